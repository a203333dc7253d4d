//! `balancer run`: wires the certificate watcher, the webhook server and the probe server together.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

use crate::cli::RunArgs;
use crate::server::{self, AppState, Limits, Readiness};
use crate::telemetry::Metrics;
use crate::tls::{self, CA_FILE, CertPaths, CertWatcher, TlsError};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Addresses the servers actually listen on (useful when binding port 0).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    pub webhook: SocketAddr,
    pub probe: SocketAddr,
}

/// Picks the serving certificate: the given files, or dev certificates in `--dev-cert-dir`.
fn cert_paths(args: &RunArgs) -> Result<CertPaths, TlsError> {
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        return Ok(CertPaths {
            cert: cert.clone(),
            key: key.clone(),
        });
    }
    let (paths, created) = tls::ensure_dev_certs(&args.dev_cert_dir)?;
    let ca = args.dev_cert_dir.join(CA_FILE);
    if created {
        tracing::info!(ca = %ca.display(), "created dev certificates for localhost; use `curl --cacert {}`", ca.display());
    } else {
        tracing::info!(ca = %ca.display(), "reusing dev certificates; use `curl --cacert {}`", ca.display());
    }
    Ok(paths)
}

/// Starts everything and returns once it is listening; the servers stop when `shutdown` is cancelled
/// and the returned task finishes when they have drained.
pub async fn start(
    args: &RunArgs,
    limits: Limits,
    shutdown: CancellationToken,
) -> Result<(Bound, tokio::task::JoinHandle<()>), RunError> {
    let metrics = Arc::new(Metrics::default());
    let (watcher, resolver) = CertWatcher::start(cert_paths(args)?, metrics.clone())?;
    let tls_config = Arc::new(tls::server_config(resolver)?);
    let readiness = Readiness::default();
    readiness.certificate.store(true, Ordering::Release);
    let limits = Arc::new(limits);
    let state = AppState {
        metrics,
        readiness,
        limits: limits.clone(),
    };

    let webhook_listener = server::bind(args.webhook_addr, "the webhook").await?;
    let probe_listener = server::bind(args.probe_addr, "probes and metrics").await?;
    let bound = Bound {
        webhook: webhook_listener.local_addr()?,
        probe: probe_listener.local_addr()?,
    };
    tracing::info!(webhook = %bound.webhook, probe = %bound.probe, "serving");

    let reload = tokio::spawn(watcher.run(args.tls_reload_interval, shutdown.clone()));
    let webhook = tokio::spawn(server::serve_tls(
        webhook_listener,
        tls_config,
        server::webhook_router(state.clone()),
        limits,
        shutdown.clone(),
    ));
    let probe = tokio::spawn(server::serve_plain(
        probe_listener,
        server::probe_router(state),
        shutdown,
    ));
    let all = tokio::spawn(async move {
        let _ = webhook.await;
        if let Ok(Err(e)) = probe.await {
            tracing::error!(error = %e, "probe server failed");
        }
        let _ = reload.await;
    });
    Ok((bound, all))
}

/// Runs until SIGTERM or SIGINT, then shuts down gracefully.
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    let shutdown = CancellationToken::new();
    let limits = Limits {
        max_body_bytes: args.max_body_bytes,
        ..Limits::default()
    };
    let (_, servers) = start(&args, limits, shutdown.clone()).await?;
    wait_for_signal().await?;
    tracing::info!("shutting down: no new connections, finishing in-flight requests");
    shutdown.cancel();
    let _ = servers.await;
    Ok(())
}

async fn wait_for_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

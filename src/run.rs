//! `balancer run`: wires the certificate watcher, the webhook and probe servers, and
//! (when a cluster is reachable) the controller, through leader election if asked.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::net::TcpListener;

use tokio_util::sync::CancellationToken;

use crate::cli::{ControllerArgs, RunArgs};
use crate::controller::{self, Scope};
use crate::metrics_auth::MetricsAuth;
use crate::server::{self, AppState, Limits, Readiness};
use crate::telemetry::Metrics;
use crate::tls::{self, CA_FILE, CertPaths, CertWatcher, TlsError};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("--require-controller: {0}")]
    NoCluster(String),
}

/// Addresses the servers actually listen on (useful when binding port 0).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    pub webhook: SocketAddr,
    pub probe: SocketAddr,
    /// The protected metrics listener; `None` with --insecure-metrics.
    pub metrics: Option<SocketAddr>,
}

/// Picks the serving certificate: the given files, or dev certificates in `--dev-cert-dir`.
fn cert_paths(args: &RunArgs) -> Result<CertPaths, TlsError> {
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        return Ok(CertPaths { cert: cert.clone(), key: key.clone() });
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
) -> Result<(Bound, Readiness, tokio::task::JoinHandle<()>), RunError> {
    let metrics = Arc::new(Metrics::default());
    let (watcher, resolver) = CertWatcher::start(cert_paths(args)?, metrics.clone())?;
    let tls_config = Arc::new(tls::server_config(resolver)?);
    let mut readiness = Readiness::default();
    readiness.certificate.store(true, Ordering::Release);
    let client = connect(&args.controller).await?;
    let metrics_auth = client.clone().map(|c| Arc::new(MetricsAuth::new(c)));
    let controller = client.map(|client| {
        let synced = Arc::new(AtomicBool::new(false));
        readiness.controller = Some(synced.clone());
        tokio::spawn(supervise(client, args.controller.clone(), metrics.clone(), synced, shutdown.clone()))
    });
    let limits = Arc::new(limits);
    let state = AppState { metrics, readiness: readiness.clone(), limits: limits.clone(), metrics_auth };

    let webhook_listener = server::bind(args.webhook_addr, "the webhook").await?;
    let probe_listener = server::bind(args.probe_addr, "probes").await?;
    let metrics_listener = match args.insecure_metrics {
        true => None,
        false => Some(server::bind(args.metrics_addr, "protected metrics").await?),
    };
    let bound = Bound {
        webhook: webhook_listener.local_addr()?,
        probe: probe_listener.local_addr()?,
        metrics: metrics_listener.as_ref().map(TcpListener::local_addr).transpose()?,
    };
    let metrics_at =
        bound.metrics.map_or_else(|| format!("http://{}/metrics", bound.probe), |a| format!("https://{a}/metrics"));
    tracing::info!(webhook = %bound.webhook, probe = %bound.probe, metrics = %metrics_at, "serving");

    let reload = tokio::spawn(watcher.run(args.tls_reload_interval, shutdown.clone()));
    let webhook = tokio::spawn(server::serve(
        webhook_listener,
        Some(tls_config.clone()),
        server::webhook_router(state.clone()),
        limits.clone(),
        shutdown.clone(),
    ));
    let protected = metrics_listener.map(|listener| {
        let router = server::protected_metrics_router(state.clone());
        tokio::spawn(server::serve(listener, Some(tls_config.clone()), router, limits.clone(), shutdown.clone()))
    });
    let probe_router = server::probe_router(state, args.insecure_metrics);
    let probe = tokio::spawn(server::serve(probe_listener, None, probe_router, limits, shutdown.clone()));
    let all = tokio::spawn(async move {
        let _ = webhook.await;
        let _ = probe.await;
        if let Some(protected) = protected {
            let _ = protected.await;
        }
        let _ = reload.await;
        if let Some(controller) = controller {
            let _ = controller.await;
        }
    });
    Ok((bound, readiness, all))
}

/// Runs until SIGTERM or SIGINT, then shuts down gracefully.
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    let shutdown = CancellationToken::new();
    let limits = Limits { max_body_bytes: args.max_body_bytes, ..Limits::default() };
    let (_, readiness, servers) = start(&args, limits, shutdown.clone()).await?;
    wait_for_signal().await?;
    readiness.shutting_down.store(true, Ordering::Release);
    tracing::info!(delay = ?args.shutdown_delay, "shutting down: reporting not-ready, then draining");
    tokio::time::sleep(args.shutdown_delay).await;
    shutdown.cancel();
    let _ = servers.await;
    Ok(())
}

/// A client for the cluster, or `None` (controller off) when there is none to reach.
async fn connect(args: &ControllerArgs) -> Result<Option<Client>, RunError> {
    if args.disable_controller {
        tracing::info!("controller disabled (--disable-controller): serving the webhooks only");
        return Ok(None);
    }
    let off = |reason: String| {
        if args.require_controller {
            return Err(RunError::NoCluster(reason));
        }
        tracing::warn!("controller is OFF, serving the webhooks only: {reason}");
        Ok(None)
    };
    let config = match kube::Config::infer().await {
        Ok(config) => config,
        Err(e) => return off(format!("no Kubernetes configuration (in-cluster, KUBECONFIG or ~/.kube/config): {e}")),
    };
    let url = config.cluster_url.clone();
    let client = match Client::try_from(config) {
        Ok(client) => client,
        Err(e) => return off(format!("cannot build a client for {url}: {e}")),
    };
    match tokio::time::timeout(Duration::from_secs(10), client.apiserver_version()).await {
        Ok(Ok(version)) => {
            tracing::info!(%url, version = %version.git_version, "connected to the cluster; starting the controller");
            Ok(Some(client))
        }
        Ok(Err(e)) => off(format!("cluster {url} is not reachable: {e}")),
        Err(_) => off(format!("cluster {url} did not answer within 10 s")),
    }
}

/// Runs the controller, through leader election when asked, until `shutdown`.
async fn supervise(
    client: Client,
    args: ControllerArgs,
    metrics: Arc<Metrics>,
    synced: Arc<AtomicBool>,
    shutdown: CancellationToken,
) {
    let scope = match &args.namespace {
        Some(ns) => Scope::Namespace(ns.clone()),
        None => Scope::All,
    };
    let settings = args.proxy.settings();
    if !args.leader_elect {
        metrics.set_leader(true);
        controller::run(client, scope, settings, metrics.clone(), synced, shutdown).await;
        metrics.set_leader(false);
        return;
    }
    let Some((mut leading, lease_task)) = elect(&client, &args, &shutdown).await else { return };
    // A standby replica is ready: it serves the webhooks, and has no caches to sync.
    synced.store(true, Ordering::Release);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            became = leading.wait_for(|leader| *leader) => if became.is_err() { break },
        }
        tracing::info!("became the leader: starting reconciles");
        metrics.set_leader(true);
        synced.store(false, Ordering::Release);
        let stop = shutdown.child_token();
        let mut lost = leading.clone();
        let on_loss = stop.clone();
        let watch_loss = tokio::spawn(async move {
            let _ = lost.wait_for(|leader| !*leader).await;
            tracing::warn!("lost leadership: stopping reconciles");
            on_loss.cancel();
        });
        controller::run(client.clone(), scope.clone(), settings.clone(), metrics.clone(), synced.clone(), stop).await;
        watch_loss.abort();
        metrics.set_leader(false);
        synced.store(true, Ordering::Release);
    }
    // Dropping the receiver makes the lease manager release the Lease for a fast hand-over;
    // wait for that release before the process exits.
    drop(leading);
    match tokio::time::timeout(Duration::from_secs(5), lease_task).await {
        Ok(Ok(Ok(_))) => tracing::info!("released the leader Lease"),
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "could not release the leader Lease; it expires by itself"),
        Ok(Err(e)) => tracing::warn!(error = %e, "the lease manager failed"),
        Err(_) => tracing::warn!("releasing the leader Lease timed out; it expires by itself"),
    }
}

/// The leadership channel and the task that renews (and finally releases) the Lease.
type Election = (
    tokio::sync::watch::Receiver<bool>,
    tokio::task::JoinHandle<Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>>,
);

/// Joins the leader election; `None` when shutdown came first.
async fn elect(client: &Client, args: &ControllerArgs, shutdown: &CancellationToken) -> Option<Election> {
    let namespace = args
        .leader_election_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| client.default_namespace().to_string());
    let identity = identity();
    let duration = args.lease_duration;
    // Renew well before expiry: a third of the lease, at least a second.
    let grace = (duration / 3).max(1);
    tracing::info!(lease = %args.leader_election_id, %namespace, %identity, "joining leader election");
    let mut retry = Duration::from_secs(1);
    loop {
        let built = LeaseManagerBuilder::new(client.clone(), &args.leader_election_id)
            .with_namespace(&namespace)
            .with_identity(&identity)
            .with_duration(duration)
            .with_grace(grace)
            .with_field_manager(format!("{}-{identity}", controller::FIELD_MANAGER))
            .build()
            .await;
        match built {
            Ok(manager) => return Some(manager.watch().await),
            Err(e) => tracing::error!(error = %e, "cannot set up leader election; retrying in {retry:?}"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(retry) => retry = (retry * 2).min(Duration::from_secs(30)),
        }
    }
}

/// This replica's name in the Lease: the pod name (or host name) and the process id.
fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()))
        .unwrap_or_else(|_| "balancer".into());
    format!("{host}_{}", std::process::id())
}

async fn wait_for_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

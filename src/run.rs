//! `balancer run`: wires the certificate watcher, the webhook and probe servers, and
//! (when a cluster is reachable) the controller, through leader election if asked.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::Client;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use tokio_util::sync::CancellationToken;

use crate::cli::{ControllerArgs, RunArgs};
use crate::contact::Contact;
use crate::controller::{self, Clients, Scope};
use crate::leader;
use crate::listener::{self, Workers};
use crate::metrics_auth::MetricsAuth;
use crate::server::{self, AppState, Limits, Readiness};
use crate::telemetry::Metrics;
use crate::throttle::{self, Rate, ThrottleLayer};
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
    let readiness = Readiness::default();
    readiness.certificate.store(true, Ordering::Release);
    let clients = connect(&args.controller, &metrics, &shutdown).await?;
    let metrics_auth = match (&clients, args.insecure_metrics) {
        (_, true) => None,
        (Some(clients), false) => Some(Arc::new(MetricsAuth::new(clients.direct.clone()))),
        // Webhooks only (or the cluster was unreachable at start): still review scrape
        // tokens whenever a configuration exists; requests fail cleanly while it is down.
        (None, false) => match kube_config(&args.controller).await.map(Client::try_from) {
            Ok(Ok(client)) => Some(Arc::new(MetricsAuth::new(client))),
            _ => None,
        },
    };
    let controller = clients.map(|clients| {
        let synced = Arc::new(AtomicBool::new(false));
        let args = args.controller.clone();
        tokio::spawn(supervise(clients, args, metrics.clone(), synced, shutdown.clone()))
    });
    // A single review body may always be read, however the budget is set. Conversions have a
    // budget of their own, one largest body: many small ones or one large one at a time.
    let budget = limits.max_body_bytes_in_flight.max(limits.max_body_bytes);
    let body_budget = Arc::new(Semaphore::new(budget.min(Semaphore::MAX_PERMITS)));
    let conversion_budget = Arc::new(Semaphore::new(limits.max_conversion_body_bytes.min(Semaphore::MAX_PERMITS)));
    let limits = Arc::new(limits);
    let policy = args.controller.proxy.spec_policy();
    let state = AppState {
        metrics,
        readiness: readiness.clone(),
        limits: limits.clone(),
        policy,
        body_budget,
        conversion_budget,
        metrics_auth,
    };

    let webhook_listener = listener::bind(args.webhook_addr, "the webhook").await?;
    let probe_listener = listener::bind(args.probe_addr, "probes").await?;
    let metrics_listener = match args.insecure_metrics {
        true => None,
        false => Some(listener::bind(args.metrics_addr, "protected metrics").await?),
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
    // The webhook's connections on threads of their own; probes and metrics on this runtime.
    let webhook_workers = Workers::per_core("webhook")?;
    let webhook = tokio::spawn(listener::serve(
        webhook_listener,
        Some(tls_config.clone()),
        server::WebhookService::new(state.clone()),
        limits.connections.clone(),
        shutdown.clone(),
        Some(webhook_workers),
    ));
    let protected = metrics_listener.map(|metrics_listener| {
        let router = server::protected_metrics_router(state.clone());
        let connections = limits.connections.clone();
        let tls = Some(tls_config.clone());
        tokio::spawn(listener::serve(metrics_listener, tls, router, connections, shutdown.clone(), None))
    });
    let probe_router = server::probe_router(state, args.insecure_metrics);
    let probe_connections = limits.probe_connections.clone();
    let probe =
        tokio::spawn(listener::serve(probe_listener, None, probe_router, probe_connections, shutdown.clone(), None));
    let all = tokio::spawn(async move {
        let servers = async {
            let _ = webhook.await;
            let _ = probe.await;
            if let Some(protected) = protected {
                let _ = protected.await;
            }
            let _ = reload.await;
        };
        tokio::join!(servers, drain_controller(controller, shutdown));
    });
    Ok((bound, readiness, all))
}

/// Once shutdown starts, the controller gets this long to finish its reconciles (and release
/// its Lease) before it is stopped where it stands: nothing it waits on may keep the process alive.
pub const CONTROLLER_DRAIN: Duration = Duration::from_secs(10);

/// Waits for the controller to stop after `shutdown`, aborting it past [`CONTROLLER_DRAIN`].
async fn drain_controller(controller: Option<tokio::task::JoinHandle<()>>, shutdown: CancellationToken) {
    let Some(mut controller) = controller else { return };
    tokio::select! {
        _ = &mut controller => return,
        _ = shutdown.cancelled() => {}
    }
    if tokio::time::timeout(CONTROLLER_DRAIN, &mut controller).await.is_err() {
        tracing::warn!(drain = ?CONTROLLER_DRAIN, "the controller did not stop in time; stopping it now");
        controller.abort();
    }
}

/// Runs until SIGTERM or SIGINT, then shuts down gracefully.
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    let shutdown = CancellationToken::new();
    let limits = Limits { max_body_bytes: args.max_body_bytes, ..Limits::default() };
    // Listen for signals before anything starts: a SIGTERM during start-up must not kill
    // the process uncleanly.
    let signals = Signals::listen()?;
    let (_, readiness, servers) = start(&args, limits, shutdown.clone()).await?;
    signals.wait().await;
    readiness.shutting_down.store(true, Ordering::Release);
    tracing::info!(delay = ?args.shutdown_delay, "shutting down: reporting not-ready, then draining");
    tokio::time::sleep(args.shutdown_delay).await;
    shutdown.cancel();
    let _ = servers.await;
    Ok(())
}

/// Clients for the cluster, or `None` (controller off) when there is none to reach.
/// The throttled client stops waiting once `shutdown` is cancelled (see [`throttle`]).
async fn connect(
    args: &ControllerArgs,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> Result<Option<Clients>, RunError> {
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
    let config = match kube_config(args).await {
        Ok(config) => config,
        Err(e) => return off(e),
    };
    let url = config.cluster_url.clone();
    let rate = Rate { qps: f64::from(args.api_qps), burst: args.api_burst };
    let throttle = ThrottleLayer::new(rate, metrics.api.clone(), shutdown.clone());
    let contact = Contact::new(metrics.api.unreachable_since.clone());
    let clients = contact.client(config.clone()).and_then(|direct| {
        Ok(Clients { direct, throttled: throttle::client(config, &contact, &throttle)?, contact: contact.clone() })
    });
    let clients = match clients {
        Ok(clients) => clients,
        Err(e) => return off(format!("cannot build a client for {url}: {e}")),
    };
    match tokio::time::timeout(Duration::from_secs(10), clients.direct.apiserver_version()).await {
        Ok(Ok(version)) => {
            tracing::info!(%url, version = %version.git_version, "connected to the cluster; starting the controller");
            Ok(Some(clients))
        }
        Ok(Err(e)) => off(format!("cluster {url} is not reachable: {e}")),
        Err(_) => off(format!("cluster {url} did not answer within 10 s")),
    }
}

/// The client configuration: `--kubeconfig` and `--context` when given (client-go's and
/// kubectl's flags), else kube's inference: in-cluster, then `KUBECONFIG`, then ~/.kube/config.
async fn kube_config(args: &ControllerArgs) -> Result<kube::Config, String> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let options = KubeConfigOptions { context: args.context.clone(), ..KubeConfigOptions::default() };
    match (&args.kubeconfig, &args.context) {
        (Some(path), _) => {
            let file = Kubeconfig::read_from(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options).await.map_err(|e| format!("{}: {e}", path.display()))
        }
        (None, Some(context)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| format!("no usable kubeconfig context {context:?}: {e}")),
        (None, None) => kube::Config::infer()
            .await
            .map_err(|e| format!("no Kubernetes configuration (in-cluster, KUBECONFIG or ~/.kube/config): {e}")),
    }
}

/// Runs the controller, through leader election when asked, until `shutdown`.
///
/// Reconciles go through the throttled client (see [`throttle`]); watches and the Lease through
/// the direct one, so that a pause the API server asks of the controller never delays a
/// renewal or the controller's return after an outage.
async fn supervise(
    clients: Clients,
    args: ControllerArgs,
    metrics: Arc<Metrics>,
    synced: Arc<AtomicBool>,
    shutdown: CancellationToken,
) {
    let scope = match &args.namespace {
        Some(ns) => Scope::Namespace(ns.clone()),
        None => Scope::All,
    };
    let options =
        controller::Options { scope, proxy: args.proxy.settings(), concurrency: args.max_concurrent_reconciles };
    if !args.leader_elect {
        metrics.controller.set_leader(true);
        controller::run(clients, options, metrics.clone(), synced, shutdown).await;
        metrics.controller.set_leader(false);
        return;
    }
    let ignored_sync = Arc::new(AtomicBool::new(false));
    let lease_client = clients.direct.clone();
    let election = leader_options(&args, &lease_client);
    let reconcile = |stop: CancellationToken| {
        controller::run(clients.clone(), options.clone(), metrics.clone(), ignored_sync.clone(), stop)
    };
    leader::run_while_leading(&lease_client, election, &metrics, &shutdown, reconcile).await;
}

/// The Lease from the flags: in `--leader-election-namespace`, else the pod's namespace, else the
/// client's.
fn leader_options(args: &ControllerArgs, client: &Client) -> leader::Options {
    let namespace = args
        .leader_election_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| client.default_namespace().to_string());
    leader::Options {
        name: args.leader_election_id.clone(),
        namespace,
        identity: leader::identity(),
        duration: Duration::from_secs(args.lease_duration),
        field_manager: controller::FIELD_MANAGER.to_string(),
    }
}

/// SIGTERM and SIGINT, listened for from the moment this is created.
struct Signals {
    term: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    fn listen() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals { term: signal(SignalKind::terminate())?, interrupt: signal(SignalKind::interrupt())? })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}

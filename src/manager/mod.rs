//! `balancer run`: wires the certificate watcher, the webhook and probe servers, and
//! (when a cluster is reachable) the controller, through leader election if asked. The only
//! place that knows every area, their metrics included.

mod config;
mod registry;
mod signing;

pub use config::{Certificate, ClusterConfig, Config, LeaderElection};
pub use registry::Metrics;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::Client;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::controller::metrics::ControllerMetrics;
use crate::controller::{self, Clients};
use crate::deploy::FIELD_MANAGER;
use crate::gateway;
use crate::runtime::listener::{self, ServeOptions, Workers};
use crate::runtime::metrics_auth::MetricsAuth;
use crate::runtime::probes::{self, Readiness};
use crate::runtime::signals::Signals;
use crate::runtime::throttle::{self, ThrottleLayer};
use crate::runtime::tls::{self, CA_FILE, CertPaths, CertWatcher, TlsError};
use crate::runtime::{leader, metrics};
use crate::webhook::{AppState, Budget, Limits, WebhookService};

#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
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
    /// Where the webhooks listen.
    pub webhook: SocketAddr,
    /// Where the health probes listen.
    pub probe: SocketAddr,
    /// The protected metrics listener; `None` with --insecure-metrics.
    pub metrics: Option<SocketAddr>,
}

/// Picks the serving certificate: the given files, or dev certificates in the given directory.
fn cert_paths(certificate: &Certificate) -> Result<CertPaths, TlsError> {
    let dir = match certificate {
        Certificate::Files { cert, key } => return Ok(CertPaths { cert: cert.clone(), key: key.clone() }),
        Certificate::Dev(dir) => dir,
    };
    let (paths, created) = tls::ensure_dev_certs(dir)?;
    let ca = dir.join(CA_FILE);
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
    config: &Config,
    limits: Limits,
    shutdown: CancellationToken,
) -> Result<(Bound, Readiness, tokio::task::JoinHandle<()>), RunError> {
    let metrics = Metrics::default();
    let (watcher, resolver) = CertWatcher::start(cert_paths(&config.certificate)?, metrics.tls.clone())?;
    let tls_config = Arc::new(tls::server_config(resolver)?);
    let readiness = Readiness::default();
    readiness.certificate.store(true, Ordering::Release);
    let clients = connect(&config.cluster, &metrics, &shutdown).await?;
    let metrics_auth = match (&clients, config.insecure_metrics) {
        (_, true) => None,
        (Some(clients), false) => Some(Arc::new(MetricsAuth::new(clients.direct.clone()))),
        // Webhooks only (or the cluster was unreachable at start): still review scrape
        // tokens whenever a configuration exists; requests fail cleanly while it is down.
        (None, false) => match kube_config(&config.cluster).await.map(Client::try_from) {
            Ok(Ok(client)) => Some(Arc::new(MetricsAuth::new(client))),
            _ => None,
        },
    };
    let controller = clients.map(|clients| {
        let synced = Arc::new(AtomicBool::new(false));
        let cluster = config.cluster.clone();
        tokio::spawn(supervise(clients, cluster, metrics.controller.clone(), synced, shutdown.clone()))
    });
    // Each budget is at least two of its largest bodies, so that no single connection ever
    // holds all of it: one client that sends a large body and stalls leaves room for the API
    // server's next review. Conversions have a budget of their own (bodies of at most 16 KiB
    // pay nothing).
    let budget = limits.max_body_bytes_in_flight.max(limits.max_body_bytes.saturating_mul(2));
    let body_budget = Budget::new(budget);
    let conversion_budget = Budget::new(limits.max_conversion_body_bytes.saturating_mul(2));
    let limits = Arc::new(limits);
    let policy = config.cluster.controller.proxy.policy.clone();
    let state = AppState {
        metrics: metrics.admission.clone(),
        readiness: readiness.clone(),
        limits: limits.clone(),
        policy,
        body_budget,
        conversion_budget,
    };

    let webhook_listener = listener::bind(config.webhook_addr, "the webhook").await?;
    let probe_listener = listener::bind(config.probe_addr, "probes").await?;
    let metrics_listener = if config.insecure_metrics {
        None
    } else {
        Some(listener::bind(config.metrics_addr, "protected metrics").await?)
    };
    let bound = Bound {
        webhook: webhook_listener.local_addr()?,
        probe: probe_listener.local_addr()?,
        metrics: metrics_listener.as_ref().map(TcpListener::local_addr).transpose()?,
    };
    let metrics_at =
        bound.metrics.map_or_else(|| format!("http://{}/metrics", bound.probe), |a| format!("https://{a}/metrics"));
    tracing::info!(webhook = %bound.webhook, probe = %bound.probe, metrics = %metrics_at, "serving");

    let reload = tokio::spawn(watcher.run(config.tls_reload_interval, shutdown.clone()));
    // The webhook's connections on threads of their own; probes and metrics on this runtime.
    let webhook_workers = Workers::per_core("webhook")?;
    let webhook_options = ServeOptions::new(limits.connections.clone())
        .counted(metrics.admission.connections.clone())
        .tls(tls_config.clone())
        .on(webhook_workers)
        .draining(readiness.draining.clone());
    let webhook = tokio::spawn(listener::serve(
        webhook_listener,
        WebhookService::new(state.clone()),
        webhook_options,
        shutdown.clone(),
    ));
    let protected = metrics_listener.map(|metrics_listener| {
        let router = metrics::protected_router(metrics.registry.clone(), metrics_auth);
        let options =
            ServeOptions::new(limits.connections.clone()).tls(tls_config.clone()).draining(readiness.draining.clone());
        tokio::spawn(listener::serve(metrics_listener, router, options, shutdown.clone()))
    });
    let exported = config.insecure_metrics.then(|| metrics.registry.clone());
    let probe_router = probes::router(readiness.clone(), exported);
    let probe_options = ServeOptions::new(limits.probe_connections.clone()).draining(readiness.draining.clone());
    let probe = tokio::spawn(listener::serve(probe_listener, probe_router, probe_options, shutdown.clone()));
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
/// its Lease) before it is aborted: nothing it waits on may keep the process alive.
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
pub async fn run(config: Config) -> Result<(), RunError> {
    let shutdown = CancellationToken::new();
    let limits = Limits::with_body_limits(config.max_body_bytes, config.min_body_rate);
    // Listen for signals before anything starts: a SIGTERM during start-up must not kill
    // the process uncleanly.
    let signals = Signals::listen()?;
    let (_, readiness, servers) = start(&config, limits, shutdown.clone()).await?;
    signals.wait().await;
    readiness.draining.cancel();
    tracing::info!(delay = ?config.shutdown_delay, "shutting down: reporting not-ready, then draining");
    tokio::time::sleep(config.shutdown_delay).await;
    shutdown.cancel();
    let _ = servers.await;
    Ok(())
}

/// Clients for the cluster, or `None` (controller off) when there is none to reach.
/// The throttled client stops waiting once `shutdown` is cancelled (see [`throttle`]).
async fn connect(
    args: &ClusterConfig,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> Result<Option<Clients>, RunError> {
    if args.disabled {
        tracing::info!("controller disabled (--disable-controller): serving the webhooks only");
        return Ok(None);
    }
    let off = |reason: String| {
        if args.required {
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
    let throttle = ThrottleLayer::new(args.rate, metrics.throttle.clone(), shutdown.clone());
    let contact = metrics.contact.clone();
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
async fn kube_config(args: &ClusterConfig) -> Result<kube::Config, String> {
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
    cluster: ClusterConfig,
    metrics: Arc<ControllerMetrics>,
    synced: Arc<AtomicBool>,
    shutdown: CancellationToken,
) {
    let mut options = cluster.controller;
    let namespace = own_namespace(cluster.leader_election.as_ref(), &clients.direct);
    let Some(signer) = signing::signer(&clients.direct, &namespace, &shutdown).await else { return };
    options.proxy.signer = Some(signer);
    let gateway_api = gateway::discover(&clients.direct).await;
    gateway_api.log();
    options.gateway_api = gateway_api == gateway::GatewayApi::Served;
    if options.gateway_api && matches!(options.scope, controller::Scope::Namespace(_)) {
        // GatewayClasses are cluster-wide, which a namespaced install's Role cannot read.
        tracing::info!(
            "Gateway API is off: the operator watches one namespace (--namespace); Gateways need the cluster-wide install"
        );
        options.gateway_api = false;
    }
    let Some(election) = cluster.leader_election else {
        metrics.set_leader(true);
        controller::run(clients, options, metrics.clone(), synced, shutdown).await;
        metrics.set_leader(false);
        return;
    };
    let ignored_sync = Arc::new(AtomicBool::new(false));
    let lease_client = clients.direct.clone();
    let election = leader_options(&election, &lease_client);
    let reconcile = |stop: CancellationToken| {
        controller::run(clients.clone(), options.clone(), metrics.clone(), ignored_sync.clone(), stop)
    };
    let leading = |leading: bool| {
        metrics.set_leader(leading);
        if !leading {
            metrics.set_balancers(0, 0, 0);
        }
    };
    leader::run_while_leading(&lease_client, election, leading, &shutdown, reconcile).await;
}

/// The operator's own namespace, where its Lease and signing key live: the Lease's configured
/// namespace, else the pod's namespace, else the client's.
fn own_namespace(election: Option<&LeaderElection>, client: &Client) -> String {
    election
        .and_then(|e| e.namespace.clone())
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| client.default_namespace().to_string())
}

/// The Lease, in the operator's own namespace.
fn leader_options(election: &LeaderElection, client: &Client) -> leader::Options {
    let namespace = own_namespace(Some(election), client);
    leader::Options {
        name: election.lease.clone(),
        namespace,
        identity: leader::identity(),
        duration: election.duration,
        field_manager: FIELD_MANAGER.to_string(),
    }
}

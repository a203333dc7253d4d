//! `balancer run`: wires the certificate watcher, the webhook and probe servers, and
//! (when a cluster is reachable) the controller, through leader election if asked.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{Api, Client};
use kube_lease_manager::LeaseManagerBuilder;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use tokio_util::sync::CancellationToken;

use crate::cli::{ControllerArgs, RunArgs};
use crate::controller::{self, Scope};
use crate::listener;
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
    let metrics_auth = match (&client, args.insecure_metrics) {
        (_, true) => None,
        (Some(client), false) => Some(Arc::new(MetricsAuth::new(client.clone()))),
        // Webhooks only (or the cluster was unreachable at start): still review scrape
        // tokens whenever a configuration exists; requests fail cleanly while it is down.
        (None, false) => Client::try_default().await.ok().map(|c| Arc::new(MetricsAuth::new(c))),
    };
    let controller = client.map(|client| {
        let synced = Arc::new(AtomicBool::new(false));
        readiness.controller = Some(synced.clone());
        tokio::spawn(supervise(client, args.controller.clone(), metrics.clone(), synced, shutdown.clone()))
    });
    // A single body may always be read, however the budget is set.
    let budget = limits.max_body_bytes_in_flight.max(limits.max_body_bytes);
    let body_budget = Arc::new(Semaphore::new(budget.min(Semaphore::MAX_PERMITS)));
    let limits = Arc::new(limits);
    let state = AppState { metrics, readiness: readiness.clone(), limits: limits.clone(), body_budget, metrics_auth };

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
    let webhook = tokio::spawn(listener::serve(
        webhook_listener,
        Some(tls_config.clone()),
        server::webhook_router(state.clone()),
        limits.connections.clone(),
        shutdown.clone(),
    ));
    let protected = metrics_listener.map(|metrics_listener| {
        let router = server::protected_metrics_router(state.clone());
        let connections = limits.connections.clone();
        tokio::spawn(listener::serve(metrics_listener, Some(tls_config.clone()), router, connections, shutdown.clone()))
    });
    let probe_router = server::probe_router(state, args.insecure_metrics);
    let probe_connections = limits.probe_connections.clone();
    let probe = tokio::spawn(listener::serve(probe_listener, None, probe_router, probe_connections, shutdown.clone()));
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
    // Under leader election readiness means "can serve the webhooks": a standby or a new
    // leader still syncing its caches must not take every webhook endpoint out of service.
    synced.store(true, Ordering::Release);
    let Some(Election { mut leading, lease_task, lease }) = elect(&client, &args, &shutdown).await else { return };
    let ignored_sync = Arc::new(AtomicBool::new(false));
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            became = leading.wait_for(|leader| *leader) => if became.is_err() { break },
        }
        // The lease manager can go on reporting leadership while its renewals fail:
        // reconcile only while the Lease itself, read back, names this replica and is fresh.
        if !lease.confirm_held(&shutdown, &leading).await {
            continue;
        }
        tracing::info!("became the leader: starting reconciles");
        metrics.set_leader(true);
        let stop = shutdown.child_token();
        let lost = CancellationToken::new();
        let mut channel = leading.clone();
        let on_loss = lost.clone();
        let watch_loss = tokio::spawn(async move {
            let _ = channel.wait_for(|leader| !*leader).await;
            tracing::warn!("lost leadership: stopping reconciles");
            on_loss.cancel();
        });
        let watchdog = tokio::spawn(lease.clone().watch(lost.clone()));
        let run = controller::run(
            client.clone(),
            scope.clone(),
            settings.clone(),
            metrics.clone(),
            ignored_sync.clone(),
            stop,
        );
        // Shutdown drains in-flight reconciles; a lost Lease drops them at once, since
        // another replica may already be writing.
        tokio::select! {
            _ = run => {}
            _ = lost.cancelled() => {}
        }
        watch_loss.abort();
        watchdog.abort();
        metrics.set_leader(false);
        metrics.set_balancers(0, 0, 0);
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

/// A joined election: the leadership channel, the task that renews (and finally
/// releases) the Lease, and a way to read the Lease back.
struct Election {
    leading: tokio::sync::watch::Receiver<bool>,
    lease_task:
        tokio::task::JoinHandle<Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>>,
    lease: LeaseCheck,
}

/// Reads the Lease to check that this replica really holds it.
#[derive(Clone)]
struct LeaseCheck {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl LeaseCheck {
    /// Whether the Lease names this replica and was renewed within its duration.
    async fn held(&self) -> Result<bool, String> {
        // A stalled request must not outlast the lease it is checking.
        let read = tokio::time::timeout(self.duration / 3, self.api.get_opt(&self.name)).await;
        let lease = match read {
            Ok(Ok(lease)) => lease,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("timed out".into()),
        };
        let Some(lease) = lease else { return Ok(false) };
        let spec = lease.spec.unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let limit = SignedDuration::try_from(self.duration).unwrap_or(SignedDuration::MAX);
        let fresh = spec.renew_time.is_some_and(|t| Timestamp::now().duration_since(t.0) < limit);
        Ok(ours && fresh)
    }

    /// Waits until the Lease is confirmed held; false when leadership or the process ends first.
    async fn confirm_held(&self, shutdown: &CancellationToken, leading: &tokio::sync::watch::Receiver<bool>) -> bool {
        loop {
            if shutdown.is_cancelled() || !*leading.borrow() {
                return false;
            }
            if let Ok(true) = self.held().await {
                return true;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Every third of the lease, reads it back; cancels `stop` when another replica holds it
    /// or it could not be confirmed for a whole lease duration.
    async fn watch(self, stop: CancellationToken) {
        let mut confirmed = Instant::now();
        let mut ticker = tokio::time::interval((self.duration / 3).max(Duration::from_millis(500)));
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            match self.held().await {
                Ok(true) => confirmed = Instant::now(),
                Ok(false) => {
                    tracing::warn!(lease = %self.name, "the Lease is no longer this replica's: stopping reconciles");
                    return stop.cancel();
                }
                Err(e) => tracing::debug!(error = %e, "cannot read the leader Lease"),
            }
            if confirmed.elapsed() > self.duration {
                tracing::warn!(lease = %self.name, "the Lease was not confirmed within its duration: stopping reconciles");
                return stop.cancel();
            }
        }
    }
}

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
            Ok(manager) => {
                let (leading, lease_task) = manager.watch().await;
                let lease = LeaseCheck {
                    api: Api::namespaced(client.clone(), &namespace),
                    name: args.leader_election_id.clone(),
                    identity: identity.clone(),
                    duration: Duration::from_secs(duration),
                };
                return Some(Election { leading, lease_task, lease });
            }
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

//! Leader election: only the replica holding the Lease reconciles.
//!
//! kube-lease-manager renews the Lease; this module also reads the Lease back, because the
//! manager can go on reporting leadership while its renewals fail. A leader that cannot
//! confirm the Lease for a whole lease duration, or sees another holder, stops reconciling at
//! once (another replica may already be writing); a leader that shuts down releases it.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{Api, Client};
use kube_lease_manager::LeaseManagerBuilder;
use tokio_util::sync::CancellationToken;

use crate::cli::ControllerArgs;
use crate::controller;
use crate::telemetry::Metrics;

/// Joins the election and runs `reconcile` whenever this replica leads, until `shutdown`;
/// then releases the Lease. `reconcile` stops when its token is cancelled (shutdown: drained)
/// or is dropped where it stands (leadership lost).
pub async fn run_while_leading<F, Fut>(
    client: &Client,
    args: &ControllerArgs,
    metrics: &Metrics,
    shutdown: &CancellationToken,
    mut reconcile: F,
) where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(Election { mut leading, lease_task, lease }) = elect(client, args, shutdown).await else { return };
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            became = leading.wait_for(|leader| *leader) => if became.is_err() { break },
        }
        // The lease manager can go on reporting leadership while its renewals fail:
        // reconcile only while the Lease itself, read back, names this replica and is fresh.
        if !lease.confirm_held(shutdown, &leading).await {
            continue;
        }
        tracing::info!("became the leader: starting reconciles");
        metrics.controller.set_leader(true);
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
        let run = reconcile(stop);
        // Shutdown drains in-flight reconciles; a lost Lease drops them at once, since
        // another replica may already be writing.
        tokio::select! {
            _ = run => {}
            _ = lost.cancelled() => {}
        }
        watch_loss.abort();
        watchdog.abort();
        metrics.controller.set_leader(false);
        metrics.controller.set_balancers(0, 0, 0);
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

//! Leader election: only the replica holding the Lease reconciles.
//!
//! client-go's algorithm, which controller-runtime uses, on a `coordination.k8s.io` Lease:
//! - Every write of the Lease replaces it at the resourceVersion last read, so of two replicas
//!   writing at once, one gets a conflict and neither is mistaken about who holds it.
//! - A replica takes a Lease another holds only once that Lease has not changed for its
//!   duration *since this replica first saw it in that state*, by its own clock: clock offsets
//!   between machines do not matter, and Leases do not all look expired the moment the API
//!   server is back from an outage.
//! - The leader renews every retry period, and stops reconciling at once when it sees another
//!   holder or has not renewed for the renew deadline (two thirds of the duration), which is
//!   before any other replica may take over.
//! - A leader that shuts down releases the Lease, for a fast hand-over.
//!
//! Attempts are a retry period apart (2 s for a 15 s Lease) whatever failed, so a replica is
//! back within one period of the API server's return, not after a random back-off.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

/// The Lease and this replica's part in the election.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub name: String,
    pub namespace: String,
    /// This replica's name in the Lease; unique among the replicas.
    pub identity: String,
    /// How long a Lease lasts without renewal.
    pub duration: Duration,
    /// The field manager of the Lease's writes.
    pub field_manager: String,
}

impl Options {
    /// How long the leader goes on without a renewal before it stops (client-go: 10 s of 15).
    pub(crate) fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }

    /// Between two attempts to take or renew the Lease (client-go: 2 s of 15).
    pub(crate) fn retry_period(&self) -> Duration {
        (self.duration * 2 / 15).max(Duration::from_millis(200))
    }
}

/// This replica's name in the Lease: the pod name (or host name) and a random suffix, new for
/// every process, as controller-runtime names it. A container restarted after a crash is
/// process 1 again, and with the process id it would take its predecessor's Lease as its own
/// at once; as a new candidate it waits for that Lease to run out like any other replica.
pub(crate) fn identity() -> String {
    use ring::rand::{SecureRandom, SystemRandom};
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()))
        .unwrap_or_else(|_| "balancer".into());
    let mut suffix = [0u8; 6];
    match SystemRandom::new().fill(&mut suffix) {
        Ok(()) => format!("{host}_{}", suffix.iter().map(|b| format!("{b:02x}")).collect::<String>()),
        Err(_) => format!("{host}_{}", std::process::id()),
    }
}

/// Joins the election and runs `reconcile` whenever this replica leads, until `shutdown`;
/// then releases the Lease. `leading` hears each change of leadership. `reconcile` stops in one
/// of two ways: on shutdown its token is cancelled and it drains; when leadership is lost its
/// future is dropped at once, since another replica may already be writing.
pub(crate) async fn run_while_leading<F, Fut>(
    client: &Client,
    options: Options,
    leading: impl Fn(bool),
    shutdown: &CancellationToken,
    mut reconcile: F,
) where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = ()>,
{
    tracing::info!(lease = %options.name, namespace = %options.namespace, identity = %options.identity,
        "joining leader election");
    let mut elector = Elector::new(client, options);
    while elector.acquire(shutdown).await {
        tracing::info!("became the leader: starting reconciles");
        leading(true);
        let stop = shutdown.child_token();
        tokio::select! {
            // Shutdown drains in-flight reconciles, renewing the Lease meanwhile.
            _ = reconcile(stop) => {}
            lost = elector.keep() => tracing::warn!(why = %lost, "lost leadership: stopping reconciles"),
        }
        leading(false);
        if shutdown.is_cancelled() {
            break;
        }
    }
    match tokio::time::timeout(Duration::from_secs(5), elector.release()).await {
        Ok(Ok(true)) => tracing::info!("released the leader Lease"),
        Ok(Ok(false)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "could not release the leader Lease; it expires by itself"),
        Err(_) => tracing::warn!("releasing the leader Lease timed out; it expires by itself"),
    }
}

/// Why a leader stopped leading.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lost {
    /// The Lease names another holder.
    Taken(String),
    /// No renewal succeeded within the renew deadline.
    NotRenewed(Duration),
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::Taken(holder) => write!(f, "the Lease is held by {holder}"),
            Lost::NotRenewed(deadline) => write!(f, "the Lease was not renewed within {deadline:?}"),
        }
    }
}

/// The outcome of one attempt to take or renew the Lease.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// This replica holds it now.
    Held,
    /// Another holds it and its Lease has not run out.
    HeldBy(String),
    /// Another replica wrote it first.
    Conflict,
}

/// The Lease as this replica last read or wrote it, and since when it has looked that way.
struct Observed {
    lease: Lease,
    since: Instant,
}

/// One replica's side of the election.
struct Elector {
    api: Api<Lease>,
    options: Options,
    observed: Option<Observed>,
}

impl Elector {
    fn new(client: &Client, options: Options) -> Self {
        Elector { api: Api::namespaced(client.clone(), &options.namespace), options, observed: None }
    }

    /// Tries every retry period until this replica holds the Lease; false when shutdown came first.
    /// An attempt may take up to the renew deadline: an API server catching up after etcd came
    /// back can be slow to answer for Leases, and cutting it short would only start again.
    async fn acquire(&mut self, shutdown: &CancellationToken) -> bool {
        let period = self.options.retry_period();
        let mut waiting_for = None;
        loop {
            match tokio::time::timeout(self.options.renew_deadline(), self.try_acquire_or_renew()).await {
                Ok(Ok(Attempt::Held)) => return true,
                Ok(Ok(Attempt::HeldBy(holder))) if waiting_for.as_ref() != Some(&holder) => {
                    tracing::info!(%holder, "the leader Lease is held by another replica: waiting");
                    waiting_for = Some(holder);
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "cannot take the leader Lease; retrying"),
                Err(_) => tracing::debug!("taking the leader Lease timed out; retrying"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(period) => {}
            }
        }
    }

    /// Renews the Lease every retry period while this replica holds it: returns once it is lost.
    async fn keep(&mut self) -> Lost {
        let deadline = self.options.renew_deadline();
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.options.retry_period()).await;
            let left = deadline.saturating_sub(renewed.elapsed());
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(Attempt::Held)) => renewed = Instant::now(),
                Ok(Ok(Attempt::HeldBy(holder))) => return Lost::Taken(holder),
                Ok(Ok(Attempt::Conflict)) => {
                    tracing::debug!("the leader Lease changed while renewing; reading it again")
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "cannot renew the leader Lease; retrying"),
                Err(_) => {}
            }
            if renewed.elapsed() >= deadline {
                return Lost::NotRenewed(deadline);
            }
        }
    }

    /// Reads the Lease and, when it is free, this replica's, or another's that has run out,
    /// writes this replica's claim on it.
    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let Some(current) = self.api.get_opt(&self.options.name).await? else {
            return self.create().await;
        };
        let since = self.observe(current.clone());
        let spec = current.spec.clone().unwrap_or_default();
        if let Some(holder) = running_holder(&spec, &self.options, since, Instant::now()) {
            return Ok(Attempt::HeldBy(holder));
        }
        let claim = Lease { metadata: current.metadata, spec: Some(claim(&self.options, Some(&spec))) };
        let written = self.api.replace(&self.options.name, &self.post_params(), &claim).await;
        self.claimed(written)
    }

    async fn create(&mut self) -> Result<Attempt, kube::Error> {
        let metadata = ObjectMeta {
            name: Some(self.options.name.clone()),
            namespace: Some(self.options.namespace.clone()),
            ..ObjectMeta::default()
        };
        let lease = Lease { metadata, spec: Some(claim(&self.options, None)) };
        let created = self.api.create(&self.post_params(), &lease).await;
        self.claimed(created)
    }

    /// The outcome of writing this replica's claim: held, or another replica wrote first (409).
    fn claimed(&mut self, written: Result<Lease, kube::Error>) -> Result<Attempt, kube::Error> {
        match written {
            Ok(lease) => {
                self.observe(lease);
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Attempt::Conflict),
            Err(e) => Err(e),
        }
    }

    /// Clears the holder when this replica holds the Lease; true when it did.
    async fn release(&mut self) -> Result<bool, kube::Error> {
        let Some(observed) = &self.observed else { return Ok(false) };
        let spec = observed.lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.options.identity.as_str()) {
            return Ok(false);
        }
        let now = MicroTime(Timestamp::now());
        let released = LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..spec
        };
        let lease = Lease { metadata: observed.lease.metadata.clone(), spec: Some(released) };
        self.api.replace(&self.options.name, &self.post_params(), &lease).await?;
        self.observed = None;
        Ok(true)
    }

    /// Records the Lease as read or written; returns since when it has looked as it does now.
    fn observe(&mut self, lease: Lease) -> Instant {
        let since = match &self.observed {
            Some(seen) if seen.lease.spec == lease.spec => seen.since,
            _ => Instant::now(),
        };
        self.observed = Some(Observed { lease, since });
        since
    }

    fn post_params(&self) -> PostParams {
        PostParams { field_manager: Some(self.options.field_manager.clone()), ..PostParams::default() }
    }
}

/// The holder that keeps this replica from writing `spec`, if any: another replica whose Lease
/// has not run out by this replica's clock (unchanged `since`, for the holder's duration).
fn running_holder(spec: &LeaseSpec, options: &Options, since: Instant, now: Instant) -> Option<String> {
    let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty() && *h != options.identity)?;
    let duration =
        spec.lease_duration_seconds.and_then(|s| u64::try_from(s).ok()).map_or(options.duration, Duration::from_secs);
    (now.saturating_duration_since(since) < duration).then(|| holder.to_string())
}

/// This replica's claim on a Lease that was `previous`: a renewal keeps the acquire time and
/// the transitions; a takeover counts one more transition.
fn claim(options: &Options, previous: Option<&LeaseSpec>) -> LeaseSpec {
    let now = MicroTime(Timestamp::now());
    let seconds = i32::try_from(options.duration.as_secs()).unwrap_or(i32::MAX);
    let ours = previous.filter(|p| p.holder_identity.as_deref() == Some(options.identity.as_str()));
    let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(options.identity.clone()),
        lease_duration_seconds: Some(seconds),
        acquire_time: ours.and_then(|p| p.acquire_time.clone()).or_else(|| Some(now.clone())),
        renew_time: Some(now),
        lease_transitions: Some(if ours.is_some() { transitions } else { transitions.saturating_add(1) }),
        ..previous.cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        Options {
            name: "balancer-leader".into(),
            namespace: "balancer-system".into(),
            identity: "me_1".into(),
            duration: Duration::from_secs(15),
            field_manager: "balancer-me_1".into(),
        }
    }

    fn held_by(holder: Option<&str>, seconds: Option<i32>) -> LeaseSpec {
        LeaseSpec { holder_identity: holder.map(String::from), lease_duration_seconds: seconds, ..LeaseSpec::default() }
    }

    #[test]
    fn timings_follow_client_go() {
        let options = options();
        assert_eq!(options.renew_deadline(), Duration::from_secs(10));
        assert_eq!(options.retry_period(), Duration::from_secs(2));
    }

    #[test]
    fn another_holder_keeps_the_lease_for_its_duration_since_it_was_first_seen_so() {
        let options = options();
        let seen = Instant::now();
        let other = held_by(Some("other_7"), Some(6));
        assert_eq!(running_holder(&other, &options, seen, seen + Duration::from_secs(5)), Some("other_7".into()));
        assert_eq!(running_holder(&other, &options, seen, seen + Duration::from_secs(6)), None, "ran out");
        let long = held_by(Some("go-operator"), Some(3600));
        assert!(running_holder(&long, &options, seen, seen + Duration::from_secs(600)).is_some());
        let unstated = held_by(Some("other_7"), None);
        assert!(running_holder(&unstated, &options, seen, seen + Duration::from_secs(14)).is_some(), "ours: 15 s");
        for free in [held_by(None, Some(6)), held_by(Some(""), Some(6)), held_by(Some("me_1"), Some(6))] {
            assert_eq!(running_holder(&free, &options, seen, seen), None, "{free:?}");
        }
    }

    #[test]
    fn a_renewal_keeps_the_acquire_time_and_a_takeover_counts_a_transition() {
        let options = options();
        let acquired = MicroTime("2026-01-01T00:00:00Z".parse().unwrap());
        let mine = LeaseSpec {
            acquire_time: Some(acquired.clone()),
            lease_transitions: Some(3),
            ..held_by(Some("me_1"), Some(15))
        };
        let renewed = claim(&options, Some(&mine));
        assert_eq!((renewed.acquire_time, renewed.lease_transitions), (Some(acquired.clone()), Some(3)));
        let theirs = LeaseSpec {
            acquire_time: Some(acquired.clone()),
            lease_transitions: Some(3),
            ..held_by(Some("x"), Some(6))
        };
        let taken = claim(&options, Some(&theirs));
        assert_eq!(taken.holder_identity.as_deref(), Some("me_1"));
        assert_eq!(taken.lease_duration_seconds, Some(15));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_ne!(taken.acquire_time, Some(acquired));
        assert_eq!(claim(&options, None).lease_transitions, Some(1));
    }
}

//! What reconciles share: clients, caches, settings, metrics, and each Balancer's record.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use tokio::sync::Notify;

use super::cache::ChildCaches;
use super::metrics::ControllerMetrics;
use super::records::Records;
use super::stored::StoredBalancer;
use super::{Error, RESYNC};
use crate::deploy::FIELD_MANAGER;
use crate::proxy::ProxySettings;
use crate::runtime::contact::Contact;
use crate::runtime::events::Events;

/// The controller's clients, both reporting to one [`Contact`].
#[derive(Clone)]
pub struct Clients {
    /// Watches and lists (and the leader Lease): a few long-lived requests, retried on the
    /// controller's own terms (see [`retry`](crate::runtime::retry)), never held by the throttle.
    pub direct: Client,
    /// Every reconcile's request, through the throttle (see [`crate::runtime::throttle`]).
    pub throttled: Client,
    /// Whether the API server answers them.
    pub contact: Contact,
}

/// Which namespaces the controller watches.
#[derive(Debug, Clone)]
pub enum Scope {
    /// Every namespace.
    All,
    /// This namespace only.
    Namespace(String),
}

/// How the controller runs and what it builds.
#[derive(Debug, Clone)]
pub struct Options {
    /// Which namespaces are watched.
    pub scope: Scope,
    /// How the proxies are built.
    pub proxy: ProxySettings,
    /// Balancers reconciled at the same time. kube-runtime's default is no bound at all, and
    /// 1,000 new Balancers then send thousands of requests at once.
    pub concurrency: u16,
    /// Whether the cluster serves Gateway API (see [`crate::gateway::discover`]): then the
    /// Gateway controller runs beside the Balancers'.
    pub gateway_api: bool,
}

/// What reconciles share: the client, the children's caches and the settings.
pub struct Context {
    /// The client every reconcile's request goes through (the throttled one).
    pub client: Client,
    /// The event recorder.
    pub events: Events,
    /// The children's caches, from their watches.
    pub children: ChildCaches,
    /// How the proxies are built.
    pub settings: ProxySettings,
    /// The controller's metrics.
    pub metrics: Arc<ControllerMetrics>,
    /// What the controller remembers of each Balancer between reconciles.
    pub(super) records: Records,
    /// Told when a reconcile wants something new known of its proxy pods (see
    /// [`prober`](super::prober)).
    pub(super) probes_wanted: Notify,
}

impl Context {
    /// A context with no Balancer's bookkeeping yet.
    pub fn new(
        client: Client,
        children: ChildCaches,
        settings: ProxySettings,
        metrics: Arc<ControllerMetrics>,
    ) -> Self {
        let events = Events::new(client.clone(), FIELD_MANAGER);
        Context {
            client,
            events,
            children,
            settings,
            metrics,
            records: Records::default(),
            probes_wanted: Notify::new(),
        }
    }
}

/// Requeues a failed Balancer with exponential backoff: 1 s, 2 s, 4 s … up to 5 minutes.
pub fn error_policy(balancer: Arc<StoredBalancer>, _error: &Error, ctx: Arc<Context>) -> Action {
    let failures = ctx.records.with(&balancer.uid().unwrap_or_default(), |record| {
        record.failures = record.failures.saturating_add(1);
        record.failures
    });
    Action::requeue(backoff(failures))
}

/// `2^(failures-1)` seconds, capped at [`RESYNC`].
pub(super) fn backoff(failures: u32) -> Duration {
    let secs = 1u64.checked_shl(failures.saturating_sub(1)).unwrap_or(u64::MAX);
    Duration::from_secs(secs).min(RESYNC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_resync_period() {
        let secs: Vec<u64> = [1, 2, 3, 4, 9, 10, 64, u32::MAX].iter().map(|&n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 256, 300, 300, 300]);
    }
}

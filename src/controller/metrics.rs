//! The controller's metrics: reconciles by result, their errors and duration, children written,
//! events dropped, leadership, and Balancers by Ready condition.

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::error::ErrorKind;
use crate::runtime::metrics::InFlight;

/// How a reconcile ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ReconcileResult {
    Success,
    Error,
}

impl EncodeLabelValue for ReconcileResult {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        match self {
            ReconcileResult::Success => "success",
            ReconcileResult::Error => "error",
        }
        .encode(encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    result: ReconcileResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReadyLabels {
    ready: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: ErrorKind,
}

impl EncodeLabelValue for ErrorKind {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        self.as_str().encode(encoder)
    }
}

/// One Balancer: the series of these grow with Balancers, never with their endpoints.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BalancerLabels {
    namespace: String,
    balancer: String,
}

/// One Balancer's canary in one phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CanaryPhaseLabels {
    namespace: String,
    balancer: String,
    phase: &'static str,
}

/// Where one Balancer's canary is, for the metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanaryCount {
    /// The Balancer's namespace.
    pub namespace: String,
    /// Its name.
    pub balancer: String,
    /// Its canary's phase.
    pub phase: &'static str,
    /// The step it is on.
    pub step: i64,
    /// The canary backend's percentage of the pair.
    pub weight: i64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// The reconcile loop: reconciles, their errors and duration, children written, leadership.
pub struct ControllerMetrics {
    reconciles: Family<ReconcileLabels, Counter>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: Histogram,
    reconciles_in_flight: Gauge,
    children_applied: Family<KindLabels, Counter>,
    children_deleted: Family<KindLabels, Counter>,
    events_dropped: Counter,
    leader: Gauge,
    balancers: Family<ReadyLabels, Gauge>,
    backends_unavailable: Family<BalancerLabels, Gauge>,
    /// Balancers with a record in memory (see `records`).
    records: Gauge,
    canary_phase: Family<CanaryPhaseLabels, Gauge>,
    canary_step: Family<BalancerLabels, Gauge>,
    canary_weight: Family<BalancerLabels, Gauge>,
}

impl ControllerMetrics {
    /// Registers the controller's series in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = ControllerMetrics {
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Histogram::new([0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            reconciles_in_flight: Gauge::default(),
            children_applied: Family::default(),
            children_deleted: Family::default(),
            events_dropped: Counter::default(),
            leader: Gauge::default(),
            balancers: Family::default(),
            backends_unavailable: Family::default(),
            records: Gauge::default(),
            canary_phase: Family::default(),
            canary_step: Family::default(),
            canary_weight: Family::default(),
        };
        registry.register(
            "canary_phase",
            "1 for the phase each Balancer's canary is in (Progressing, Paused, RollingBack, Aborted, Completed), as the leader sees it",
            metrics.canary_phase.clone(),
        );
        registry.register(
            "canary_step",
            "The step each Balancer's canary is on (0-based; the number of steps once completed)",
            metrics.canary_step.clone(),
        );
        registry.register(
            "canary_weight",
            "The canary backend's percentage of the new connections its pair takes, per Balancer with a canary",
            metrics.canary_weight.clone(),
        );
        registry.register(
            "records",
            "Balancers the controller keeps a record of in memory (failures, status writes, changes being applied), as of the last count",
            metrics.records.clone(),
        );
        registry.register(
            "backends_unavailable",
            "Backends with a weight and no ready endpoint, per Balancer that has any, as the leader sees them",
            metrics.backends_unavailable.clone(),
        );
        registry.register(
            "balancers",
            "Balancers seen by the leader, by their Ready condition (true, false, unknown)",
            metrics.balancers.clone(),
        );
        registry.register("reconciles", "Balancer reconciles, by result", metrics.reconciles.clone());
        registry.register("reconcile_errors", "Failed reconciles, by error kind", metrics.reconcile_errors.clone());
        registry.register("reconcile_duration_seconds", "Time one reconcile takes", metrics.reconcile_duration.clone());
        registry.register(
            "reconciles_in_flight",
            "Reconciles running now (the controller's work in progress)",
            metrics.reconciles_in_flight.clone(),
        );
        registry.register(
            "children_applied",
            "Child objects created or updated, by kind",
            metrics.children_applied.clone(),
        );
        registry.register("children_deleted", "Child objects deleted, by kind", metrics.children_deleted.clone());
        registry.register(
            "events_dropped",
            "Events not published because their Balancer exceeded its event budget",
            metrics.events_dropped.clone(),
        );
        registry.register(
            "controller_leader",
            "1 while this replica runs the reconcile loop (leader, or leader election off), else 0",
            metrics.leader.clone(),
        );
        for result in [ReconcileResult::Success, ReconcileResult::Error] {
            let _ = metrics.reconciles.get_or_create(&ReconcileLabels { result });
        }
        for kind in ErrorKind::ALL {
            let _ = metrics.reconcile_errors.get_or_create(&ErrorLabels { kind });
        }
        for kind in ["Service", "ConfigMap", "Deployment"] {
            let _ = metrics.children_applied.get_or_create(&KindLabels { kind: kind.into() });
        }
        let _ = metrics.children_deleted.get_or_create(&KindLabels { kind: "Service".into() });
        metrics.set_balancers(0, 0, 0);
        metrics
    }

    /// Marks a reconcile as started; the guard counts it out when dropped.
    pub fn reconcile_started(&self) -> InFlight {
        InFlight::enter(&self.reconciles_in_flight)
    }

    /// Counts a finished reconcile, with its error's kind when it failed, and times it.
    pub fn reconciled(&self, result: ReconcileResult, error_kind: Option<ErrorKind>, elapsed: Duration) {
        self.reconciles.get_or_create(&ReconcileLabels { result }).inc();
        if let Some(kind) = error_kind {
            self.reconcile_errors.get_or_create(&ErrorLabels { kind }).inc();
        }
        self.reconcile_duration.observe(elapsed.as_secs_f64());
    }

    /// Counts a child of `kind` written.
    pub fn child_applied(&self, kind: &str) {
        self.children_applied.get_or_create(&KindLabels { kind: kind.to_string() }).inc();
    }

    /// Counts a child of `kind` deleted.
    pub fn child_deleted(&self, kind: &str) {
        self.children_deleted.get_or_create(&KindLabels { kind: kind.to_string() }).inc();
    }

    /// Counts an event the budget dropped.
    pub fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    /// Balancers by Ready condition; all zero when this replica does not reconcile.
    pub fn set_balancers(&self, ready: i64, not_ready: i64, unknown: i64) {
        for (label, count) in [("true", ready), ("false", not_ready), ("unknown", unknown)] {
            self.balancers.get_or_create(&ReadyLabels { ready: label }).set(count);
        }
    }

    /// How many Balancers the controller keeps a record of in memory.
    pub fn set_records(&self, records: usize) {
        self.records.set(i64::try_from(records).unwrap_or(i64::MAX));
    }

    /// The Balancers that have backends with a weight and no ready endpoint, and how many:
    /// only those have a series, so a Balancer fixed or deleted leaves none behind.
    pub fn set_backends_unavailable(&self, unavailable: impl IntoIterator<Item = (String, String, i64)>) {
        self.backends_unavailable.clear();
        for (namespace, balancer, count) in unavailable {
            self.backends_unavailable.get_or_create(&BalancerLabels { namespace, balancer }).set(count);
        }
    }

    /// Where each Balancer with a canary is: only those have series, so a canary removed from
    /// its spec, or a Balancer deleted, leaves none behind.
    pub fn set_canaries(&self, canaries: impl IntoIterator<Item = CanaryCount>) {
        self.canary_phase.clear();
        self.canary_step.clear();
        self.canary_weight.clear();
        for canary in canaries {
            let labels = BalancerLabels { namespace: canary.namespace, balancer: canary.balancer };
            let phase = CanaryPhaseLabels {
                namespace: labels.namespace.clone(),
                balancer: labels.balancer.clone(),
                phase: canary.phase,
            };
            self.canary_phase.get_or_create(&phase).set(1);
            self.canary_step.get_or_create(&labels).set(canary.step);
            self.canary_weight.get_or_create(&labels).set(canary.weight);
        }
    }

    /// Records whether this replica holds the leader Lease.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }
}

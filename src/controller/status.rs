//! The status a reconcile arrives at, as pure functions: counts, the `Ready` condition, which
//! change of it deserves an event, and when a write of it waits.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::backends::Backends;
use super::conditions::{ConditionType, Finding, find, is_true};
use super::exposure::Exposure;
use super::programmed::Programmed;
use super::reasons::Reason;
use super::stored::StoredBalancer;
use crate::api::canary::CanaryStatus;
use crate::api::{BalancerStatus, ConditionStatus};
use crate::proxy;
use crate::runtime::events::EventType;

/// What a reconcile observed of the children, for the status: the backend Services, the
/// proxy pods, where the front Service is reached, and each backend's endpoints.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Observed {
    pub active: usize,
    pub obsolete: usize,
    pub proxy: ProxyCounts,
    pub exposure: Exposure,
    /// What each backend's endpoints say; `None` keeps what the status said (a reconcile that
    /// stopped before the backends were known).
    pub backends: Option<Backends>,
    /// How many proxy pods serve the current configuration, and the `Programmed` condition
    /// (with live configuration only); `None` keeps what the status said.
    pub programmed: Option<(i32, Condition)>,
    /// The canary's status: `Some(None)` when the spec has no canary; `None` keeps what the
    /// status said.
    pub canary: Option<Option<CanaryStatus>>,
}

/// The proxy pods, for the scale subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct ProxyCounts {
    pub replicas: i32,
    pub ready: i32,
}

impl ProxyCounts {
    pub(super) fn of(deployment: &Deployment) -> Self {
        let status = deployment.status.as_ref();
        ProxyCounts {
            replicas: status.and_then(|s| s.replicas).unwrap_or(0),
            ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
        }
    }

    /// What the status said last (a reconcile that stops early does not look at the Deployment).
    pub(super) fn previous(balancer: &StoredBalancer) -> Self {
        let status = balancer.status.as_ref();
        ProxyCounts { replicas: status.map_or(0, |s| s.replicas), ready: status.map_or(0, |s| s.ready_replicas) }
    }
}

/// `Ready` from the proxy Deployment: rolled out (no pod of an older template left, as
/// `kubectl rollout status` has it) and available. Until then the old pods may still send
/// traffic to backends the spec no longer names.
pub(super) fn proxy_condition(
    balancer: &StoredBalancer,
    deployment: &Deployment,
    active: usize,
    now: Timestamp,
) -> Condition {
    let name = deployment.name_any();
    let want = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let status = deployment.status.clone().unwrap_or_default();
    let observed = status.observed_generation.unwrap_or(0) >= deployment.metadata.generation.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    let old = status.replicas.unwrap_or(0) - updated;
    let available = status.available_replicas.unwrap_or(0);
    if want == 0 {
        let message = format!("proxy Deployment {name} is scaled to zero: no traffic is served");
        return ready_condition(balancer, ConditionStatus::False, Reason::ScaledToZero, &message, now);
    }
    if observed && updated >= want && old <= 0 && available >= want {
        let message = format!("proxy Deployment {name} is available ({available}/{want}); {active} backends active");
        ready_condition(balancer, ConditionStatus::True, Reason::ProxyAvailable, &message, now)
    } else {
        // The message gives only the available count: the updated count changes as the
        // Deployment controller starts a rollout, and every change of the message costs a status
        // write.
        let message = format!("waiting for proxy Deployment {name} to roll out ({available}/{want} available)");
        ready_condition(balancer, ConditionStatus::False, Reason::ProxyNotAvailable, &message, now)
    }
}

/// `ready`, unless the Balancer is becoming Ready (with live delivery) while some proxy pod
/// does not serve the current configuration yet, or while its front Service lists no ready
/// proxy pod: such a pod may run an earlier file, which skips a backend whose pods just became
/// ready, and without a ready endpoint nothing reaches the proxy. Once Ready, a change does not
/// take it away; the `Programmed` condition follows each change.
pub(super) fn served_when_ready(
    balancer: &StoredBalancer,
    ready: Condition,
    programmed: Option<Programmed>,
    front_endpoints: u32,
    now: Timestamp,
) -> Condition {
    let was_ready = find(balancer.status.as_ref(), ConditionType::Ready).is_some_and(is_true);
    let Some(p) = programmed.filter(|_| is_true(&ready) && !was_ready) else { return ready };
    let message = match (p.all(), front_endpoints) {
        (false, _) => format!("waiting for the proxy pods to serve the configuration ({} of {} do)", p.serving, p.pods),
        (true, 0) => "waiting for the front Service to list a ready proxy pod".to_string(),
        (true, _) => return ready,
    };
    ready_condition(balancer, ConditionStatus::False, Reason::ConfigurationNotServed, &message, now)
}

/// The `Ready` condition with `status` for `reason`, as of `now`.
pub(super) fn ready_condition(
    balancer: &StoredBalancer,
    status: ConditionStatus,
    reason: Reason,
    message: &str,
    now: Timestamp,
) -> Condition {
    Finding { type_: ConditionType::Ready, status, reason, message }.replacing(balancer, now)
}

/// The status a reconcile arrives at. `ready`, the backends' condition (when known) and
/// `takeover` (the Go-operator takeover's, see [`migration`](super::migration)) replace their
/// namesakes in place; other conditions are kept.
pub(super) fn next_status(
    balancer: &StoredBalancer,
    observed: Observed,
    ready: Condition,
    takeover: Option<Condition>,
) -> BalancerStatus {
    let previous = balancer.status.as_ref();
    let (backends, backends_ready, available) = match observed.backends {
        Some(b) => (b.statuses, Some(b.summary), Some(b.condition)),
        None => (
            previous.map(|s| s.backends.clone()).unwrap_or_default(),
            previous.and_then(|s| s.backends_ready.clone()),
            None,
        ),
    };
    let (configured_replicas, programmed) = match observed.programmed {
        Some((serving, condition)) => (Some(serving), Some(condition)),
        None => (previous.and_then(|s| s.configured_replicas), None),
    };
    let mut conditions: Vec<Condition> = previous.map(|s| s.conditions.clone()).unwrap_or_default();
    for new in [Some(ready), available, takeover, programmed].into_iter().flatten() {
        // Replaced in place, so the list keeps its order: a status that did not change then
        // compares equal to the stored one and is not written again.
        match conditions.iter_mut().find(|c| c.type_ == new.type_) {
            Some(old) => *old = new,
            None => conditions.push(new),
        }
    }
    BalancerStatus {
        replicas: observed.proxy.replicas,
        ready_replicas: observed.proxy.ready,
        addresses: observed.exposure.addresses,
        node_ports: observed.exposure.node_ports,
        selector: balancer.metadata.name.as_deref().map(proxy::proxy_selector_string),
        active_backends: i32::try_from(observed.active).unwrap_or(i32::MAX),
        obsolete_backends: i32::try_from(observed.obsolete).unwrap_or(i32::MAX),
        backends,
        backends_ready,
        configured_replicas,
        observed_generation: balancer.metadata.generation,
        canary: observed.canary.unwrap_or_else(|| previous.and_then(|s| s.canary.clone())),
        conditions,
    }
}

/// The least time between two status writes when the second changes only what the backends'
/// endpoints say: a pod flapping every second costs one write per Balancer per interval, and
/// the status is at most this late.
pub const READINESS_WRITE_INTERVAL: Duration = Duration::from_secs(5);

/// How long a write of `next` over `stored` waits, if it must: only a change of backend
/// readiness alone (the ready endpoints, the shares, `backendsReady`, `BackendsAvailable`)
/// waits, until [`READINESS_WRITE_INTERVAL`] after the `last` write.
pub(super) fn hold(
    stored: &BalancerStatus,
    next: &BalancerStatus,
    last: Option<Timestamp>,
    now: Timestamp,
) -> Option<Duration> {
    let without_readiness = |status: &BalancerStatus| BalancerStatus {
        backends: Vec::new(),
        backends_ready: None,
        conditions: status
            .conditions
            .iter()
            .filter(|c| c.type_ != ConditionType::BackendsAvailable.as_str())
            .cloned()
            .collect(),
        ..status.clone()
    };
    if without_readiness(stored) != without_readiness(next) {
        return None;
    }
    interval_left(last, now)
}

/// What is left of [`READINESS_WRITE_INTERVAL`] since the `last` write, if any.
///
/// Also how long after its own write the controller looks at an unchanged status again: the
/// cached Balancer may not show that write yet, so a reconcile that finds the status it wants
/// in the cache may be comparing with the status before it, and would otherwise leave a write
/// that a later change undid (2 ready, then 3 again) until the resync.
pub(super) fn interval_left(last: Option<Timestamp>, now: Timestamp) -> Option<Duration> {
    // When the clock went back, `last` is in the future and nothing is held: otherwise a write
    // would wait for as long as the clock jumped.
    let elapsed = Duration::try_from(now.duration_since(last?)).ok()?;
    let left = READINESS_WRITE_INTERVAL.checked_sub(elapsed).filter(|left| !left.is_zero())?;
    // In whole milliseconds, rounded up: a wake-up before the interval is over would wait again.
    Some(Duration::from_millis(u64::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)))
}

/// Whether a refusal is about the stored spec (its causes, or its message, name a `spec` field).
pub(super) fn names_spec(status: &kube::core::Status) -> bool {
    let causes = status.details.as_ref().map(|d| d.causes.as_slice()).unwrap_or_default();
    causes.iter().any(|c| c.field.starts_with("spec")) || status.message.contains(": spec.")
}

/// The event a change of `Ready` deserves, if any: every change of status or reason, but not a
/// new Balancer waiting for its first proxy pods (progress, not a warning).
pub(super) fn ready_event(was: Option<&Condition>, ready: &Condition) -> Option<EventType> {
    let first_rollout = was.is_none() && ready.reason == Reason::ProxyNotAvailable.as_str();
    let changed = was.is_none_or(|c| c.status != ready.status || c.reason != ready.reason);
    match (first_rollout, changed) {
        (false, true) if is_true(ready) => Some(EventType::Normal),
        (false, true) => Some(EventType::Warning),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;
    use crate::spec::FieldError;

    const NOW: &str = "2026-11-24T08:00:00Z";
    const EARLIER: &str = "2026-11-24T07:00:00Z";

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    /// A stored Balancer whose Ready condition, if any, is `ready` since [`EARLIER`].
    fn balancer(ready: Option<(&str, &str)>) -> StoredBalancer {
        let conditions = ready.into_iter().map(|(status, reason)| Condition {
            type_: ConditionType::Ready.as_str().into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(at(EARLIER)),
        });
        StoredBalancer {
            metadata: ObjectMeta { name: Some("lb".into()), generation: Some(2), ..ObjectMeta::default() },
            spec: Err(FieldError::new("spec", "not read by these rules")),
            status: Some(BalancerStatus { conditions: conditions.collect(), ..BalancerStatus::default() }),
        }
    }

    fn deployment(want: i32, status: DeploymentStatus) -> Deployment {
        Deployment {
            metadata: ObjectMeta { name: Some("lb-proxy".into()), generation: Some(3), ..ObjectMeta::default() },
            spec: Some(DeploymentSpec { replicas: Some(want), ..DeploymentSpec::default() }),
            status: Some(status),
        }
    }

    fn rolled_out(n: i32) -> DeploymentStatus {
        DeploymentStatus {
            observed_generation: Some(3),
            replicas: Some(n),
            updated_replicas: Some(n),
            available_replicas: Some(n),
            ..DeploymentStatus::default()
        }
    }

    #[test]
    fn ready_follows_the_proxy_rollout() {
        let stale = DeploymentStatus { observed_generation: Some(2), ..rolled_out(2) };
        let old_pod_left = DeploymentStatus { replicas: Some(3), ..rolled_out(2) };
        let cases = [
            (deployment(2, rolled_out(2)), "True", Reason::ProxyAvailable),
            (deployment(2, stale), "False", Reason::ProxyNotAvailable),
            (deployment(2, old_pod_left), "False", Reason::ProxyNotAvailable),
            (deployment(2, rolled_out(1)), "False", Reason::ProxyNotAvailable),
            (deployment(0, rolled_out(0)), "False", Reason::ScaledToZero),
        ];
        for (deployment, status, reason) in cases {
            let ready = proxy_condition(&balancer(None), &deployment, 3, at(NOW));
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                (status, reason.as_str()),
                "{:?}",
                deployment.status
            );
            assert_eq!(ready.observed_generation, Some(2));
        }
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_flips() {
        use ConditionStatus::{False, True};
        let moved_at = |was: Option<(&str, &str)>, status: ConditionStatus, reason: Reason| {
            ready_condition(&balancer(was), status, reason, "", at(NOW)).last_transition_time
        };
        assert_eq!(
            moved_at(Some(("True", Reason::ProxyAvailable.as_str())), True, Reason::ProxyAvailable),
            Time(at(EARLIER))
        );
        let reason_only = moved_at(Some(("False", Reason::InvalidSpec.as_str())), False, Reason::ScaledToZero);
        assert_eq!(reason_only, Time(at(EARLIER)), "the same status with a new reason");
        assert_eq!(
            moved_at(Some(("False", Reason::ProxyNotAvailable.as_str())), True, Reason::ProxyAvailable),
            Time(at(NOW))
        );
        assert_eq!(moved_at(None, False, Reason::ProxyNotAvailable), Time(at(NOW)));
    }

    #[test]
    fn every_change_of_ready_is_an_event_but_a_first_rollout() {
        let ready = |status: &str, reason: Reason| {
            ready_condition(&balancer(None), status.parse().unwrap(), reason, "", at(NOW))
        };
        let cases = [
            (None, ready("False", Reason::ProxyNotAvailable), None),
            (None, ready("True", Reason::ProxyAvailable), Some(EventType::Normal)),
            (None, ready("False", Reason::InvalidSpec), Some(EventType::Warning)),
            (
                Some(ready("False", Reason::ProxyNotAvailable)),
                ready("True", Reason::ProxyAvailable),
                Some(EventType::Normal),
            ),
            (Some(ready("True", Reason::ProxyAvailable)), ready("True", Reason::ProxyAvailable), None),
            (
                Some(ready("True", Reason::ProxyAvailable)),
                ready("False", Reason::ProxyNotAvailable),
                Some(EventType::Warning),
            ),
            (
                Some(ready("False", Reason::ProxyNotAvailable)),
                ready("False", Reason::ScaledToZero),
                Some(EventType::Warning),
            ),
        ];
        for (was, now, event) in cases {
            assert_eq!(
                ready_event(was.as_ref(), &now),
                event,
                "{:?} -> {}/{}",
                was.map(|c| c.reason),
                now.status,
                now.reason
            );
        }
    }

    #[test]
    fn only_a_change_of_readiness_alone_waits_and_only_within_the_interval() {
        let stored =
            BalancerStatus { backends_ready: Some("3/3".into()), active_backends: 3, ..BalancerStatus::default() };
        let readiness = BalancerStatus { backends_ready: Some("2/3".into()), ..stored.clone() };
        let more = BalancerStatus { active_backends: 2, ..readiness.clone() };
        let last = at(NOW);
        let after =
            |secs: i64| last.checked_add(k8s_openapi::jiff::SignedDuration::from_millis(secs * 1000 + 300)).unwrap();
        assert_eq!(hold(&stored, &readiness, Some(last), after(1)), Some(Duration::from_millis(3700)));
        assert_eq!(hold(&stored, &readiness, Some(last), after(5)), None, "the interval is over");
        assert_eq!(hold(&stored, &readiness, None, after(0)), None, "no write since the operator started");
        assert_eq!(hold(&stored, &more, Some(last), after(0)), None, "other news is written at once");
        assert_eq!(hold(&stored, &readiness, Some(after(60)), after(0)), None, "a clock that went back holds nothing");
    }

    #[test]
    fn the_next_status_replaces_ready_and_keeps_other_conditions() {
        let mut stored = balancer(Some(("False", Reason::ProxyNotAvailable.as_str())));
        let other = Condition { type_: "Other".into(), ..stored.status.as_ref().unwrap().conditions[0].clone() };
        stored.status.as_mut().unwrap().conditions.push(other.clone());
        let counts = Observed {
            active: 3,
            obsolete: 1,
            proxy: ProxyCounts { replicas: 2, ready: 1 },
            exposure: Exposure::previous(None),
            backends: None,
            programmed: None,
            canary: None,
        };
        let ready = ready_condition(&stored, ConditionStatus::True, Reason::ProxyAvailable, "serving", at(NOW));
        let status = next_status(&stored, counts, ready.clone(), None);
        assert_eq!(status.conditions, vec![ready, other], "replaced in place");
        assert_eq!((status.active_backends, status.obsolete_backends), (3, 1));
        assert_eq!((status.replicas, status.ready_replicas, status.observed_generation), (2, 1, Some(2)));
        assert_eq!(status.selector.as_deref(), Some(proxy::proxy_selector_string("lb").as_str()));
    }

    #[test]
    fn a_new_balancer_is_ready_only_once_its_proxies_serve_and_its_front_lists_one() {
        let available =
            |b: &StoredBalancer| ready_condition(b, ConditionStatus::True, Reason::ProxyAvailable, "ok", at(NOW));
        let (new, ready) = (
            balancer(Some(("False", Reason::ProxyNotAvailable.as_str()))),
            balancer(Some(("True", Reason::ProxyAvailable.as_str()))),
        );
        let half = Some(Programmed { serving: 1, pods: 2 });
        let all = Some(Programmed { serving: 2, pods: 2 });
        let reason = |b: &StoredBalancer, p: Option<Programmed>, front: u32| {
            let c = served_when_ready(b, available(b), p, front, at(NOW));
            (c.status, c.reason)
        };
        let waiting = ("False".to_string(), Reason::ConfigurationNotServed.as_str().to_string());
        let served = ("True".to_string(), Reason::ProxyAvailable.as_str().to_string());
        assert_eq!(reason(&new, half, 2), waiting, "a pod on an earlier configuration");
        assert_eq!(reason(&new, all, 0), waiting, "nothing reaches the proxy yet");
        assert_eq!(reason(&new, all, 2), served);
        assert_eq!(reason(&ready, half, 2), served, "a change does not take Ready away");
        assert_eq!(reason(&new, None, 0), served, "without live delivery, the Deployment says");
    }
}

//! Taking a Balancer over from the Go operator (hliangzhao/balancer) without a gap in service.
//!
//! The Go operator gives a Balancer backend Services `<name>-<backend>-backend`, a front
//! Service `<name>` and a ConfigMap `<name>-proxy-configmap`: the names this operator uses, so
//! the controller takes them over as it does any child whose controller owner reference names
//! the same Balancer UID (the front and backend Services keep their cluster IPs). Its proxy
//! Deployment has another name, `<name>proxy`, and its pods carry only the label
//! `balancer.exposer.hliangzhao.io/balancer-name`, which this operator's proxy pods carry too.
//! So while this operator's proxy rolls out, the front Service selects by that label alone
//! (both proxies serve); once it is available, the front Service selects only it, and
//! [`DRAIN`] later, when kube-proxy everywhere has dropped the Go pods, their Deployment is
//! deleted. A `<name>proxy` Deployment that another owner controls is left alone and reported.
//!
//! Where a Balancer stands is kept in its status, as the condition `GoOperatorProxy`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use super::conditions::{ConditionType, Finding, find};
use super::reasons::Reason;
use super::stored::StoredBalancer;
use crate::api::ConditionStatus;
use crate::proxy::BALANCER_NAME_LABEL;

/// Time between the front Service leaving the Go operator's proxy pods and their deletion.
pub(super) const DRAIN: Duration = Duration::from_secs(10);

/// The Go operator's proxy Deployment of a Balancer.
pub(super) fn deployment_name(balancer: &str) -> String {
    format!("{balancer}proxy")
}

/// The front Service's selector while both proxies serve: the Go operator's own.
pub(super) fn shared_selector(balancer: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(BALANCER_NAME_LABEL.to_string(), balancer.to_string())])
}

/// Where a Balancer stands, from its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Stage {
    /// Never looked for: the status is the Go operator's, or no reconcile here has got far.
    Unchecked,
    /// The Go operator's proxy serves, alongside this operator's while it rolls out.
    Serving,
    /// The front Service left the Go proxy pods at `since`.
    Draining { since: Timestamp },
    /// Nothing to do, or nothing left to do.
    Done,
}

/// What a look for the Go operator's proxy Deployment found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    Absent,
    /// Its controller owner reference names this Balancer's UID: provably the Go operator's
    /// child of this very Balancer.
    Controlled,
    NotControlled,
}

/// Reads the stage. For a new Balancer (no status yet) the Go proxy is never looked for: the Go
/// operator wrote a status on every Balancer it reconciled. For one whose reconciles here have
/// not yet reached the proxy, it is looked for on every attempt: that costs a read per retry,
/// and only until a reconcile gets that far.
pub(super) fn stage(balancer: &StoredBalancer) -> Stage {
    let Some(status) = balancer.status.as_ref() else { return Stage::Done };
    match find(Some(status), ConditionType::GoOperatorProxy) {
        Some(c) if Reason::of(&c.reason) == Some(Reason::Serving) => Stage::Serving,
        Some(c) if Reason::of(&c.reason) == Some(Reason::Draining) => {
            Stage::Draining { since: c.last_transition_time.0 }
        }
        Some(_) => Stage::Done,
        // Only a reconcile that got as far as the proxy writes these reasons. One that failed or
        // refused the spec before that point never looked for the Go proxy.
        None => match find(Some(status), ConditionType::Ready) {
            Some(ready) if Reason::of(&ready.reason).is_some_and(|r| Reason::PROXY_READY.contains(&r)) => Stage::Done,
            _ => Stage::Unchecked,
        },
    }
}

/// What one reconcile does about the Go operator's proxy.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Step {
    /// The front Service selects both proxies' pods.
    pub shared_front: bool,
    /// Delete the Go operator's proxy Deployment now.
    pub delete: bool,
    /// The condition to record, if it changes.
    pub condition: Option<Condition>,
    /// Come back this soon.
    pub requeue: Option<Duration>,
}

impl Step {
    const NONE: Step = Step { shared_front: false, delete: false, condition: None, requeue: None };

    /// The front Service of `balancer` as this step wants it: selecting both proxies' pods
    /// while they share the traffic.
    pub(super) fn shape_front(&self, balancer: &str, front: &mut Service) {
        if let Some(spec) = front.spec.as_mut().filter(|_| self.shared_front) {
            spec.selector = Some(shared_selector(balancer));
        }
    }
}

/// The next step, from the stage (with what a look found, if one was made), whether this
/// operator's proxy is available, and the time.
pub(super) fn step(balancer: &str, stage: &Stage, found: Option<Found>, available: bool, now: Timestamp) -> Step {
    let go = deployment_name(balancer);
    let ours = crate::api::proxy_deployment_name(balancer);
    match (stage, found) {
        (Stage::Serving, _) | (Stage::Unchecked, Some(Found::Controlled)) => {}
        (Stage::Unchecked, Some(Found::NotControlled)) => {
            let message = format!("Deployment {go} is not controlled by this Balancer: left alone");
            return Step {
                condition: Some(condition(ConditionStatus::False, Reason::NotControlled, message, now)),
                ..Step::NONE
            };
        }
        (Stage::Draining { since }, _) => {
            // A transition time ahead of this clock (another replica's) counts as just now.
            let elapsed = Duration::try_from(now.duration_since(*since)).unwrap_or_default();
            if elapsed < DRAIN {
                return Step { requeue: Some(DRAIN - elapsed), ..Step::NONE };
            }
            let message = format!("the Go operator's proxy Deployment {go} was deleted once {ours} served");
            return Step {
                delete: true,
                condition: Some(condition(ConditionStatus::False, Reason::Removed, message, now)),
                ..Step::NONE
            };
        }
        _ => return Step::NONE,
    }
    if available {
        let message = format!("{ours} serves alone; the Go operator's proxy Deployment {go} is deleted in {DRAIN:?}");
        Step {
            condition: Some(condition(ConditionStatus::False, Reason::Draining, message, now)),
            requeue: Some(DRAIN),
            ..Step::NONE
        }
    } else {
        let message = format!("the Go operator's proxy Deployment {go} serves alongside {ours} until it is available");
        let recorded = *stage == Stage::Serving;
        Step {
            shared_front: true,
            condition: (!recorded).then(|| condition(ConditionStatus::True, Reason::Serving, message, now)),
            ..Step::NONE
        }
    }
}

/// The takeover's condition: written once per stage, so it has no earlier time to keep.
fn condition(status: ConditionStatus, reason: Reason, message: String, now: Timestamp) -> Condition {
    Finding { type_: ConditionType::GoOperatorProxy, status, reason, message: &message }.at(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).expect("a time")
    }

    #[test]
    fn the_go_proxy_serves_until_ours_is_available_then_drains_then_goes() {
        let first = step("b", &Stage::Unchecked, Some(Found::Controlled), false, at(0));
        assert!(first.shared_front && !first.delete);
        assert_eq!(first.condition.as_ref().map(|c| c.reason.as_str()), Some(Reason::Serving.as_str()));
        let waiting = step("b", &Stage::Serving, None, false, at(5));
        assert_eq!((waiting.shared_front, waiting.condition), (true, None), "nothing new to record");
        let switched = step("b", &Stage::Serving, None, true, at(9));
        assert!(!switched.shared_front && !switched.delete);
        assert_eq!(switched.requeue, Some(DRAIN));
        assert_eq!(switched.condition.as_ref().map(|c| c.reason.as_str()), Some(Reason::Draining.as_str()));
        let early = step("b", &Stage::Draining { since: at(9) }, None, true, at(15));
        assert_eq!((early.delete, early.requeue), (false, Some(Duration::from_secs(4))));
        let done = step("b", &Stage::Draining { since: at(9) }, None, true, at(19));
        assert!(done.delete && !done.shared_front);
        assert_eq!(
            done.condition.map(|c| c.message),
            Some("the Go operator's proxy Deployment bproxy was deleted once b-proxy served".into())
        );
    }

    #[test]
    fn a_namesake_or_nothing_is_left_alone() {
        let other = step("b", &Stage::Unchecked, Some(Found::NotControlled), true, at(0));
        assert!(!other.shared_front && !other.delete);
        assert_eq!(other.condition.map(|c| c.reason), Some(Reason::NotControlled.as_str().to_string()));
        assert_eq!(step("b", &Stage::Unchecked, Some(Found::Absent), true, at(0)), Step::NONE);
        assert_eq!(step("b", &Stage::Done, None, true, at(0)), Step::NONE);
    }

    #[test]
    fn the_front_selects_both_proxies_only_while_they_share_the_traffic() {
        use k8s_openapi::api::core::v1::ServiceSpec;
        let ours = BTreeMap::from([("app.kubernetes.io/component".to_string(), "proxy".to_string())]);
        let front = Service {
            spec: Some(ServiceSpec { selector: Some(ours.clone()), ..ServiceSpec::default() }),
            ..Service::default()
        };
        let selector = |step: &Step| {
            let mut front = front.clone();
            step.shape_front("b", &mut front);
            front.spec.and_then(|s| s.selector)
        };
        let sharing = step("b", &Stage::Serving, None, false, at(0));
        assert_eq!(selector(&sharing), Some(shared_selector("b")));
        let alone = step("b", &Stage::Serving, None, true, at(0));
        assert_eq!(selector(&alone), Some(ours));
    }
}

//! The conditions of a Balancer's status, built in one place: their types, their statuses, and
//! how a new condition keeps the transition time of the one it replaces.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::reasons::Reason;
use super::stored::StoredBalancer;
use crate::api::{BalancerStatus, ConditionStatus};
use crate::runtime::conditions::keep_transition;

/// The condition types of a Balancer's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
pub enum ConditionType {
    /// The proxy serves the spec: rolled out and available.
    Ready,
    /// Every backend with a weight has a ready endpoint.
    BackendsAvailable,
    /// Where the takeover from the Go operator stands (see [`migration`](super::migration)).
    GoOperatorProxy,
    /// Every proxy pod serves the current configuration (with live configuration: see
    /// [`programmed`](super::programmed)). Gateway API's name for the same fact.
    Programmed,
}

impl ConditionType {
    /// The type as the status writes it.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The condition of `type_` in `status`, if it has one.
pub(super) fn find(status: Option<&BalancerStatus>, type_: ConditionType) -> Option<&Condition> {
    status?.conditions.iter().find(|c| c.type_ == type_.as_str())
}

/// Whether a condition's status is `True`.
pub(super) fn is_true(condition: &Condition) -> bool {
    condition.status == ConditionStatus::True.as_str()
}

/// What a reconcile found about one condition.
#[derive(Debug, Clone, Copy)]
pub(super) struct Finding<'a> {
    pub type_: ConditionType,
    pub status: ConditionStatus,
    pub reason: Reason,
    pub message: &'a str,
}

impl Finding<'_> {
    /// The condition that replaces its namesake in `balancer`'s status: it keeps that one's
    /// transition time while the status stays the same (else it is `now`), and records the
    /// generation it was found for.
    pub(super) fn replacing(self, balancer: &StoredBalancer, now: Timestamp) -> Condition {
        let condition = Condition { observed_generation: balancer.metadata.generation, ..self.at(now) };
        keep_transition(condition, find(balancer.status.as_ref(), self.type_))
    }

    /// The condition as of `now`, for no particular generation.
    pub(super) fn at(self, now: Timestamp) -> Condition {
        Condition {
            type_: self.type_.as_str().into(),
            status: self.status.as_str().into(),
            reason: self.reason.as_str().into(),
            message: self.message.into(),
            observed_generation: None,
            last_transition_time: Time(now),
        }
    }
}

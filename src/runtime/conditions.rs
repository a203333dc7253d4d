//! The rule of Kubernetes' `metav1.Condition` that every status here follows: a condition's
//! `lastTransitionTime` is when its status last changed, not when it was last written.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// `condition`, with the transition time of `previous` (its namesake in the status being
/// replaced) while the status is the same.
pub fn keep_transition(condition: Condition, previous: Option<&Condition>) -> Condition {
    match previous.filter(|p| p.type_ == condition.type_ && p.status == condition.status) {
        Some(previous) => Condition { last_transition_time: previous.last_transition_time.clone(), ..condition },
        None => condition,
    }
}

//! The proxy's PodDisruptionBudget.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta::{COMPONENT_PROXY, Owner, labels, metadata, proxy_selector};
use crate::api;

/// `<balancer>-proxy` PodDisruptionBudget, for Balancers with more than one proxy pod: a drain
/// or an eviction takes at most one of them at a time. (With one pod, a budget could only
/// block drains or allow everything.)
pub fn proxy_disruption_budget(owner: &Owner) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: metadata(owner, api::proxy_deployment_name(&owner.name), labels(&owner.name, COMPONENT_PROXY)),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector { match_labels: Some(proxy_selector(&owner.name)), match_expressions: None }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

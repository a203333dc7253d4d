//! Typed waits on Balancers: kube's `await_condition` watches the object and returns as soon
//! as a condition holds, without polling untyped JSON.

use std::time::{Duration, Instant};

use balancer::api::Balancer;
use kube::Api;
use kube::runtime::wait::{Condition, await_condition};

/// Watches Balancer `name` until `condition` holds and returns it, or panics with `what` after
/// `timeout`. A watch that breaks (the API server restarting, say) is started again: only the
/// deadline fails the wait, as a poll that ignores failed reads would.
pub async fn balancer_until(
    api: &Api<Balancer>,
    name: &str,
    what: &str,
    timeout: Duration,
    condition: impl Condition<Balancer> + Clone,
) -> Balancer {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, await_condition(api.clone(), name, condition.clone())).await {
            Ok(Ok(Some(balancer))) => return balancer,
            Ok(Ok(None)) => panic!("Balancer {name} went away while waiting for {what}"),
            Ok(Err(_)) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(250)).await,
            Ok(Err(e)) => panic!("waiting for {what}: {e}"),
            Err(_) => panic!("timed out after {timeout:?} waiting for {what}"),
        }
    }
}

/// `Ready=True` for the Balancer's current generation.
pub fn is_ready() -> impl Condition<Balancer> + Clone {
    |balancer: Option<&Balancer>| {
        let Some(balancer) = balancer else { return false };
        let Some(status) = &balancer.status else { return false };
        status.observed_generation == balancer.metadata.generation && condition_is(balancer, "Ready", "True")
    }
}

/// The status describes the Balancer's current generation: the controller reconciled it.
pub fn generation_observed() -> impl Condition<Balancer> + Clone {
    |balancer: Option<&Balancer>| {
        let Some(balancer) = balancer else { return false };
        balancer.status.as_ref().is_some_and(|s| s.observed_generation == balancer.metadata.generation)
    }
}

/// `status.backends` shows `ready` endpoints and `shares`, in spec order, and the
/// `BackendsAvailable` condition's status is `available` ("True" or "False").
pub fn backends_show(
    ready: &[i32],
    shares: &[i32],
    available: &'static str,
) -> impl Condition<Balancer> + Clone + use<> {
    let want: Vec<(i32, i32)> = ready.iter().copied().zip(shares.iter().copied()).collect();
    move |balancer: Option<&Balancer>| {
        let Some(balancer) = balancer else { return false };
        let Some(status) = &balancer.status else { return false };
        let seen: Vec<(i32, i32)> = status.backends.iter().map(|b| (b.ready_endpoints, b.share)).collect();
        seen == want && condition_is(balancer, "BackendsAvailable", available)
    }
}

/// `status.replicas` and `status.readyReplicas` are both `replicas`.
pub fn replicas_ready(replicas: i32) -> impl Condition<Balancer> + Clone {
    move |balancer: Option<&Balancer>| {
        let status = balancer.and_then(|b| b.status.as_ref());
        status.is_some_and(|s| s.replicas == replicas && s.ready_replicas == replicas)
    }
}

/// Every one of `pods` proxy pods serves the current generation's configuration:
/// `configuredReplicas` and `Programmed=True`, for that generation.
pub fn programmed(pods: i32) -> impl Condition<Balancer> + Clone {
    move |balancer: Option<&Balancer>| {
        let Some(balancer) = balancer else { return false };
        let Some(status) = &balancer.status else { return false };
        status.observed_generation == balancer.metadata.generation
            && status.configured_replicas == Some(pods)
            && condition_is(balancer, "Programmed", "True")
    }
}

/// Whether the Balancer's condition `kind` has status `status`.
pub fn condition_is(balancer: &Balancer, kind: &str, status: &str) -> bool {
    condition(balancer, kind).is_some_and(|c| c.status == status)
}

/// The Balancer's condition `kind`, if it has one.
pub fn condition<'a>(
    balancer: &'a Balancer,
    kind: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    balancer.status.as_ref()?.conditions.iter().find(|c| c.type_ == kind)
}

//! One reconcile, orchestrated: admit the spec, write what differs, report. The decisions are
//! pure and live in [`status`](super::status), [`plan`](super::plan), [`ssa`](super::ssa) and
//! [`migration`](super::migration); the writes in [`apply`](super::apply) and
//! [`report`](super::report). The clock is read once, here.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::apply::{delete_go_proxy, delete_obsolete_backends, ensure, ensure_budget, find_go_proxy};
use super::backends::backends;
use super::context::Context;
use super::exposure::Exposure;
use super::metrics::ReconcileResult;
use super::plan::{cluster_ip, obsolete_backends};
use super::report::{StatusWrite, Written, announce, counts_from_cache, publish, write_status};
use super::status::{Counts, ProxyCounts, condition, names_spec, proxy_condition};
use super::stored::StoredBalancer;
use super::{Error, RESYNC, migration};
use crate::api::backend_service_name;
use crate::proxy::{self, BackendHosts, Owner};
use crate::runtime::events::EventType;
use crate::spec::{FieldError, ObjectName, admit, denial_message};

/// Reconciles one Balancer, recording metrics and, on failure, the error in its status.
pub async fn reconcile(balancer: Arc<StoredBalancer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _in_flight = ctx.metrics.reconcile_started();
    let started = Instant::now();
    let now = Timestamp::now();
    let mut written = Written::default();
    let result = converge(&balancer, &ctx, &mut written, now).await;
    let outcome = match &result {
        Ok(_) => {
            ctx.failures().remove(&balancer.uid().unwrap_or_default());
            ReconcileResult::Success
        }
        Err(e) => {
            tracing::warn!(balancer = %ObjectRef::from_obj(balancer.as_ref()), error = %e, "reconcile failed");
            // What was written before the failure is still news.
            announce(&balancer, &ctx, &mut written).await;
            report_failure(&balancer, &ctx, e, now).await;
            ReconcileResult::Error
        }
    };
    ctx.metrics.reconciled(outcome, result.as_ref().err().map(Error::kind), started.elapsed());
    result
}

/// Brings the children and the status in line with the spec, as of `now`.
async fn converge(
    balancer: &StoredBalancer,
    ctx: &Context,
    written: &mut Written,
    now: Timestamp,
) -> Result<Action, Error> {
    // Nothing is written before every child cache has listed (false only when stopping).
    ctx.children.synced().await;
    if balancer.meta().deletion_timestamp.is_some() {
        // Garbage collection removes the children through their ownerReferences.
        ctx.failures().remove(&balancer.uid().unwrap_or_default());
        return Ok(Action::await_change());
    }
    let owner = Owner::of(balancer)?;
    // The webhooks normally stop both; without them (or under an older schema), the
    // Balancer is refused children and told why, and every other Balancer carries on.
    let spec = match &balancer.spec {
        Ok(spec) => spec.clone(),
        Err(unreadable) => return refuse(balancer, ctx, &owner, std::slice::from_ref(unreadable), now).await,
    };
    let spec = match admit(ObjectName::Name(&owner.name), spec, &ctx.settings.policy) {
        Ok(admitted) => admitted,
        Err(report) => return refuse(balancer, ctx, &owner, &report.errors, now).await,
    };

    // A Balancer the Go operator ran: is its proxy Deployment still there?
    let stage = migration::stage(balancer);
    let found = match stage {
        migration::Stage::Unchecked => Some(find_go_proxy(ctx, &owner).await?),
        _ => None,
    };

    let backend_services = proxy::backend_services(&owner, &spec);
    let mut cluster_ips = Vec::with_capacity(backend_services.len());
    let caches = &ctx.children;
    for service in &backend_services {
        let applied = ensure(ctx, &owner, &caches.services, service, written).await?;
        cluster_ips.push(cluster_ip(&applied).ok_or_else(|| Error::NoClusterIp { name: applied.name_any() })?);
    }
    let mut proxy = proxy::proxy(&owner, &spec, &ctx.settings, BackendHosts::ClusterIps(&cluster_ips));
    ensure(ctx, &owner, &caches.config_maps, &proxy.config_map, written).await?;
    let deployment = ensure(ctx, &owner, &caches.deployments, &proxy.deployment, written).await?;
    let budget = proxy::proxy_disruption_budget(&owner);
    let wanted = spec.replicas() > 1;
    let budgeted = ensure_budget(balancer, ctx, &owner, budget, wanted, written).await;
    // A budget protects against drains; without one the proxy still serves, so a refusal (a
    // namesake, a quota) is told, and the rest of the reconcile goes on.
    if let Err(e) = budgeted {
        tracing::warn!(balancer = %owner.name, error = %e, "no PodDisruptionBudget for the proxy");
        publish(balancer, ctx, EventType::Warning, "DisruptionBudget", e.to_string(), None).await;
    }
    let ready = proxy_condition(balancer, &deployment, backend_services.len(), now);
    let takeover = migration::step(&owner.name, &stage, found, ready.status == "True", now);
    takeover.shape_front(&owner.name, &mut proxy.front_service);
    let front = ensure(ctx, &owner, &caches.services, &proxy.front_service, written).await?;
    announce(balancer, ctx, written).await;
    if takeover.delete {
        delete_go_proxy(balancer, ctx, &owner).await?;
    }

    // Obsolete backends keep serving the running proxy pods until the new ones have rolled out.
    let obsolete = if ready.status == "True" {
        delete_obsolete_backends(balancer, ctx, &owner, &backend_services).await?;
        0
    } else {
        obsolete_backends(&ctx.children.services, &owner, &backend_services).len()
    };
    let ready_endpoints =
        |backend: &str| caches.endpoint_slices.get(&owner.namespace, &backend_service_name(&owner.name, backend));
    let counts = Counts {
        active: backend_services.len(),
        obsolete,
        proxy: ProxyCounts::of(&deployment),
        exposure: Exposure::of(&front),
        backends: Some(backends(balancer, &spec, ready_endpoints, now)),
    };
    let requeue = takeover.requeue.unwrap_or(RESYNC);
    match write_status(balancer, ctx, counts, ready, takeover.condition, now).await? {
        StatusWrite::Done => Ok(Action::requeue(requeue)),
        StatusWrite::Held(wait) => Ok(Action::requeue(wait.min(requeue))),
    }
}

/// Records an invalid or unreadable spec as `Ready=False/InvalidSpec`; waits for the next change.
async fn refuse(
    balancer: &StoredBalancer,
    ctx: &Context,
    owner: &Owner,
    errors: &[FieldError],
    now: Timestamp,
) -> Result<Action, Error> {
    let message = denial_message(&owner.name, errors);
    let counts = counts_from_cache(balancer, ctx);
    let ready = condition(balancer, false, "InvalidSpec", &message, now);
    match write_status(balancer, ctx, counts, ready, None, now).await {
        Ok(_) => {}
        // The API server validates the whole object on a status write: one stored under a looser
        // schema cannot get a status until its spec is fixed, so it is told through an event.
        Err(Error::Api { source: kube::Error::Api(status), .. }) if status.code == 422 && names_spec(&status) => {
            publish(balancer, ctx, EventType::Warning, "InvalidSpec", message, None).await;
        }
        Err(e) => return Err(e),
    }
    Ok(Action::await_change())
}

/// After a failed reconcile: best effort to show the error in the status and as an event.
async fn report_failure(balancer: &StoredBalancer, ctx: &Context, error: &Error, now: Timestamp) {
    let counts = counts_from_cache(balancer, ctx);
    let reason = match error {
        Error::Conflict { .. } => "Conflict",
        _ => "ReconcileError",
    };
    let ready = condition(balancer, false, reason, &error.to_string(), now);
    if let Err(e) = write_status(balancer, ctx, counts, ready, None, now).await {
        tracing::debug!(error = %e, "could not record the failure in the status");
    }
}

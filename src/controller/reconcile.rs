//! One reconcile, orchestrated: admit the spec, write what differs, report. The decisions are
//! pure and live in [`status`](super::status), [`plan`](super::plan), [`ssa`](super::ssa) and
//! [`migration`](super::migration); the writes in [`apply`](super::apply) and
//! [`report`](super::report). The clock is read once, here.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::Instrument;

use super::apply::{
    delete_budget, delete_go_proxy, delete_obsolete_backends, ensure, ensure_proxy_config, find_go_proxy,
};
use super::backends::backends as backends_of;
use super::canary;
use super::conditions::is_true;
use super::context::Context;
use super::exposure::Exposure;
use super::metrics::ReconcileResult;
use super::plan::{cluster_ip, obsolete_backends};
use super::probing::{PodProbe, Want};
use super::programmed::{self, Programmed};
use super::reasons::Reason;
use super::report::{StatusWrite, Written, announce, observed_from_cache, publish, write_status};
use super::status::{Observed, ProxyCounts, names_spec, proxy_condition, ready_condition, served_when_ready};
use super::stored::StoredBalancer;
use super::{Error, RESYNC, migration};
use crate::api::{self, ConditionStatus, backend_service_name};
use crate::proxy::{self, BackendTarget, Owner, Proxy};
use crate::runtime::events::{EventType, Note};
use crate::spec::{Admitted, FieldError, ObjectName, admit, denial_message};

/// Reconciles one Balancer, recording metrics and, on failure, the error in its status.
///
/// Every log line of a reconcile carries the Balancer's namespace and name (this span), inside
/// kube-runtime's `reconciling object` span, which says what triggered it.
pub async fn reconcile(balancer: Arc<StoredBalancer>, ctx: Arc<Context>) -> Result<Action, Error> {
    // At error level, so that it is enabled whenever any line of the reconcile is logged.
    let span = tracing::error_span!(
        "reconcile",
        namespace = balancer.namespace().unwrap_or_default(),
        name = balancer.name_any()
    );
    reconcile_in_span(balancer, ctx).instrument(span).await
}

async fn reconcile_in_span(balancer: Arc<StoredBalancer>, ctx: Arc<Context>) -> Result<Action, Error> {
    // Nothing is written before every child cache has listed: a child missing from a cache
    // that has not listed yet would be created again. A cache that never lists means the
    // controller is stopping.
    if !ctx.children.synced().await {
        tracing::info!("the controller is stopping: the reconcile ends with nothing written");
        return Ok(Action::await_change());
    }
    let _in_flight = ctx.metrics.reconcile_started();
    let started = Instant::now();
    let now = Timestamp::now();
    let mut written = Written::default();
    let result = converge(&balancer, &ctx, &mut written, now).await;
    let outcome = match &result {
        Ok(action) => {
            ctx.records.with(&balancer.uid().unwrap_or_default(), |record| record.failures = 0);
            tracing::debug!(elapsed = ?started.elapsed(), next = ?action, "reconciled");
            ReconcileResult::Success
        }
        Err(e) => {
            tracing::warn!(error = %e, "reconcile failed");
            // The children written before the failure still get their event.
            announce(&balancer, &ctx, &mut written).await;
            report_failure(&balancer, &ctx, e, now).await;
            ReconcileResult::Error
        }
    };
    ctx.metrics.reconciled(outcome, result.as_ref().err().map(Error::kind), started.elapsed());
    result
}

/// Brings the children and the status in line with the spec, as of `now`, in the order the
/// traffic needs: backend Services first (their cluster IPs go into `nginx.conf`), then the
/// proxy, then the front Service, and only then the removal of what the spec no longer names.
async fn converge(
    balancer: &StoredBalancer,
    ctx: &Context,
    written: &mut Written,
    now: Timestamp,
) -> Result<Action, Error> {
    if balancer.meta().deletion_timestamp.is_some() {
        // Garbage collection removes the children through their ownerReferences.
        ctx.records.forget(&balancer.uid().unwrap_or_default());
        return Ok(Action::await_change());
    }
    let owner = Owner::of(balancer)?;
    let spec = match admitted_spec(balancer, &owner, ctx) {
        Ok(spec) => spec,
        Err(errors) => return refuse(balancer, ctx, &owner, &errors, now).await,
    };
    let go_proxy = look_for_go_proxy(balancer, ctx, &owner).await?;
    let canary = canary::take_turn(balancer, ctx, &owner, spec, now).await?;
    let spec = canary.spec;

    let backends = apply_backend_services(ctx, &owner, &spec, written).await?;
    let mut proxy = proxy::proxy(&owner, &spec, &ctx.settings, &backends.targets);
    let deployment = apply_proxy(balancer, ctx, &owner, &spec, &proxy, now, written).await?;
    let programmed = match ctx.settings.metrics_image {
        Some(_) => Some(learnt_serving(balancer, ctx, &owner, &spec, &proxy.nginx_conf, now)),
        None => None,
    };
    let available = proxy_condition(balancer, &deployment, backends.services.len(), now);
    let front_endpoints = ctx.children.endpoint_slices.get(&owner.namespace, &owner.name);
    let ready = served_when_ready(balancer, available, programmed, front_endpoints, now);
    // With live configuration the pods serve a change once their sidecars say so; until then
    // the previous configuration, and the backends only it names, may still take traffic.
    let proxy_serves = is_true(&ready) && programmed.is_none_or(Programmed::all);

    let takeover = migration::step(&owner.name, &go_proxy.stage, go_proxy.found, proxy_serves, now);
    takeover.shape_front(&owner.name, &mut proxy.front_service);
    let front = ensure(ctx, &owner, &ctx.children.services, &proxy.front_service, written).await?;
    announce(balancer, ctx, written).await;
    if takeover.delete {
        delete_go_proxy(balancer, ctx, &owner).await?;
    }

    let obsolete = retire_obsolete_backends(balancer, ctx, &owner, &backends.services, proxy_serves).await?;
    let ready_endpoints =
        |backend: &str| ctx.children.endpoint_slices.get(&owner.namespace, &backend_service_name(&owner.name, backend));
    let observed = Observed {
        active: backends.services.len(),
        obsolete,
        proxy: ProxyCounts::of(&deployment),
        exposure: Exposure::of(&front),
        backends: Some(backends_of(balancer, &spec, |index| spec.weight(index), ready_endpoints, now)),
        programmed: programmed.map(|p| (i32::try_from(p.serving).unwrap_or(i32::MAX), p.condition(balancer, now))),
        canary: canary.status,
    };
    let requeue = takeover.requeue.unwrap_or(RESYNC).min(canary.wake_after.unwrap_or(RESYNC));
    match write_status(balancer, ctx, observed, ready, takeover.condition, now).await? {
        StatusWrite::Done => Ok(Action::requeue(requeue)),
        StatusWrite::Held(wait) => Ok(Action::requeue(wait.min(requeue))),
    }
}

/// The stored spec, defaulted and valid, or why not. The webhooks normally keep invalid specs
/// out; without them (or under an older schema) the Balancer is refused its children, and
/// every other Balancer carries on.
fn admitted_spec(balancer: &StoredBalancer, owner: &Owner, ctx: &Context) -> Result<Admitted, Vec<FieldError>> {
    let spec = balancer.spec.clone().map_err(|unreadable| vec![unreadable])?;
    admit(ObjectName::Name(&owner.name), spec, &ctx.settings.policy).map_err(|report| report.errors)
}

/// Where the takeover from the Go operator stands, and what a look for its proxy found.
struct GoProxy {
    stage: migration::Stage,
    found: Option<migration::Found>,
}

/// Looks for the Go operator's proxy Deployment, once per Balancer the Go operator ran.
async fn look_for_go_proxy(balancer: &StoredBalancer, ctx: &Context, owner: &Owner) -> Result<GoProxy, Error> {
    let stage = migration::stage(balancer);
    let found = match stage {
        migration::Stage::Unchecked => Some(find_go_proxy(ctx, owner).await?),
        _ => None,
    };
    Ok(GoProxy { stage, found })
}

/// The backend Services as applied, in spec order, and where the proxy reaches each backend.
struct BackendServices<'a> {
    services: Vec<Service>,
    targets: Vec<BackendTarget<'a>>,
}

/// Applies each backend's Service, then reads its cluster IP and, for pod upstreams, its ready
/// pods from its EndpointSlices.
async fn apply_backend_services<'a>(
    ctx: &Context,
    owner: &Owner,
    spec: &'a Admitted,
    written: &mut Written,
) -> Result<BackendServices<'a>, Error> {
    let read_pods = proxy::pod_upstreams(spec, &ctx.settings);
    let mut applied = BackendServices { services: Vec::new(), targets: Vec::new() };
    for backend in &spec.backends {
        let service = proxy::backend_service(owner, spec, backend);
        let live = ensure(ctx, owner, &ctx.children.services, &service, written).await?;
        let ip = cluster_ip(&live).ok_or_else(|| Error::NoClusterIp { name: live.name_any() })?;
        let ready_pods =
            read_pods.then(|| ctx.children.endpoint_slices.ready_pods(&owner.namespace, &service.name_any()));
        applied.targets.push(BackendTarget { spec: backend, cluster_ip: Some(ip), ready_pods });
        applied.services.push(service);
    }
    Ok(applied)
}

/// How many of the proxy pods serve `nginx_conf`, as their sidecars last told the
/// [`prober`](super::prober), which this asks to look again; it wakes this Balancer's reconcile
/// when the count changes.
fn learnt_serving(
    balancer: &StoredBalancer,
    ctx: &Context,
    owner: &Owner,
    spec: &Admitted,
    nginx_conf: &str,
    now: Timestamp,
) -> Programmed {
    // This operator's proxy pods (`<name>-proxy-…`), not the Go operator's (`<name>proxy-…`),
    // which the front Service also selects while it takes over.
    let ours = format!("{}-", api::proxy_deployment_name(&owner.name));
    let want = Want::new(
        ctx.children.endpoint_slices.live_addresses(&owner.namespace, &owner.name, &ours),
        spec.replicas(),
        proxy::access_log::metrics_port(spec.ports.iter().map(|p| p.port)),
        programmed::config_id(nginx_conf),
    );
    let balancer_ref = ObjectRef::from_obj(balancer);
    let programmed = ctx.records.with(&balancer.uid().unwrap_or_default(), |record| {
        PodProbe::observe(&mut record.probe, balancer_ref, want, Instant::now(), now)
    });
    ctx.probes_wanted.notify_one();
    programmed
}

/// Applies the proxy pods' ServiceAccount, and the Role and RoleBinding that let its token read
/// the proxy's ConfigMap: the metrics sidecar watches it and hands each change to nginx.
async fn apply_proxy_identity(ctx: &Context, owner: &Owner, written: &mut Written) -> Result<(), Error> {
    let caches = &ctx.children.identity;
    ensure(ctx, owner, &caches.accounts, &proxy::proxy_service_account(owner), written).await?;
    ensure(ctx, owner, &caches.roles, &proxy::proxy_config_reader(owner), written).await?;
    ensure(ctx, owner, &caches.bindings, &proxy::proxy_config_reader_binding(owner), written).await?;
    Ok(())
}

/// Applies the proxy's ConfigMap, Deployment and disruption budget; returns the Deployment as
/// the API server has it.
async fn apply_proxy(
    balancer: &StoredBalancer,
    ctx: &Context,
    owner: &Owner,
    spec: &Admitted,
    proxy: &Proxy,
    now: Timestamp,
    written: &mut Written,
) -> Result<Deployment, Error> {
    let caches = &ctx.children;
    if ctx.settings.metrics_image.is_some() {
        apply_proxy_identity(ctx, owner, written).await?;
    }
    ensure_proxy_config(ctx, owner, balancer, &proxy.config_map, now, written).await?;
    let deployment = ensure(ctx, owner, &caches.deployments, &proxy.deployment, written).await?;
    let budget = proxy::proxy_disruption_budget(owner);
    // A PodDisruptionBudget is kept only for a proxy of more than one pod: with one pod, it
    // would block every drain of the node.
    let budgeted = if spec.replicas() > 1 {
        ensure(ctx, owner, &caches.budgets, &budget, written).await.map(drop)
    } else {
        delete_budget(balancer, ctx, owner, &budget.name_any()).await
    };
    // Without a budget the proxy still serves, so a refusal (a namesake, a quota) is reported
    // and the reconcile goes on.
    if let Err(e) = budgeted {
        tracing::warn!(error = %e, "no PodDisruptionBudget for the proxy");
        let note = e.to_string();
        publish(balancer, ctx, Note::new(EventType::Warning, Reason::DisruptionBudget, &note)).await;
    }
    Ok(deployment)
}

/// Deletes the backend Services the spec no longer names once the proxy serves without them
/// (until then the running proxy pods still send to them); returns how many are left.
async fn retire_obsolete_backends(
    balancer: &StoredBalancer,
    ctx: &Context,
    owner: &Owner,
    wanted: &[Service],
    proxy_serves: bool,
) -> Result<usize, Error> {
    if proxy_serves {
        delete_obsolete_backends(balancer, ctx, owner, wanted).await?;
        return Ok(0);
    }
    Ok(obsolete_backends(&ctx.children.services, owner, wanted).len())
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
    let observed = observed_from_cache(balancer, ctx);
    let ready = ready_condition(balancer, ConditionStatus::False, Reason::InvalidSpec, &message, now);
    match write_status(balancer, ctx, observed, ready, None, now).await {
        Ok(_) => {}
        // The API server validates the whole object on a status write: one stored under a looser
        // schema cannot get a status until its spec is fixed, so the error goes into an event.
        Err(Error::Api { source: kube::Error::Api(status), .. }) if status.code == 422 && names_spec(&status) => {
            publish(balancer, ctx, Note::new(EventType::Warning, Reason::InvalidSpec, &message)).await;
        }
        Err(e) => return Err(e),
    }
    Ok(Action::await_change())
}

/// After a failed reconcile: best effort to show the error in the status and as an event.
async fn report_failure(balancer: &StoredBalancer, ctx: &Context, error: &Error, now: Timestamp) {
    let observed = observed_from_cache(balancer, ctx);
    let reason = match error {
        Error::Conflict { .. } => Reason::Conflict,
        _ => Reason::ReconcileError,
    };
    let ready = ready_condition(balancer, ConditionStatus::False, reason, &error.to_string(), now);
    if let Err(e) = write_status(balancer, ctx, observed, ready, None, now).await {
        tracing::debug!(error = %e, "could not record the failure in the status");
    }
}

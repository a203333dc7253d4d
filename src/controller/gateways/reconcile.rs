//! One Gateway's reconcile: assemble it from its routes, write its proxy as a Balancer's is
//! written (same builders, same `ensure`), then its status and its routes'.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tracing::Instrument;

use super::report::{GatewayOutcome, write_gateway_status, write_route_statuses};
use super::watches::GatewayCaches;
use crate::controller::apply::{delete_proxy, ensure};
use crate::controller::context::{Context, backoff};
use crate::controller::exposure::Exposure;
use crate::controller::probing::{PodProbe, Want};
use crate::controller::programmed::{self, Programmed};
use crate::controller::report::Written;
use crate::controller::{Error, RESYNC};
use crate::gateway::api::gateways::Gateway;
use crate::gateway::api::referencegrants::ReferenceGrant;
use crate::gateway::assembly::{Lookups, assemble};
use crate::gateway::parameters::{self, ParametersSource, ProxyParameters};
use crate::gateway::proxy::{GatewayProxy, gateway_owner, gateway_proxy, infrastructure_refusal};
use crate::gateway::status::CONTROLLER_NAME;
use crate::proxy::{self, Owner};

/// What Gateway reconciles share.
pub(crate) struct GatewayContext {
    /// The Balancers' context: client, child caches, settings, records, prober.
    pub ctx: Arc<Context>,
    /// The Gateway API caches.
    pub caches: GatewayCaches,
}

/// Reconciles one Gateway of a GatewayClass balancer serves; others are left alone.
pub(crate) async fn reconcile(gateway: Arc<Gateway>, gctx: Arc<GatewayContext>) -> Result<Action, Error> {
    let span = tracing::error_span!(
        "reconcile",
        kind = "Gateway",
        namespace = gateway.namespace().unwrap_or_default(),
        name = gateway.name_any()
    );
    let result = converge(&gateway, &gctx).instrument(span.clone()).await;
    match &result {
        Ok(_) => gctx.ctx.records.with(&gateway.uid().unwrap_or_default(), |record| record.failures = 0),
        Err(e) => span.in_scope(|| tracing::warn!(error = %e, "reconcile failed")),
    }
    result
}

/// Requeues a failed Gateway with the Balancers' backoff.
pub(crate) fn error_policy(gateway: Arc<Gateway>, _error: &Error, gctx: Arc<GatewayContext>) -> Action {
    let failures = gctx.ctx.records.with(&gateway.uid().unwrap_or_default(), |record| {
        record.failures = record.failures.saturating_add(1);
        record.failures
    });
    Action::requeue(backoff(failures))
}

/// Whether `gateway`'s class is one balancer serves.
pub(crate) fn is_ours(gateway: &Gateway, caches: &GatewayCaches) -> bool {
    let class = caches.classes.get(&ObjectRef::new(&gateway.spec.gateway_class_name));
    class.is_some_and(|c| c.spec.controller_name == CONTROLLER_NAME)
}

async fn converge(gateway: &Gateway, gctx: &GatewayContext) -> Result<Action, Error> {
    let (ctx, caches) = (&gctx.ctx, &gctx.caches);
    if !ctx.children.synced().await || !caches.synced().await {
        return Ok(Action::await_change());
    }
    let gateway_ref = ObjectRef::from_obj(gateway);
    if !is_ours(gateway, caches) {
        return Ok(Action::await_change());
    }
    if gateway.meta().deletion_timestamp.is_some() {
        ctx.records.forget(&gateway.uid().unwrap_or_default());
        caches.index.forget(&gateway_ref);
        return Ok(Action::await_change());
    }
    let now = Timestamp::now();
    let owner = gateway_owner(gateway)?;
    let routes: Vec<_> = {
        let key = (owner.namespace.clone(), gateway.name_any());
        caches.routes().into_iter().filter(|r| r.gateways().contains(&key)).collect()
    };
    let lookups = Lookups {
        namespace_labels: |namespace: &str| namespace_labels(caches, namespace),
        service: |namespace: &str, name: &str| caches.services.get(&ObjectRef::new(name).within(namespace)),
        grants: |namespace: &str| grants_in(caches, namespace),
    };
    // The Services the routes name are recorded before the cache is read: a Service that
    // arrives later wakes this Gateway; one that arrived earlier is in the cache it reads.
    let referenced = referenced_services(&routes);
    caches.index.record(&gateway_ref, (owner.namespace.clone(), owner.name.clone()), &referenced);
    let assembly = assemble(gateway, &routes, &lookups);
    let parameters = parameters_of(gateway, ctx, caches).await?;
    let refusal = infrastructure_refusal(gateway, &ctx.settings.policy).or(parameters.as_ref().err().cloned());
    if let Some(refusal) = refusal {
        write_route_statuses(ctx, gateway, &routes, &assembly, now).await?;
        let outcome = GatewayOutcome { refused: Some(refusal), served: false, addresses: Vec::new() };
        write_gateway_status(ctx, gateway, &assembly, &outcome, now).await?;
        // A parameters ConfigMap is not watched: looked at again after the resync period.
        return Ok(Action::requeue(RESYNC));
    }
    if assembly.listeners.is_empty() {
        // Nothing to serve (every listener HTTP, say): no proxy, and none left from before.
        if delete_proxy(ctx, &owner).await? {
            tracing::info!("no listener is served: the proxy is deleted");
        }
        write_route_statuses(ctx, gateway, &routes, &assembly, now).await?;
        let outcome = GatewayOutcome { refused: None, served: false, addresses: Vec::new() };
        write_gateway_status(ctx, gateway, &assembly, &outcome, now).await?;
        return Ok(Action::requeue(RESYNC));
    }
    // The proxy first: a route's change is on its way to the wire before any status is written.
    let parameters = parameters.unwrap_or_default();
    let proxy = gateway_proxy(&owner, gateway, assembly.listeners.clone(), &ctx.settings, &parameters);
    let (deployment, front) = apply_proxy(ctx, &owner, &proxy).await?;
    write_route_statuses(ctx, gateway, &routes, &assembly, now).await?;
    let served = serves(gateway, ctx, &owner, &proxy, &deployment, now);
    let outcome = GatewayOutcome { refused: None, served, addresses: Exposure::of(&front).addresses };
    write_gateway_status(ctx, gateway, &assembly, &outcome, now).await?;
    Ok(Action::requeue(RESYNC))
}

/// Every Service the routes' backend references name, as `(namespace, name)`.
fn referenced_services(routes: &[crate::gateway::routes::RouteView]) -> Vec<(String, String)> {
    let mut services: Vec<(String, String)> = routes
        .iter()
        .flat_map(|route| {
            route
                .backend_references()
                .map(move |b| (b.namespace.unwrap_or(&route.namespace).to_string(), b.name.to_string()))
        })
        .collect();
    services.sort();
    services.dedup();
    services
}

/// The proxy settings `gateway`'s parameters give, or why they are refused (`Err` of the
/// outer result only when the API server did not answer). Read at each reconcile: a change to
/// the ConfigMap is applied at the Gateway's next one.
async fn parameters_of(
    gateway: &Gateway,
    ctx: &Context,
    caches: &GatewayCaches,
) -> Result<Result<ProxyParameters, String>, Error> {
    let class = caches.classes.get(&ObjectRef::new(&gateway.spec.gateway_class_name));
    match parameters::source(gateway, class.as_deref()) {
        ParametersSource::Defaults => Ok(Ok(ProxyParameters::default())),
        ParametersSource::Unsupported(why) => Ok(Err(why)),
        ParametersSource::ConfigMap { namespace, name } => {
            let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
            let found = api.get_opt(&name).await.map_err(|e| Error::api("get", "ConfigMap", &name, e))?;
            Ok(match found {
                Some(config_map) => parameters::read(&config_map, &ctx.settings.policy),
                None => Err(format!("the parameters ConfigMap {namespace}/{name} does not exist")),
            })
        }
    }
}

/// The labels of `namespace`, as cached (none when only one namespace is watched).
fn namespace_labels(caches: &GatewayCaches, namespace: &str) -> BTreeMap<String, String> {
    let store = caches.namespaces.as_ref();
    store.and_then(|s| s.get(&ObjectRef::new(namespace))).map(|n| n.labels().clone()).unwrap_or_default()
}

/// The ReferenceGrants of `namespace`.
fn grants_in(caches: &GatewayCaches, namespace: &str) -> Vec<ReferenceGrant> {
    let grants = caches.grants.state();
    grants.iter().filter(|g| g.namespace().as_deref() == Some(namespace)).map(|g| g.as_ref().clone()).collect()
}

/// Applies the proxy's identity (with live delivery), ConfigMap, Deployment and front Service;
/// returns the Deployment and the Service as the API server has them.
async fn apply_proxy(
    ctx: &Context,
    owner: &Owner,
    proxy: &GatewayProxy,
) -> Result<(Deployment, k8s_openapi::api::core::v1::Service), Error> {
    let caches = &ctx.children;
    let mut written = Written::default();
    if ctx.settings.metrics_image.is_some() {
        let (account, role, binding) = &proxy.identity;
        ensure(ctx, owner, &caches.identity.accounts, account, &mut written).await?;
        ensure(ctx, owner, &caches.identity.roles, role, &mut written).await?;
        ensure(ctx, owner, &caches.identity.bindings, binding, &mut written).await?;
    }
    ensure(ctx, owner, &caches.config_maps, &proxy.config_map, &mut written).await?;
    let deployment = ensure(ctx, owner, &caches.deployments, &proxy.deployment, &mut written).await?;
    let front = ensure(ctx, owner, &caches.services, &proxy.front_service, &mut written).await?;
    Ok((deployment, front))
}

/// Whether every proxy pod serves the current configuration: as their sidecars tell the
/// prober (which wakes this Gateway when the count changes), or, without live delivery, once
/// the Deployment has rolled out the configuration's pods.
fn serves(
    gateway: &Gateway,
    ctx: &Context,
    owner: &Owner,
    proxy: &GatewayProxy,
    deployment: &Deployment,
    now: Timestamp,
) -> bool {
    if ctx.settings.metrics_image.is_none() {
        return rolled_out(deployment);
    }
    // Every pod of the front Service is this proxy's (the Balancers' filter by name, which keeps
    // out the Go operator's pods, has no such case here, and would miss pods whose name the
    // ReplicaSet controller cut short for a long proxy name).
    let want = Want {
        pods: ctx.children.endpoint_slices.live_addresses(&owner.namespace, &owner.name, ""),
        port: proxy::access_log::metrics_port(proxy.workload.port_numbers()),
        id: programmed::config_id(&proxy.nginx_conf),
    };
    let programmed: Programmed = ctx.records.with(&gateway.uid().unwrap_or_default(), |record| {
        PodProbe::observe(&mut record.probe, ObjectRef::from_obj(gateway), want, Instant::now(), now)
    });
    ctx.probes_wanted.notify_one();
    programmed.all()
}

/// Whether the Deployment's pods are all of its current template, and ready.
fn rolled_out(deployment: &Deployment) -> bool {
    let wanted = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let status = deployment.status.clone().unwrap_or_default();
    let current = deployment.metadata.generation.is_some_and(|g| status.observed_generation == Some(g));
    current
        && status.updated_replicas.unwrap_or(0) == wanted
        && status.ready_replicas.unwrap_or(0) == wanted
        && status.replicas.unwrap_or(0) == wanted
}

//! One Gateway's reconcile: assemble it from its routes, write its proxy as a Balancer's is
//! written (same builders, same `ensure`), then its status and its routes'.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use tracing::Instrument;

use super::report::{GatewayOutcome, write_gateway_status, write_route_statuses};
use super::watches::GatewayCaches;
use crate::api::UpstreamKind;
use crate::controller::apply::{delete_proxy, ensure, ensure_proxy_config};
use crate::controller::context::{Context, backoff};
use crate::controller::exposure::Exposure;
use crate::controller::probing::{PodProbe, Want};
use crate::controller::programmed::{self, Programmed};
use crate::controller::report::Written;
use crate::controller::{Error, RESYNC};
use crate::gateway::api::gateways::Gateway;
use crate::gateway::api::referencegrants::ReferenceGrant;
use crate::gateway::assembly::{Assembly, Lookups, assemble, assemble_to_fit};
use crate::gateway::parameters::{self, ParametersSource, ProxyParameters};
use crate::gateway::proxy::{GatewayProxy, gateway_owner, gateway_proxy, infrastructure_refusal};
use crate::gateway::routes::{RouteView, referenced_services};
use crate::proxy::model::Listener;
use crate::proxy::{self, BALANCER_NAME_LABEL, Owner};

/// What Gateway reconciles share.
pub(crate) struct GatewayContext {
    /// The Balancers' context: client, child caches, settings, records, prober.
    pub ctx: Arc<Context>,
    /// The Gateway API caches.
    pub caches: GatewayCaches,
    /// Asks for the routes' entries of Gateways balancer no longer serves to be withdrawn.
    pub tidy: UnboundedSender<()>,
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

async fn converge(gateway: &Gateway, gctx: &GatewayContext) -> Result<Action, Error> {
    let (ctx, caches) = (&gctx.ctx, &gctx.caches);
    if !ctx.children.synced().await || !caches.synced().await {
        return Ok(Action::await_change());
    }
    let gateway_ref = ObjectRef::from_obj(gateway);
    if !caches.is_ours(gateway) {
        return leave(gateway, gctx).await;
    }
    if gateway.meta().deletion_timestamp.is_some() {
        // Held back by someone's finalizer: its routes' entries go now.
        ctx.records.forget(&gateway.uid().unwrap_or_default());
        caches.index.forget(&gateway_ref);
        let _ = gctx.tidy.unbounded_send(());
        return Ok(Action::await_change());
    }
    if ctx.settings.metrics_image.is_some() && !caches.backend_slices.listed() {
        // Not before the backends' pods are known: a proxy written meanwhile with the Services'
        // addresses would be written again a moment later, at every start of the operator.
        tracing::debug!("waiting for the EndpointSlices' first list");
        return Ok(Action::requeue(SLICES_PENDING));
    }
    let now = Timestamp::now();
    let owner = gateway_owner(gateway)?;
    let routes: Vec<_> = {
        let key = (owner.namespace.clone(), gateway.name_any());
        caches.routes().into_iter().filter(|r| r.concerns(&key.0, &key.1)).map(Arc::unwrap_or_clone).collect()
    };
    let class = caches.classes.get(&ObjectRef::new(&gateway.spec.gateway_class_name));
    let source = parameters::source(gateway, class.as_deref());
    // What the Gateway reads is recorded before it is read: a Service or parameters ConfigMap
    // that changes later wakes this Gateway; one that changed earlier is read as it is now.
    let proxy_key = (owner.namespace.clone(), owner.name.clone());
    caches.index.record(&gateway_ref, proxy_key, &referenced_services(&routes), source.config_map());
    let read = parameters_of(&source, ctx).await?;
    let parameters = parameters::in_force(read, recorded_parameters(ctx, &owner).as_deref(), &ctx.settings.policy);
    // The backends' pods, as a Balancer's (the default).
    let pods = ctx.settings.metrics_image.is_some()
        && parameters.as_ref().is_ok_and(|(p, _)| p.upstreams() == UpstreamKind::Pods);
    let lookups = Lookups {
        namespace_labels: |namespace: &str| namespace_labels(caches, namespace),
        service: |namespace: &str, name: &str| caches.services.get(&ObjectRef::new(name).within(namespace)),
        grants: |namespace: &str| grants_in(caches, namespace),
        ready_pods: |namespace: &str, name: &str| pods.then(|| caches.backend_slices.ready_pods(namespace, name)),
    };
    let mut assembly = assemble(gateway, &routes, &lookups);
    let refusal = infrastructure_refusal(gateway, &ctx.settings.policy).or(parameters.as_ref().err().cloned());
    if let Some(refusal) = refusal {
        report(
            ctx,
            gateway,
            &routes,
            &assembly,
            now,
            GatewayOutcome { refused: Some(refusal), ..GatewayOutcome::default() },
        )
        .await?;
        return Ok(Action::requeue(RESYNC));
    }
    if assembly.listeners.is_empty() {
        // Nothing to serve (every listener HTTP, say): no proxy, and none left from before.
        delete_stale_proxies(ctx, gateway, None).await?;
        report(ctx, gateway, &routes, &assembly, now, GatewayOutcome::default()).await?;
        return Ok(Action::requeue(RESYNC));
    }
    // The proxy first: a route's change is on its way to the wire before any status is written.
    let (parameters, stale_parameters) = parameters.unwrap_or_default();
    let proxy_of = |listeners: Vec<Listener>| gateway_proxy(&owner, gateway, listeners, &ctx.settings, &parameters);
    let mut proxy = proxy_of(assembly.listeners.clone());
    if !proxy.fits() {
        // Too many pods for one ConfigMap: the Services' cluster IPs, as a Balancer falls back;
        // and when the routes do not fit even so, the newest are refused (`GatewayFull`) so that
        // every older one is still served and updated.
        let fits = |listeners: &[Listener]| proxy_of(listeners.to_vec()).fits();
        assembly = if pods {
            assemble_to_fit(gateway, &routes, &lookups.without_pods(), fits)
        } else {
            assemble_to_fit(gateway, &routes, &lookups, fits)
        };
        proxy = proxy_of(assembly.listeners.clone());
    }
    let (deployment, front) = match apply_proxy(ctx, &owner, gateway, &proxy, now).await {
        Ok(applied) => applied,
        Err(Error::Conflict { kind, name }) => {
            // Its name is held (by a Balancer's proxy, say): said in the status, tried again
            // when that object goes (its change wakes this Gateway) or at the resync.
            let conflict = Some(format!("{kind} {name}"));
            let outcome = GatewayOutcome { conflict, stale_parameters, ..GatewayOutcome::default() };
            report(ctx, gateway, &routes, &assembly, now, outcome).await?;
            return Ok(Action::requeue(RESYNC));
        }
        Err(other) => return Err(other),
    };
    let served = serves(gateway, ctx, &owner, &proxy, &deployment, now);
    if served {
        // A proxy of this Gateway's under another name (it moved to another of balancer's
        // classes) serves until this one does.
        delete_stale_proxies(ctx, gateway, Some(&owner.name)).await?;
    }
    let addresses = Exposure::of(&front).addresses;
    let outcome = GatewayOutcome { served, addresses, stale_parameters, ..GatewayOutcome::default() };
    report(ctx, gateway, &routes, &assembly, now, outcome).await?;
    Ok(Action::requeue(RESYNC))
}

/// A Gateway that is not of balancer's classes: when it is another controller's (it moved),
/// what balancer made for it goes, its proxy and its routes' entries. A class that does not
/// exist may be coming back: nothing is taken down for it.
async fn leave(gateway: &Gateway, gctx: &GatewayContext) -> Result<Action, Error> {
    let (ctx, caches) = (&gctx.ctx, &gctx.caches);
    if caches.is_others(gateway) {
        delete_stale_proxies(ctx, gateway, None).await?;
        // Known from a reconcile of this process, or listed in a route's status (balancer's
        // entries from before a restart).
        let known = caches.index.forget(&ObjectRef::from_obj(gateway));
        let (namespace, name) = (gateway.namespace().unwrap_or_default(), gateway.name_any());
        let listed = || {
            let others = |n: &str, g: &str| (n, g) != (namespace.as_str(), name.as_str());
            caches.routes().iter().any(|route| route.without_stale_entries(others).is_some())
        };
        if known || listed() {
            let _ = gctx.tidy.unbounded_send(());
        }
    }
    Ok(Action::await_change())
}

/// How soon a Gateway waiting for the EndpointSlices' first list looks again.
const SLICES_PENDING: std::time::Duration = std::time::Duration::from_secs(1);

/// Writes the routes' entries for `gateway`, then its own status: a route's change is told
/// where it lands before the Gateway says it is programmed.
async fn report(
    ctx: &Context,
    gateway: &Gateway,
    routes: &[RouteView],
    assembly: &Assembly,
    now: Timestamp,
    outcome: GatewayOutcome,
) -> Result<(), Error> {
    write_route_statuses(ctx, gateway, routes, assembly, now).await?;
    write_gateway_status(ctx, gateway, assembly, &outcome, now).await
}

/// Deletes every proxy `gateway` controls but `keep` (see [`delete_proxy`]), as the child
/// caches have them (its children carry the proxy's name in their labels).
async fn delete_stale_proxies(ctx: &Context, gateway: &Gateway, keep: Option<&str>) -> Result<(), Error> {
    let (namespace, uid) = (gateway.namespace().unwrap_or_default(), gateway.uid().unwrap_or_default());
    let children = &ctx.children;
    let mut stale: BTreeSet<String> = proxies_of(&children.deployments, &namespace, &uid);
    stale.extend(proxies_of(&children.services, &namespace, &uid));
    if let Some(keep) = keep {
        stale.remove(keep);
    }
    for name in stale {
        let owner = Owner { name, ..gateway_owner(gateway)? };
        if delete_proxy(ctx, &owner).await? {
            tracing::info!(proxy = %owner.name, "deleted a proxy this Gateway no longer has");
        }
    }
    Ok(())
}

/// The proxies whose children in `store` the object of `uid` controls in `namespace`, by the
/// name their labels give.
fn proxies_of<K>(store: &Store<K>, namespace: &str, uid: &str) -> BTreeSet<String>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let proxy = |child: &Arc<K>| {
        let meta = child.meta();
        let controlled = meta.owner_references.iter().flatten().any(|r| r.controller == Some(true) && r.uid == uid);
        let here = meta.namespace.as_deref() == Some(namespace);
        (controlled && here).then(|| meta.labels.as_ref()?.get(BALANCER_NAME_LABEL).cloned()).flatten()
    };
    store.state().iter().filter_map(proxy).collect()
}

/// The proxy settings `source` gives, or why they are refused (`Err` of the outer result only
/// when the API server did not answer). A ConfigMap is read at each reconcile, and its change
/// wakes the Gateways it configures (their reconciles record it).
async fn parameters_of(source: &ParametersSource, ctx: &Context) -> Result<Result<ProxyParameters, String>, Error> {
    match source {
        ParametersSource::Defaults => Ok(Ok(ProxyParameters::default())),
        ParametersSource::Unsupported(why) => Ok(Err(why.clone())),
        ParametersSource::ConfigMap { namespace, name } => {
            let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
            let found = api.get_opt(name).await.map_err(|e| Error::api("get", "ConfigMap", name, e))?;
            Ok(match found {
                Some(config_map) => parameters::read(&config_map, &ctx.settings.policy),
                None => Err(format!("the parameters ConfigMap {namespace}/{name} does not exist")),
            })
        }
    }
}

/// The parameters the Gateway's proxy Deployment was last made with, as cached (see
/// [`parameters::in_force`]); only from a Deployment the Gateway controls.
fn recorded_parameters(ctx: &Context, owner: &Owner) -> Option<String> {
    let name = crate::api::proxy_deployment_name(&owner.name);
    let cached = ctx.children.deployments.get(&ObjectRef::new(&name).within(&owner.namespace))?;
    let deployment = cached.object().ok().filter(|d| crate::controller::plan::controlled_by(d, owner))?;
    deployment.metadata.annotations?.remove(parameters::PARAMETERS_ANNOTATION)
}

/// The labels of `namespace`, as cached.
fn namespace_labels(caches: &GatewayCaches, namespace: &str) -> BTreeMap<String, String> {
    caches.namespaces.get(&ObjectRef::new(namespace)).map(|n| n.labels().clone()).unwrap_or_default()
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
    gateway: &Gateway,
    proxy: &GatewayProxy,
    now: Timestamp,
) -> Result<(Deployment, k8s_openapi::api::core::v1::Service), Error> {
    let caches = &ctx.children;
    let mut written = Written::default();
    if ctx.settings.metrics_image.is_some() {
        let (account, role, binding) = &proxy.identity;
        ensure(ctx, owner, &caches.identity.accounts, account, &mut written).await?;
        ensure(ctx, owner, &caches.identity.roles, role, &mut written).await?;
        ensure(ctx, owner, &caches.identity.bindings, binding, &mut written).await?;
    }
    ensure_proxy_config(ctx, owner, gateway, &proxy.config_map, now, &mut written).await?;
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
    let want = Want::new(
        ctx.children.endpoint_slices.live_addresses(&owner.namespace, &owner.name, ""),
        proxy.workload.replicas,
        proxy::access_log::metrics_port(proxy.workload.port_numbers()),
        programmed::config_id(&proxy.nginx_conf),
    );
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

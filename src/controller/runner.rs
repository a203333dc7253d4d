//! The controller as it runs: the watches, kube-runtime's `Controller` over them, and the census
//! of Balancers for the metrics, until stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::Error;
use super::cache::{Cached, Caches, ChildCaches, IdentityCaches};
use super::conditions::{ConditionType, find};
use super::context::{Clients, Context, Options, error_policy};
use super::endpoint_slices::{ReadyEndpointSlices, ReadySlice};
use super::gateways::{GatewayCaches, GatewayController, gateway_of};
use super::metrics::{CanaryCount, ControllerMetrics};
use super::prober::{self, Wakers};
use super::reconcile::reconcile;
use super::stored::StoredBalancer;
use super::watches::{Reflected, balancer_of, service_endpoint_slices};
use crate::api::ConditionStatus;
use crate::gateway::api::gateways::Gateway;
use crate::proxy::BALANCER_NAME_LABEL;

/// Runs the controller until `stop` is cancelled; sets `synced` once every cache has listed.
pub async fn run(
    clients: Clients,
    options: Options,
    metrics: Arc<ControllerMetrics>,
    synced: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let scope = &options.scope;
    let Clients { direct: client, throttled, contact } = clients;
    let services = Reflected::<Cached<Service>>::children(&client, scope, &contact);
    let config_maps = Reflected::<Cached<ConfigMap>>::children(&client, scope, &contact);
    let deployments = Reflected::<Cached<Deployment>>::children(&client, scope, &contact);
    let budgets = Reflected::<Cached<PodDisruptionBudget>>::children(&client, scope, &contact);
    let accounts = Reflected::<Cached<ServiceAccount>>::children(&client, scope, &contact);
    let roles = Reflected::<Cached<Role>>::children(&client, scope, &contact);
    let bindings = Reflected::<Cached<RoleBinding>>::children(&client, scope, &contact);
    let endpoint_slices = ReadyEndpointSlices::default();
    let slice_changes = service_endpoint_slices(&client, scope, &contact, endpoint_slices.clone());
    let balancers = Reflected::balancers(&client, scope, &contact);

    let children = ChildCaches {
        services: services.store.clone(),
        config_maps: config_maps.store.clone(),
        deployments: deployments.store.clone(),
        budgets: budgets.store.clone(),
        identity: IdentityCaches {
            accounts: accounts.store.clone(),
            roles: roles.store.clone(),
            bindings: bindings.store.clone(),
        },
        endpoint_slices,
    };
    let caches = Caches { balancers: balancers.store.clone(), children: children.clone() };
    let ctx = Arc::new(Context::new(throttled, children, options.proxy, metrics.clone()));
    // The prober wakes a Balancer, or a Gateway, whose proxy pods' count changed, outside the
    // reconcile workers; a change to a Gateway's child wakes that Gateway.
    let (wake, woken) = futures::channel::mpsc::unbounded();
    let (wake_gateways, woken_gateways) = futures::channel::mpsc::unbounded();
    let gateways = options.gateway_api.then(|| {
        GatewayController::new(&client, scope, &contact, ctx.clone(), woken_gateways, options.concurrency, &stop)
    });
    let gateway_caches = gateways.as_ref().map(|g| g.caches.clone());
    let census = count_balancers(balancers.store.clone(), gateway_caches.clone(), ctx.clone(), stop.clone());
    let to_gateway = ChildToGateway { caches: gateway_caches, wake: wake_gateways.clone() };
    let prober = prober::run(ctx.clone(), Wakers { balancers: wake, gateways: wake_gateways }, stop.clone());
    let gateway_controller = {
        let stop = stop.clone();
        async move {
            if let Some(gateways) = gateways {
                gateways.run(stop).await;
            }
        }
    };
    let readiness = {
        let caches = caches.clone();
        async move {
            if caches.synced().await {
                synced.store(true, Ordering::Release);
                tracing::info!("controller caches synced");
            }
        }
    };
    // Graceful shutdown drains in-flight reconciles. But kube-runtime's runner cannot end before
    // the Balancer cache has synced, and that cache's writer lives in the stream the runner owns.
    // Every reconcile waits for every cache before it writes, and a synced cache stays synced.
    // So when any cache is still unsynced at the stop (missing RBAC, a missing CRD), no reconcile
    // is in flight, and the controller is dropped instead of drained.
    let stopped_unsynced = {
        let stop = stop.clone();
        async move {
            stop.cancelled().await;
            if caches.synced_now() {
                std::future::pending::<()>().await;
            }
        }
    };
    let config = controller::Config::default().debounce(Duration::from_millis(200)).concurrency(options.concurrency);
    let controller = Controller::for_stream(balancers.changes, balancers.store)
        .watches_stream(to_gateway.also(services.changes), |child| balancer_of(&child))
        .watches_stream(to_gateway.also(config_maps.changes), |child| balancer_of(&child))
        .watches_stream(to_gateway.also(deployments.changes), |child| balancer_of(&child))
        .watches_stream(budgets.changes, |child| balancer_of(&child))
        .watches_stream(to_gateway.also(accounts.changes), |child| balancer_of(&child))
        .watches_stream(to_gateway.also(roles.changes), |child| balancer_of(&child))
        .watches_stream(to_gateway.also(bindings.changes), |child| balancer_of(&child))
        .watches_stream(to_gateway.also_slices(slice_changes), |slice| slice.balancer())
        .reconcile_on(woken)
        .with_config(config)
        .graceful_shutdown_on(stop.cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            if let Err(e) = result {
                log_controller_error(&e);
            }
            std::future::ready(())
        });
    let controller = async {
        tokio::select! {
            _ = controller => {}
            _ = stopped_unsynced => tracing::info!("stopped before the Balancer cache synced: nothing to drain"),
        }
    };
    tokio::join!(controller, readiness, census, prober, gateway_controller);
    metrics.set_balancers(0, 0, 0);
    metrics.set_backends_unavailable([]);
    metrics.set_canaries([]);
}

/// Backends with a weight and no ready endpoint, as the status says.
fn unavailable_backends(status: &crate::api::BalancerStatus) -> i64 {
    let count = status.backends.iter().filter(|b| b.weight > 0 && b.ready_endpoints == 0).count();
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Where a change to one of balancer's children also wakes the Gateway it belongs to.
struct ChildToGateway {
    caches: Option<GatewayCaches>,
    wake: UnboundedSender<ObjectRef<Gateway>>,
}

impl ChildToGateway {
    /// `changes`, each also waking its Gateway (when it is a Gateway's).
    fn also<K: Resource + Send + 'static>(
        &self,
        changes: BoxStream<'static, Result<K, watcher::Error>>,
    ) -> BoxStream<'static, Result<K, watcher::Error>> {
        let Some(caches) = self.caches.clone() else { return changes };
        let wake = self.wake.clone();
        changes
            .inspect_ok(move |child| {
                let meta = child.meta();
                let proxy = meta.labels.as_ref().and_then(|l| l.get(BALANCER_NAME_LABEL));
                if let Some(gateway) = gateway_of(&caches, meta.namespace.as_deref(), proxy.map(String::as_str)) {
                    let _ = wake.unbounded_send(gateway);
                }
            })
            .boxed()
    }

    /// The EndpointSlices' changes, each also waking the Gateway whose front Service it serves.
    fn also_slices(
        &self,
        changes: BoxStream<'static, Result<ReadySlice, watcher::Error>>,
    ) -> BoxStream<'static, Result<ReadySlice, watcher::Error>> {
        let Some(caches) = self.caches.clone() else { return changes };
        let wake = self.wake.clone();
        changes
            .inspect_ok(move |slice| {
                if let Some(proxy) = slice.balancer()
                    && let Some(gateway) = gateway_of(&caches, proxy.namespace.as_deref(), Some(&proxy.name))
                {
                    let _ = wake.unbounded_send(gateway);
                }
            })
            .boxed()
    }
}

/// Every 10 s: the Balancers by readiness and those with unavailable backends, for the
/// metrics, and what is kept per Balancer or Gateway
/// (failure counts, status write times) forgotten for deleted ones (never reconciled again).
async fn count_balancers(
    balancers: Store<StoredBalancer>,
    gateways: Option<GatewayCaches>,
    ctx: Arc<Context>,
    stop: CancellationToken,
) {
    let mut ticker = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let (mut ready, mut not_ready, mut unknown) = (0, 0, 0);
        let mut uids = std::collections::HashSet::new();
        let mut unavailable = Vec::new();
        let mut canaries = Vec::new();
        for balancer in balancers.state() {
            uids.extend(balancer.uid());
            canaries.extend(canary_count(&balancer));
            let missing = balancer.status.as_ref().map_or(0, unavailable_backends);
            if missing > 0 {
                unavailable.push((balancer.namespace().unwrap_or_default(), balancer.name_any(), missing));
            }
            let condition = find(balancer.status.as_ref(), ConditionType::Ready);
            match condition.and_then(|c| c.status.parse().ok()) {
                Some(ConditionStatus::True) => ready += 1,
                Some(ConditionStatus::False) => not_ready += 1,
                Some(ConditionStatus::Unknown) | None => unknown += 1,
            }
        }
        for gateway in gateways.iter().flat_map(|g| g.gateways.state()) {
            uids.extend(gateway.uid());
        }
        ctx.metrics.set_balancers(ready, not_ready, unknown);
        ctx.metrics.set_backends_unavailable(unavailable);
        ctx.metrics.set_canaries(canaries);
        ctx.metrics.set_records(ctx.records.keep_only(&uids));
    }
}

/// Where `balancer`'s canary is, when its spec has one.
fn canary_count(balancer: &StoredBalancer) -> Option<CanaryCount> {
    balancer.spec.as_ref().ok()?.canary.as_ref()?;
    let canary = balancer.status.as_ref()?.canary.as_ref()?;
    Some(CanaryCount {
        namespace: balancer.namespace().unwrap_or_default(),
        balancer: balancer.name_any(),
        phase: canary.phase.as_str(),
        step: i64::from(canary.step),
        weight: i64::from(canary.weight),
    })
}

fn log_controller_error(error: &controller::Error<Error, watcher::Error>) {
    match error {
        // Reconcile errors are logged where they happen, watch errors in `watch`; a vanished
        // object is routine.
        controller::Error::ReconcilerFailed(..) | controller::Error::ObjectNotFound(_) => {}
        other => tracing::warn!(error = %other, "controller error"),
    }
}

//! What the Gateway controller caches, and which Gateways each change wakes.
//!
//! Memory: routes are kept as their views ([`StoredRoute`]), the other Gateway API objects as
//! the API server sends them less their `managedFields`; Services (every one in scope, since a
//! route may name any) keep only their name, namespace, type, cluster IP and ports, and
//! EndpointSlices only their Service and ready endpoints; ConfigMaps are watched by their
//! metadata and not kept. See `docs/gateway-api.md` for the bound at 1,000 routes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceSpec};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use crate::controller::cache::{LISTED_POLL, listed_now};
use crate::controller::context::Scope;
use crate::controller::endpoint_slices::{ReadyEndpointSlices, ReadySlice};
use crate::controller::watches::{api, watch, watch_config};
use crate::gateway::api::gatewayclasses::GatewayClass;
use crate::gateway::api::gateways::Gateway;
use crate::gateway::api::referencegrants::ReferenceGrant;
use crate::gateway::api::tcproutes::TcpRoute;
use crate::gateway::api::tlsroutes::TlsRoute;
use crate::gateway::api::udproutes::UdpRoute;
use crate::gateway::routes::{RouteView, StoredRoute};
use crate::gateway::status::CONTROLLER_NAME;
use crate::runtime::contact::Contact;

/// Every cache the Gateway controller reads.
#[derive(Clone)]
pub(crate) struct GatewayCaches {
    /// Every GatewayClass.
    pub classes: Store<GatewayClass>,
    /// The Gateways in scope.
    pub gateways: Store<Gateway>,
    /// The TCPRoutes in scope, each read once into its view.
    pub tcp_routes: Store<StoredRoute<TcpRoute>>,
    /// The UDPRoutes in scope, likewise.
    pub udp_routes: Store<StoredRoute<UdpRoute>>,
    /// The TLSRoutes in scope, likewise.
    pub tls_routes: Store<StoredRoute<TlsRoute>>,
    /// The ReferenceGrants in scope.
    pub grants: Store<ReferenceGrant>,
    /// Every Service in scope, slimmed.
    pub services: Store<Service>,
    /// Every namespace's labels (for `allowedRoutes.namespaces.from: Selector`). Gateway API
    /// is served only by a cluster-wide install, so every namespace is watched.
    pub namespaces: Store<Namespace>,
    /// The ready endpoints of every Service in scope, from every EndpointSlice (a route may
    /// name any Service): a route's backend is its Service's ready pods.
    pub backend_slices: ReadyEndpointSlices,
    /// Which Gateway each proxy concerns, and which Gateways each Service and parameters
    /// ConfigMap wakes.
    pub index: Index,
}

impl GatewayCaches {
    /// Waits until every cache has listed; false when a watch ended first. It looks again
    /// every [`LISTED_POLL`], as the child caches do: kube's `wait_until_ready` wakes only the
    /// last of several tasks waiting on one store.
    pub(crate) async fn synced(&self) -> bool {
        loop {
            let all = [
                listed_now(&self.classes),
                listed_now(&self.gateways),
                listed_now(&self.tcp_routes),
                listed_now(&self.udp_routes),
                listed_now(&self.tls_routes),
                listed_now(&self.grants),
                listed_now(&self.services),
                listed_now(&self.namespaces),
            ];
            if all.contains(&Some(false)) {
                return false;
            }
            if all.iter().all(Option::is_some) {
                return true;
            }
            tokio::time::sleep(LISTED_POLL).await;
        }
    }

    /// Whether `gateway`'s class is one balancer serves.
    pub(crate) fn is_ours(&self, gateway: &Gateway) -> bool {
        self.controller_of(gateway).is_some_and(|c| c == CONTROLLER_NAME)
    }

    /// Whether `gateway`'s class exists and is another controller's.
    pub(crate) fn is_others(&self, gateway: &Gateway) -> bool {
        self.controller_of(gateway).is_some_and(|c| c != CONTROLLER_NAME)
    }

    /// The `controllerName` of `gateway`'s class, when the class exists.
    fn controller_of(&self, gateway: &Gateway) -> Option<String> {
        let class = self.classes.get(&ObjectRef::new(&gateway.spec.gateway_class_name))?;
        Some(class.spec.controller_name.clone())
    }

    /// Every route of the three kinds, read alike.
    pub(crate) fn routes(&self) -> Vec<Arc<RouteView>> {
        let tcp = self.tcp_routes.state().into_iter().map(|r| r.view.clone());
        let udp = self.udp_routes.state().into_iter().map(|r| r.view.clone());
        let tls = self.tls_routes.state().into_iter().map(|r| r.view.clone());
        tcp.chain(udp).chain(tls).collect()
    }

    /// The Gateways of class `class`.
    fn of_class(&self, class: &str) -> Vec<ObjectRef<Gateway>> {
        let gateways = self.gateways.state();
        gateways
            .iter()
            .filter(|g| g.spec.gateway_class_name == class)
            .map(|g| ObjectRef::from_obj(g.as_ref()))
            .collect()
    }

    fn all(&self) -> Vec<ObjectRef<Gateway>> {
        self.gateways.state().iter().map(|g| ObjectRef::from_obj(g.as_ref())).collect()
    }
}

/// Which Gateway each proxy (by its name and namespace) is, and which Gateways each Service
/// feeds, as their last reconciles found: a change to a proxy's children, or to a Service a
/// route names, wakes only those Gateways.
#[derive(Clone, Default)]
pub(crate) struct Index(Arc<Mutex<IndexTables>>);

#[derive(Default)]
struct IndexTables {
    proxies: HashMap<(String, String), ObjectRef<Gateway>>,
    services: Readers,
    parameters: Readers,
}

/// Which Gateways read each object, by its namespace and name.
type Readers = HashMap<(String, String), HashSet<ObjectRef<Gateway>>>;

/// Makes `gateway` a reader of `objects` only.
fn relink(readers: &mut Readers, gateway: &ObjectRef<Gateway>, objects: &[(String, String)]) {
    readers.retain(|_, gateways| {
        gateways.remove(gateway);
        !gateways.is_empty()
    });
    for object in objects {
        readers.entry(object.clone()).or_default().insert(gateway.clone());
    }
}

fn readers_of(readers: &Readers, namespace: &str, name: &str) -> Vec<ObjectRef<Gateway>> {
    readers.get(&(namespace.to_string(), name.to_string())).into_iter().flatten().cloned().collect()
}

impl Index {
    fn lock(&self) -> MutexGuard<'_, IndexTables> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records what `gateway`'s reconcile found: its proxy's name, the Services it reads, and
    /// the ConfigMap its parameters are in.
    pub(crate) fn record(
        &self,
        gateway: &ObjectRef<Gateway>,
        proxy: (String, String),
        services: &[(String, String)],
        parameters: Option<(String, String)>,
    ) {
        let mut tables = self.lock();
        tables.proxies.retain(|_, g| g != gateway);
        tables.proxies.insert(proxy, gateway.clone());
        relink(&mut tables.services, gateway, services);
        relink(&mut tables.parameters, gateway, parameters.as_slice());
    }

    /// Forgets `gateway`; whether it was known.
    pub(crate) fn forget(&self, gateway: &ObjectRef<Gateway>) -> bool {
        let mut tables = self.lock();
        let known = tables.proxies.values().any(|g| g == gateway);
        tables.proxies.retain(|_, g| g != gateway);
        relink(&mut tables.services, gateway, &[]);
        relink(&mut tables.parameters, gateway, &[]);
        known
    }

    /// The Gateway whose proxy is `name` in `namespace`.
    pub(crate) fn proxy(&self, namespace: &str, name: &str) -> Option<ObjectRef<Gateway>> {
        self.lock().proxies.get(&(namespace.to_string(), name.to_string())).cloned()
    }

    /// The Gateways whose routes name Service `namespace/name`.
    fn feeding(&self, namespace: &str, name: &str) -> Vec<ObjectRef<Gateway>> {
        readers_of(&self.lock().services, namespace, name)
    }

    /// The Gateways whose parameters are ConfigMap `namespace/name`.
    fn configured_by(&self, namespace: &str, name: &str) -> Vec<ObjectRef<Gateway>> {
        readers_of(&self.lock().parameters, namespace, name)
    }
}

/// The caches, and the changes that wake Gateways, as one stream each.
pub(crate) struct Watched {
    pub caches: GatewayCaches,
    pub gateways: BoxStream<'static, Result<Gateway, watcher::Error>>,
    pub wakes: Vec<BoxStream<'static, ObjectRef<Gateway>>>,
    /// The GatewayClasses that changed, for their status.
    pub classes: BoxStream<'static, GatewayClass>,
    /// A signal each time a Gateway is deleted, and where a reconcile finds one balancer no
    /// longer serves: routes' entries for it are then withdrawn.
    pub tidy: (UnboundedSender<()>, UnboundedReceiver<()>),
}

/// Starts every watch of the Gateway controller.
pub(crate) fn watched(client: &Client, scope: &Scope, contact: &Contact) -> Watched {
    let (classes, class_writer) = reflector::store();
    let class_changes = watch(Api::<GatewayClass>::all(client.clone()), watch_config(), contact)
        .modify(strip)
        .reflect(class_writer)
        .touched_objects()
        .filter_map(|c| std::future::ready(c.ok()))
        .boxed();
    let (gateways, gateway_writer) = reflector::store();
    let index = Index::default();
    let tidy = futures::channel::mpsc::unbounded();
    let (deleted, forgotten) = (tidy.0.clone(), index.clone());
    let gateway_changes = watch(api(client, scope), watch_config(), contact)
        .modify(strip)
        .reflect(gateway_writer)
        .inspect_ok(move |event| match event {
            // A relist reports no deletion: the Gateways gone meanwhile are found by the tidy.
            watcher::Event::Delete(gateway) => {
                forgotten.forget(&ObjectRef::from_obj(gateway));
                let _ = deleted.unbounded_send(());
            }
            watcher::Event::InitDone => {
                let _ = deleted.unbounded_send(());
            }
            _ => {}
        })
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default())
        .boxed();
    let (tcp_routes, tcp) = reflected::<StoredRoute<TcpRoute>>(client, scope, contact);
    let (udp_routes, udp) = reflected::<StoredRoute<UdpRoute>>(client, scope, contact);
    let (tls_routes, tls) = reflected::<StoredRoute<TlsRoute>>(client, scope, contact);
    let (grants, grant_changes) = reflected::<ReferenceGrant>(client, scope, contact);
    let (services, writer) = reflector::store();
    let service_changes = watch(api::<Service>(client, scope), watch_config(), contact)
        .modify(slim_service)
        .reflect(writer)
        .touched_objects()
        .boxed();
    let (namespaces, writer) = reflector::store();
    let namespace_changes = watch(Api::<Namespace>::all(client.clone()), watch_config(), contact)
        .modify(|n| {
            strip(n);
            n.spec = None;
            n.status = None;
        })
        .reflect(writer)
        .touched_objects()
        .boxed();
    let backend_slices = ReadyEndpointSlices::default();
    let slice_changes = {
        let table = backend_slices.clone();
        watch(api::<ReadySlice>(client, scope), watch_config(), contact)
            .inspect_ok(move |event| table.apply(event))
            .touched_objects()
            .boxed()
    };
    let caches = GatewayCaches {
        classes,
        gateways,
        tcp_routes,
        udp_routes,
        tls_routes,
        grants,
        services,
        namespaces,
        backend_slices,
        index,
    };
    let (class_wakes, class_status) = {
        let (tx, rx) = futures::channel::mpsc::unbounded::<GatewayClass>();
        let by_class = caches.clone();
        let wakes = class_changes
            .flat_map(move |class| {
                let _ = tx.unbounded_send(class.clone());
                futures::stream::iter(by_class.of_class(&class.name_any()))
            })
            .boxed();
        (wakes, rx.boxed())
    };
    let wakes = vec![
        class_wakes,
        route_wakes(tcp),
        route_wakes(udp),
        route_wakes(tls),
        every_gateway(grant_changes, caches.clone()),
        {
            let index = caches.index.clone();
            service_changes
                .filter_map(|s| std::future::ready(s.ok()))
                .flat_map(move |s| {
                    futures::stream::iter(index.feeding(&s.namespace().unwrap_or_default(), &s.name_any()))
                })
                .boxed()
        },
        every_gateway(namespace_changes, caches.clone()),
        {
            // Parameters ConfigMaps, by their metadata only (any ConfigMap may be one).
            let index = caches.index.clone();
            watch(Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()), watch_config(), contact)
                .touched_objects()
                .filter_map(|c| std::future::ready(c.ok()))
                .flat_map(move |c| {
                    futures::stream::iter(index.configured_by(&c.namespace().unwrap_or_default(), &c.name_any()))
                })
                .boxed()
        },
        {
            let index = caches.index.clone();
            slice_changes
                .filter_map(|s| std::future::ready(s.ok()))
                .flat_map(move |slice| {
                    let feeding = slice.service().map(|(namespace, name)| index.feeding(namespace, name));
                    futures::stream::iter(feeding.unwrap_or_default())
                })
                .boxed()
        },
    ];
    Watched { caches, gateways: gateway_changes, wakes, classes: class_status, tidy }
}

fn reflected<K>(
    client: &Client,
    scope: &Scope,
    contact: &Contact,
) -> (Store<K>, BoxStream<'static, Result<K, watcher::Error>>)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let changes =
        watch(api(client, scope), watch_config(), contact).modify(strip).reflect(writer).touched_objects().boxed();
    (store, changes)
}

/// A route's change wakes the Gateways it names, and those its status lists.
fn route_wakes<K>(
    changes: BoxStream<'static, Result<StoredRoute<K>, watcher::Error>>,
) -> BoxStream<'static, ObjectRef<Gateway>>
where
    K: Send + 'static,
{
    changes
        .filter_map(|r| std::future::ready(r.ok()))
        .flat_map(|route| {
            let gateways = route.view.gateways();
            futures::stream::iter(
                gateways.into_iter().map(|(namespace, name)| ObjectRef::new(&name).within(&namespace)),
            )
        })
        .boxed()
}

/// Every change wakes every Gateway (ReferenceGrants and namespaces: rare, and any Gateway may
/// read them).
fn every_gateway<K: Send + 'static>(
    changes: BoxStream<'static, Result<K, watcher::Error>>,
    caches: GatewayCaches,
) -> BoxStream<'static, ObjectRef<Gateway>> {
    changes.filter_map(|r| std::future::ready(r.ok())).flat_map(move |_| futures::stream::iter(caches.all())).boxed()
}

/// Drops what no reconcile reads and a watch sends on every object: `managedFields`.
fn strip<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// A Service as a route's backend needs it: type, cluster IP and ports.
fn slim_service(service: &mut Service) {
    let meta = service.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
    meta.labels = None;
    service.status = None;
    if let Some(spec) = service.spec.take() {
        service.spec = Some(ServiceSpec {
            type_: spec.type_,
            cluster_ip: spec.cluster_ip,
            ports: spec.ports,
            ..ServiceSpec::default()
        });
    }
}

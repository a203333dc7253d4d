//! What the Gateway controller caches, and which Gateways each change wakes.
//!
//! Memory: the Gateway API objects are cached as the API server sends them, less their
//! `managedFields`; Services (every one in scope, since a route may name any) keep only their
//! name, namespace, type, cluster IP and ports. See `docs/gateway-api.md` for the bound at
//! 1,000 routes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Service, ServiceSpec};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use crate::controller::context::Scope;
use crate::controller::watches::{api, watch, watch_config};
use crate::gateway::api::gatewayclasses::GatewayClass;
use crate::gateway::api::gateways::Gateway;
use crate::gateway::api::referencegrants::ReferenceGrant;
use crate::gateway::api::tcproutes::TcpRoute;
use crate::gateway::api::tlsroutes::TlsRoute;
use crate::gateway::api::udproutes::UdpRoute;
use crate::gateway::attachment::RouteKind;
use crate::gateway::routes::RouteView;
use crate::runtime::contact::Contact;

/// Every cache the Gateway controller reads.
#[derive(Clone)]
pub(crate) struct GatewayCaches {
    /// Every GatewayClass.
    pub classes: Store<GatewayClass>,
    /// The Gateways in scope.
    pub gateways: Store<Gateway>,
    /// The TCPRoutes in scope.
    pub tcp_routes: Store<TcpRoute>,
    /// The UDPRoutes in scope.
    pub udp_routes: Store<UdpRoute>,
    /// The TLSRoutes in scope.
    pub tls_routes: Store<TlsRoute>,
    /// The ReferenceGrants in scope.
    pub grants: Store<ReferenceGrant>,
    /// Every Service in scope, slimmed.
    pub services: Store<Service>,
    /// Every namespace's labels (for `allowedRoutes.namespaces.from: Selector`); `None` when
    /// the controller watches one namespace.
    pub namespaces: Option<Store<Namespace>>,
    /// Which Gateway each proxy and each Service concerns.
    pub index: Index,
}

impl GatewayCaches {
    /// Waits until every cache has listed; false when a watch ended first.
    pub(crate) async fn synced(&self) -> bool {
        let listed = [
            self.classes.wait_until_ready().await,
            self.gateways.wait_until_ready().await,
            self.tcp_routes.wait_until_ready().await,
            self.udp_routes.wait_until_ready().await,
            self.tls_routes.wait_until_ready().await,
            self.grants.wait_until_ready().await,
            self.services.wait_until_ready().await,
        ];
        let namespaces = match &self.namespaces {
            Some(store) => store.wait_until_ready().await.is_ok(),
            None => true,
        };
        listed.iter().all(Result::is_ok) && namespaces
    }

    /// Every route of the three kinds, read alike.
    pub(crate) fn routes(&self) -> Vec<RouteView> {
        let tcp = self.tcp_routes.state().into_iter().filter_map(|r| RouteView::of(RouteKind::Tcp, r.as_ref()));
        let udp = self.udp_routes.state().into_iter().filter_map(|r| RouteView::of(RouteKind::Udp, r.as_ref()));
        let tls = self.tls_routes.state().into_iter().filter_map(|r| RouteView::of(RouteKind::Tls, r.as_ref()));
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
    services: HashMap<(String, String), HashSet<ObjectRef<Gateway>>>,
}

impl Index {
    fn lock(&self) -> MutexGuard<'_, IndexTables> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records what `gateway`'s reconcile found: its proxy's name, and the Services it reads.
    pub(crate) fn record(&self, gateway: &ObjectRef<Gateway>, proxy: (String, String), services: &[(String, String)]) {
        let mut tables = self.lock();
        tables.proxies.insert(proxy, gateway.clone());
        tables.services.retain(|_, gateways| {
            gateways.remove(gateway);
            !gateways.is_empty()
        });
        for service in services {
            tables.services.entry(service.clone()).or_default().insert(gateway.clone());
        }
    }

    /// Forgets `gateway`.
    pub(crate) fn forget(&self, gateway: &ObjectRef<Gateway>) {
        let mut tables = self.lock();
        tables.proxies.retain(|_, g| g != gateway);
        tables.services.retain(|_, gateways| {
            gateways.remove(gateway);
            !gateways.is_empty()
        });
    }

    /// The Gateway whose proxy is `name` in `namespace`.
    pub(crate) fn proxy(&self, namespace: &str, name: &str) -> Option<ObjectRef<Gateway>> {
        self.lock().proxies.get(&(namespace.to_string(), name.to_string())).cloned()
    }

    fn feeding(&self, namespace: &str, name: &str) -> Vec<ObjectRef<Gateway>> {
        let tables = self.lock();
        tables.services.get(&(namespace.to_string(), name.to_string())).into_iter().flatten().cloned().collect()
    }
}

/// The caches, and the changes that wake Gateways, as one stream each.
pub(crate) struct Watched {
    pub caches: GatewayCaches,
    pub gateways: BoxStream<'static, Result<Gateway, watcher::Error>>,
    pub wakes: Vec<BoxStream<'static, ObjectRef<Gateway>>>,
    /// The GatewayClasses that changed, for their status.
    pub classes: BoxStream<'static, GatewayClass>,
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
    let gateway_changes = watch(api(client, scope), watch_config(), contact)
        .modify(strip)
        .reflect(gateway_writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default())
        .boxed();
    let (tcp_routes, tcp) = reflected::<TcpRoute>(client, scope, contact);
    let (udp_routes, udp) = reflected::<UdpRoute>(client, scope, contact);
    let (tls_routes, tls) = reflected::<TlsRoute>(client, scope, contact);
    let (grants, grant_changes) = reflected::<ReferenceGrant>(client, scope, contact);
    let (services, writer) = reflector::store();
    let service_changes = watch(api::<Service>(client, scope), watch_config(), contact)
        .modify(slim_service)
        .reflect(writer)
        .touched_objects()
        .boxed();
    let (namespaces, namespace_changes) = match scope {
        Scope::All => {
            let (store, writer) = reflector::store();
            let changes = watch(Api::<Namespace>::all(client.clone()), watch_config(), contact)
                .modify(|n| {
                    strip(n);
                    n.spec = None;
                    n.status = None;
                })
                .reflect(writer)
                .touched_objects()
                .boxed();
            (Some(store), Some(changes))
        }
        Scope::Namespace(_) => (None, None),
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
        index: Index::default(),
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
    let mut wakes = vec![
        class_wakes,
        route_wakes(tcp, RouteKind::Tcp),
        route_wakes(udp, RouteKind::Udp),
        route_wakes(tls, RouteKind::Tls),
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
    ];
    if let Some(changes) = namespace_changes {
        wakes.push(every_gateway(changes, caches.clone()));
    }
    Watched { caches, gateways: gateway_changes, wakes, classes: class_status }
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
    changes: BoxStream<'static, Result<K, watcher::Error>>,
    kind: RouteKind,
) -> BoxStream<'static, ObjectRef<Gateway>>
where
    K: Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    changes
        .filter_map(|r| std::future::ready(r.ok()))
        .flat_map(move |route| {
            let gateways = RouteView::of(kind, &route).map(|view| view.gateways()).unwrap_or_default();
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
    changes
        .try_filter_map(|_| std::future::ready(Ok(Some(()))))
        .filter_map(|r| std::future::ready(r.ok()))
        .flat_map(move |()| futures::stream::iter(caches.all()))
        .boxed()
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

//! TCPRoutes, UDPRoutes and TLSRoutes seen alike: the three kinds share the shape of their
//! `parentRefs`, `backendRefs` and `status.parents`, so each is read once into a [`RouteView`]
//! and the rules are written once.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Resource;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};

use super::api::tcproutes::{TcpRouteParentRefs, TcpRouteRulesBackendRefs, TcpRouteStatusParents};
use super::attachment::{GROUP, RouteKind};
use super::backend_refs::BackendRef;
use super::status::CONTROLLER_NAME;
use crate::runtime::cached_kind::resource_as_kind;

/// A route of any kind balancer serves, as the rules read it.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteView {
    /// Its kind.
    pub kind: RouteKind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `metadata.generation`, for its conditions' `observedGeneration`.
    pub generation: Option<i64>,
    /// `metadata.resourceVersion`, which a status write is conditional on.
    pub resource_version: Option<String>,
    /// When it was created: the oldest route wins where routes compete.
    pub created: Option<Time>,
    /// `spec.hostnames` (a TLSRoute's); empty for the others.
    pub hostnames: Vec<String>,
    /// `spec.parentRefs`.
    pub parent_refs: Vec<TcpRouteParentRefs>,
    /// Every rule's `backendRefs`, in order.
    pub backend_refs: Vec<TcpRouteRulesBackendRefs>,
    /// `status.parents`, every controller's.
    pub status_parents: Vec<TcpRouteStatusParents>,
}

/// The fields every route kind shares, as they are spelled on the wire (serde skips the rest).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Shared {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: SharedSpec,
    #[serde(default)]
    status: SharedStatus,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct SharedSpec {
    #[serde(default)]
    parent_refs: Vec<TcpRouteParentRefs>,
    #[serde(default)]
    hostnames: Vec<String>,
    #[serde(default)]
    rules: Vec<SharedRule>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct SharedRule {
    #[serde(default)]
    backend_refs: Vec<TcpRouteRulesBackendRefs>,
}

#[derive(Deserialize, Default)]
struct SharedStatus {
    #[serde(default)]
    parents: Vec<TcpRouteStatusParents>,
}

impl RouteView {
    /// `route`, a `kind` route, read; `None` when it does not read as one (the API server
    /// validated it, so only a bug makes that so).
    pub fn of<K>(kind: RouteKind, route: &K) -> Option<RouteView>
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let shared: Shared = serde_json::from_value(serde_json::to_value(route).ok()?).ok()?;
        Some(RouteView::read(kind, shared))
    }

    fn read(kind: RouteKind, shared: Shared) -> RouteView {
        let meta = shared.metadata;
        RouteView {
            kind,
            namespace: meta.namespace.unwrap_or_default(),
            name: meta.name.unwrap_or_default(),
            generation: meta.generation,
            resource_version: meta.resource_version,
            created: meta.creation_timestamp,
            hostnames: shared.spec.hostnames,
            parent_refs: shared.spec.parent_refs,
            backend_refs: shared.spec.rules.into_iter().flat_map(|r| r.backend_refs).collect(),
            status_parents: shared.status.parents,
        }
    }

    /// Whether `parent` names the Gateway `namespace/name`.
    pub fn names_gateway(&self, parent: &TcpRouteParentRefs, namespace: &str, name: &str) -> bool {
        let group = parent.group.as_deref().unwrap_or(GROUP);
        let kind = parent.kind.as_deref().unwrap_or("Gateway");
        let parent_namespace = parent.namespace.as_deref().unwrap_or(&self.namespace);
        group == GROUP && kind == "Gateway" && parent_namespace == namespace && parent.name == name
    }

    /// The Gateways its `parentRefs` name, and those its status says a controller wrote for
    /// (a reference since removed still has its entry there, until that Gateway's reconcile
    /// removes it), as `(namespace, name)`.
    pub fn gateways(&self) -> Vec<(String, String)> {
        let named = self.parent_refs.iter().map(|p| (&p.group, &p.kind, &p.namespace, &p.name));
        let listed = self.status_parents.iter().map(|s| {
            let p = &s.parent_ref;
            (&p.group, &p.kind, &p.namespace, &p.name)
        });
        let mut gateways: Vec<(String, String)> = named
            .chain(listed)
            .filter(|(group, kind, _, _)| {
                group.as_deref().unwrap_or(GROUP) == GROUP && kind.as_deref().unwrap_or("Gateway") == "Gateway"
            })
            .map(|(_, _, namespace, name)| (namespace.clone().unwrap_or_else(|| self.namespace.clone()), name.clone()))
            .collect();
        gateways.sort();
        gateways.dedup();
        gateways
    }

    /// Its `status.parents` without balancer's entries for Gateways balancer no longer serves
    /// (deleted, or moved to another class), `served` telling which it does by namespace and
    /// name; `None` when there is no such entry. Other controllers' entries are kept.
    pub fn without_stale_entries(&self, served: impl Fn(&str, &str) -> bool) -> Option<Vec<TcpRouteStatusParents>> {
        let stale = |entry: &TcpRouteStatusParents| {
            let parent = &entry.parent_ref;
            let gateway = parent.group.as_deref().unwrap_or(GROUP) == GROUP
                && parent.kind.as_deref().unwrap_or("Gateway") == "Gateway";
            let namespace = parent.namespace.as_deref().unwrap_or(&self.namespace);
            entry.controller_name == CONTROLLER_NAME && gateway && !served(namespace, &parent.name)
        };
        let kept: Vec<TcpRouteStatusParents> = self.status_parents.iter().filter(|e| !stale(e)).cloned().collect();
        (kept.len() < self.status_parents.len()).then_some(kept)
    }

    /// Whether the Gateway `namespace/name` is among [`RouteView::gateways`] (without building
    /// the list: every reconcile asks this of every route).
    pub fn concerns(&self, namespace: &str, name: &str) -> bool {
        let named = self.parent_refs.iter().map(|p| (&p.group, &p.kind, &p.namespace, &p.name));
        let listed = self.status_parents.iter().map(|s| {
            let p = &s.parent_ref;
            (&p.group, &p.kind, &p.namespace, &p.name)
        });
        named.chain(listed).any(|(group, kind, parent_namespace, parent_name)| {
            group.as_deref().unwrap_or(GROUP) == GROUP
                && kind.as_deref().unwrap_or("Gateway") == "Gateway"
                && parent_namespace.as_deref().unwrap_or(&self.namespace) == namespace
                && parent_name == name
        })
    }

    /// Its backend references, as [`backend_refs`](super::backend_refs) reads them.
    pub fn backend_references(&self) -> impl Iterator<Item = BackendRef<'_>> {
        self.backend_refs.iter().map(|b| BackendRef {
            group: b.group.as_deref(),
            kind: b.kind.as_deref(),
            name: &b.name,
            namespace: b.namespace.as_deref(),
            port: b.port,
            weight: b.weight,
        })
    }
}

/// A route of kind `K` (a TCPRoute, UDPRoute or TLSRoute) as the cache keeps it: read into its
/// [`RouteView`] as it arrives from the watch, so that the cache holds no other field and no
/// reconcile reads a route twice. Its metadata keeps only what the store keys on and the watch
/// resumes from.
pub struct StoredRoute<K> {
    metadata: ObjectMeta,
    /// The route, as the rules read it.
    pub view: Arc<RouteView>,
    kind: PhantomData<fn() -> K>,
}

impl<'de, K: Resource<DynamicType = ()>> Deserialize<'de> for StoredRoute<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let kind =
            RouteKind::named(&K::kind(&())).ok_or_else(|| D::Error::custom("not a route kind balancer reads"))?;
        let shared = Shared::deserialize(deserializer)?;
        let metadata = ObjectMeta {
            name: shared.metadata.name.clone(),
            namespace: shared.metadata.namespace.clone(),
            resource_version: shared.metadata.resource_version.clone(),
            ..ObjectMeta::default()
        };
        Ok(StoredRoute { metadata, view: Arc::new(RouteView::read(kind, shared)), kind: PhantomData })
    }
}

impl<K> Clone for StoredRoute<K> {
    fn clone(&self) -> Self {
        StoredRoute { metadata: self.metadata.clone(), view: self.view.clone(), kind: PhantomData }
    }
}

impl<K: Resource<DynamicType = ()>> fmt::Debug for StoredRoute<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredRoute").field("kind", &K::kind(&())).field("view", &self.view).finish()
    }
}

resource_as_kind!(impl[K: Resource<DynamicType = ()>] StoredRoute<K> => K);

/// Every Service the `routes`' backend references name, as `(namespace, name)`, sorted and
/// distinct: the Services whose change reassembles the Gateway that reads them.
pub fn referenced_services(routes: &[RouteView]) -> Vec<(String, String)> {
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

/// A `parentRef` as a status entry spells it: the same fields, so it reads back equal.
pub fn parent_ref_value(parent: &TcpRouteParentRefs) -> serde_json::Value {
    serde_json::to_value(parent).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::gateway::api::tlsroutes::TlsRoute;

    #[test]
    fn a_tlsroute_reads_with_its_hostnames_parents_and_backends() {
        let route: TlsRoute = serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TLSRoute",
            "metadata": {"namespace": "apps", "name": "db", "generation": 3},
            "spec": {
                "hostnames": ["db.example.com"],
                "parentRefs": [{"name": "gw", "sectionName": "tls"}, {"name": "other", "namespace": "infra"},
                               {"name": "svc", "kind": "Service", "group": ""}],
                "rules": [{"backendRefs": [{"name": "a", "port": 443}]}, {"backendRefs": [{"name": "b", "port": 443, "weight": 0}]}]
            },
            "status": {"parents": [{"controllerName": "x", "parentRef": {"name": "old"}, "conditions": []}]}
        }))
        .expect("a TLSRoute");
        let view = RouteView::of(RouteKind::Tls, &route).expect("it reads");
        assert_eq!(view.hostnames, ["db.example.com"]);
        assert_eq!(view.generation, Some(3));
        assert!(view.names_gateway(&view.parent_refs[0], "apps", "gw"));
        assert!(!view.names_gateway(&view.parent_refs[0], "infra", "gw"));
        assert!(view.names_gateway(&view.parent_refs[1], "infra", "other"));
        assert!(!view.names_gateway(&view.parent_refs[2], "apps", "svc"), "a Service is no Gateway");
        let gateways = view.gateways();
        let expected =
            [("apps", "gw"), ("apps", "old"), ("infra", "other")].map(|(n, g)| (n.to_string(), g.to_string()));
        assert_eq!(gateways, expected);
        for (namespace, name) in [("apps", "gw"), ("apps", "old"), ("infra", "other"), ("apps", "svc"), ("infra", "gw")]
        {
            let listed = expected.iter().any(|(n, g)| (n.as_str(), g.as_str()) == (namespace, name));
            assert_eq!(view.concerns(namespace, name), listed, "{namespace}/{name}");
        }
        let weights: Vec<u32> = view.backend_references().map(|b| b.weight()).collect();
        assert_eq!(weights, [1, 0]);
        assert_eq!(parent_ref_value(&view.parent_refs[0]), json!({"name": "gw", "sectionName": "tls"}));
        let served = |namespace: &str, name: &str| (namespace, name) != ("apps", "old");
        assert_eq!(view.without_stale_entries(served), None, "another controller's entry for a Gateway gone is kept");
        let mut ours = view.clone();
        let entry = |namespace: Option<&str>, name: &str| {
            serde_json::from_value::<TcpRouteStatusParents>(json!({
                "controllerName": CONTROLLER_NAME, "conditions": [],
                "parentRef": {"name": name, "namespace": namespace},
            }))
            .expect("an entry")
        };
        ours.status_parents.extend([entry(None, "old"), entry(Some("apps"), "gw"), entry(Some("infra"), "old")]);
        let kept = ours.without_stale_entries(served).expect("one is stale");
        let names: Vec<(&str, &str)> =
            kept.iter().map(|e| (e.controller_name.as_str(), e.parent_ref.name.as_str())).collect();
        assert_eq!(
            names,
            [("x", "old"), (CONTROLLER_NAME, "gw"), (CONTROLLER_NAME, "old")],
            "only ours for apps/old goes"
        );
        let services = referenced_services(&[view.clone(), view]);
        assert_eq!(services, [("apps", "a"), ("apps", "b")].map(|(n, s)| (n.to_string(), s.to_string())), "once each");
    }
}

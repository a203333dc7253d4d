//! TCPRoutes, UDPRoutes and TLSRoutes seen alike: the three kinds share the shape of their
//! `parentRefs`, `backendRefs` and `status.parents`, so each is read once into a [`RouteView`]
//! and the rules are written once.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::api::tcproutes::{TcpRouteParentRefs, TcpRouteRulesBackendRefs, TcpRouteStatusParents};
use super::attachment::{GROUP, RouteKind};
use super::backend_refs::BackendRef;

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

/// The fields every route kind shares, as they are spelled on the wire.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Shared {
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
        let meta = route.meta();
        Some(RouteView {
            kind,
            namespace: route.namespace().unwrap_or_default(),
            name: route.name_any(),
            generation: meta.generation,
            resource_version: meta.resource_version.clone(),
            created: meta.creation_timestamp.clone(),
            hostnames: shared.spec.hostnames,
            parent_refs: shared.spec.parent_refs,
            backend_refs: shared.spec.rules.into_iter().flat_map(|r| r.backend_refs).collect(),
            status_parents: shared.status.parents,
        })
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
        let weights: Vec<u32> = view.backend_references().map(|b| b.weight()).collect();
        assert_eq!(weights, [1, 0]);
        assert_eq!(parent_ref_value(&view.parent_refs[0]), json!({"name": "gw", "sectionName": "tls"}));
    }
}

//! A route's `backendRefs`, resolved to Services: the kind, the ReferenceGrant a reference to
//! another namespace needs, and the Service's port. Pure: the caller gives what the cache holds.
//! A reference that does not resolve still takes its weight, and the proxy refuses that share.

use std::net::IpAddr;
use std::ops::Deref;

use k8s_openapi::api::core::v1::{Service, ServicePort};

use super::api::referencegrants::ReferenceGrant;
use super::attachment::{GROUP, RouteKind};
use crate::api::formats::is_dns1123_subdomain;

/// One `backendRef` of a route's rule, as every route kind spells it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendRef<'a> {
    /// `group`: the core group when unset or empty.
    pub group: Option<&'a str>,
    /// `kind`: `Service` when unset.
    pub kind: Option<&'a str>,
    /// `name`.
    pub name: &'a str,
    /// `namespace`: the route's when unset.
    pub namespace: Option<&'a str>,
    /// `port`: the Service's port, which a Service reference needs.
    pub port: Option<i32>,
    /// `weight`: 1 when unset.
    pub weight: Option<i32>,
}

impl BackendRef<'_> {
    /// Its share beside the rule's other references.
    pub fn weight(&self) -> u32 {
        u32::try_from(self.weight.unwrap_or(1)).unwrap_or_default()
    }
}

/// A Service a route may send to, at a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedService {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The Service's port.
    pub port: u16,
    /// That port's name (empty when unnamed): the name its EndpointSlices give the pods' port.
    pub port_name: String,
    /// Its cluster IP, where the proxy sends; `None` for a headless Service, which has none.
    pub cluster_ip: Option<IpAddr>,
}

/// Why a reference does not resolve: the route's `ResolvedRefs` condition's reason, False.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unresolved {
    /// Not a Service of the core group.
    InvalidKind,
    /// In another namespace, and no ReferenceGrant there allows it.
    RefNotPermitted,
    /// No such Service, no such port on it, no port given, or an ExternalName Service (which
    /// may point outside the cluster, CVE-2021-25740): the message says which.
    BackendNotFound(String),
}

impl Unresolved {
    /// The condition's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Unresolved::InvalidKind => "InvalidKind",
            Unresolved::RefNotPermitted => "RefNotPermitted",
            Unresolved::BackendNotFound(_) => "BackendNotFound",
        }
    }

    /// The condition's message.
    pub fn message(&self, reference: &BackendRef<'_>) -> String {
        let name = reference.name;
        match self {
            Unresolved::InvalidKind => {
                let (group, kind) = (reference.group.unwrap_or_default(), reference.kind.unwrap_or("Service"));
                format!("backendRef {name}: {kind} of group {group:?} is not a kind balancer sends to (only Services)")
            }
            Unresolved::RefNotPermitted => {
                format!("backendRef {name}: no ReferenceGrant in its namespace allows this route to refer to it")
            }
            Unresolved::BackendNotFound(why) => format!("backendRef {name}: {why}"),
        }
    }
}

/// The Service `reference` of a `kind` route in `route_namespace` names, at its port; or why
/// not. `service` finds a Service by namespace and name; `grants` are the ReferenceGrants of
/// the Service's namespace.
pub fn resolve<S: Deref<Target = Service>>(
    kind: RouteKind,
    route_namespace: &str,
    reference: &BackendRef<'_>,
    service: impl Fn(&str, &str) -> Option<S>,
    grants: &[ReferenceGrant],
) -> Result<ResolvedService, Unresolved> {
    let core = reference.group.is_none_or(str::is_empty);
    if !core || reference.kind.is_some_and(|k| k != "Service") {
        return Err(Unresolved::InvalidKind);
    }
    let namespace = reference.namespace.unwrap_or(route_namespace);
    if namespace != route_namespace && !granted(kind, route_namespace, reference.name, grants) {
        return Err(Unresolved::RefNotPermitted);
    }
    let not_found = |why: String| Err(Unresolved::BackendNotFound(why));
    if !is_dns1123_subdomain(reference.name) {
        return not_found("the name is not a Service's (a DNS-1123 subdomain)".into());
    }
    let Some(port) = reference.port.and_then(|p| u16::try_from(p).ok()).filter(|&p| p > 0) else {
        return not_found("a Service reference needs a port".into());
    };
    let Some(found) = service(namespace, reference.name) else {
        return not_found(format!("no Service {namespace}/{}", reference.name));
    };
    let spec = found.spec.as_ref();
    if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
        return not_found("an ExternalName Service may point outside the cluster; balancer does not send to it".into());
    }
    // The port of the route's protocol (a Service may have one number for two: DNS's 53).
    let protocol = kind.protocol().as_str();
    let mut ports = spec.and_then(|s| s.ports.as_ref()).into_iter().flatten();
    let same = |p: &&ServicePort| p.port == i32::from(port) && p.protocol.as_deref().unwrap_or("TCP") == protocol;
    let Some(service_port) = ports.find(same) else {
        return not_found(format!("Service {namespace}/{} has no {protocol} port {port}", reference.name));
    };
    let port_name = service_port.name.clone().unwrap_or_default();
    let cluster_ip = spec.and_then(|s| s.cluster_ip.as_deref()).and_then(|ip| ip.parse().ok());
    if cluster_ip.is_none() {
        return not_found(format!(
            "Service {namespace}/{} has no cluster IP (a headless Service): balancer sends to a Service's cluster IP",
            reference.name
        ));
    }
    Ok(ResolvedService {
        namespace: namespace.to_string(),
        name: reference.name.to_string(),
        port,
        port_name,
        cluster_ip,
    })
}

/// Whether a ReferenceGrant (of the Service's namespace) lets `kind` routes of `from_namespace`
/// refer to Service `name`.
fn granted(kind: RouteKind, from_namespace: &str, name: &str, grants: &[ReferenceGrant]) -> bool {
    grants.iter().any(|grant| {
        let from =
            grant.spec.from.iter().any(|f| f.group == GROUP && f.kind == kind.kind() && f.namespace == from_namespace);
        let to = grant
            .spec
            .to
            .iter()
            .any(|t| t.group.is_empty() && t.kind == "Service" && t.name.as_deref().is_none_or(|n| n == name));
        from && to
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn service(namespace: &str, name: &str, kind: &str, ports: &[i32]) -> Service {
        let ports: Vec<serde_json::Value> = ports.iter().map(|p| json!({"port": p})).collect();
        let value = json!({"metadata": {"namespace": namespace, "name": name},
                           "spec": {"type": kind, "ports": ports, "clusterIP": "10.96.0.10"}});
        serde_json::from_value(value).expect("a Service")
    }

    fn grant(from_kind: &str, from_namespace: &str, to_name: Option<&str>) -> ReferenceGrant {
        let value = json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant",
            "metadata": {"namespace": "backends", "name": "grant"},
            "spec": {"from": [{"group": GROUP, "kind": from_kind, "namespace": from_namespace}],
                     "to": [{"group": "", "kind": "Service", "name": to_name}]},
        });
        serde_json::from_value(value).expect("a ReferenceGrant")
    }

    #[test]
    fn a_reference_resolves_to_a_services_port_or_says_why_not() {
        let services = [
            service("apps", "pg", "ClusterIP", &[5432]),
            service("backends", "pg", "ClusterIP", &[5432]),
            service("apps", "outside", "ExternalName", &[5432]),
        ];
        let find = |ns: &str, name: &str| {
            services
                .iter()
                .find(|s| s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name))
        };
        let refer = |namespace: Option<&'static str>, name: &'static str, port: Option<i32>| BackendRef {
            name,
            namespace,
            port,
            ..BackendRef::default()
        };
        let resolve_in = |reference: BackendRef<'_>, grants: &[ReferenceGrant]| {
            resolve(RouteKind::Tcp, "apps", &reference, find, grants).map_err(|e| e.reason())
        };
        let cluster_ip = Some("10.96.0.10".parse().expect("an address"));
        let pg = ResolvedService {
            namespace: "apps".into(),
            name: "pg".into(),
            port: 5432,
            port_name: String::new(),
            cluster_ip,
        };
        assert_eq!(resolve_in(refer(None, "pg", Some(5432)), &[]), Ok(pg));
        let kinds = [(Some("example.com"), None), (Some(""), Some("Pod")), (None, Some("ServiceImport"))];
        for (group, kind) in kinds {
            let reference = BackendRef { group, kind, ..refer(None, "pg", Some(5432)) };
            assert_eq!(resolve_in(reference, &[]), Err("InvalidKind"), "{group:?} {kind:?}");
        }
        for missing in [
            refer(None, "gone", Some(5432)),
            refer(None, "pg", Some(5433)),
            refer(None, "pg", None),
            refer(None, "outside", Some(5432)),
            refer(None, "pg\n    server 10.0.0.1:1;", Some(5432)),
        ] {
            assert_eq!(resolve_in(missing, &[]), Err("BackendNotFound"), "{missing:?}");
        }
        let elsewhere = refer(Some("backends"), "pg", Some(5432));
        assert_eq!(resolve_in(elsewhere, &[]), Err("RefNotPermitted"));
        assert_eq!(resolve_in(elsewhere, &[grant("UDPRoute", "apps", None)]), Err("RefNotPermitted"), "another kind");
        assert_eq!(
            resolve_in(elsewhere, &[grant("TCPRoute", "web", None)]),
            Err("RefNotPermitted"),
            "another namespace"
        );
        assert_eq!(
            resolve_in(elsewhere, &[grant("TCPRoute", "apps", Some("mysql"))]),
            Err("RefNotPermitted"),
            "another name"
        );
        for allowing in [grant("TCPRoute", "apps", None), grant("TCPRoute", "apps", Some("pg"))] {
            assert_eq!(resolve_in(elsewhere, &[allowing]).map(|s| s.namespace), Ok("backends".to_string()));
        }
        assert_eq!(BackendRef { weight: Some(0), ..elsewhere }.weight(), 0);
        assert_eq!(elsewhere.weight(), 1);
    }

    #[test]
    fn a_port_number_two_protocols_share_resolves_to_the_routes_protocol() {
        let dns: Service = serde_json::from_value(json!({
            "metadata": {"namespace": "kube-system", "name": "kube-dns"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            ]}
        }))
        .expect("a Service");
        let reference = BackendRef { name: "kube-dns", port: Some(53), ..BackendRef::default() };
        let port_name =
            |kind| resolve(kind, "kube-system", &reference, |_: &str, _: &str| Some(&dns), &[]).map(|s| s.port_name);
        assert_eq!(port_name(RouteKind::Udp), Ok("dns".to_string()));
        assert_eq!(port_name(RouteKind::Tcp), Ok("dns-tcp".to_string()));
        assert_eq!(port_name(RouteKind::Tls), Ok("dns-tcp".to_string()));
        let udp_only = BackendRef { name: "kube-dns", port: Some(5353), ..BackendRef::default() };
        let mut dns = dns.clone();
        dns.spec.as_mut().and_then(|s| s.ports.as_mut()).expect("ports")[0].port = 5353;
        let found = resolve(RouteKind::Tcp, "kube-system", &udp_only, |_: &str, _: &str| Some(&dns), &[]);
        assert_eq!(found.map_err(|e| e.reason()), Err("BackendNotFound"), "a TCPRoute to a UDP-only port");
    }
}

//! Which listeners of a Gateway a route attaches to through one of its `parentRefs`, or why it
//! attaches to none: the rules of Gateway API's `ParentReference` and `AllowedRoutes`, as pure
//! functions of the objects.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::core::{Selector, SelectorExt as _};

use super::api::gateways::{
    GatewayListeners, GatewayListenersAllowedRoutesNamespacesFrom as From,
    GatewayListenersAllowedRoutesNamespacesSelector as NamespaceSelector, GatewayListenersTlsMode,
};
use super::hostnames;
use crate::api::Protocol;

/// Gateway API's group, the default of a `parentRef`'s and an allowed kind's.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// The routes balancer serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    /// `TCPRoute`, on TCP listeners.
    Tcp,
    /// `UDPRoute`, on UDP listeners.
    Udp,
    /// `TLSRoute`, on TLS listeners in mode Passthrough.
    Tls,
}

impl RouteKind {
    /// The kind's name.
    pub fn kind(self) -> &'static str {
        match self {
            RouteKind::Tcp => "TCPRoute",
            RouteKind::Udp => "UDPRoute",
            RouteKind::Tls => "TLSRoute",
        }
    }

    /// The kind named `kind` (`TCPRoute`, …).
    pub fn named(kind: &str) -> Option<RouteKind> {
        [RouteKind::Tcp, RouteKind::Udp, RouteKind::Tls].into_iter().find(|k| k.kind() == kind)
    }

    /// The protocol its connections take to a backend: a TLSRoute's pass through as TCP.
    pub fn protocol(self) -> Protocol {
        match self {
            RouteKind::Udp => Protocol::Udp,
            RouteKind::Tcp | RouteKind::Tls => Protocol::Tcp,
        }
    }
}

/// A listener's protocol as balancer serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerProtocol {
    /// `TCP`.
    Tcp,
    /// `UDP`.
    Udp,
    /// `TLS` with mode Passthrough (the default): routed by SNI, forwarded unread.
    TlsPassthrough,
    /// Anything else: HTTP, HTTPS, TLS that terminates, or a protocol balancer does not know.
    Unsupported,
}

impl ListenerProtocol {
    /// The protocol of `listener`.
    pub fn of(listener: &GatewayListeners) -> ListenerProtocol {
        let terminates =
            listener.tls.as_ref().and_then(|tls| tls.mode.as_ref()) == Some(&GatewayListenersTlsMode::Terminate);
        match listener.protocol.as_str() {
            "TCP" => ListenerProtocol::Tcp,
            "UDP" => ListenerProtocol::Udp,
            "TLS" if !terminates => ListenerProtocol::TlsPassthrough,
            _ => ListenerProtocol::Unsupported,
        }
    }

    /// The one route kind a listener of this protocol takes, if balancer serves it.
    pub fn route_kind(self) -> Option<RouteKind> {
        match self {
            ListenerProtocol::Tcp => Some(RouteKind::Tcp),
            ListenerProtocol::Udp => Some(RouteKind::Udp),
            ListenerProtocol::TlsPassthrough => Some(RouteKind::Tls),
            ListenerProtocol::Unsupported => None,
        }
    }
}

/// The kinds a listener admits: those of `allowedRoutes.kinds` that balancer serves on its
/// protocol, or that protocol's kind when the field is unset; and whether some kind it lists
/// is one balancer cannot serve there (the listener's `ResolvedRefs` is then `InvalidRouteKinds`).
pub fn allowed_kinds(listener: &GatewayListeners) -> (Vec<RouteKind>, bool) {
    let Some(served) = ListenerProtocol::of(listener).route_kind() else { return (Vec::new(), false) };
    let Some(kinds) = listener.allowed_routes.as_ref().and_then(|a| a.kinds.as_ref()) else {
        return (vec![served], false);
    };
    let is_served = |group: Option<&str>, kind: &str| group.unwrap_or(GROUP) == GROUP && kind == served.kind();
    let allowed = kinds.iter().any(|k| is_served(k.group.as_deref(), &k.kind));
    let invalid = kinds.iter().any(|k| !is_served(k.group.as_deref(), &k.kind));
    (if allowed { vec![served] } else { Vec::new() }, invalid)
}

/// What a route's `parentRef` asks of a Gateway it names: a listener by name, by port, or both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParentRef<'a> {
    /// `sectionName`: the listener's name.
    pub section_name: Option<&'a str>,
    /// `port`: the listener's port.
    pub port: Option<i32>,
}

/// A route as attachment sees it.
#[derive(Debug, Clone, Copy)]
pub struct Route<'a> {
    /// Its kind.
    pub kind: RouteKind,
    /// Its namespace.
    pub namespace: &'a str,
    /// The labels of its namespace, for `allowedRoutes.namespaces.from: Selector`.
    pub namespace_labels: &'a BTreeMap<String, String>,
    /// `spec.hostnames` (TLSRoute), empty for the others.
    pub hostnames: &'a [String],
}

/// Why a `parentRef` attaches to no listener: its `Accepted` condition's reason, False.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAccepted {
    /// No listener has the name or port the reference asks for.
    NoMatchingParent,
    /// Listeners match, but none admits the route's kind or namespace.
    NotAllowedByListeners,
    /// TLS listeners admit it, but no hostname of the route is one of theirs.
    NoMatchingListenerHostname,
    /// It attaches, but the Gateway's proxy configuration would not fit with it: the older
    /// routes are served, the newer refused (an implementation's own reason).
    GatewayFull,
}

impl NotAccepted {
    /// The condition's reason.
    pub fn reason(self) -> &'static str {
        match self {
            NotAccepted::NoMatchingParent => "NoMatchingParent",
            NotAccepted::NotAllowedByListeners => "NotAllowedByListeners",
            NotAccepted::NoMatchingListenerHostname => "NoMatchingListenerHostname",
            NotAccepted::GatewayFull => "GatewayFull",
        }
    }
}

/// The indexes of the listeners of a Gateway in `gateway_namespace` that `route` attaches to
/// through `parent`, in listener order; or why it attaches to none. A reference without a name
/// or port asks for every listener.
pub fn attach(
    gateway_namespace: &str,
    listeners: &[GatewayListeners],
    route: &Route<'_>,
    parent: ParentRef<'_>,
) -> Result<Vec<usize>, NotAccepted> {
    let asked = |l: &GatewayListeners| {
        parent.section_name.is_none_or(|name| name == l.name) && parent.port.is_none_or(|port| port == l.port)
    };
    let matching: Vec<usize> = (0..listeners.len()).filter(|&i| asked(&listeners[i])).collect();
    if matching.is_empty() {
        return Err(NotAccepted::NoMatchingParent);
    }
    let admits = |l: &GatewayListeners| {
        allowed_kinds(l).0.contains(&route.kind) && admits_namespace(l, gateway_namespace, route)
    };
    let allowed: Vec<usize> = matching.into_iter().filter(|&i| admits(&listeners[i])).collect();
    if allowed.is_empty() {
        return Err(NotAccepted::NotAllowedByListeners);
    }
    let named: Vec<usize> = allowed.into_iter().filter(|&i| hostnames_meet(&listeners[i], route.hostnames)).collect();
    if named.is_empty() {
        return Err(NotAccepted::NoMatchingListenerHostname);
    }
    Ok(named)
}

/// `allowedRoutes.namespaces`: the Gateway's own namespace by default, every one, or those
/// whose labels the selector matches (a selector that does not parse matches none).
fn admits_namespace(listener: &GatewayListeners, gateway_namespace: &str, route: &Route<'_>) -> bool {
    let namespaces = listener.allowed_routes.as_ref().and_then(|a| a.namespaces.as_ref());
    match namespaces.and_then(|n| n.from.as_ref()) {
        Some(From::All) => true,
        Some(From::Selector) => namespaces
            .and_then(|n| n.selector.as_ref())
            .and_then(selector)
            .is_some_and(|s| s.matches(route.namespace_labels)),
        Some(From::Same) | None => route.namespace == gateway_namespace,
    }
}

fn selector(from: &NamespaceSelector) -> Option<Selector> {
    let requirement = |e: &super::api::gateways::GatewayListenersAllowedRoutesNamespacesSelectorMatchExpressions| {
        LabelSelectorRequirement { key: e.key.clone(), operator: e.operator.clone(), values: e.values.clone() }
    };
    let selector = LabelSelector {
        match_labels: from.match_labels.clone(),
        match_expressions: from.match_expressions.as_ref().map(|all| all.iter().map(requirement).collect()),
    };
    Selector::try_from(selector).ok()
}

/// A listener without a hostname, or a route without any, meets every name; else some name
/// must be covered by both.
fn hostnames_meet(listener: &GatewayListeners, route_hostnames: &[String]) -> bool {
    match &listener.hostname {
        None => true,
        Some(_) if route_hostnames.is_empty() => true,
        Some(own) => route_hostnames.iter().any(|h| hostnames::intersect(own, h)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn listeners(value: serde_json::Value) -> Vec<GatewayListeners> {
        serde_json::from_value(value).expect("listeners")
    }

    /// The listeners of the suite's Gateways, in one: TCP and UDP on one port, by name, a TLS
    /// passthrough one for a wildcard, one that terminates TLS, and HTTP.
    fn gateway() -> Vec<GatewayListeners> {
        listeners(json!([
            {"name": "tcp", "port": 5432, "protocol": "TCP"},
            {"name": "udp", "port": 5432, "protocol": "UDP"},
            {"name": "tls", "port": 443, "protocol": "TLS", "hostname": "*.example.com", "tls": {"mode": "Passthrough"}},
            {"name": "terminate", "port": 8443, "protocol": "TLS", "tls": {"mode": "Terminate"}},
            {"name": "http", "port": 80, "protocol": "HTTP"},
        ]))
    }

    fn route<'a>(kind: RouteKind, namespace: &'a str, hostnames: &'a [String]) -> Route<'a> {
        static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
        Route { kind, namespace, namespace_labels: &NO_LABELS, hostnames }
    }

    fn by_name(name: &str) -> ParentRef<'_> {
        ParentRef { section_name: Some(name), port: None }
    }

    #[test]
    fn a_reference_takes_the_listeners_it_names_that_serve_its_kind() {
        let (gateway, tcp, udp) = (gateway(), route(RouteKind::Tcp, "apps", &[]), route(RouteKind::Udp, "apps", &[]));
        assert_eq!(attach("apps", &gateway, &tcp, by_name("tcp")), Ok(vec![0]));
        let by_port = ParentRef { section_name: None, port: Some(5432) };
        assert_eq!(attach("apps", &gateway, &tcp, by_port), Ok(vec![0]), "the UDP listener on the port is not for it");
        assert_eq!(attach("apps", &gateway, &udp, by_port), Ok(vec![1]));
        assert_eq!(attach("apps", &gateway, &udp, ParentRef::default()), Ok(vec![1]), "all listeners");
        let both = ParentRef { section_name: Some("tcp"), port: Some(5432) };
        assert_eq!(attach("apps", &gateway, &tcp, both), Ok(vec![0]));
        for wrong in [by_name("pg"), ParentRef { section_name: Some("tcp"), port: Some(5433) }] {
            assert_eq!(attach("apps", &gateway, &tcp, wrong), Err(NotAccepted::NoMatchingParent), "{wrong:?}");
        }
        for listener in ["http", "udp", "tls", "terminate"] {
            let refused = attach("apps", &gateway, &tcp, by_name(listener));
            assert_eq!(refused, Err(NotAccepted::NotAllowedByListeners), "{listener}");
        }
        let refused = attach("apps", &gateway, &udp, by_name("tls"));
        assert_eq!(refused, Err(NotAccepted::NotAllowedByListeners), "the suite's UDPRoute not-allowed-by-listeners");
    }

    #[test]
    fn a_tls_route_needs_a_name_its_listener_covers() {
        let gateway = gateway();
        let names = |n: &[&str]| n.iter().map(|h| h.to_string()).collect::<Vec<_>>();
        for (hostnames, attached) in [
            (names(&[]), Ok(vec![2])),
            (names(&["db.example.com"]), Ok(vec![2])),
            (names(&["example.com", "*.db.example.com"]), Ok(vec![2])),
            (names(&["db.example.org"]), Err(NotAccepted::NoMatchingListenerHostname)),
            (names(&["example.com"]), Err(NotAccepted::NoMatchingListenerHostname)),
        ] {
            let tls = route(RouteKind::Tls, "apps", &hostnames);
            assert_eq!(attach("apps", &gateway, &tls, by_name("tls")), attached, "{hostnames:?}");
        }
    }

    #[test]
    fn a_listener_admits_its_own_namespace_all_or_those_selected() {
        let gateway = listeners(json!([
            {"name": "same", "port": 1, "protocol": "TCP"},
            {"name": "all", "port": 2, "protocol": "TCP", "allowedRoutes": {"namespaces": {"from": "All"}}},
            {"name": "selected", "port": 3, "protocol": "TCP", "allowedRoutes": {"namespaces": {"from": "Selector",
                "selector": {"matchLabels": {"team": "db"}, "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]}]}}}},
            {"name": "broken", "port": 4, "protocol": "TCP", "allowedRoutes": {"namespaces": {"from": "Selector",
                "selector": {"matchExpressions": [{"key": "env", "operator": "Sideways", "values": ["dev"]}]}}}},
        ]));
        let db: BTreeMap<String, String> = [("team".to_string(), "db".to_string())].into();
        let db_dev: BTreeMap<String, String> =
            [("team", "db"), ("env", "dev")].map(|(k, v)| (k.into(), v.into())).into();
        let allowed = |namespace: &str, labels: &BTreeMap<String, String>| -> Vec<&str> {
            let route = Route { kind: RouteKind::Tcp, namespace, namespace_labels: labels, hostnames: &[] };
            let attached = attach("gw", &gateway, &route, ParentRef::default()).unwrap_or_default();
            attached.into_iter().map(|i| gateway[i].name.as_str()).collect()
        };
        assert_eq!(allowed("gw", &BTreeMap::new()), ["same", "all"]);
        assert_eq!(allowed("apps", &db), ["all", "selected"]);
        assert_eq!(allowed("apps", &db_dev), ["all"]);
        let nothing = Route { kind: RouteKind::Tcp, namespace: "apps", namespace_labels: &db_dev, hostnames: &[] };
        assert_eq!(attach("gw", &gateway, &nothing, by_name("same")), Err(NotAccepted::NotAllowedByListeners));
    }

    #[test]
    fn listed_kinds_narrow_a_listener_and_one_it_cannot_serve_is_flagged() {
        let gateway = listeners(json!([
            {"name": "tcp", "port": 1, "protocol": "TCP"},
            {"name": "listed", "port": 2, "protocol": "TCP", "allowedRoutes": {"kinds": [{"kind": "TCPRoute"}]}},
            {"name": "mixed", "port": 3, "protocol": "TCP", "allowedRoutes": {"kinds": [{"kind": "TCPRoute"}, {"kind": "HTTPRoute"}]}},
            {"name": "wrong", "port": 4, "protocol": "TCP", "allowedRoutes": {"kinds": [{"group": "example.com", "kind": "TCPRoute"}]}},
            {"name": "http", "port": 80, "protocol": "HTTP"},
        ]));
        let kinds: Vec<(Vec<RouteKind>, bool)> = gateway.iter().map(allowed_kinds).collect();
        let tcp = vec![RouteKind::Tcp];
        assert_eq!(kinds, [(tcp.clone(), false), (tcp.clone(), false), (tcp, true), (vec![], true), (vec![], false)]);
    }
}

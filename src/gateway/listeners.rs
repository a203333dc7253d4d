//! A Gateway's listeners, with the routes attached to each, as the proxy model's listeners: the
//! same engine a Balancer's ports run on. Pure: the routes come with their backends resolved
//! (a backend that does not resolve, or has no ready endpoint, is [`Targets::Refused`]).
//!
//! [`Targets::Refused`]: crate::proxy::model::Targets::Refused

use std::cmp::Ordering;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::api::gateways::GatewayListeners;
use super::attachment::ListenerProtocol;
use super::hostnames;
use super::verdicts::verdicts;
use crate::api::Protocol;
use crate::proxy::model::{Listener, Method, Server, SniRoute, WeightedBackend, upstream_servers};

/// A route attached to a listener, its backends resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct AttachedRoute {
    /// When it was created: the oldest route wins where routes compete.
    pub created: Option<Time>,
    /// Its namespace, then its name: the tie-break after age.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `spec.hostnames`, for a TLSRoute; empty for the others.
    pub hostnames: Vec<String>,
    /// Every backend of its rules.
    pub backends: Vec<WeightedBackend>,
}

/// Gateway API's precedence between routes: the oldest first, then by namespace and name. A
/// route without a creation time (not yet stored) comes last.
pub fn precedence(a: &AttachedRoute, b: &AttachedRoute) -> Ordering {
    let created = |r: &AttachedRoute| (r.created.is_none(), r.created.as_ref().map(|t| t.0));
    created(a).cmp(&created(b)).then_with(|| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)))
}

/// The proxy model's listeners for a Gateway's `listeners`, `routes[i]` attached to
/// `listeners[i]`: one per port and protocol, for the listeners balancer serves
/// ([`verdicts`]). On a TCP or UDP listener the oldest route takes every connection (the others
/// stay attached, and serve once it goes); TLS listeners on one port share it, each route
/// routed by the names it and its listener both cover.
pub fn proxy_listeners(listeners: &[GatewayListeners], routes: &[Vec<AttachedRoute>]) -> Vec<Listener> {
    let verdicts = verdicts(listeners);
    // Each listener built, and whether it is TLS (routed by name, if any route names one).
    let mut built: Vec<(bool, Listener)> = Vec::new();
    for (i, listener) in listeners.iter().enumerate().filter(|&(i, _)| verdicts[i].served()) {
        let Ok(port) = u16::try_from(listener.port) else { continue };
        let mut routes = routes.get(i).cloned().unwrap_or_default();
        routes.sort_by(precedence);
        let own_hostname = listener.hostname.as_deref();
        let shared_tls = built.iter_mut().find(|(tls, l)| *tls && l.port == port).map(|(_, l)| l);
        match (ListenerProtocol::of(listener), shared_tls) {
            (ListenerProtocol::TlsPassthrough, Some(shared)) => add_tls_routes(shared, own_hostname, &routes),
            (ListenerProtocol::TlsPassthrough, None) => {
                let mut tls = Listener::tls_passthrough(port, Vec::new());
                add_tls_routes(&mut tls, own_hostname, &routes);
                built.push((true, tls));
            }
            // The verdicts leave a TCP or UDP listener its port and protocol to itself.
            (protocol, _) => {
                let protocol = if protocol == ListenerProtocol::Udp { Protocol::Udp } else { Protocol::Tcp };
                let servers = routes.first().map(|oldest| servers(&oldest.backends)).unwrap_or_default();
                built.push((false, Listener::of_route(port, protocol, servers)));
            }
        }
    }
    built.into_iter().map(|(_, listener)| listener).collect()
}

fn servers(backends: &[WeightedBackend]) -> Vec<Server> {
    upstream_servers(Method::RoundRobin, backends)
}

/// Each route as an SNI route for the names it and the listener (`own`) both cover; a route
/// that names none, on a listener that names none, takes the connections no route names (the
/// oldest such route).
fn add_tls_routes(tls: &mut Listener, own: Option<&str>, routes: &[AttachedRoute]) {
    for route in routes {
        let names: Vec<String> = match (own, route.hostnames.is_empty()) {
            (None, true) => {
                if tls.servers.is_empty() {
                    tls.servers = servers(&route.backends);
                }
                continue;
            }
            (Some(own), true) => vec![own.to_string()],
            (None, false) => route.hostnames.clone(),
            (Some(own), false) => {
                route.hostnames.iter().filter_map(|h| hostnames::narrower(own, h)).map(str::to_string).collect()
            }
        };
        if let Some(sni) = SniRoute::new(names, Method::RoundRobin, &route.backends) {
            tls.sni_routes.push(sni);
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    use super::*;
    use crate::proxy::model::{Destination, Targets};

    fn listener(value: serde_json::Value) -> GatewayListeners {
        serde_json::from_value(value).expect("a listener")
    }

    /// A route created `second` seconds after the epoch, to one Service named `backend`.
    fn route(name: &str, second: i64, hostnames: &[&str], backend: &str) -> AttachedRoute {
        let address = Destination::Name { host: format!("{backend}.apps.svc"), port: 5432 };
        let backends = vec![WeightedBackend {
            name: backend.to_string(),
            weight: 1,
            backup: false,
            max_fails: None,
            fail_timeout: None,
            max_connections: None,
            targets: Targets::Service(address),
        }];
        AttachedRoute {
            created: Some(Time(Timestamp::from_second(second).expect("a time"))),
            namespace: "apps".into(),
            name: name.into(),
            hostnames: hostnames.iter().map(|h| h.to_string()).collect(),
            backends,
        }
    }

    fn backends(servers: &[Server]) -> Vec<&str> {
        servers.iter().map(|s| s.backend.as_str()).collect()
    }

    #[test]
    fn the_oldest_route_takes_a_tcp_or_udp_listener() {
        let tcp = listener(json!({"name": "pg", "port": 5432, "protocol": "TCP"}));
        let udp = listener(json!({"name": "dns", "port": 5432, "protocol": "UDP"}));
        let idle = listener(json!({"name": "idle", "port": 6000, "protocol": "TCP"}));
        let routes =
            vec![route("newer", 20, &[], "v2"), route("older", 10, &[], "v1"), route("a-older", 10, &[], "v0")];
        let built = proxy_listeners(&[tcp, udp, idle], &[routes.clone(), routes[..2].to_vec(), vec![]]);
        let summary: Vec<(u16, Protocol, Vec<&str>, bool)> =
            built.iter().map(|l| (l.port, l.protocol, backends(&l.servers), l.single_attempt)).collect();
        assert_eq!(
            summary,
            [
                (5432, Protocol::Tcp, vec!["v0"], true),
                (5432, Protocol::Udp, vec!["v1"], true),
                (6000, Protocol::Tcp, vec![], true),
            ],
            "by age, then by name; a listener without a route refuses"
        );
    }

    #[test]
    fn tls_listeners_on_one_port_share_it_by_server_name() {
        let wildcard = listener(json!({"name": "any", "port": 443, "protocol": "TLS", "hostname": "*.example.com"}));
        let exact = listener(json!({"name": "one", "port": 443, "protocol": "TLS", "hostname": "db.other.com"}));
        let open = listener(json!({"name": "open", "port": 8443, "protocol": "TLS", "tls": {"mode": "Passthrough"}}));
        let routes = [
            vec![route("web", 2, &["web.example.com", "web.example.org"], "web"), route("all", 1, &[], "all")],
            vec![route("db", 3, &[], "db")],
            vec![route("named", 4, &["x.example.com"], "x"), route("rest", 5, &[], "rest")],
        ];
        let built = proxy_listeners(&[wildcard, exact, open], &routes);
        assert_eq!(built.len(), 2, "{built:?}");
        let names: Vec<(Vec<&str>, Vec<&str>)> = built[0]
            .sni_routes
            .iter()
            .map(|r| (r.hostnames.iter().map(String::as_str).collect(), backends(&r.servers)))
            .collect();
        assert_eq!(
            names,
            [
                (vec!["*.example.com"], vec!["all"]),
                (vec!["web.example.com"], vec!["web"]),
                (vec!["db.other.com"], vec!["db"])
            ],
            "oldest first; each narrowed to its listener's names"
        );
        assert!(built[0].servers.is_empty(), "a name no route covers is refused");
        assert_eq!(backends(&built[1].servers), ["rest"], "a route without names on a listener without one");
        assert_eq!(built[1].sni_routes[0].hostnames, ["x.example.com"]);
    }

    #[test]
    fn conflicting_listeners_and_http_are_not_served() {
        let tls = listener(json!({"name": "tls", "port": 443, "protocol": "TLS"}));
        let tcp = listener(json!({"name": "tcp", "port": 443, "protocol": "TCP"}));
        let http = listener(json!({"name": "http", "port": 80, "protocol": "HTTP"}));
        let terminate = listener(json!({"name": "t", "port": 9443, "protocol": "TLS", "tls": {"mode": "Terminate"}}));
        let udp = listener(json!({"name": "dns", "port": 443, "protocol": "UDP"}));
        let routes = vec![route("r", 1, &[], "v1")];
        let built = proxy_listeners(&[tls, tcp, http, terminate, udp], &vec![routes; 5]);
        let summary: Vec<(u16, Protocol, Vec<&str>)> =
            built.iter().map(|l| (l.port, l.protocol, backends(&l.servers))).collect();
        assert_eq!(summary, [(443, Protocol::Udp, vec!["v1"])]);
    }
}

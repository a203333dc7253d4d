//! A Gateway's listeners, with the routes attached to each, as the proxy model's listeners: the
//! same engine a Balancer's ports run on. Pure: the routes come with their backends resolved
//! (a backend that does not resolve, or has no ready endpoint, is [`Targets::Refused`]).
//!
//! [`Targets::Refused`]: crate::proxy::model::Targets::Refused

use std::cmp::Ordering;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

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
    let a_key = precedence_key(a.created.as_ref(), &a.namespace, &a.name);
    a_key.cmp(&precedence_key(b.created.as_ref(), &b.namespace, &b.name))
}

/// [`precedence`] as a sort key, for a route created at `created` (`None`: not yet stored).
pub fn precedence_key<'a>(
    created: Option<&Time>,
    namespace: &'a str,
    name: &'a str,
) -> (bool, Option<Timestamp>, &'a str, &'a str) {
    (created.is_none(), created.map(|t| t.0), namespace, name)
}

/// A route's hostname that it does not serve through a listener because a more specific
/// listener on the same port takes that name: Gateway API picks the listener first (an exact
/// hostname, then the longest wildcard, then none), and only then its routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shadowed {
    /// The index of the listener the route attached to, in the Gateway's `listeners`.
    pub listener: usize,
    /// The route's namespace.
    pub namespace: String,
    /// The route's name.
    pub name: String,
    /// The name the more specific listener takes.
    pub hostname: String,
}

/// The proxy model's listeners for a Gateway, and the names routes lose to a more specific
/// listener ([`Shadowed`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyListeners {
    /// The proxy model's listeners.
    pub listeners: Vec<Listener>,
    /// The routes' names another listener takes, in listener and route order.
    pub shadowed: Vec<Shadowed>,
}

/// The proxy model's listeners for a Gateway's `listeners`, `routes[i]` attached to
/// `listeners[i]`: one per port and protocol, for the listeners balancer serves
/// ([`verdicts`]). On a TCP or UDP listener the oldest route takes every connection (the others
/// stay attached, and serve once it goes); TLS listeners on one port share it, as
/// [`tls_listener`] says.
pub fn proxy_listeners(listeners: &[GatewayListeners], routes: &[Vec<AttachedRoute>]) -> ProxyListeners {
    let verdicts = verdicts(listeners);
    let port = |listener: &GatewayListeners| u16::try_from(listener.port).ok();
    let served: Vec<usize> =
        (0..listeners.len()).filter(|&i| verdicts[i].served() && port(&listeners[i]).is_some()).collect();
    let sorted_routes = |i: usize| {
        let mut routes = routes.get(i).cloned().unwrap_or_default();
        routes.sort_by(precedence);
        routes
    };
    let mut built = ProxyListeners { listeners: Vec::new(), shadowed: Vec::new() };
    let mut tls_ports = Vec::new();
    for &i in &served {
        let Some(listener_port) = port(&listeners[i]) else { continue };
        match ListenerProtocol::of(&listeners[i]) {
            ListenerProtocol::TlsPassthrough if tls_ports.contains(&listener_port) => {}
            ListenerProtocol::TlsPassthrough => {
                tls_ports.push(listener_port);
                let group: Vec<TlsListener> = served
                    .iter()
                    .filter(|&&j| {
                        ListenerProtocol::of(&listeners[j]) == ListenerProtocol::TlsPassthrough
                            && port(&listeners[j]) == Some(listener_port)
                    })
                    .map(|&j| TlsListener {
                        index: j,
                        hostname: listeners[j].hostname.as_deref(),
                        routes: sorted_routes(j),
                    })
                    .collect();
                let tls = tls_listener(listener_port, &group, &mut built.shadowed);
                built.listeners.push(tls);
            }
            // The verdicts leave a TCP or UDP listener its port and protocol to itself.
            protocol => {
                let protocol = if protocol == ListenerProtocol::Udp { Protocol::Udp } else { Protocol::Tcp };
                let routes = sorted_routes(i);
                let servers = routes.first().map(|oldest| servers(&oldest.backends)).unwrap_or_default();
                built.listeners.push(Listener::of_route(listener_port, protocol, servers));
            }
        }
    }
    built
}

fn servers(backends: &[WeightedBackend]) -> Vec<Server> {
    upstream_servers(Method::RoundRobin, backends)
}

/// One TLS passthrough listener of a port, with its routes in precedence order.
struct TlsListener<'a> {
    /// Its index in the Gateway's `listeners`.
    index: usize,
    /// Its `hostname`.
    hostname: Option<&'a str>,
    /// Its routes, oldest first.
    routes: Vec<AttachedRoute>,
}

/// The TLS listeners of one port as one proxy listener routed by SNI. Each route is routed by
/// the names it and its listener both cover, less those a more specific listener of the port
/// takes ([`Shadowed`]); a route that names none, on a listener that names none, takes the
/// connections no route names (the oldest such route). With more than one listener, each
/// listener's own hostname is kept for it: a name under it that none of its routes serves is
/// refused, not sent to a broader listener's route.
fn tls_listener(port: u16, group: &[TlsListener<'_>], shadowed: &mut Vec<Shadowed>) -> Listener {
    let hostnames: Vec<Option<&str>> = group.iter().map(|l| l.hostname).collect();
    let mut tls = Listener::tls_passthrough(port, Vec::new());
    for (position, listener) in group.iter().enumerate() {
        for route in &listener.routes {
            let Some(names) = route_names(listener.hostname, route) else {
                if tls.servers.is_empty() {
                    tls.servers = servers(&route.backends);
                }
                continue;
            };
            let winner = |name: &String| most_specific(&hostnames, name);
            let (kept, lost): (Vec<String>, Vec<String>) =
                names.into_iter().partition(|name| winner(name) == Some(position));
            // A name the route also serves through the listener that wins it is not lost.
            let served_by_winner = |name: &String| {
                winner(name).and_then(|w| group.get(w)).is_some_and(|w| {
                    w.routes.iter().any(|r| (&r.namespace, &r.name) == (&route.namespace, &route.name))
                })
            };
            shadowed.extend(lost.into_iter().filter(|name| !served_by_winner(name)).map(|hostname| Shadowed {
                listener: listener.index,
                namespace: route.namespace.clone(),
                name: route.name.clone(),
                hostname,
            }));
            if let Some(sni) = SniRoute::new(kept, Method::RoundRobin, &route.backends) {
                tls.sni_routes.push(sni);
            }
        }
    }
    if group.len() > 1 {
        let served =
            |name: &str| tls.sni_routes.iter().any(|r| r.hostnames.iter().any(|h| h.eq_ignore_ascii_case(name)));
        let kept: Vec<String> = hostnames.iter().flatten().filter(|h| !served(h)).map(|h| h.to_string()).collect();
        if let Some(refused) = SniRoute::new(kept, Method::RoundRobin, &[]) {
            tls.sni_routes.push(refused);
        }
    }
    tls
}

/// The names a route is routed by on a listener whose hostname is `own`: those both cover;
/// `None` for a route that names none on a listener that names none (it takes what no name
/// routes).
fn route_names(own: Option<&str>, route: &AttachedRoute) -> Option<Vec<String>> {
    match (own, route.hostnames.is_empty()) {
        (None, true) => None,
        (Some(own), true) => Some(vec![own.to_string()]),
        (None, false) => Some(route.hostnames.clone()),
        (Some(own), false) => {
            Some(route.hostnames.iter().filter_map(|h| hostnames::narrower(own, h)).map(str::to_string).collect())
        }
    }
}

/// The position in `listeners` (their hostnames, one port's) of the listener Gateway API picks
/// for every name `name` covers: one whose hostname is `name`, else the longest wildcard that
/// covers all of `name`, else one without a hostname. `None` when no listener covers all of it.
pub fn most_specific(listeners: &[Option<&str>], name: &str) -> Option<usize> {
    let specificity = |own: Option<&str>| match own {
        None => Some(0),
        Some(own) if own.eq_ignore_ascii_case(name) => Some(usize::MAX),
        Some(own) => hostnames::narrower(own, name).filter(|n| n.eq_ignore_ascii_case(name)).map(|_| own.len()),
    };
    let mut best: Option<(usize, usize)> = None;
    for (position, own) in listeners.iter().enumerate() {
        if let Some(rank) = specificity(*own)
            && best.is_none_or(|(best_rank, _)| rank > best_rank)
        {
            best = Some((rank, position));
        }
    }
    best.map(|(_, position)| position)
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
        let built = proxy_listeners(&[tcp, udp, idle], &[routes.clone(), routes[..2].to_vec(), vec![]]).listeners;
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
        let built = proxy_listeners(&[wildcard, exact, open], &routes).listeners;
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

    /// Which route's backends nginx's `hostnames` map sends `sni` to: the first route that
    /// names it exactly, else the longest wildcard that covers it, else the listener's own.
    fn nginx_picks<'a>(listener: &'a Listener, sni: &str) -> Vec<&'a str> {
        let routes = &listener.sni_routes;
        let exact = routes.iter().find(|r| r.hostnames.iter().any(|h| h == sni));
        let wildcard = routes
            .iter()
            .flat_map(|r| r.hostnames.iter().map(move |h| (h, r)))
            .filter(|(h, _)| h.starts_with("*.") && hostnames::intersect(h, sni))
            .fold(None, |best: Option<(&String, _)>, (h, r)| match best {
                Some((b, _)) if b.len() >= h.len() => best,
                _ => Some((h, r)),
            })
            .map(|(_, r)| r);
        exact.or(wildcard).map(|r| backends(&r.servers)).unwrap_or_else(|| backends(&listener.servers))
    }

    /// Gateway API's listener precedence, in both listing orders: the most specific listener
    /// takes a name, and a broader listener's route that names it loses it (and says so).
    #[test]
    fn the_most_specific_listener_takes_a_name_in_either_order() {
        let open = || listener(json!({"name": "open", "port": 443, "protocol": "TLS", "hostname": "*.example.com"}));
        let pay = || listener(json!({"name": "pay", "port": 443, "protocol": "TLS", "hostname": "*.pay.example.com"}));
        let db = || listener(json!({"name": "db", "port": 443, "protocol": "TLS", "hostname": "db.example.com"}));
        // The tenant's route is the oldest, so it would win any tie between routes.
        let tenant = || route("tenant", 1, &["api.pay.example.com", "db.example.com", "web.example.com"], "tenant");
        let payments = || route("payments", 5, &["api.pay.example.com"], "payments");
        let database = || route("database", 6, &[], "database");
        for reversed in [false, true] {
            let mut listeners = vec![(open(), vec![tenant()]), (pay(), vec![payments()]), (db(), vec![database()])];
            if reversed {
                listeners.reverse();
            }
            let (gateway, routes): (Vec<_>, Vec<_>) = listeners.into_iter().unzip();
            let built = proxy_listeners(&gateway, &routes);
            let tls = &built.listeners[0];
            for (sni, expected) in [
                ("api.pay.example.com", vec!["payments"]),
                ("other.pay.example.com", vec![]),
                ("db.example.com", vec!["database"]),
                ("web.example.com", vec!["tenant"]),
                ("else.example.com", vec![]),
            ] {
                assert_eq!(nginx_picks(tls, sni), expected, "{sni}, reversed: {reversed}: {tls:?}");
            }
            let open_index = if reversed { 2 } else { 0 };
            let lost: Vec<(usize, &str, &str)> =
                built.shadowed.iter().map(|s| (s.listener, s.name.as_str(), s.hostname.as_str())).collect();
            assert_eq!(
                lost,
                [(open_index, "tenant", "api.pay.example.com"), (open_index, "tenant", "db.example.com")],
                "reversed: {reversed}"
            );
        }
    }

    /// A route attached to both the broader and the more specific listener (a parent
    /// reference without a `sectionName`) serves the name through the more specific one, and
    /// has lost nothing.
    #[test]
    fn a_route_on_both_listeners_serves_the_name_through_the_more_specific() {
        let open = listener(json!({"name": "open", "port": 443, "protocol": "TLS", "hostname": "*.example.com"}));
        let pay = listener(json!({"name": "pay", "port": 443, "protocol": "TLS", "hostname": "*.pay.example.com"}));
        let both = route("both", 1, &["api.pay.example.com"], "api");
        let built = proxy_listeners(&[open, pay], &[vec![both.clone()], vec![both]]);
        assert_eq!(nginx_picks(&built.listeners[0], "api.pay.example.com"), ["api"]);
        assert!(built.shadowed.is_empty(), "{:?}", built.shadowed);
    }

    /// A wildcard under a listener without a hostname: the listener for `*.pay.example.com`
    /// keeps its names, even from a broader wildcard route and from the catch-all.
    #[test]
    fn a_wildcard_listener_keeps_its_names_from_a_broader_wildcard_route() {
        let any = listener(json!({"name": "any", "port": 443, "protocol": "TLS"}));
        let pay = listener(json!({"name": "pay", "port": 443, "protocol": "TLS", "hostname": "*.pay.example.com"}));
        let routes = [
            vec![route("tenant", 1, &["*.example.com"], "tenant"), route("rest", 2, &[], "rest")],
            vec![route("payments", 5, &["api.pay.example.com"], "payments")],
        ];
        let built = proxy_listeners(&[any, pay], &routes);
        let tls = &built.listeners[0];
        assert_eq!(nginx_picks(tls, "api.pay.example.com"), ["payments"]);
        assert_eq!(nginx_picks(tls, "x.pay.example.com"), Vec::<&str>::new(), "the pay listener has no route for it");
        assert_eq!(nginx_picks(tls, "www.example.com"), ["tenant"]);
        assert_eq!(nginx_picks(tls, "example.org"), ["rest"]);
        assert!(built.shadowed.is_empty(), "{:?}", built.shadowed);
    }

    #[test]
    fn the_most_specific_listener_is_exact_then_the_longest_wildcard_then_none() {
        let listeners = [None, Some("*.example.com"), Some("*.pay.example.com"), Some("db.example.com")];
        for (name, expected) in [
            ("db.example.com", Some(3)),
            ("a.pay.example.com", Some(2)),
            ("*.pay.example.com", Some(2)),
            ("*.a.pay.example.com", Some(2)),
            ("*.example.com", Some(1)),
            ("web.example.com", Some(1)),
            ("example.com", Some(0)),
            ("*.org", Some(0)),
        ] {
            assert_eq!(most_specific(&listeners, name), expected, "{name}");
        }
        assert_eq!(most_specific(&[Some("*.example.com")], "web.example.org"), None);
    }

    #[test]
    fn conflicting_listeners_and_http_are_not_served() {
        let tls = listener(json!({"name": "tls", "port": 443, "protocol": "TLS"}));
        let tcp = listener(json!({"name": "tcp", "port": 443, "protocol": "TCP"}));
        let http = listener(json!({"name": "http", "port": 80, "protocol": "HTTP"}));
        let terminate = listener(json!({"name": "t", "port": 9443, "protocol": "TLS", "tls": {"mode": "Terminate"}}));
        let udp = listener(json!({"name": "dns", "port": 443, "protocol": "UDP"}));
        let routes = vec![route("r", 1, &[], "v1")];
        let built = proxy_listeners(&[tls, tcp, http, terminate, udp], &vec![routes; 5]).listeners;
        let summary: Vec<(u16, Protocol, Vec<&str>)> =
            built.iter().map(|l| (l.port, l.protocol, backends(&l.servers))).collect();
        assert_eq!(summary, [(443, Protocol::Udp, vec!["v1"])]);
    }
}

//! One Gateway, assembled from its routes: which route attaches to which listener, where each
//! backend is, the proxy model's listeners, and what each route's status says for this
//! Gateway. Pure: the caller gives what its caches hold.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Deref;

use k8s_openapi::api::core::v1::Service;

use super::api::gateways::Gateway;
use super::api::referencegrants::ReferenceGrant;
use super::api::tcproutes::TcpRouteParentRefs;
use super::attachment::{NotAccepted, ParentRef, Route, attach};
use super::backend_refs::{ResolvedService, resolve};
use super::listeners::{AttachedRoute, ProxyListeners, Shadowed, precedence_key, proxy_listeners};
use super::routes::RouteView;
use super::status::RouteFindings;
use super::verdicts::{Verdict, verdicts};
use crate::proxy::model::{Destination, Listener, Targets, WeightedBackend};
use crate::proxy::{ReadyPod, pod_addresses};

/// What the caches hold that a Gateway's assembly reads.
pub struct Lookups<N, S, G, P> {
    /// The labels of a namespace, by name.
    pub namespace_labels: N,
    /// A Service, by namespace and name.
    pub service: S,
    /// The ReferenceGrants of a namespace.
    pub grants: G,
    /// A Service's ready pods, by namespace and name, from its EndpointSlices; `None` when the
    /// proxy sends to the Services' cluster IPs instead (see [`Lookups::without_pods`]).
    pub ready_pods: P,
}

/// A [`Lookups::ready_pods`] that reads none.
pub type NoPods = fn(&str, &str) -> Option<Vec<ReadyPod>>;

impl<N, S, G, P> Lookups<N, S, G, P> {
    /// The same lookups, sending to each Service's cluster IP rather than its pods: for a proxy
    /// that sends to Services, or whose pods' configuration would not fit its ConfigMap.
    pub fn without_pods(&self) -> Lookups<&N, &S, &G, NoPods> {
        Lookups {
            namespace_labels: &self.namespace_labels,
            service: &self.service,
            grants: &self.grants,
            ready_pods: |_, _| None,
        }
    }
}

/// A Gateway, assembled.
#[derive(Debug, Clone, PartialEq)]
pub struct Assembly {
    /// The proxy model's listeners.
    pub listeners: Vec<Listener>,
    /// Each listener's verdict, in order.
    pub verdicts: Vec<Verdict>,
    /// How many routes attach to each listener.
    pub attached: Vec<i32>,
    /// For each route given (same order), its findings through each `parentRef` that names this
    /// Gateway.
    pub findings: Vec<Vec<(TcpRouteParentRefs, RouteFindings)>>,
}

/// Assembles `gateway` from `routes` (those that name it, or did).
pub fn assemble<N, S, G, P, R>(gateway: &Gateway, routes: &[RouteView], lookups: &Lookups<N, S, G, P>) -> Assembly
where
    N: Fn(&str) -> BTreeMap<String, String>,
    S: Fn(&str, &str) -> Option<R>,
    R: Deref<Target = Service>,
    G: Fn(&str) -> Vec<ReferenceGrant>,
    P: Fn(&str, &str) -> Option<Vec<ReadyPod>>,
{
    let namespace = gateway.metadata.namespace.as_deref().unwrap_or_default();
    let name = gateway.metadata.name.as_deref().unwrap_or_default();
    let listeners = &gateway.spec.listeners;
    let mut by_listener: Vec<Vec<AttachedRoute>> = vec![Vec::new(); listeners.len()];
    // Each route's parents that name this Gateway, with the listeners each attached it to.
    let mut parents = Vec::with_capacity(routes.len());
    for route in routes {
        let labels = (lookups.namespace_labels)(&route.namespace);
        let seen = Route {
            kind: route.kind,
            namespace: &route.namespace,
            namespace_labels: &labels,
            hostnames: &route.hostnames,
        };
        let (backends, resolved) = backends(route, lookups);
        let mut own = Vec::new();
        let mut attached_to: Vec<usize> = Vec::new();
        for parent in route.parent_refs.iter().filter(|p| route.names_gateway(p, namespace, name)) {
            let asked = ParentRef { section_name: parent.section_name.as_deref(), port: parent.port };
            let attached = attach(namespace, listeners, &seen, asked);
            if let Ok(indexes) = &attached {
                attached_to.extend(indexes);
            }
            own.push((parent.clone(), attached));
        }
        attached_to.sort_unstable();
        attached_to.dedup();
        for i in attached_to {
            by_listener[i].push(AttachedRoute {
                created: route.created.clone(),
                namespace: route.namespace.clone(),
                name: route.name.clone(),
                hostnames: route.hostnames.clone(),
                backends: backends.clone(),
            });
        }
        parents.push((own, resolved));
    }
    let ProxyListeners { listeners: proxy, shadowed } = proxy_listeners(listeners, &by_listener);
    let findings = routes
        .iter()
        .zip(parents)
        .map(|(route, (own, resolved))| {
            own.into_iter()
                .map(|(parent, attached)| {
                    let lost = |s: &&Shadowed| {
                        (&s.namespace, &s.name) == (&route.namespace, &route.name)
                            && attached.as_ref().is_ok_and(|indexes| indexes.contains(&s.listener))
                    };
                    let mut shadowed: Vec<String> = shadowed.iter().filter(lost).map(|s| s.hostname.clone()).collect();
                    shadowed.sort_unstable();
                    shadowed.dedup();
                    (parent, RouteFindings { attached: attached.map(drop), resolved: resolved.clone(), shadowed })
                })
                .collect()
        })
        .collect();
    Assembly {
        listeners: proxy,
        verdicts: verdicts(listeners),
        attached: by_listener.iter().map(|routes| i32::try_from(routes.len()).unwrap_or(i32::MAX)).collect(),
        findings,
    }
}

/// [`assemble`], with only as many routes as `fits` the proxy's listeners: when all of them
/// do not, the first that do in [`fair_order`] are served and every other one is refused,
/// `Accepted=False` [`NotAccepted::GatewayFull`] through each parent it attached through. A
/// tenant that floods a shared Gateway with routes therefore refuses only its own newest ones:
/// every other namespace's routes, older or newer than the flood, are still served and updated
/// up to the flooding namespace's share. `fits` is asked about `log2` of the routes' count
/// times.
pub fn assemble_to_fit<N, S, G, P, R>(
    gateway: &Gateway,
    routes: &[RouteView],
    lookups: &Lookups<N, S, G, P>,
    fits: impl Fn(&[Listener]) -> bool,
) -> Assembly
where
    N: Fn(&str) -> BTreeMap<String, String>,
    S: Fn(&str, &str) -> Option<R>,
    R: Deref<Target = Service>,
    G: Fn(&str) -> Vec<ReferenceGrant>,
    P: Fn(&str, &str) -> Option<Vec<ReadyPod>>,
{
    let all = assemble(gateway, routes, lookups);
    if fits(&all.listeners) {
        return all;
    }
    let oldest_first = fair_order(routes);
    let oldest =
        |count: usize| -> Vec<RouteView> { oldest_first[..count].iter().map(|&i| routes[i].clone()).collect() };
    // The most routes that fit, between none (assumed to fit: a proxy of no route) and all
    // (which do not).
    let (mut fitting, mut too_many) = (0, routes.len());
    while too_many - fitting > 1 {
        let middle = fitting + (too_many - fitting) / 2;
        if fits(&assemble(gateway, &oldest(middle), lookups).listeners) {
            fitting = middle;
        } else {
            too_many = middle;
        }
    }
    let kept = assemble(gateway, &oldest(fitting), lookups);
    let mut findings = all.findings;
    for (position, &route) in oldest_first.iter().enumerate() {
        match kept.findings.get(position) {
            Some(served) => findings[route] = served.clone(),
            None => {
                for (_, refused) in &mut findings[route] {
                    if refused.attached.is_ok() {
                        refused.attached = Err(NotAccepted::GatewayFull);
                        refused.shadowed.clear();
                    }
                }
            }
        }
    }
    Assembly { findings, ..kept }
}

/// The order in which routes get room on a Gateway that cannot serve them all: each namespace
/// (a tenant) takes its turn, its oldest route first (by Gateway API's precedence: the oldest,
/// then by namespace and name), so the `n`th route of any namespace comes before the `n + 1`th
/// of every other. Indexes into `routes`.
pub fn fair_order(routes: &[RouteView]) -> Vec<usize> {
    let key = |i: usize| precedence_key(routes[i].created.as_ref(), &routes[i].namespace, &routes[i].name);
    let mut oldest_first: Vec<usize> = (0..routes.len()).collect();
    oldest_first.sort_by_key(|&i| key(i));
    let mut turns: BTreeMap<&str, usize> = BTreeMap::new();
    let mut ranked: Vec<(usize, usize)> = oldest_first
        .into_iter()
        .map(|i| {
            let turn = turns.entry(routes[i].namespace.as_str()).or_default();
            *turn += 1;
            (*turn, i)
        })
        .collect();
    ranked.sort_by_key(|&(turn, i)| (turn, key(i)));
    ranked.into_iter().map(|(_, i)| i).collect()
}

/// A route's backends, each weighed, and whether all resolve (else the first one's reason and
/// message). One that does not resolve keeps its weight and is refused. One that resolves is
/// its ready pods when the lookups read them (its weight shared over them, as a Balancer
/// backend's), else its Service's cluster IP.
fn backends<N, S, G, P, R>(
    route: &RouteView,
    lookups: &Lookups<N, S, G, P>,
) -> (Vec<WeightedBackend>, Result<(), (&'static str, String)>)
where
    S: Fn(&str, &str) -> Option<R>,
    R: Deref<Target = Service>,
    G: Fn(&str) -> Vec<ReferenceGrant>,
    P: Fn(&str, &str) -> Option<Vec<ReadyPod>>,
{
    let mut resolved = Ok(());
    let mut backends = Vec::new();
    for (index, reference) in route.backend_references().enumerate() {
        let target_namespace = reference.namespace.unwrap_or(&route.namespace);
        let grants = (lookups.grants)(target_namespace);
        let found = resolve(route.kind, &route.namespace, &reference, &lookups.service, &grants);
        let targets = match &found {
            Ok(ResolvedService { namespace, name, cluster_ip: Some(ip), port, port_name }) => {
                let service = Destination::Address(SocketAddr::new(*ip, *port));
                match (lookups.ready_pods)(namespace, name) {
                    Some(ready) => {
                        Targets::Pods { service, pods: pod_addresses(&ready, port_name, route.kind.protocol()) }
                    }
                    None => Targets::Service(service),
                }
            }
            Ok(_) => Targets::Refused,
            Err(why) => {
                if resolved.is_ok() {
                    resolved = Err((why.reason(), why.message(&reference)));
                }
                Targets::Refused
            }
        };
        // Named for what it is when it resolved (a Service's namespace and name are DNS names);
        // else by its place in the route, never by text the route's author chose.
        let name = match &found {
            Ok(service) => format!("{}/{}:{}", service.namespace, service.name, service.port),
            Err(_) => format!("{}/{}#{index}", route.namespace, route.name),
        };
        backends.push(WeightedBackend {
            name,
            weight: reference.weight(),
            backup: false,
            max_fails: None,
            fail_timeout: None,
            max_connections: None,
            targets,
        });
    }
    (backends, resolved)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    use super::*;
    use crate::gateway::api::tcproutes::TcpRoute;
    use crate::gateway::attachment::{NotAccepted, RouteKind};

    fn gateway() -> Gateway {
        serde_json::from_value(json!({
            "metadata": {"namespace": "apps", "name": "gw"},
            "spec": {"gatewayClassName": "balancer", "listeners": [
                {"name": "pg", "port": 5432, "protocol": "TCP"},
                {"name": "web", "port": 80, "protocol": "HTTP"},
            ]}
        }))
        .expect("a Gateway")
    }

    fn route(name: &str, second: i64, parent: serde_json::Value, backends: serde_json::Value) -> RouteView {
        let created = Timestamp::from_second(second).expect("a time").to_string();
        let route: TcpRoute = serde_json::from_value(json!({
            "metadata": {"namespace": "apps", "name": name, "creationTimestamp": created},
            "spec": {"parentRefs": [parent], "rules": [{"backendRefs": backends}]}
        }))
        .expect("a TCPRoute");
        RouteView::of(RouteKind::Tcp, &route).expect("it reads")
    }

    fn service(name: &str, ip: &str) -> Service {
        serde_json::from_value(json!({
            "metadata": {"namespace": "apps", "name": name},
            "spec": {"clusterIP": ip, "ports": [{"port": 5432}]}
        }))
        .expect("a Service")
    }

    type NoLabels = fn(&str) -> BTreeMap<String, String>;
    type NoGrants = fn(&str) -> Vec<ReferenceGrant>;

    /// Lookups that find one of `services` by name alone, and nothing else: no namespace labels,
    /// no grants, and the Services' cluster IPs rather than their pods.
    fn by_name<'a>(
        services: &'a [Service],
    ) -> Lookups<NoLabels, impl Fn(&str, &str) -> Option<&'a Service> + 'a, NoGrants, NoPods> {
        Lookups {
            namespace_labels: |_: &str| BTreeMap::new(),
            service: move |_: &str, name: &str| services.iter().find(|s| s.metadata.name.as_deref() == Some(name)),
            grants: |_: &str| Vec::new(),
            ready_pods: |_: &str, _: &str| None,
        }
    }

    #[test]
    fn routes_attach_resolve_and_weigh() {
        let services = [service("v1", "10.96.0.11"), service("v2", "10.96.0.12")];
        let lookups = Lookups {
            namespace_labels: |_: &str| BTreeMap::new(),
            service: |ns: &str, name: &str| {
                services
                    .iter()
                    .find(|s| s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name))
            },
            grants: |_: &str| Vec::new(),
            ready_pods: |_: &str, _: &str| None,
        };
        let routes = [
            route(
                "split",
                10,
                json!({"name": "gw", "sectionName": "pg"}),
                json!([{"name": "v1", "port": 5432, "weight": 70}, {"name": "v2", "port": 5432, "weight": 30},
                       {"name": "gone", "port": 5432, "weight": 0}]),
            ),
            route("newer", 20, json!({"name": "gw", "port": 5432}), json!([{"name": "v2", "port": 5432}])),
            route("http", 30, json!({"name": "gw", "sectionName": "web"}), json!([{"name": "v1", "port": 5432}])),
            route("elsewhere", 40, json!({"name": "other"}), json!([])),
        ];
        let assembly = assemble(&gateway(), &routes, &lookups);
        assert_eq!(assembly.attached, [2, 0], "both TCP routes attach; the HTTP listener takes no TCPRoute");
        let servers: Vec<(&str, &str, u32)> =
            assembly.listeners[0].servers.iter().map(|s| (s.backend.as_str(), s.address.as_str(), s.weight)).collect();
        assert_eq!(
            servers,
            [
                ("apps/v1:5432", "10.96.0.11:5432", 70),
                ("apps/v2:5432", "10.96.0.12:5432", 30),
                ("apps/split#2", "127.0.0.1:1", 0)
            ],
            "the oldest route serves, by weight, the missing Service refused"
        );
        assert_eq!(assembly.listeners.len(), 1, "HTTP is not served");
        let split = &assembly.findings[0][0].1;
        assert_eq!(split.attached, Ok(()));
        assert_eq!(split.resolved.as_ref().map_err(|e| e.0), Err("BackendNotFound"));
        assert_eq!(assembly.findings[2][0].1.attached, Err(NotAccepted::NotAllowedByListeners));
        assert!(assembly.findings[3].is_empty(), "no finding for another Gateway's reference");
    }

    /// A TLSRoute `name` created at `second`, for `hostnames`, to Service `v1`.
    fn tls_route(name: &str, second: i64, hostnames: &[&str]) -> RouteView {
        tls_route_in("apps", name, second, hostnames)
    }

    fn tls_route_in(namespace: &str, name: &str, second: i64, hostnames: &[&str]) -> RouteView {
        let created = Timestamp::from_second(second).expect("a time").to_string();
        let route: crate::gateway::api::tlsroutes::TlsRoute = serde_json::from_value(json!({
            "metadata": {"namespace": namespace, "name": name, "creationTimestamp": created},
            "spec": {"parentRefs": [{"name": "gw", "namespace": "apps"}], "hostnames": hostnames,
                     "rules": [{"backendRefs": [{"name": "v1", "port": 5432}]}]}
        }))
        .expect("a TLSRoute");
        RouteView::of(RouteKind::Tls, &route).expect("it reads")
    }

    /// When the routes would not fit, the oldest that do are served and the newer are refused
    /// `GatewayFull`, whatever order the cache lists them in.
    #[test]
    fn the_newest_routes_that_would_not_fit_are_refused() {
        let gateway: Gateway = serde_json::from_value(json!({
            "metadata": {"namespace": "apps", "name": "gw"},
            "spec": {"gatewayClassName": "balancer", "listeners": [{"name": "tls", "port": 443, "protocol": "TLS"}]}
        }))
        .expect("a Gateway");
        let services = [service("v1", "10.96.0.11")];
        let lookups = by_name(&services);
        // Listed newest first; the fourth and fifth by age are the flood.
        let routes: Vec<RouteView> =
            (0..5).rev().map(|i| tls_route(&format!("r{i}"), 10 + i, &[&format!("h{i}.example.com")])).collect();
        let at_most_three = |listeners: &[Listener]| listeners.iter().map(|l| l.sni_routes.len()).sum::<usize>() <= 3;
        let assembly = assemble_to_fit(&gateway, &routes, &lookups, at_most_three);
        let served: Vec<&str> = assembly.listeners[0].sni_routes.iter().map(|r| r.hostnames[0].as_str()).collect();
        assert_eq!(served, ["h0.example.com", "h1.example.com", "h2.example.com"]);
        let accepted: Vec<(&str, Result<(), NotAccepted>)> =
            routes.iter().zip(&assembly.findings).map(|(r, f)| (r.name.as_str(), f[0].1.attached)).collect();
        let full = Err(NotAccepted::GatewayFull);
        assert_eq!(accepted, [("r4", full), ("r3", full), ("r2", Ok(())), ("r1", Ok(())), ("r0", Ok(()))]);
        assert_eq!(assembly.attached, [3], "the refused are not counted as attached");
        let everything = assemble_to_fit(&gateway, &routes, &lookups, |_| true);
        assert_eq!(everything, assemble(&gateway, &routes, &lookups), "all fit: the plain assembly");
    }

    /// One tenant's flood of routes on a shared listener, older and newer than another tenant's
    /// routes, takes only its share of a full Gateway: the other tenant's routes, one created
    /// after the flood included, are served, and the flood's newest are refused.
    #[test]
    fn a_tenants_flood_takes_only_its_share_of_a_full_gateway() {
        let gateway: Gateway = serde_json::from_value(json!({
            "metadata": {"namespace": "apps", "name": "gw"},
            "spec": {"gatewayClassName": "balancer", "listeners": [{"name": "tls", "port": 443, "protocol": "TLS",
                     "allowedRoutes": {"namespaces": {"from": "All"}}}]}
        }))
        .expect("a Gateway");
        let services = [service("v1", "10.96.0.11")];
        let lookups = by_name(&services);
        // The flood (team-a, 6 routes at 10 to 15 s), team-b's two routes at 5 s and 20 s.
        let mut routes: Vec<RouteView> =
            (0..6).map(|i| tls_route_in("team-a", &format!("f{i}"), 10 + i, &[&format!("f{i}.example.com")])).collect();
        routes.push(tls_route_in("team-b", "old", 5, &["old.example.com"]));
        routes.push(tls_route_in("team-b", "new", 20, &["new.example.com"]));
        let names = |order: Vec<usize>| order.into_iter().map(|i| routes[i].name.clone()).collect::<Vec<_>>();
        assert_eq!(names(fair_order(&routes)), ["old", "f0", "f1", "new", "f2", "f3", "f4", "f5"]);
        let at_most_four = |listeners: &[Listener]| listeners.iter().map(|l| l.sni_routes.len()).sum::<usize>() <= 4;
        let assembly = assemble_to_fit(&gateway, &routes, &lookups, at_most_four);
        let mut served: Vec<&str> = assembly.listeners[0].sni_routes.iter().map(|r| r.hostnames[0].as_str()).collect();
        served.sort_unstable();
        assert_eq!(served, ["f0.example.com", "f1.example.com", "new.example.com", "old.example.com"]);
        let full: Vec<&str> = routes
            .iter()
            .zip(&assembly.findings)
            .filter(|(_, f)| f[0].1.attached == Err(NotAccepted::GatewayFull))
            .map(|(r, _)| r.name.as_str())
            .collect();
        assert_eq!(full, ["f2", "f3", "f4", "f5"], "only the flood's newest are refused");
    }

    #[test]
    fn a_backend_name_written_to_inject_a_directive_never_reaches_the_proxy() {
        let lookups = Lookups {
            namespace_labels: |_: &str| BTreeMap::new(),
            service: |_: &str, _: &str| None::<&Service>,
            grants: |_: &str| Vec::new(),
            ready_pods: |_: &str, _: &str| None,
        };
        let evil = "x;\n    server 10.0.0.1:1;\n#";
        let routes =
            [route("evil", 1, json!({"name": "gw", "sectionName": "pg"}), json!([{"name": evil, "port": 5432}]))];
        let assembly = assemble(&gateway(), &routes, &lookups);
        let backends: Vec<&str> = assembly.listeners[0].servers.iter().map(|s| s.backend.as_str()).collect();
        assert_eq!(backends, ["apps/evil#0"], "named by its place, not by its text");
        let resolved = &assembly.findings[0][0].1.resolved;
        assert_eq!(resolved.as_ref().map_err(|e| e.0), Err("BackendNotFound"));
    }

    #[test]
    fn a_resolved_backend_is_its_ready_pods_at_the_services_named_port_when_read() {
        let named = |name: &str, ip: &str| -> Service {
            serde_json::from_value(json!({
                "metadata": {"namespace": "apps", "name": name},
                "spec": {"clusterIP": ip, "ports": [{"name": "pg", "port": 5432, "targetPort": 15432}]}
            }))
            .expect("a Service")
        };
        let services = [named("v1", "10.96.0.11"), named("v2", "10.96.0.12")];
        let pod = |address: &str, name: &str, protocol: crate::api::Protocol| ReadyPod {
            address: address.parse().expect("an address"),
            ports: vec![crate::proxy::PodPort { name: name.into(), protocol, port: 15432 }],
        };
        let lookups = Lookups {
            namespace_labels: |_: &str| BTreeMap::new(),
            service: |_: &str, name: &str| services.iter().find(|s| s.metadata.name.as_deref() == Some(name)),
            grants: |_: &str| Vec::new(),
            ready_pods: |_: &str, name: &str| {
                let tcp = crate::api::Protocol::Tcp;
                Some(match name {
                    // Two pods, and one whose port is of another name or protocol (left out).
                    "v1" => vec![
                        pod("10.0.0.1", "pg", tcp),
                        pod("10.0.0.2", "pg", tcp),
                        pod("10.0.0.3", "other", tcp),
                        pod("10.0.0.4", "pg", crate::api::Protocol::Udp),
                    ],
                    _ => vec![pod("10.0.1.1", "pg", tcp)],
                })
            },
        };
        let routes = [route(
            "split",
            10,
            json!({"name": "gw", "sectionName": "pg"}),
            json!([{"name": "v1", "port": 5432, "weight": 70}, {"name": "v2", "port": 5432, "weight": 30}]),
        )];
        let servers = |assembly: Assembly| -> Vec<(String, u32)> {
            assembly.listeners[0].servers.iter().map(|s| (s.address.clone(), s.weight)).collect()
        };
        let pods = servers(assemble(&gateway(), &routes, &lookups));
        let addresses: Vec<&str> = pods.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(addresses, ["10.0.0.1:15432", "10.0.0.2:15432", "10.0.1.1:15432"], "each ready pod at its port");
        let total: u32 = pods.iter().map(|(_, w)| w).sum();
        assert_eq!((pods[0].1 + pods[1].1) * 10, total * 7, "v1's 70 % shared over its two pods: {pods:?}");
        let services = servers(assemble(&gateway(), &routes, &lookups.without_pods()));
        assert_eq!(services, [("10.96.0.11:5432".to_string(), 70), ("10.96.0.12:5432".to_string(), 30)]);
    }
}

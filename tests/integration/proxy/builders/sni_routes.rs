//! A listener routed by the TLS server name (SNI): the golden rendering, a name written once
//! and only Gateway API hostnames written, routes only on TCP, and a Balancer's model unchanged
//! by the field (the running sidecars read it).

use balancer::api::Protocol;
use balancer::proxy::model::{Destination, Listener, Method, ProxyConfig, SniRoute, Targets, WeightedBackend};
use balancer::proxy::nginx;
use balancer::proxy::upstreams::Upstreams;

use super::fixtures::{desired_for, sample};

fn backend(name: &str, address: &str, weight: u32) -> WeightedBackend {
    let targets = Targets::Service(Destination::Address(address.parse().expect("an address")));
    let (max_fails, fail_timeout, max_connections) = (None, None, None);
    WeightedBackend { name: name.into(), weight, backup: false, max_fails, fail_timeout, max_connections, targets }
}

fn names(hostnames: &[&str]) -> Vec<String> {
    hostnames.iter().map(|h| h.to_string()).collect()
}

fn listener(protocol: Protocol, sni_routes: Vec<SniRoute>) -> Listener {
    Listener { protocol, ..Listener::tls_passthrough(443, sni_routes) }
}

fn config(listeners: Vec<Listener>) -> ProxyConfig {
    let (load_modules, drain_timeout) = (vec![], "1h".to_string());
    ProxyConfig { balancer: "tls".into(), load_modules, drain_timeout, access_log: None, listeners }
}

fn routes() -> Vec<SniRoute> {
    let db = [backend("db", "10.0.0.1:5432", 3), backend("db-canary", "10.0.0.2:5432", 1)];
    let web = [backend("web", "10.0.0.3:8443", 1)];
    vec![
        SniRoute::new(names(&["db.example.com", "*.db.example.com"]), Method::RoundRobin, &db).expect("a route"),
        SniRoute::new(names(&["*.example.com", "db.example.com"]), Method::LeastConn, &web).expect("a route"),
    ]
}

#[test]
fn golden_nginx_conf_for_two_routes_by_server_name() {
    let conf = nginx::write(&config(vec![listener(Protocol::Tcp, routes())]));
    let stream = &conf[conf.find("stream {").expect("a stream block")..];
    let expected = r#"stream {
    upstream port_443_tcp {
        zone port_443_tcp 512k;
        server 127.0.0.1:1 down;  # no route for the name the client sent
    }

    upstream port_443_tcp_sni_0 {
        zone port_443_tcp_sni_0 512k;
        server 10.0.0.1:5432 weight=3;  # db
        server 10.0.0.2:5432 weight=1;  # db-canary
    }

    upstream port_443_tcp_sni_1 {
        zone port_443_tcp_sni_1 512k;
        least_conn;
        server 10.0.0.3:8443 weight=1;  # web
    }

    map $ssl_preread_server_name $port_443_tcp_sni {
        hostnames;
        db.example.com port_443_tcp_sni_0;
        *.db.example.com port_443_tcp_sni_0;
        *.example.com port_443_tcp_sni_1;
        default port_443_tcp;
    }

    server {
        listen 443;
        listen [::]:443;
        proxy_next_upstream off;
        ssl_preread on;
        proxy_pass $port_443_tcp_sni;
    }
}
"#;
    assert_eq!(stream, expected);
}

#[test]
fn only_gateway_hostnames_make_a_route_and_only_they_are_written() {
    let web = [backend("web", "10.0.0.3:8443", 1)];
    for refused in [vec![], names(&["db.example.com;"]), names(&["a b"]), names(&["*"]), names(&["Upper.example.com"])]
    {
        assert_eq!(SniRoute::new(refused.clone(), Method::RoundRobin, &web), None, "{refused:?}");
    }
    let mut routes = routes();
    routes[1].hostnames.push("evil.com;\n    server 169.254.169.254:80".into());
    let conf = nginx::write(&config(vec![listener(Protocol::Tcp, routes)]));
    assert!(!conf.contains("evil") && !conf.contains("169.254"), "{conf}");
}

#[test]
fn a_udp_listener_is_never_routed_by_server_name() {
    let conf = nginx::write(&config(vec![listener(Protocol::Udp, routes())]));
    assert!(!conf.contains("ssl_preread") && !conf.contains("map ") && !conf.contains("_sni"), "{conf}");
    assert!(conf.contains("proxy_pass port_443_udp;"), "{conf}");
}

#[test]
fn the_metrics_know_every_routes_servers_and_upstreams() {
    let upstreams = Upstreams::of(&config(vec![listener(Protocol::Tcp, routes())]));
    assert_eq!(upstreams.backend("10.0.0.2:5432"), Some("db-canary"));
    assert_eq!(upstreams.backend("10.0.0.3:8443"), Some("web"));
    for name in ["port_443_tcp", "port_443_tcp_sni_0", "port_443_tcp_sni_1"] {
        assert!(upstreams.is_upstream(name), "{name}");
    }
}

/// Sidecars already running read `proxy.json` with the model of their release: a Balancer's
/// model leaves the new field out, so it is the same text as before.
#[test]
fn a_balancers_model_has_no_route_by_server_name() {
    let model = desired_for(&sample()).config_map.data.expect("data");
    let model = &model[balancer::proxy::model::MODEL_FILE];
    assert!(!model.contains("sniRoutes"), "{model}");
    let read = ProxyConfig::from_json(model).expect("a model");
    assert!(read.listeners.iter().all(|l| l.sni_routes.is_empty() && !l.routes_by_sni()));
}

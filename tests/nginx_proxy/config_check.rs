//! `nginx -t` accepts every rendered config of a table of specs, and refuses a broken one.

use std::collections::BTreeMap;

use balancer::api::{BackendSpec, BalancerPort, BalancerSpec};
use balancer::proxy::nginx;
use balancer::spec::{ObjectName, SpecPolicy, admit};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::backends::{admitted, loopback_addresses, sample_spec};
use crate::process::{nginx_binary, nginx_check};
use crate::support::fixtures::{backend, port};

fn config_table() -> Vec<(&'static str, BalancerSpec)> {
    let three = || vec![backend("v1", 40), backend("v2", 20), backend("v3", 40)];
    let spec = |ports, backends| BalancerSpec {
        replicas: None,
        session_affinity: None,
        algorithm: None,
        service: None,
        proxy: None,
        canary: None,
        ports,
        selector: None,
        backends,
    };
    let mut named_target = port(Some("dns"), "UDP", 53);
    named_target.target_port = Some(IntOrString::String("dns".into()));
    let mut named_tcp = port(Some("http"), "TCP", 80);
    named_tcp.target_port = Some(IntOrString::String("http-alt".into()));
    vec![
        ("original sample", sample_spec(80)),
        (
            "single TCP port, defaults left out",
            spec(
                vec![BalancerPort { name: None, protocol: None, port: 8080, target_port: None, ..Default::default() }],
                vec![BackendSpec {
                    name: "a".into(),
                    weight: None,
                    selector: Some(BTreeMap::from([("app".into(), "a".into())])),
                    ..Default::default()
                }],
            ),
        ),
        ("single UDP port", spec(vec![port(None, "UDP", 5353)], three())),
        ("ClientIP affinity, TCP and UDP", {
            let mut affine = spec(vec![port(Some("tcp"), "TCP", 80), port(Some("udp"), "UDP", 53)], three());
            affine.session_affinity = Some("ClientIP".into());
            affine
        }),
        ("53/TCP and 53/UDP", spec(vec![port(Some("dns-tcp"), "TCP", 53), port(Some("dns-udp"), "UDP", 53)], three())),
        (
            "weight-0 backend",
            spec(vec![port(None, "TCP", 80)], vec![backend("v1", 1), backend("v2", 0), backend("v3", 100)]),
        ),
        (
            "64 backends",
            spec(vec![port(None, "TCP", 80)], (0..64).map(|i| backend(&format!("b{i}"), i % 101)).collect()),
        ),
        (
            "32 ports",
            spec(
                (0..32)
                    .map(|i| port(Some(&format!("p{i}")), if i % 2 == 0 { "TCP" } else { "UDP" }, 1000 + i))
                    .collect(),
                three(),
            ),
        ),
        (
            "64 backends x 32 ports",
            spec(
                (0..32).map(|i| port(Some(&format!("p{i}")), "TCP", 65535 - i)).collect(),
                (0..64).map(|i| backend(&format!("b{i}"), 100)).collect(),
            ),
        ),
        ("named targetPort", spec(vec![named_tcp, named_target], three())),
        (
            "backend names with dashes",
            spec(
                vec![port(None, "TCP", 1)],
                vec![backend("blue-green-1", 3), backend("canary--x", 1), backend("a-b-c-d-e", 2)],
            ),
        ),
    ]
}

#[test]
fn nginx_t_accepts_every_rendered_config() {
    let Some(bin) = nginx_binary() else { return };
    let mut rejected = Vec::new();
    for (case, spec) in config_table() {
        let spec = admit(ObjectName::Name("table"), spec, &SpecPolicy::default())
            .unwrap_or_else(|report| panic!("{case}: the table holds valid specs only: {:?}", report.errors));
        let rendered = nginx::render("table", &spec, &[], None, &loopback_addresses(&spec));
        if let Err(log) = nginx_check(&bin, &rendered) {
            rejected.push(format!("--- {case} ---\n{log}\n{rendered}"));
        }
    }
    assert!(rejected.is_empty(), "nginx -t rejected:\n{}", rejected.join("\n"));
}

#[test]
fn nginx_t_rejects_a_broken_config() {
    // The check above must be able to fail: a config nginx cannot load is reported.
    let Some(bin) = nginx_binary() else { return };
    let spec = admitted(sample_spec(80));
    let rendered =
        nginx::render("table", &spec, &[], None, &loopback_addresses(&spec)).replace("weight=40", "weight=0");
    let log = nginx_check(&bin, &rendered).expect_err("weight=0 is invalid for nginx");
    assert!(log.contains("weight"), "{log}");
}

/// Gateway API hostnames, with the words nginx gives meaning to inside a `map` and names of
/// the longest length among them: what a tenant may write in a TLSRoute, or an administrator
/// on a listener.
fn arb_hostname() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let keyword = proptest::sample::select(vec!["default", "include", "hostnames", "volatile", "map", "server"]);
    let label = "[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?";
    let name = proptest::collection::vec(label, 1..4).prop_map(|labels| labels.join("."));
    let longest = (0u8..10).prop_map(|i| {
        let label = format!("{}{i}", "a".repeat(62));
        [label.as_str(); 4].join(".").chars().take(253).collect::<String>().trim_end_matches('.').to_string()
    });
    let plain = prop_oneof![keyword.prop_map(str::to_string), name, longest];
    (any::<bool>(), plain).prop_map(|(wildcard, name)| if wildcard { format!("*.{name}") } else { name })
}

/// A Gateway's TLS listeners on one port (each with a hostname or none) and the routes
/// attached to each, every route with up to four hostnames.
fn arb_gateway() -> impl proptest::strategy::Strategy<Value = (Vec<Option<String>>, Vec<Vec<Vec<String>>>)> {
    use proptest::prelude::*;
    let routes = proptest::collection::vec(proptest::collection::vec(arb_hostname(), 0..4), 0..4);
    proptest::collection::vec((proptest::option::of(arb_hostname()), routes), 1..5)
        .prop_map(|listeners| listeners.into_iter().unzip())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Whatever hostnames tenants' routes and the listeners carry, the rendered file is one
    /// nginx accepts: no name becomes one of `map`'s own parameters.
    #[test]
    fn nginx_t_accepts_every_gateway_whatever_its_hostnames((hostnames, routes) in arb_gateway()) {
        let Some(bin) = nginx_binary() else { return Ok(()) };
        let rendered = gateway_conf(&hostnames, &routes);
        if let Err(log) = nginx_check(&bin, &rendered) {
            proptest::prop_assert!(false, "nginx -t rejected a Gateway's configuration:\n{log}\n{rendered}");
        }
    }
}

/// `nginx.conf` for TLS listeners on port 443 with `hostnames`, `routes[i]` the routes attached
/// to listener `i`, each route's hostnames given.
fn gateway_conf(hostnames: &[Option<String>], routes: &[Vec<Vec<String>>]) -> String {
    use balancer::gateway::api::gateways::GatewayListeners;
    use balancer::gateway::listeners::{AttachedRoute, proxy_listeners};
    use balancer::proxy::model::{Destination, OwnerKind, ProxyConfig, Targets, WeightedBackend};

    let listeners: Vec<GatewayListeners> = hostnames
        .iter()
        .enumerate()
        .map(|(i, hostname)| {
            let listener =
                serde_json::json!({"name": format!("l{i}"), "port": 443, "protocol": "TLS", "hostname": hostname});
            serde_json::from_value(listener).expect("a listener")
        })
        .collect();
    let attached: Vec<Vec<AttachedRoute>> = routes
        .iter()
        .enumerate()
        .map(|(l, routes)| {
            routes
                .iter()
                .enumerate()
                .map(|(r, hostnames)| AttachedRoute {
                    created: None,
                    namespace: "tenant".into(),
                    name: format!("r{l}-{r}"),
                    hostnames: hostnames.clone(),
                    backends: vec![WeightedBackend {
                        name: format!("b{l}-{r}"),
                        weight: 1,
                        backup: false,
                        max_fails: None,
                        fail_timeout: None,
                        max_connections: None,
                        targets: Targets::Service(Destination::Address(([127, 0, 0, 2], 9000).into())),
                    }],
                })
                .collect()
        })
        .collect();
    let config = ProxyConfig {
        kind: OwnerKind::Gateway,
        name: "shared".into(),
        load_modules: Vec::new(),
        drain_timeout: "1h".into(),
        access_log: None,
        listeners: proxy_listeners(&listeners, &attached).listeners,
        canary_window: None,
    };
    nginx::write(&config)
}

/// The check above can fail: before keys were escaped, a route named `default` on a listener
/// without a hostname made nginx refuse the whole file (`duplicate default map parameter`).
#[test]
fn nginx_t_rejects_a_map_key_left_unescaped() {
    let Some(bin) = nginx_binary() else { return };
    let rendered = gateway_conf(&[None], &[vec![vec!["default".to_string()]]]);
    assert!(rendered.contains("        \\default port_443_tcp_sni_0;"), "{rendered}");
    nginx_check(&bin, &rendered).expect("the escaped key is accepted");
    let unescaped = rendered.replace("\\default", "default");
    let log = nginx_check(&bin, &unescaped).expect_err("an unescaped default is a second default");
    assert!(log.contains("duplicate default"), "{log}");
}

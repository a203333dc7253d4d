//! `docs/gateway-api.md` against the code: its example reads as Gateway API objects, and
//! assembles into the proxy it describes (the TCP route's 90/10 split, the TLS route by server
//! name); its install commands are the ones the real-node suite runs.

use std::collections::BTreeMap;

use balancer::gateway::api::gateways::Gateway;
use balancer::gateway::api::tcproutes::TcpRoute;
use balancer::gateway::api::tlsroutes::TlsRoute;
use balancer::gateway::assembly::{Lookups, assemble};
use balancer::gateway::attachment::RouteKind;
use balancer::gateway::proxy::{gateway_owner, gateway_proxy};
use balancer::gateway::routes::RouteView;
use balancer::proxy::ProxySettings;
use balancer::spec::SpecPolicy;
use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use crate::support::repo::repo;

fn page() -> String {
    std::fs::read_to_string(repo("docs/gateway-api.md")).expect("docs/gateway-api.md reads")
}

/// The page's fenced blocks of `language`.
fn blocks(page: &str, language: &str) -> Vec<String> {
    let fence = format!("```{language}\n");
    page.split(&fence).skip(1).filter_map(|rest| rest.split("```").next()).map(str::to_string).collect()
}

fn service(name: &str, ip: &str, port: i32) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": "apps", "name": name},
        "spec": {"clusterIP": ip, "ports": [{"port": port}]}
    }))
    .expect("a Service")
}

#[test]
fn the_example_assembles_into_the_proxy_the_page_describes() {
    let yaml = blocks(&page(), "yaml");
    assert_eq!(yaml.len(), 2, "the example, and the parameters' ConfigMap");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml[0]).expect("the example parses");
    let of_kind = |kind: &'static str| docs.iter().filter(move |d| d["kind"] == kind).cloned();
    let mut gateway: Gateway =
        serde_json::from_value(of_kind("Gateway").next().expect("a Gateway")).expect("a Gateway reads");
    gateway.metadata.uid = Some("uid".into());
    let mut routes = Vec::new();
    for route in of_kind("TCPRoute") {
        let route: TcpRoute = serde_json::from_value(route).expect("a TCPRoute reads");
        routes.extend(RouteView::of(RouteKind::Tcp, &route));
    }
    for route in of_kind("TLSRoute") {
        let route: TlsRoute = serde_json::from_value(route).expect("a TLSRoute reads");
        routes.extend(RouteView::of(RouteKind::Tls, &route));
    }
    assert_eq!(routes.len(), 2);
    let services =
        [service("pg-v1", "10.96.0.11", 5432), service("pg-v2", "10.96.0.12", 5432), service("db", "10.96.0.13", 8443)];
    let lookups = Lookups {
        namespace_labels: |_: &str| BTreeMap::new(),
        service: |_: &str, name: &str| services.iter().find(|s| s.metadata.name.as_deref() == Some(name)),
        grants: |_: &str| Vec::new(),
        ready_pods: |_: &str, _: &str| None,
    };
    let assembly = assemble(&gateway, &routes, &lookups);
    assert_eq!(assembly.attached, [1, 1]);
    let owner = gateway_owner(&gateway).expect("an owner");
    assert_eq!(
        (owner.name.as_str(), owner.identity.as_str()),
        ("edge-balancer", "Gateway/edge"),
        "as the page's table says"
    );
    let settings = ProxySettings {
        image: "nginx".into(),
        load_modules: Vec::new(),
        metrics_image: None,
        policy: SpecPolicy::default(),
        signer: None,
    };
    let proxy = gateway_proxy(&owner, &gateway, assembly.listeners, &settings, &Default::default());
    let conf = &proxy.nginx_conf;
    for line in [
        "server 10.96.0.11:5432 weight=90;",
        "server 10.96.0.12:5432 weight=10;",
        r"\db.example.com port_443_tcp_sni_0;",
    ] {
        assert!(conf.contains(line), "{line:?} in:\n{conf}");
    }
    let ports: Vec<Option<String>> =
        proxy.front_service.spec.expect("a spec").ports.expect("ports").into_iter().map(|p| p.name).collect();
    assert_eq!(ports, [Some("tcp-5432".to_string()), Some("tcp-443".to_string())]);
}

#[test]
fn the_parameters_example_reads_as_the_page_says() {
    let yaml = blocks(&page(), "yaml");
    let config_map: k8s_openapi::api::core::v1::ConfigMap =
        serde_saphyr::from_str(&yaml[1]).expect("the parameters example parses");
    let given = balancer::gateway::parameters::read(&config_map, &SpecPolicy::default()).expect("valid settings");
    assert_eq!(given.replicas, Some(2));
    assert_eq!(given.proxy.drain_timeout.as_deref(), Some("10m"));
    let limits = given.proxy.resources.and_then(|r| r.limits).expect("limits");
    assert_eq!(limits["memory"].0, "256Mi");
}

#[test]
fn the_install_commands_are_the_ones_the_node_suite_runs() {
    let commands = blocks(&page(), "sh").concat();
    let crds = std::fs::read_to_string(repo("tests/kubernetes/gateway-api.sh")).expect("gateway-api.sh");
    assert!(crds.contains("v1.7.0") && commands.contains("/v1.7.0/standard-install.yaml"), "one version");
    let node = std::fs::read_to_string(repo("tests/node/gateway.rs")).expect("the node scenario");
    assert!(commands.contains("kubectl -n balancer-system rollout restart deployment/balancer"));
    assert!(node.contains(r#"["-n", "balancer-system", "rollout", "restart", "deployment/balancer"]"#));
}

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

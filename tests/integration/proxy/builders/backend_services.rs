//! The backend Services: their selectors and ports; and the spec they are built from, defaulted.

use std::collections::BTreeMap;

use balancer::api::{BackendSpec, BalancerPort, BalancerSpec};
use balancer::proxy::{self, ProxySettings};
use balancer::spec::{SpecPolicy, with_defaults};
use k8s_openapi::api::core::v1::ServicePort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::fixtures::{
    admitted, as_json, desired, desired_for, is_subset, labels, owner, pod_labels, sample, selector, service_ports,
    settings, with_ports,
};
use crate::support::fixtures::port;

#[test]
fn backend_selector_is_the_spec_selector_overlaid_by_the_backend_selector() {
    let mut balancer = sample();
    balancer.spec.selector = Some(labels(&[("app", "test"), ("tier", "web")]));
    balancer.spec.backends[0].selector = Some(labels(&[("version", "v1"), ("tier", "canary")]));
    balancer.spec.backends[1].selector = None;
    let desired = desired_for(&balancer);
    assert_eq!(
        selector(&desired.backend_services[0]),
        &labels(&[("app", "test"), ("tier", "canary"), ("version", "v1")]),
        "the backend wins on a shared key"
    );
    assert_eq!(selector(&desired.backend_services[1]), &labels(&[("app", "test"), ("tier", "web")]));
    assert_eq!(selector(&desired.backend_services[2]), &labels(&[("app", "test"), ("tier", "web"), ("version", "v3")]));

    // Without spec.selector, each backend's own (a backend with none would select every pod: invalid).
    balancer.spec.selector = None;
    balancer.spec.backends[1].selector = Some(labels(&[("version", "v2")]));
    let desired = desired_for(&balancer);
    assert_eq!(selector(&desired.backend_services[0]), &labels(&[("version", "v1"), ("tier", "canary")]));
    assert_eq!(selector(&desired.backend_services[1]), &labels(&[("version", "v2")]));
}

#[test]
fn backend_services_expose_every_port_with_its_target_port() {
    let mut named = port(Some("dns"), "UDP", 53);
    named.target_port = Some(IntOrString::String("dns".into()));
    let mut numbered = port(Some("http"), "TCP", 80);
    numbered.target_port = Some(IntOrString::Int(5678));
    let defaulted = port(Some("metrics"), "TCP", 9090);
    let balancer = with_ports(vec![named, numbered, defaulted]);
    let desired = desired_for(&balancer);
    assert_eq!(desired.backend_services.len(), 3, "one Service per backend");
    let expected = vec![
        ServicePort {
            name: Some("dns".into()),
            protocol: Some("UDP".into()),
            port: 53,
            target_port: Some(IntOrString::String("dns".into())),
            ..ServicePort::default()
        },
        ServicePort {
            name: Some("http".into()),
            protocol: Some("TCP".into()),
            port: 80,
            target_port: Some(IntOrString::Int(5678)),
            ..ServicePort::default()
        },
        ServicePort {
            name: Some("metrics".into()),
            protocol: Some("TCP".into()),
            port: 9090,
            target_port: Some(IntOrString::Int(9090)),
            ..ServicePort::default()
        },
    ];
    for service in &desired.backend_services {
        assert_eq!(service_ports(service), expected.as_slice());
        assert_eq!(service.spec.as_ref().and_then(|s| s.type_.as_deref()), Some("ClusterIP"));
    }
}

/// A Balancer stored without the mutating webhook's defaults (before it ran, or with it
/// off) gets the same children as a defaulted one: `admit` fills the defaults in.
#[test]
fn admit_fills_in_the_defaults_the_webhook_did_not() {
    let mut balancer = sample();
    balancer.spec = BalancerSpec {
        replicas: None,
        session_affinity: None,
        algorithm: None,
        service: None,
        proxy: None,
        canary: None,
        ports: vec![BalancerPort { name: None, protocol: None, port: 8080, target_port: None, ..Default::default() }],
        selector: None,
        backends: vec![BackendSpec {
            name: "a".into(),
            weight: None,
            selector: Some(labels(&[("app", "a")])),
            ..Default::default()
        }],
    };
    let settings = settings();
    let spec = admitted(&balancer, &settings);
    assert_eq!(*spec, with_defaults(&balancer.spec, &settings.policy));
    assert_eq!(spec.replicas(), 2, "the operator's default");
    let built = desired(&owner(&balancer), &spec, &settings);
    let backend_port = &service_ports(&built.backend_services[0])[0];
    assert_eq!(backend_port.target_port, Some(IntOrString::Int(8080)));
    assert_eq!(backend_port.protocol.as_deref(), Some("TCP"));
    assert_eq!(backend_port.name, None, "an unnamed port stays unnamed");
    assert!(built.nginx_conf.contains("weight=1 max_fails=1 fail_timeout=10s;"), "defaults:\n{}", built.nginx_conf);
    assert!(built.nginx_conf.contains("proxy_connect_timeout 5s;\n        proxy_timeout 10m;"), "{}", built.nginx_conf);
    assert_eq!(built.deployment.spec.as_ref().and_then(|s| s.replicas), Some(2));

    let mut defaulted = balancer.clone();
    defaulted.spec = with_defaults(&balancer.spec, &settings.policy);
    let from_defaulted = desired(&owner(&defaulted), &admitted(&defaulted, &settings), &settings);
    assert_eq!(as_json(&built), as_json(&from_defaulted), "the same children as for the defaulted spec");
}

/// `spec.replicas` sizes the proxy; `--proxy-replicas` only stands in when a Balancer does not say.
#[test]
fn the_proxy_has_the_replicas_the_balancer_asks_for() {
    let replicas = |spec_replicas: Option<i32>, default: i32| {
        let mut balancer = sample();
        balancer.spec.replicas = spec_replicas;
        let settings =
            ProxySettings { policy: SpecPolicy { replicas: default, ..SpecPolicy::default() }, ..settings() };
        let spec = admitted(&balancer, &settings);
        let deployment = desired(&owner(&balancer), &spec, &settings).deployment;
        let replicas = deployment.spec.as_ref().and_then(|s| s.replicas);
        assert_eq!(replicas, Some(spec.replicas()), "Admitted::replicas is what the Deployment gets");
        replicas
    };
    assert_eq!(replicas(Some(5), 2), Some(5));
    assert_eq!(replicas(Some(5), 7), Some(5), "the spec wins over the default");
    assert_eq!(replicas(Some(0), 2), Some(0), "scaled to zero");
    assert_eq!(replicas(Some(100), 1), Some(100));
    assert_eq!(replicas(None, 3), Some(3), "the default when the spec does not say");
    assert_eq!(replicas(None, 1), Some(1));
}

/// The scale subresource's `status.selector`: a label selector string that selects exactly
/// the proxy pods (what a HorizontalPodAutoscaler averages its metrics over).
#[test]
fn the_selector_string_selects_the_proxy_pods() {
    let selector = proxy::proxy_selector_string("example-balancer");
    assert_eq!(
        selector,
        "app.kubernetes.io/component=proxy,balancer.exposer.hliangzhao.io/balancer-name=example-balancer"
    );
    let parsed: BTreeMap<String, String> = selector
        .split(',')
        .map(|term| term.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).expect("key=value"))
        .collect();
    assert_eq!(parsed, proxy::proxy_selector("example-balancer"));
    assert!(is_subset(&parsed, pod_labels(&desired_for(&sample()).deployment)));
}

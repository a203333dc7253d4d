//! What the builders' tests share: the sample, the settings, and the desired children of a
//! Balancer with stand-in cluster IPs, read back field by field.

use std::collections::BTreeMap;
use std::net::IpAddr;

use balancer::api::{BackendSpec, Balancer, BalancerPort, BalancerSpec};
use balancer::proxy::{self, BackendTarget, CONFIG_HASH_ANNOTATION, Owner, ProxySettings, ReadyPod};
use balancer::spec::Admitted;
use balancer::spec::with_defaults;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PodSpec, Service, ServicePort};

use crate::support::fixtures::{self, BalancerVariants};

pub(super) const UID: &str = "6a1c3b3e-1f0e-4d2a-9b7c-0123456789ab";

/// The original sample as the API server stores it (v1beta1): defaulted, with a uid.
pub(super) fn sample() -> Balancer {
    fixtures::sample().stored("default", UID).defaulted(&settings().policy)
}

pub(super) fn settings() -> ProxySettings {
    fixtures::proxy_settings(2)
}

/// A Balancer's spec through the pipeline the controller uses.
pub(super) fn admitted(balancer: &Balancer, settings: &ProxySettings) -> Admitted {
    let name = balancer.metadata.name.as_deref().expect("a name");
    fixtures::admitted(name, balancer.spec.clone(), &settings.policy)
}

/// Every child of one Balancer, as the controller applies them.
pub(super) struct Desired {
    pub(super) backend_services: Vec<Service>,
    pub(super) config_map: k8s_openapi::api::core::v1::ConfigMap,
    pub(super) deployment: Deployment,
    pub(super) front_service: Service,
    pub(super) nginx_conf: String,
}

/// Stand-ins for the cluster IPs the API server gives the backend Services: 10.96.0.10, .11, …
pub(super) fn cluster_ips(spec: &BalancerSpec) -> Vec<IpAddr> {
    (0..spec.backends.len()).map(|i| IpAddr::from([10, 96, 0, 10 + i as u8])).collect()
}

/// Each backend of `spec` at its cluster IP in `ips`, with its ready pods in `pods` when given
/// (both in the spec's order).
pub(super) fn targets<'a>(
    spec: &'a Admitted,
    ips: &[IpAddr],
    pods: Option<&[Vec<ReadyPod>]>,
) -> Vec<BackendTarget<'a>> {
    let target = |(i, backend): (usize, &'a BackendSpec)| BackendTarget {
        spec: backend,
        cluster_ip: ips.get(i).copied(),
        ready_pods: pods.map(|pods| pods[i].clone()),
    };
    spec.backends.iter().enumerate().map(target).collect()
}

pub(super) fn desired_with(owner: &Owner, spec: &Admitted, settings: &ProxySettings, ips: &[IpAddr]) -> Desired {
    let proxy = proxy::proxy(owner, spec, settings, &targets(spec, ips, None));
    Desired {
        backend_services: proxy::backend_services(owner, spec),
        config_map: proxy.config_map,
        deployment: proxy.deployment,
        front_service: proxy.front_service,
        nginx_conf: proxy.nginx_conf,
    }
}

pub(super) fn desired(owner: &Owner, spec: &Admitted, settings: &ProxySettings) -> Desired {
    desired_with(owner, spec, settings, &cluster_ips(spec))
}

pub(super) fn owner(balancer: &Balancer) -> Owner {
    Owner::of(balancer).expect("a stored Balancer has an owner identity")
}

pub(super) fn desired_for(balancer: &Balancer) -> Desired {
    let settings = settings();
    desired(&owner(balancer), &admitted(balancer, &settings), &settings)
}

/// The sample with other ports.
pub(super) fn with_ports(ports: Vec<BalancerPort>) -> Balancer {
    let mut balancer = sample();
    balancer.spec.ports = ports;
    balancer.spec = with_defaults(&balancer.spec, &settings().policy);
    balancer
}

pub(super) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

pub(super) fn pod_spec(deployment: &Deployment) -> &PodSpec {
    deployment.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("pod spec")
}

pub(super) fn container(deployment: &Deployment) -> &Container {
    let pod = pod_spec(deployment);
    assert_eq!(pod.containers.len(), 1, "one nginx container");
    &pod.containers[0]
}

pub(super) fn pod_labels(deployment: &Deployment) -> &BTreeMap<String, String> {
    deployment.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).and_then(|m| m.labels.as_ref()).expect("labels")
}

pub(super) fn service_ports(service: &Service) -> &[ServicePort] {
    service.spec.as_ref().and_then(|s| s.ports.as_deref()).expect("ports")
}

pub(super) fn selector(service: &Service) -> &BTreeMap<String, String> {
    service.spec.as_ref().and_then(|s| s.selector.as_ref()).expect("selector")
}

pub(super) fn config_hash(deployment: &Deployment) -> &str {
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION))
        .expect("config-hash annotation")
}

/// Every child and the rendered file, serialized: equal strings, equal output.
pub(super) fn as_json(desired: &Desired) -> String {
    serde_json::to_string(&serde_json::json!({
        "backendServices": desired.backend_services,
        "configMap": desired.config_map,
        "deployment": desired.deployment,
        "frontService": desired.front_service,
        "nginxConf": desired.nginx_conf,
    }))
    .expect("serializes")
}

pub(super) fn is_subset(small: &BTreeMap<String, String>, big: &BTreeMap<String, String>) -> bool {
    small.iter().all(|(k, v)| big.get(k) == Some(v))
}

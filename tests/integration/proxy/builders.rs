//! The pure builders: the children a Balancer owns (`balancer::proxy`) and the
//! `nginx.conf` the proxy reads (`balancer::proxy::nginx`), checked field by field.

use std::collections::BTreeMap;
use std::net::IpAddr;

use balancer::api::v1beta1::{FrontService, ProxySpec};
use balancer::api::{BackendSpec, Balancer, BalancerPort, BalancerSpec, Protocol};
use balancer::proxy::access_log::metrics_port;
use balancer::proxy::model::{Destination, MODEL_FILE, ProxyConfig};
use balancer::proxy::nginx;
use balancer::proxy::upstreams::Upstreams;
use balancer::proxy::{
    self, BACKEND_LABEL, BALANCER_NAME_LABEL, BackendTarget, COMPONENT_LABEL, CONFIG_HASH_ANNOTATION, MANAGED_BY_LABEL,
    Owner, OwnerError, PodPort, ProxySettings, ReadyPod,
};
use balancer::spec::Admitted;
use balancer::spec::{SpecPolicy, with_defaults};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PodSpec, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::support::fixtures::{self, BalancerVariants, backend, port};

const UID: &str = "6a1c3b3e-1f0e-4d2a-9b7c-0123456789ab";

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

/// The original sample as the API server stores it (v1beta1): defaulted, with a uid.
fn sample() -> Balancer {
    fixtures::sample().stored("default", UID).defaulted(&settings().policy)
}

fn settings() -> ProxySettings {
    fixtures::proxy_settings(2)
}

/// A Balancer's spec through the pipeline the controller uses.
fn admitted(balancer: &Balancer, settings: &ProxySettings) -> Admitted {
    let name = balancer.metadata.name.as_deref().expect("a name");
    fixtures::admitted(name, balancer.spec.clone(), &settings.policy)
}

/// Every child of one Balancer, as the controller applies them.
struct Desired {
    backend_services: Vec<Service>,
    config_map: k8s_openapi::api::core::v1::ConfigMap,
    deployment: Deployment,
    front_service: Service,
    nginx_conf: String,
}

/// Stand-ins for the cluster IPs the API server gives the backend Services: 10.96.0.10, .11, …
fn cluster_ips(spec: &BalancerSpec) -> Vec<IpAddr> {
    (0..spec.backends.len()).map(|i| IpAddr::from([10, 96, 0, 10 + i as u8])).collect()
}

/// Each backend of `spec` at its cluster IP in `ips`, with its ready pods in `pods` when given
/// (both in the spec's order).
fn targets<'a>(spec: &'a Admitted, ips: &[IpAddr], pods: Option<&[Vec<ReadyPod>]>) -> Vec<BackendTarget<'a>> {
    let target = |(i, backend): (usize, &'a BackendSpec)| BackendTarget {
        spec: backend,
        cluster_ip: ips.get(i).copied(),
        ready_pods: pods.map(|pods| pods[i].clone()),
    };
    spec.backends.iter().enumerate().map(target).collect()
}

fn desired_with(owner: &Owner, spec: &Admitted, settings: &ProxySettings, ips: &[IpAddr]) -> Desired {
    let proxy = proxy::proxy(owner, spec, settings, &targets(spec, ips, None));
    Desired {
        backend_services: proxy::backend_services(owner, spec),
        config_map: proxy.config_map,
        deployment: proxy.deployment,
        front_service: proxy.front_service,
        nginx_conf: proxy.nginx_conf,
    }
}

fn desired(owner: &Owner, spec: &Admitted, settings: &ProxySettings) -> Desired {
    desired_with(owner, spec, settings, &cluster_ips(spec))
}

fn owner(balancer: &Balancer) -> Owner {
    Owner::of(balancer).expect("a stored Balancer has an owner identity")
}

fn desired_for(balancer: &Balancer) -> Desired {
    let settings = settings();
    desired(&owner(balancer), &admitted(balancer, &settings), &settings)
}

/// The sample with other ports.
fn with_ports(ports: Vec<BalancerPort>) -> Balancer {
    let mut balancer = sample();
    balancer.spec.ports = ports;
    balancer.spec = with_defaults(&balancer.spec, &settings().policy);
    balancer
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn pod_spec(deployment: &Deployment) -> &PodSpec {
    deployment.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("pod spec")
}

fn container(deployment: &Deployment) -> &Container {
    let pod = pod_spec(deployment);
    assert_eq!(pod.containers.len(), 1, "one nginx container");
    &pod.containers[0]
}

fn pod_labels(deployment: &Deployment) -> &BTreeMap<String, String> {
    deployment.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).and_then(|m| m.labels.as_ref()).expect("labels")
}

fn service_ports(service: &Service) -> &[ServicePort] {
    service.spec.as_ref().and_then(|s| s.ports.as_deref()).expect("ports")
}

fn selector(service: &Service) -> &BTreeMap<String, String> {
    service.spec.as_ref().and_then(|s| s.selector.as_ref()).expect("selector")
}

fn config_hash(deployment: &Deployment) -> &str {
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION))
        .expect("config-hash annotation")
}

/// Every child and the rendered file, serialized: equal strings, equal output.
fn as_json(desired: &Desired) -> String {
    serde_json::to_string(&serde_json::json!({
        "backendServices": desired.backend_services,
        "configMap": desired.config_map,
        "deployment": desired.deployment,
        "frontService": desired.front_service,
        "nginxConf": desired.nginx_conf,
    }))
    .expect("serializes")
}

fn is_subset(small: &BTreeMap<String, String>, big: &BTreeMap<String, String>) -> bool {
    small.iter().all(|(k, v)| big.get(k) == Some(v))
}

// ---------------------------------------------------------------------------
// Owner
// ---------------------------------------------------------------------------

#[test]
fn owner_reference_is_the_controller_reference_of_the_balancer() {
    let owner = owner(&sample());
    assert_eq!(owner.name, "example-balancer");
    assert_eq!(owner.namespace, "default");
    let reference = &owner.reference;
    assert_eq!(reference.api_version, "exposer.hliangzhao.io/v1beta1", "the storage version");
    assert_eq!(reference.kind, "Balancer");
    assert_eq!(reference.name, "example-balancer");
    assert_eq!(reference.uid, UID);
    assert_eq!(reference.controller, Some(true));
}

/// `Owner::of` promises `blockOwnerDeletion` (so do the README and `balancer render`,
/// which writes `blockOwnerDeletion: true`), but it takes kube's `controller_owner_ref`,
/// which sets only `controller: true` and leaves `blockOwnerDeletion` unset.
#[test]
fn owner_reference_blocks_owner_deletion() {
    let balancer = sample();
    assert_eq!(owner(&balancer).reference.block_owner_deletion, Some(true));
    let desired = desired_for(&balancer);
    for meta in desired.backend_services.iter().map(|s| &s.metadata).chain([&desired.deployment.metadata]) {
        let reference = &meta.owner_references.as_ref().expect("ownerReferences")[0];
        assert_eq!(reference.block_owner_deletion, Some(true), "{:?}", meta.name);
    }
}

#[test]
fn owner_requires_name_namespace_and_uid() {
    let mut no_name = sample();
    no_name.metadata.name = None;
    assert_eq!(Owner::of(&no_name).unwrap_err(), OwnerError::MissingName);

    let mut no_namespace = sample();
    no_namespace.metadata.namespace = None;
    assert_eq!(Owner::of(&no_namespace).unwrap_err(), OwnerError::MissingNamespace);

    let mut no_uid = sample();
    no_uid.metadata.uid = None;
    assert_eq!(Owner::of(&no_uid).unwrap_err(), OwnerError::MissingUid);
}

#[test]
fn every_child_points_back_to_the_balancer() {
    let balancer = sample();
    let desired = desired_for(&balancer);
    let expected = vec![owner(&balancer).reference];
    let metas = desired.backend_services.iter().map(|s| &s.metadata).chain([
        &desired.config_map.metadata,
        &desired.deployment.metadata,
        &desired.front_service.metadata,
    ]);
    for meta in metas {
        assert_eq!(meta.owner_references.as_ref(), Some(&expected), "{:?}", meta.name);
        assert_eq!(meta.namespace.as_deref(), Some("default"), "{:?}", meta.name);
    }
}

// ---------------------------------------------------------------------------
// Names and labels
// ---------------------------------------------------------------------------

#[test]
fn children_are_named_after_the_balancer() {
    let desired = desired_for(&sample());
    let backend_names: Vec<_> =
        desired.backend_services.iter().map(|s| s.metadata.name.clone().expect("name")).collect();
    assert_eq!(
        backend_names,
        ["example-balancer-v1-backend", "example-balancer-v2-backend", "example-balancer-v3-backend"]
    );
    assert_eq!(desired.deployment.metadata.name.as_deref(), Some("example-balancer-proxy"));
    assert_eq!(desired.config_map.metadata.name.as_deref(), Some("example-balancer-proxy-configmap"));
    assert_eq!(desired.front_service.metadata.name.as_deref(), Some("example-balancer"));
}

#[test]
fn children_carry_managed_by_balancer_name_and_component_labels() {
    let desired = desired_for(&sample());
    let common = |component: &str| {
        labels(&[
            (MANAGED_BY_LABEL, "balancer"),
            (BALANCER_NAME_LABEL, "example-balancer"),
            (COMPONENT_LABEL, component),
        ])
    };
    assert_eq!(MANAGED_BY_LABEL, "app.kubernetes.io/managed-by");
    assert_eq!(COMPONENT_LABEL, "app.kubernetes.io/component");
    assert_eq!(BALANCER_NAME_LABEL, "balancer.exposer.hliangzhao.io/balancer-name");
    for (service, backend) in desired.backend_services.iter().zip(["v1", "v2", "v3"]) {
        let mut expected = common("backend");
        expected.insert(BACKEND_LABEL.into(), backend.into());
        assert_eq!(service.metadata.labels.as_ref(), Some(&expected));
    }
    assert_eq!(desired.config_map.metadata.labels.as_ref(), Some(&common("proxy")));
    assert_eq!(desired.deployment.metadata.labels.as_ref(), Some(&common("proxy")));
    assert_eq!(pod_labels(&desired.deployment), &common("proxy"));
    assert_eq!(desired.front_service.metadata.labels.as_ref(), Some(&common("frontend")));
}

// ---------------------------------------------------------------------------
// Backend Services
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Front Service and Deployment
// ---------------------------------------------------------------------------

#[test]
fn front_service_selects_exactly_this_balancers_proxy_pods() {
    let desired = desired_for(&sample());
    let front = selector(&desired.front_service);
    assert_eq!(front, &proxy::proxy_selector("example-balancer"));
    assert_eq!(front, &labels(&[(BALANCER_NAME_LABEL, "example-balancer"), (COMPONENT_LABEL, "proxy")]));
    assert!(is_subset(front, pod_labels(&desired.deployment)), "selects the proxy pods");

    // Not another Balancer's proxy pods, not its own backends' pods.
    let mut other = sample();
    other.metadata.name = Some("example-balancer-2".into());
    assert!(!is_subset(front, pod_labels(&desired_for(&other).deployment)));
    for backend in &desired.backend_services {
        assert!(!is_subset(front, selector(backend)));
    }
}

#[test]
fn front_service_ports_target_the_proxy_container_ports() {
    let mut named = port(Some("dns"), "UDP", 53);
    named.target_port = Some(IntOrString::String("dns".into()));
    let mut http = port(Some("http"), "TCP", 80);
    http.target_port = Some(IntOrString::Int(5678));
    let balancer = with_ports(vec![named, http, port(Some("dns-tcp"), "TCP", 53)]);
    let desired = desired_for(&balancer);
    let front: Vec<_> = service_ports(&desired.front_service)
        .iter()
        .map(|p| {
            (p.name.clone().unwrap_or_default(), p.protocol.clone().unwrap_or_default(), p.port, p.target_port.clone())
        })
        .collect();
    assert_eq!(
        front,
        vec![
            ("dns".into(), "UDP".into(), 53, Some(IntOrString::Int(53))),
            ("http".into(), "TCP".into(), 80, Some(IntOrString::Int(80))),
            ("dns-tcp".into(), "TCP".into(), 53, Some(IntOrString::Int(53))),
        ],
        "the proxy listens on the Balancer port; the named/backend targetPort is the backend Services' business"
    );
    let container_ports: Vec<_> = container(&desired.deployment)
        .ports
        .as_ref()
        .expect("container ports")
        .iter()
        .map(|p| (p.container_port, p.protocol.clone().unwrap_or_default()))
        .collect();
    assert_eq!(container_ports, vec![(53, "UDP".to_string()), (80, "TCP".into()), (53, "TCP".into())]);
    assert_eq!(desired.front_service.spec.as_ref().and_then(|s| s.type_.as_deref()), Some("ClusterIP"));
}

#[test]
fn deployment_selector_is_a_subset_of_its_pod_template_labels() {
    for name in ["example-balancer", "a", "with-dashes-1"] {
        let mut balancer = sample();
        balancer.metadata.name = Some(name.into());
        let deployment = desired_for(&balancer).deployment;
        let spec = deployment.spec.as_ref().expect("spec");
        let selector = spec.selector.match_labels.as_ref().expect("matchLabels");
        assert!(spec.selector.match_expressions.is_none());
        assert_eq!(selector, &proxy::proxy_selector(name));
        assert!(is_subset(selector, pod_labels(&deployment)), "{selector:?} ⊄ {:?}", pod_labels(&deployment));
        assert_eq!(spec.replicas, Some(2));
    }
}

#[test]
fn proxy_container_runs_the_configured_image_with_nginx_args() {
    let desired = desired_for(&sample());
    let nginx = container(&desired.deployment);
    assert_eq!(nginx.image.as_deref(), Some("nginxinc/nginx-unprivileged:1.28.0-alpine"));
    let script = proxy::nginx::entrypoint(&proxy::nginx::POD_FILES);
    let entrypoint = ["/bin/sh", "-c", &script, "nginx"].map(String::from).to_vec();
    assert_eq!(nginx.command, Some(entrypoint));
    // The copy the entrypoint makes of the mounted file (see tests/integration/proxy/entrypoint.rs).
    assert_eq!(
        nginx.args,
        Some(
            ["-c", "/tmp/nginx.conf", "-e", "stderr", "-g", "daemon off; pid /tmp/nginx.pid;"]
                .map(String::from)
                .to_vec()
        )
    );
    assert_eq!(nginx.args, Some(proxy::nginx::nginx_args()));
}

#[test]
fn the_config_map_is_mounted_where_the_entrypoint_reads_it() {
    let desired = desired_for(&sample());
    let nginx = container(&desired.deployment);
    let args = nginx.args.as_ref().expect("args");
    // nginx runs the entrypoint's copy, in the writable /tmp, of the mounted file.
    let conf_path = &args[args.iter().position(|a| a == "-c").expect("-c") + 1];
    assert_eq!(conf_path, nginx::POD_FILES.running);
    assert!(conf_path.starts_with("/tmp/"), "{conf_path}");
    let (dir, file) = nginx::POD_FILES.mounted.rsplit_once('/').expect("absolute path");

    let mount = nginx
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == dir)
        .unwrap_or_else(|| panic!("nothing mounted at {dir}: {:?}", nginx.volume_mounts));
    assert_eq!(mount.read_only, Some(true));
    assert!(mount.sub_path.is_none());
    let volume = pod_spec(&desired.deployment)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .expect("the mounted volume exists");
    let source = volume.config_map.as_ref().expect("a ConfigMap volume");
    assert_eq!(Some(&source.name), desired.config_map.metadata.name.as_ref());
    assert!(source.items.is_none(), "every key is projected as a file");
    assert_eq!(file, nginx::CONFIG_FILE);
    let data = desired.config_map.data.as_ref().expect("data");
    assert_eq!(data.keys().collect::<Vec<_>>(), [file, MODEL_FILE], "the file and its model");
    assert_eq!(data[file], desired.nginx_conf);

    // The pid file goes to /tmp, a writable emptyDir under the read-only root filesystem.
    let directives = &args[args.iter().position(|a| a == "-g").expect("-g") + 1];
    assert!(directives.contains("pid /tmp/nginx.pid;"), "{directives}");
    let tmp = nginx.volume_mounts.iter().flatten().find(|m| m.mount_path == "/tmp").expect("/tmp mounted");
    assert_ne!(tmp.read_only, Some(true));
    let tmp_volume =
        pod_spec(&desired.deployment).volumes.iter().flatten().find(|v| v.name == tmp.name).expect("volume");
    assert!(tmp_volume.empty_dir.is_some());
}

#[test]
fn proxy_is_locked_down() {
    let desired = desired_for(&sample());
    let pod = pod_spec(&desired.deployment);
    let pod_security = pod.security_context.as_ref().expect("pod securityContext");
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(pod_security.run_as_user, Some(101));
    assert_eq!(pod_security.run_as_group, Some(101));
    let seccomp = pod_security.seccomp_profile.as_ref().expect("seccomp");
    assert_eq!(seccomp.type_, "RuntimeDefault");
    assert_eq!(pod.automount_service_account_token, Some(false));

    let security = container(&desired.deployment).security_context.as_ref().expect("container securityContext");
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.privileged, None);
    let capabilities = security.capabilities.as_ref().expect("capabilities");
    assert_eq!(capabilities.drop, Some(vec!["ALL".to_string()]));
    assert_eq!(capabilities.add, None);
}

#[test]
fn unprivileged_port_sysctl_only_for_ports_below_1024() {
    let sysctls = |ports: Vec<BalancerPort>| {
        let deployment = desired_for(&with_ports(ports)).deployment;
        pod_spec(&deployment).security_context.as_ref().and_then(|s| s.sysctls.clone())
    };
    let expected = Some(vec![k8s_openapi::api::core::v1::Sysctl {
        name: "net.ipv4.ip_unprivileged_port_start".into(),
        value: "0".into(),
    }]);
    assert_eq!(sysctls(vec![port(None, "TCP", 80)]), expected, "the sample's port 80");
    assert_eq!(sysctls(vec![port(None, "TCP", 1023)]), expected);
    assert_eq!(sysctls(vec![port(Some("a"), "TCP", 8080), port(Some("b"), "UDP", 53)]), expected, "any low port");
    assert_eq!(sysctls(vec![port(None, "TCP", 1024)]), None);
    assert_eq!(sysctls(vec![port(Some("a"), "TCP", 8080), port(Some("b"), "UDP", 65535)]), None);
}

#[test]
fn readiness_probes_the_first_tcp_port_or_checks_the_config_when_udp_only() {
    let probe = |ports: Vec<BalancerPort>| {
        container(&desired_for(&with_ports(ports)).deployment).readiness_probe.clone().expect("readiness probe")
    };
    let mixed = probe(vec![port(Some("dns"), "UDP", 53), port(Some("a"), "TCP", 8080), port(Some("b"), "TCP", 9090)]);
    assert_eq!(mixed.tcp_socket.as_ref().map(|t| t.port.clone()), Some(IntOrString::Int(8080)));
    assert!(mixed.tcp_socket.as_ref().is_some_and(|t| t.host.is_none()), "the pod's own IP");
    assert!(mixed.exec.is_none() && mixed.http_get.is_none());
    assert_eq!(mixed.period_seconds, Some(5));
    assert_eq!(mixed.failure_threshold, Some(3));

    let udp_only = probe(vec![port(Some("dns"), "UDP", 53), port(Some("syslog"), "UDP", 514)]);
    assert!(udp_only.tcp_socket.is_none());
    let command = udp_only.exec.as_ref().and_then(|e| e.command.clone()).expect("exec probe");
    // nginx runs (its pid file, which the entrypoint removes first, is there), and accepts the
    // file; every argument, the pid file's path included: the default one is on the read-only root.
    let expected = [
        "/bin/sh",
        "-c",
        r#"test -s /tmp/nginx.pid && exec nginx -t -q "$@""#,
        "nginx",
        "-c",
        "/tmp/nginx.conf",
        "-e",
        "stderr",
        "-g",
        "daemon off; pid /tmp/nginx.pid;",
    ];
    assert_eq!(command, expected.map(String::from));

    // A port that requires a PROXY protocol header is not probed with a bare connection.
    let mut behind_a_load_balancer = port(Some("nlb"), "TCP", 8443);
    behind_a_load_balancer.accept_proxy_protocol = Some(true);
    let skipped = probe(vec![behind_a_load_balancer.clone(), port(Some("plain"), "TCP", 80)]);
    assert_eq!(skipped.tcp_socket.map(|t| t.port), Some(IntOrString::Int(80)));
    let only = probe(vec![behind_a_load_balancer]);
    assert!(only.tcp_socket.is_none());
    assert_eq!(only.exec.and_then(|e| e.command), Some(expected.map(String::from).to_vec()));
}

// ---------------------------------------------------------------------------
// nginx.conf
// ---------------------------------------------------------------------------

#[test]
fn golden_nginx_conf_for_the_original_sample() {
    let desired = desired_for(&sample());
    let expected = r#"# Generated by balancer for Balancer "example-balancer". Do not edit: changes are overwritten.
worker_processes 2;
worker_shutdown_timeout 1h;

events {
    worker_connections 4096;
}

stream {
    upstream port_80_tcp {
        zone port_80_tcp 512k;
        server 10.96.0.10:80 weight=40 max_fails=1 fail_timeout=10s;  # example-balancer-v1-backend
        server 10.96.0.11:80 weight=20 max_fails=1 fail_timeout=10s;  # example-balancer-v2-backend
        server 10.96.0.12:80 weight=40 max_fails=1 fail_timeout=10s;  # example-balancer-v3-backend
    }

    server {
        listen 80;
        listen [::]:80;
        proxy_connect_timeout 5s;
        proxy_timeout 10m;
        proxy_pass port_80_tcp;
    }
}
"#;
    assert_eq!(desired.nginx_conf, expected);
}

#[test]
fn udp_ports_listen_udp_and_weight_zero_is_down() {
    let mut balancer = with_ports(vec![port(Some("dns-udp"), "UDP", 53), port(Some("dns-tcp"), "TCP", 53)]);
    balancer.spec.backends[1].weight = Some(0);
    let conf = desired_for(&balancer).nginx_conf;
    let expected_stream = r#"stream {
    upstream port_53_udp {
        zone port_53_udp 512k;
        server 10.96.0.10:53 weight=40 max_fails=1 fail_timeout=10s;  # example-balancer-v1-backend
        server 10.96.0.11:53 down;  # example-balancer-v2-backend
        server 10.96.0.12:53 weight=40 max_fails=1 fail_timeout=10s;  # example-balancer-v3-backend
    }

    server {
        listen 53 udp;
        listen [::]:53 udp;
        proxy_responses 1;
        proxy_connect_timeout 5s;
        proxy_timeout 10s;
        proxy_pass port_53_udp;
    }

    upstream port_53_tcp {
        zone port_53_tcp 512k;
        server 10.96.0.10:53 weight=40 max_fails=1 fail_timeout=10s;  # example-balancer-v1-backend
        server 10.96.0.11:53 down;  # example-balancer-v2-backend
        server 10.96.0.12:53 weight=40 max_fails=1 fail_timeout=10s;  # example-balancer-v3-backend
    }

    server {
        listen 53;
        listen [::]:53;
        proxy_connect_timeout 5s;
        proxy_timeout 10m;
        proxy_pass port_53_tcp;
    }
}
"#;
    assert!(conf.ends_with(expected_stream), "{conf}");
    assert!(!conf.contains("weight=0"), "nginx rejects weight=0:\n{conf}");

    // UDP also in the Services and the container.
    let desired = desired_for(&balancer);
    for service in desired.backend_services.iter().chain([&desired.front_service]) {
        let protocols: Vec<_> = service_ports(service).iter().map(|p| p.protocol.as_deref()).collect();
        assert_eq!(protocols, [Some("UDP"), Some("TCP")]);
    }
}

#[test]
fn nginx_conf_sends_traffic_to_the_backend_cluster_ips_and_names_the_services() {
    let conf = desired_for(&sample()).nginx_conf;
    let servers: Vec<&str> = conf.lines().map(str::trim).filter(|l| l.starts_with("server 10.")).collect();
    assert_eq!(
        servers,
        [
            "server 10.96.0.10:80 weight=40 max_fails=1 fail_timeout=10s;  # example-balancer-v1-backend",
            "server 10.96.0.11:80 weight=20 max_fails=1 fail_timeout=10s;  # example-balancer-v2-backend",
            "server 10.96.0.12:80 weight=40 max_fails=1 fail_timeout=10s;  # example-balancer-v3-backend",
        ],
        "{conf}"
    );
    assert!(!conf.contains(".svc"), "no name for nginx to resolve:\n{conf}");
}

#[test]
fn ipv6_cluster_ips_are_bracketed() {
    let balancer = sample();
    let ips: Vec<IpAddr> = ["fd00::a", "fd00::b", "fd00::c"].map(|ip| ip.parse().unwrap()).into();
    let settings = settings();
    let conf = desired_with(&owner(&balancer), &admitted(&balancer, &settings), &settings, &ips).nginx_conf;
    assert!(conf.contains("server [fd00::b]:80 weight=20 "), "{conf}");
}

#[test]
fn an_offline_preview_names_the_backend_services() {
    let mut balancer = sample();
    balancer.metadata.namespace = Some("edge".into());
    let settings = settings();
    let spec = admitted(&balancer, &settings);
    let proxy = proxy::proxy(&owner(&balancer), &spec, &settings, &BackendTarget::previews(&spec));
    assert!(
        proxy.nginx_conf.contains("server example-balancer-v2-backend.edge.svc:80 weight=20 "),
        "{}",
        proxy.nginx_conf
    );
}

#[test]
fn load_modules_come_first() {
    let settings =
        ProxySettings { load_modules: vec!["/usr/lib/nginx/modules/ngx_stream_module.so".into()], ..settings() };
    let balancer = sample();
    let conf = desired(&owner(&balancer), &admitted(&balancer, &settings), &settings).nginx_conf;
    let directives: Vec<&str> = conf.lines().filter(|l| !l.starts_with('#')).take(2).collect();
    assert_eq!(directives, ["load_module /usr/lib/nginx/modules/ngx_stream_module.so;", "worker_processes 2;"]);
}

/// A stopping proxy pod drops no connection: it keeps serving while it leaves the endpoints
/// (at least 5 s, on while new connections still arrive, at most 30 s), then nginx quits
/// gracefully, then the metrics sidecar stops, within a grace period that covers all three.
#[test]
fn proxy_pods_stop_gracefully() {
    use proxy::stop::{PROXY_STOP_WAIT, StopWait, TCP_COUNTERS, pre_stop_script};
    let desired = desired_for(&sample());
    let nginx = container(&desired.deployment);
    let hook = nginx.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).and_then(|h| h.exec.as_ref());
    let command = hook.and_then(|e| e.command.clone()).expect("a preStop exec hook");
    assert_eq!(command, ["/bin/sh".to_string(), "-c".into(), pre_stop_script(TCP_COUNTERS, PROXY_STOP_WAIT)]);
    assert_eq!(PROXY_STOP_WAIT, StopWait { min: 5, quiet: 3, max: 30 });
    let script = proxy::nginx::entrypoint(&proxy::nginx::POD_FILES);
    let quit = "trap 'kill -QUIT \"$nginx\"; { sleep 20; kill -TERM \"$nginx\"; } 2>/dev/null & wait \"$nginx\"; exit $?' TERM";
    assert!(script.ends_with(&format!("{quit}\nnginx \"$@\" & nginx=$!\nwait \"$nginx\"")), "{script}");
    let live = proxy::reload::live_entrypoint(&proxy::reload::LIVE_POD_FILES, proxy::reload::RELOAD_POLICY);
    assert!(live.contains(&format!("\n{quit}\n")), "{live}");
    // Connections opened before a configuration change live an hour; a stopping pod closes them
    // after 20 s.
    assert!(desired.nginx_conf.contains("\nworker_shutdown_timeout 1h;\n"), "{}", desired.nginx_conf);
    let grace = pod_spec(&desired.deployment).termination_grace_period_seconds;
    assert_eq!(grace, Some(65), "30 s of stop wait + 20 s of nginx's drain + 10 s of the sidecar's + 5 s to spare");
}

#[test]
fn render_uses_the_given_addresses_in_spec_order() {
    let spec = sample().spec;
    let address = |b: &BackendSpec, p: &BalancerPort| Destination::Name {
        host: format!("{}.test", b.name),
        port: u16::try_from(p.port + 1).expect("a port"),
    };
    let conf = nginx::render("x", &fixtures::admitted("x", spec, &SpecPolicy::default()), &[], None, &address);
    let servers: Vec<&str> = conf
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("server ") && l.contains(".test"))
        .filter_map(|l| l.split("  #").next())
        .collect();
    assert_eq!(
        servers,
        [
            "server v1.test:81 weight=40 max_fails=1 fail_timeout=10s;",
            "server v2.test:81 weight=20 max_fails=1 fail_timeout=10s;",
            "server v3.test:81 weight=40 max_fails=1 fail_timeout=10s;"
        ]
    );
}

// ---------------------------------------------------------------------------
// Determinism and the config hash
// ---------------------------------------------------------------------------

#[test]
fn output_is_deterministic() {
    let balancer = sample();
    let spec = &admitted(&balancer, &settings());
    let address = fixtures::named;
    assert_eq!(
        nginx::render("example-balancer", spec, &[], None, &address),
        nginx::render("example-balancer", spec, &[], None, &address)
    );
    let first = as_json(&desired_for(&balancer));
    let second = as_json(&desired_for(&sample()));
    assert_eq!(first, second);
}

#[test]
fn config_hash_is_hex_sha256() {
    assert_eq!(nginx::config_hash(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_eq!(nginx::config_hash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

#[test]
fn config_hash_annotation_is_the_hash_of_nginx_conf() {
    let desired = desired_for(&sample());
    assert_eq!(config_hash(&desired.deployment), nginx::config_hash(&desired.nginx_conf));
    assert_eq!(config_hash(&desired.deployment).len(), 64);
}

#[test]
fn config_hash_changes_exactly_when_nginx_conf_changes() {
    let base = desired_for(&sample());
    type Change = fn(&mut Balancer, &mut ProxySettings, &mut Vec<IpAddr>);
    // (change, whether it changes nginx.conf)
    let changes: [(&str, Change, bool); 16] = [
        ("weight", |b, _, _| b.spec.backends[0].weight = Some(41), true),
        ("weight to 0", |b, _, _| b.spec.backends[1].weight = Some(0), true),
        ("backend added", |b, _, _| b.spec.backends.push(backend("v4", 1)), true),
        ("backend renamed", |b, _, _| b.spec.backends[2].name = "v9".into(), true),
        ("port number", |b, _, _| b.spec.ports[0].port = 8080, true),
        ("protocol", |b, _, _| b.spec.ports[0].protocol = Some("UDP".into()), true),
        ("backend cluster IP", |_, _, ips| ips[1] = IpAddr::from([10, 96, 7, 7]), true),
        ("module loaded", |_, s, _| s.load_modules = vec!["/m.so".into()], true),
        ("namespace", |b, _, _| b.metadata.namespace = Some("other".into()), false),
        ("proxy image", |_, s, _| s.image = "nginx:1.29".into(), false),
        ("replicas", |b, _, _| b.spec.replicas = Some(5), false),
        ("scaled to zero", |b, _, _| b.spec.replicas = Some(0), false),
        ("default replicas", |b, s, _| (b.spec.replicas, s.policy.replicas) = (None, 5), false),
        ("selector", |b, _, _| b.spec.selector = Some(labels(&[("app", "other")])), false),
        ("targetPort", |b, _, _| b.spec.ports[0].target_port = Some(IntOrString::String("web".into())), false),
        ("port name", |b, _, _| b.spec.ports[0].name = Some("web".into()), false),
    ];
    for (what, change, changes_conf) in changes {
        let mut balancer = sample();
        let mut settings = settings();
        // One IP more than the sample has backends, for the one added.
        let mut ips: Vec<IpAddr> = (0..4).map(|i| IpAddr::from([10, 96, 0, 10 + i])).collect();
        change(&mut balancer, &mut settings, &mut ips);
        let desired = desired_with(&owner(&balancer), &admitted(&balancer, &settings), &settings, &ips);
        let conf_changed = desired.nginx_conf != base.nginx_conf;
        let hash_changed = config_hash(&desired.deployment) != config_hash(&base.deployment);
        assert_eq!(conf_changed, changes_conf, "{what}: nginx.conf changed = {conf_changed}");
        assert_eq!(hash_changed, conf_changed, "{what}: the hash follows nginx.conf");
        assert_eq!(config_hash(&desired.deployment), nginx::config_hash(&desired.nginx_conf), "{what}");
    }
    // The image change still reaches the Deployment, just without a config roll.
    let mut settings = settings();
    settings.image = "nginx:1.29".into();
    let desired = desired(&owner(&sample()), &admitted(&sample(), &settings), &settings);
    assert_eq!(container(&desired.deployment).image.as_deref(), Some("nginx:1.29"));
    // So does a replica count, by the Deployment's own field.
    let mut scaled = sample();
    scaled.spec.replicas = Some(5);
    let scaled = self::desired(&owner(&scaled), &admitted(&scaled, &settings), &settings);
    assert_eq!(scaled.deployment.spec.as_ref().and_then(|s| s.replicas), Some(5));
}

/// Losing a node loses one proxy replica at most, and a single node still runs them all.
#[test]
fn proxy_pods_spread_across_nodes() {
    let desired = desired_for(&sample());
    let spread = pod_spec(&desired.deployment).topology_spread_constraints.clone().expect("a spread constraint");
    assert_eq!(spread.len(), 1);
    assert_eq!(
        (spread[0].max_skew, spread[0].topology_key.as_str(), spread[0].when_unsatisfiable.as_str()),
        (1, "kubernetes.io/hostname", "ScheduleAnyway")
    );
    let selector = spread[0].label_selector.as_ref().and_then(|s| s.match_labels.clone());
    assert_eq!(selector, desired.deployment.spec.as_ref().and_then(|s| s.selector.match_labels.clone()));
}

/// `spec.service` shapes the front Service only: type, chosen node ports, the LoadBalancer
/// settings and the annotations; the backend Services stay ClusterIP without node ports.
#[test]
fn the_front_service_is_exposed_as_spec_service_says() {
    let mut balancer = with_ports(vec![port(Some("http"), "TCP", 80), port(Some("dns"), "UDP", 53)]);
    balancer.spec.ports[0].node_port = Some(30080);
    balancer.spec.service = Some(FrontService {
        type_: Some("LoadBalancer".into()),
        load_balancer_class: Some("example.com/internal".into()),
        external_traffic_policy: Some("Local".into()),
        load_balancer_source_ranges: Some(vec!["10.0.0.0/8".into()]),
        annotations: Some(BTreeMap::from([("example.com/lb-scheme".into(), "internal".into())])),
    });
    let desired = desired_for(&balancer);
    let front = desired.front_service.spec.as_ref().expect("a spec");
    assert_eq!(front.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(front.load_balancer_class.as_deref(), Some("example.com/internal"));
    assert_eq!(front.external_traffic_policy.as_deref(), Some("Local"));
    assert_eq!(front.load_balancer_source_ranges, Some(vec!["10.0.0.0/8".to_string()]));
    let node_ports: Vec<Option<i32>> = service_ports(&desired.front_service).iter().map(|p| p.node_port).collect();
    assert_eq!(node_ports, [Some(30080), None], "the other is the API server's to allocate");
    let annotations = desired.front_service.metadata.annotations.as_ref().expect("annotations");
    assert_eq!(annotations.get("example.com/lb-scheme").map(String::as_str), Some("internal"));
    for backend in &desired.backend_services {
        let spec = backend.spec.as_ref().expect("a spec");
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert!(spec.ports.iter().flatten().all(|p| p.node_port.is_none()));
        assert!(backend.metadata.annotations.is_none());
    }

    // The default: ClusterIP, no node port, no annotation.
    balancer.spec.service = None;
    balancer.spec.ports[0].node_port = None;
    let desired = desired_for(&balancer);
    let front = desired.front_service.spec.as_ref().expect("a spec");
    assert_eq!(front.type_.as_deref(), Some("ClusterIP"));
    assert!(service_ports(&desired.front_service).iter().all(|p| p.node_port.is_none()));
    assert_eq!(
        (front.external_traffic_policy.as_ref(), desired.front_service.metadata.annotations.as_ref()),
        (None, None)
    );
}

/// `spec.proxy` goes into the proxy pods as it is: image, resources, placement, priority and
/// annotations (the config hash stays the operator's); unset, the defaults stand.
#[test]
fn the_proxy_pods_are_shaped_as_spec_proxy_says() {
    use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let mut balancer = with_ports(vec![port(Some("http"), "TCP", 80)]);
    let defaults = desired_for(&balancer);
    let default_pod = pod_spec(&defaults.deployment).clone();
    let requests = BTreeMap::from([("cpu".to_string(), Quantity("250m".into()))]);
    let spread = TopologySpreadConstraint {
        max_skew: 2,
        topology_key: "topology.kubernetes.io/zone".into(),
        when_unsatisfiable: "DoNotSchedule".into(),
        ..TopologySpreadConstraint::default()
    };
    balancer.spec.proxy = Some(ProxySpec {
        image: Some("registry.example.com/nginx/stream:1".into()),
        resources: Some(ResourceRequirements { requests: Some(requests.clone()), ..Default::default() }),
        node_selector: Some(BTreeMap::from([("kubernetes.io/os".into(), "linux".into())])),
        tolerations: Some(vec![Toleration {
            key: Some("dedicated".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }]),
        affinity: Some(Affinity::default()),
        topology_spread_constraints: Some(vec![spread.clone()]),
        priority_class_name: Some("system-cluster-critical".into()),
        upstreams: None,
        pod_annotations: Some(BTreeMap::from([
            ("example.com/scrape".into(), "true".into()),
            (CONFIG_HASH_ANNOTATION.into(), "mine".into()),
        ])),
        drain_timeout: Some("8h".into()),
    });
    let mut settings = settings();
    settings.policy.allowed_images = vec!["registry.example.com/nginx/".into()];
    let desired = desired(&owner(&balancer), &admitted(&balancer, &settings), &settings);
    let pod = pod_spec(&desired.deployment);
    let nginx = container(&desired.deployment);
    assert_eq!(nginx.image.as_deref(), Some("registry.example.com/nginx/stream:1"));
    assert_eq!(nginx.resources.as_ref().and_then(|r| r.requests.clone()), Some(requests));
    assert_eq!(pod.node_selector.as_ref().map(|s| s.len()), Some(1));
    assert_eq!(pod.tolerations.as_ref().map(Vec::len), Some(1));
    assert_eq!(pod.affinity, Some(Affinity::default()));
    assert_eq!(pod.topology_spread_constraints, Some(vec![spread]), "replaces the default spread");
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-cluster-critical"));
    let template = desired.deployment.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).expect("metadata");
    let annotations = template.annotations.as_ref().expect("annotations");
    assert_eq!(annotations.get("example.com/scrape").map(String::as_str), Some("true"));
    let hash = nginx::config_hash(&desired.nginx_conf);
    assert_eq!(annotations.get(CONFIG_HASH_ANNOTATION), Some(&hash), "the controller's, not the user's");
    assert!(desired.nginx_conf.contains("\nworker_shutdown_timeout 8h;\n"), "{}", desired.nginx_conf);
    // Unset: the operator's image, requests, spread; no placement of its own.
    assert_eq!(container(&defaults.deployment).image.as_deref(), Some(settings.image.as_str()));
    assert!(default_pod.node_selector.is_none() && default_pod.tolerations.is_none() && default_pod.affinity.is_none());
    assert_eq!(
        default_pod.topology_spread_constraints.as_ref().map(|t| t[0].topology_key.as_str()),
        Some("kubernetes.io/hostname")
    );
}

// ---------------------------------------------------------------------------
// The metrics sidecar
// ---------------------------------------------------------------------------

fn with_sidecar() -> ProxySettings {
    ProxySettings { metrics_image: Some("registry.example.com/balancer:1.2".into()), ..settings() }
}

#[test]
fn without_a_metrics_image_the_proxy_has_no_sidecar_and_logs_nothing() {
    let desired = desired_for(&sample());
    assert_eq!(pod_spec(&desired.deployment).containers.len(), 1);
    assert_eq!(pod_spec(&desired.deployment).init_containers, None);
    assert!(!desired.nginx_conf.contains("access_log"), "{}", desired.nginx_conf);
}

#[test]
fn the_metrics_sidecar_runs_balancers_image_as_strictly_as_the_proxy() {
    let balancer = sample();
    let settings = with_sidecar();
    let desired = desired(&owner(&balancer), &admitted(&balancer, &settings), &settings);
    let pod = pod_spec(&desired.deployment);
    let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["nginx"]);
    let init: Vec<&str> = pod.init_containers.iter().flatten().map(|c| c.name.as_str()).collect();
    assert_eq!(init, [proxy::METRICS_CONTAINER], "a native sidecar: starts before nginx, stops after it");
    let (nginx, sidecar) = (&pod.containers[0], &pod.init_containers.as_ref().unwrap()[0]);
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    assert_eq!(sidecar.image.as_deref(), Some("registry.example.com/balancer:1.2"));
    assert_eq!(sidecar.command.as_deref(), Some(&["/balancer".to_string()][..]));
    assert_eq!(
        sidecar.args.as_deref().unwrap_or_default(),
        [
            "proxy-metrics",
            "--configmap=example-balancer-proxy-configmap",
            "--live-dir=/run/balancer",
            "--listen=[::]:9113",
            "--log-file=/var/log/balancer/access.log",
            "--drain=10s"
        ]
    );
    assert_eq!(sidecar.security_context, nginx.security_context, "as strict as the proxy");
    let port = &sidecar.ports.as_ref().unwrap()[0];
    assert_eq!((port.name.as_deref(), port.container_port), (Some(proxy::METRICS_PORT_NAME), 9113));
    let limits = sidecar.resources.as_ref().and_then(|r| r.limits.as_ref()).expect("limits");
    assert!(limits.contains_key("memory"));
    assert!(sidecar.readiness_probe.is_none() && sidecar.liveness_probe.is_none(), "never gates the proxy");
    let mounts: Vec<(&str, &str, Option<bool>)> =
        sidecar.volume_mounts.iter().flatten().map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only)).collect();
    assert_eq!(
        mounts,
        [
            ("live", "/run/balancer", None),
            ("token", proxy::TOKEN_DIR, Some(true)),
            ("access-log", "/var/log/balancer", None)
        ],
        "writes the configuration for nginx; reads its token; reads and frees the access log"
    );
    let log_volume = pod.volumes.iter().flatten().find(|v| v.name == "access-log").expect("the log's volume");
    let empty_dir = log_volume.empty_dir.as_ref().expect("an emptyDir");
    assert_eq!(
        (empty_dir.medium.as_deref(), empty_dir.size_limit.as_ref().map(|q| q.0.as_str())),
        (Some("Memory"), Some("8Mi")),
        "a bounded tmpfs: a stalled sidecar makes nginx drop lines, and never gets the pod evicted"
    );
    assert!(
        desired.nginx_conf.contains("    access_log /var/log/balancer/access.log balancer buffer=64k flush=1s;\n"),
        "{}",
        desired.nginx_conf
    );
}

#[test]
fn the_sidecars_port_stays_clear_of_the_balancers_own() {
    let mut spec = sample().spec;
    spec.ports = vec![port(Some("a"), "TCP", 9113), port(Some("b"), "UDP", 5514), port(Some("c"), "TCP", 9114)];
    assert_eq!(metrics_port(&spec), 9115);
}

/// What the sidecar reads from the ConfigMap's model: which backend each server is, the ports
/// nginx listens on, and the weights; and the file beside it is the rendering of that model.
#[test]
fn the_sidecar_reads_every_backend_and_weight_from_the_model_beside_the_file() {
    let mut spec = sample().spec;
    spec.ports.push(port(Some("dns"), "UDP", 53));
    spec.backends[1].weight = Some(0);
    let ips: Vec<IpAddr> = (0..3).map(|i| IpAddr::from([10, 96, 0, 10 + i])).collect();
    let spec = fixtures::admitted("example-balancer", spec.clone(), &SpecPolicy::default());
    let settings = ProxySettings { metrics_image: Some("localhost/balancer:dev".into()), ..settings() };
    let built = proxy::proxy(&owner(&sample()), &spec, &settings, &targets(&spec, &ips, None));
    let data = built.config_map.data.expect("data");
    let model = ProxyConfig::from_json(&data[MODEL_FILE]).expect("a model");
    assert_eq!(nginx::write(&model), data[nginx::CONFIG_FILE], "the file is the model's rendering");
    assert!(nginx::is_rendered_for(&data[nginx::CONFIG_FILE], "example-balancer"));
    assert!(!nginx::is_rendered_for(&data[nginx::CONFIG_FILE], "example"), "another Balancer's file");
    let upstreams = Upstreams::of(&model);
    assert_eq!(upstreams.balancer, "example-balancer");
    for (i, name) in ["v1", "v2", "v3"].iter().enumerate() {
        assert_eq!(upstreams.backend(&format!("{}:80", ips[i])), Some(*name));
        assert_eq!(upstreams.backend(&format!("{}:53", ips[i])), Some(*name));
    }
    assert!(upstreams.listens(80, Protocol::Tcp) && upstreams.listens(53, Protocol::Udp));
    assert!(!upstreams.listens(53, Protocol::Tcp) && !upstreams.listens(81, Protocol::Tcp));
    let weights: Vec<(u16, &str, &str, u32)> =
        upstreams.weights().iter().map(|w| (w.port, w.protocol.as_str(), w.backend.as_str(), w.weight)).collect();
    assert_eq!(
        weights,
        [
            (80, "TCP", "v1", 40),
            (80, "TCP", "v2", 0),
            (80, "TCP", "v3", 40),
            (53, "UDP", "v1", 40),
            (53, "UDP", "v2", 0),
            (53, "UDP", "v3", 40)
        ]
    );
    assert_eq!(ProxyConfig::from_json("events {}\n"), None, "not a model");
}

/// Without the sidecar, nginx reads the mounted file once: it is told which file to wait for
/// (see `proxy::nginx::entrypoint`), and a new configuration rolls the pods.
#[test]
fn without_the_sidecar_a_new_configuration_rolls_the_pods() {
    let mut balancer = sample();
    let desired = desired_for(&balancer);
    let hash = nginx::config_hash(&desired.nginx_conf);
    let nginx = &pod_spec(&desired.deployment).containers[0];
    let env = nginx.env.clone().unwrap_or_default();
    let told: Vec<_> = env.iter().filter(|e| e.name == nginx::CONFIG_HASH_ENV).collect();
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].value.as_deref(), Some(hash.as_str()));
    balancer.spec.backends[0].weight = Some(7);
    let changed = desired_for(&balancer);
    assert_ne!(template(&changed.deployment), template(&desired.deployment));
}

/// With the sidecar, a new configuration reaches the running pods: the pod template holds
/// nothing it changes. The sidecar, and only it, holds a token of the proxy's own
/// ServiceAccount, which may read the proxy's ConfigMap and nothing else.
#[test]
fn with_the_sidecar_a_new_configuration_changes_no_pod_and_only_the_sidecar_holds_a_token() {
    let settings = with_sidecar();
    let mut balancer = sample();
    let before = desired(&owner(&balancer), &admitted(&balancer, &settings), &settings);
    balancer.spec.backends[0].weight = Some(7);
    balancer.spec.algorithm = Some("LeastConnections".into());
    let changed = desired(&owner(&balancer), &admitted(&balancer, &settings), &settings);
    assert_ne!(changed.nginx_conf, before.nginx_conf);
    assert_eq!(template(&changed.deployment), template(&before.deployment), "no pod rolls");

    let pod = pod_spec(&before.deployment);
    assert_eq!(pod.service_account_name.as_deref(), Some("example-balancer-proxy"));
    assert_eq!(pod.automount_service_account_token, Some(false), "no token for nginx");
    let (nginx, sidecar) = (&pod.containers[0], &pod.init_containers.as_ref().unwrap()[0]);
    let mounts = |c: &Container| c.volume_mounts.iter().flatten().map(|m| m.name.clone()).collect::<Vec<_>>();
    assert_eq!(mounts(nginx), ["live", "tmp", "access-log"]);
    assert!(mounts(sidecar).contains(&"token".to_string()));
    assert!(nginx.env.is_none() && sidecar.env.is_none(), "no hash to wait for");

    let owner = owner(&balancer);
    let role = proxy::proxy_config_reader(&owner);
    let rules = role.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].resources.as_deref(), Some(&["configmaps".to_string()][..]));
    assert_eq!(rules[0].resource_names.as_deref(), Some(&["example-balancer-proxy-configmap".to_string()][..]));
    assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
    let binding = proxy::proxy_config_reader_binding(&owner);
    assert_eq!((binding.role_ref.kind.as_str(), binding.role_ref.name.as_str()), ("Role", "example-balancer-proxy"));
    let subject = &binding.subjects.unwrap_or_default()[0];
    assert_eq!((subject.kind.as_str(), subject.name.as_str()), ("ServiceAccount", "example-balancer-proxy"));
    let account = proxy::proxy_service_account(&owner);
    assert_eq!(account.automount_service_account_token, Some(false));
}

fn template(deployment: &Deployment) -> serde_json::Value {
    serde_json::to_value(&deployment.spec.as_ref().expect("a spec").template).expect("serializes")
}

/// Each L4 setting as the nginx directive it stands for (see docs/guide.md).
#[test]
fn algorithms_limits_backups_and_the_proxy_protocol_render_as_nginx_directives() {
    let mut balancer = sample();
    balancer.spec.algorithm = Some("LeastConnections".into());
    balancer.spec.backends[0].max_connections = Some(100);
    balancer.spec.backends[1].backup = Some(true);
    balancer.spec.backends[2].weight = Some(0);
    balancer.spec.backends[2].backup = Some(true);
    balancer.spec.ports[0].proxy_protocol = Some(true);
    balancer.spec.ports[0].accept_proxy_protocol = Some(true);
    let conf = desired_for(&balancer).nginx_conf;
    let expected = r#"    upstream port_80_tcp {
        zone port_80_tcp 512k;
        least_conn;
        server 10.96.0.10:80 weight=40 max_fails=1 fail_timeout=10s max_conns=100;  # example-balancer-v1-backend
        server 10.96.0.11:80 weight=20 max_fails=1 fail_timeout=10s backup;  # example-balancer-v2-backend
        server 10.96.0.12:80 down backup;  # example-balancer-v3-backend
    }

    server {
        listen 80 proxy_protocol;
        listen [::]:80 proxy_protocol;
        set_real_ip_from 0.0.0.0/0;
        set_real_ip_from ::/0;
        proxy_protocol on;
        proxy_connect_timeout 5s;
        proxy_timeout 10m;
        proxy_pass port_80_tcp;
    }
"#;
    assert!(conf.contains(expected), "{conf}");

    balancer.spec.algorithm = Some("PowerOfTwoChoices".into());
    balancer.spec.backends.iter_mut().for_each(|b| b.backup = None);
    assert!(desired_for(&balancer).nginx_conf.contains("        random two least_conn;\n"));
    balancer.spec.algorithm = Some("RoundRobin".into());
    balancer.spec.session_affinity = Some("ClientIP".into());
    let conf = desired_for(&balancer).nginx_conf;
    assert!(conf.contains("        zone port_80_tcp 512k;\n        hash $remote_addr consistent;\n"), "{conf}");
}

// ---------------------------------------------------------------------------
// Upstreams of pods
// ---------------------------------------------------------------------------

/// `count` ready pods of backend `b` (0, 1, 2), each with the sample's `http` port at 5678.
fn ready_pods(b: u8, count: u8) -> Vec<ReadyPod> {
    let port = PodPort { name: "http".into(), protocol: Protocol::Tcp, port: 5678 };
    (0..count).map(|i| ReadyPod { address: IpAddr::from([10, 244, b, 10 + i]), ports: vec![port.clone()] }).collect()
}

fn live_settings() -> ProxySettings {
    ProxySettings { metrics_image: Some("localhost/balancer:dev".into()), ..settings() }
}

/// Each pod weighs its backend's weight over its pod count: 40/20/40 over 1/3/2 pods gives
/// 6/1/3 per pod (6, 3×1 and 2×3 make 40/20/40 of 20); a backend without a ready pod keeps its
/// Service, down.
#[test]
fn pod_upstreams_share_each_backends_weight_across_its_ready_pods() {
    let balancer = sample();
    let spec = admitted(&balancer, &live_settings());
    let pods = [ready_pods(0, 1), ready_pods(1, 3), ready_pods(2, 2)];
    let ips = cluster_ips(&spec);
    let built = proxy::proxy(&owner(&balancer), &spec, &live_settings(), &targets(&spec, &ips, Some(&pods)));
    assert!(built.pod_upstreams);
    let servers: Vec<&str> = built.nginx_conf.lines().map(str::trim).filter(|l| l.starts_with("server 10.")).collect();
    assert_eq!(
        servers,
        [
            "server 10.244.0.10:5678 weight=6 max_fails=1 fail_timeout=10s;  # example-balancer-v1-backend",
            "server 10.244.1.10:5678 weight=1 max_fails=1 fail_timeout=10s;  # example-balancer-v2-backend",
            "server 10.244.1.11:5678 weight=1 max_fails=1 fail_timeout=10s;  # example-balancer-v2-backend",
            "server 10.244.1.12:5678 weight=1 max_fails=1 fail_timeout=10s;  # example-balancer-v2-backend",
            "server 10.244.2.10:5678 weight=3 max_fails=1 fail_timeout=10s;  # example-balancer-v3-backend",
            "server 10.244.2.11:5678 weight=3 max_fails=1 fail_timeout=10s;  # example-balancer-v3-backend",
        ]
    );
    let without_v2 = [ready_pods(0, 1), vec![], ready_pods(2, 2)];
    let built = proxy::proxy(&owner(&balancer), &spec, &live_settings(), &targets(&spec, &ips, Some(&without_v2)));
    assert!(
        built.nginx_conf.contains("server 10.96.0.11:80 down;  # example-balancer-v2-backend"),
        "{}",
        built.nginx_conf
    );
}

/// `maxConnections` is shared across the backend's pods, at least 1 each; a port the pods do not
/// have (by the Service port's name and protocol) leaves the backend without a server there.
#[test]
fn pod_upstreams_share_the_connection_limit_and_match_ports_by_name() {
    let mut balancer = sample();
    balancer.spec.backends[0].max_connections = Some(100);
    balancer.spec.ports.push(port(Some("dns"), "UDP", 53));
    let spec = admitted(&balancer, &live_settings());
    let pods = [ready_pods(0, 3), ready_pods(1, 1), ready_pods(2, 1)];
    let ips = cluster_ips(&spec);
    let built = proxy::proxy(&owner(&balancer), &spec, &live_settings(), &targets(&spec, &ips, Some(&pods)));
    let conf = &built.nginx_conf;
    assert_eq!(conf.matches("max_conns=33;").count(), 3, "{conf}");
    // No pod has a `dns` port: every backend keeps its Service at 53, down.
    for (i, backend) in ["v1", "v2", "v3"].iter().enumerate() {
        let line = format!("server 10.96.0.{}:53 down;  # example-balancer-{backend}-backend", 10 + i);
        assert!(conf.contains(&line), "{line} in {conf}");
    }
}

/// `upstreams: Services`, or no metrics sidecar (every endpoint change would roll the pods), keep
/// the Services' cluster IPs whatever pods are ready.
#[test]
fn services_are_the_upstreams_when_asked_or_without_live_delivery() {
    let pods = [ready_pods(0, 1), ready_pods(1, 1), ready_pods(2, 1)];
    let mut balancer = sample();
    balancer.spec.proxy = Some(ProxySpec { upstreams: Some("Services".into()), ..ProxySpec::default() });
    let asked = admitted(&balancer, &live_settings());
    let ips = cluster_ips(&asked);
    for (spec, settings) in [(asked, live_settings()), (admitted(&sample(), &settings()), settings())] {
        let built = proxy::proxy(&owner(&balancer), &spec, &settings, &targets(&spec, &ips, Some(&pods)));
        assert!(!built.pod_upstreams);
        assert!(built.nginx_conf.contains("server 10.96.0.10:80 weight=40"), "{}", built.nginx_conf);
        assert!(!built.nginx_conf.contains("10.244."), "{}", built.nginx_conf);
    }
}

/// A configuration of more pods than a ConfigMap holds falls back to the Services.
#[test]
fn too_many_pods_for_a_config_map_fall_back_to_the_services() {
    let balancer = sample();
    let spec = admitted(&balancer, &live_settings());
    let port = PodPort { name: "http".into(), protocol: Protocol::Tcp, port: 5678 };
    let many: Vec<ReadyPod> = (0..6000)
        .map(|i| ReadyPod {
            address: IpAddr::from([10, (i / 65536) as u8, ((i / 256) % 256) as u8, (i % 256) as u8]),
            ports: vec![port.clone()],
        })
        .collect();
    let pods = [many.clone(), many.clone(), many];
    let ips = cluster_ips(&spec);
    let built = proxy::proxy(&owner(&balancer), &spec, &live_settings(), &targets(&spec, &ips, Some(&pods)));
    assert!(!built.pod_upstreams, "{} bytes", built.nginx_conf.len());
    assert!(built.nginx_conf.contains("server 10.96.0.10:80 weight=40"));
}

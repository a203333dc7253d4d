//! The objects a Balancer owns, built as pure functions of the Balancer.
//!
//! Each builder returns exactly the fields balancer manages (server-side apply
//! semantics): the controller applies them as they are and compares them with
//! the cached objects as a subset, so server-populated fields never look like drift.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, ExecAction,
    Lifecycle, LifecycleHandler, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec, Sysctl, TCPSocketAction,
    TopologySpreadConstraint, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use serde::Serialize;

use crate::admit::Admitted;
use crate::api::{self, BackendSpec, BalancerPort, BalancerSpec};
use crate::defaulting::SpecPolicy;
use crate::nginx::{self, CONFIG_FILE};

/// Label every child carries: who manages it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "balancer";
/// Label every child carries: which Balancer owns it.
pub const BALANCER_NAME_LABEL: &str = "balancer.exposer.hliangzhao.io/balancer-name";
/// Label telling children apart: `backend`, `proxy` or `frontend`.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// Label on backend Services: the backend's name.
pub const BACKEND_LABEL: &str = "balancer.exposer.hliangzhao.io/backend";
/// Pod template annotation: hash of `nginx.conf` (which holds the backends' cluster IPs),
/// so a config change rolls the proxy pods.
pub const CONFIG_HASH_ANNOTATION: &str = "balancer.exposer.hliangzhao.io/config-hash";

/// Annotation on every child: a hash of the child as the controller last wanted it. A field
/// dropped from the spec (a node selector, an annotation, a source range) changes it, so the
/// child is applied again and server-side apply removes the field; the comparison with the
/// child as it is would otherwise find every field still asked for present, and do nothing.
pub const DESIRED_HASH_ANNOTATION: &str = "balancer.exposer.hliangzhao.io/desired-hash";

pub const COMPONENT_BACKEND: &str = "backend";
pub const COMPONENT_PROXY: &str = "proxy";
pub const COMPONENT_FRONTEND: &str = "frontend";

/// Seconds a terminating proxy pod keeps serving before nginx stops listening, so that
/// kube-proxy on every node has dropped it from the front Service first.
const ENDPOINT_REMOVAL_SECONDS: i64 = 5;

/// nginx's pid file, on the writable /tmp: the compiled-in default lies on the read-only root,
/// and `nginx -t` opens it too.
const PID_FILE: &str = "/tmp/nginx.pid";

/// Where the proxy's files live inside its container.
const CONFIG_DIR: &str = "/etc/balancer";
/// nginx-unprivileged's user and group.
const PROXY_UID: i64 = 101;

/// How proxy Deployments are built; set from the command line.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// nginx image with the stream module, running as a non-root user.
    pub image: String,
    /// Dynamic modules `nginx.conf` loads first (`load_module`), for images whose stream
    /// module is not built in (Debian, Ubuntu, UBI).
    pub load_modules: Vec<String>,
    /// What a Balancer that does not say gets (`spec.replicas`).
    pub policy: SpecPolicy,
}

/// The identity children point back to.
#[derive(Debug, Clone)]
pub struct Owner {
    pub name: String,
    pub namespace: String,
    pub reference: OwnerReference,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OwnerError {
    #[error("the Balancer has no metadata.name")]
    MissingName,
    #[error("the Balancer has no metadata.namespace")]
    MissingNamespace,
    #[error("the Balancer has no metadata.uid (it has not been stored by the API server)")]
    MissingUid,
}

impl Owner {
    /// The controller owner reference of a stored Balancer (`controller` and `blockOwnerDeletion` set).
    pub fn of<K: Resource<DynamicType = ()>>(balancer: &K) -> Result<Owner, OwnerError> {
        let name = balancer.meta().name.clone().ok_or(OwnerError::MissingName)?;
        let namespace = balancer.meta().namespace.clone().ok_or(OwnerError::MissingNamespace)?;
        let mut reference = balancer.controller_owner_ref(&()).ok_or(OwnerError::MissingUid)?;
        // kube sets only `controller`; blocking owner deletion lets foreground deletion of a
        // Balancer wait for its children.
        reference.block_owner_deletion = Some(true);
        Ok(Owner { name, namespace, reference })
    }
}

/// Where `nginx.conf` sends each backend's traffic.
#[derive(Debug, Clone, Copy)]
pub enum BackendHosts<'a> {
    /// The backend Services' cluster IPs, in the spec's backend order, as the API server
    /// assigned them (an empty or missing one falls back to the Service's name). The proxy
    /// then needs no cluster DNS: nginx refuses to start when it cannot resolve an upstream
    /// name, so a DNS outage would stop proxy pods from restarting.
    ClusterIps(&'a [String]),
    /// `<service>.<namespace>.svc` names: what an offline preview (`balancer render`) shows,
    /// since no cluster IP exists before the Services do.
    ServiceNames,
}

/// The proxy side of a Balancer, built once its backend Services have cluster IPs.
#[derive(Debug, Clone)]
pub struct Proxy {
    pub config_map: ConfigMap,
    pub deployment: Deployment,
    pub front_service: Service,
    /// The rendered `nginx.conf` (also inside `config_map`).
    pub nginx_conf: String,
}

/// The backend Services of a defaulted, valid spec, in backend order: applied first,
/// because their cluster IPs go into `nginx.conf`.
pub fn backend_services(owner: &Owner, spec: &Admitted) -> Vec<Service> {
    spec.backends.iter().map(|b| backend_service(owner, spec, b)).collect()
}

/// The ConfigMap, Deployment and front Service of a defaulted, valid spec. The pod template
/// carries the hash of `nginx.conf`, which holds the backends' addresses: a new configuration,
/// or a backend Service recreated with a new cluster IP, rolls the proxy pods.
pub fn proxy(owner: &Owner, spec: &Admitted, settings: &ProxySettings, hosts: BackendHosts<'_>) -> Proxy {
    let position = |backend: &BackendSpec| spec.backends.iter().position(|b| b.name == backend.name);
    let address = |backend: &BackendSpec, port: &BalancerPort| {
        let service = api::backend_service_name(&owner.name, &backend.name);
        let host = match hosts {
            BackendHosts::ClusterIps(ips) => position(backend).and_then(|i| ips.get(i)).map_or("", String::as_str),
            BackendHosts::ServiceNames => "",
        };
        match host {
            "" => format!("{service}.{}.svc:{}", owner.namespace, port.port),
            ip if ip.contains(':') => format!("[{ip}]:{}", port.port),
            ip => format!("{ip}:{}", port.port),
        }
    };
    let nginx_conf = nginx::render(&owner.name, spec, &settings.load_modules, &address);
    Proxy {
        config_map: proxy_config_map(owner, &nginx_conf),
        deployment: proxy_deployment(owner, spec, settings, &nginx::config_hash(&nginx_conf)),
        front_service: front_service(owner, spec),
        nginx_conf,
    }
}

/// `desired` with [`DESIRED_HASH_ANNOTATION`] set to the hash of everything else in it.
pub fn stamped<K: Resource + Serialize + Clone>(desired: &K) -> Result<K, serde_json::Error> {
    let hash = sha256_hex(&serde_json::to_string(desired)?);
    let mut stamped = desired.clone();
    let annotations = stamped.meta_mut().annotations.get_or_insert_default();
    annotations.insert(DESIRED_HASH_ANNOTATION.to_string(), hash[..16].to_string());
    Ok(stamped)
}

/// SHA-256 of `text`, in lowercase hex.
pub fn sha256_hex(text: &str) -> String {
    use std::fmt::Write as _;
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().fold(String::with_capacity(64), |mut hex, byte| {
        let _ = write!(hex, "{byte:02x}");
        hex
    })
}

/// The labels every child of `balancer` carries, plus its component.
pub fn labels(balancer: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (BALANCER_NAME_LABEL.to_string(), balancer.to_string()),
        (COMPONENT_LABEL.to_string(), component.to_string()),
    ])
}

/// Selects the proxy pods of one Balancer; also the Deployment's (immutable) selector.
pub fn proxy_selector(balancer: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (BALANCER_NAME_LABEL.to_string(), balancer.to_string()),
        (COMPONENT_LABEL.to_string(), COMPONENT_PROXY.to_string()),
    ])
}

/// [`proxy_selector`] as the string a scale subresource reports (`status.selector`), which a
/// HorizontalPodAutoscaler uses to find the pods whose metrics it averages.
pub fn proxy_selector_string(balancer: &str) -> String {
    proxy_selector(balancer).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

fn metadata(owner: &Owner, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(owner.namespace.clone()),
        labels: Some(labels),
        owner_references: Some(vec![owner.reference.clone()]),
        ..ObjectMeta::default()
    }
}

/// One Service port per Balancer port, forwarding to `target(port)`.
fn service_ports(spec: &BalancerSpec, target: impl Fn(&BalancerPort) -> IntOrString) -> Vec<ServicePort> {
    spec.ports
        .iter()
        .map(|p| ServicePort {
            name: p.name.clone().filter(|n| !n.is_empty()),
            protocol: Some(p.effective_protocol().to_string()),
            port: p.port,
            target_port: Some(target(p)),
            ..ServicePort::default()
        })
        .collect()
}

/// `<balancer>-<backend>-backend`: ClusterIP, the merged selector, one port per Balancer port.
pub fn backend_service(owner: &Owner, spec: &Admitted, backend: &BackendSpec) -> Service {
    let mut labels = labels(&owner.name, COMPONENT_BACKEND);
    labels.insert(BACKEND_LABEL.to_string(), backend.name.clone());
    let ports = service_ports(spec, BalancerPort::effective_target_port);
    Service {
        metadata: metadata(owner, api::backend_service_name(&owner.name, &backend.name), labels),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(spec.merged_selector(backend)),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// `<balancer>`: in front of the proxy pods, every Balancer port, exposed as `spec.service`
/// says (a ClusterIP Service by default).
pub fn front_service(owner: &Owner, spec: &BalancerSpec) -> Service {
    let exposure = spec.service.clone().unwrap_or_default();
    let node_ports = spec.service_type() != "ClusterIP";
    // The proxy listens on the Balancer's own ports.
    let mut ports = service_ports(spec, |p| IntOrString::Int(p.port));
    if node_ports {
        for (service_port, port) in ports.iter_mut().zip(&spec.ports) {
            service_port.node_port = port.node_port;
        }
    }
    let mut metadata = metadata(owner, owner.name.clone(), labels(&owner.name, COMPONENT_FRONTEND));
    metadata.annotations = exposure.annotations.filter(|a| !a.is_empty());
    Service {
        metadata,
        spec: Some(ServiceSpec {
            type_: Some(spec.service_type().to_string()),
            selector: Some(proxy_selector(&owner.name)),
            ports: Some(ports),
            external_traffic_policy: exposure.external_traffic_policy.filter(|_| node_ports),
            load_balancer_class: exposure.load_balancer_class,
            load_balancer_source_ranges: exposure.load_balancer_source_ranges.filter(|r| !r.is_empty()),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// `<balancer>-proxy-configmap` holding `nginx.conf`.
pub fn proxy_config_map(owner: &Owner, nginx_conf: &str) -> ConfigMap {
    ConfigMap {
        metadata: metadata(owner, api::proxy_configmap_name(&owner.name), labels(&owner.name, COMPONENT_PROXY)),
        data: Some(BTreeMap::from([(CONFIG_FILE.to_string(), nginx_conf.to_string())])),
        ..ConfigMap::default()
    }
}

/// `<balancer>-proxy`: unprivileged nginx reading the ConfigMap, rolled when `config_hash` changes.
pub fn proxy_deployment(owner: &Owner, spec: &Admitted, settings: &ProxySettings, config_hash: &str) -> Deployment {
    let mut pod_labels = labels(&owner.name, COMPONENT_PROXY);
    pod_labels.extend(proxy_selector(&owner.name));
    let mut annotations = spec.proxy.as_ref().and_then(|p| p.pod_annotations.clone()).unwrap_or_default();
    annotations.insert(CONFIG_HASH_ANNOTATION.to_string(), config_hash.to_string());
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        }),
        spec: Some(proxy_pod_spec(owner, spec, settings)),
    };
    Deployment {
        metadata: metadata(owner, api::proxy_deployment_name(&owner.name), labels(&owner.name, COMPONENT_PROXY)),
        spec: Some(DeploymentSpec {
            replicas: Some(spec.replicas()),
            selector: LabelSelector { match_labels: Some(proxy_selector(&owner.name)), match_expressions: None },
            template,
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// `<balancer>-proxy` PodDisruptionBudget, for Balancers with more than one proxy pod: a drain
/// or an eviction takes at most one of them at a time. (With one pod, a budget could only
/// block drains or allow everything.)
pub fn proxy_disruption_budget(owner: &Owner) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: metadata(owner, api::proxy_deployment_name(&owner.name), labels(&owner.name, COMPONENT_PROXY)),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector { match_labels: Some(proxy_selector(&owner.name)), match_expressions: None }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

fn proxy_pod_spec(owner: &Owner, spec: &BalancerSpec, settings: &ProxySettings) -> PodSpec {
    let proxy = spec.proxy.clone().unwrap_or_default();
    let config_volume = "nginx-conf";
    let tmp_volume = "tmp";
    // Ports below 1024 need the (namespaced, safe since Kubernetes 1.22) sysctl for a non-root nginx.
    let sysctls = spec
        .ports
        .iter()
        .any(|p| p.port < 1024)
        .then(|| vec![Sysctl { name: "net.ipv4.ip_unprivileged_port_start".into(), value: "0".into() }]);
    let container = Container {
        name: "nginx".into(),
        image: Some(proxy.image.unwrap_or_else(|| settings.image.clone())),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["/bin/sh".into(), "-c".into(), STOP_GRACEFULLY.into(), "nginx".into()]),
        args: Some(nginx_args()),
        ports: Some(
            spec.ports
                .iter()
                .map(|p| ContainerPort {
                    container_port: p.port,
                    protocol: Some(p.effective_protocol().to_string()),
                    ..ContainerPort::default()
                })
                .collect(),
        ),
        readiness_probe: Some(readiness_probe(spec)),
        lifecycle: Some(graceful_stop()),
        resources: Some(proxy.resources.unwrap_or_else(default_resources)),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: config_volume.into(),
                mount_path: CONFIG_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            VolumeMount { name: tmp_volume.into(), mount_path: "/tmp".into(), ..VolumeMount::default() },
        ]),
        ..Container::default()
    };
    PodSpec {
        automount_service_account_token: Some(false),
        // The stop hook's wait, nginx's drain, and a few seconds to spare.
        termination_grace_period_seconds: Some(ENDPOINT_REMOVAL_SECONDS + nginx::DRAIN_SECONDS + 5),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(PROXY_UID),
            run_as_group: Some(PROXY_UID),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
            sysctls,
            ..PodSecurityContext::default()
        }),
        containers: vec![container],
        topology_spread_constraints: Some(
            proxy.topology_spread_constraints.unwrap_or_else(|| vec![spread_across_nodes(owner)]),
        ),
        node_selector: proxy.node_selector.filter(|s| !s.is_empty()),
        tolerations: proxy.tolerations.filter(|t| !t.is_empty()),
        affinity: proxy.affinity,
        priority_class_name: proxy.priority_class_name.filter(|c| !c.is_empty()),
        volumes: Some(vec![
            Volume {
                name: config_volume.into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: api::proxy_configmap_name(&owner.name),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            },
            Volume { name: tmp_volume.into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Volume::default() },
        ]),
        ..PodSpec::default()
    }
}

/// What a proxy pod asks for unless `spec.proxy.resources` says: nginx at rest needs a few
/// MiB; the limit keeps a runaway worker from taking the node's memory.
fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("50m".into())),
            ("memory".to_string(), Quantity("32Mi".into())),
        ])),
        limits: Some(BTreeMap::from([("memory".to_string(), Quantity("128Mi".into()))])),
        ..ResourceRequirements::default()
    }
}

/// One Balancer's proxy pods on as many nodes as possible, so that losing a node loses one
/// replica at most; `ScheduleAnyway`, so a single-node cluster still runs them all.
fn spread_across_nodes(owner: &Owner) -> TopologySpreadConstraint {
    TopologySpreadConstraint {
        max_skew: 1,
        topology_key: "kubernetes.io/hostname".into(),
        when_unsatisfiable: "ScheduleAnyway".into(),
        label_selector: Some(LabelSelector {
            match_labels: Some(proxy_selector(&owner.name)),
            match_expressions: None,
        }),
        ..TopologySpreadConstraint::default()
    }
}

/// nginx in the foreground, reading the mounted file, logging to stderr, pid file on the writable /tmp.
pub fn nginx_args() -> Vec<String> {
    vec![
        "-c".into(),
        format!("{CONFIG_DIR}/{CONFIG_FILE}"),
        "-e".into(),
        "stderr".into(),
        "-g".into(),
        format!("daemon off; pid {PID_FILE};"),
    ]
}

/// The proxy container's entrypoint: nginx with the container's args, under a shell that turns
/// the kubelet's SIGTERM into SIGQUIT, nginx's graceful quit (open connections finish, within
/// `worker_shutdown_timeout`); SIGTERM would make nginx drop them at once. Pods cannot choose
/// their stop signal before Kubernetes 1.33. Needs `/bin/sh`, as nginx images have.
pub const STOP_GRACEFULLY: &str =
    "trap 'kill -QUIT \"$nginx\"; wait \"$nginx\"; exit $?' TERM; nginx \"$@\" & nginx=$!; wait \"$nginx\"";

/// A rollout or a drain drops no connection: the pod keeps serving while it leaves the front
/// Service's endpoints; the SIGTERM that follows starts nginx's graceful quit.
fn graceful_stop() -> Lifecycle {
    let sleep = vec!["sleep".to_string(), ENDPOINT_REMOVAL_SECONDS.to_string()];
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            exec: Some(ExecAction { command: Some(sleep) }),
            ..LifecycleHandler::default()
        }),
        ..Lifecycle::default()
    }
}

/// Ready when the first TCP port accepts connections; a UDP-only proxy is
/// ready when nginx accepts its configuration (UDP has no connection to probe).
fn readiness_probe(spec: &BalancerSpec) -> Probe {
    let tcp_port = spec.ports.iter().find(|p| p.effective_protocol() == "TCP").map(|p| p.port);
    let mut probe = Probe { period_seconds: Some(5), failure_threshold: Some(3), ..Probe::default() };
    match tcp_port {
        Some(port) => {
            probe.tcp_socket = Some(TCPSocketAction { port: IntOrString::Int(port), host: None });
        }
        None => {
            // Every argument, the pid file's path included: nginx -t opens it.
            let mut command = vec!["nginx".to_string(), "-t".into(), "-q".into()];
            command.extend(nginx_args());
            probe.exec = Some(ExecAction { command: Some(command) });
        }
    }
    probe
}

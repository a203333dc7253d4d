//! The proxy's ConfigMap and Deployment: unprivileged nginx, spread across nodes, reading
//! `nginx.conf` from the ConfigMap and stopping gracefully.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, ExecAction,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext, Sysctl,
    TCPSocketAction, TopologySpreadConstraint, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::access_log::SidecarPorts;
use super::meta::{COMPONENT_PROXY, CONFIG_HASH_ANNOTATION, Owner, labels, metadata, proxy_selector};
use super::nginx::{
    CONFIG_DIR, CONFIG_FILE, CONFIG_HASH_ENV, POD_FILES, entrypoint, nginx_args, running_readiness_command,
};
use super::stop::{SIDECAR_DRAIN, TERMINATION_GRACE_SECONDS, graceful_stop};
use crate::api::{self, Protocol};
use crate::spec::{Admitted, SpecPolicy};

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
    /// The metrics sidecar's image (balancer's own); `None`: no sidecar, no access log.
    pub metrics_image: Option<String>,
    /// The operator's spec policy: the `spec.replicas` of a Balancer that sets none, and the
    /// proxy images a Balancer may choose.
    pub policy: SpecPolicy,
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
        spec: Some(proxy_pod_spec(owner, spec, settings, config_hash)),
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

fn proxy_pod_spec(owner: &Owner, spec: &Admitted, settings: &ProxySettings, config_hash: &str) -> PodSpec {
    let proxy = spec.proxy.clone().unwrap_or_default();
    let config_volume = "nginx-conf";
    let tmp_volume = "tmp";
    // Ports below 1024 need the (namespaced, safe since Kubernetes 1.22) sysctl for a non-root nginx.
    let sysctls = spec
        .ports
        .iter()
        .any(|p| p.port < 1024)
        .then(|| vec![Sysctl { name: "net.ipv4.ip_unprivileged_port_start".into(), value: "0".into() }]);
    let security_context = SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
        ..SecurityContext::default()
    };
    let config_mount = VolumeMount {
        name: config_volume.into(),
        mount_path: CONFIG_DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    };
    // Both containers read the mounted file only once, so each waits until the file's hash is
    // the one this pod was made for (the kubelet may still show the previous ConfigMap).
    let config_hash_env =
        vec![EnvVar { name: CONFIG_HASH_ENV.into(), value: Some(config_hash.into()), value_from: None }];
    let container = Container {
        name: "nginx".into(),
        image: Some(proxy.image.unwrap_or_else(|| settings.image.clone())),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["/bin/sh".into(), "-c".into(), entrypoint(&POD_FILES), "nginx".into()]),
        args: Some(nginx_args()),
        env: Some(config_hash_env.clone()),
        ports: Some(
            spec.ports()
                .map(|p| ContainerPort {
                    container_port: p.port,
                    protocol: Some(p.protocol.to_string()),
                    ..ContainerPort::default()
                })
                .collect(),
        ),
        readiness_probe: Some(readiness_probe(spec)),
        lifecycle: Some(graceful_stop()),
        resources: Some(proxy.resources.unwrap_or_else(default_resources)),
        security_context: Some(security_context.clone()),
        volume_mounts: Some(vec![
            config_mount.clone(),
            VolumeMount { name: tmp_volume.into(), mount_path: "/tmp".into(), ..VolumeMount::default() },
        ]),
        ..Container::default()
    };
    let sidecar = settings.metrics_image.as_ref().map(|image| Container {
        security_context: Some(security_context),
        volume_mounts: Some(vec![config_mount]),
        env: Some(config_hash_env),
        ..metrics_sidecar(image, SidecarPorts::of(spec))
    });
    PodSpec {
        automount_service_account_token: Some(false),
        termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(PROXY_UID),
            run_as_group: Some(PROXY_UID),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
            sysctls,
            ..PodSecurityContext::default()
        }),
        init_containers: sidecar.map(|sidecar| vec![sidecar]),
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

/// The metrics sidecar: balancer's own image counting the sessions nginx logs to it (see
/// [`access_log`](super::access_log)), serving `/metrics` in plain HTTP on the pod network,
/// as nginx-prometheus-exporter does (proxy pods mount no service-account token, so the sidecar
/// could not review a scraper's token). No probes: a sidecar in trouble must not take the
/// proxy out of its Service.
///
/// A native sidecar (an init container that restarts `Always`): the kubelet starts it before
/// nginx and stops it only once nginx has exited, so it counts every session nginx drains, and
/// serves the last count for a few seconds more.
fn metrics_sidecar(image: &str, ports: SidecarPorts) -> Container {
    let args = [
        "proxy-metrics".to_string(),
        format!("--config={}", POD_FILES.mounted),
        format!("--listen=0.0.0.0:{}", ports.metrics),
        format!("--log-port={}", ports.log),
        format!("--drain={}s", SIDECAR_DRAIN.as_secs()),
    ];
    Container {
        name: METRICS_CONTAINER.into(),
        image: Some(image.to_string()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["/balancer".into()]),
        args: Some(args.to_vec()),
        restart_policy: Some("Always".into()),
        ports: Some(vec![ContainerPort {
            name: Some(METRICS_PORT_NAME.into()),
            container_port: i32::from(ports.metrics),
            protocol: Some(Protocol::Tcp.to_string()),
            ..ContainerPort::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("10m".into())),
                ("memory".to_string(), Quantity("16Mi".into())),
            ])),
            limits: Some(BTreeMap::from([("memory".to_string(), Quantity("64Mi".into()))])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    }
}

/// The sidecar container's name.
pub const METRICS_CONTAINER: &str = "metrics";

/// The sidecar's port name, which a PodMonitor selects (its number avoids the Balancer's ports).
pub const METRICS_PORT_NAME: &str = "metrics";

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

/// Ready when the first plain TCP port accepts connections. A proxy without such a port (UDP
/// only, or every TCP port requiring a PROXY protocol header, where a probe's bare connection
/// would be logged and counted as a bad request) is ready when nginx runs and accepts its
/// configuration.
fn readiness_probe(spec: &Admitted) -> Probe {
    let tcp_port = spec.ports().find(|p| p.protocol == Protocol::Tcp && !p.accepts_proxy_protocol()).map(|p| p.port);
    let mut probe = Probe { period_seconds: Some(5), failure_threshold: Some(3), ..Probe::default() };
    match tcp_port {
        Some(port) => {
            probe.tcp_socket = Some(TCPSocketAction { port: IntOrString::Int(port), host: None });
        }
        None => {
            probe.exec = Some(ExecAction { command: Some(running_readiness_command()) });
        }
    }
    probe
}

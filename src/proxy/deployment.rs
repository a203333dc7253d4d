//! The proxy's ConfigMap and Deployment: unprivileged nginx, spread across nodes, reading
//! `nginx.conf` from the ConfigMap and stopping gracefully.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapProjection, ConfigMapVolumeSource, Container, ContainerPort,
    DownwardAPIProjection, DownwardAPIVolumeFile, EmptyDirVolumeSource, EnvVar, ExecAction, KeyToPath,
    ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ProjectedVolumeSource,
    ResourceRequirements, SeccompProfile, SecurityContext, ServiceAccountTokenProjection, Sysctl, TCPSocketAction,
    TopologySpreadConstraint, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::access_log::{LOG_DIR, LOG_FILE, LOG_VOLUME_BYTES, metrics_port};
use super::meta::{COMPONENT_PROXY, CONFIG_HASH_ANNOTATION, Owner, labels, metadata, proxy_selector};
use super::model::MODEL_FILE;
use super::nginx::{
    CONFIG_DIR, CONFIG_FILE, CONFIG_HASH_ENV, ENTRYPOINT, POD_FILES, entrypoint_environment, nginx_args,
    running_readiness_command,
};
use super::reload::{LIVE_DIR, LIVE_ENTRYPOINT, LIVE_POD_FILES, RELOAD_POLICY, live_environment};
use super::signature::{CONFIG_KEY_ENV, ConfigKey, ConfigSigner, same_files};
use super::stop::{SIDECAR_DRAIN, TERMINATION_GRACE_SECONDS, graceful_stop};
use super::workload::Workload;
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
    /// The operator's key, which signs every configuration, and whose public half the live
    /// proxies check it with (see [`signature`](super::signature)); `None` (`balancer render`):
    /// unsigned, and the proxies check nothing.
    pub signer: Option<ConfigSigner>,
}

/// `<balancer>-proxy-configmap` holding `nginx.conf` and its model (see [`super::model`]); the
/// write path signs it ([`ConfigSigner::seal`]) against the ConfigMap as it then is.
pub fn proxy_config_map(owner: &Owner, nginx_conf: &str, model_json: &str) -> ConfigMap {
    let data: BTreeMap<String, String> =
        [(CONFIG_FILE, nginx_conf), (MODEL_FILE, model_json)].map(|(k, v)| (k.to_string(), v.to_string())).into();
    ConfigMap {
        metadata: metadata(owner, api::proxy_configmap_name(&owner.name), labels(&owner.name, COMPONENT_PROXY)),
        data: Some(data),
        ..ConfigMap::default()
    }
}

/// Whether the proxy's ConfigMap as it is (`current`) holds a configuration someone else wrote:
/// neither the files balancer wants (`desired`, signed or not: a ConfigMap written before
/// configurations were signed is not someone else's) nor files it signed for this owner.
pub fn written_by_another(current: &ConfigMap, desired: &ConfigMap, owner: &Owner, key: &ConfigKey) -> bool {
    let empty = BTreeMap::new();
    let (current, desired) = (current.data.as_ref().unwrap_or(&empty), desired.data.as_ref().unwrap_or(&empty));
    !same_files(current, desired) && key.sealed_sequence(current, &owner.subject()).is_none()
}

/// A Balancer's proxy Deployment: [`workload_deployment`] of its spec's [`Workload`].
pub fn proxy_deployment(owner: &Owner, spec: &Admitted, settings: &ProxySettings, config_hash: &str) -> Deployment {
    workload_deployment(owner, &Workload::of(spec), settings, config_hash)
}

/// `<owner>-proxy`: unprivileged nginx. With the metrics sidecar, the sidecar follows the
/// ConfigMap and nginx reloads gracefully on each change, so the template holds nothing that a
/// new configuration changes. Without it, nginx reads the mounted ConfigMap once, and the
/// template's `config_hash` rolls the pods when it changes.
pub fn workload_deployment(
    owner: &Owner,
    workload: &Workload,
    settings: &ProxySettings,
    config_hash: &str,
) -> Deployment {
    let delivery = match settings.metrics_image {
        Some(_) => Delivery::Live,
        None => Delivery::Mounted { config_hash },
    };
    let mut pod_labels = labels(&owner.name, COMPONENT_PROXY);
    pod_labels.extend(proxy_selector(&owner.name));
    let mut annotations = workload.pods.pod_annotations.clone().unwrap_or_default();
    if let Delivery::Mounted { config_hash } = delivery {
        annotations.insert(CONFIG_HASH_ANNOTATION.to_string(), config_hash.to_string());
    }
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        }),
        spec: Some(proxy_pod_spec(owner, workload, settings, delivery)),
    };
    Deployment {
        metadata: metadata(owner, api::proxy_deployment_name(&owner.name), labels(&owner.name, COMPONENT_PROXY)),
        spec: Some(DeploymentSpec {
            replicas: Some(workload.replicas),
            selector: LabelSelector { match_labels: Some(proxy_selector(&owner.name)), match_expressions: None },
            template,
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// How a proxy pod gets its `nginx.conf`.
#[derive(Debug, Clone, Copy)]
enum Delivery<'a> {
    /// Mounted from the ConfigMap and read once, when the file's hash is `config_hash`.
    Mounted { config_hash: &'a str },
    /// Written by the sidecar, which watches the ConfigMap, into a directory both containers
    /// share; nginx reloads gracefully on each new file (see [`reload`](super::reload)).
    Live,
}

/// The volumes' names.
const CONFIG_VOLUME: &str = "nginx-conf";
const TMP_VOLUME: &str = "tmp";
const LIVE_VOLUME: &str = "live";
const TOKEN_VOLUME: &str = "token";
const LOG_VOLUME: &str = "access-log";

/// Where the sidecar finds its token, CA and namespace: the path every Kubernetes client reads
/// in a pod.
pub const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How long a projected token lives before the kubelet renews it (the API server's minimum is
/// ten minutes); the client reads the file again as it changes.
const TOKEN_SECONDS: i64 = 3600;

fn proxy_pod_spec(owner: &Owner, workload: &Workload, settings: &ProxySettings, delivery: Delivery<'_>) -> PodSpec {
    let proxy = workload.pods.clone();
    // Ports below 1024 need the (namespaced, safe since Kubernetes 1.22) sysctl for a non-root nginx.
    let sysctls = workload
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
    let tmp_mount = VolumeMount { name: TMP_VOLUME.into(), mount_path: "/tmp".into(), ..VolumeMount::default() };
    // The entrypoint is a constant program; where its files are, and its pace, are in the
    // container's environment, after the hash.
    let (program, config_mount, hash, program_environment) = match delivery {
        Delivery::Mounted { config_hash } => {
            let mount = VolumeMount {
                name: CONFIG_VOLUME.into(),
                mount_path: CONFIG_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            };
            // Both containers read the mounted file only once, so each waits until the file's
            // hash is the one this pod was made for (the kubelet may still show the previous
            // ConfigMap).
            let hash = vec![env_var(CONFIG_HASH_ENV, config_hash.into())];
            (ENTRYPOINT, mount, Some(hash), entrypoint_environment(&POD_FILES))
        }
        Delivery::Live => {
            let mount = VolumeMount { name: LIVE_VOLUME.into(), mount_path: LIVE_DIR.into(), ..VolumeMount::default() };
            (LIVE_ENTRYPOINT, mount, None, live_environment(&LIVE_POD_FILES, RELOAD_POLICY))
        }
    };
    let nginx_environment = hash.iter().flatten().cloned();
    let nginx_environment =
        nginx_environment.chain(program_environment.into_iter().map(|(name, value)| env_var(name, value))).collect();
    let container = Container {
        name: "nginx".into(),
        image: Some(proxy.image.unwrap_or_else(|| settings.image.clone())),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(["/bin/sh", "-c", program, "nginx"].map(String::from).to_vec()),
        args: Some(nginx_args()),
        env: Some(nginx_environment),
        ports: Some(
            workload
                .ports
                .iter()
                .map(|p| ContainerPort {
                    container_port: p.port,
                    protocol: Some(p.protocol.to_string()),
                    ..ContainerPort::default()
                })
                .collect(),
        ),
        readiness_probe: Some(readiness_probe(workload)),
        lifecycle: Some(graceful_stop()),
        resources: Some(proxy.resources.unwrap_or_else(default_resources)),
        security_context: Some(security_context.clone()),
        volume_mounts: Some(match delivery {
            Delivery::Mounted { .. } => vec![config_mount.clone(), tmp_mount],
            Delivery::Live => vec![config_mount.clone(), tmp_mount, log_mount()],
        }),
        ..Container::default()
    };
    let sidecar = settings.metrics_image.as_ref().map(|image| {
        let mut mounts = vec![config_mount];
        if let Delivery::Live = delivery {
            mounts.push(VolumeMount {
                name: TOKEN_VOLUME.into(),
                mount_path: TOKEN_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
            mounts.push(log_mount());
        }
        // Live, the sidecar checks each configuration's signature with the operator's key.
        let key = |signer: &ConfigSigner| vec![env_var(CONFIG_KEY_ENV, signer.public_key().to_string())];
        let env = match delivery {
            Delivery::Live => settings.signer.as_ref().map(key),
            Delivery::Mounted { .. } => hash,
        };
        Container {
            security_context: Some(security_context),
            volume_mounts: Some(mounts),
            env,
            ..metrics_sidecar(image, metrics_port(workload.port_numbers()), sidecar_source(owner, delivery))
        }
    });
    let service_account_name = match delivery {
        Delivery::Live => Some(api::proxy_account_name(&owner.name)),
        Delivery::Mounted { .. } => None,
    };
    PodSpec {
        service_account_name,
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
        volumes: Some(volumes(owner, delivery)),
        ..PodSpec::default()
    }
}

/// A variable of a container's environment.
fn env_var(name: &str, value: String) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value), value_from: None }
}

/// The pod's volumes: where the configuration comes from, and nginx's writable `/tmp`.
fn volumes(owner: &Owner, delivery: Delivery<'_>) -> Vec<Volume> {
    let tmp = Volume { name: TMP_VOLUME.into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Volume::default() };
    match delivery {
        Delivery::Mounted { .. } => vec![
            Volume {
                name: CONFIG_VOLUME.into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: api::proxy_configmap_name(&owner.name),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            },
            tmp,
        ],
        Delivery::Live => vec![
            Volume { name: LIVE_VOLUME.into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Volume::default() },
            tmp,
            token_volume(),
            log_volume(),
        ],
    }
}

/// The access log's volume, which nginx writes and the sidecar reads and frees (see
/// [`access_log`](super::access_log)): a tmpfs of [`LOG_VOLUME_BYTES`], so that a stalled
/// sidecar makes nginx drop lines, never fill the node's disk or get the pod evicted.
fn log_volume() -> Volume {
    let empty_dir = EmptyDirVolumeSource {
        medium: Some("Memory".into()),
        size_limit: Some(Quantity(format!("{}Mi", LOG_VOLUME_BYTES >> 20))),
    };
    Volume { name: LOG_VOLUME.into(), empty_dir: Some(empty_dir), ..Volume::default() }
}

/// Where both containers see the access log's volume.
fn log_mount() -> VolumeMount {
    VolumeMount { name: LOG_VOLUME.into(), mount_path: LOG_DIR.into(), ..VolumeMount::default() }
}

/// The sidecar's credentials: a token of the pod's ServiceAccount (which may read the proxy's
/// ConfigMap only), the cluster's CA and the pod's namespace, laid out as an automounted token
/// is, but in the sidecar only.
fn token_volume() -> Volume {
    let ca = ConfigMapProjection {
        name: "kube-root-ca.crt".into(),
        items: Some(vec![KeyToPath { key: "ca.crt".into(), path: "ca.crt".into(), mode: None }]),
        optional: None,
    };
    let namespace = DownwardAPIVolumeFile {
        path: "namespace".into(),
        field_ref: Some(ObjectFieldSelector { field_path: "metadata.namespace".into(), api_version: None }),
        ..DownwardAPIVolumeFile::default()
    };
    let token =
        ServiceAccountTokenProjection { path: "token".into(), expiration_seconds: Some(TOKEN_SECONDS), audience: None };
    Volume {
        name: TOKEN_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: None,
            sources: Some(vec![
                VolumeProjection { service_account_token: Some(token), ..VolumeProjection::default() },
                VolumeProjection { config_map: Some(ca), ..VolumeProjection::default() },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection { items: Some(vec![namespace]) }),
                    ..VolumeProjection::default()
                },
            ]),
        }),
        ..Volume::default()
    }
}

/// Where the sidecar reads the configuration: the mounted file, or the ConfigMap it watches
/// (writing each new one for nginx).
fn sidecar_source(owner: &Owner, delivery: Delivery<'_>) -> Vec<String> {
    match delivery {
        Delivery::Mounted { .. } => vec![format!("--config={}", POD_FILES.mounted)],
        Delivery::Live => {
            // The owner too, so that the sidecar refuses another's configuration from the first,
            // and its UID, which the signature binds (a deleted namesake's is refused).
            let configmap = format!("--configmap={}", api::proxy_configmap_name(&owner.name));
            let owner_uid = format!("--owner-uid={}", owner.reference.uid);
            vec![configmap, format!("--live-dir={LIVE_DIR}"), format!("--owner={}", owner.identity), owner_uid]
        }
    }
}

/// The metrics sidecar: balancer's own image counting the sessions nginx logs for it (see
/// [`access_log`](super::access_log)), serving `/metrics` in plain HTTP on the pod network,
/// as nginx-prometheus-exporter does (proxy pods mount no service-account token, so the sidecar
/// could not review a scraper's token). No probes: a sidecar in trouble must not take the
/// proxy out of its Service.
///
/// A native sidecar (an init container that restarts `Always`): the kubelet starts it before
/// nginx and stops it only once nginx has exited, so it counts every session nginx drains, and
/// serves the last count for a few seconds more.
fn metrics_sidecar(image: &str, port: u16, source: Vec<String>) -> Container {
    let args: Vec<String> = ["proxy-metrics".to_string()]
        .into_iter()
        .chain(source)
        .chain([
            // Both families: the controller asks the sidecar at the pod's address, IPv6 in an
            // IPv6-only cluster; the sidecar falls back to IPv4 on a node without IPv6.
            format!("--listen=[::]:{port}"),
            format!("--log-file={LOG_FILE}"),
            format!("--drain={}s", SIDECAR_DRAIN.as_secs()),
        ])
        .collect();
    Container {
        name: METRICS_CONTAINER.into(),
        image: Some(image.to_string()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["/balancer".into()]),
        args: Some(args),
        restart_policy: Some("Always".into()),
        ports: Some(vec![ContainerPort {
            name: Some(METRICS_PORT_NAME.into()),
            container_port: i32::from(port),
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
fn readiness_probe(workload: &Workload) -> Probe {
    let tcp_port =
        workload.ports.iter().find(|p| p.protocol == Protocol::Tcp && !p.accepts_proxy_protocol).map(|p| p.port);
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

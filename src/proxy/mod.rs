//! The objects a Balancer owns, built as pure functions of the Balancer.
//!
//! Each builder returns exactly the fields balancer manages (server-side apply
//! semantics): the controller applies them as they are and compares them with
//! the cached objects as a subset, so server-populated fields never look like drift.

pub mod access_log;
mod budget;
mod deployment;
mod identity;
mod meta;
pub mod model;
pub mod nginx;
pub mod reload;
mod services;
pub mod signals;
pub mod signature;
pub mod stop;
pub mod upstreams;
mod workload;

pub use budget::proxy_disruption_budget;
pub use deployment::{
    METRICS_CONTAINER, METRICS_PORT_NAME, ProxySettings, TOKEN_DIR, proxy_config_map, proxy_deployment,
    workload_deployment, written_by_another,
};
pub use identity::{CONFIG_READER_VERBS, proxy_config_reader, proxy_config_reader_binding, proxy_service_account};
pub use meta::{
    BACKEND_LABEL, BALANCER_NAME_LABEL, COMPONENT_BACKEND, COMPONENT_FRONTEND, COMPONENT_LABEL, COMPONENT_PROXY,
    CONFIG_HASH_ANNOTATION, DESIRED_HASH_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, Owner, OwnerError, labels,
    proxy_selector, proxy_selector_string, stamped,
};
pub use services::{backend_service, backend_services, front_service, workload_front_service};
pub use workload::{Workload, WorkloadPort};

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};

use self::model::{Destination, ProxyConfig, Targets, UpstreamTargets};
use crate::api::{self, BackendSpec, Protocol, UpstreamKind};
use crate::spec::{Admitted, AdmittedPort};

/// One backend as the proxy reaches it: its spec, its Service's cluster IP, and its ready pods.
#[derive(Debug, Clone)]
pub struct BackendTarget<'a> {
    /// The backend as the spec gives it.
    pub spec: &'a BackendSpec,
    /// Its Service's cluster IP, as the API server assigned it; `None` before there is one (an
    /// offline preview), when the proxy names the Service instead. With the IP the proxy needs
    /// no cluster DNS: nginx refuses to start when it cannot resolve an upstream name, so a DNS
    /// outage would stop proxy pods from restarting.
    pub cluster_ip: Option<IpAddr>,
    /// Its ready pods, from its Service's EndpointSlices; `None` when they were not read (an
    /// offline preview, or a proxy that sends to the Services).
    pub ready_pods: Option<Vec<ReadyPod>>,
}

impl<'a> BackendTarget<'a> {
    /// Each backend of `spec` as an offline preview knows it: by its Service's name, no pod.
    pub fn previews(spec: &'a Admitted) -> Vec<BackendTarget<'a>> {
        let preview = |spec| BackendTarget { spec, cluster_ip: None, ready_pods: None };
        spec.backends.iter().map(preview).collect()
    }
}

/// The proxy side of a Balancer, built once its backend Services have cluster IPs.
#[derive(Debug, Clone)]
pub struct Proxy {
    /// The proxy's ConfigMap: `nginx.conf` and its model.
    pub config_map: ConfigMap,
    /// The proxy Deployment.
    pub deployment: Deployment,
    /// The front Service.
    pub front_service: Service,
    /// The rendered `nginx.conf` (also inside `config_map`, with its model).
    pub nginx_conf: String,
    /// Whether the upstreams are the backends' pods (else their Services).
    pub pod_upstreams: bool,
}

/// One ready pod of a backend, as its Service's EndpointSlices list it: its address and the
/// ports of the Service's ports on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyPod {
    /// The pod's address.
    pub address: IpAddr,
    /// The pod's ports of the Service's ports.
    pub ports: Vec<PodPort>,
}

/// A Service port on a pod: the Service port's name (empty for an unnamed one), its protocol,
/// and the pod's port number (the `targetPort`, resolved).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodPort {
    /// The Service port's name, empty for an unnamed one.
    pub name: String,
    /// The Service port's protocol.
    pub protocol: Protocol,
    /// The pod's port number.
    pub port: u16,
}

/// Whether a Balancer's proxy sends to its backends' pods: `spec.proxy.upstreams: Pods` (the
/// default), with live delivery (the metrics sidecar). Without it every endpoint change would
/// roll the proxy pods, so the proxy uses the Services.
pub fn pod_upstreams(spec: &Admitted, settings: &ProxySettings) -> bool {
    settings.metrics_image.is_some() && spec.upstreams() == UpstreamKind::Pods
}

/// The ConfigMap, Deployment and front Service of a defaulted, valid spec, its backends at
/// `backends` (one per backend of the spec).
///
/// The upstreams are the backends' ready pods when [`pod_upstreams`] allows it, every backend's
/// pods were read, and the result fits a ConfigMap (see [`model::fits`]); else each backend is
/// its Service. Without live delivery the pod template carries the hash of `nginx.conf`, which
/// holds the backends' addresses: a new configuration, or a backend Service recreated with a new
/// cluster IP, rolls the proxy pods.
pub fn proxy(owner: &Owner, spec: &Admitted, settings: &ProxySettings, backends: &[BackendTarget<'_>]) -> Proxy {
    let access_log = settings.metrics_image.as_ref().map(|_| access_log::LOG_FILE);
    let of = |targets: &dyn Fn(&BackendTarget<'_>, AdmittedPort<'_>) -> Targets| {
        // By name, unique within a spec; a backend not given is reached by its Service's name.
        let by_name = |backend: &BackendSpec, port: AdmittedPort<'_>| {
            let unknown = BackendTarget { spec: backend, cluster_ip: None, ready_pods: None };
            targets(backends.iter().find(|t| t.spec.name == backend.name).unwrap_or(&unknown), port)
        };
        let config = ProxyConfig::of(&owner.name, spec, &settings.load_modules, access_log, &&by_name);
        let conf = nginx::write(&config);
        let json = config.to_json();
        (conf, json)
    };
    let service = |backend: &BackendTarget<'_>, port: AdmittedPort<'_>| service_destination(owner, backend, port);
    let pods_read = backends.iter().all(|b| b.ready_pods.is_some());
    let pod_targets = (pods_read && pod_upstreams(spec, settings)).then(|| {
        of(&|backend: &BackendTarget<'_>, port: AdmittedPort<'_>| {
            let name = port.name.as_deref().unwrap_or_default();
            let pods = pod_addresses(backend.ready_pods.as_deref().unwrap_or_default(), name, port.protocol);
            Targets::Pods { service: service(backend, port), pods }
        })
    });
    let (pod_upstreams, (nginx_conf, model)) = match pod_targets.filter(|(conf, json)| model::fits(conf, json)) {
        Some(rendered) => (true, rendered),
        None => {
            (false, of(&|backend: &BackendTarget<'_>, port: AdmittedPort<'_>| Targets::Service(service(backend, port))))
        }
    };
    Proxy {
        config_map: proxy_config_map(owner, &nginx_conf, &model),
        deployment: proxy_deployment(owner, spec, settings, &nginx::config_hash(&nginx_conf)),
        front_service: front_service(owner, spec),
        nginx_conf,
        pod_upstreams,
    }
}

impl<F: Fn(&BackendSpec, AdmittedPort<'_>) -> Targets + ?Sized> UpstreamTargets for &F {
    fn targets(&self, backend: &BackendSpec, port: AdmittedPort<'_>) -> Targets {
        self(backend, port)
    }
}

/// Where `pods` take connections for their Service's port `name` (empty for an unnamed one) of
/// `protocol`: each pod's address at its port of that name and protocol, a pod without one
/// left out. One per address: endpoints may share one (distinct pods listed at one address, a
/// hostile slice), and their ports need not sort them together.
pub fn pod_addresses(pods: &[ReadyPod], name: &str, protocol: Protocol) -> Vec<SocketAddr> {
    let mut seen = HashSet::new();
    let at_port = |pod: &ReadyPod| {
        let on_pod = pod.ports.iter().find(|p| p.name == name && p.protocol == protocol)?;
        Some(SocketAddr::new(pod.address, on_pod.port))
    };
    pods.iter().filter_map(at_port).filter(|address| seen.insert(*address)).collect()
}

/// A backend's Service at `port`: its cluster IP, or its name when it has none yet.
fn service_destination(owner: &Owner, backend: &BackendTarget<'_>, port: AdmittedPort<'_>) -> Destination {
    match backend.cluster_ip {
        Some(ip) => Destination::Address(SocketAddr::new(ip, port.number())),
        None => {
            let service = api::backend_service_name(&owner.name, &backend.spec.name);
            Destination::Name { host: format!("{service}.{}.svc", owner.namespace), port: port.number() }
        }
    }
}

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
pub mod stop;
pub mod upstreams;

pub use budget::proxy_disruption_budget;
pub use deployment::{
    METRICS_CONTAINER, METRICS_PORT_NAME, ProxySettings, TOKEN_DIR, proxy_config_map, proxy_deployment,
};
pub use identity::{CONFIG_READER_VERBS, proxy_config_reader, proxy_config_reader_binding, proxy_service_account};
pub use meta::{
    BACKEND_LABEL, BALANCER_NAME_LABEL, COMPONENT_BACKEND, COMPONENT_FRONTEND, COMPONENT_LABEL, COMPONENT_PROXY,
    CONFIG_HASH_ANNOTATION, DESIRED_HASH_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, Owner, OwnerError, labels,
    proxy_selector, proxy_selector_string, stamped,
};
pub use services::{backend_service, backend_services, front_service};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};

use self::model::{ProxyConfig, Targets, UpstreamTargets};
use crate::api::{self, BackendSpec, Protocol, UpstreamKind};
use crate::spec::{Admitted, AdmittedPort};

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
    /// The rendered `nginx.conf` (also inside `config_map`, with its model).
    pub nginx_conf: String,
    /// Whether the upstreams are the backends' pods (else their Services).
    pub pod_upstreams: bool,
}

/// One ready pod of a backend, as its Service's EndpointSlices list it: its address and the
/// ports of the Service's ports on it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReadyPod {
    pub address: String,
    pub ports: Vec<PodPort>,
}

/// A Service port on a pod: the Service port's name (empty for an unnamed one), its protocol,
/// and the pod's port number (the `targetPort`, resolved).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodPort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// Whether a Balancer's proxy sends to its backends' pods: `spec.proxy.upstreams: Pods` (the
/// default), with live delivery (the metrics sidecar). Without it every endpoint change would
/// roll the proxy pods, so the proxy uses the Services.
pub fn pod_upstreams(spec: &Admitted, settings: &ProxySettings) -> bool {
    settings.metrics_image.is_some() && spec.upstreams() == UpstreamKind::Pods
}

/// The ConfigMap, Deployment and front Service of a defaulted, valid spec.
///
/// `pods` (each backend's ready pods, in the spec's order) makes the upstreams pods, when
/// [`pod_upstreams`] allows it and the result fits a ConfigMap (see [`model::fits`]); else each
/// backend is its Service. Without live delivery the pod template carries the hash of
/// `nginx.conf`, which holds the backends' addresses: a new configuration, or a backend Service
/// recreated with a new cluster IP, rolls the proxy pods.
pub fn proxy(
    owner: &Owner,
    spec: &Admitted,
    settings: &ProxySettings,
    hosts: BackendHosts<'_>,
    pods: Option<&[Vec<ReadyPod>]>,
) -> Proxy {
    let service = ServiceAddresses { owner, spec, hosts };
    let access_log = settings.metrics_image.as_ref().map(|_| access_log::LOG_FILE);
    let of = |targets: &dyn Fn(&BackendSpec, AdmittedPort<'_>) -> Targets| {
        let config = ProxyConfig::of(&owner.name, spec, &settings.load_modules, access_log, &targets);
        let conf = nginx::write(&config);
        let json = config.to_json();
        (conf, json)
    };
    let pod_targets = pods.filter(|_| pod_upstreams(spec, settings)).map(|pods| {
        of(&|backend: &BackendSpec, port: AdmittedPort<'_>| {
            let ready = spec.backends.iter().position(|b| b.name == backend.name).and_then(|i| pods.get(i));
            let mut addresses: Vec<String> =
                ready.into_iter().flatten().filter_map(|pod| pod_address(pod, port)).collect();
            addresses.dedup();
            Targets::Pods { service: service.address(backend, port), pods: addresses }
        })
    });
    let (pod_upstreams, (nginx_conf, model)) = match pod_targets.filter(|(conf, json)| model::fits(conf, json)) {
        Some(rendered) => (true, rendered),
        None => (
            false,
            of(&|backend: &BackendSpec, port: AdmittedPort<'_>| Targets::Service(service.address(backend, port))),
        ),
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

/// `ip:port` (`[ip]:port` for IPv6) of `pod` at the Balancer port `port`: the pod's port of the
/// backend Service's port of the same name and protocol; `None` when the pod has none.
fn pod_address(pod: &ReadyPod, port: AdmittedPort<'_>) -> Option<String> {
    let name = port.name.as_deref().unwrap_or_default();
    let on_pod = pod.ports.iter().find(|p| p.name == name && p.protocol == port.protocol)?;
    Some(host_port(&pod.address, on_pod.port))
}

fn host_port(host: &str, port: impl std::fmt::Display) -> String {
    match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    }
}

/// Each backend's Service address, as `hosts` says.
struct ServiceAddresses<'a> {
    owner: &'a Owner,
    spec: &'a Admitted,
    hosts: BackendHosts<'a>,
}

impl ServiceAddresses<'_> {
    fn address(&self, backend: &BackendSpec, port: AdmittedPort<'_>) -> String {
        let service = api::backend_service_name(&self.owner.name, &backend.name);
        let position = self.spec.backends.iter().position(|b| b.name == backend.name);
        let host = match self.hosts {
            BackendHosts::ClusterIps(ips) => position.and_then(|i| ips.get(i)).map_or("", String::as_str),
            BackendHosts::ServiceNames => "",
        };
        match host {
            "" => format!("{service}.{}.svc:{}", self.owner.namespace, port.port),
            ip => host_port(ip, port.port),
        }
    }
}

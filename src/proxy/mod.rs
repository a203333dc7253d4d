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

use crate::api::{self, BackendSpec, BalancerPort};
use crate::spec::Admitted;

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
    let access_log = settings.metrics_image.as_ref().map(|_| access_log::SidecarPorts::of(spec).log);
    let nginx_conf = nginx::render(&owner.name, spec, &settings.load_modules, access_log, &address);
    Proxy {
        config_map: proxy_config_map(owner, &nginx_conf),
        deployment: proxy_deployment(owner, spec, settings, &nginx::config_hash(&nginx_conf)),
        front_service: front_service(owner, spec),
        nginx_conf,
    }
}

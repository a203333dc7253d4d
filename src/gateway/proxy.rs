//! A Gateway's proxy: the same pods, ConfigMap and front Service a Balancer gets, built by the
//! same builders from the Gateway's [`Workload`] and its assembled listeners. Pure.
//!
//! The children are named after [`gateway_proxy_name`] (GEP-1762's `<gateway>-<class>`) and
//! carry GEP-1762's labels, and `spec.infrastructure`'s labels and annotations, on their own
//! metadata (never on the pod template, whose labels Services select by).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use super::api::gateways::Gateway;
use super::parameters::{PARAMETERS_ANNOTATION, ProxyParameters};
use crate::api::{DEFAULT_DRAIN_TIMEOUT, ServiceType, gateway_proxy_name};
use crate::proxy::model::{self, Listener, OwnerKind, ProxyConfig};
use crate::proxy::{
    BALANCER_NAME_LABEL, COMPONENT_LABEL, MANAGED_BY_LABEL, Owner, OwnerError, ProxySettings, Workload, WorkloadPort,
    access_log, nginx, proxy_config_map, proxy_config_reader, proxy_config_reader_binding, proxy_service_account,
    workload_deployment, workload_front_service,
};
use crate::spec::SpecPolicy;

/// GEP-1762's label on what a Gateway's controller makes: the Gateway's name.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
/// GEP-1762's label on what a Gateway's controller makes: its GatewayClass's name.
pub const GATEWAY_CLASS_LABEL: &str = "gateway.networking.k8s.io/gateway-class-name";

/// A Gateway's proxy, built.
#[derive(Debug, Clone)]
pub struct GatewayProxy {
    /// The model, which `nginx_conf` renders.
    pub config: ProxyConfig,
    /// `nginx.conf`.
    pub nginx_conf: String,
    /// The proxy pods asked for.
    pub workload: Workload,
    /// The proxy's ConfigMap, signed for `Gateway/<name>`.
    pub config_map: ConfigMap,
    /// The proxy Deployment.
    pub deployment: Deployment,
    /// The front Service, whose address is the Gateway's.
    pub front_service: Service,
    /// The pods' ServiceAccount, and the Role and binding that let it read the ConfigMap.
    pub identity: (ServiceAccount, Role, RoleBinding),
}

impl GatewayProxy {
    /// Whether its `nginx.conf` and model fit one ConfigMap (see [`model::fits`]).
    pub fn fits(&self) -> bool {
        model::fits(&self.nginx_conf, &self.config.to_json())
    }
}

/// Who a Gateway's children belong to: named after [`gateway_proxy_name`], signed for
/// `Gateway/<name>`.
pub fn gateway_owner(gateway: &Gateway) -> Result<Owner, OwnerError> {
    let name = gateway.metadata.name.clone().ok_or(OwnerError::MissingName)?;
    let namespace = gateway.metadata.namespace.clone().ok_or(OwnerError::MissingNamespace)?;
    let mut reference = gateway.controller_owner_ref(&()).ok_or(OwnerError::MissingUid)?;
    reference.block_owner_deletion = Some(true);
    let config = ProxyConfig { kind: OwnerKind::Gateway, name: name.clone(), ..empty_config() };
    Ok(Owner {
        name: gateway_proxy_name(&name, &gateway.spec.gateway_class_name),
        namespace,
        reference,
        identity: config.identity(),
    })
}

fn empty_config() -> ProxyConfig {
    ProxyConfig {
        kind: OwnerKind::Gateway,
        name: String::new(),
        load_modules: Vec::new(),
        drain_timeout: DEFAULT_DRAIN_TIMEOUT.to_string(),
        access_log: None,
        listeners: Vec::new(),
        canary_window: None,
    }
}

/// The proxy pods a Gateway's `listeners` need: as many as its `parameters` say (else the
/// operator's default), with their settings, and one port per listener port and protocol,
/// named `tcp-<port>` or `udp-<port>`.
pub fn gateway_workload(listeners: &[Listener], policy: &SpecPolicy, parameters: &ProxyParameters) -> Workload {
    let ports = listeners
        .iter()
        .map(|l| WorkloadPort {
            name: Some(format!("{}-{}", l.protocol.as_str().to_ascii_lowercase(), l.port)),
            port: i32::from(l.port),
            protocol: l.protocol,
            accepts_proxy_protocol: false,
        })
        .collect();
    Workload { replicas: parameters.replicas.unwrap_or(policy.replicas), pods: parameters.proxy.clone(), ports }
}

/// The proxy of `gateway`, owned by `owner`, serving `listeners`, with the settings its
/// `parameters` give (see [`parameters`](super::parameters)).
pub fn gateway_proxy(
    owner: &Owner,
    gateway: &Gateway,
    listeners: Vec<Listener>,
    settings: &ProxySettings,
    parameters: &ProxyParameters,
) -> GatewayProxy {
    let workload = gateway_workload(&listeners, &settings.policy, parameters);
    let drain_timeout = parameters.proxy.drain_timeout.clone().unwrap_or_else(|| DEFAULT_DRAIN_TIMEOUT.to_string());
    let config = ProxyConfig {
        drain_timeout,
        name: gateway.metadata.name.clone().unwrap_or_default(),
        load_modules: settings.load_modules.clone(),
        access_log: settings.metrics_image.as_ref().map(|_| access_log::LOG_FILE.to_string()),
        listeners,
        ..empty_config()
    };
    let nginx_conf = nginx::write(&config);
    let model = config.to_json();
    let carried = carried(gateway);
    let mut proxy = GatewayProxy {
        config_map: proxy_config_map(owner, &nginx_conf, &model),
        deployment: workload_deployment(owner, &workload, settings, &nginx::config_hash(&nginx_conf)),
        front_service: workload_front_service(owner, &workload, ServiceType::ClusterIp),
        identity: (proxy_service_account(owner), proxy_config_reader(owner), proxy_config_reader_binding(owner)),
        config,
        nginx_conf,
        workload,
    };
    for meta in [
        &mut proxy.config_map.metadata,
        &mut proxy.deployment.metadata,
        &mut proxy.front_service.metadata,
        &mut proxy.identity.0.metadata,
        &mut proxy.identity.1.metadata,
        &mut proxy.identity.2.metadata,
    ] {
        carry(meta, &carried);
    }
    // After what `spec.infrastructure` carries: the record is the operator's alone.
    let record = serde_json::to_string(parameters).unwrap_or_default();
    proxy.deployment.metadata.annotations.get_or_insert_default().insert(PARAMETERS_ANNOTATION.to_string(), record);
    proxy
}

/// The labels and annotations every child of `gateway` carries: `spec.infrastructure`'s, and
/// GEP-1762's labels (each only when its value is one a label may hold, 63 characters at most).
fn carried(gateway: &Gateway) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let infrastructure = gateway.spec.infrastructure.as_ref();
    let mut labels = infrastructure.and_then(|i| i.labels.clone()).unwrap_or_default();
    let annotations = infrastructure.and_then(|i| i.annotations.clone()).unwrap_or_default();
    let name = gateway.metadata.name.as_deref().unwrap_or_default();
    for (key, value) in [(GATEWAY_NAME_LABEL, name), (GATEWAY_CLASS_LABEL, gateway.spec.gateway_class_name.as_str())] {
        if value.len() <= 63 {
            labels.insert(key.to_string(), value.to_string());
        }
    }
    (labels, annotations)
}

/// Adds `carried` to a child's metadata; balancer's own labels (managed-by, owner, component)
/// keep their values.
fn carry(meta: &mut ObjectMeta, (labels, annotations): &(BTreeMap<String, String>, BTreeMap<String, String>)) {
    let own = [MANAGED_BY_LABEL, BALANCER_NAME_LABEL, COMPONENT_LABEL];
    let child_labels = meta.labels.get_or_insert_default();
    for (key, value) in labels.iter().filter(|(k, _)| !own.contains(&k.as_str())) {
        child_labels.entry(key.clone()).or_insert_with(|| value.clone());
    }
    if !annotations.is_empty() {
        let child_annotations = meta.annotations.get_or_insert_default();
        for (key, value) in annotations {
            child_annotations.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
}

/// Whether `key` is in Kubernetes' own domains (`kubernetes.io`, `k8s.io`, and their
/// subdomains).
fn is_reserved(key: &str) -> bool {
    let domain = key.split_once('/').map_or("", |(domain, _)| domain);
    ["kubernetes.io", "k8s.io"].iter().any(|d| domain == *d || domain.ends_with(&format!(".{d}")))
}

/// Why `gateway`'s `spec.infrastructure` is refused under `policy`, if it is: an annotation in
/// Kubernetes' own domains, or one whose key starts with none of
/// `--allowed-pod-annotation-prefixes`, as a Balancer's `spec.proxy.podAnnotations` would be.
pub fn infrastructure_refusal(gateway: &Gateway, policy: &SpecPolicy) -> Option<String> {
    let annotations = gateway.spec.infrastructure.as_ref()?.annotations.as_ref()?;
    // Kubernetes' own keys belong to its controllers (a Deployment's revision, say): written
    // by balancer too, the two would rewrite each other.
    let reserved: Vec<&str> = annotations.keys().filter(|key| is_reserved(key)).map(String::as_str).collect();
    if !reserved.is_empty() {
        return Some(format!(
            "spec.infrastructure.annotations: {} are Kubernetes' own (kubernetes.io/ and k8s.io/ keys)",
            crate::util::echo::quoted(&reserved.join(", "))
        ));
    }
    let allowed = policy.scheduling.pod_annotation_prefixes.as_ref()?;
    let refused: Vec<&str> = annotations
        .keys()
        .filter(|key| !allowed.iter().any(|prefix| key.starts_with(prefix.as_str())))
        .map(String::as_str)
        .collect();
    (!refused.is_empty()).then(|| {
        format!(
            "spec.infrastructure.annotations: {} start with none of the prefixes the operator allows \
             (--allowed-pod-annotation-prefixes): {}",
            crate::util::echo::quoted(&refused.join(", ")),
            allowed.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn gateway(annotations: serde_json::Value) -> Gateway {
        serde_json::from_value(json!({
            "metadata": {"namespace": "apps", "name": "gw"},
            "spec": {"gatewayClassName": "balancer", "listeners": [], "infrastructure": {"annotations": annotations}}
        }))
        .expect("a Gateway")
    }

    #[test]
    fn infrastructure_annotations_stay_out_of_kubernetes_own_keys_and_within_the_policy() {
        let any = SpecPolicy::default();
        assert_eq!(infrastructure_refusal(&gateway(json!({"example.com/team": "db"})), &any), None);
        for key in ["deployment.kubernetes.io/revision", "kubernetes.io/description", "x.k8s.io/y"] {
            assert!(infrastructure_refusal(&gateway(json!({key: "1"})), &any).is_some(), "{key}");
        }
        let strict = SpecPolicy {
            scheduling: crate::spec::SchedulingPolicy {
                pod_annotation_prefixes: Some(vec!["prometheus.io/".into()]),
                ..crate::spec::SchedulingPolicy::ANY
            },
            ..SpecPolicy::default()
        };
        assert!(infrastructure_refusal(&gateway(json!({"example.com/team": "db"})), &strict).is_some());
        assert_eq!(infrastructure_refusal(&gateway(json!({"prometheus.io/scrape": "true"})), &strict), None);
    }
}

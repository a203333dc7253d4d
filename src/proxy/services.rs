//! The Services of a Balancer: one per backend, and the front Service in front of the proxy pods.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta::{BACKEND_LABEL, COMPONENT_BACKEND, COMPONENT_FRONTEND, Owner, labels, metadata, proxy_selector};
use super::workload::Workload;
use crate::api::{self, BackendSpec, BalancerPort, ServiceType};
use crate::spec::{Admitted, AdmittedPort};

/// The backend Services of a defaulted, valid spec, in backend order: applied first,
/// because their cluster IPs go into `nginx.conf`.
pub fn backend_services(owner: &Owner, spec: &Admitted) -> Vec<Service> {
    spec.backends.iter().map(|b| backend_service(owner, spec, b)).collect()
}

/// One Service port per Balancer port, forwarding to `target(port)`.
fn service_ports(spec: &Admitted, target: impl Fn(AdmittedPort<'_>) -> IntOrString) -> Vec<ServicePort> {
    spec.ports()
        .map(|p| ServicePort {
            name: p.name.clone().filter(|n| !n.is_empty()),
            protocol: Some(p.protocol.to_string()),
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
    let ports = service_ports(spec, |p| BalancerPort::effective_target_port(&p));
    Service {
        metadata: metadata(owner, api::backend_service_name(&owner.name, &backend.name), labels),
        spec: Some(ServiceSpec {
            type_: Some(ServiceType::ClusterIp.to_string()),
            selector: Some(spec.merged_selector(backend)),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// `<balancer>`: in front of the proxy pods, every Balancer port, exposed as `spec.service`
/// says (a ClusterIP Service by default).
pub fn front_service(owner: &Owner, spec: &Admitted) -> Service {
    let exposure = spec.service.clone().unwrap_or_default();
    let node_ports = spec.service_type().has_node_ports();
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
            external_traffic_policy: spec.external_traffic_policy().filter(|_| node_ports).map(|p| p.to_string()),
            load_balancer_class: exposure.load_balancer_class,
            load_balancer_source_ranges: exposure.load_balancer_source_ranges.filter(|r| !r.is_empty()),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// `<owner>`, in front of the proxy pods of `workload`, of type `service_type`: a Gateway's
/// front Service (a Balancer's is [`front_service`], which `spec.service` shapes).
pub fn workload_front_service(owner: &Owner, workload: &Workload, service_type: ServiceType) -> Service {
    let ports = workload
        .ports
        .iter()
        .map(|p| ServicePort {
            name: p.name.clone().filter(|n| !n.is_empty()),
            protocol: Some(p.protocol.to_string()),
            port: p.port,
            target_port: Some(IntOrString::Int(p.port)),
            ..ServicePort::default()
        })
        .collect();
    Service {
        metadata: metadata(owner, owner.name.clone(), labels(&owner.name, COMPONENT_FRONTEND)),
        spec: Some(ServiceSpec {
            type_: Some(service_type.to_string()),
            selector: Some(proxy_selector(&owner.name)),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

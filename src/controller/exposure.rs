//! Where a Balancer is reached: read from its front Service for the status.

use k8s_openapi::api::core::v1::Service;

use crate::api::v1beta1::{BalancerAddress, BalancerStatus, NodePortStatus};
use crate::api::{Protocol, ServiceType};

/// The status's `addresses` and `nodePorts`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Exposure {
    pub addresses: Vec<BalancerAddress>,
    pub node_ports: Vec<NodePortStatus>,
}

impl Exposure {
    /// A LoadBalancer Service is reached at its ingress (none while the cloud provisions it);
    /// any other at its cluster IPs. Node ports as the API server allocated them.
    pub(super) fn of(service: &Service) -> Self {
        let spec = service.spec.clone().unwrap_or_default();
        let load_balancer = spec.type_.as_deref() == Some(ServiceType::LoadBalancer.as_str());
        let addresses = if load_balancer {
            let ingress = service.status.as_ref().and_then(|s| s.load_balancer.as_ref()?.ingress.clone());
            ingress
                .unwrap_or_default()
                .into_iter()
                .filter_map(|i| match (i.ip, i.hostname) {
                    (Some(ip), _) if !ip.is_empty() => Some(address("IPAddress", ip)),
                    (_, Some(host)) if !host.is_empty() => Some(address("Hostname", host)),
                    _ => None,
                })
                .collect()
        } else {
            let ips = spec.cluster_ips.filter(|ips| !ips.is_empty()).or(spec.cluster_ip.map(|ip| vec![ip]));
            ips.unwrap_or_default()
                .into_iter()
                .filter(|ip| !ip.is_empty() && ip != "None")
                .map(|ip| address("IPAddress", ip))
                .collect()
        };
        let node_ports = spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| {
                let node_port = p.node_port.filter(|n| *n > 0)?;
                Some(NodePortStatus {
                    port: p.port,
                    protocol: p.protocol.unwrap_or_else(|| Protocol::Tcp.to_string()),
                    node_port,
                })
            })
            .collect();
        Exposure { addresses, node_ports }
    }

    /// What the status said last (a reconcile that stops early does not look at the Service).
    pub(super) fn previous(status: Option<&BalancerStatus>) -> Self {
        status.map_or_else(Exposure::default, |s| Exposure {
            addresses: s.addresses.clone(),
            node_ports: s.node_ports.clone(),
        })
    }
}

fn address(type_: &str, value: String) -> BalancerAddress {
    BalancerAddress { type_: type_.into(), value }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_cluster_ip_service_is_reached_at_its_cluster_ips() {
        let s = service(
            json!({"spec": {"type": "ClusterIP", "clusterIP": "10.0.0.9", "clusterIPs": ["10.0.0.9", "fd00::9"],
                                         "ports": [{"port": 80, "protocol": "TCP"}]}}),
        );
        let e = Exposure::of(&s);
        assert_eq!(e.addresses.iter().map(|a| a.value.as_str()).collect::<Vec<_>>(), ["10.0.0.9", "fd00::9"]);
        assert!(e.node_ports.is_empty());
    }

    #[test]
    fn a_load_balancer_is_reached_at_its_ingress_and_has_node_ports() {
        let s = service(json!({
            "spec": {"type": "LoadBalancer", "clusterIP": "10.0.0.9",
                     "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}, {"port": 53, "protocol": "UDP", "nodePort": 30053}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}, {"hostname": "lb.example.com"}]}}
        }));
        let e = Exposure::of(&s);
        assert_eq!(
            e.addresses,
            [address("IPAddress", "192.0.2.7".into()), address("Hostname", "lb.example.com".into())]
        );
        assert_eq!(e.node_ports[1], NodePortStatus { port: 53, protocol: "UDP".into(), node_port: 30053 });
        let pending = service(json!({"spec": {"type": "LoadBalancer", "clusterIP": "10.0.0.9"}}));
        assert_eq!(Exposure::of(&pending), Exposure::default(), "no address while the cloud provisions it");
    }
}

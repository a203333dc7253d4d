//! What a proxy's pods are, whichever front door asked for them: how many, on which ports,
//! and the pod settings (image, resources, placement, annotations). A Balancer's come from its
//! spec ([`Workload::of`]); a Gateway's from its listeners and its parameters. The Deployment
//! and the front Service are built from a workload alone, so both doors get the same pods.

use crate::api::Protocol;
use crate::api::v1beta1::ProxySpec;
use crate::spec::Admitted;

/// The proxy pods one owner asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// How many proxy pods.
    pub replicas: i32,
    /// The pods' settings, as a Balancer's `spec.proxy` gives them.
    pub pods: ProxySpec,
    /// The ports nginx listens on, in order, one per port and protocol.
    pub ports: Vec<WorkloadPort>,
}

/// A port nginx listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadPort {
    /// The port's name on the front Service, if it has one.
    pub name: Option<String>,
    /// The port number, within 1–65535.
    pub port: i32,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Whether clients must open with a PROXY protocol header (then a bare connection is no
    /// readiness probe).
    pub accepts_proxy_protocol: bool,
}

impl Workload {
    /// A Balancer's proxy pods: `spec.replicas`, `spec.proxy`, and one port per Balancer port.
    pub fn of(spec: &Admitted) -> Workload {
        let ports = spec
            .ports()
            .map(|p| WorkloadPort {
                name: p.name.clone(),
                port: p.port,
                protocol: p.protocol,
                accepts_proxy_protocol: p.accepts_proxy_protocol(),
            })
            .collect();
        Workload { replicas: spec.replicas(), pods: spec.proxy.clone().unwrap_or_default(), ports }
    }

    /// The port numbers nginx takes, which the metrics sidecar's port must avoid.
    pub fn port_numbers(&self) -> impl Iterator<Item = i32> + '_ {
        self.ports.iter().map(|p| p.port)
    }
}

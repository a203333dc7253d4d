//! `spec.ports`.

use super::fields::*;
use crate::api::formats::is_dns1123_label;
use crate::api::{BalancerPort, BalancerSpec, MAX_PORTS, Protocol};
use crate::spec::report::Report;
use crate::util::echo::quoted;

pub(super) fn validate_ports(spec: &BalancerSpec, report: &mut Report) {
    let ports = &spec.ports;
    if ports.is_empty() {
        report.error("spec.ports", "must have at least one port");
    }
    if ports.len() > MAX_PORTS {
        // Checking each of an unbounded list would let one request cost unbounded time and memory.
        report.error("spec.ports", format!("must have at most {MAX_PORTS} ports, got {}", ports.len()));
        return;
    }
    let mut names: Vec<(&str, usize)> = Vec::with_capacity(ports.len());
    let mut pairs: Vec<((i32, &str), usize)> = Vec::with_capacity(ports.len());
    for (i, port) in ports.iter().enumerate() {
        let at = Item("ports", i);
        if !(1..=65535).contains(&port.port) {
            report.error(format!("{at}.port"), format!("must be between 1 and 65535, got {}", port.port));
        }
        let written = port.written_protocol();
        let protocol = one_of::<Protocol>(format_args!("{at}.protocol"), written, report);
        match port.name.as_deref().filter(|n| !n.is_empty()) {
            None if ports.len() > 1 => {
                report.error(format!("{at}.name"), "is required when there is more than one port")
            }
            None => {}
            Some(name) => {
                if !is_dns1123_label(name) {
                    report.error(format!("{at}.name"), dns1123_label_problem(name));
                }
                if let Some(first) = first_seen(&mut names, name, i) {
                    report.error(
                        format!("{at}.name"),
                        format!("duplicate port name {} (also spec.ports[{first}].name)", quoted(name)),
                    );
                }
            }
        }
        if let Some(first) = first_seen(&mut pairs, (port.port, written), i) {
            report.error(at.to_string(), format!("duplicate port {}/{written} (also spec.ports[{first}])", port.port));
        }
        validate_target_port(at, port.target_port.as_ref(), report);
        validate_duration(
            &format_args!("{at}.connectTimeout"),
            port.connect_timeout.as_deref(),
            CONNECT_TIMEOUT,
            report,
        );
        validate_duration(&format_args!("{at}.idleTimeout"), port.idle_timeout.as_deref(), IDLE_TIMEOUT, report);
        if protocol == Some(Protocol::Udp) {
            validate_tcp_only(at, port, report);
        }
    }
}

/// The PROXY protocol is a header at the start of a byte stream: nginx refuses to accept it
/// on UDP, and would send it inside a UDP backend's first datagram, which no DNS or syslog
/// server reads, so balancer refuses both.
fn validate_tcp_only(at: Item, port: &BalancerPort, report: &mut Report) {
    if port.accepts_proxy_protocol() {
        report.error(format!("{at}.acceptProxyProtocol"), "is TCP only: nginx cannot accept PROXY protocol over UDP");
    }
    if port.sends_proxy_protocol() {
        report.error(
            format!("{at}.proxyProtocol"),
            "is TCP only: the header would arrive inside the backend's first UDP datagram",
        );
    }
}

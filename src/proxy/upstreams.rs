//! What the metrics sidecar needs of the proxy's model ([`ProxyConfig`]) to label the sessions
//! the access log reports: which backend each server address is, each backend's weight at each
//! port, and the ports nginx listens on. Read from the model, never from `nginx.conf`.

use std::collections::HashMap;

use super::model::{Listener, ProxyConfig};
use crate::api::Protocol;

/// The backend behind each server address of one proxy configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Upstreams {
    /// Who the proxy serves ([`ProxyConfig::identity`]): a Balancer's name, or `Gateway/<name>`.
    pub balancer: String,
    backends: HashMap<String, String>,
    /// The ports nginx listens on, with their protocols.
    listens: Vec<(u16, Protocol)>,
    /// Each backend's weight at each port.
    weights: Vec<Weight>,
    /// The upstreams' names, which nginx logs in place of a server when it had none to try.
    upstream_names: Vec<String>,
}

/// A backend's weight at one port, as the proxy runs it: the sum of its servers' weights (one
/// Service, or each of its pods), 0 when all are `down` and for a backup, which is meant to take
/// nothing while the others serve. `weight / sum(weight)` at a port is the backend's share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weight {
    /// The listener's port.
    pub port: u16,
    /// The listener's protocol.
    pub protocol: Protocol,
    /// The backend.
    pub backend: String,
    /// The sum of its servers' weights there.
    pub weight: u32,
}

impl Upstreams {
    /// The index of `config`.
    pub fn of(config: &ProxyConfig) -> Upstreams {
        let mut backends = HashMap::new();
        let mut weights: Vec<Weight> = Vec::new();
        for (listener, server) in config.servers() {
            backends.insert(server.address.clone(), server.backend.clone());
            let meant = if server.backup { 0 } else { server.weight };
            let (port, protocol) = (listener.port, listener.protocol);
            match weights.iter_mut().find(|w| (w.port, w.protocol) == (port, protocol) && w.backend == server.backend) {
                Some(weight) => weight.weight = weight.weight.saturating_add(meant),
                None => weights.push(Weight { port, protocol, backend: server.backend.clone(), weight: meant }),
            }
        }
        Upstreams {
            balancer: config.identity(),
            backends,
            listens: config.listeners.iter().map(|l| (l.port, l.protocol)).collect(),
            weights,
            upstream_names: config.listeners.iter().flat_map(Listener::upstream_names).collect(),
        }
    }

    /// Whether `address` is an upstream's name (nginx's "no live upstreams").
    pub fn is_upstream(&self, address: &str) -> bool {
        self.upstream_names.iter().any(|name| name == address)
    }

    /// Whether nginx listens on `port` with `protocol`.
    pub fn listens(&self, port: u16, protocol: Protocol) -> bool {
        self.listens.iter().any(|&(p, proto)| p == port && proto == protocol)
    }

    /// The backend at `address`, if the configuration names one there.
    pub fn backend(&self, address: &str) -> Option<&str> {
        self.backends.get(address).map(String::as_str)
    }

    /// Each backend's weight at each port.
    pub fn weights(&self) -> &[Weight] {
        &self.weights
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::model::{Method, OwnerKind, Server};

    fn server(address: &str, backend: &str, weight: u32, backup: bool) -> Server {
        let (max_fails, fail_timeout, max_conns) = (Some(1), Some("10s".to_string()), None);
        Server { address: address.into(), backend: backend.into(), weight, max_fails, fail_timeout, max_conns, backup }
    }

    fn listener(port: u16, protocol: Protocol, servers: Vec<Server>) -> Listener {
        let (accept_proxy_protocol, send_proxy_protocol, connect_timeout, idle_timeout) = (false, false, None, None);
        let method = Method::RoundRobin;
        Listener {
            port,
            protocol,
            accept_proxy_protocol,
            send_proxy_protocol,
            connect_timeout,
            idle_timeout,
            method,
            servers,
            sni_routes: vec![],
            single_attempt: false,
        }
    }

    fn config(listeners: Vec<Listener>) -> ProxyConfig {
        let (load_modules, drain_timeout) = (vec![], "1h".to_string());
        ProxyConfig {
            kind: OwnerKind::Balancer,
            name: "lb".into(),
            load_modules,
            drain_timeout,
            access_log: None,
            listeners,
            canary_window: None,
        }
    }

    #[test]
    fn a_backends_weight_is_the_sum_of_its_pods_and_a_backup_is_meant_to_take_nothing() {
        let pods = vec![
            server("10.244.0.5:8080", "v1", 3, false),
            server("10.244.1.5:8080", "v1", 3, false),
            server("10.244.0.6:8080", "v2", 2, false),
            server("10.96.0.9:8080", "v3", 0, false),
            server("10.244.0.7:8080", "spare", 5, true),
        ];
        let upstreams =
            Upstreams::of(&config(vec![listener(80, Protocol::Tcp, pods), listener(53, Protocol::Udp, vec![])]));
        let weights: Vec<(&str, u32)> = upstreams.weights().iter().map(|w| (w.backend.as_str(), w.weight)).collect();
        assert_eq!(weights, [("v1", 6), ("v2", 2), ("v3", 0), ("spare", 0)]);
        assert_eq!(upstreams.backend("10.244.1.5:8080"), Some("v1"));
        assert_eq!(upstreams.backend("10.244.0.7:8080"), Some("spare"), "still counted as itself");
        assert!(upstreams.listens(80, Protocol::Tcp) && upstreams.listens(53, Protocol::Udp));
        assert!(!upstreams.listens(53, Protocol::Tcp));
        assert!(upstreams.is_upstream("port_80_tcp") && upstreams.is_upstream("port_53_udp"));
    }
}

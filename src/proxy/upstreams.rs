//! Maps each server address in the `nginx.conf` a proxy runs back to its backend, reading the
//! file itself. The metrics sidecar needs this to label the sessions the access log reports.

use std::collections::HashMap;

use super::nginx::HEADER;
use crate::api::{BACKEND_SERVICE_SUFFIX, Protocol};

/// The backend behind each server address of a rendered `nginx.conf`, read from the file the
/// proxy runs: its `server <address> …;  # <backend Service>` lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Upstreams {
    /// The Balancer, from the file's first line.
    pub balancer: String,
    backends: HashMap<String, String>,
    /// The ports nginx listens on, with their protocols.
    listens: Vec<(u16, Protocol)>,
    /// Each upstream server's port, protocol, backend and weight (0: `down`).
    weights: Vec<Weight>,
    /// The upstreams' names, which nginx logs in place of a server when it had none to try.
    upstream_names: Vec<String>,
}

/// A backend's weight at one port, as `nginx.conf` has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weight {
    pub port: u16,
    pub protocol: Protocol,
    pub backend: String,
    pub weight: u32,
}

/// `port_80_tcp` (see `nginx::upstream_name`): the port and protocol.
fn upstream_port(name: &str) -> Option<(u16, Protocol)> {
    let rest = name.strip_prefix("port_")?;
    let (port, protocol) = rest.split_once('_')?;
    let protocol = match protocol {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        _ => return None,
    };
    Some((port.parse().ok()?, protocol))
}

impl Upstreams {
    /// Reads what [`nginx::render`](super::nginx::render) wrote; `None` for any other file.
    pub fn read(conf: &str) -> Option<Upstreams> {
        let first = conf.lines().next()?;
        let balancer = first.strip_prefix(HEADER)?.split('"').nth(1)?.to_string();
        let prefix = format!("{balancer}-");
        let mut backends = HashMap::new();
        let (mut listens, mut weights, mut upstream_names) = (Vec::new(), Vec::new(), Vec::new());
        let mut upstream = None;
        for line in conf.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix("upstream ").and_then(|l| l.strip_suffix(" {")) {
                upstream = upstream_port(name);
                upstream_names.push(name.to_string());
                continue;
            }
            if let Some(listen) = line.strip_prefix("listen ").and_then(|l| l.strip_suffix(';')) {
                // `80`, `[::]:80 udp`, `80 proxy_protocol`: the port ends the address.
                let mut words = listen.split(' ');
                let port = words.next().and_then(|address| address.rsplit(':').next());
                let protocol = if words.any(|flag| flag == "udp") { Protocol::Udp } else { Protocol::Tcp };
                listens.extend(port.and_then(|p| p.parse::<u16>().ok()).map(|port| (port, protocol)));
                continue;
            }
            let Some(server) = line.strip_prefix("server ") else { continue };
            let Some((directive, service)) = server.split_once(";  # ") else { continue };
            let address = directive.split(' ').next().unwrap_or_default();
            let backend = service.strip_prefix(&prefix).and_then(|s| s.strip_suffix(BACKEND_SERVICE_SUFFIX));
            let Some(backend) = backend else { continue };
            backends.insert(address.to_string(), backend.to_string());
            if let Some((port, protocol)) = upstream {
                // A backup takes no traffic while the other backends serve: its weight counts as 0.
                let backup = directive.split(' ').any(|word| word == "backup");
                let weight = directive
                    .split(' ')
                    .find_map(|word| word.strip_prefix("weight="))
                    .and_then(|w| w.parse().ok())
                    .filter(|_| !backup)
                    .unwrap_or(0);
                weights.push(Weight { port, protocol, backend: backend.to_string(), weight });
            }
        }
        Some(Upstreams { balancer, backends, listens, weights, upstream_names })
    }

    /// Whether `address` is an upstream's name (nginx's "no live upstreams").
    pub fn is_upstream(&self, address: &str) -> bool {
        self.upstream_names.iter().any(|name| name == address)
    }

    /// Whether nginx listens on `port` with `protocol`.
    pub fn listens(&self, port: u16, protocol: Protocol) -> bool {
        self.listens.iter().any(|&(p, proto)| p == port && proto == protocol)
    }

    /// The backend at `address`, if the file names one there.
    pub fn backend(&self, address: &str) -> Option<&str> {
        self.backends.get(address).map(String::as_str)
    }

    /// Each backend's weight at each port (0 for one marked `down`, and for a backup).
    pub fn weights(&self) -> &[Weight] {
        &self.weights
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listen_form_nginx_render_writes_is_read() {
        let conf = "# Generated by balancer for Balancer \"lb\". Do not edit: changes are overwritten.\n\
                    listen 80;\nlisten [::]:80;\nlisten 81 proxy_protocol;\nlisten [::]:81 proxy_protocol;\n\
                    listen 53 udp;\nlisten [::]:53 udp;\n";
        let upstreams = Upstreams::read(conf).unwrap();
        for (port, protocol) in [(80, Protocol::Tcp), (81, Protocol::Tcp), (53, Protocol::Udp)] {
            assert!(upstreams.listens(port, protocol), "{port}/{protocol}");
        }
        assert!(!upstreams.listens(53, Protocol::Tcp) && !upstreams.listens(81, Protocol::Udp));
    }

    #[test]
    fn a_backup_is_meant_to_take_nothing() {
        let conf = "# Generated by balancer for Balancer \"lb\". Do not edit: changes are overwritten.\n\
                    upstream port_80_tcp {\n\
                    server 10.0.0.1:80 weight=40 max_fails=1 fail_timeout=10s;  # lb-v1-backend\n\
                    server 10.0.0.2:80 weight=20 max_fails=1 fail_timeout=10s backup;  # lb-spare-backend\n}\n";
        let upstreams = Upstreams::read(conf).unwrap();
        let weights: Vec<(&str, u32)> = upstreams.weights().iter().map(|w| (w.backend.as_str(), w.weight)).collect();
        assert_eq!(weights, [("v1", 40), ("spare", 0)]);
        assert_eq!(upstreams.backend("10.0.0.2:80"), Some("spare"), "still counted as itself");
    }
}

//! The proxy's configuration as data: one [`ProxyConfig`] per Balancer, built from its admitted
//! spec and where its backends are, then rendered to `nginx.conf` in one place
//! ([`nginx::write`](super::nginx::write)).
//!
//! The controller stores it beside `nginx.conf` in the proxy's ConfigMap ([`MODEL_FILE`]), and
//! the metrics sidecar reads what it needs from it (which backend each address is, the weights,
//! the listeners): nothing parses `nginx.conf` back.
//!
//! Upstreams are the backends' ready pods, from their EndpointSlices, or their Services (see
//! [`Targets`]). With pods, each backend's weight is shared across its pods ([`pod_weights`]),
//! so the split between backends stays the spec's whatever their pod counts.

use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::api::formats::is_hostname;
use crate::api::{Algorithm, BackendSpec, BalancerPort, Protocol, SessionAffinity};
use crate::spec::{Admitted, AdmittedPort};
use crate::util::arith::gcd;

/// The ConfigMap key the model is stored under, beside `nginx.conf`.
pub const MODEL_FILE: &str = "proxy.json";

/// The largest `nginx.conf`, or model, that a proxy applies, and the most the two together take
/// in the ConfigMap (see [`fits`]): the API server stores no object above about 1.5 MiB.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// Whether a rendered `nginx.conf` and its model fit in one ConfigMap that every proxy accepts.
pub fn fits(nginx_conf: &str, model_json: &str) -> bool {
    nginx_conf.len() + model_json.len() <= MAX_CONFIG_BYTES
}

/// The kind of resource a proxy serves.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OwnerKind {
    /// A Balancer: what every model before Gateway API was, so the default.
    #[default]
    Balancer,
    /// A Gateway, with its routes.
    Gateway,
}

impl OwnerKind {
    fn is_balancer(&self) -> bool {
        *self == OwnerKind::Balancer
    }
}

/// Everything one proxy runs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProxyConfig {
    /// What the proxy serves: left out for a Balancer, so a Balancer's model reads as before.
    #[serde(default, skip_serializing_if = "OwnerKind::is_balancer")]
    pub kind: OwnerKind,
    /// The name of the Balancer or Gateway (under the key sidecars of every release read).
    #[serde(rename = "balancer")]
    pub name: String,
    /// Dynamic modules to load first (images whose stream module is not built in).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_modules: Vec<String>,
    /// How long connections opened before a change go on (nginx's `worker_shutdown_timeout`).
    pub drain_timeout: String,
    /// The file the proxy logs each session to, for the metrics sidecar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log: Option<String>,
    /// One per Balancer port.
    pub listeners: Vec<Listener>,
    /// A running canary's step: the sidecars count the sessions of each backend under it, once
    /// nginx serves this configuration. Not in `nginx.conf`: a new step of the same weights
    /// reloads nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_window: Option<String>,
}

/// One Balancer port: what nginx listens on, and the upstream it proxies to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    /// The port nginx listens on.
    pub port: u16,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Clients must send the PROXY protocol header.
    #[serde(default)]
    pub accept_proxy_protocol: bool,
    /// nginx sends the PROXY protocol header to the backends.
    #[serde(default)]
    pub send_proxy_protocol: bool,
    /// nginx's `proxy_connect_timeout`, when the spec sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<String>,
    /// nginx's `proxy_timeout`, when the spec sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// How a server is picked.
    pub method: Method,
    /// A backend without an address to send to keeps one server, marked down. Empty only beside
    /// `sni_routes`, when connections that match none of them are refused.
    pub servers: Vec<Server>,
    /// TLS passthrough (TCP only): connections whose TLS ClientHello names a host of a route go
    /// to that route's servers, unread; `servers` take the others. None on a Balancer's port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sni_routes: Vec<SniRoute>,
    /// Each connection (or datagram) tries one server only, so a refused backend's share is
    /// refused, as Gateway API asks of a route's invalid backend. A Balancer's backends are
    /// retried on the next server instead (unset).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub single_attempt: bool,
}

impl Listener {
    /// A Gateway's listener on `port`: `servers` take every connection (or datagram), one
    /// server each, so that a refused backend's share is refused; no PROXY protocol, nginx's
    /// timeouts, round robin.
    pub fn of_route(port: u16, protocol: Protocol, servers: Vec<Server>) -> Listener {
        Listener {
            port,
            protocol,
            accept_proxy_protocol: false,
            send_proxy_protocol: false,
            connect_timeout: None,
            idle_timeout: None,
            method: Method::RoundRobin,
            servers,
            sni_routes: Vec::new(),
            single_attempt: true,
        }
    }

    /// A TCP listener on `port` whose connections go by their TLS server name to `sni_routes`,
    /// and are refused when they name none (TLS passthrough, as a TLSRoute's listener).
    pub fn tls_passthrough(port: u16, sni_routes: Vec<SniRoute>) -> Listener {
        Listener { sni_routes, ..Listener::of_route(port, Protocol::Tcp, Vec::new()) }
    }

    /// The upstream's name, from its port and protocol (`port_80_tcp`): the `(port, protocol)`
    /// pairs of a model are unique, so the names are too. nginx logs it in place of a server
    /// when it had none to try.
    pub fn upstream_name(&self) -> String {
        format!("port_{}_{}", self.port, self.protocol.as_str().to_ascii_lowercase())
    }

    /// The upstream of SNI route `index` (`port_443_tcp_sni_0`).
    pub fn route_upstream_name(&self, index: usize) -> String {
        format!("{}_sni_{index}", self.upstream_name())
    }

    /// Every upstream of the listener: its own, then one per SNI route.
    pub fn upstream_names(&self) -> impl Iterator<Item = String> + '_ {
        let routes = (0..self.sni_routes.len()).map(|i| self.route_upstream_name(i));
        std::iter::once(self.upstream_name()).chain(routes)
    }

    /// Whether connections are routed by their TLS server name.
    pub fn routes_by_sni(&self) -> bool {
        self.protocol == Protocol::Tcp && !self.sni_routes.is_empty()
    }

    /// Every server of the listener, its own and its routes'.
    pub fn all_servers(&self) -> impl Iterator<Item = &Server> {
        self.servers.iter().chain(self.sni_routes.iter().flat_map(|r| r.servers.iter()))
    }
}

/// The connections of a TLS listener whose ClientHello names one of `hostnames` (SNI), sent to
/// `servers` unread: TLS passthrough, as a TLSRoute asks. nginx matches an exact name first,
/// then the longest wildcard, as Gateway API's hostname precedence does.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SniRoute {
    /// Exact names (`db.example.com`) or wildcards of one or more labels (`*.example.com`), each
    /// a Gateway API hostname ([`is_hostname`]); the renderer writes no other.
    pub hostnames: Vec<String>,
    /// How a server is picked.
    pub method: Method,
    /// As a listener's: a backend without an address keeps one server, marked down.
    pub servers: Vec<Server>,
}

/// How nginx picks a server for a new connection.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Weighted round robin, nginx's default.
    RoundRobin,
    /// The server with the fewest active connections, by weight.
    LeastConn,
    /// Two servers at random (by weight), then the one with fewer connections.
    RandomTwoLeastConn,
    /// A consistent hash of the client's address (ClientIP affinity).
    ClientAddressHash,
}

/// One upstream server: a backend's Service or one of its pods.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Server {
    /// `ip:port`, `[ipv6]:port` or `name:port`.
    pub address: String,
    /// The backend it belongs to.
    pub backend: String,
    /// nginx's weight; 0 marks the server down (nginx's own weight is at least 1).
    pub weight: u32,
    /// nginx's `max_fails`, when the spec sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_fails: Option<i32>,
    /// nginx's `fail_timeout`, when the spec sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_timeout: Option<String>,
    /// nginx's `max_conns`, when the spec limits connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_conns: Option<i32>,
    /// Takes connections only when no other server can.
    #[serde(default)]
    pub backup: bool,
}

/// Where nginx sends one server's connections, written as nginx reads it and logs it
/// (`$upstream_addr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// An IP address and port: `ip:port`, or `[ipv6]:port` (`SocketAddr` brackets IPv6).
    Address(SocketAddr),
    /// A Service's cluster DNS name and port, `<service>.<namespace>.svc:port`: what an offline
    /// preview shows, before the Service has a cluster IP.
    Name {
        /// `<service>.<namespace>.svc`.
        host: String,
        /// The Service's port.
        port: u16,
    },
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Address(address) => address.fmt(f),
            Destination::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// Where the proxy reaches one backend at one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets {
    /// The backend's Service: one destination (its cluster IP or its name) for all its pods.
    Service(Destination),
    /// The backend's ready pods; `service` (as above) is kept, marked down, when there are none,
    /// so the backend still shows in the upstream.
    Pods {
        /// The backend's Service, kept down when no pod is ready.
        service: Destination,
        /// Each ready pod's address at the port.
        pods: Vec<SocketAddr>,
    },
    /// Nowhere: the backend's share of connections is refused, and of datagrams dropped (a
    /// route's backend that does not resolve, or has no ready endpoint). Weighed as one pod
    /// beside backends of pods, and by its weight beside Services.
    Refused,
}

/// Where a refused backend's server points: nothing listens there in a proxy pod, so a
/// connection is reset at once and a datagram is dropped.
pub const REFUSED_ADDRESS: &str = "127.0.0.1:1";

/// Where each backend is, at each port.
pub trait UpstreamTargets {
    /// Where `backend` is at `port`.
    fn targets(&self, backend: &BackendSpec, port: AdmittedPort<'_>) -> Targets;
}

/// Where the proxy reaches one backend at one port: its Service.
pub trait UpstreamAddress {
    /// The address of `backend`'s Service at `port`.
    fn address(&self, backend: &BackendSpec, port: &BalancerPort) -> Destination;
}

impl<F: Fn(&BackendSpec, &BalancerPort) -> Destination> UpstreamAddress for F {
    fn address(&self, backend: &BackendSpec, port: &BalancerPort) -> Destination {
        self(backend, port)
    }
}

/// Each backend at its Service's address, as `0` gives it.
pub struct ServiceUpstreams<'a, A>(pub &'a A);

impl<A: UpstreamAddress> UpstreamTargets for ServiceUpstreams<'_, A> {
    fn targets(&self, backend: &BackendSpec, port: AdmittedPort<'_>) -> Targets {
        Targets::Service(self.0.address(backend, &port))
    }
}

/// Total weight a consistent hash's servers share, about: 50 units per pod, between 1,024 and
/// 4,096. nginx's ketama hash makes 160 points per unit of weight, 16 bytes each, per
/// configuration generation: 2.5 to 10 MiB. 50 per pod keeps the weights exact for two backends
/// of weights 1 and 99 over tens of pods each.
fn hash_weight_budget(pods: u64) -> u64 {
    pods.saturating_mul(50).clamp(1024, 4096)
}

/// Weight units per ready pod for the other methods, whose cost does not grow with the
/// weights: each backend's share is then within 0.05 point of the spec's.
const WEIGHT_UNITS_PER_POD: u64 = 1000;

impl ProxyConfig {
    /// The configuration of Balancer `balancer` for an admitted spec, its backends at `targets`.
    pub fn of(
        balancer: &str,
        spec: &Admitted,
        load_modules: &[String],
        access_log: Option<&str>,
        targets: &impl UpstreamTargets,
    ) -> ProxyConfig {
        ProxyConfig {
            kind: OwnerKind::Balancer,
            name: balancer.to_string(),
            load_modules: load_modules.to_vec(),
            drain_timeout: spec.drain_timeout().to_string(),
            access_log: access_log.map(str::to_string),
            listeners: spec.ports().map(|port| listener(spec, port, targets)).collect(),
            canary_window: spec.canary_window().map(str::to_string),
        }
    }

    /// Who the proxy serves, as the signature, `nginx.conf`'s first line and the sidecar name
    /// it: a Balancer's name, or `Gateway/<name>`. No Balancer's name holds a `/`, so a
    /// configuration made for one never passes for another's.
    pub fn identity(&self) -> String {
        match self.kind {
            OwnerKind::Balancer => self.name.clone(),
            OwnerKind::Gateway => format!("Gateway/{}", self.name),
        }
    }

    /// The model as the ConfigMap stores it: indented, for people reading the ConfigMap.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// A model read back; `None` when `text` is not one (or is over [`MAX_CONFIG_BYTES`]).
    pub fn from_json(text: &str) -> Option<ProxyConfig> {
        (text.len() <= MAX_CONFIG_BYTES).then(|| serde_json::from_str(text).ok()).flatten()
    }

    /// Every server, its routes' included, with its listener.
    pub fn servers(&self) -> impl Iterator<Item = (&Listener, &Server)> {
        self.listeners.iter().flat_map(|l| l.all_servers().map(move |s| (l, s)))
    }
}

fn listener(spec: &Admitted, port: AdmittedPort<'_>, targets: &impl UpstreamTargets) -> Listener {
    let method = method(spec);
    let backends: Vec<WeightedBackend> = spec
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let backend =
                WeightedBackend { weight: spec.weight(i), ..WeightedBackend::of(b, targets.targets(b, port)) };
            // A running canary's backend takes its share whatever it does with it: the gates judge it.
            if spec.is_measured(i) { WeightedBackend { max_fails: Some(0), ..backend } } else { backend }
        })
        .collect();
    Listener {
        port: port.number(),
        protocol: port.protocol,
        accept_proxy_protocol: port.accepts_proxy_protocol(),
        send_proxy_protocol: port.sends_proxy_protocol(),
        connect_timeout: port.connect_timeout.clone(),
        idle_timeout: port.idle_timeout.clone(),
        method,
        servers: upstream_servers(method, &backends),
        sni_routes: Vec::new(),
        single_attempt: false,
    }
}

/// One backend's part of an upstream, whichever resource named it: a Balancer's backend, or a
/// route's backend reference.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightedBackend {
    /// The name its servers carry, which the metrics label sessions with.
    pub name: String,
    /// Its share of new connections beside the others of its group (primaries, or backups).
    pub weight: u32,
    /// Takes connections only when no primary can.
    pub backup: bool,
    /// nginx's `max_fails` for each of its servers.
    pub max_fails: Option<i32>,
    /// nginx's `fail_timeout` for each of its servers.
    pub fail_timeout: Option<String>,
    /// At most this many connections at once, shared across its pods.
    pub max_connections: Option<i32>,
    /// Where it is.
    pub targets: Targets,
}

impl WeightedBackend {
    /// A Balancer's backend, at `targets`.
    pub fn of(backend: &BackendSpec, targets: Targets) -> WeightedBackend {
        WeightedBackend {
            name: backend.name.clone(),
            weight: u32::try_from(backend.effective_weight()).unwrap_or_default(),
            backup: backend.is_backup(),
            max_fails: backend.max_fails,
            fail_timeout: backend.fail_timeout.clone(),
            max_connections: backend.max_connections,
            targets,
        }
    }
}

/// The servers of one upstream of `backends`, in their order within each group. Primaries and
/// backups share their weights apart (backups serve only when no primary can), and a backend's
/// servers stay together.
pub fn upstream_servers(method: Method, backends: &[WeightedBackend]) -> Vec<Server> {
    let mut servers = Vec::new();
    for backup in [false, true] {
        let group: Vec<&WeightedBackend> = backends.iter().filter(|b| b.backup == backup).collect();
        let budget = |pods: u64| match method {
            Method::ClientAddressHash => hash_weight_budget(pods),
            _ => WEIGHT_UNITS_PER_POD * pods,
        };
        let of_pods = group.iter().any(|b| matches!(b.targets, Targets::Pods { .. }));
        let shares: Vec<(u32, usize)> = group.iter().map(|b| (b.weight, pod_count(&b.targets, of_pods))).collect();
        let pods_in_group: usize = shares.iter().map(|&(_, n)| n).sum();
        let per_pod = pod_weights(&shares, budget(pods_in_group as u64));
        for (backend, weight) in group.into_iter().zip(per_pod) {
            servers.extend(servers_of(backend, weight, of_pods));
        }
    }
    servers
}

impl SniRoute {
    /// A route for `hostnames` to `backends`; `None` when a hostname is not one nginx may be
    /// given ([`is_hostname`]) or there is none.
    pub fn new(hostnames: Vec<String>, method: Method, backends: &[WeightedBackend]) -> Option<SniRoute> {
        let valid = !hostnames.is_empty() && hostnames.iter().all(|h| is_hostname(h));
        valid.then(|| SniRoute { hostnames, method, servers: upstream_servers(method, backends) })
    }
}

/// ClientIP affinity is a hash of the client's address; ketama points are in proportion to the
/// weights, so one client sticks and many still split by weight.
fn method(spec: &Admitted) -> Method {
    if spec.session_affinity() == SessionAffinity::ClientIp {
        return Method::ClientAddressHash;
    }
    match spec.algorithm() {
        Algorithm::RoundRobin => Method::RoundRobin,
        Algorithm::LeastConnections => Method::LeastConn,
        Algorithm::PowerOfTwoChoices => Method::RandomTwoLeastConn,
    }
}

/// The pods a backend's weight is shared across (0 for a Service); a refused backend counts as
/// one beside backends of pods (`of_pods`).
fn pod_count(targets: &Targets, of_pods: bool) -> usize {
    match targets {
        Targets::Service(_) => 0,
        Targets::Pods { pods, .. } => pods.len(),
        Targets::Refused => usize::from(of_pods),
    }
}

/// A backend's servers: its Service with its weight, or each ready pod with `pod_weight` and the
/// backend's connection limit shared out; the Service, down, when it sends nothing; a refused
/// backend's one server at [`REFUSED_ADDRESS`], weighed as a pod (`of_pods`) or as a Service,
/// and never counted as failed (`max_fails=0`).
fn servers_of(backend: &WeightedBackend, pod_weight: u32, of_pods: bool) -> Vec<Server> {
    let server = |address: &dyn fmt::Display, weight: u32, max_conns: Option<i32>| Server {
        address: address.to_string(),
        backend: backend.name.clone(),
        weight,
        max_fails: backend.max_fails,
        fail_timeout: backend.fail_timeout.clone(),
        max_conns,
        backup: backend.backup,
    };
    match &backend.targets {
        Targets::Service(address) => vec![server(address, backend.weight, backend.max_connections)],
        Targets::Pods { service, pods } if pods.is_empty() || pod_weight == 0 => {
            vec![server(service, 0, backend.max_connections)]
        }
        Targets::Pods { pods, .. } => {
            let max_conns = backend.max_connections.map(|n| shared_limit(n, pods.len()));
            pods.iter().map(|pod| server(pod, pod_weight, max_conns)).collect()
        }
        Targets::Refused => {
            let weight = if of_pods { pod_weight } else { backend.weight };
            // Never marked failed, or nginx would give its share to the others for a while.
            vec![Server { max_fails: Some(0), fail_timeout: None, ..server(&REFUSED_ADDRESS, weight, None) }]
        }
    }
}

/// A backend's `maxConnections` shared across its `pods`: at most the backend's limit in all,
/// but at least one each.
fn shared_limit(limit: i32, pods: usize) -> i32 {
    let pods = i32::try_from(pods).unwrap_or(i32::MAX).max(1);
    (limit / pods).max(1)
}

/// The weight of each pod of each backend, for backends given as `(weight, ready pods)`, so that
/// each backend's share of the group stays its weight's share of the group's, within a total of
/// about `budget`. A backend with no weight or no pod gets 0.
///
/// Exact when it fits the budget: `weight × lcm(pods) / pods`. Otherwise a pod gets
/// `weight × budget / (total weight × pods)`, rounded, at least 1, which moves a backend's
/// share by at most `0.5 × pods / budget`. Either way all are then divided by their greatest
/// common divisor, so that equal pods weigh 1.
pub fn pod_weights(backends: &[(u32, usize)], budget: u64) -> Vec<u32> {
    let serving = |&(weight, pods): &(u32, usize)| weight > 0 && pods > 0;
    let exact = exact_weights(backends, budget);
    let raw = exact.unwrap_or_else(|| {
        let total: u64 = backends.iter().filter(|b| serving(b)).map(|&(w, _)| u64::from(w)).sum();
        let rounded = |&(weight, pods): &(u32, usize)| {
            // Rounded to the nearest: (2·w·budget + total·pods) / (2·total·pods).
            let pods = pods as u64;
            ((2 * u64::from(weight) * budget + total * pods) / (2 * total * pods)).max(1)
        };
        backends.iter().map(|b| if serving(b) { rounded(b) } else { 0 }).collect()
    });
    let divisor = raw.iter().copied().filter(|&w| w > 0).fold(0, gcd).max(1);
    raw.into_iter().map(|w| u32::try_from(w / divisor).unwrap_or(u32::MAX)).collect()
}

/// `weight × lcm(pods) / pods` for each serving backend, when the total stays within `budget`.
fn exact_weights(backends: &[(u32, usize)], budget: u64) -> Option<Vec<u64>> {
    let serving = |&(weight, pods): &(u32, usize)| weight > 0 && pods > 0;
    let lcm = backends.iter().filter(|b| serving(b)).try_fold(1u64, |lcm, &(_, pods)| {
        let pods = pods as u64;
        (lcm / gcd(lcm, pods)).checked_mul(pods).filter(|&l| l <= budget)
    })?;
    let weights: Vec<u64> =
        backends.iter().map(|b @ &(w, pods)| if serving(b) { u64::from(w) * lcm / pods as u64 } else { 0 }).collect();
    let total: u64 = weights.iter().zip(backends).map(|(&w, &(_, pods))| w * pods as u64).sum();
    // Before the common divisor: the reduced total is smaller still.
    let divisor = weights.iter().copied().filter(|&w| w > 0).fold(0, gcd).max(1);
    (total / divisor <= budget).then_some(weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each backend's share of new connections under nginx's weights, in points.
    fn shares(backends: &[(u32, usize)], weights: &[u32]) -> Vec<f64> {
        let total: f64 = backends.iter().zip(weights).map(|(&(_, n), &w)| n as f64 * f64::from(w)).sum();
        backends.iter().zip(weights).map(|(&(_, n), &w)| 100.0 * n as f64 * f64::from(w) / total).collect()
    }

    fn wanted(backends: &[(u32, usize)]) -> Vec<f64> {
        let total: f64 = backends.iter().filter(|&&(_, n)| n > 0).map(|&(w, _)| f64::from(w)).sum();
        backends.iter().map(|&(w, n)| if n == 0 { 0.0 } else { 100.0 * f64::from(w) / total }).collect()
    }

    #[test]
    fn equal_pods_weigh_one_and_the_split_is_the_specs_whatever_the_pod_counts() {
        assert_eq!(pod_weights(&[(50, 3), (50, 3)], 6000), [1, 1]);
        assert_eq!(pod_weights(&[(50, 1), (50, 3)], 4000), [3, 1], "one pod carries what three do");
        for backends in [
            vec![(90, 1), (10, 7)],
            vec![(1, 1000), (99, 1)],
            vec![(5, 3), (25, 2), (70, 11)],
            vec![(33, 10), (33, 10), (34, 10)],
            vec![(100, 2), (0, 5), (1, 0)],
            vec![(1, 25), (99, 25)],
            vec![(1, 40), (99, 40)],
        ] {
            let pods: usize = backends.iter().map(|&(_, n)| n).sum();
            // The hash's budget is bounded (its memory grows with it): it holds for tens of pods.
            let hash = (pods <= 80).then_some(hash_weight_budget(pods as u64));
            for budget in [Some(WEIGHT_UNITS_PER_POD * pods as u64), hash].into_iter().flatten() {
                let weights = pod_weights(&backends, budget);
                let (got, want) = (shares(&backends, &weights), wanted(&backends));
                for (g, w) in got.iter().zip(&want) {
                    let bound = if Some(budget) == hash { 1.0 } else { 0.1 };
                    assert!((g - w).abs() <= bound, "{backends:?} at {budget}: {got:?}, wanted {want:?} ({weights:?})");
                }
            }
        }
    }

    #[test]
    fn a_backend_without_weight_or_pods_gets_nothing_and_the_hash_budget_holds() {
        assert_eq!(pod_weights(&[(0, 3), (40, 0), (60, 2)], 5000), [0, 0, 1]);
        // The same where the weights are rounded into the budget (1:99 over 37 and 41 pods is
        // not exact within 4,096 units).
        let rounded = pod_weights(&[(0, 3), (40, 0), (1, 37), (99, 41)], 4096);
        assert_eq!(rounded[..2], [0, 0], "{rounded:?}");
        assert!(rounded[2] > 0 && rounded[3] > rounded[2], "{rounded:?}");
        assert_eq!(pod_weights(&[], 1000), Vec::<u32>::new());
        let budget = hash_weight_budget(1000);
        assert_eq!((hash_weight_budget(3), budget), (1024, 4096));
        let weights = pod_weights(&[(1, 500), (99, 500)], budget);
        let total: u64 = weights.iter().zip([500u64, 500]).map(|(&w, n)| u64::from(w) * n).sum();
        assert!(total <= budget + 1000, "{weights:?}: {total}");
    }

    /// The exact weights are kept whenever they fit: a weightless backend's pods do not widen
    /// their common multiple, and the fit is judged on the weights reduced. Each budget is 1.3
    /// to 1.5 times the exact total, where rounding into the budget gives other weights.
    #[test]
    fn exact_weights_are_kept_whenever_they_fit_the_budget() {
        assert_eq!(pod_weights(&[(1, 2), (2, 3), (0, 5)], 27), [3, 4, 0]);
        assert_eq!(pod_weights(&[(1, 2), (1, 4)], 12), [2, 1]);
        assert_eq!(pod_weights(&[(2, 1), (4, 3)], 13), [3, 2]);
    }

    /// A refused backend takes its share: weighed as one pod beside backends of pods, by its
    /// weight beside Services, down at weight 0, and never counted as failed.
    #[test]
    fn a_refused_backend_is_weighed_like_the_others() {
        let backend = |name: &str, weight: u32, targets: Targets| WeightedBackend {
            name: name.into(),
            weight,
            backup: false,
            max_fails: Some(1),
            fail_timeout: None,
            max_connections: None,
            targets,
        };
        let address = |a: &str| a.parse::<SocketAddr>().expect("an address");
        let service = Destination::Address(address("10.96.0.1:80"));
        let pods =
            Targets::Pods { service: service.clone(), pods: vec![address("10.0.0.1:80"), address("10.0.0.2:80")] };
        let weights = |backends: &[WeightedBackend]| -> Vec<(String, u32, Option<i32>)> {
            let servers = upstream_servers(Method::RoundRobin, backends);
            servers.into_iter().map(|s| (s.address, s.weight, s.max_fails)).collect()
        };
        let refused = |weight| (REFUSED_ADDRESS.to_string(), weight, Some(0));
        // 60 over two pods, 40 refused: 30 a pod beside 40.
        let beside_pods = [backend("a", 60, pods.clone()), backend("gone", 40, Targets::Refused)];
        assert_eq!(
            weights(&beside_pods),
            [("10.0.0.1:80".into(), 3, Some(1)), ("10.0.0.2:80".into(), 3, Some(1)), refused(4)]
        );
        let beside_service = [backend("a", 60, Targets::Service(service)), backend("gone", 40, Targets::Refused)];
        assert_eq!(weights(&beside_service), [("10.96.0.1:80".into(), 60, Some(1)), refused(40)]);
        assert_eq!(weights(&[backend("a", 1, pods), backend("gone", 0, Targets::Refused)])[2], refused(0));
    }

    #[test]
    fn a_limit_is_shared_but_never_below_one() {
        assert_eq!((shared_limit(100, 3), shared_limit(2, 5), shared_limit(7, 0)), (33, 1, 7));
    }

    #[test]
    fn a_running_canarys_split_and_window_reach_the_model_and_only_its_weights_reach_nginx() {
        let spec: crate::api::BalancerSpec = serde_json::from_value(serde_json::json!({
            "ports": [{"port": 80}],
            "selector": {"app": "web"},
            "backends": [{"name": "v1", "weight": 0, "selector": {"v": "1"}}, {"name": "v2", "weight": 100, "selector": {"v": "2"}},
                         {"name": "v3", "weight": 50, "selector": {"v": "3"}}],
            "canary": {"stableBackend": "v1", "canaryBackend": "v2", "steps": [{"setWeight": 5}]},
        }))
        .expect("a spec");
        let admitted =
            crate::spec::admit(crate::spec::ObjectName::Name("lb"), spec, &Default::default()).expect("admitted");
        let address = |_: &BackendSpec, _: &BalancerPort| Destination::Address(SocketAddr::from(([10, 0, 0, 1], 80)));
        let plain = ProxyConfig::of("lb", &admitted, &[], None, &ServiceUpstreams(&address));
        assert_eq!(plain.canary_window, None);
        let weights = |config: &ProxyConfig| config.listeners[0].servers.iter().map(|s| s.weight).collect::<Vec<_>>();
        assert_eq!(weights(&plain), [0, 100, 50], "without a split, the spec's weights");
        let split =
            crate::spec::LiveSplit { weights: vec![9500, 500, 5000], window: Some("r/1/0".into()), measured: Some(1) };
        let canary = ProxyConfig::of("lb", &admitted.clone().with_split(split), &[], None, &ServiceUpstreams(&address));
        assert_eq!(weights(&canary), [9500, 500, 5000]);
        assert_eq!(canary.canary_window.as_deref(), Some("r/1/0"));
        let max_fails = canary.listeners[0].servers.iter().map(|s| s.max_fails).collect::<Vec<_>>();
        assert_eq!(max_fails[1], Some(0), "the canary is measured, not health-checked: {max_fails:?}");
        assert_eq!(max_fails[0], plain.listeners[0].servers[0].max_fails, "the others keep theirs");
        let same_weights =
            crate::spec::LiveSplit { weights: vec![9500, 500, 5000], window: Some("r/1/1".into()), measured: Some(1) };
        let next_step =
            ProxyConfig::of("lb", &admitted.with_split(same_weights), &[], None, &ServiceUpstreams(&address));
        assert_eq!(
            super::super::nginx::write(&next_step),
            super::super::nginx::write(&canary),
            "a new window alone reloads nothing"
        );
    }
}

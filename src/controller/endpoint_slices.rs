//! The ready endpoints of balancer's backend Services, counted from their EndpointSlices
//! (`discovery.k8s.io/v1`), for `status.backends[].readyEndpoints`; and the front Services'
//! endpoints, the proxy pods, whose sidecars say which configuration they serve.
//!
//! EndpointSlices rather than `v1` Endpoints: Kubernetes deprecated Endpoints in 1.33, and the
//! API server answers every list and watch of them with a deprecation warning. A Service may
//! have several slices: the EndpointSlice controller fills each with at most 100 endpoints by
//! default, and a dual-stack Service has an IPv4 slice and an IPv6 slice that list the same
//! pods. So a Service's count is the number of distinct ready endpoints across all its slices,
//! a pod being one endpoint whichever slices list it (see [`ReadySlice`]).
//!
//! The EndpointSlice controller copies the Service's labels onto its slices, so the watch
//! selects balancer's own by balancer's label, and the Balancer's name label says whose they
//! are. Each slice names its Service in `kubernetes.io/service-name`.
//!
//! The endpoints are read while the object is deserialized and the rest is dropped: the cache
//! ([`ReadyEndpointSlices`]) keeps, per slice, its Service and the identities of its ready
//! endpoints, never the objects. It grows with the backends' ready pods, at a few dozen bytes
//! each, and is bounded per slice (see [`MAX_ENDPOINTS_PER_SLICE`]).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde::{Deserialize, Deserializer};

use super::stored::StoredBalancer;
use crate::proxy::{BALANCER_NAME_LABEL, COMPONENT_FRONTEND, COMPONENT_LABEL, PodPort, ReadyPod};

/// The label that names a slice's Service, set by the EndpointSlice controller.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Most ready endpoints kept for one slice. The API server refuses a slice of more than 1,000
/// endpoints (and the EndpointSlice controller's `--max-endpoints-per-slice` is 100 unless
/// raised, to 1,000 at most), so this never cuts a real slice short; it bounds what a broken or
/// hostile object can make the cache hold.
const MAX_ENDPOINTS_PER_SLICE: usize = 1_000;

/// Longest endpoint identity kept, in bytes: a namespace (63) and a name (253) with their `/`.
/// Addresses (253 at most, for an FQDN) and uids are shorter. A longer one is cut to this.
const MAX_IDENTITY_LEN: usize = 317;

/// One EndpointSlice of a backend Service, as the controller keeps it: whose it is, and which of
/// its endpoints are ready.
///
/// An endpoint is known by what it stands for, so that one listed in two slices counts once:
/// its `targetRef` (`namespace/name`, or the uid when the reference has no name), or, without a
/// `targetRef`, its first address. It is ready when `conditions.ready` is not false (unset
/// means ready, as the API says) and `conditions.terminating` is not true: a terminating pod
/// is on its way out, and kube-proxy sends it new connections only while its Service has no
/// other (a Service with `publishNotReadyAddresses` leaves `ready` true while it terminates).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadySlice {
    /// Name, namespace and resource version only.
    pub metadata: ObjectMeta,
    /// The Service, from `kubernetes.io/service-name`.
    service: Option<Box<str>>,
    /// The Balancer, from the label copied from the Service.
    balancer: Option<Box<str>>,
    /// The ready endpoints, sorted by identity and distinct.
    ready: Arc<[ReadyEndpoint]>,
    /// The slice's ports (the Service's ports, resolved on its pods), [`MAX_PORTS_PER_SLICE`]
    /// at most.
    ports: Arc<[PodPort]>,
    /// Whether its addresses are IPv6 ones (`addressType: IPv6`).
    ipv6: bool,
    /// For a front Service's slice only: the endpoints that are not terminating, ready or not
    /// yet (the proxy pods), sorted and distinct.
    live: Arc<[LiveEndpoint]>,
}

/// A ready endpoint: what it stands for (see [`ReadySlice`]) and its first address, when that
/// is an IP address a proxy may send to ([`upstream_address`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReadyEndpoint {
    identity: Box<str>,
    address: Option<IpAddr>,
}

/// A pod behind a front Service that is not terminating: its name (from `targetRef`) and its
/// first address.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LiveEndpoint {
    pub pod: Box<str>,
    pub address: IpAddr,
}

impl ReadySlice {
    /// The Service this slice is of, `(namespace, name)`.
    pub(super) fn service(&self) -> Option<(&str, &str)> {
        Some((self.metadata.namespace.as_deref()?, self.service.as_deref()?))
    }

    /// The Balancer whose backend Service this slice is of (from the copied label).
    pub(super) fn balancer(&self) -> Option<ObjectRef<StoredBalancer>> {
        let reference = ObjectRef::new(self.balancer.as_deref()?);
        Some(match &self.metadata.namespace {
            Some(namespace) => reference.within(namespace),
            None => reference,
        })
    }
}

/// The EndpointSlice fields read; serde skips the rest (topology, hints).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    address_type: Option<String>,
    #[serde(default)]
    endpoints: Option<Vec<Endpoint>>,
    #[serde(default)]
    ports: Option<Vec<WirePort>>,
}

#[derive(Deserialize)]
struct WirePort {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    protocol: Option<String>,
    #[serde(default)]
    port: Option<i32>,
}

/// Most ports kept for one slice: the API server allows 100.
const MAX_PORTS_PER_SLICE: usize = 100;

/// The slice's ports that name a port number, [`MAX_PORTS_PER_SLICE`] at most. An unset
/// protocol is TCP, as the API defaults it; one nginx cannot proxy (SCTP) is left out.
fn slice_ports(ports: &[WirePort]) -> Arc<[PodPort]> {
    let read = |port: &WirePort| {
        let protocol = port.protocol.as_deref().unwrap_or("TCP").parse().ok()?;
        let number = u16::try_from(port.port?).ok().filter(|&p| p > 0)?;
        let name = bounded(port.name.clone().unwrap_or_default()).into_string();
        Some(PodPort { name, protocol, port: number })
    };
    ports.iter().take(MAX_PORTS_PER_SLICE).filter_map(read).collect()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Endpoint {
    #[serde(default)]
    addresses: Option<Vec<String>>,
    #[serde(default)]
    conditions: Option<Conditions>,
    #[serde(default)]
    target_ref: Option<TargetRef>,
}

#[derive(Deserialize)]
struct Conditions {
    #[serde(default)]
    ready: Option<bool>,
    #[serde(default)]
    terminating: Option<bool>,
}

#[derive(Deserialize)]
struct TargetRef {
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    uid: Option<String>,
}

impl Endpoint {
    /// Ready unless it says it is not, and not terminating.
    fn is_ready(&self) -> bool {
        let conditions = self.conditions.as_ref();
        let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
        let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
        ready && !terminating
    }

    /// What this endpoint stands for (a pod, usually), the same in every slice that lists it;
    /// `None` when it names nothing. The reference's namespace defaults to the slice's.
    fn identity(&self, slice_namespace: &str) -> Option<String> {
        let non_empty = |s: &Option<String>| s.as_deref().filter(|s| !s.is_empty()).map(str::to_owned);
        if let Some(target) = &self.target_ref {
            if let Some(name) = non_empty(&target.name) {
                let namespace = non_empty(&target.namespace).unwrap_or_else(|| slice_namespace.to_owned());
                return Some(format!("{namespace}/{name}"));
            }
            if let Some(uid) = non_empty(&target.uid) {
                return Some(uid);
            }
        }
        self.addresses.iter().flatten().find(|a| !a.is_empty()).cloned()
    }
}

/// `identity` within [`MAX_IDENTITY_LEN`] bytes, cut at a character boundary.
fn bounded(mut identity: String) -> Box<str> {
    if identity.len() > MAX_IDENTITY_LEN {
        let end = (0..=MAX_IDENTITY_LEN).rev().find(|&i| identity.is_char_boundary(i)).unwrap_or(0);
        identity.truncate(end);
    }
    identity.into_boxed_str()
}

/// An endpoint's first address, when it is an IP address; `None` for a name (an `FQDN`
/// slice's), which the proxy cannot send to.
fn ip_address(endpoint: &Endpoint) -> Option<IpAddr> {
    let first = endpoint.addresses.iter().flatten().find(|a| !a.is_empty());
    first.and_then(|a| a.parse().ok())
}

/// An endpoint's address as an upstream: its [`ip_address`], unless that is [`special`].
fn upstream_address(endpoint: &Endpoint) -> Option<IpAddr> {
    ip_address(endpoint).filter(|ip| !special(*ip))
}

/// Whether `ip` is one no backend can be at: unspecified, loopback (the proxy pod itself),
/// link-local (a cloud's metadata service at 169.254.169.254), or multicast; an IPv4 address
/// written as IPv6 (`::ffff:127.0.0.1`) is judged as IPv4. The API server refuses these in an
/// `Endpoints` object, not in an EndpointSlice, which anyone who may write EndpointSlices in a
/// namespace can make for any Service there (the CVE-2021-25740 family).
pub fn special(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            v4.is_unspecified() || v4.is_loopback() || v4.is_link_local() || v4.is_multicast() || v4.is_broadcast()
        }
        IpAddr::V6(v6) => v6.is_unspecified() || v6.is_loopback() || v6.is_unicast_link_local() || v6.is_multicast(),
    }
}

/// The ready endpoints, sorted by identity and distinct, [`MAX_ENDPOINTS_PER_SLICE`] at most.
fn ready_endpoints(endpoints: &[Endpoint], slice_namespace: &str) -> Arc<[ReadyEndpoint]> {
    let ready_endpoint = |endpoint: &Endpoint| {
        let identity = bounded(endpoint.identity(slice_namespace)?);
        Some(ReadyEndpoint { identity, address: upstream_address(endpoint) })
    };
    let mut ready: Vec<ReadyEndpoint> = endpoints
        .iter()
        .filter(|endpoint| endpoint.is_ready())
        .filter_map(ready_endpoint)
        .take(MAX_ENDPOINTS_PER_SLICE)
        .collect();
    ready.sort_unstable();
    ready.dedup_by(|a, b| a.identity == b.identity);
    ready.into()
}

/// The endpoints that are not terminating and name a pod, sorted and distinct,
/// [`MAX_ENDPOINTS_PER_SLICE`] at most.
fn live_endpoints(endpoints: &[Endpoint]) -> Arc<[LiveEndpoint]> {
    let terminating = |e: &Endpoint| e.conditions.as_ref().and_then(|c| c.terminating).unwrap_or(false);
    let live_endpoint = |endpoint: &Endpoint| {
        let pod = endpoint.target_ref.as_ref()?.name.clone().filter(|n| !n.is_empty())?;
        Some(LiveEndpoint { pod: bounded(pod), address: ip_address(endpoint)? })
    };
    let mut live: Vec<LiveEndpoint> = endpoints
        .iter()
        .filter(|endpoint| !terminating(endpoint))
        .filter_map(live_endpoint)
        .take(MAX_ENDPOINTS_PER_SLICE)
        .collect();
    live.sort_unstable();
    live.dedup();
    live.into()
}

impl<'de> Deserialize<'de> for ReadySlice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(deserializer)?;
        let metadata = wire.metadata;
        let namespace = metadata.namespace.as_deref().unwrap_or_default();
        let endpoints = wire.endpoints.as_deref().unwrap_or_default();
        let ready = ready_endpoints(endpoints, namespace);
        let ports = slice_ports(wire.ports.as_deref().unwrap_or_default());
        let ipv6 = wire.address_type.as_deref() == Some("IPv6");
        let mut labels = metadata.labels.unwrap_or_default();
        let front = labels.get(COMPONENT_LABEL).is_some_and(|c| c == COMPONENT_FRONTEND);
        let live = if front { live_endpoints(endpoints) } else { Arc::from([]) };
        let mut label = |key: &str| labels.remove(key).filter(|v| !v.is_empty()).map(String::into_boxed_str);
        let (service, balancer) = (label(SERVICE_NAME_LABEL), label(BALANCER_NAME_LABEL));
        Ok(ReadySlice {
            // Only the name and namespace (which identify the slice) and the resource version
            // (where the watch resumes) are kept.
            metadata: ObjectMeta {
                name: metadata.name,
                namespace: metadata.namespace,
                resource_version: metadata.resource_version,
                ..ObjectMeta::default()
            },
            service,
            balancer,
            ready,
            ports,
            ipv6,
            live,
        })
    }
}

/// Where [`ReadyEndpointSlices::ready_pods`] takes an endpoint from: its rank (IPv6, then the
/// slice's key), the endpoint's address, and the slice's ports.
type Listing<'a> = ((bool, &'a str), IpAddr, &'a Arc<[PodPort]>);

/// The ready endpoints of every backend Service, from the watch of their slices.
#[derive(Clone, Default)]
pub struct ReadyEndpointSlices(Arc<RwLock<Table>>);

#[derive(Default)]
struct Table {
    /// Every slice with a Service.
    slices: Slices,
    /// A (re)list in progress: it replaces `slices` when done.
    listing: Option<Slices>,
    listed: bool,
}

/// Slices by their key (`namespace/slice`), and each Service's slices: a Service's endpoints
/// are read from its own slices, whatever the number of others (a Gateway's table holds every
/// slice of the cluster).
#[derive(Default)]
struct Slices {
    by_key: HashMap<Box<str>, Slice>,
    /// The keys of each Service's slices, by `namespace/service`.
    by_service: HashMap<Box<str>, HashSet<Box<str>>>,
}

impl Slices {
    /// Puts `slice` in, or takes it out when it no longer names a Service.
    fn put(&mut self, slice: &ReadySlice) {
        let (key, kept) = entry(slice);
        self.remove(&key);
        if let Some(kept) = kept {
            self.by_service.entry(kept.service.clone()).or_default().insert(key.clone());
            self.by_key.insert(key, kept);
        }
    }

    fn remove(&mut self, key: &str) {
        let Some(gone) = self.by_key.remove(key) else { return };
        if let Some(keys) = self.by_service.get_mut(&gone.service) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_service.remove(&gone.service);
            }
        }
    }

    /// The slices of Service `service` (`namespace/name`), with their keys.
    fn of_service<'a>(&'a self, service: &str) -> impl Iterator<Item = (&'a str, &'a Slice)> {
        let keys = self.by_service.get(service).into_iter().flatten();
        keys.filter_map(|key| Some((&**key, self.by_key.get(key)?)))
    }

    fn shrink_to_fit(&mut self) {
        self.by_key.shrink_to_fit();
        self.by_service.shrink_to_fit();
    }
}

/// What counting needs of one slice.
struct Slice {
    /// Its Service, as `namespace/name`.
    service: Box<str>,
    /// Its ready endpoints, ports and address family (shared with the [`ReadySlice`] it was
    /// read from).
    ready: Arc<[ReadyEndpoint]>,
    ports: Arc<[PodPort]>,
    ipv6: bool,
    /// A front Service's live endpoints (see [`ReadySlice`]).
    live: Arc<[LiveEndpoint]>,
}

fn key(namespace: &str, name: &str) -> Box<str> {
    format!("{namespace}/{name}").into_boxed_str()
}

/// `slice` as the table keeps it, under its key; `None` for a slice that names no Service.
fn entry(slice: &ReadySlice) -> (Box<str>, Option<Slice>) {
    let namespace = slice.metadata.namespace.as_deref().unwrap_or_default();
    let name = slice.metadata.name.as_deref().unwrap_or_default();
    let kept = slice.service.as_deref().map(|service| Slice {
        service: key(namespace, service),
        ready: slice.ready.clone(),
        ports: slice.ports.clone(),
        ipv6: slice.ipv6,
        live: slice.live.clone(),
    });
    (key(namespace, name), kept)
}

impl ReadyEndpointSlices {
    /// The distinct ready endpoints of Service `name` in `namespace`, across its slices (0 when
    /// none is known).
    pub fn get(&self, namespace: &str, name: &str) -> u32 {
        let service = key(namespace, name);
        let table = self.read();
        let union: HashSet<&str> = table
            .slices
            .of_service(&service)
            .flat_map(|(_, slice)| slice.ready.iter().map(|endpoint| &*endpoint.identity))
            .collect();
        u32::try_from(union.len()).unwrap_or(u32::MAX)
    }

    /// The ready pods of Service `name` in `namespace`, one per endpoint across its slices (by
    /// its IPv4 address when it has one: the proxy pods listen on both families, and most pod
    /// networks route IPv4), each with its slice's ports; sorted by address, so the same
    /// endpoints always render the same configuration.
    pub fn ready_pods(&self, namespace: &str, name: &str) -> Vec<ReadyPod> {
        let service = key(namespace, name);
        let table = self.read();
        // Per endpoint, the listing to use: IPv4 first, then the slice's name, so that the
        // choice never depends on the table's order.
        let mut by_identity: HashMap<&str, Listing<'_>> = HashMap::new();
        for (name, slice) in table.slices.of_service(&service) {
            for (endpoint, address) in slice.ready.iter().filter_map(|e| Some((e, e.address?))) {
                let rank = (slice.ipv6, name);
                let entry = by_identity.entry(&endpoint.identity).or_insert((rank, address, &slice.ports));
                if rank < entry.0 {
                    *entry = (rank, address, &slice.ports);
                }
            }
        }
        let mut pods: Vec<ReadyPod> =
            by_identity.into_values().map(|(_, address, ports)| ReadyPod { address, ports: ports.to_vec() }).collect();
        // By the address as text, the order nginx.conf lists the servers in.
        pods.sort_by_cached_key(|pod| (pod.address.to_string(), pod.ports.clone()));
        pods
    }

    /// The addresses of the front Service `name`'s endpoints that are not terminating and whose
    /// pod's name starts with `pod_prefix` (its proxy pods, ready or not yet, and not a Go
    /// operator's proxy pod it also selects during a takeover), across its slices, distinct.
    pub fn live_addresses(&self, namespace: &str, name: &str, pod_prefix: &str) -> Vec<IpAddr> {
        let service = key(namespace, name);
        let table = self.read();
        let mut live: Vec<IpAddr> = table
            .slices
            .of_service(&service)
            .flat_map(|(_, slice)| slice.live.iter())
            .filter(|endpoint| endpoint.pod.starts_with(pod_prefix))
            .map(|endpoint| endpoint.address)
            .collect();
        live.sort_unstable();
        live.dedup();
        live
    }

    /// Takes in one watch event, as a reflector's store does.
    pub fn apply(&self, event: &watcher::Event<ReadySlice>) {
        let mut table = self.0.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(slice) => table.slices.put(slice),
            watcher::Event::Delete(slice) => table.slices.remove(&entry(slice).0),
            watcher::Event::Init => table.listing = Some(Slices::default()),
            watcher::Event::InitApply(slice) => table.listing.get_or_insert_default().put(slice),
            watcher::Event::InitDone => {
                table.slices = table.listing.take().unwrap_or_default();
                table.slices.shrink_to_fit();
                table.listed = true;
            }
        }
    }

    /// Whether the first list is in.
    pub(super) fn listed(&self) -> bool {
        self.read().listed
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// The table once the watch's first list, of `slices`, is done: what the controller reads its
/// ready pods from, built without a watch (a preview, a test, the fuzzer).
impl FromIterator<ReadySlice> for ReadyEndpointSlices {
    fn from_iter<I: IntoIterator<Item = ReadySlice>>(slices: I) -> Self {
        let table = ReadyEndpointSlices::default();
        table.apply(&watcher::Event::Init);
        for slice in slices {
            table.apply(&watcher::Event::InitApply(slice));
        }
        table.apply(&watcher::Event::InitDone);
        table
    }
}

impl k8s_openapi::Resource for ReadySlice {
    const API_VERSION: &'static str = "discovery.k8s.io/v1";
    const GROUP: &'static str = "discovery.k8s.io";
    const KIND: &'static str = "EndpointSlice";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "endpointslices";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for ReadySlice {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use kube::Resource;
    use serde_json::{Value, json};

    use super::*;

    /// A pod's endpoint as the EndpointSlice controller lists it.
    fn pod(name: &str, address: &str, conditions: Value) -> Value {
        json!({"addresses": [address], "conditions": conditions, "nodeName": "node-1",
               "targetRef": {"kind": "Pod", "namespace": "ns", "name": name, "uid": format!("uid-{name}")}})
    }

    /// Slice `name` of Service `service` (with the Balancer's label) listing `endpoints`.
    fn slice(name: &str, service: &str, endpoints: Vec<Value>) -> ReadySlice {
        serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": "7",
                         "labels": {SERVICE_NAME_LABEL: service, BALANCER_NAME_LABEL: "lb",
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                         "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "x"}},
            "endpoints": endpoints,
            "ports": [{"name": "", "port": 80, "protocol": "TCP"}]
        }))
        .unwrap()
    }

    fn ready() -> Value {
        json!({"ready": true, "serving": true, "terminating": false})
    }

    fn identities(slice: &ReadySlice) -> Vec<&str> {
        slice.ready.iter().map(|endpoint| &*endpoint.identity).collect()
    }

    fn listed(slices: &[ReadySlice]) -> ReadyEndpointSlices {
        let table: ReadyEndpointSlices = slices.iter().cloned().collect();
        assert!(table.listed());
        table
    }

    #[test]
    fn keeps_the_service_the_balancer_and_the_ready_identities_only() {
        let read = slice("lb-v1-abcde", "lb-v1", vec![pod("a", "10.244.0.5", ready())]);
        assert_eq!(read.balancer(), Some(ObjectRef::new("lb").within("ns")));
        assert_eq!(read.service.as_deref(), Some("lb-v1"));
        assert_eq!(identities(&read), ["ns/a"]);
        assert_eq!((&read.metadata.labels, &read.metadata.annotations), (&None, &None));
        assert_eq!(read.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(ReadySlice::url_path(&(), Some("ns")), "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices");
    }

    /// The front Service's slice: its endpoints are the proxy pods.
    fn front_slice(name: &str, endpoints: Vec<Value>) -> ReadySlice {
        serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "namespace": "ns",
                         "labels": {SERVICE_NAME_LABEL: "lb", BALANCER_NAME_LABEL: "lb", COMPONENT_LABEL: COMPONENT_FRONTEND}},
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    #[test]
    fn a_front_services_live_addresses_are_its_pods_that_are_not_terminating_ready_or_not() {
        let starting = json!({"ready": false, "serving": false, "terminating": false});
        let leaving = json!({"ready": false, "serving": true, "terminating": true});
        let first = front_slice("lb-aaaaa", vec![pod("a", "10.244.0.5", ready()), pod("b", "10.244.0.6", starting)]);
        let second = front_slice("lb-bbbbb", vec![pod("c", "10.244.1.5", leaving), pod("a", "10.244.0.5", ready())]);
        let table = listed(&[first, second, slice("lb-v1-ccccc", "lb-v1", vec![pod("d", "10.244.2.5", ready())])]);
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        assert_eq!(table.live_addresses("ns", "lb", ""), [ip("10.244.0.5"), ip("10.244.0.6")]);
        assert_eq!(table.live_addresses("ns", "lb", "b"), [ip("10.244.0.6")], "only the pods named so");
        assert!(table.live_addresses("ns", "lb-v1", "").is_empty(), "a backend's slice keeps no addresses");
        assert_eq!(table.get("ns", "lb"), 1, "and the front's ready count as before");
    }

    /// An EndpointSlice anyone may write in the namespace cannot send the proxy to itself, to
    /// a node's or a cloud's link-local services, or to no address: such endpoints count as
    /// ready but give no upstream.
    #[test]
    fn special_addresses_never_become_upstreams() {
        let refused =
            ["127.0.0.1", "169.254.169.254", "0.0.0.0", "224.0.0.1", "255.255.255.255", "::1", "fe80::1", "::"];
        let mut endpoints: Vec<Value> =
            refused.iter().enumerate().map(|(i, address)| pod(&format!("p{i}"), address, ready())).collect();
        endpoints.push(pod("mapped", "::ffff:127.0.0.1", ready()));
        endpoints.push(pod("real", "10.244.0.5", ready()));
        let table = listed(&[slice("lb-v1-aaaaa", "lb-v1", endpoints)]);
        let addresses: Vec<IpAddr> = table.ready_pods("ns", "lb-v1").into_iter().map(|pod| pod.address).collect();
        assert_eq!(addresses, ["10.244.0.5".parse::<IpAddr>().unwrap()]);
        assert!(!special("192.0.2.1".parse().unwrap()) && !special("fd00::5".parse().unwrap()));
    }

    #[test]
    fn a_services_count_is_across_all_its_slices() {
        let first =
            slice("lb-v1-aaaaa", "lb-v1", vec![pod("a", "10.244.0.5", ready()), pod("b", "10.244.0.6", ready())]);
        let second = slice("lb-v1-bbbbb", "lb-v1", vec![pod("c", "10.244.1.5", ready())]);
        let other = slice("lb-v2-ccccc", "lb-v2", vec![pod("d", "10.244.2.5", ready())]);
        let table = listed(&[first, second, other]);
        assert_eq!((table.get("ns", "lb-v1"), table.get("ns", "lb-v2")), (3, 1));
        assert_eq!((table.get("other", "lb-v1"), table.get("ns", "lb-v3")), (0, 0));
    }

    #[test]
    fn a_pod_in_an_ipv4_and_an_ipv6_slice_counts_once() {
        let ipv4 = slice("lb-v1-ipv4", "lb-v1", vec![pod("a", "10.244.0.5", ready()), pod("b", "10.244.0.6", ready())]);
        let ipv6 = slice("lb-v1-ipv6", "lb-v1", vec![pod("a", "fd00::5", ready()), pod("b", "fd00::6", ready())]);
        assert_eq!(listed(&[ipv4, ipv6]).get("ns", "lb-v1"), 2);
    }

    #[test]
    fn an_endpoint_without_a_target_is_known_by_its_first_address() {
        let bare = |addresses: Value| json!({"addresses": addresses, "conditions": {"ready": true}});
        let first = slice("x-1", "x", vec![bare(json!(["192.0.2.1", "192.0.2.2"])), bare(json!(["192.0.2.3"]))]);
        let second = slice("x-2", "x", vec![bare(json!(["192.0.2.1"])), json!({"addresses": [], "conditions": {}})]);
        let uid_only = slice("x-3", "x", vec![json!({"addresses": ["192.0.2.9"], "targetRef": {"uid": "u-1"}})]);
        assert_eq!(listed(&[first, second]).get("ns", "x"), 2, "one address in two slices is one endpoint");
        assert_eq!(identities(&uid_only), ["u-1"], "a reference without a name is known by its uid");
    }

    #[test]
    fn ready_unset_counts_and_not_ready_or_terminating_does_not() {
        let endpoints = vec![
            pod("unset", "10.244.0.1", json!({})),
            pod("no-conditions", "10.244.0.2", Value::Null),
            pod("not-ready", "10.244.0.3", json!({"ready": false, "serving": false, "terminating": false})),
            pod("terminating", "10.244.0.4", json!({"ready": false, "serving": true, "terminating": true})),
            // publishNotReadyAddresses: ready says true while the pod terminates.
            pod("published", "10.244.0.5", json!({"ready": true, "serving": true, "terminating": true})),
            pod("ready", "10.244.0.6", ready()),
        ];
        let read = slice("s", "svc", endpoints);
        assert_eq!(identities(&read), ["ns/no-conditions", "ns/ready", "ns/unset"]);
    }

    #[test]
    fn a_deleted_slice_takes_away_its_endpoints_only() {
        let first =
            slice("lb-v1-aaaaa", "lb-v1", vec![pod("a", "10.244.0.5", ready()), pod("b", "10.244.0.6", ready())]);
        let second = slice("lb-v1-bbbbb", "lb-v1", vec![pod("b", "fd00::6", ready()), pod("c", "fd00::7", ready())]);
        let table = listed(&[first, second.clone()]);
        assert_eq!(table.get("ns", "lb-v1"), 3);
        table.apply(&watcher::Event::Delete(second));
        assert_eq!(table.get("ns", "lb-v1"), 2, "b is still in the first slice");
        table.apply(&watcher::Event::Delete(slice("lb-v1-aaaaa", "lb-v1", Vec::new())));
        assert_eq!(table.get("ns", "lb-v1"), 0);
        assert!(table.read().slices.by_service.is_empty(), "a Service without slices is not kept");
    }

    #[test]
    fn the_slices_follow_the_watch_and_a_relist_replaces_them_whole() {
        let table = ReadyEndpointSlices::default();
        table.apply(&watcher::Event::Init);
        table.apply(&watcher::Event::InitApply(slice("a-1", "a", vec![pod("p", "10.0.0.1", ready())])));
        assert!(!table.listed());
        assert_eq!(table.get("ns", "a"), 0, "not before the list is done");
        table.apply(&watcher::Event::InitDone);
        assert!(table.listed());
        assert_eq!(table.get("ns", "a"), 1);
        table.apply(&watcher::Event::Apply(slice("b-1", "b", vec![pod("q", "10.0.0.2", ready())])));
        table.apply(&watcher::Event::Apply(slice("a-1", "a", vec![pod("p", "10.0.0.1", json!({"ready": false}))])));
        assert_eq!((table.get("ns", "a"), table.get("ns", "b")), (0, 1));
        // A slice moved to another Service (by hand) no longer counts for the first one.
        table.apply(&watcher::Event::Apply(slice("b-1", "c", vec![pod("q", "10.0.0.2", ready())])));
        assert_eq!((table.get("ns", "b"), table.get("ns", "c")), (0, 1));
        table.apply(&watcher::Event::Init);
        table.apply(&watcher::Event::InitApply(slice("d-1", "d", vec![pod("r", "10.0.0.3", ready())])));
        assert_eq!(table.get("ns", "c"), 1, "the old slices serve until the relist is done");
        table.apply(&watcher::Event::InitDone);
        assert_eq!((table.get("ns", "a"), table.get("ns", "c"), table.get("ns", "d")), (0, 0, 1));
    }

    #[test]
    fn a_slice_without_labels_or_endpoints_counts_nothing_and_names_no_balancer() {
        let bare: ReadySlice = serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "ns"},
            "endpoints": [{"addresses": ["10.0.0.1"]}]}))
        .unwrap();
        assert_eq!((bare.balancer(), bare.service.as_deref(), bare.ready.len()), (None, None, 1));
        let table = listed(std::slice::from_ref(&bare));
        assert_eq!(table.get("ns", "x"), 0, "a slice without its Service's name is of no Service");
        let empty: ReadySlice = serde_json::from_value(json!({"metadata": {}, "endpoints": null})).unwrap();
        assert_eq!((empty.balancer(), empty.ready.len()), (None, 0));
    }

    #[test]
    fn a_hostile_slice_is_bounded() {
        let endpoints =
            (0..MAX_ENDPOINTS_PER_SLICE + 500).map(|i| pod(&format!("p{i}"), "10.0.0.1", ready())).collect();
        let huge = slice("huge", "svc", endpoints);
        assert_eq!(huge.ready.len(), MAX_ENDPOINTS_PER_SLICE);
        let long = slice("long", "svc", vec![pod(&"é".repeat(400), "10.0.0.1", ready())]);
        let identity = &long.ready[0].identity;
        assert!(identity.len() <= MAX_IDENTITY_LEN && identity.starts_with("ns/é"));
    }

    /// A backend's slice with ports, in `family`.
    fn ported_slice(name: &str, family: &str, endpoints: Vec<Value>, ports: Value) -> ReadySlice {
        serde_json::from_value(json!({
            "addressType": family,
            "metadata": {"name": name, "namespace": "ns", "labels": {SERVICE_NAME_LABEL: "lb-v1", BALANCER_NAME_LABEL: "lb"}},
            "endpoints": endpoints,
            "ports": ports,
        }))
        .unwrap()
    }

    #[test]
    fn ready_pods_are_one_per_endpoint_by_their_ipv4_address_with_their_slices_ports_sorted() {
        let ports = json!([{"name": "http", "port": 5678, "protocol": "TCP"}, {"name": "sctp", "port": 9, "protocol": "SCTP"},
                           {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "none"}]);
        let ipv6 = ported_slice(
            "lb-v1-b",
            "IPv6",
            vec![pod("a", "fd00:0::5", ready()), pod("c", "fd00::7", ready())],
            ports.clone(),
        );
        let ipv4 = ported_slice(
            "lb-v1-a",
            "IPv4",
            vec![
                pod("b", "10.244.0.6", ready()),
                pod("a", "10.244.0.5", ready()),
                pod("d", "10.244.0.8", json!({"ready": false})),
            ],
            ports,
        );
        let fqdn = ported_slice("lb-v1-c", "FQDN", vec![pod("e", "backend.example.com", ready())], json!([]));
        let table = listed(&[ipv6, ipv4, fqdn]);
        let pods = table.ready_pods("ns", "lb-v1");
        let addresses: Vec<String> = pods.iter().map(|p| p.address.to_string()).collect();
        assert_eq!(addresses, ["10.244.0.5", "10.244.0.6", "fd00::7"], "IPv4 first, written canonically, no name");
        let wanted = [
            PodPort { name: "dns".into(), protocol: crate::api::Protocol::Udp, port: 53 },
            PodPort { name: "http".into(), protocol: crate::api::Protocol::Tcp, port: 5678 },
        ];
        let mut read = pods[0].ports.clone();
        read.sort();
        assert_eq!(read, wanted, "SCTP and a port without a number are left out");
        assert_eq!(table.get("ns", "lb-v1"), 4, "the name still counts as a ready endpoint");
    }
}

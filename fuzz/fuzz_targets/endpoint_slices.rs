//! EndpointSlices as the controller's watch reads them, which whoever runs pods behind a backend
//! Service (or writes EndpointSlices in the namespace) shapes: one slice, or a JSON array of
//! them, listed in the controller's table, then the ready pods of each Service they name (in the
//! order they name them) as a Balancer's backends, rendered into `nginx.conf`. Never a panic;
//! every pod is the first address of a ready, non-terminating endpoint of its Service's slices;
//! and every upstream server in `nginx.conf` is a canonical socket address, listed once per
//! backend in its upstream, of one of those pods (or of a backend Service: down for a backend without a ready
//! pod, and for all when the pods do not fit).
#![no_main]

use std::collections::{BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::LazyLock;

use balancer::api::v1beta1::Balancer;
use balancer::controller::{ReadyEndpointSlices, ReadySlice};
use balancer::proxy::{BackendTarget, Owner, ProxySettings, proxy};
use balancer::spec::{Admitted, ObjectName, SpecPolicy, admit};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// The Balancer whose backends the slices' Services become: a TCP and a UDP port.
const BALANCER: &str = r#"{"apiVersion": "exposer.hliangzhao.io/v1beta1", "kind": "Balancer",
  "metadata": {"name": "lb", "namespace": "ns", "uid": "00000000-0000-0000-0000-000000000001"},
  "spec": {"selector": {"app": "test"},
    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
              {"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 5353}],
    "backends": [{"name": "v1", "weight": 40, "selector": {"version": "v1"}},
                 {"name": "v2", "weight": 20, "selector": {"version": "v2"}},
                 {"name": "v3", "weight": 40, "selector": {"version": "v3"}}]}}"#;

static BALANCER_READ: LazyLock<(Owner, Admitted)> = LazyLock::new(|| {
    let balancer: Balancer = serde_json::from_str(BALANCER).expect("the Balancer reads");
    let owner = Owner::of(&balancer).expect("a stored Balancer");
    let spec = admit(ObjectName::Name("lb"), balancer.spec, &SpecPolicy::default()).expect("the Balancer is valid");
    (owner, spec)
});

/// Live delivery, so that the upstreams are the backends' pods.
static SETTINGS: LazyLock<ProxySettings> = LazyLock::new(|| ProxySettings {
    image: "nginx".into(),
    load_modules: Vec::new(),
    metrics_image: Some("balancer".into()),
    policy: SpecPolicy::default(),
    signer: None,
});

const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What the API says of the slices, read apart from the controller's code: each Service they
/// name (`namespace`, `name`), in the order the slices that the table keeps name them (a later
/// slice of the same namespace and name replaces an earlier one; one without a Service takes it
/// out), with the first address of each endpoint that is ready (unset counts as ready) and not
/// terminating.
fn ready_addresses(slices: &[Value]) -> Vec<((String, String), BTreeSet<IpAddr>)> {
    let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
    let mut kept: Vec<((String, String), &Value)> = Vec::new();
    for slice in slices {
        let key = (text(&slice["metadata"]["namespace"]), text(&slice["metadata"]["name"]));
        kept.retain(|(k, _)| *k != key);
        if !text(&slice["metadata"]["labels"][SERVICE_NAME_LABEL]).is_empty() {
            kept.push((key, slice));
        }
    }
    let mut services: Vec<((String, String), BTreeSet<IpAddr>)> = Vec::new();
    for ((namespace, _), slice) in kept {
        let service = (namespace, text(&slice["metadata"]["labels"][SERVICE_NAME_LABEL]));
        let index = services.iter().position(|(s, _)| *s == service).unwrap_or_else(|| {
            services.push((service, BTreeSet::new()));
            services.len() - 1
        });
        for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
            let ready = endpoint["conditions"]["ready"].as_bool().unwrap_or(true);
            let terminating = endpoint["conditions"]["terminating"].as_bool().unwrap_or(false);
            let addresses = endpoint["addresses"].as_array().into_iter().flatten();
            let first = addresses.filter_map(Value::as_str).find(|a| !a.is_empty());
            if let (true, false, Some(address)) = (ready, terminating, first.and_then(|a| a.parse().ok())) {
                services[index].1.insert(address);
            }
        }
    }
    services
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else { return };
    let values = match value {
        Value::Array(items) => items,
        one => vec![one],
    };
    // As the watch reads them: a slice that does not read is an error there, and so here.
    let Ok(slices) =
        values.iter().map(|v| serde_json::from_value::<ReadySlice>(v.clone())).collect::<Result<Vec<_>, _>>()
    else {
        return;
    };
    let table: ReadyEndpointSlices = slices.into_iter().collect();
    let expected = ready_addresses(&values);

    let (owner, spec) = &*BALANCER_READ;
    let cluster_ip = |i: usize| IpAddr::from([10, 96, 0, u8::try_from(i + 1).unwrap_or(u8::MAX)]);
    let mut pod_addresses: HashSet<IpAddr> = HashSet::new();
    let targets: Vec<BackendTarget<'_>> = spec
        .backends
        .iter()
        .enumerate()
        .map(|(i, backend)| {
            let pods = match expected.get(i) {
                Some(((namespace, service), ready)) => {
                    let pods = table.ready_pods(namespace, service);
                    for pod in &pods {
                        assert!(ready.contains(&pod.address), "{} is no ready endpoint of {service}", pod.address);
                    }
                    pods
                }
                None => Vec::new(),
            };
            pod_addresses.extend(pods.iter().map(|pod| pod.address));
            BackendTarget { spec: backend, cluster_ip: Some(cluster_ip(i)), ready_pods: Some(pods) }
        })
        .collect();

    let built = proxy(owner, spec, &SETTINGS, &targets);
    let services: HashSet<IpAddr> = (0..spec.backends.len()).map(cluster_ip).collect();
    let mut upstream: HashSet<(SocketAddr, &str)> = HashSet::new();
    for line in built.nginx_conf.lines().map(str::trim) {
        if line.starts_with("upstream ") {
            upstream.clear();
        }
        let Some(rest) = line.strip_prefix("server ") else { continue };
        if rest.starts_with('{') {
            continue;
        }
        let token = rest.split([' ', ';']).next().unwrap_or_default();
        let address: SocketAddr = token.parse().unwrap_or_else(|_| panic!("not a socket address: {line}"));
        assert_eq!(address.to_string(), token, "not written canonically: {line}");
        // A backend's Service, down, stands for a backend without a ready pod.
        let down = rest.contains(" down");
        let allowed = if built.pod_upstreams && !down { &pod_addresses } else { &services };
        assert!(allowed.contains(&address.ip()), "an address of nowhere: {line}");
        // Once per backend: a pod that two backends select (the webhook warns) serves both shares.
        let backend = line.rsplit_once("# ").map(|(_, service)| service).unwrap_or_default();
        assert!(upstream.insert((address, backend)), "twice in one backend: {line}\n{}", built.nginx_conf);
    }
});

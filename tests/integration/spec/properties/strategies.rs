//! The proptest strategies the properties draw from: arbitrary specs, valid Balancers (and the
//! optional fields a test may drop), arbitrary JSON; and the defaults they are checked against.

use std::collections::BTreeMap;

use balancer::api::v1beta1::{FrontService, ProxySpec};
use balancer::api::{Algorithm, BackendSpec, BalancerPort, BalancerSpec};
use balancer::spec::{SchedulingPolicy, SpecPolicy, with_defaults};
use json_patch::Patch;
use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::collection::{btree_map, btree_set, vec};
use proptest::option;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use serde_json::Value;
use strum::VariantNames;

pub(super) const CASES: u32 = 256;

/// What the webhooks default with in these tests (`--proxy-replicas 3`: not the type's default,
/// so a test cannot pass by accident with `SpecPolicy::default()`).
pub(super) const DEFAULTS: SpecPolicy =
    SpecPolicy { replicas: 3, allowed_images: Vec::new(), scheduling: SchedulingPolicy::ANY };

/// The defaults patch, which cannot fail to encode for a spec of strings and numbers.
pub(super) fn defaults_patch(spec: &BalancerSpec) -> Patch {
    balancer::spec::defaults_patch(spec, &DEFAULTS).expect("a spec encodes")
}

pub(super) fn defaulted(spec: &BalancerSpec) -> BalancerSpec {
    with_defaults(spec, &DEFAULTS)
}

/// Strings that are sometimes valid names, often not, sometimes not even ASCII.
pub(super) fn arb_text() -> BoxedStrategy<String> {
    let label_chars = select(&b"abcxyz0189-"[..]).prop_map(char::from);
    let ascii = (b' '..=b'~').prop_map(char::from);
    prop_oneof![
        vec(label_chars, 0..12).prop_map(String::from_iter),
        vec(ascii, 0..70).prop_map(String::from_iter), // long enough to break the 63-character limits
        vec(any::<char>(), 0..16).prop_map(String::from_iter),
        Just(String::new()),
        Just("TCP".to_string()),
    ]
    .boxed()
}

/// Ports and weights: anything, near the bounds, or in range.
pub(super) fn arb_number() -> BoxedStrategy<i32> {
    prop_oneof![any::<i32>(), -2i32..=70_000, 0i32..=101].boxed()
}

pub(super) fn arb_labels(max: usize) -> BoxedStrategy<BTreeMap<String, String>> {
    btree_map(arb_text(), arb_text(), 0..max).boxed()
}

fn arb_port() -> impl Strategy<Value = BalancerPort> {
    (
        (
            option::of(arb_text()),
            option::of(prop_oneof![Just("TCP".to_string()), Just("UDP".to_string()), arb_text()]),
            arb_number(),
            option::of(prop_oneof![arb_number().prop_map(IntOrString::Int), arb_text().prop_map(IntOrString::String),]),
            option::of(arb_duration()),
            option::of(arb_duration()),
        ),
        (option::of(arb_number()), option::of(any::<bool>()), option::of(any::<bool>())),
    )
        .prop_map(
            |(
                (name, protocol, port, target_port, connect_timeout, idle_timeout),
                (node_port, proxy_protocol, accept_proxy_protocol),
            )| BalancerPort {
                name,
                protocol,
                port,
                target_port,
                connect_timeout,
                idle_timeout,
                node_port,
                proxy_protocol,
                accept_proxy_protocol,
            },
        )
}

/// Durations as nginx writes them, in and out of bounds, and any text.
fn arb_duration() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[0-9]{1,7}(ms|s|m|h)", 1 => arb_text()]
}

fn arb_backend() -> impl Strategy<Value = BackendSpec> {
    (
        arb_text(),
        option::of(arb_number()),
        option::of(arb_labels(4)),
        option::of(arb_number()),
        option::of(arb_duration()),
        option::of(arb_number()),
        option::of(any::<bool>()),
    )
        .prop_map(|(name, weight, selector, max_fails, fail_timeout, max_connections, backup)| BackendSpec {
            name,
            weight,
            selector,
            max_fails,
            fail_timeout,
            max_connections,
            backup,
        })
}

/// `spec.service`: the known values, or anything.
fn arb_service() -> impl Strategy<Value = FrontService> {
    let one_of =
        |known: &'static [&'static str]| option::of(prop_oneof![select(known).prop_map(String::from), arb_text()]);
    (
        one_of(&["ClusterIP", "NodePort", "LoadBalancer"]),
        option::of(prop_oneof![Just("example.com/lb".to_string()), arb_text()]),
        one_of(&["Cluster", "Local"]),
        option::of(vec(prop_oneof![Just("10.0.0.0/8".to_string()), arb_text()], 0..6)),
        option::of(arb_labels(6)),
    )
        .prop_map(
            |(type_, load_balancer_class, external_traffic_policy, load_balancer_source_ranges, annotations)| {
                FrontService {
                    type_,
                    load_balancer_class,
                    external_traffic_policy,
                    load_balancer_source_ranges,
                    annotations,
                }
            },
        )
}

/// Specs of up to 40 ports and 70 backends (past both limits), mostly small ones to keep the run short.
pub(super) fn arb_spec() -> impl Strategy<Value = BalancerSpec> {
    let ports = prop_oneof![3 => vec(arb_port(), 0..4), 1 => vec(arb_port(), 0..40)];
    let backends = prop_oneof![3 => vec(arb_backend(), 0..4), 1 => vec(arb_backend(), 0..70)];
    let replicas = option::of(prop_oneof![0i32..=100, arb_number()]);
    let affinity = option::of(prop_oneof![Just("None".to_string()), Just("ClientIP".to_string()), arb_text()]);
    let algorithm = option::of(prop_oneof![select(Algorithm::VARIANTS).prop_map(String::from), arb_text()]);
    let proxy = option::of((0i32..100).prop_map(proxy_pods));
    let choices = (replicas, affinity, algorithm);
    (choices, option::of(arb_service()), proxy, ports, option::of(arb_labels(5)), backends).prop_map(
        |((replicas, session_affinity, algorithm), service, proxy, ports, selector, backends)| BalancerSpec {
            replicas,
            session_affinity,
            algorithm,
            service,
            proxy,
            canary: None,
            ports,
            selector,
            backends,
        },
    )
}

/// Specs within the list bounds: longer lists are refused while being read, so only
/// these survive a trip through JSON.
pub(super) fn readable_spec() -> impl Strategy<Value = BalancerSpec> {
    arb_spec().prop_filter("lists within their bounds", |spec| spec.ports.len() <= 32 && spec.backends.len() <= 64)
}

/// A Balancer that breaks no rule, with every optional field set.
#[derive(Clone, Debug)]
pub(super) struct ValidBalancer {
    pub(super) name: String,
    pub(super) spec: BalancerSpec,
}

fn valid_label_key() -> &'static str {
    "([a-z0-9]{1,8}(\\.[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?){0,2}/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,10}[A-Za-z0-9])?"
}

fn valid_label_value() -> &'static str {
    "([A-Za-z0-9]([A-Za-z0-9_.-]{0,10}[A-Za-z0-9])?)?"
}

fn valid_selector() -> BoxedStrategy<BTreeMap<String, String>> {
    btree_map(valid_label_key(), valid_label_value(), 0..4).boxed()
}

fn valid_ports() -> impl Strategy<Value = Vec<BalancerPort>> {
    let extras = (
        "[a-z][a-z0-9]{0,8}",
        select(&["TCP", "UDP"][..]),
        prop_oneof![
            (1i32..=65535).prop_map(IntOrString::Int),
            // IANA service names: a letter, no leading, trailing or double dash, at most 14 characters.
            "[a-z][a-z0-9]{0,3}(-[a-z0-9]{1,4}){0,2}".prop_map(IntOrString::String),
        ],
    );
    (1usize..6).prop_flat_map(move |n| (btree_set(1i32..=65535, n), vec(extras.clone(), n))).prop_map(
        |(numbers, extras)| {
            numbers
                .into_iter()
                .zip(extras)
                .enumerate()
                .map(|(i, (port, (name, protocol, target)))| BalancerPort {
                    // The "-<index>" suffix keeps names unique (the base has no dash).
                    name: Some(format!("{name}-{i}")),
                    protocol: Some(protocol.to_string()),
                    port,
                    target_port: Some(target),
                    connect_timeout: Some(format!("{}ms", 100 + port % 1000)),
                    idle_timeout: Some(format!("{}s", 1 + port % 3600)),
                    node_port: None,
                    // The PROXY protocol either way on some TCP ports (never on UDP).
                    proxy_protocol: (protocol == "TCP" && port % 3 == 0).then_some(true),
                    accept_proxy_protocol: (protocol == "TCP").then_some(port % 4 == 1),
                })
                .collect()
        },
    )
}

pub(super) fn valid_balancer() -> impl Strategy<Value = ValidBalancer> {
    (
        "[a-z]([a-z0-9-]{0,20}[a-z0-9])?",
        0i32..=100,
        valid_ports(),
        option::of(valid_selector()),
        vec(("[a-z0-9]{1,8}", 0i32..=100, option::of(valid_selector())), 1..8),
    )
        .prop_map(|(name, replicas, ports, selector, backends)| {
            let mut spec = BalancerSpec {
                replicas: Some(replicas),
                session_affinity: Some(["None", "ClientIP"][replicas as usize % 2].to_string()),
                // Any algorithm without affinity; ClientIP affinity needs RoundRobin.
                algorithm: Some(
                    Algorithm::VARIANTS[if replicas % 2 == 0 { (replicas as usize / 2) % 3 } else { 0 }].to_string(),
                ),
                service: Some(exposure(replicas)),
                proxy: (replicas % 2 == 0).then(|| proxy_pods(replicas)),
                canary: None,
                ports,
                selector,
                backends: backends
                    .into_iter()
                    .enumerate()
                    .map(|(i, (name, weight, selector))| BackendSpec {
                        name: format!("{name}-{i}"),
                        weight: Some(weight),
                        selector,
                        max_fails: Some(weight % 5),
                        fail_timeout: Some(format!("{}s", 1 + weight)),
                        max_connections: (weight % 2 == 1).then_some(1 + 100 * weight),
                        // Backups where nginx takes them, and never the first backend.
                        backup: (i > 0 && weight % 3 == 0).then_some(true),
                    })
                    .collect(),
            };
            if spec.session_affinity.as_deref() == Some("ClientIP")
                || spec.algorithm.as_deref() == Some("PowerOfTwoChoices")
            {
                spec.backends.iter_mut().for_each(|b| b.backup = None);
            }
            if spec.written_service_type() != "ClusterIP" {
                for (i, port) in spec.ports.iter_mut().enumerate().filter(|(i, _)| i % 2 == 0) {
                    port.node_port = Some(30000 + i as i32);
                }
            }
            if spec.backends.iter().all(|b| b.weight == Some(0) || b.is_backup()) {
                spec.backends[0].weight = Some(1);
            }
            for i in 0..spec.backends.len() {
                if spec.merged_selector(&spec.backends[i]).is_empty() {
                    let own = BTreeMap::from([("backend".to_string(), spec.backends[i].name.clone())]);
                    spec.backends[i].selector = Some(own);
                }
            }
            ValidBalancer { name, spec }
        })
}

/// A valid `spec.service` of each type, chosen by `n`.
fn exposure(n: i32) -> FrontService {
    let type_ = ["ClusterIP", "NodePort", "LoadBalancer"][n as usize % 3];
    let load_balancer = type_ == "LoadBalancer";
    FrontService {
        type_: Some(type_.into()),
        load_balancer_class: load_balancer.then(|| "example.com/internal".into()),
        external_traffic_policy: (type_ != "ClusterIP").then(|| ["Cluster", "Local"][n as usize % 2].into()),
        load_balancer_source_ranges: load_balancer.then(|| vec!["10.0.0.0/8".into(), "fd00::/8".into()]),
        annotations: Some(BTreeMap::from([("example.com/lb-scheme".to_string(), "internal".to_string())])),
    }
}

/// A valid `spec.proxy` (no image: the policy allows none).
fn proxy_pods(n: i32) -> ProxySpec {
    let quantities = BTreeMap::from([
        ("cpu".to_string(), Quantity(format!("{}m", 10 + n))),
        ("memory".to_string(), Quantity("64Mi".into())),
    ]);
    ProxySpec {
        resources: Some(ResourceRequirements { requests: Some(quantities), ..ResourceRequirements::default() }),
        node_selector: Some(BTreeMap::from([("kubernetes.io/os".to_string(), "linux".to_string())])),
        tolerations: Some(vec![Toleration {
            key: Some("dedicated".into()),
            operator: Some("Exists".into()),
            ..Toleration::default()
        }]),
        priority_class_name: Some("system-cluster-critical".into()),
        pod_annotations: Some(BTreeMap::from([("example.com/scrape".to_string(), "true".to_string())])),
        ..ProxySpec::default()
    }
}

/// How to drop one port's optional fields: 0 keep, 1 remove, 2 set empty.
#[derive(Clone, Copy, Debug)]
pub(super) struct PortDrop {
    pub(super) protocol: u8,
    pub(super) target_port: u8,
}

pub(super) fn drop_optional_fields(
    spec: &BalancerSpec,
    ports: &[PortDrop],
    weights: &[bool],
    single_port_name: bool,
    replicas: bool,
) -> BalancerSpec {
    let mut spec = spec.clone();
    if replicas {
        spec.replicas = None;
        spec.session_affinity = None;
    }
    for (port, how) in spec.ports.iter_mut().zip(ports) {
        match how.protocol {
            1 => port.protocol = None,
            2 => port.protocol = Some(String::new()),
            _ => {}
        }
        match how.target_port {
            1 => port.target_port = None,
            2 => port.target_port = Some(IntOrString::String(String::new())),
            _ => {}
        }
    }
    if single_port_name && spec.ports.len() == 1 {
        spec.ports[0].name = None;
    }
    for (backend, drop) in spec.backends.iter_mut().zip(weights) {
        if *drop {
            backend.weight = None;
        }
    }
    spec
}

/// A float as JSON, if it is finite and serde_json reads its text back as the same
/// number (without the `float_roundtrip` feature some are off by one ulp, which would
/// make the body the server parses differ from the `Value` the test reasons about).
fn json_float(f: f64) -> Option<Value> {
    let number = serde_json::Number::from_f64(f)?;
    let text = number.to_string();
    (serde_json::from_str::<f64>(&text).ok()? == f).then_some(Value::Number(number))
}

const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "generateName",
    "spec",
    "ports",
    "port",
    "protocol",
    "targetPort",
    "selector",
    "backends",
    "weight",
    "request",
    "uid",
    "object",
    "operation",
    "subResource",
];

pub(super) fn arb_key() -> BoxedStrategy<String> {
    prop_oneof![select(KEYS).prop_map(str::to_string), ".{0,8}"].boxed()
}

pub(super) fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-3i64..70_000).prop_map(Value::from),
        any::<f64>().prop_filter_map("finite and read back exactly", json_float),
        arb_key().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(arb_key(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Every JSON pointer into `value`, the root ("") included.
fn pointers(value: &Value) -> Vec<String> {
    fn walk(value: &Value, at: String, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    walk(child, format!("{at}/{}", key.replace('~', "~0").replace('/', "~1")), out);
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    walk(child, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
        out.push(at);
    }
    let mut out = Vec::new();
    walk(value, String::new(), &mut out);
    out
}

/// `value` with the subtree chosen by `which` replaced by `with`.
pub(super) fn replace_somewhere(mut value: Value, which: Index, with: Value) -> Value {
    let all = pointers(&value);
    let pointer = which.get(&all).clone();
    *value.pointer_mut(&pointer).expect("the pointer was just collected") = with;
    value
}

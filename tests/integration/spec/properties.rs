//! Property tests of the admission rules, the defaults, the AdmissionReview handling and
//! the conversion between API versions.
//!
//! (a) validation and defaulting never panic on arbitrary specs;
//! (b) mutation is idempotent: after the defaults patch is applied, a second one is empty;
//! (c) the JSON-patched spec is exactly `with_defaults(spec)`;
//! (d) a valid Balancer with its optional fields dropped is still valid once mutated;
//! (e) `admission::review` never panics and never fails server-side, whatever the body,
//!     and echoes the request's uid whenever it answers;
//! (f) v1alpha1 → v1beta1 → v1alpha1 and v1beta1 → v1alpha1 → v1beta1 are the identity
//!     (the v1beta1-only fields ride in an annotation), and `conversion_review` never panics
//!     and answers every usable review with its uid.

use std::collections::BTreeMap;

use balancer::api::conversion::{PRESERVED_ANNOTATION, Version, convert};
use balancer::api::v1beta1::{BalancerAddress, FrontService, NodePortStatus, ProxySpec};
use balancer::api::{Algorithm, BackendSpec, BackendStatus, Balancer, BalancerPort, BalancerSpec, BalancerStatus};
use balancer::spec::admit;
use balancer::spec::{ObjectName, Report};
use balancer::spec::{SpecPolicy, with_defaults};
use balancer::webhook::admission::{self, Answer, MAX_WARNINGS, Outcome, Webhook};
use balancer::webhook::conversion::conversion_review;
use balancer::webhook::review::{BadRequest, MAX_ANSWER_BYTES, MAX_UID_BYTES};
use base64::Engine as _;
use json_patch::{Patch, PatchOperation};
use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::collection::{btree_map, btree_set, vec};
use proptest::option;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use serde_json::value::to_raw_value;
use serde_json::{Value, json};
use strum::VariantNames;

use crate::support::fixtures;

const CASES: u32 = 256;

/// What the webhooks default with in these tests (`--proxy-replicas 3`: not the type's default,
/// so a test cannot pass by accident with `SpecPolicy::default()`).
const DEFAULTS: SpecPolicy = SpecPolicy { replicas: 3, allowed_images: Vec::new() };

/// The defaults patch, which cannot fail to encode for a spec of strings and numbers.
fn defaults_patch(spec: &BalancerSpec) -> Patch {
    balancer::spec::defaults_patch(spec, &DEFAULTS).expect("a spec encodes")
}

fn defaulted(spec: &BalancerSpec) -> BalancerSpec {
    with_defaults(spec, &DEFAULTS)
}
// ---------------------------------------------------------------------------
// Strategies: arbitrary specs
// ---------------------------------------------------------------------------

/// Strings that are sometimes valid names, often not, sometimes not even ASCII.
fn arb_text() -> BoxedStrategy<String> {
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
fn arb_number() -> BoxedStrategy<i32> {
    prop_oneof![any::<i32>(), -2i32..=70_000, 0i32..=101].boxed()
}

fn arb_labels(max: usize) -> BoxedStrategy<BTreeMap<String, String>> {
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
fn arb_spec() -> impl Strategy<Value = BalancerSpec> {
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
            ports,
            selector,
            backends,
        },
    )
}

/// Specs within the list bounds: longer lists are refused while being read, so only
/// these survive a trip through JSON.
fn readable_spec() -> impl Strategy<Value = BalancerSpec> {
    arb_spec().prop_filter("lists within their bounds", |spec| spec.ports.len() <= 32 && spec.backends.len() <= 64)
}

// ---------------------------------------------------------------------------
// Strategies: valid specs
// ---------------------------------------------------------------------------

/// A Balancer that breaks no rule, with every optional field set.
#[derive(Clone, Debug)]
struct ValidBalancer {
    name: String,
    spec: BalancerSpec,
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

fn valid_balancer() -> impl Strategy<Value = ValidBalancer> {
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
struct PortDrop {
    protocol: u8,
    target_port: u8,
}

fn drop_optional_fields(
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

// ---------------------------------------------------------------------------
// Strategies: arbitrary JSON
// ---------------------------------------------------------------------------

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

fn arb_key() -> BoxedStrategy<String> {
    prop_oneof![select(KEYS).prop_map(str::to_string), ".{0,8}"].boxed()
}

fn arb_json() -> impl Strategy<Value = Value> {
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
fn replace_somewhere(mut value: Value, which: Index, with: Value) -> Value {
    let all = pointers(&value);
    let pointer = which.get(&all).clone();
    *value.pointer_mut(&pointer).expect("the pointer was just collected") = with;
    value
}

// ---------------------------------------------------------------------------
// AdmissionReview helpers
// ---------------------------------------------------------------------------

fn object(name: &str, spec: &BalancerSpec) -> Value {
    serde_json::to_value(Balancer::new(name, spec.clone())).expect("a Balancer serializes")
}

fn envelope(uid: &str, operation: &str, object: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "exposer.hliangzhao.io", "version": "v1beta1", "kind": "Balancer"},
            "resource": {"group": "exposer.hliangzhao.io", "version": "v1beta1", "resource": "balancers"},
            "name": object.pointer("/metadata/name").cloned().unwrap_or(json!("")),
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "proptest"},
            "object": object,
            "oldObject": null,
            "dryRun": false
        }
    })
}

fn review(webhook: Webhook, body: &Value) -> Result<Answer, BadRequest> {
    admission::review(webhook, &serde_json::to_vec(body).expect("JSON serializes"), &DEFAULTS)
}

/// Checks an answer the way the server would send it: it encodes (else the
/// server answers 500), its status is not a server error, and its outcome
/// agrees with the response it carries. Returns the wire form.
fn check_answer(answer: &Answer) -> Result<Value, TestCaseError> {
    let bytes = answer.to_json().map_err(|e| TestCaseError::fail(format!("the answer does not encode: {e}")))?;
    prop_assert!(bytes.len() <= MAX_ANSWER_BYTES, "a {}-byte answer", bytes.len());
    let wire: Value = serde_json::from_slice(&bytes).expect("to_json produces JSON");
    let response =
        answer.review.response.as_ref().ok_or_else(|| TestCaseError::fail("an answer without a response"))?;
    prop_assert!(response.result.code < 500, "status code {}", response.result.code);
    prop_assert!(!response.result.message.contains("internal error"), "{}", response.result.message);
    prop_assert_eq!(wire.pointer("/response/uid"), Some(&json!(response.uid)));
    match answer.outcome {
        Outcome::Allowed => {
            prop_assert!(response.allowed);
            prop_assert!(response.patch.is_none());
        }
        Outcome::Patched => {
            prop_assert!(response.allowed);
            let encoded = wire
                .pointer("/response/patch")
                .and_then(Value::as_str)
                .ok_or_else(|| TestCaseError::fail("a patch that is not a base64 string"))?;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| TestCaseError::fail(format!("patch is not base64: {e}")))?;
            let ops: Vec<PatchOperation> = serde_json::from_slice(&decoded)
                .map_err(|e| TestCaseError::fail(format!("patch is not a JSON Patch: {e}")))?;
            prop_assert!(!ops.is_empty());
        }
        Outcome::Denied => {
            prop_assert!(!response.allowed);
            prop_assert_eq!(response.result.code, 422);
            prop_assert_eq!(&response.result.reason, "Invalid");
            prop_assert!(response.result.message.starts_with("Balancer "), "{}", response.result.message);
        }
        Outcome::BadRequest => prop_assert!(false, "an answered review cannot be a bad request"),
    }
    Ok(wire)
}

/// The JSON Patch carried by a wire-form answer, or an empty one.
fn wire_patch(wire: &Value) -> Patch {
    match wire.pointer("/response/patch").and_then(Value::as_str) {
        None => Patch(vec![]),
        Some(encoded) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).expect("base64");
            serde_json::from_slice(&bytes).expect("a JSON Patch")
        }
    }
}

fn spec_of(doc: &Value) -> BalancerSpec {
    serde_json::from_value(doc["spec"].clone()).expect("the spec still parses")
}

fn validate_as(meta: &(Option<String>, Option<String>), spec: &BalancerSpec) -> Report {
    balancer::spec::validate(ObjectName::from_meta(meta.0.as_deref(), meta.1.as_deref()), spec, &DEFAULTS)
}

// ---------------------------------------------------------------------------
// (a) no panics on arbitrary specs
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn validation_and_defaulting_never_panic(
        name in option::of(arb_text()),
        generate_name in option::of(arb_text()),
        spec in arb_spec(),
    ) {
        let meta = (name, generate_name);
        let report = validate_as(&meta, &spec);
        prop_assert_eq!(report.is_valid(), report.errors.is_empty());
        prop_assert_eq!(&validate_as(&meta, &spec), &report, "validation is deterministic");
        for error in &report.errors {
            prop_assert!(
                error.field.starts_with("metadata.") || error.field.starts_with("spec."),
                "unexpected field path {:?}", error.field
            );
            prop_assert!(!error.detail.is_empty());
        }
        let defaulted = defaulted(&spec);
        let _ = validate_as(&meta, &defaulted);
        let patch = defaults_patch(&spec);
        prop_assert!(patch.0.len() <= 4 + 4 * spec.ports.len() + 3 * spec.backends.len());
        prop_assert!(defaults_patch(&defaulted).0.is_empty(), "with_defaults leaves nothing to default");
        // admit is exactly: defaults, then the rules.
        match admit(ObjectName::from_meta(meta.0.as_deref(), meta.1.as_deref()), spec.clone(), &DEFAULTS) {
            Ok(admitted) => {
                prop_assert_eq!(&*admitted, &defaulted);
                prop_assert_eq!(admitted.warnings().to_vec(), validate_as(&meta, &defaulted).warnings);
                prop_assert_eq!(admitted.replicas(), defaulted.replicas.unwrap_or_default());
            }
            Err(report) => prop_assert_eq!(report, validate_as(&meta, &defaulted)),
        }
    }
}

// ---------------------------------------------------------------------------
// (b) and (c): the patch, applied, is with_defaults and leaves nothing to do
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn defaults_patch_applies_matches_with_defaults_and_is_idempotent(spec in readable_spec()) {
        let original = object("p", &spec);
        prop_assert_eq!(&spec_of(&original), &spec, "the spec survives a JSON round trip");

        let mut doc = original.clone();
        let patch = defaults_patch(&spec);
        json_patch::patch(&mut doc, &patch.0)
            .map_err(|e| TestCaseError::fail(format!("the defaults patch does not apply: {e}")))?;
        let patched = spec_of(&doc);
        prop_assert_eq!(&patched, &defaulted(&spec));
        prop_assert!(defaults_patch(&patched).0.is_empty(), "second patch: {:?}", defaults_patch(&patched));
        // A spec within the list bounds always gets a replica count.
        prop_assert_eq!(patched.replicas, Some(spec.replicas.unwrap_or(DEFAULTS.replicas)));

        // The patch only touches the spec.
        prop_assert_eq!(&doc["metadata"], &original["metadata"]);
        prop_assert_eq!(&doc["apiVersion"], &original["apiVersion"]);
        prop_assert_eq!(&doc["kind"], &original["kind"]);
    }

    #[test]
    fn the_mutating_webhook_is_idempotent(spec in readable_spec()) {
        let original = object("p", &spec);
        let first = review(Webhook::Mutate, &envelope("uid-1", "CREATE", original.clone()))
            .map_err(|e| TestCaseError::fail(format!("refused as a bad request: {e}")))?;
        let wire = check_answer(&first)?;
        let patch = wire_patch(&wire);
        prop_assert_eq!(first.outcome == Outcome::Patched, !patch.0.is_empty());
        let mut doc = original;
        json_patch::patch(&mut doc, &patch.0)
            .map_err(|e| TestCaseError::fail(format!("the webhook's patch does not apply: {e}")))?;
        prop_assert_eq!(&spec_of(&doc), &defaulted(&spec));

        let second = review(Webhook::Mutate, &envelope("uid-2", "UPDATE", doc))
            .map_err(|e| TestCaseError::fail(format!("refused as a bad request: {e}")))?;
        let wire = check_answer(&second)?;
        prop_assert_eq!(second.outcome, Outcome::Allowed);
        prop_assert!(wire.pointer("/response/patch").is_none());
    }
}

// ---------------------------------------------------------------------------
// (d) valid stays valid
// ---------------------------------------------------------------------------

fn port_drops() -> impl Strategy<Value = Vec<PortDrop>> {
    vec((0u8..3, 0u8..3).prop_map(|(protocol, target_port)| PortDrop { protocol, target_port }), 8)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn valid_balancers_are_valid(valid in valid_balancer()) {
        let report = balancer::spec::validate(ObjectName::Name(&valid.name), &valid.spec, &DEFAULTS);
        prop_assert!(report.is_valid(), "{:#?}", report.errors);
        prop_assert!(defaults_patch(&valid.spec).0.is_empty(), "every optional field is set");
        let admitted = admit(ObjectName::Name(&valid.name), valid.spec.clone(), &DEFAULTS)
            .map_err(|r| TestCaseError::fail(format!("not admitted: {:?}", r.errors)))?;
        prop_assert_eq!(&*admitted, &valid.spec);
    }

    #[test]
    fn a_mutated_valid_balancer_stays_valid(
        valid in valid_balancer(),
        ports in port_drops(),
        weights in vec(any::<bool>(), 8),
        single_port_name in any::<bool>(),
        replicas in any::<bool>(),
    ) {
        let dropped = drop_optional_fields(&valid.spec, &ports, &weights, single_port_name, replicas);
        let defaulted = defaulted(&dropped);
        let report = balancer::spec::validate(ObjectName::Name(&valid.name), &defaulted, &DEFAULTS);
        prop_assert!(report.is_valid(), "{:#?}", report.errors);

        // The same through both webhooks, in the order the API server calls them.
        let mut doc = object(&valid.name, &dropped);
        let mutated = review(Webhook::Mutate, &envelope("uid-m", "CREATE", doc.clone()))
            .map_err(|e| TestCaseError::fail(format!("refused as a bad request: {e}")))?;
        let wire = check_answer(&mutated)?;
        json_patch::patch(&mut doc, &wire_patch(&wire).0)
            .map_err(|e| TestCaseError::fail(format!("the webhook's patch does not apply: {e}")))?;
        prop_assert_eq!(&spec_of(&doc), &defaulted);
        let validated = review(Webhook::Validate, &envelope("uid-v", "CREATE", doc))
            .map_err(|e| TestCaseError::fail(format!("refused as a bad request: {e}")))?;
        check_answer(&validated)?;
        prop_assert_eq!(validated.outcome, Outcome::Allowed);
    }
}

// ---------------------------------------------------------------------------
// (e) the AdmissionReview handling
// ---------------------------------------------------------------------------

fn any_webhook() -> impl Strategy<Value = Webhook> {
    prop_oneof![Just(Webhook::Validate), Just(Webhook::Mutate)]
}

fn any_operation() -> impl Strategy<Value = &'static str> {
    select(&["CREATE", "UPDATE", "DELETE", "CONNECT"][..])
}

/// Spec-shaped JSON: an arbitrary spec's JSON with one subtree replaced by arbitrary JSON.
fn spec_like_json() -> impl Strategy<Value = Value> {
    (arb_spec(), any::<Index>(), arb_json(), any::<bool>()).prop_map(|(spec, which, with, replace)| {
        let value = serde_json::to_value(&spec).expect("a spec serializes");
        if replace { replace_somewhere(value, which, with) } else { value }
    })
}

fn checked(result: Result<Answer, BadRequest>) -> Result<Option<Value>, TestCaseError> {
    match result {
        Ok(answer) => check_answer(&answer).map(Some),
        Err(_) => Ok(None),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn review_survives_arbitrary_bytes(webhook in any_webhook(), body in vec(any::<u8>(), 0..512)) {
        checked(admission::review(webhook, &body, &DEFAULTS))?;
    }

    #[test]
    fn review_survives_arbitrary_json_bodies(webhook in any_webhook(), body in arb_json()) {
        checked(review(webhook, &body))?;
    }

    /// Any spec, well-formed or not, in a well-formed review is answered, never refused as a bad request.
    #[test]
    fn review_answers_any_spec_and_echoes_the_uid(
        webhook in any_webhook(),
        uid in prop_oneof!["[ -~]{1,36}", ".{1,8}"],
        operation in any_operation(),
        name in "[a-z][a-z0-9-]{0,10}",
        spec in prop_oneof![arb_json(), spec_like_json()],
    ) {
        let object = json!({
            "apiVersion": "exposer.hliangzhao.io/v1beta1",
            "kind": "Balancer",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        });
        let answer = review(webhook, &envelope(&uid, operation, object.clone()))
            .map_err(|e| TestCaseError::fail(format!("refused as a bad request: {e}")))?;
        let wire = check_answer(&answer)?;
        prop_assert_eq!(wire.pointer("/response/uid"), Some(&json!(uid)));

        let writes = matches!(operation, "CREATE" | "UPDATE");
        match balancer::spec::parse_spec(&object) {
            _ if !writes => prop_assert_eq!(answer.outcome, Outcome::Allowed),
            Err(error) => {
                prop_assert_eq!(answer.outcome, Outcome::Denied);
                let message = &answer.review.response.as_ref().unwrap().result.message;
                prop_assert_eq!(message, &balancer::spec::denial_message(&name, &[error]));
            }
            Ok(parsed) => match webhook {
                Webhook::Validate => {
                    // The validating webhook judges the spec as it will be stored: defaulted.
                    let (expected, report_warnings) = match admit(ObjectName::Name(&name), parsed, &DEFAULTS) {
                        Ok(admitted) => (Outcome::Allowed, admitted.warnings().to_vec()),
                        Err(report) => (Outcome::Denied, report.warnings),
                    };
                    prop_assert_eq!(answer.outcome, expected);
                    let warnings = answer.review.response.as_ref().unwrap().warnings.clone().unwrap_or_default();
                    let listed = report_warnings.len().min(MAX_WARNINGS);
                    prop_assert_eq!(&warnings[..listed], &report_warnings[..listed]);
                    if report_warnings.len() > MAX_WARNINGS {
                        let more = format!("and {} more warnings", report_warnings.len() - MAX_WARNINGS);
                        prop_assert_eq!(warnings.last(), Some(&more));
                    }
                }
                Webhook::Mutate => {
                    let patch = defaults_patch(&parsed);
                    let expected = if patch.0.is_empty() { Outcome::Allowed } else { Outcome::Patched };
                    prop_assert_eq!(answer.outcome, expected);
                    prop_assert_eq!(wire_patch(&wire), patch);
                }
            },
        }
    }

    /// A well-formed review with any one part replaced by arbitrary JSON: answered or refused,
    /// never a panic or a server error, and an answer carries the uid the request had.
    #[test]
    fn review_survives_any_part_of_the_envelope_replaced(
        webhook in any_webhook(),
        operation in any_operation(),
        spec in arb_spec(),
        which in any::<Index>(),
        with in arb_json(),
    ) {
        let body = replace_somewhere(envelope("uid-x", operation, object("p", &spec)), which, with);
        if let Some(wire) = checked(review(webhook, &body))? {
            let uid = body.pointer("/request/uid").and_then(Value::as_str);
            prop_assert!(uid.is_some_and(|u| !u.is_empty()), "answered without a usable uid: {}", body);
            prop_assert_eq!(wire.pointer("/response/uid").and_then(Value::as_str), uid);
        }
    }
}

// ---------------------------------------------------------------------------
// Answers are bounded, whatever the input
// ---------------------------------------------------------------------------

/// Text of hostile length and content: long runs of one character (control, DEL, quote,
/// backslash, multi-byte) or long arbitrary strings.
fn hostile_text() -> BoxedStrategy<String> {
    let repeated = (select(vec!['\u{7f}', '\u{1}', '"', '\\', 'é', '🦀', 'a', '-']), 0usize..20_000)
        .prop_map(|(c, n)| std::iter::repeat_n(c, n).collect::<String>());
    prop_oneof![repeated, vec(any::<char>(), 0..2_000).prop_map(String::from_iter), arb_text()].boxed()
}

fn hostile_object() -> impl Strategy<Value = Value> {
    let backend = (hostile_text(), arb_number(), btree_map(hostile_text(), hostile_text(), 0..3))
        .prop_map(|(name, weight, selector)| json!({"name": name, "weight": weight, "selector": selector}));
    let port = (hostile_text(), hostile_text(), arb_number())
        .prop_map(|(name, target, port)| json!({"name": name, "port": port, "targetPort": target, "protocol": "TCP"}));
    (hostile_text(), vec(port, 0..34), vec(backend, 0..66), btree_map(hostile_text(), hostile_text(), 0..34)).prop_map(
        |(name, ports, backends, selector)| {
            json!({
                "apiVersion": "exposer.hliangzhao.io/v1beta1",
                "kind": "Balancer",
                "metadata": {"name": name},
                "spec": {"ports": ports, "backends": backends, "selector": selector},
            })
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Names, labels and values of any length and content, in any number up to past every
    /// list bound, under both webhooks: the answer never exceeds MAX_ANSWER_BYTES, and a
    /// body refused as a bad request gets a short reason.
    #[test]
    fn no_answer_exceeds_the_size_bound(
        webhook in any_webhook(),
        operation in any_operation(),
        uid in prop_oneof![Just("u".repeat(MAX_UID_BYTES)), "[ -~]{1,36}", hostile_text()],
        object in hostile_object(),
    ) {
        let body = envelope(&uid, operation, object);
        match review(webhook, &body) {
            Ok(answer) => {
                check_answer(&answer)?;
            }
            Err(bad) => prop_assert!(bad.to_string().len() <= 2 * 1024, "a {}-byte reason", bad.to_string().len()),
        }
    }
}

// ---------------------------------------------------------------------------
// Fixed cases the generators are unlikely to reach
// ---------------------------------------------------------------------------

#[test]
fn an_envelope_without_a_uid_is_a_bad_request() {
    for webhook in [Webhook::Validate, Webhook::Mutate] {
        let result = review(webhook, &envelope("", "CREATE", fixtures::minimal_json()));
        assert_eq!(result.err(), Some(BadRequest::MissingUid));
    }
}

#[test]
fn deeply_nested_specs_are_answered_or_refused_without_overflowing() {
    // serde_json stops at 128 levels; both sides of that limit must be handled.
    for depth in [100, 120, 123, 124, 125, 130, 1_000, 100_000] {
        let mut spec = "[".repeat(depth);
        spec.push_str(&"]".repeat(depth));
        let body = serde_json::to_string(&envelope("uid-deep", "CREATE", json!({"metadata": {"name": "deep"}})))
            .expect("serializes")
            .replace("\"metadata\":", &format!("\"spec\":{spec},\"metadata\":"));
        for webhook in [Webhook::Validate, Webhook::Mutate] {
            match admission::review(webhook, body.as_bytes(), &DEFAULTS) {
                Ok(answer) => {
                    assert_eq!(answer.outcome, Outcome::Denied, "depth {depth}");
                    let response = answer.review.response.as_ref().expect("a response");
                    assert_eq!(response.uid, "uid-deep");
                    assert!(answer.to_json().is_ok());
                }
                Err(BadRequest::Malformed(..)) => {}
                Err(other) => panic!("depth {depth}: unexpected {other:?}"),
            }
        }
    }
}

/// The CRD schema declares `spec`, every port and every backend as objects, but
/// serde's derived `Deserialize` also reads a struct from an array of its fields
/// in declaration order. So `parse_spec`, and with it both webhooks and
/// `balancer check`, accepts `spec: [[{name: http, port: 80}], {app: test}, [...]]`
/// as a valid Balancer, and the mutating webhook patches `/spec/ports/0/...`
/// paths that do not exist in such an object.
#[test]
fn specs_ports_and_backends_must_be_objects() {
    let spec_as_array = json!({"spec": [
        [{"name": "http", "port": 80}],
        {"app": "test"},
        [{"name": "v1", "selector": {"version": "v1"}}]
    ]});
    let port_as_array = json!({"spec": {
        "ports": [["http", "TCP", 80]],
        "selector": {"app": "test"},
        "backends": [{"name": "v1"}]
    }});
    let backend_as_array = json!({"spec": {
        "ports": [{"name": "http", "port": 80}],
        "selector": {"app": "test"},
        "backends": [["v1", 1, {"version": "v1"}]]
    }});
    for (data, field) in
        [(spec_as_array, "spec"), (port_as_array, "spec.ports[0]"), (backend_as_array, "spec.backends[0]")]
    {
        match balancer::spec::parse_spec(&data) {
            Ok(spec) => panic!("{data} was read as {spec:?}"),
            Err(error) => assert!(error.field.starts_with(field), "{field}: {error}"),
        }
    }
}

#[test]
fn unreadable_specs_are_denied_naming_the_field() {
    let mut missing = fixtures::minimal_json();
    missing.as_object_mut().unwrap().remove("spec");
    let mut mistyped = fixtures::minimal_json();
    mistyped["spec"]["ports"][0]["port"] = json!("80");
    for (object, message) in [
        (missing, "Balancer \"example-balancer\" is invalid: spec: is required"),
        (
            mistyped,
            "Balancer \"example-balancer\" is invalid: spec.ports[0].port: invalid type: string \"80\", expected i32",
        ),
    ] {
        for webhook in [Webhook::Validate, Webhook::Mutate] {
            let answer = review(webhook, &envelope("uid-bad", "CREATE", object.clone())).expect("answered");
            assert_eq!(answer.outcome, Outcome::Denied);
            let response = answer.review.response.as_ref().expect("a response");
            assert_eq!(response.uid, "uid-bad");
            assert_eq!(response.result.message, message);
            assert_eq!(response.result.code, 422);
        }
    }
}

#[test]
fn the_sample_is_patched_then_allowed() {
    let mutated = review(Webhook::Mutate, &envelope("uid-s", "CREATE", fixtures::minimal_json())).expect("answered");
    assert_eq!(mutated.outcome, Outcome::Patched);
    let wire: Value = serde_json::from_slice(&mutated.to_json().expect("encodes")).expect("JSON");
    let patch: Value = serde_json::to_value(wire_patch(&wire)).expect("serializes");
    assert_eq!(
        patch,
        json!([
            {"op": "add", "path": "/spec/algorithm", "value": "RoundRobin"},
            {"op": "add", "path": "/spec/backends/0/failTimeout", "value": "10s"},
            {"op": "add", "path": "/spec/backends/0/maxFails", "value": 1},
            {"op": "add", "path": "/spec/backends/0/weight", "value": 1},
            {"op": "add", "path": "/spec/ports/0/connectTimeout", "value": "5s"},
            {"op": "add", "path": "/spec/ports/0/idleTimeout", "value": "10m"},
            {"op": "add", "path": "/spec/ports/0/protocol", "value": "TCP"},
            {"op": "add", "path": "/spec/ports/0/targetPort", "value": 80},
            {"op": "add", "path": "/spec/replicas", "value": DEFAULTS.replicas},
            {"op": "add", "path": "/spec/service", "value": {"type": "ClusterIP"}},
            {"op": "add", "path": "/spec/sessionAffinity", "value": "None"}
        ])
    );
    let mut doc = fixtures::minimal_json();
    json_patch::patch(&mut doc, &wire_patch(&wire).0).expect("applies");
    let validated = review(Webhook::Validate, &envelope("uid-s", "CREATE", doc)).expect("answered");
    assert_eq!(validated.outcome, Outcome::Allowed);
    assert!(validated.review.response.as_ref().expect("a response").allowed);
}

// ---------------------------------------------------------------------------
// (f) conversion between the API versions
// ---------------------------------------------------------------------------

const V1ALPHA1: &str = "exposer.hliangzhao.io/v1alpha1";
const V1BETA1: &str = "exposer.hliangzhao.io/v1beta1";

fn convert_value(object: &Value, to: Version) -> Result<Value, TestCaseError> {
    let text = to_raw_value(object).expect("JSON encodes");
    let converted =
        convert(&text, to).map_err(|e| TestCaseError::fail(format!("{object} does not convert to {to:?}: {e}")))?;
    Ok(serde_json::from_str(converted.get()).expect("a conversion is JSON"))
}

/// Annotation keys, some near the preserved one; never the preserved one itself.
fn arb_annotation_key() -> BoxedStrategy<String> {
    prop_oneof![
        "[a-z]{1,8}",
        "[a-z]{1,6}\\.[a-z]{2,4}/[a-z-]{1,10}",
        Just("exposer.hliangzhao.io/v1beta1".to_string()),
        Just("exposer.hliangzhao.io/v1beta1-field".to_string()),
        Just("kubectl.kubernetes.io/last-applied-configuration".to_string()),
    ]
    .prop_filter("not the preserved annotation", |k| k != PRESERVED_ANNOTATION)
    .boxed()
}

/// No annotations, or some (the API server never stores an empty map: Go omits it).
fn arb_annotations() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    option::of(btree_map(arb_annotation_key(), prop_oneof![arb_text(), "\\{\"spec\":\\{\\}\\}"], 1..4))
}

/// Metadata as the API server stores it, annotations from `annotations`.
fn arb_metadata(annotations: impl Strategy<Value = Option<BTreeMap<String, String>>>) -> impl Strategy<Value = Value> {
    (
        "[a-z]([a-z0-9-]{0,12}[a-z0-9])?",
        option::of("[a-z]{1,8}"),
        option::of(any::<u32>()),
        option::of(1i64..1000),
        option::of(arb_labels(3)),
        annotations,
    )
        .prop_map(|(name, namespace, resource_version, generation, labels, annotations)| {
            let mut metadata = json!({"name": name, "uid": "4b1e6f0c-8f44-4a8f-9d1c-2f4f3f8f0c11"});
            if let Some(namespace) = namespace {
                metadata["namespace"] = json!(namespace);
            }
            if let Some(version) = resource_version {
                metadata["resourceVersion"] = json!(version.to_string());
            }
            if let Some(generation) = generation {
                metadata["generation"] = json!(generation);
            }
            if let Some(labels) = labels.filter(|l| !l.is_empty()) {
                metadata["labels"] = json!(labels);
            }
            if let Some(annotations) = annotations {
                metadata["annotations"] = json!(annotations);
            }
            metadata
        })
}

fn arb_conditions() -> impl Strategy<Value = Vec<Value>> {
    let condition = (
        select(&["Ready", "Progressing"][..]),
        select(&["True", "False", "Unknown"][..]),
        "[A-Z][a-zA-Z]{0,12}",
        arb_text(),
        option::of(0i64..100),
    )
        .prop_map(|(type_, status, reason, message, generation)| {
            let mut condition = json!({"type": type_, "status": status, "reason": reason, "message": message,
                                       "lastTransitionTime": "2026-11-22T10:00:00Z"});
            if let Some(generation) = generation {
                condition["observedGeneration"] = json!(generation);
            }
            condition
        });
    vec(condition, 0..3)
}

/// A v1alpha1 spec: the shared fields only (the API server prunes any other), each typed or
/// any JSON (a stored spec is converted whether or not it is readable), or no spec at all.
fn arb_v1alpha1_spec() -> impl Strategy<Value = Option<Value>> {
    let typed = arb_spec().prop_map(|spec| {
        let mut value = serde_json::to_value(spec).expect("a spec encodes");
        // v1beta1's own fields: the v1alpha1 schema prunes them.
        value.as_object_mut().unwrap().retain(|k, _| ["ports", "selector", "backends"].contains(&k.as_str()));
        value
    });
    let loose = btree_map(select(&["ports", "selector", "backends"][..]), arb_json(), 0..4)
        .prop_map(|fields| Value::Object(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect()));
    option::of(prop_oneof![3 => typed, 1 => loose].prop_map(pruned_as_v1alpha1))
}

/// What the API server keeps of a spec under the v1alpha1 schema: list items hold only
/// v1alpha1's fields (anything else, such as v1beta1's timeouts, is pruned).
fn pruned_as_v1alpha1(mut spec: Value) -> Value {
    for (list, keep) in
        [("ports", &["name", "protocol", "port", "targetPort"][..]), ("backends", &["name", "weight", "selector"][..])]
    {
        if let Some(Value::Array(items)) = spec.get_mut(list) {
            for item in items.iter_mut().filter_map(Value::as_object_mut) {
                item.retain(|k, _| keep.contains(&k.as_str()));
            }
        }
    }
    spec
}

fn arb_v1alpha1_status() -> impl Strategy<Value = Option<Value>> {
    option::of((any::<i32>(), any::<i32>(), option::of(0i64..1000), arb_conditions()).prop_map(
        |(active, obsolete, generation, conditions)| {
            let mut status = json!({"activeBackendsNum": active, "obsoleteBackendsNum": obsolete});
            if let Some(generation) = generation {
                status["observedGeneration"] = json!(generation);
            }
            if !conditions.is_empty() {
                status["conditions"] = json!(conditions);
            }
            status
        },
    ))
}

fn arb_v1alpha1_object() -> impl Strategy<Value = Value> {
    (arb_metadata(arb_annotations()), arb_v1alpha1_spec(), arb_v1alpha1_status()).prop_map(
        |(metadata, spec, status)| {
            let mut object = json!({"apiVersion": V1ALPHA1, "kind": "Balancer", "metadata": metadata});
            if let Some(spec) = spec {
                object["spec"] = spec;
            }
            if let Some(status) = status {
                object["status"] = status;
            }
            object
        },
    )
}

/// A v1beta1 status as the controller writes it, or with only some of its fields (the
/// API server defaults the counts, but a status written by someone else may lack any).
fn arb_v1beta1_status() -> impl Strategy<Value = Option<Value>> {
    let full = (
        any::<i32>(),
        any::<i32>(),
        option::of("[a-z./=,-]{1,40}"),
        any::<i32>(),
        any::<i32>(),
        option::of(0i64..1000),
        arb_conditions(),
    )
        .prop_map(|(replicas, ready, selector, active, obsolete, generation, conditions)| {
            serde_json::to_value(BalancerStatus {
                replicas,
                ready_replicas: ready,
                selector,
                addresses: vec![BalancerAddress {
                    type_: "IPAddress".into(),
                    value: format!("10.0.0.{}", active & 0xff),
                }],
                node_ports: vec![NodePortStatus {
                    port: 80,
                    protocol: "TCP".into(),
                    node_port: 30000 + (obsolete & 0xfff),
                }],
                active_backends: active,
                obsolete_backends: obsolete,
                backends: vec![BackendStatus {
                    name: "v1".into(),
                    weight: active & 0xff,
                    ready_endpoints: ready & 0xff,
                    share: 100,
                }],
                backends_ready: Some("1/1".into()),
                configured_replicas: Some(ready & 0xff),
                observed_generation: generation,
                conditions: serde_json::from_value(json!(conditions)).expect("conditions"),
            })
            .expect("a status encodes")
        });
    let partial = btree_map(
        select(
            &["replicas", "readyReplicas", "selector", "activeBackends", "obsoleteBackends", "observedGeneration"][..],
        ),
        arb_json(),
        0..4,
    )
    .prop_map(|fields| Value::Object(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect()));
    option::of(prop_oneof![3 => full, 1 => partial])
}

fn arb_v1beta1_object() -> impl Strategy<Value = Value> {
    (arb_metadata(arb_annotations()), arb_spec(), arb_v1beta1_status()).prop_map(|(metadata, mut spec, status)| {
        // Ports and backends are list-maps in v1beta1: the API server keeps their keys unique.
        let mut seen = std::collections::BTreeSet::new();
        spec.ports.retain(|p| seen.insert((p.port, p.protocol.clone().unwrap_or_else(|| "TCP".into()))));
        let mut names = std::collections::BTreeSet::new();
        spec.backends.retain(|b| names.insert(b.name.clone()));
        let mut object = json!({"apiVersion": V1BETA1, "kind": "Balancer", "metadata": metadata});
        object["spec"] = serde_json::to_value(spec).expect("a spec encodes");
        if let Some(status) = status {
            object["status"] = status;
        }
        object
    })
}

/// The fields v1beta1 has and v1alpha1 does not, present in `beta`: (spec's, status's).
fn beta_only(beta: &Value) -> (Vec<String>, Vec<String>) {
    let keys = |v: &Value, shared: &[&str]| -> Vec<String> {
        v.as_object().map(|m| m.keys().filter(|k| !shared.contains(&k.as_str())).cloned().collect()).unwrap_or_default()
    };
    let spec = keys(&beta["spec"], &["ports", "selector", "backends"]);
    let status = keys(&beta["status"], &["activeBackends", "obsoleteBackends", "observedGeneration", "conditions"]);
    (spec, status)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// v1alpha1 → v1beta1 → v1alpha1 is the identity: a Go-era object read as the storage
    /// version and written back is unchanged.
    #[test]
    fn v1alpha1_to_v1beta1_and_back_is_the_identity(alpha in arb_v1alpha1_object()) {
        let beta = convert_value(&alpha, Version::V1beta1)?;
        prop_assert_eq!(&beta["apiVersion"], V1BETA1);
        prop_assert_eq!(&beta["metadata"], &alpha["metadata"], "nothing to restore, nothing changed");
        prop_assert_eq!(beta.get("spec"), alpha.get("spec"));
        if let Some(status) = alpha.get("status") {
            prop_assert_eq!(&beta["status"]["activeBackends"], &status["activeBackendsNum"]);
            prop_assert_eq!(&beta["status"]["obsoleteBackends"], &status["obsoleteBackendsNum"]);
            prop_assert!(beta["status"].get("activeBackendsNum").is_none());
        }
        let back = convert_value(&beta, Version::V1alpha1)?;
        prop_assert_eq!(&back, &alpha);
    }

    /// v1beta1 → v1alpha1 → v1beta1 is the identity for everything but the derived status fields
    /// v1alpha1 lacks (the controller writes them again; a v1alpha1 client must not set them):
    /// the spec fields v1alpha1 cannot say ride in the annotation.
    #[test]
    fn v1beta1_to_v1alpha1_and_back_is_the_identity(beta in arb_v1beta1_object()) {
        let alpha = convert_value(&beta, Version::V1alpha1)?;
        prop_assert_eq!(&alpha["apiVersion"], V1ALPHA1);
        // Nothing v1alpha1 does not know is left in its spec or status.
        let (spec_only, status_only) = beta_only(&beta);
        for field in &spec_only {
            prop_assert!(alpha["spec"].get(field.as_str()).is_none(), "spec.{} leaked into v1alpha1: {}", field, alpha);
        }
        for field in &status_only {
            prop_assert!(alpha["status"].get(field.as_str()).is_none(), "status.{} leaked into v1alpha1: {}", field, alpha);
        }
        // Nor in its list items: v1beta1's per-port and per-backend fields ride in the annotation too.
        let item_only = |object: &Value| -> usize {
            let count = |list: &str, fields: &[&str]| {
                object["spec"][list].as_array().map_or(0, |items| {
                    items.iter().map(|item| fields.iter().filter(|f| item.get(**f).is_some()).count()).sum()
                })
            };
            count("ports", &["connectTimeout", "idleTimeout", "nodePort", "proxyProtocol", "acceptProxyProtocol"])
                + count("backends", &["maxFails", "failTimeout", "maxConnections", "backup"])
        };
        prop_assert_eq!(item_only(&alpha), 0, "item fields leaked into v1alpha1: {}", alpha);
        let annotation = alpha["metadata"]["annotations"].get(PRESERVED_ANNOTATION);
        let moved = !spec_only.is_empty() || item_only(&beta) > 0;
        prop_assert_eq!(annotation.is_some(), moved, "{}", alpha);
        let back = convert_value(&alpha, Version::V1beta1)?;
        prop_assert_eq!(&back, &without_derived_status(&beta));
    }

    /// A v1alpha1 object that carries the annotation (it was converted from v1beta1) also
    /// round-trips, and a read-modify-write through v1alpha1 keeps the v1beta1-only fields.
    #[test]
    fn an_annotated_v1alpha1_object_round_trips_and_keeps_the_v1beta1_fields(
        beta in arb_v1beta1_object(),
        other in arb_v1alpha1_spec(),
    ) {
        let alpha = convert_value(&beta, Version::V1alpha1)?;
        let again = convert_value(&convert_value(&alpha, Version::V1beta1)?, Version::V1alpha1)?;
        prop_assert_eq!(&again, &alpha);

        // A v1alpha1 client replaces the shared spec fields (kubectl apply of a Go-era manifest).
        let mut edited = alpha;
        match other {
            Some(spec) => edited["spec"] = spec,
            None => { edited.as_object_mut().unwrap().remove("spec"); }
        }
        let read = convert_value(&edited, Version::V1beta1)?;
        prop_assert_eq!(read["spec"].get("replicas"), beta["spec"].get("replicas"));
        prop_assert_eq!(read["spec"].get("sessionAffinity"), beta["spec"].get("sessionAffinity"));
        prop_assert_eq!(read["spec"].get("service"), beta["spec"].get("service"));
        for field in DERIVED_STATUS {
            prop_assert!(read["status"].get(field).is_none(), "status.{} came back from v1alpha1", field);
        }
        prop_assert_eq!(&read["metadata"], &beta["metadata"]);
    }
}

/// `beta` without the status fields only v1beta1 has, and without a status they leave empty.
/// The status fields only v1beta1 has, which the controller derives and writes again.
const DERIVED_STATUS: [&str; 8] = [
    "replicas",
    "readyReplicas",
    "selector",
    "addresses",
    "nodePorts",
    "backends",
    "backendsReady",
    "configuredReplicas",
];

fn without_derived_status(beta: &Value) -> Value {
    let mut beta = beta.clone();
    if let Some(status) = beta.get_mut("status").and_then(Value::as_object_mut) {
        let had = status.len();
        status.retain(|k, _| !DERIVED_STATUS.contains(&k.as_str()));
        if status.is_empty() && had > 0 {
            beta.as_object_mut().unwrap().remove("status");
        }
    }
    beta
}

// The ConversionReview handling: never a panic, and every answer carries the uid.

/// Checks what `conversion_review` made of `body`: a BadRequest, or an answer that is a
/// ConversionReview with the request's uid, `Success` with one object per object (each at the
/// desired version), or `Failure` with a message and no objects.
fn check_conversion(body: &[u8]) -> Result<Option<Value>, TestCaseError> {
    let Ok(converted) = conversion_review(body) else { return Ok(None) };
    let answer: Value = serde_json::from_slice(&converted.body)
        .map_err(|e| TestCaseError::fail(format!("the answer is not JSON: {e}")))?;
    prop_assert_eq!(&answer["apiVersion"], "apiextensions.k8s.io/v1");
    prop_assert_eq!(&answer["kind"], "ConversionReview");
    let request: Value = serde_json::from_slice(body).expect("an answered body is JSON");
    prop_assert_eq!(&answer["response"]["uid"], &request["request"]["uid"]);
    let status = answer["response"]["result"]["status"].as_str();
    prop_assert_eq!(converted.success, status == Some("Success"), "{}", answer);
    match status {
        Some("Success") => {
            let objects = request["request"]["objects"].as_array().expect("converted objects came from a list");
            let out = answer["response"].get("convertedObjects").and_then(Value::as_array).cloned().unwrap_or_default();
            prop_assert_eq!(out.len(), objects.len());
            for (from, to) in objects.iter().zip(&out) {
                prop_assert_eq!(&to["apiVersion"], &request["request"]["desiredAPIVersion"]);
                prop_assert_eq!(&to["kind"], &from["kind"]);
                prop_assert_eq!(to["metadata"].get("name"), from["metadata"].get("name"));
            }
        }
        Some("Failure") => {
            prop_assert!(answer["response"]["result"]["message"].as_str().is_some_and(|m| !m.is_empty()));
            prop_assert!(answer["response"].get("convertedObjects").is_none());
        }
        other => prop_assert!(false, "result.status {:?}", other),
    }
    Ok(Some(answer))
}

fn any_desired_version() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(V1ALPHA1.to_string()),
        Just(V1BETA1.to_string()),
        Just("exposer.hliangzhao.io/v2".to_string()),
        Just("v1".to_string()),
        ".{0,12}",
    ]
}

fn any_object() -> impl Strategy<Value = Value> {
    prop_oneof![
        2 => arb_v1alpha1_object(),
        2 => arb_v1beta1_object(),
        1 => arb_json(),
        1 => (prop_oneof![Just(V1ALPHA1), Just(V1BETA1)], arb_json()).prop_map(|(version, spec)| {
            json!({"apiVersion": version, "kind": "Balancer", "metadata": {"name": "x"}, "spec": spec})
        }),
        1 => (prop_oneof![Just(V1ALPHA1), Just(V1BETA1)], btree_map(arb_key(), arb_json(), 0..5)).prop_map(
            |(version, fields)| {
                let mut object: serde_json::Map<String, Value> = fields.into_iter().collect();
                object.insert("apiVersion".into(), json!(version));
                Value::Object(object)
            }
        ),
    ]
}

fn conversion_envelope(uid: &str, desired: &str, objects: Vec<Value>) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": uid, "desiredAPIVersion": desired, "objects": objects}
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn conversion_review_survives_arbitrary_bytes(body in vec(any::<u8>(), 0..512)) {
        check_conversion(&body)?;
    }

    #[test]
    fn conversion_review_survives_arbitrary_json(body in arb_json()) {
        check_conversion(&serde_json::to_vec(&body).expect("encodes"))?;
    }

    /// A well-formed review of any objects, to any version, is always answered (never a
    /// bad request), with the uid.
    #[test]
    fn conversion_review_answers_any_objects(
        uid in prop_oneof!["[ -~]{1,36}", ".{1,8}"],
        desired in any_desired_version(),
        objects in vec(any_object(), 0..4),
    ) {
        let body = serde_json::to_vec(&conversion_envelope(&uid, &desired, objects)).expect("encodes");
        let answer = check_conversion(&body)?;
        prop_assert!(answer.is_some(), "a well-formed review was refused as a bad request");
    }

    /// Any part of a well-formed review replaced by arbitrary JSON: answered or refused, never a panic.
    #[test]
    fn conversion_review_survives_any_part_replaced(
        desired in any_desired_version(),
        objects in vec(any_object(), 0..3),
        which in any::<Index>(),
        with in arb_json(),
    ) {
        let body = replace_somewhere(conversion_envelope("uid-c", &desired, objects), which, with);
        check_conversion(&serde_json::to_vec(&body).expect("encodes"))?;
    }
}

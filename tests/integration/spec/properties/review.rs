//! `admission::review` never panics and never fails server-side, whatever the body, echoes the
//! request's uid whenever it answers, and bounds its answer; with fixed cases the generators are
//! unlikely to reach.

use balancer::api::{Balancer, BalancerSpec};
use balancer::spec::{ObjectName, Report};
use balancer::webhook::admission::{self, Answer, Outcome, Webhook};
use balancer::webhook::review::{BadRequest, MAX_ANSWER_BYTES};
use base64::Engine as _;
use json_patch::{Patch, PatchOperation};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use serde_json::{Value, json};

use super::strategies::{DEFAULTS, arb_json, arb_number, arb_spec, arb_text, replace_somewhere};
use crate::support::fixtures;

pub(super) fn object(name: &str, spec: &BalancerSpec) -> Value {
    serde_json::to_value(Balancer::new(name, spec.clone())).expect("a Balancer serializes")
}

pub(super) fn envelope(uid: &str, operation: &str, object: Value) -> Value {
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

pub(super) fn review(webhook: Webhook, body: &Value) -> Result<Answer, BadRequest> {
    admission::review(webhook, &serde_json::to_vec(body).expect("JSON serializes"), &DEFAULTS)
}

/// Checks an answer the way the server would send it: it encodes (else the
/// server answers 500), its status is not a server error, and its outcome
/// agrees with the response it carries. Returns the wire form.
pub(super) fn check_answer(answer: &Answer) -> Result<Value, TestCaseError> {
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
pub(super) fn wire_patch(wire: &Value) -> Patch {
    match wire.pointer("/response/patch").and_then(Value::as_str) {
        None => Patch(vec![]),
        Some(encoded) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).expect("base64");
            serde_json::from_slice(&bytes).expect("a JSON Patch")
        }
    }
}

pub(super) fn spec_of(doc: &Value) -> BalancerSpec {
    serde_json::from_value(doc["spec"].clone()).expect("the spec still parses")
}

pub(super) fn validate_as(meta: &(Option<String>, Option<String>), spec: &BalancerSpec) -> Report {
    balancer::spec::validate(ObjectName::from_meta(meta.0.as_deref(), meta.1.as_deref()), spec, &DEFAULTS)
}

pub(super) fn any_webhook() -> impl Strategy<Value = Webhook> {
    prop_oneof![Just(Webhook::Validate), Just(Webhook::Mutate)]
}

pub(super) fn any_operation() -> impl Strategy<Value = &'static str> {
    select(&["CREATE", "UPDATE", "DELETE", "CONNECT"][..])
}

/// Spec-shaped JSON: an arbitrary spec's JSON with one subtree replaced by arbitrary JSON.
pub(super) fn spec_like_json() -> impl Strategy<Value = Value> {
    (arb_spec(), any::<Index>(), arb_json(), any::<bool>()).prop_map(|(spec, which, with, replace)| {
        let value = serde_json::to_value(&spec).expect("a spec serializes");
        if replace { replace_somewhere(value, which, with) } else { value }
    })
}

pub(super) fn checked(result: Result<Answer, BadRequest>) -> Result<Option<Value>, TestCaseError> {
    match result {
        Ok(answer) => check_answer(&answer).map(Some),
        Err(_) => Ok(None),
    }
}

/// Text of hostile length and content: long runs of one character (control, DEL, quote,
/// backslash, multi-byte) or long arbitrary strings.
pub(super) fn hostile_text() -> BoxedStrategy<String> {
    let repeated = (select(vec!['\u{7f}', '\u{1}', '"', '\\', 'é', '🦀', 'a', '-']), 0usize..20_000)
        .prop_map(|(c, n)| std::iter::repeat_n(c, n).collect::<String>());
    prop_oneof![repeated, vec(any::<char>(), 0..2_000).prop_map(String::from_iter), arb_text()].boxed()
}

pub(super) fn hostile_object() -> impl Strategy<Value = Value> {
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

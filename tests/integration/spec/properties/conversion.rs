//! v1alpha1 → v1beta1 → v1alpha1 and v1beta1 → v1alpha1 → v1beta1 are the identity (the
//! v1beta1-only fields ride in an annotation), and `conversion_review` never panics and answers
//! every usable review with its uid.

use std::collections::BTreeMap;

use balancer::api::conversion::{PRESERVED_ANNOTATION, Version, convert};
use balancer::api::v1beta1::{BalancerAddress, NodePortStatus};
use balancer::api::{BackendStatus, BalancerStatus};
use balancer::webhook::conversion::conversion_review;
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::value::to_raw_value;
use serde_json::{Value, json};

use super::strategies::{arb_json, arb_key, arb_labels, arb_spec, arb_text};

pub(super) const V1ALPHA1: &str = "exposer.hliangzhao.io/v1alpha1";

pub(super) const V1BETA1: &str = "exposer.hliangzhao.io/v1beta1";

pub(super) fn convert_value(object: &Value, to: Version) -> Result<Value, TestCaseError> {
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
pub(super) fn arb_v1alpha1_spec() -> impl Strategy<Value = Option<Value>> {
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

pub(super) fn arb_v1alpha1_object() -> impl Strategy<Value = Value> {
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
                canary: None,
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

pub(super) fn arb_v1beta1_object() -> impl Strategy<Value = Value> {
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
pub(super) fn beta_only(beta: &Value) -> (Vec<String>, Vec<String>) {
    let keys = |v: &Value, shared: &[&str]| -> Vec<String> {
        v.as_object().map(|m| m.keys().filter(|k| !shared.contains(&k.as_str())).cloned().collect()).unwrap_or_default()
    };
    let spec = keys(&beta["spec"], &["ports", "selector", "backends"]);
    let status = keys(&beta["status"], &["activeBackends", "obsoleteBackends", "observedGeneration", "conditions"]);
    (spec, status)
}

/// `beta` without the status fields only v1beta1 has, and without a status they leave empty.
/// The status fields only v1beta1 has, which the controller derives and writes again.
pub(super) const DERIVED_STATUS: [&str; 8] = [
    "replicas",
    "readyReplicas",
    "selector",
    "addresses",
    "nodePorts",
    "backends",
    "backendsReady",
    "configuredReplicas",
];

pub(super) fn without_derived_status(beta: &Value) -> Value {
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
pub(super) fn check_conversion(body: &[u8]) -> Result<Option<Value>, TestCaseError> {
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

pub(super) fn any_desired_version() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(V1ALPHA1.to_string()),
        Just(V1BETA1.to_string()),
        Just("exposer.hliangzhao.io/v2".to_string()),
        Just("v1".to_string()),
        ".{0,12}",
    ]
}

pub(super) fn any_object() -> impl Strategy<Value = Value> {
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

pub(super) fn conversion_envelope(uid: &str, desired: &str, objects: Vec<Value>) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": uid, "desiredAPIVersion": desired, "objects": objects}
    })
}

//! Cost of answering one AdmissionReview, end to end (parse, rules, encode),
//! next to a baseline measured in the same run: parsing the same body into a
//! `serde_json::Value`. Compare the ratio, not the absolute numbers.

use std::hint::black_box;

use balancer::spec::parse_spec;
use balancer::spec::{ObjectName, validate};
use balancer::spec::{SpecPolicy, defaults_patch};
use balancer::webhook::admission::{Answer, Outcome, Webhook};
use balancer::webhook::conversion::conversion_review;
use balancer::webhook::review::BadRequest;
use criterion::{Criterion, criterion_main};
use serde_json::{Value, json};

/// What the server defaults with (`--proxy-replicas` 1).
const DEFAULTS: SpecPolicy = SpecPolicy::DEFAULT;

fn review(webhook: Webhook, body: &[u8]) -> Result<Answer, BadRequest> {
    balancer::webhook::admission::review(webhook, body, &DEFAULTS)
}

fn sample_review(defaulted: bool) -> Vec<u8> {
    let port = if defaulted {
        json!({"name": "http", "protocol": "TCP", "port": 80, "targetPort": 5678,
               "connectTimeout": "5s", "idleTimeout": "10m"})
    } else {
        json!({"name": "http", "port": 80})
    };
    let mut spec = json!({
        "ports": [port],
        "selector": {"app": "test"},
        "backends": [
            {"name": "v1", "weight": 40, "selector": {"version": "v1"}},
            {"name": "v2", "weight": 20, "selector": {"version": "v2"}},
            {"name": "v3", "weight": 40, "selector": {"version": "v3"}}
        ]
    });
    if defaulted {
        spec["replicas"] = json!(DEFAULTS.replicas);
        spec["sessionAffinity"] = json!("None");
        for backend in spec["backends"].as_array_mut().unwrap() {
            backend["maxFails"] = json!(1);
            backend["failTimeout"] = json!("10s");
        }
    }
    review_of(spec)
}

/// The largest Balancer the rules accept: 32 ports, 64 backends, 32 labels in every merged selector.
fn largest_valid_review() -> Vec<u8> {
    let ports: Vec<Value> = (0..32)
        .map(|i| json!({"name": format!("port-{i}"), "protocol": "TCP", "port": 1000 + i, "targetPort": 2000 + i}))
        .collect();
    let common: serde_json::Map<String, Value> =
        (0..16).map(|i| (format!("example.com/common-{i}"), json!(format!("value-{i}")))).collect();
    let backends: Vec<Value> = (0..64)
        .map(|b| {
            let own: serde_json::Map<String, Value> =
                (0..16).map(|i| (format!("example.com/own-{i}"), json!(format!("backend-{b}-{i}")))).collect();
            json!({"name": format!("backend-{b}"), "weight": 1 + b % 100, "selector": own})
        })
        .collect();
    review_of(json!({"replicas": 1, "ports": ports, "selector": common, "backends": backends}))
}

fn review_of(spec: Value) -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "exposer.hliangzhao.io", "version": "v1beta1", "kind": "Balancer"},
            "resource": {"group": "exposer.hliangzhao.io", "version": "v1beta1", "resource": "balancers"},
            "name": "example-balancer",
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": {
                "apiVersion": "exposer.hliangzhao.io/v1beta1",
                "kind": "Balancer",
                "metadata": {"name": "example-balancer", "namespace": "default"},
                "spec": spec
            },
            "dryRun": false
        }
    })
    .to_string()
    .into_bytes()
}

fn bench(c: &mut Criterion) {
    let defaulted = sample_review(true);
    let undefaulted = sample_review(false);
    let object: Value = serde_json::from_slice::<Value>(&defaulted).unwrap()["request"]["object"].clone();
    let spec = parse_spec(&object).unwrap();

    let unpatched = review(Webhook::Mutate, &defaulted).unwrap();
    assert_eq!(unpatched.outcome, Outcome::Allowed, "the defaulted sample needs no patch");
    assert_eq!(review(Webhook::Mutate, &undefaulted).unwrap().outcome, Outcome::Patched);

    let mut group = c.benchmark_group("admission");
    group.bench_function("baseline: parse body as serde_json::Value", |b| {
        b.iter(|| serde_json::from_slice::<Value>(black_box(&defaulted)).unwrap())
    });
    group.bench_function("validate review (sample, allowed)", |b| {
        b.iter(|| review(Webhook::Validate, black_box(&defaulted)).unwrap().to_json().unwrap())
    });
    group.bench_function("mutate review (no patch)", |b| {
        b.iter(|| review(Webhook::Mutate, black_box(&defaulted)).unwrap().to_json().unwrap())
    });
    group.bench_function("mutate review (patched)", |b| {
        b.iter(|| review(Webhook::Mutate, black_box(&undefaulted)).unwrap().to_json().unwrap())
    });
    let largest = largest_valid_review();
    let answer = review(Webhook::Validate, &largest).unwrap();
    assert!(answer.review.response.as_ref().is_some_and(|r| r.allowed), "the largest review is valid");
    group.bench_function("validate review (largest valid Balancer)", |b| {
        b.iter(|| review(Webhook::Validate, black_box(&largest)).unwrap().to_json().unwrap())
    });
    group.bench_function("baseline: parse the largest body as serde_json::Value", |b| {
        b.iter(|| serde_json::from_slice::<Value>(black_box(&largest)).unwrap())
    });
    group.bench_function("rules only: validation::validate", |b| {
        b.iter(|| validate(ObjectName::Name("example-balancer"), black_box(&spec), &DEFAULTS))
    });
    group.bench_function("rules only: defaults_patch", |b| b.iter(|| defaults_patch(black_box(&spec), &DEFAULTS)));
    group.finish();

    // Conversion: a list page of 500 Balancers, as the API server sends one to /convert.
    let mut group = c.benchmark_group("conversion");
    for (from, to) in [("v1alpha1", "v1beta1"), ("v1beta1", "v1alpha1")] {
        let page = conversion_page(&object, from, to, 500);
        let converted = conversion_review(&page).unwrap();
        assert!(converted.success, "the page converts");
        group.bench_function(format!("baseline: parse a 500-object page as serde_json::Value ({from})"), |b| {
            b.iter(|| serde_json::from_slice::<Value>(black_box(&page)).unwrap())
        });
        group.bench_function(format!("convert a 500-object page {from} -> {to}"), |b| {
            b.iter(|| conversion_review(black_box(&page)).unwrap())
        });
    }
    group.finish();
}

/// A ConversionReview of `n` copies of `object` at `from` (with `spec.replicas` and a v1beta1
/// status when `from` is v1beta1, so the annotation is written), asking for `to`.
fn conversion_page(object: &Value, from: &str, to: &str, n: usize) -> Vec<u8> {
    let mut object = object.clone();
    object["apiVersion"] = json!(format!("exposer.hliangzhao.io/{from}"));
    if from == "v1beta1" {
        object["spec"]["replicas"] = json!(2);
        object["status"] = json!({"replicas": 2, "readyReplicas": 2, "activeBackends": 3, "obsoleteBackends": 0,
            "selector": "app.kubernetes.io/component=proxy,balancer.exposer.hliangzhao.io/balancer-name=example-balancer"});
    } else {
        object["status"] = json!({"activeBackendsNum": 3, "obsoleteBackendsNum": 0});
    }
    let objects: Vec<Value> = (0..n)
        .map(|i| {
            let mut o = object.clone();
            o["metadata"]["name"] = json!(format!("balancer-{i}"));
            o
        })
        .collect();
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                    "desiredAPIVersion": format!("exposer.hliangzhao.io/{to}"), "objects": objects}})
    .to_string()
    .into_bytes()
}

/// The group criterion runs: its macro writes a public function without docs.
mod group {
    #![allow(missing_docs, reason = "criterion_group! writes the function")]
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);

//! `POST /convert`: ConversionReview v1, v1alpha1 ↔ v1beta1, over the real server.

use serde_json::{Value, json};

use super::server::sample_balancer;
use crate::support;
use crate::support::fixtures::sample_v1alpha1 as sample_balancer_v1alpha1;
use crate::support::{TestServer, UID, conversion_review};

const V1ALPHA1: &str = "exposer.hliangzhao.io/v1alpha1";
const V1BETA1: &str = "exposer.hliangzhao.io/v1beta1";
const PRESERVED: &str = balancer::api::conversion::PRESERVED_ANNOTATION;

/// Posts a ConversionReview and checks the envelope of a usable answer: 200, JSON, the
/// request's uid. Returns `response`.
async fn convert(server: &TestServer, desired: &str, objects: Vec<Value>) -> Value {
    let response =
        server.client().post(server.url("/convert")).json(&conversion_review(desired, objects)).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    let body: Value = response.json().await.expect("JSON body");
    assert_eq!(body["apiVersion"], "apiextensions.k8s.io/v1", "{body}");
    assert_eq!(body["kind"], "ConversionReview", "{body}");
    assert_eq!(body["response"]["uid"], UID, "{body}");
    body["response"].clone()
}

/// Converts and expects success; returns the converted objects.
async fn converted(server: &TestServer, desired: &str, objects: Vec<Value>) -> Vec<Value> {
    let count = objects.len();
    let response = convert(server, desired, objects).await;
    assert_eq!(response["result"]["status"], "Success", "{response}");
    let objects = response["convertedObjects"].as_array().expect("convertedObjects").clone();
    assert_eq!(objects.len(), count, "one converted object per object, in order");
    objects
}

/// The Go project's sample as the API server stores it: uid, resourceVersion, and a status.
fn stored_v1alpha1() -> Value {
    let mut alpha = sample_balancer_v1alpha1();
    alpha["metadata"]["uid"] = json!("0b4c2e4a-1b6f-4f0e-9a43-5b3d3c9b8a11");
    alpha["metadata"]["resourceVersion"] = json!("4242");
    alpha["metadata"]["generation"] = json!(2);
    alpha["metadata"]["labels"] = json!({"team": "edge"});
    alpha["status"] = json!({"activeBackendsNum": 3, "obsoleteBackendsNum": 1, "observedGeneration": 2});
    alpha
}

#[tokio::test]
async fn convert_reads_the_go_sample_as_v1beta1_and_back_losslessly() {
    let server = TestServer::start().await;
    let alpha = stored_v1alpha1();

    // v1alpha1 -> v1beta1: the same object, the status counts renamed.
    let beta = converted(&server, V1BETA1, vec![alpha.clone()]).await.remove(0);
    let mut expected = alpha.clone();
    expected["apiVersion"] = json!(V1BETA1);
    expected["status"] = json!({"activeBackends": 3, "obsoleteBackends": 1, "observedGeneration": 2});
    assert_eq!(beta, expected);
    // ... and back: exactly the original.
    assert_eq!(converted(&server, V1ALPHA1, vec![beta.clone()]).await.remove(0), alpha);

    // What only v1beta1's spec can say (scaled to 3) rides to v1alpha1 in an annotation and
    // comes back from it; the scale subresource's status is the controller's to write again.
    let mut scaled = beta;
    scaled["spec"]["replicas"] = json!(3);
    scaled["status"]["replicas"] = json!(3);
    scaled["status"]["readyReplicas"] = json!(2);
    scaled["status"]["selector"] =
        json!("app.kubernetes.io/component=proxy,balancer.exposer.hliangzhao.io/balancer-name=example-balancer");
    let as_alpha = converted(&server, V1ALPHA1, vec![scaled.clone()]).await.remove(0);
    assert_eq!(as_alpha["apiVersion"], V1ALPHA1);
    assert_eq!(as_alpha["spec"], alpha["spec"], "no v1beta1 field in the v1alpha1 spec");
    assert_eq!(as_alpha["status"], alpha["status"]);
    assert_eq!(as_alpha["metadata"]["labels"], alpha["metadata"]["labels"]);
    let annotation = as_alpha["metadata"]["annotations"][PRESERVED].as_str().expect("the fields are preserved");
    assert_eq!(serde_json::from_str::<Value>(annotation).unwrap(), json!({"spec": {"replicas": 3}}));
    let mut without_derived = scaled.clone();
    for field in ["replicas", "readyReplicas", "selector"] {
        without_derived["status"].as_object_mut().unwrap().remove(field);
    }
    assert_eq!(converted(&server, V1BETA1, vec![as_alpha.clone()]).await.remove(0), without_derived);

    // A read-modify-write through v1alpha1 (the Go-era manifest re-applied with a new weight)
    // keeps the replicas.
    let mut edited = as_alpha;
    edited["spec"]["backends"][0]["weight"] = json!(60);
    let back = converted(&server, V1BETA1, vec![edited]).await.remove(0);
    assert_eq!(back["spec"]["replicas"], 3);
    assert_eq!(back["spec"]["backends"][0]["weight"], 60);
    assert!(back["metadata"].get("annotations").is_none(), "the annotation is consumed: {back}");
    server.stop().await;
}

/// A list page holds objects of both versions; each is converted (or left as it is) in order.
#[tokio::test]
async fn convert_handles_every_object_of_a_review_in_order() {
    let server = TestServer::start().await;
    let alpha = stored_v1alpha1();
    let mut beta = sample_balancer();
    beta["metadata"]["name"] = json!("second");
    beta["spec"]["replicas"] = json!(2);
    let objects = converted(&server, V1BETA1, vec![alpha.clone(), beta.clone(), alpha]).await;
    let names: Vec<&str> = objects.iter().map(|o| o["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["example-balancer", "second", "example-balancer"]);
    assert!(objects.iter().all(|o| o["apiVersion"] == V1BETA1), "{objects:?}");
    assert_eq!(objects[1], beta, "already at the desired version: unchanged");
    server.stop().await;
}

/// A review the server can read but not carry out is answered `Failure`, with the uid and a
/// reason, never a 4xx (the API server would report a transport error instead of the reason).
#[tokio::test]
async fn an_unconvertible_review_is_answered_with_a_failure_and_a_reason() {
    let server = TestServer::start().await;
    let response = convert(&server, "exposer.hliangzhao.io/v2", vec![stored_v1alpha1()]).await;
    assert_eq!(response["result"]["status"], "Failure");
    let message = response["result"]["message"].as_str().expect("a message");
    assert!(message.contains("exposer.hliangzhao.io/v2"), "{message}");
    assert!(response.get("convertedObjects").is_none(), "{response}");

    let foreign = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
    let response = convert(&server, V1BETA1, vec![stored_v1alpha1(), foreign]).await;
    assert_eq!(response["result"]["status"], "Failure");
    let message = response["result"]["message"].as_str().expect("a message");
    assert!(message.starts_with("objects[1]: "), "names the object: {message}");
    assert!(response.get("convertedObjects").is_none(), "all or nothing: {response}");
    server.stop().await;
}

/// A ConversionReview carries a whole list page, so its limit is its own and larger than a
/// review's; past it, 413, whether the size is declared or streamed.
#[tokio::test]
async fn conversion_bodies_have_their_own_size_limit() {
    let limit = 256 * 1024;
    let server = TestServer::start_with(balancer::webhook::Limits {
        max_conversion_body_bytes: limit,
        ..support::test_limits()
    })
    .await;
    let padded = |bytes: usize| {
        let mut object = stored_v1alpha1();
        object["metadata"]["annotations"] = json!({"pad": "x".repeat(bytes)});
        conversion_review(V1BETA1, vec![object]).to_string()
    };
    // Past /validate's 64 KiB, within the conversion limit: converted.
    let within = padded(100 * 1024);
    let post = |path: &str, body: String| {
        server.client().post(server.url(path)).header("content-type", "application/json").body(body).send()
    };
    let response = post("/convert", within.clone()).await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["response"]["result"]["status"], "Success");
    assert_eq!(
        body["response"]["convertedObjects"][0]["metadata"]["annotations"]["pad"].as_str().unwrap().len(),
        100 * 1024
    );
    assert_eq!(post("/validate", within).await.unwrap().status().as_u16(), 413, "a review's limit is smaller");

    let over = padded(limit);
    let response = post("/convert", over.clone()).await.unwrap();
    assert_eq!(response.status().as_u16(), 413);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"], format!("the body exceeds the limit of {limit} bytes"));
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        over.as_bytes().chunks(16 * 1024).map(|c| Ok(c.to_vec())).collect();
    let response = server
        .client()
        .post(server.url("/convert"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413, "streamed, no Content-Length");
    server.stop().await;
}

#[tokio::test]
async fn unusable_conversion_requests_get_4xx_with_a_json_error() {
    let server = TestServer::start().await;
    let client = server.client();
    let mut no_uid = conversion_review(V1BETA1, vec![stored_v1alpha1()]);
    no_uid["request"]["uid"] = json!("");
    let mut old_version = conversion_review(V1BETA1, vec![]);
    old_version["apiVersion"] = json!("apiextensions.k8s.io/v1beta1");
    let mut no_objects = conversion_review(V1BETA1, vec![]);
    no_objects["request"].as_object_mut().unwrap().remove("objects");
    let cases = [
        ("not JSON at all".to_string(), "application/json", 400),
        ("{".to_string(), "application/json", 400),
        ("[]".to_string(), "application/json", 400),
        (r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview"}"#.to_string(), "application/json", 400),
        (old_version.to_string(), "application/json", 400),
        (no_uid.to_string(), "application/json", 400),
        (no_objects.to_string(), "application/json", 400),
        (conversion_review(V1BETA1, vec![]).to_string(), "text/plain", 415),
    ];
    for (body, content_type, status) in cases {
        let response = client
            .post(server.url("/convert"))
            .header("content-type", content_type)
            .body(body.clone())
            .send()
            .await
            .expect("request");
        assert_eq!(response.status().as_u16(), status, "{body}");
        let json: Value = response.json().await.expect("a JSON error");
        assert!(json["error"].as_str().is_some_and(|e| !e.is_empty()), "{body}: {json}");
    }
    let response = client.get(server.url("/convert")).send().await.expect("request");
    assert_eq!(response.status().as_u16(), 405);

    // Counted by result.
    converted(&server, V1BETA1, vec![stored_v1alpha1()]).await;
    convert(&server, "exposer.hliangzhao.io/v2", vec![stored_v1alpha1()]).await;
    let text = server.metrics().await;
    for line in [
        "balancer_conversion_requests_total{result=\"converted\"} 1",
        "balancer_conversion_requests_total{result=\"failed\"} 1",
        "balancer_conversion_requests_total{result=\"bad_request\"} 8",
        "balancer_conversion_duration_seconds_count 10",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    server.stop().await;
}

//! The real TLS webhook server over real sockets: reqwest, curl, raw TCP and raw TLS.

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support;
use crate::support::fixtures::sample_json;
use crate::support::{TestServer, UID, review};

async fn post_json(server: &TestServer, path: &str, body: &Value) -> (u16, Value) {
    let response = server.client().post(server.url(path)).json(body).send().await.expect("request");
    let status = response.status().as_u16();
    let body = response.json::<Value>().await.expect("JSON body");
    (status, body)
}

/// A raw TLS connection to the webhook port, for speaking HTTP by hand.
async fn tls_connect(server: &TestServer) -> tokio_rustls::client::TlsStream<TcpStream> {
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(support::client_config(&server.ca_path())));
    let tcp = TcpStream::connect(server.webhook).await.unwrap();
    connector.connect("127.0.0.1".try_into().unwrap(), tcp).await.expect("handshake")
}

/// The sample as the API server stores it once mutated: `spec.replicas` set (to the test
/// server's default, `--proxy-replicas` 1).
/// The sample as a v1beta1 client writes it, with v1beta1's own settings at their defaults
/// (the patches the tests expect are then about the fields each test leaves out).
pub(super) fn sample_balancer() -> Value {
    let mut sample = sample_json();
    sample["spec"]["sessionAffinity"] = json!("None");
    sample["spec"]["algorithm"] = json!("RoundRobin");
    sample["spec"]["service"] = json!({"type": "ClusterIP"});
    for port in sample["spec"]["ports"].as_array_mut().unwrap() {
        port["connectTimeout"] = json!("5s");
        port["idleTimeout"] = json!("10m");
    }
    for backend in sample["spec"]["backends"].as_array_mut().unwrap() {
        backend["maxFails"] = json!(1);
        backend["failTimeout"] = json!("10s");
    }
    sample
}

fn defaulted_sample() -> Value {
    let mut sample = sample_balancer();
    sample["spec"]["replicas"] = json!(1);
    sample
}

fn decoded_patch(review: &Value) -> Value {
    let b64 = review["response"]["patch"].as_str().expect("patch is a base64 string");
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64");
    serde_json::from_slice(&bytes).expect("patch is JSON")
}

#[tokio::test]
async fn the_sample_is_allowed_with_the_request_uid() {
    let server = TestServer::start().await;
    let (status, body) = post_json(&server, "/validate", &review("CREATE", sample_balancer())).await;
    assert_eq!(status, 200);
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(body["kind"], "AdmissionReview");
    assert_eq!(body["response"]["uid"], UID);
    assert_eq!(body["response"]["allowed"], true);
    assert!(body["response"].get("warnings").is_none(), "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_bad_balancer_is_denied_with_every_field_error() {
    let server = TestServer::start().await;
    let mut object = sample_balancer();
    object["spec"]["backends"][1]["weight"] = json!(150);
    object["spec"]["ports"] = json!([{"name": "http", "port": 80}, {"name": "http", "port": 81}]);
    let (status, body) = post_json(&server, "/validate", &review("UPDATE", object)).await;
    assert_eq!(status, 200);
    let response = &body["response"];
    assert_eq!(response["uid"], UID);
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 422);
    assert_eq!(response["status"]["reason"], "Invalid");
    assert_eq!(
        response["status"]["message"],
        "Balancer \"example-balancer\" is invalid: [spec.ports[1].name: duplicate port name \"http\" \
         (also spec.ports[0].name), spec.backends[1].weight: must be between 0 and 100, got 150]"
    );
    let fields: Vec<&str> = response["status"]["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["spec.ports[1].name", "spec.backends[1].weight"]);
    let cause = &response["status"]["details"]["causes"][1];
    assert_eq!(cause["message"], "must be between 0 and 100, got 150");
    assert_eq!(response["status"]["details"]["kind"], "Balancer");
    server.stop().await;
}

#[tokio::test]
async fn suspicious_specs_are_allowed_with_warnings() {
    let server = TestServer::start().await;
    let mut object = sample_balancer();
    object["spec"]["backends"][1]["weight"] = json!(0);
    let (_, body) = post_json(&server, "/validate", &review("CREATE", object)).await;
    assert_eq!(body["response"]["allowed"], true);
    assert_eq!(
        body["response"]["warnings"],
        json!(["spec.backends[1].weight: weight 0 drains backend \"v2\": it receives no traffic"])
    );
    server.stop().await;
}

#[tokio::test]
async fn mutation_adds_the_defaults_as_a_json_patch() {
    let server = TestServer::start().await;
    let mut object = sample_balancer();
    object["spec"]["ports"] = json!([{"name": "http", "port": 80}]);
    object["spec"]["backends"][2].as_object_mut().unwrap().remove("weight");
    let (status, body) = post_json(&server, "/mutate", &review("CREATE", object)).await;
    assert_eq!(status, 200);
    assert_eq!(body["response"]["allowed"], true);
    assert_eq!(body["response"]["patchType"], "JSONPatch");
    assert_eq!(
        decoded_patch(&body),
        json!([
            {"op": "add", "path": "/spec/backends/2/weight", "value": 1},
            {"op": "add", "path": "/spec/ports/0/connectTimeout", "value": "5s"},
            {"op": "add", "path": "/spec/ports/0/idleTimeout", "value": "10m"},
            {"op": "add", "path": "/spec/ports/0/protocol", "value": "TCP"},
            {"op": "add", "path": "/spec/ports/0/targetPort", "value": 80},
            {"op": "add", "path": "/spec/replicas", "value": 1}
        ])
    );
    server.stop().await;
}

#[tokio::test]
async fn mutating_a_defaulted_object_returns_no_patch() {
    let server = TestServer::start().await;
    let (_, body) = post_json(&server, "/mutate", &review("CREATE", defaulted_sample())).await;
    assert_eq!(body["response"]["allowed"], true);
    assert!(body["response"].get("patch").is_none(), "{body}");
    assert!(body["response"].get("patchType").is_none(), "{body}");
    server.stop().await;
}

/// `spec.replicas` defaults to the operator's `--proxy-replicas`; a Balancer that says how many
/// keeps its own, zero included; the validating webhook holds it to 0..=100.
#[tokio::test]
async fn replicas_default_to_the_proxy_replicas_flag() {
    let server =
        TestServer::start_with_args(support::test_limits(), |args| args.controller.proxy.policy.proxy_replicas = 4)
            .await;
    let (_, body) = post_json(&server, "/mutate", &review("CREATE", sample_balancer())).await;
    assert_eq!(body["response"]["allowed"], true);
    assert_eq!(decoded_patch(&body), json!([{"op": "add", "path": "/spec/replicas", "value": 4}]));
    for replicas in [0, 2, 100] {
        let mut object = sample_balancer();
        object["spec"]["replicas"] = json!(replicas);
        let (_, body) = post_json(&server, "/mutate", &review("CREATE", object.clone())).await;
        assert!(body["response"].get("patch").is_none(), "{replicas}: {body}");
        let (_, body) = post_json(&server, "/validate", &review("CREATE", object)).await;
        assert_eq!(body["response"]["allowed"], true, "{replicas}: {body}");
    }
    let mut too_many = sample_balancer();
    too_many["spec"]["replicas"] = json!(101);
    let (_, body) = post_json(&server, "/validate", &review("UPDATE", too_many)).await;
    assert_eq!(body["response"]["allowed"], false);
    assert_eq!(
        body["response"]["status"]["message"],
        "Balancer \"example-balancer\" is invalid: spec.replicas: must be between 0 and 100, got 101"
    );
    assert_eq!(body["response"]["status"]["details"]["causes"][0]["field"], "spec.replicas");
    server.stop().await;
}

#[tokio::test]
async fn other_kinds_and_deletes_are_allowed_untouched() {
    let server = TestServer::start().await;
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}});
    for path in ["/validate", "/mutate"] {
        let (_, body) = post_json(&server, path, &review("CREATE", config_map.clone())).await;
        assert_eq!(body["response"]["allowed"], true);
        assert!(body["response"].get("patch").is_none());
    }
    let mut delete = review("DELETE", json!(null));
    delete["request"]["oldObject"] = sample_balancer();
    let (_, body) = post_json(&server, "/validate", &delete).await;
    assert_eq!(body["response"]["allowed"], true);
    server.stop().await;
}

#[tokio::test]
async fn an_object_that_is_not_a_balancer_is_denied_not_a_bad_request() {
    let server = TestServer::start().await;
    let mut object = sample_balancer();
    object["spec"]["ports"][0]["port"] = json!("eighty");
    for path in ["/validate", "/mutate"] {
        let (status, body) = post_json(&server, path, &review("CREATE", object.clone())).await;
        assert_eq!(status, 200);
        assert_eq!(body["response"]["uid"], UID);
        assert_eq!(body["response"]["allowed"], false);
        let message = body["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(
                "Balancer \"example-balancer\" is invalid: spec.ports[0].port: invalid type: string \"eighty\""
            ),
            "{message}"
        );
    }
    let mut no_spec = sample_balancer();
    no_spec.as_object_mut().unwrap().remove("spec");
    let (_, body) = post_json(&server, "/validate", &review("CREATE", no_spec)).await;
    assert_eq!(body["response"]["status"]["message"], "Balancer \"example-balancer\" is invalid: spec: is required");
    server.stop().await;
}

#[tokio::test]
async fn unusable_requests_get_4xx_with_a_json_error() {
    let server = TestServer::start().await;
    let client = server.client();
    let send = |body: &'static str, content_type: &'static str| {
        client.post(server.url("/validate")).header("content-type", content_type).body(body).send()
    };
    let cases = [
        ("{", "application/json", 400, "the body is not a usable AdmissionReview"),
        (
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
            "application/json",
            400,
            "the AdmissionReview has no request",
        ),
        (
            r#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#,
            "application/json",
            400,
            "unsupported AdmissionReview apiVersion",
        ),
        ("{}", "text/plain", 415, "Content-Type must be application/json"),
    ];
    for (body, content_type, status, message) in cases {
        let response = send(body, content_type).await.expect("request");
        assert_eq!(response.status().as_u16(), status, "{body}");
        let json: Value = response.json().await.expect("JSON error");
        assert!(json["error"].as_str().unwrap().starts_with(message), "{json}");
    }
    let mut no_uid = review("CREATE", sample_balancer());
    no_uid["request"]["uid"] = json!("");
    let (status, body) = post_json(&server, "/validate", &no_uid).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("request.uid must not be empty")));

    let response = client.get(server.url("/validate")).send().await.expect("request");
    assert_eq!(response.status().as_u16(), 405);
    let response = client.post(server.url("/nope")).send().await.expect("request");
    assert_eq!(response.status().as_u16(), 404);
    server.stop().await;
}

#[tokio::test]
async fn oversized_bodies_get_413_whether_declared_or_streamed() {
    let server = TestServer::start().await;
    let big = vec![b' '; 65 * 1024];
    let response = server
        .client()
        .post(server.url("/validate"))
        .header("content-type", "application/json")
        .body(big.clone())
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 413);

    // Chunked, so no Content-Length announces the size.
    let stream =
        futures::stream::iter(big.chunks(8 * 1024).map(|c| Ok::<_, std::io::Error>(c.to_vec())).collect::<Vec<_>>());
    let response = server
        .client()
        .post(server.url("/validate"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 413);
    server.stop().await;
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let server = TestServer::start().await;
    for url in [server.url("/healthz"), server.url("/readyz")] {
        assert_eq!(server.client().get(&url).send().await.unwrap().text().await.unwrap(), "ok");
    }
    for path in ["/healthz", "/readyz"] {
        assert_eq!(reqwest::get(server.probe_url(path)).await.unwrap().text().await.unwrap(), "ok");
    }
    post_json(&server, "/validate", &review("CREATE", sample_balancer())).await;
    post_json(&server, "/validate", &review("CREATE", sample_balancer())).await;
    post_json(&server, "/mutate", &review("CREATE", json!({"apiVersion":"exposer.hliangzhao.io/v1beta1","kind":"Balancer","metadata":{"name":"m"},"spec":{"ports":[{"port":1}],"backends":[{"name":"a","selector":{"a":"b"}}]}}))).await;
    let _ =
        server.client().post(server.url("/mutate")).header("content-type", "application/json").body("[").send().await;
    let text = server.metrics().await;
    for line in [
        "balancer_admission_requests_total{webhook=\"validate\",outcome=\"allowed\"} 2",
        "balancer_admission_requests_total{webhook=\"mutate\",outcome=\"patched\"} 1",
        "balancer_admission_requests_total{webhook=\"mutate\",outcome=\"bad_request\"} 1",
        "balancer_admission_duration_seconds_count{webhook=\"validate\"} 2",
        "balancer_admission_in_flight_requests{webhook=\"validate\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    server.stop().await;
}

/// The way users test webhooks by hand: curl with the CA file.
#[tokio::test]
async fn curl_with_cacert_gets_real_answers() {
    if !support::have_tool("curl") {
        return;
    }
    let server = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut bad = sample_balancer();
    bad["spec"]["backends"][0]["weight"] = json!(101);
    let mut undefaulted = defaulted_sample();
    undefaulted["spec"]["ports"][0].as_object_mut().unwrap().remove("protocol");
    let cases = [
        ("/validate", review("CREATE", sample_balancer()), json!(true)),
        ("/validate", review("CREATE", bad), json!(false)),
        ("/mutate", review("CREATE", undefaulted), json!(true)),
    ];
    for (i, (path, body, allowed)) in cases.into_iter().enumerate() {
        let file = dir.path().join(format!("review-{i}.json"));
        std::fs::write(&file, body.to_string()).unwrap();
        let output = tokio::process::Command::new("curl")
            .args(["-sS", "--fail-with-body", "--cacert"])
            .arg(server.ca_path())
            .args(["-H", "Content-Type: application/json", "--data-binary"])
            .arg(format!("@{}", file.display()))
            .arg(server.url(path))
            .output()
            .await
            .expect("curl runs");
        assert!(output.status.success(), "curl failed: {}", String::from_utf8_lossy(&output.stderr));
        let answer: Value = serde_json::from_slice(&output.stdout).expect("JSON answer");
        assert_eq!(answer["response"]["uid"], UID);
        assert_eq!(answer["response"]["allowed"], allowed, "{answer}");
        if path == "/mutate" {
            assert_eq!(
                decoded_patch(&answer),
                json!([{"op": "add", "path": "/spec/ports/0/protocol", "value": "TCP"}])
            );
        }
    }
    // And curl without the CA refuses the dev certificate, as it should.
    let output = tokio::process::Command::new("curl").args(["-sS", &server.url("/healthz")]).output().await.unwrap();
    assert!(!output.status.success());
    server.stop().await;
}

/// A client that declares an oversized body and waits for `100 Continue` before sending it
/// gets its 413 at once, never a 100, and the connection closes: it sent nothing that could
/// turn the close into a reset, so the 413 is what it reads (as curl does with large bodies).
#[tokio::test]
async fn a_declared_oversized_body_awaiting_100_continue_gets_its_413_at_once() {
    let server = TestServer::start().await;
    // 32 MiB: over both the review limit and the conversion limit (16 MiB).
    for path in ["/validate", "/convert"] {
        let mut tls = tls_connect(&server).await;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: 33554432\r\nExpect: 100-continue\r\n\r\n"
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        // Nothing of the body is sent: a server that waits for it would still be waiting.
        let read = tokio::time::timeout(Duration::from_secs(2), tls.read_to_end(&mut answer)).await;
        assert!(read.is_ok(), "{path}: no answer and no close within 2 s: {:?}", String::from_utf8_lossy(&answer));
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413 "), "{path}: {answer}");
        assert!(answer.to_ascii_lowercase().contains("connection: close"), "{path}: {answer}");
        assert!(answer.contains("exceeds the limit"), "{path}: {answer}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_does_not_finish_its_headers_is_disconnected() {
    let server = TestServer::start().await;
    let mut tls = tls_connect(&server).await;
    tls.write_all(b"POST /validate HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let mut buf = Vec::new();
    // test_limits() allows 1 s for headers; the server must hang up well before 5 s.
    let read = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the connection was still open after 5 s");
    server.stop().await;
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed() {
    let server = TestServer::start().await;
    let mut tls = tls_connect(&server).await;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut first = [0u8; 17];
    tls.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200 OK\r\n");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the idle keep-alive connection was still open after 5 s");
    server.stop().await;
}

#[tokio::test]
async fn plain_http_on_the_webhook_port_is_refused() {
    let server = TestServer::start().await;
    let plain = reqwest::Client::new().get(format!("http://127.0.0.1:{}/healthz", server.webhook.port())).send().await;
    assert!(plain.is_err(), "plain HTTP got an answer: {plain:?}");

    let mut tcp = TcpStream::connect(server.webhook).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut buf)).await;
    assert!(!buf.starts_with(b"HTTP/"), "answered plain HTTP: {:?}", String::from_utf8_lossy(&buf));
    server.stop().await;
}

/// A minimal ClientHello offering only `version` (no supported_versions extension).
fn client_hello(version: [u8; 2]) -> Vec<u8> {
    let mut ext = Vec::new();
    // supported_groups: x25519, secp256r1
    ext.extend_from_slice(&[0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x1d, 0x00, 0x17]);
    // ec_point_formats: uncompressed
    ext.extend_from_slice(&[0x00, 0x0b, 0x00, 0x02, 0x01, 0x00]);
    // signature_algorithms: ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256, rsa_pkcs1_sha256
    ext.extend_from_slice(&[0x00, 0x0d, 0x00, 0x08, 0x00, 0x06, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01]);
    let mut body = Vec::new();
    body.extend_from_slice(&version);
    body.extend_from_slice(&[7u8; 32]); // random
    body.push(0); // session id
    // ECDHE-ECDSA/RSA AES-128-GCM-SHA256 (TLS 1.2) and two TLS 1.0/1.1 CBC suites.
    body.extend_from_slice(&[0x00, 0x08, 0xc0, 0x2b, 0xc0, 0x2f, 0xc0, 0x09, 0xc0, 0x13]);
    body.extend_from_slice(&[0x01, 0x00]); // compression: null
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut handshake = vec![0x01];
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

async fn first_record(server: &TestServer, hello: &[u8]) -> Vec<u8> {
    let mut tcp = TcpStream::connect(server.webhook).await.unwrap();
    tcp.write_all(hello).await.unwrap();
    let mut header = vec![0u8; 7];
    tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut header))
        .await
        .expect("answer in time")
        .expect("read");
    header
}

#[tokio::test]
async fn tls_1_1_is_refused_and_tls_1_2_accepted() {
    let server = TestServer::start().await;
    // TLS 1.1: an alert record (0x15), fatal (2), protocol_version (70).
    let answer = first_record(&server, &client_hello([0x03, 0x02])).await;
    assert_eq!((answer[0], answer[5], answer[6]), (0x15, 2, 70), "{answer:?}");
    // The same hello at TLS 1.2 gets a handshake record holding a ServerHello (type 2).
    let answer = first_record(&server, &client_hello([0x03, 0x03])).await;
    assert_eq!((answer[0], answer[5]), (0x16, 0x02), "{answer:?}");
    server.stop().await;
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish_and_stops_accepting() {
    let server = TestServer::start_with(balancer::webhook::Limits {
        body_timeout: Duration::from_secs(10),
        ..support::test_limits()
    })
    .await;
    let mut tls = tls_connect(&server).await;
    let body = review("CREATE", sample_balancer()).to_string();
    let head = format!(
        "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(&body.as_bytes()[..10]).await.unwrap();
    tls.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let token = server.shutdown_token();
    let webhook = server.webhook;
    token.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(TcpStream::connect(webhook).await.is_err(), "still accepting after shutdown");

    tls.write_all(&body.as_bytes()[10..]).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut response)).await.expect("answered").unwrap();
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains(UID), "{text}");
    server.stop().await;
}

/// During the shutdown delay every answer closes its connection (`Connection: close`), so the
/// API server's keep-alive pool empties before the listener stops: closing an idle connection
/// at shutdown races its next POST, which Go does not retry ("failed calling webhook: EOF").
#[tokio::test]
async fn draining_closes_each_connection_after_its_next_answer() {
    let server = TestServer::start().await;
    let mut kept = tls_connect(&server).await;
    let before = exchange(&mut kept, "/healthz").await;
    assert!(before.starts_with("http/1.1 200 ok") && !before.contains("connection: close"), "{before}");

    server.begin_draining();
    let ready = reqwest::get(server.probe_url("/readyz")).await.unwrap();
    assert_eq!(ready.status(), 503, "ready while draining");
    // The connection opened before still gets its answer, then is closed by the server.
    let during = exchange(&mut kept, "/healthz").await;
    assert!(during.starts_with("http/1.1 200 ok") && during.contains("connection: close"), "{during}");
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(2), kept.read_to_end(&mut rest)).await;
    assert!(matches!(closed, Ok(Ok(0))), "still open after its answer while draining: {closed:?}");
    // A new connection is still answered, once.
    let mut fresh = tls_connect(&server).await;
    let answer = exchange(&mut fresh, "/readyz").await;
    assert!(answer.starts_with("http/1.1 503") && answer.contains("connection: close"), "{answer}");
    server.stop().await;
}

/// Sends `GET path` and reads exactly one answer (its head and `content-length` bytes of body),
/// lowercased.
async fn exchange(tls: &mut tokio_rustls::client::TlsStream<TcpStream>, path: &str) -> String {
    tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
    exchange_after_body(tls).await
}

/// Oversized lists and selectors are refused while they are read, with their exact size,
/// so a single review can make the server neither keep nor answer an unbounded list.
#[tokio::test]
async fn oversized_lists_are_refused_while_read() {
    let server = TestServer::start().await;
    let mut many_labels = sample_balancer();
    let labels: serde_json::Map<String, Value> = (0..40).map(|i| (format!("k{i}"), json!("v"))).collect();
    many_labels["spec"]["selector"] = Value::Object(labels);
    let mut many_backends = sample_balancer();
    let backend = json!({"name": "x", "weight": 500, "selector": {"a": "b"}});
    many_backends["spec"]["backends"] = Value::Array(vec![backend; 1000]);
    for (object, problem) in [
        (many_labels, "spec.selector: must have at most 32 labels, got 40"),
        (many_backends, "spec.backends: must have at most 64 backends, got 1000"),
    ] {
        let (status, body) = post_json(&server, "/validate", &review("CREATE", object.clone())).await;
        assert_eq!(status, 200);
        let message = format!("Balancer \"example-balancer\" is invalid: {problem}");
        assert_eq!(body["response"]["status"]["message"], message.as_str());
        let (_, body) = post_json(&server, "/mutate", &review("CREATE", object)).await;
        assert_eq!(body["response"]["allowed"], false, "{body}");
        assert!(body["response"].get("patch").is_none(), "no patch for a spec that cannot be read: {body}");
    }
    server.stop().await;
}

/// An UPDATE that leaves an (invalid) spec alone is allowed, so a Balancer stored under
/// looser rules can still be relabelled or deleted; changing the spec is judged as usual.
#[tokio::test]
async fn updates_that_keep_the_spec_are_not_judged_again() {
    let server = TestServer::start().await;
    let mut stored = sample_balancer();
    stored["spec"]["backends"][1]["name"] = json!("V2");
    let mut relabelled = stored.clone();
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    let mut update = review("UPDATE", relabelled.clone());
    update["request"]["oldObject"] = stored.clone();
    let (_, body) = post_json(&server, "/validate", &update).await;
    assert_eq!(body["response"]["allowed"], true, "{body}");

    relabelled["spec"]["backends"][0]["weight"] = json!(41);
    let mut update = review("UPDATE", relabelled);
    update["request"]["oldObject"] = stored;
    let (_, body) = post_json(&server, "/validate", &update).await;
    assert_eq!(body["response"]["allowed"], false, "{body}");
    server.stop().await;
}

/// A LoadBalancer's class cannot change (the API server would refuse it on the Service for
/// ever after): the validating webhook compares with the stored object and says how to do it.
#[tokio::test]
async fn a_load_balancers_class_change_is_refused_on_update() {
    let server = TestServer::start().await;
    let mut stored = sample_balancer();
    stored["spec"]["service"] = json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/a"});
    let mut changed = stored.clone();
    changed["spec"]["service"]["loadBalancerClass"] = json!("example.com/b");
    let mut update = review("UPDATE", changed);
    update["request"]["oldObject"] = stored.clone();
    let (_, body) = post_json(&server, "/validate", &update).await;
    assert_eq!(body["response"]["allowed"], false, "{body}");
    let message = body["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("spec.service.loadBalancerClass: may not change while the type is LoadBalancer"),
        "{message}"
    );
    // Created with a class: nothing to compare with.
    let (_, body) = post_json(&server, "/validate", &review("CREATE", stored)).await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
    server.stop().await;
}

/// Review bodies share a byte budget of at least two bodies, so that no one client holds all
/// of it: while two clients hold it with bodies they have not finished sending, another
/// review waits only `budget_wait`, then gets 503 at once, well inside the API server's
/// timeout; once they are gone, reviews flow again.
#[tokio::test]
async fn reviews_beyond_the_body_budget_fail_fast_with_503() {
    let server = TestServer::start_with(balancer::webhook::Limits {
        max_body_bytes_in_flight: 64 * 1024,
        budget_wait: Duration::from_millis(300),
        body_timeout: Duration::from_secs(10),
        // The holders stop sending: no minimum rate may cut them before the review is judged.
        min_body_rate: balancer::runtime::listener::MinRate::NONE,
        ..support::test_limits()
    })
    .await;
    let mut object = sample_balancer();
    object["metadata"]["annotations"] = json!({"pad": "x".repeat(60_000)});
    let body = review("CREATE", object).to_string();
    let head = format!(
        "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut holder = tls_connect(&server).await;
        holder.write_all(head.as_bytes()).await.unwrap();
        holder.write_all(&body.as_bytes()[..body.len() - 10]).await.unwrap();
        holder.flush().await.unwrap();
        holders.push(holder);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = std::time::Instant::now();
    let response = server
        .client()
        .post(server.url("/validate"))
        .header("Content-Type", "application/json")
        .body(body.clone())
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status().as_u16(), 503);
    assert!(started.elapsed() < Duration::from_secs(2), "waited {:?}", started.elapsed());

    drop(holders);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let response = server
        .client()
        .post(server.url("/validate"))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status().as_u16(), 200, "the budget came back");
    server.stop().await;
}

/// Connections that never sent a byte, or never finished their handshake, do not hold up
/// shutdown: only requests in flight are drained.
#[tokio::test]
async fn silent_connections_do_not_delay_shutdown() {
    let slow = |limits: balancer::runtime::listener::ConnectionLimits| balancer::runtime::listener::ConnectionLimits {
        first_byte_timeout: Duration::from_secs(30),
        handshake_timeout: Duration::from_secs(30),
        ..limits
    };
    let limits = support::test_limits();
    let server = TestServer::start_with(balancer::webhook::Limits {
        connections: slow(limits.connections.clone()),
        probe_connections: slow(limits.probe_connections.clone()),
        ..limits
    })
    .await;
    let _silent = TcpStream::connect(server.webhook).await.unwrap();
    let mut half_hello = TcpStream::connect(server.webhook).await.unwrap();
    half_hello.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).await.unwrap();
    let _silent_probe = TcpStream::connect(server.probe).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    server.stop().await;
    assert!(started.elapsed() < Duration::from_secs(2), "shutdown took {:?}", started.elapsed());
}

/// The answer to a request sent by hand, read until the server closes (at most 5 s), lowercased.
async fn answer_until_closed(tls: &mut tokio_rustls::client::TlsStream<TcpStream>) -> String {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the server closed within 5 s; it sent {:?}", String::from_utf8_lossy(&answer));
    String::from_utf8_lossy(&answer).to_ascii_lowercase()
}

/// A body that falls behind the minimum rate gets 408 as soon as it does, long before the
/// body timeout, and is counted by reason; one that keeps to the rate, in pieces, is read.
#[tokio::test]
async fn a_trickled_body_gets_408_once_behind_the_minimum_rate() {
    use balancer::runtime::listener::MinRate;
    let server = TestServer::start_with(balancer::webhook::Limits {
        min_body_rate: MinRate { bytes_per_second: 1024, grace: Duration::from_millis(300) },
        body_timeout: Duration::from_secs(10),
        ..support::test_limits()
    })
    .await;
    let head = |length: usize| {
        format!(
            "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        )
    };
    let mut slow = tls_connect(&server).await;
    slow.write_all(head(50_000).as_bytes()).await.unwrap();
    slow.write_all(b"{\"apiVersi").await.unwrap();
    slow.flush().await.unwrap();
    let started = std::time::Instant::now();
    let answer = answer_until_closed(&mut slow).await;
    assert!(answer.starts_with("http/1.1 408"), "{answer}");
    assert!(answer.contains("too slowly") && answer.contains("connection: close"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(2), "cut off after {:?}, not at the timeout", started.elapsed());
    let metrics = server.metrics().await;
    assert!(metrics.contains("balancer_webhook_body_refusals_total{reason=\"too_slow\"} 1"), "{metrics}");

    // 1,000 bytes a second in three pieces: within 1 KiB a second after the grace.
    let body = review("CREATE", sample_balancer()).to_string();
    let pieces: Vec<&[u8]> = body.as_bytes().chunks(body.len().div_ceil(3)).collect();
    let mut steady = tls_connect(&server).await;
    steady.write_all(head(body.len()).as_bytes()).await.unwrap();
    for piece in pieces {
        steady.write_all(piece).await.unwrap();
        steady.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let answer = exchange_after_body(&mut steady).await;
    assert!(answer.starts_with("http/1.1 200"), "{answer}");
    assert!(answer.contains("\"allowed\":true"), "{answer}");
    server.stop().await;
}

/// Reads one answer whose request was already sent (its head and `content-length` bytes).
async fn exchange_after_body(tls: &mut tokio_rustls::client::TlsStream<TcpStream>) -> String {
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .and_then(|n| n.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if answer.len() >= end + 4 + length {
                return text;
            }
        }
        let read = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut chunk)).await;
        let n = read.expect("an answer within 5 s").expect("read");
        assert!(n > 0, "closed before a whole answer: {text}");
        answer.extend_from_slice(&chunk[..n]);
    }
}

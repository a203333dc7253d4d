//! The one mock API server: a kube `Client` whose every request arrives here, to be checked
//! and answered in order (tower-test, the controller-rs pattern).

use std::time::Duration;

use axum::http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::Value;
use tower_test::mock::{self, Handle, SendResponse};

/// Answers one request.
pub type Respond = SendResponse<Response<Body>>;

/// The API server side of a mock client.
pub struct MockApi(Handle<Request<Body>, Response<Body>>);

/// One request as it arrived.
pub struct Received {
    pub method: Method,
    /// Path and query, as the client sent them.
    pub uri: String,
    /// The JSON body; `Null` when there is none.
    pub body: Value,
    pub respond: Respond,
}

/// A client for namespace `default` and the API server it talks to.
pub fn pair() -> (Client, MockApi) {
    let (service, api) = service_pair();
    (Client::new(service, "default"), api)
}

impl MockApi {
    /// The next request, or `None` when none arrives within `within` (on a paused clock: once
    /// every task is idle) or the client is gone.
    pub async fn next_within(&mut self, within: Duration) -> Option<Received> {
        tokio::time::timeout(within, self.recv()).await.ok()?
    }

    /// The next request, however long it takes; `None` once the client is gone.
    pub async fn recv(&mut self) -> Option<Received> {
        let (request, respond) = self.0.next_request().await?;
        let method = request.method().clone();
        let uri = request.uri().to_string();
        let bytes = request.into_body().collect_bytes().await.expect("the request body reads");
        let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("a JSON body") };
        Some(Received { method, uri, body, respond })
    }

    /// The next request, which must arrive within 5 s.
    pub async fn next(&mut self) -> Received {
        self.next_within(Duration::from_secs(5)).await.expect("no request arrived")
    }

    /// The next request, which must be `method` on `uri`.
    pub async fn expect(&mut self, method: Method, uri: &str) -> Received {
        let received = self.next_within(Duration::from_secs(5)).await;
        let received = received.unwrap_or_else(|| panic!("no request arrived; expected {method} {uri}"));
        assert_eq!((&received.method, received.uri.as_str()), (&method, uri));
        received
    }

    /// No request arrives within `within`.
    pub async fn assert_none_within(&mut self, within: Duration) {
        if let Ok(Some((request, _))) = tokio::time::timeout(within, self.0.next_request()).await {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
    }

    /// The client sends nothing more and is dropped (within 5 s).
    pub async fn expect_done(&mut self) {
        let next = tokio::time::timeout(Duration::from_secs(5), self.0.next_request())
            .await
            .expect("the client is dropped once its work is done");
        if let Some((request, _)) = next {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
    }
}

/// Answers with `status` and a JSON `body`.
pub fn reply(respond: Respond, status: StatusCode, body: &Value) {
    let body = Body::from(serde_json::to_vec(body).expect("JSON encodes"));
    respond.send_response(Response::builder().status(status).body(body).expect("a response"));
}

/// Answers 200 with `body`.
pub fn ok(respond: Respond, body: &Value) {
    reply(respond, StatusCode::OK, body);
}

/// The mock as a tower service (to wrap in layers before the `Client`), and its API server.
pub fn service_pair() -> (mock::Mock<Request<Body>, Response<Body>>, MockApi) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (service, MockApi(handle))
}

/// The request `method` on `uri` (path and query) is covered by the permissions the controller
/// declares in `CLUSTER_PERMISSIONS`, which `deploy/rbac.yaml` grants (the manifests test keeps
/// the two equal). A GET of a collection is a list, or a watch with `watch=true`.
pub fn assert_granted(method: &Method, uri: &str) {
    let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => panic!("unexpected path {path}"),
    };
    let (resource, named) = match rest {
        [resource] | ["namespaces", _, resource] => (resource.to_string(), false),
        ["namespaces", _, resource, _name] => (resource.to_string(), true),
        ["namespaces", _, resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => panic!("unexpected path {path}"),
    };
    let watch = query.split('&').any(|parameter| parameter == "watch=true");
    let mut verbs = match *method {
        Method::GET if named => vec!["get"],
        Method::GET if watch => vec!["watch"],
        Method::GET => vec!["list"],
        Method::POST => vec!["create"],
        Method::PATCH => vec!["patch"],
        Method::DELETE => vec!["delete"],
        _ => panic!("unexpected method {method}"),
    };
    if query.contains("fieldManager=") && *method == Method::PATCH {
        verbs.push("create"); // server-side apply creates what is missing
    }
    for verb in verbs {
        let granted = balancer::deploy::CLUSTER_PERMISSIONS
            .iter()
            .any(|(g, r, vs)| *g == group && *r == resource && vs.contains(&verb));
        assert!(granted, "{method} {path}: {verb} on {group}/{resource} is not in CLUSTER_PERMISSIONS");
    }
}

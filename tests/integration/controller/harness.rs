//! The reconciler's harness: kube's `Client` over a tower-test mock API server that asserts
//! every request the controller makes, in order (the controller-rs pattern), the child caches
//! filled as the API server would hold them, and the expectations the tests share.

use std::sync::Arc;

use axum::http::{Method, Response, StatusCode};
use balancer::api::{Balancer, BalancerStatus};
use balancer::controller::{Cached, ChildCaches, Context, IdentityCaches, ReadyEndpointSlices, ReadySlice};
use balancer::manager::Metrics;
use balancer::proxy::{self, BackendTarget, Owner, ProxySettings};
use balancer::runtime::throttle::{Rate, ThrottleLayer};
use balancer::spec::Admitted;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::client::Body;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::fixtures::{self, BalancerVariants};
use crate::support::mock_api::{self, MockApi, Respond, ok};

pub(super) const NS: &str = "ns";

pub(super) const NAME: &str = "example-balancer";

pub(super) const UID: &str = "6a1c5e2e-0f2a-4d8c-9c57-6c1f4b5e8d11";

pub(super) const SSA: &str = "?&force=true&fieldManager=balancer";

pub(super) const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events?";

pub(super) const STATUS: &str = "/apis/exposer.hliangzhao.io/v1beta1/namespaces/ns/balancers/example-balancer/status?";

/// The proxy pods' selector, as the scale subresource reports it.
const SELECTOR: &str =
    "app.kubernetes.io/component=proxy,balancer.exposer.hliangzhao.io/balancer-name=example-balancer";

pub(super) type ApiServer = MockApi;

/// The cluster IP the mock API server gives every Service.
pub(super) const CLUSTER_IP: &str = "10.96.0.10";

/// The reconcile tests' settings: one proxy pod by default, and an image of their own.
pub(super) fn settings() -> ProxySettings {
    ProxySettings { image: "nginx-test:1".into(), ..fixtures::proxy_settings(1) }
}

/// A spec through the pipeline the controller uses.
pub(super) fn admitted(balancer: &Balancer) -> Admitted {
    fixtures::admitted(NAME, balancer.spec.clone(), &settings().policy)
}

pub(super) fn sample() -> Balancer {
    fixtures::sample().stored(NS, UID)
}

pub(super) struct Caches {
    pub(super) services: Writer<Cached<Service>>,
    pub(super) config_maps: Writer<Cached<ConfigMap>>,
    pub(super) deployments: Writer<Cached<Deployment>>,
    pub(super) budgets: Writer<Cached<PodDisruptionBudget>>,
    /// Kept so that the identity caches stay listed.
    pub(super) _identity: IdentityWriters,
    pub(super) endpoint_slices: ReadyEndpointSlices,
}

/// The writers of the proxy identity's caches.
type IdentityWriters = (Writer<Cached<ServiceAccount>>, Writer<Cached<Role>>, Writer<Cached<RoleBinding>>);

/// A cache that has listed (nothing).
fn synced_store<K>() -> (Store<K>, Writer<K>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let (store, mut writer) = reflector::store::<K>();
    writer.apply_watcher_event(&watcher::Event::InitDone);
    (store, writer)
}

/// Synced, empty child caches, and their writers.
pub(super) fn child_caches() -> (ChildCaches, Caches) {
    let (services, services_writer) = synced_store();
    let (config_maps, config_maps_writer) = synced_store();
    let (deployments, deployments_writer) = synced_store();
    let (budgets, budgets_writer) = synced_store();
    let ((accounts, accounts_writer), (roles, roles_writer), (bindings, bindings_writer)) =
        (synced_store(), synced_store(), synced_store());
    let identity = IdentityCaches { accounts, roles, bindings };
    let endpoint_slices = ReadyEndpointSlices::default();
    endpoint_slices.apply(&watcher::Event::Init);
    endpoint_slices.apply(&watcher::Event::InitDone);
    let caches = Caches {
        services: services_writer,
        config_maps: config_maps_writer,
        deployments: deployments_writer,
        budgets: budgets_writer,
        _identity: (accounts_writer, roles_writer, bindings_writer),
        endpoint_slices: endpoint_slices.clone(),
    };
    (ChildCaches { services, config_maps, deployments, budgets, identity, endpoint_slices }, caches)
}

/// A context whose client talks to the returned mock, with synced (empty) caches.
pub(super) fn context() -> (Arc<Context>, ApiServer, Caches) {
    let (client, handle) = mock_api::pair();
    let (children, caches) = child_caches();
    let ctx = Context::new(client, children, settings(), Metrics::default().controller);
    (Arc::new(ctx), handle, caches)
}

/// Fills the caches with the children as the API server would hold them, the proxy available.
pub(super) fn converged(caches: &mut Caches, balancer: &Balancer) {
    let owner = Owner::of(balancer).unwrap();
    let spec = admitted(balancer);
    let backend_services = proxy::backend_services(&owner, &spec);
    let at_cluster_ip =
        |backend| BackendTarget { spec: backend, cluster_ip: CLUSTER_IP.parse().ok(), ready_pods: None };
    let targets: Vec<BackendTarget<'_>> = spec.backends.iter().map(at_cluster_ip).collect();
    let proxy = proxy::proxy(&owner, &spec, &settings(), &targets);
    let replicas = spec.replicas();
    let stored = |mut value: Value| {
        value["metadata"]["uid"] = json!("child-uid");
        value["metadata"]["resourceVersion"] = json!("42");
        value["metadata"]["generation"] = json!(1);
        value["metadata"]["managedFields"] = json!([{"manager": "balancer", "operation": "Apply"}]);
        value
    };
    // As the controller applied them: with the hash of what it wanted.
    for service in backend_services.iter().chain([&proxy.front_service]) {
        let mut value = stored(serde_json::to_value(proxy::stamped(service).unwrap()).unwrap());
        value["spec"]["clusterIP"] = json!(CLUSTER_IP);
        value["spec"]["sessionAffinity"] = json!("None");
        value["spec"]["ports"][0]["nodePort"] = Value::Null;
        caches.services.apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(value).unwrap()));
    }
    let config_map = stored(serde_json::to_value(proxy::stamped(&proxy.config_map).unwrap()).unwrap());
    caches.config_maps.apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(config_map).unwrap()));
    let mut deployment: Deployment =
        serde_json::from_value(stored(serde_json::to_value(proxy::stamped(&proxy.deployment).unwrap()).unwrap()))
            .unwrap();
    deployment.spec.as_mut().unwrap().template.spec.as_mut().unwrap().dns_policy = Some("ClusterFirst".into());
    deployment.status = Some(DeploymentStatus {
        observed_generation: Some(1),
        replicas: Some(replicas),
        updated_replicas: Some(replicas),
        ready_replicas: Some(replicas),
        available_replicas: Some(replicas),
        ..DeploymentStatus::default()
    });
    caches.deployments.apply_watcher_event(&watcher::Event::Apply(Cached::of(&deployment).unwrap()));
}

/// Takes the next request, checks its method, URI and permission, and returns its JSON body and
/// the responder.
pub(super) async fn expect(server: &mut ApiServer, method: Method, uri: &str) -> (Value, Respond) {
    let received = server.expect(method.clone(), uri).await;
    mock_api::assert_granted(&method, uri);
    (received.body, received.respond)
}

/// The controller sends nothing more: its client is dropped once the reconcile returns.
pub(super) async fn expect_done(server: &mut ApiServer) {
    server.expect_done().await;
}

/// A child the cache does not know is created with a POST to its collection (which a taken name
/// refuses); answers with the created object.
pub(super) async fn expect_create(server: &mut ApiServer, path: &str, kind: &str) -> Value {
    let (collection, name) = path.rsplit_once('/').unwrap();
    let (body, respond) = expect(server, Method::POST, &format!("{collection}?&fieldManager=balancer")).await;
    assert_eq!((body["kind"].as_str(), body["metadata"]["name"].as_str()), (Some(kind), Some(name)));
    ok(respond, &stored(&body, kind));
    body
}

/// Refuses a POST: the name is taken.
pub(super) async fn expect_create_refused(server: &mut ApiServer, path: &str) {
    let (collection, _) = path.rsplit_once('/').unwrap();
    let (_, respond) = expect(server, Method::POST, &format!("{collection}?&fieldManager=balancer")).await;
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "reason": "AlreadyExists", "code": 409, "message": "already exists"});
    respond.send_response(
        Response::builder()
            .status(StatusCode::CONFLICT)
            .body(Body::from(serde_json::to_vec(&status).unwrap()))
            .unwrap(),
    );
}

/// The object as the API server would return it after a write of `body`.
pub(super) fn stored(body: &Value, kind: &str) -> Value {
    let mut stored = body.clone();
    stored["metadata"]["resourceVersion"] = json!("7");
    if kind == "Service" {
        stored["spec"]["clusterIP"] = json!(CLUSTER_IP);
    }
    stored
}

/// Answers the apply of a child with the applied object.
pub(super) async fn expect_apply(server: &mut ApiServer, path: &str, kind: &str) -> Value {
    let (body, respond) = expect(server, Method::PATCH, &format!("{path}{SSA}")).await;
    assert_eq!(body["kind"], kind);
    ok(respond, &stored(&body, kind));
    body
}

/// Answers the status write (a merge patch of the status alone) and returns the status.
pub(super) async fn expect_status(server: &mut ApiServer, balancer: &Balancer) -> Value {
    let (body, respond) = expect(server, Method::PATCH, STATUS).await;
    let keys: Vec<&String> = body.as_object().expect("a merge patch").keys().collect();
    assert_eq!(keys, ["status"], "only the status is written: {body}");
    let mut stored = serde_json::to_value(balancer).unwrap();
    stored["status"] = body["status"].clone();
    ok(respond, &stored);
    body["status"].clone()
}

/// Answers the status write of a reconcile that leaves the sample converged and Ready, checks
/// that status, and takes the `ProxyAvailable` event that follows it; returns the status.
pub(super) async fn expect_ready(server: &mut ApiServer) -> Value {
    let status = expect_status(server, &sample()).await;
    assert_status(
        &status,
        (1, 1),
        (3, 0),
        json!({"status": "True", "reason": "ProxyAvailable",
               "message": "proxy Deployment example-balancer-proxy is available (1/1); 3 backends active"}),
    );
    expect_event(server, "ProxyAvailable").await;
    status
}

/// The whole status a reconcile writes, field by field: the proxy's pods (for the scale
/// subresource), the backend counts, and one `Ready` condition (its transition time is
/// checked to be a timestamp, then left out of the comparison).
pub(super) fn assert_status(
    written: &Value,
    (replicas, ready_replicas): (i32, i32),
    (active, obsolete): (i32, i32),
    ready: Value,
) {
    let mut status = written.clone();
    // A reconcile that stops early keeps what the status said of the addresses and the
    // backends (nothing, in these tests).
    let stopped_early = ["InvalidSpec", "ReconcileError", "Conflict"].contains(&ready["reason"].as_str().unwrap_or(""));
    let conditions = status["conditions"].as_array_mut().expect("conditions");
    assert_eq!(conditions.len(), if stopped_early { 1 } else { 2 }, "{conditions:?}");
    for condition in conditions.iter_mut() {
        let time = condition.as_object_mut().unwrap().remove("lastTransitionTime").expect("lastTransitionTime");
        let time = time.as_str().expect("a string");
        assert!(time.len() >= 20 && time.ends_with('Z') && time.as_bytes()[10] == b'T', "RFC 3339: {time}");
    }
    let backends_available = (!stopped_early).then(|| conditions.remove(1));
    let addresses = if stopped_early { json!([]) } else { json!([{"type": "IPAddress", "value": CLUSTER_IP}]) };
    let object = status.as_object_mut().expect("a status object");
    assert_eq!(object.remove("addresses"), Some(addresses), "{written}");
    assert_eq!(object.remove("nodePorts"), Some(json!([])), "always written, so that none can linger");
    // No endpoints in these tests' caches: no backend has a ready endpoint.
    let (backends, backends_ready) = if stopped_early {
        (json!([]), None)
    } else {
        let rows: Vec<Value> = sample()
            .spec
            .backends
            .iter()
            .map(|b| json!({"name": b.name, "weight": b.weight, "readyEndpoints": 0, "share": 0}))
            .collect();
        (json!(rows), Some(json!("0/3")))
    };
    assert_eq!(object.remove("backends"), Some(backends), "always written, so that a removed backend leaves");
    assert_eq!(object.remove("backendsReady"), backends_ready);
    if let Some(condition) = backends_available {
        assert_eq!(
            condition,
            json!({"type": "BackendsAvailable", "status": "False", "reason": "NoReadyEndpoints", "observedGeneration": 1,
                   "message": "no backend has a ready endpoint: v1, v2, v3; new connections fail"})
        );
    }
    let mut expected_ready = ready;
    expected_ready["type"] = json!("Ready");
    expected_ready["observedGeneration"] = json!(1);
    assert_eq!(
        status,
        json!({
            "replicas": replicas,
            "readyReplicas": ready_replicas,
            "selector": SELECTOR,
            "activeBackends": active,
            "obsoleteBackends": obsolete,
            "observedGeneration": 1,
            "conditions": [expected_ready],
        })
    );
    let typed: BalancerStatus = serde_json::from_value(written.clone()).expect("reads back as a v1beta1 status");
    assert_eq!((typed.replicas, typed.ready_replicas), (replicas, ready_replicas));
}

pub(super) async fn expect_event(server: &mut ApiServer, reason: &str) -> Value {
    let (event, respond) = expect(server, Method::POST, EVENTS).await;
    assert_eq!(event["reason"], reason, "{event}");
    ok(respond, &event);
    event
}

/// A client whose requests go through the controller's throttle, over a mock API server.
pub(super) fn throttled_context() -> (Arc<Context>, ApiServer, Arc<Metrics>) {
    let (ctx, server, metrics, _shutdown) = throttled_context_until_shutdown();
    (ctx, server, metrics)
}

/// [`throttled_context`], and the shutdown token its throttle obeys.
pub(super) fn throttled_context_until_shutdown() -> (Arc<Context>, ApiServer, Arc<Metrics>, CancellationToken) {
    use tower::Layer;
    let (service, handle) = mock_api::service_pair();
    let metrics = Arc::new(Metrics::default());
    let shutdown = CancellationToken::new();
    let layer = ThrottleLayer::new(Rate { qps: 100.0, burst: 100 }, metrics.throttle.clone(), shutdown.clone());
    let client = Client::new(layer.layer(service), "default");
    let (children, _) = child_caches();
    (Arc::new(Context::new(client, children, settings(), metrics.controller.clone())), handle, metrics, shutdown)
}

pub(super) fn too_many_requests(respond: Respond, retry_after: Option<u64>) {
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Too many requests, please try again later.", "reason": "TooManyRequests", "code": 429});
    let mut response = Response::builder().status(StatusCode::TOO_MANY_REQUESTS);
    if let Some(seconds) = retry_after {
        response = response.header("Retry-After", seconds.to_string());
    }
    respond.send_response(response.body(Body::from(serde_json::to_vec(&status).unwrap())).unwrap());
}

/// The backend Services' EndpointSlices as the EndpointSlice controller writes them for a
/// dual-stack Service: an IPv4 and an IPv6 slice, each listing the same `ready` pods of each
/// backend named (and one terminating pod, which does not count).
pub(super) fn endpoint_slices(caches: &mut Caches, ready: &[(&str, usize)]) {
    for (backend, count) in ready {
        let service = balancer::api::backend_service_name(NAME, backend);
        for (family, address) in [("IPv4", "10.244.0."), ("IPv6", "fd00::")] {
            let pod = |i: usize, conditions: Value| {
                json!({"addresses": [format!("{address}{}", i + 2)], "conditions": conditions,
                       "targetRef": {"kind": "Pod", "namespace": NS, "name": format!("{backend}-{i}")}})
            };
            let mut listed: Vec<Value> =
                (0..*count).map(|i| pod(i, json!({"ready": true, "serving": true, "terminating": false}))).collect();
            listed.push(pod(*count, json!({"ready": false, "serving": true, "terminating": true})));
            let slice: ReadySlice = serde_json::from_value(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": family,
                "metadata": {"name": format!("{service}-{}", family.to_lowercase()), "namespace": NS,
                             "labels": {"kubernetes.io/service-name": service, proxy::BALANCER_NAME_LABEL: NAME}},
                "endpoints": listed,
                "ports": [{"port": 80, "protocol": "TCP"}]
            }))
            .unwrap();
            caches.endpoint_slices.apply(&watcher::Event::Apply(slice));
        }
    }
}

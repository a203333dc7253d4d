//! The reconciler against kube's `Client` over a tower-test mock API server:
//! every request the controller makes is asserted, in order (the controller-rs pattern).

use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, Response, StatusCode};
use balancer::api::{Balancer, BalancerStatus};
use balancer::controller::StoredBalancer;
use balancer::controller::{
    self, Cached, ChildCaches, Context, ErrorKind, IdentityCaches, ReadyEndpointSlices, ReadySlice, Reason,
    error_policy, reconcile,
};
use balancer::manager::Metrics;
use balancer::proxy::{self, BackendTarget, Owner, ProxySettings};
use balancer::runtime::throttle::{Rate, ThrottleLayer};
use balancer::spec::Admitted;
use balancer::spec::SpecPolicy;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::fixtures::{self, BalancerVariants};
use crate::support::mock_api::{self, MockApi, Respond, ok};

const NS: &str = "ns";
const NAME: &str = "example-balancer";
const UID: &str = "6a1c5e2e-0f2a-4d8c-9c57-6c1f4b5e8d11";
const SSA: &str = "?&force=true&fieldManager=balancer";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events?";
const STATUS: &str = "/apis/exposer.hliangzhao.io/v1beta1/namespaces/ns/balancers/example-balancer/status?";
/// The proxy pods' selector, as the scale subresource reports it.
const SELECTOR: &str =
    "app.kubernetes.io/component=proxy,balancer.exposer.hliangzhao.io/balancer-name=example-balancer";

type ApiServer = MockApi;

/// The cluster IP the mock API server gives every Service.
const CLUSTER_IP: &str = "10.96.0.10";

/// The reconcile tests' settings: one proxy pod by default, and an image of their own.
fn settings() -> ProxySettings {
    ProxySettings { image: "nginx-test:1".into(), ..fixtures::proxy_settings(1) }
}

/// A spec through the pipeline the controller uses.
fn admitted(balancer: &Balancer) -> Admitted {
    fixtures::admitted(NAME, balancer.spec.clone(), &settings().policy)
}

fn sample() -> Balancer {
    fixtures::sample().stored(NS, UID)
}

struct Caches {
    services: Writer<Cached<Service>>,
    config_maps: Writer<Cached<ConfigMap>>,
    deployments: Writer<Cached<Deployment>>,
    budgets: Writer<Cached<PodDisruptionBudget>>,
    /// Kept so that the identity caches stay listed.
    _identity: IdentityWriters,
    endpoint_slices: ReadyEndpointSlices,
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
fn child_caches() -> (ChildCaches, Caches) {
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
fn context() -> (Arc<Context>, ApiServer, Caches) {
    let (client, handle) = mock_api::pair();
    let (children, caches) = child_caches();
    let ctx = Context::new(client, children, settings(), Metrics::default().controller);
    (Arc::new(ctx), handle, caches)
}

/// Fills the caches with the children as the API server would hold them, the proxy available.
fn converged(caches: &mut Caches, balancer: &Balancer) {
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
async fn expect(server: &mut ApiServer, method: Method, uri: &str) -> (Value, Respond) {
    let received = server.expect(method.clone(), uri).await;
    mock_api::assert_granted(&method, uri);
    (received.body, received.respond)
}

/// The controller sends nothing more: its client is dropped once the reconcile returns.
async fn expect_done(server: &mut ApiServer) {
    server.expect_done().await;
}

/// A child the cache does not know is created with a POST to its collection (which a taken name
/// refuses); answers with the created object.
async fn expect_create(server: &mut ApiServer, path: &str, kind: &str) -> Value {
    let (collection, name) = path.rsplit_once('/').unwrap();
    let (body, respond) = expect(server, Method::POST, &format!("{collection}?&fieldManager=balancer")).await;
    assert_eq!((body["kind"].as_str(), body["metadata"]["name"].as_str()), (Some(kind), Some(name)));
    ok(respond, &stored(&body, kind));
    body
}

/// Refuses a POST: the name is taken.
async fn expect_create_refused(server: &mut ApiServer, path: &str) {
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
fn stored(body: &Value, kind: &str) -> Value {
    let mut stored = body.clone();
    stored["metadata"]["resourceVersion"] = json!("7");
    if kind == "Service" {
        stored["spec"]["clusterIP"] = json!(CLUSTER_IP);
    }
    stored
}

/// Answers the apply of a child with the applied object.
async fn expect_apply(server: &mut ApiServer, path: &str, kind: &str) -> Value {
    let (body, respond) = expect(server, Method::PATCH, &format!("{path}{SSA}")).await;
    assert_eq!(body["kind"], kind);
    ok(respond, &stored(&body, kind));
    body
}

/// Answers the status write (a merge patch of the status alone) and returns the status.
async fn expect_status(server: &mut ApiServer, balancer: &Balancer) -> Value {
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
async fn expect_ready(server: &mut ApiServer) -> Value {
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
fn assert_status(
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

async fn expect_event(server: &mut ApiServer, reason: &str) -> Value {
    let (event, respond) = expect(server, Method::POST, EVENTS).await;
    assert_eq!(event["reason"], reason, "{event}");
    ok(respond, &event);
    event
}

#[tokio::test]
async fn first_reconcile_applies_every_child_in_order_then_the_status() {
    let (ctx, mut server, _caches) = context();
    let balancer = sample();
    let verifier = tokio::spawn(async move {
        for backend in ["v1", "v2", "v3"] {
            let service = expect_create(
                &mut server,
                &format!("/api/v1/namespaces/ns/services/example-balancer-{backend}-backend"),
                "Service",
            )
            .await;
            assert_eq!(service["spec"]["selector"], json!({"app": "test", "version": backend}));
            assert_eq!(service["metadata"]["ownerReferences"][0]["uid"], UID);
        }
        let config_map = expect_create(
            &mut server,
            "/api/v1/namespaces/ns/configmaps/example-balancer-proxy-configmap",
            "ConfigMap",
        )
        .await;
        let conf = config_map["data"]["nginx.conf"].as_str().unwrap();
        let v2 = "server 10.96.0.10:80 weight=20 max_fails=1 fail_timeout=10s;  # example-balancer-v2-backend";
        assert!(conf.contains(v2), "{conf}");
        expect_create(&mut server, "/apis/apps/v1/namespaces/ns/deployments/example-balancer-proxy", "Deployment")
            .await;
        expect_create(&mut server, "/api/v1/namespaces/ns/services/example-balancer", "Service").await;
        // One event tells of all six children.
        let event = expect_event(&mut server, "Created").await;
        assert_eq!(
            event["note"],
            "created Service example-balancer-v1-backend, Service example-balancer-v2-backend, \
             Service example-balancer-v3-backend, ConfigMap example-balancer-proxy-configmap, \
             Deployment example-balancer-proxy, Service example-balancer"
        );
        let status = expect_status(&mut server, &sample()).await;
        // The Deployment was just created: no pod yet.
        assert_status(
            &status,
            (0, 0),
            (3, 0),
            json!({"status": "False", "reason": "ProxyNotAvailable",
                   "message": "waiting for proxy Deployment example-balancer-proxy to roll out (0/1 available)"}),
        );
        // A new Balancer waiting for its pods is progress: no Warning event.
        expect_done(&mut server).await;
    });
    let action = reconcile(Arc::new(balancer.into()), ctx).await.expect("reconcile succeeds");
    assert_eq!(action, Action::requeue(controller::RESYNC));
    verifier.await.expect("the API server saw exactly the expected requests");
}

/// With the metrics sidecar, the proxy's own identity comes first (the pods' sidecars read the
/// ConfigMap with it), and the status says how many proxy pods serve the configuration.
#[tokio::test]
async fn with_the_sidecar_the_proxy_identity_is_created_before_the_config_map() {
    let (client, mut server) = mock_api::pair();
    let (children, _caches) = child_caches();
    let settings = ProxySettings { metrics_image: Some("registry.example.com/balancer:1".into()), ..settings() };
    let ctx = Arc::new(Context::new(client, children, settings, Metrics::default().controller));
    let verifier = tokio::spawn(async move {
        for backend in ["v1", "v2", "v3"] {
            let path = format!("/api/v1/namespaces/ns/services/example-balancer-{backend}-backend");
            expect_create(&mut server, &path, "Service").await;
        }
        let account = expect_create(
            &mut server,
            "/api/v1/namespaces/ns/serviceaccounts/example-balancer-proxy",
            "ServiceAccount",
        )
        .await;
        assert_eq!(account["automountServiceAccountToken"], false);
        let rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/ns";
        let role = expect_create(&mut server, &format!("{rbac}/roles/example-balancer-proxy"), "Role").await;
        assert_eq!(
            role["rules"],
            json!([{"apiGroups": [""], "resources": ["configmaps"],
                    "resourceNames": ["example-balancer-proxy-configmap"], "verbs": ["get", "list", "watch"]}])
        );
        expect_create(&mut server, &format!("{rbac}/rolebindings/example-balancer-proxy"), "RoleBinding").await;
        expect_create(&mut server, "/api/v1/namespaces/ns/configmaps/example-balancer-proxy-configmap", "ConfigMap")
            .await;
        let deployment =
            expect_create(&mut server, "/apis/apps/v1/namespaces/ns/deployments/example-balancer-proxy", "Deployment")
                .await;
        assert_eq!(deployment["spec"]["template"]["spec"]["serviceAccountName"], "example-balancer-proxy");
        expect_create(&mut server, "/api/v1/namespaces/ns/services/example-balancer", "Service").await;
        expect_event(&mut server, "Created").await;
        let status = expect_status(&mut server, &sample()).await;
        assert_eq!(status["configuredReplicas"], 0, "{status}");
        let programmed = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Programmed").cloned();
        let programmed = programmed.expect("a Programmed condition");
        assert_eq!((&programmed["status"], &programmed["reason"]), (&json!("False"), &json!("NoProxyPods")));
        expect_done(&mut server).await;
    });
    let action = reconcile(Arc::new(sample().into()), ctx).await.expect("reconcile succeeds");
    assert_eq!(action, Action::requeue(controller::RESYNC), "no pod yet: the slices' watch brings it back");
    verifier.await.expect("the API server saw exactly the expected requests");
}

#[tokio::test]
async fn a_converged_balancer_costs_one_status_write_then_nothing() {
    let (ctx, mut server, mut caches) = context();
    let balancer = sample();
    converged(&mut caches, &balancer);

    // Children match the caches: the only write is the status, now Ready.
    let verifier = tokio::spawn(async move {
        let status = expect_ready(&mut server).await;
        (status, server)
    });
    reconcile(Arc::new(balancer.clone().into()), ctx.clone()).await.expect("reconcile succeeds");
    let (status, mut server) = verifier.await.unwrap();

    // With that status stored, a second reconcile sends no request at all: any request
    // would block the reconcile until answered, and nothing answers now. Right after its own
    // write it looks again within the interval (the cache may not show the write yet).
    let mut settled = balancer;
    settled.status = Some(serde_json::from_value(status).unwrap());
    let action = tokio::time::timeout(Duration::from_secs(5), reconcile(Arc::new(settled.into()), ctx))
        .await
        .expect("a steady-state reconcile made an API request")
        .expect("reconcile succeeds");
    let interval = controller::READINESS_WRITE_INTERVAL.as_millis() as u64;
    assert!((1..=interval).any(|ms| action == Action::requeue(Duration::from_millis(ms))), "{action:?}");
    // The client is gone with the context, so the mock reports no request at all (None).
    server.assert_none_within(Duration::from_millis(50)).await;
}

#[tokio::test]
async fn a_hand_edited_config_map_is_reapplied() {
    let (ctx, mut server, mut caches) = context();
    let balancer = sample();
    converged(&mut caches, &balancer);
    let mut edited: ConfigMap = ctx.children.config_maps.state()[0].object().unwrap();
    edited.data.as_mut().unwrap().insert("nginx.conf".into(), "events {}\n".into());
    caches.config_maps.apply_watcher_event(&watcher::Event::Apply(Cached::of(&edited).unwrap()));
    let verifier = tokio::spawn(async move {
        let (body, respond) = expect(
            &mut server,
            Method::PATCH,
            &format!("/api/v1/namespaces/ns/configmaps/example-balancer-proxy-configmap{SSA}"),
        )
        .await;
        assert!(body["data"]["nginx.conf"].as_str().unwrap().contains("upstream port_80_tcp"));
        ok(respond, &body);
        let event = expect_event(&mut server, "Updated").await;
        assert_eq!(event["note"], "updated ConfigMap example-balancer-proxy-configmap");
        expect_ready(&mut server).await;
    });
    reconcile(Arc::new(balancer.into()), ctx).await.expect("reconcile succeeds");
    verifier.await.unwrap();
}

#[tokio::test]
async fn an_obsolete_backend_service_is_deleted() {
    let (ctx, mut server, mut caches) = context();
    let balancer = sample();
    converged(&mut caches, &balancer);
    // A Service for a backend "old" that the spec no longer names.
    let owner = Owner::of(&balancer).unwrap();
    let mut old_balancer = balancer.clone();
    old_balancer.spec.backends[0].name = "old".into();
    let old_spec = admitted(&old_balancer);
    let mut old = proxy::backend_service(&owner, &old_spec, &old_spec.backends[0]);
    old.metadata.uid = Some("old-uid".into());
    caches.services.apply_watcher_event(&watcher::Event::Apply(Cached::of(&old).unwrap()));

    let verifier = tokio::spawn(async move {
        let (body, respond) =
            expect(&mut server, Method::DELETE, "/api/v1/namespaces/ns/services/example-balancer-old-backend?").await;
        assert_eq!(body["preconditions"]["uid"], "old-uid", "deletes only the object it saw: {body}");
        ok(respond, &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}));
        let event = expect_event(&mut server, "Deleted").await;
        assert_eq!(event["related"]["name"], "example-balancer-old-backend");
        expect_ready(&mut server).await;
    });
    reconcile(Arc::new(balancer.into()), ctx).await.expect("reconcile succeeds");
    verifier.await.unwrap();
}

#[tokio::test]
async fn an_obsolete_backend_keeps_serving_until_the_proxy_has_rolled_out() {
    // No proxy pod available yet.
    obsolete_backend_kept_while(|status| status.available_replicas = Some(0)).await;
    // The new pod is not available yet, the old one still is (and still counted): the rollout
    // is not over, whatever `availableReplicas` says.
    obsolete_backend_kept_while(|status| {
        status.replicas = Some(2);
        status.updated_replicas = Some(1);
        status.available_replicas = Some(1);
    })
    .await;
}

async fn obsolete_backend_kept_while(rolling_status: fn(&mut DeploymentStatus)) {
    let (ctx, mut server, mut caches) = context();
    let balancer = sample();
    converged(&mut caches, &balancer);
    let mut rolling: Deployment = ctx.children.deployments.state()[0].object().unwrap();
    rolling_status(rolling.status.as_mut().unwrap());
    let status = rolling.status.clone().unwrap();
    caches.deployments.apply_watcher_event(&watcher::Event::Apply(Cached::of(&rolling).unwrap()));
    let owner = Owner::of(&balancer).unwrap();
    let mut old_balancer = balancer.clone();
    old_balancer.spec.backends[0].name = "old".into();
    let old_spec = admitted(&old_balancer);
    let old = proxy::backend_service(&owner, &old_spec, &old_spec.backends[0]);
    caches.services.apply_watcher_event(&watcher::Event::Apply(Cached::of(&old).unwrap()));
    let verifier = tokio::spawn(async move {
        // No DELETE: the status counts it as obsolete while the proxy rolls out.
        let written = expect_status(&mut server, &sample()).await;
        // The pods the Deployment reports, whether or not they are of the new template.
        let (replicas, ready) = (status.replicas.unwrap(), status.ready_replicas.unwrap());
        let available = status.available_replicas.unwrap();
        assert_status(
            &written,
            (replicas, ready),
            (3, 1),
            json!({"status": "False", "reason": "ProxyNotAvailable",
                   "message": format!("waiting for proxy Deployment example-balancer-proxy to roll out ({available}/1 available)")}),
        );
        expect_done(&mut server).await;
    });
    reconcile(Arc::new(balancer.into()), ctx).await.expect("reconcile succeeds");
    verifier.await.unwrap();
}

#[tokio::test]
async fn an_api_error_fails_the_reconcile_and_backs_off() {
    let (ctx, mut server, _caches) = context();
    let verifier = tokio::spawn(async move {
        let (_, respond) =
            expect(&mut server, Method::POST, "/api/v1/namespaces/ns/services?&fieldManager=balancer").await;
        let forbidden = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "services is forbidden: User \"balancer\" cannot create resource \"services\"",
            "reason": "Forbidden", "code": 403
        });
        respond.send_response(
            Response::builder()
                .status(StatusCode::FORBIDDEN)
                .body(Body::from(serde_json::to_vec(&forbidden).unwrap()))
                .unwrap(),
        );
        // The failure is recorded in the status, best effort: the proxy's pods as the
        // status said last (the Deployment was not looked at), the backends as the cache has them.
        let status = expect_status(&mut server, &sample()).await;
        let message = status["conditions"][0]["message"].as_str().unwrap().to_string();
        assert!(message.starts_with("cannot create Service example-balancer-v1-backend"), "{message}");
        assert!(message.contains("services is forbidden"), "{message}");
        let ready = json!({"status": "False", "reason": "ReconcileError", "message": message});
        assert_status(&status, (2, 1), (0, 0), ready);
        expect_event(&mut server, "ReconcileError").await;
    });
    let mut balancer = sample();
    // Reconciled here before (a Ready condition): no look for the Go operator's proxy.
    let ready: Condition =
        serde_json::from_value(json!({"type": "Ready", "status": "True", "reason": "ProxyAvailable",
        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}))
        .unwrap();
    let status =
        BalancerStatus { replicas: 2, ready_replicas: 1, conditions: vec![ready], ..BalancerStatus::default() };
    balancer.status = Some(status);
    let balancer = Arc::new(StoredBalancer::from(balancer));
    let error = reconcile(balancer.clone(), ctx.clone()).await.expect_err("reconcile fails");
    assert_eq!(error.kind(), ErrorKind::ApiError);
    verifier.await.unwrap();
    assert_eq!(error_policy(balancer.clone(), &error, ctx.clone()), Action::requeue(Duration::from_secs(1)));
    assert_eq!(error_policy(balancer.clone(), &error, ctx.clone()), Action::requeue(Duration::from_secs(2)));
    assert_eq!(error_policy(balancer, &error, ctx), Action::requeue(Duration::from_secs(4)));
}

#[tokio::test]
async fn an_invalid_spec_is_reported_and_builds_nothing() {
    let (ctx, mut server, _caches) = context();
    let mut balancer = sample();
    balancer.spec.replicas = Some(101);
    balancer.spec.backends[1].weight = Some(150);
    let verifier = tokio::spawn(async move {
        let status = expect_status(&mut server, &sample()).await;
        let message = "Balancer \"example-balancer\" is invalid: [spec.replicas: must be between 0 and 100, got 101, \
                       spec.backends[1].weight: must be between 0 and 100, got 150]";
        assert_status(&status, (0, 0), (0, 0), json!({"status": "False", "reason": "InvalidSpec", "message": message}));
        expect_event(&mut server, "InvalidSpec").await;
    });
    let action = reconcile(Arc::new(balancer.into()), ctx).await.expect("an invalid spec is not a reconcile error");
    assert_eq!(action, Action::await_change());
    verifier.await.unwrap();
}

/// A Balancer stored under a looser schema: its spec cannot be read, nothing is built, and
/// when the API server also refuses its status (it validates the whole object on a status
/// write), the problem is told through an event, without a retry loop.
#[tokio::test]
async fn an_unreadable_spec_is_reported_even_when_its_status_cannot_be_written() {
    let (ctx, mut server, _caches) = context();
    let mut object = serde_json::to_value(sample()).unwrap();
    object["spec"]["ports"][0]["targetPort"] = json!(3_000_000_000u64);
    let stored: StoredBalancer = serde_json::from_value(object).expect("any stored Balancer is readable");
    let verifier = tokio::spawn(async move {
        let (body, respond) = expect(&mut server, Method::PATCH, STATUS).await;
        let message = body["status"]["conditions"][0]["message"].as_str().unwrap().to_string();
        assert!(message.contains("spec.ports[0].targetPort: invalid value: integer `3000000000`"), "{message}");
        let ready = json!({"status": "False", "reason": "InvalidSpec", "message": message});
        assert_status(&body["status"], (0, 0), (0, 0), ready);
        // As kube-apiserver 1.20 refuses it: the whole object is validated on a status write.
        let refusal = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Balancer.exposer.hliangzhao.io \"example-balancer\" is invalid: spec.ports.targetPort: \
                        Invalid value: 3000000000: spec.ports.targetPort in body should be less than or equal to 65535",
            "reason": "Invalid", "code": 422,
            "details": {"name": "example-balancer", "group": "exposer.hliangzhao.io", "kind": "Balancer",
                "causes": [{"reason": "FieldValueInvalid", "field": "spec.ports.targetPort",
                            "message": "Invalid value: 3000000000: spec.ports.targetPort in body should be less than or equal to 65535"}]}});
        respond.send_response(
            Response::builder()
                .status(StatusCode::UNPROCESSABLE_ENTITY)
                .body(Body::from(serde_json::to_vec(&refusal).unwrap()))
                .unwrap(),
        );
        let event = expect_event(&mut server, "InvalidSpec").await;
        assert_eq!(event["type"], "Warning");
        assert_eq!(event["note"], message.as_str());
    });
    let action = reconcile(Arc::new(stored), ctx).await.expect("an unreadable spec is not a reconcile error");
    assert_eq!(action, Action::await_change());
    verifier.await.unwrap();
}

/// A hand-made object holds a child's name, unknown to the cache (it watches balancer's children
/// only, and may lag anyway): the POST is refused, the read shows whose it is, and nothing is
/// written to it; the conflict goes to the status.
#[tokio::test]
async fn a_namesake_not_owned_by_the_balancer_is_never_adopted() {
    let (ctx, mut server, _caches) = context();
    let verifier = tokio::spawn(async move {
        let path = "/api/v1/namespaces/ns/services/example-balancer-v1-backend";
        expect_create_refused(&mut server, path).await;
        let (_, respond) = expect(&mut server, Method::GET, path).await;
        let users = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "example-balancer-v1-backend", "namespace": "ns", "uid": "someone-else"},
            "spec": {"selector": {"app": "mine"}, "ports": [{"port": 8080}]}});
        ok(respond, &users);
        // No apply: the failure goes straight to the status.
        let status = expect_status(&mut server, &sample()).await;
        assert_status(
            &status,
            (0, 0),
            (0, 0),
            json!({"status": "False", "reason": "Conflict",
                   "message": "Service example-balancer-v1-backend already exists and is not controlled by this \
                               Balancer; rename or remove it"}),
        );
        expect_event(&mut server, "Conflict").await;
    });
    let error = reconcile(Arc::new(sample().into()), ctx).await.expect_err("a conflict fails the reconcile");
    assert_eq!(error.kind(), ErrorKind::Conflict);
    verifier.await.unwrap();
}

#[test]
fn the_object_ref_of_children_points_at_the_balancer() {
    let balancer = sample();
    let reference = balancer.controller_owner_ref(&()).unwrap();
    assert_eq!(reference.uid, UID);
    assert_eq!(reference.controller, Some(true));
}

/// Its own child whose label was removed by hand (so the cache lost it): the POST is refused, the
/// read shows it is this Balancer's, and it is applied again, which puts the label back, and told
/// as an update.
#[tokio::test]
async fn an_own_child_without_its_label_is_taken_back() {
    let (ctx, mut server, _caches) = context();
    let verifier = tokio::spawn(async move {
        for name in ["example-balancer-v1-backend", "example-balancer-v2-backend", "example-balancer-v3-backend"] {
            let path = format!("/api/v1/namespaces/ns/services/{name}");
            if !name.contains("-v1-") {
                expect_create(&mut server, &path, "Service").await;
                continue;
            }
            expect_create_refused(&mut server, &path).await;
            let (_, respond) = expect(&mut server, Method::GET, &path).await;
            let unlabelled = json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": "ns", "uid": "child-uid",
                             "managedFields": [{"manager": "balancer", "operation": "Apply", "apiVersion": "v1",
                                                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
                             "ownerReferences": [{"apiVersion": "exposer.hliangzhao.io/v1alpha1", "kind": "Balancer",
                                                  "name": NAME, "uid": UID, "controller": true}]},
                "spec": {"clusterIP": CLUSTER_IP}});
            ok(respond, &unlabelled);
            // Applied by balancer before (an Apply entry): nothing to take over first.
            let body = expect_apply(&mut server, &path, "Service").await;
            assert_eq!(body["metadata"]["labels"]["app.kubernetes.io/managed-by"], "balancer");
        }
        expect_create(&mut server, "/api/v1/namespaces/ns/configmaps/example-balancer-proxy-configmap", "ConfigMap")
            .await;
        expect_create(&mut server, "/apis/apps/v1/namespaces/ns/deployments/example-balancer-proxy", "Deployment")
            .await;
        expect_create(&mut server, "/api/v1/namespaces/ns/services/example-balancer", "Service").await;
        let event = expect_event(&mut server, "Created").await;
        let note = event["note"].as_str().unwrap();
        assert!(note.starts_with("created Service example-balancer-v2-backend, "), "{note}");
        assert!(note.ends_with("; updated Service example-balancer-v1-backend"), "{note}");
        let status = expect_status(&mut server, &sample()).await;
        assert_status(
            &status,
            (0, 0),
            (3, 0),
            json!({"status": "False", "reason": "ProxyNotAvailable",
                   "message": "waiting for proxy Deployment example-balancer-proxy to roll out (0/1 available)"}),
        );
        expect_done(&mut server).await;
    });
    reconcile(Arc::new(sample().into()), ctx).await.expect("reconcile succeeds");
    verifier.await.unwrap();
}

/// A child a POST created (its fields owned through balancer's `Update` entry) that must change:
/// before the apply, that entry is folded into balancer's `Apply` entry with a merge patch of
/// `managedFields` conditional on the resource version read, so that the apply can remove what
/// it no longer sets.
#[tokio::test]
async fn a_created_child_is_made_the_appliers_own_before_its_first_apply() {
    let (ctx, mut server, mut caches) = context();
    let balancer = sample();
    converged(&mut caches, &balancer);
    let mut edited: ConfigMap = ctx.children.config_maps.state()[0].object().unwrap();
    edited.data.as_mut().unwrap().insert("nginx.conf".into(), "events {}\n".into());
    let mut edited = serde_json::to_value(&edited).unwrap();
    let created = json!({"manager": "balancer", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                         "fieldsV1": {"f:data": {".": {}, "f:nginx.conf": {}}}});
    edited["metadata"]["managedFields"] = json!([created]);
    let edited: Cached<ConfigMap> = serde_json::from_value(edited).unwrap();
    assert!(edited.created_by_post());
    caches.config_maps.apply_watcher_event(&watcher::Event::Apply(edited));
    let verifier = tokio::spawn(async move {
        let path = "/api/v1/namespaces/ns/configmaps/example-balancer-proxy-configmap";
        let (_, respond) = expect(&mut server, Method::GET, path).await;
        let kubectl = json!({"manager": "kubectl", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                             "fieldsV1": {"f:data": {"f:nginx.conf": {}}}});
        ok(
            respond,
            &json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                    "metadata": {"name": "example-balancer-proxy-configmap", "namespace": "ns",
                                 "resourceVersion": "41", "managedFields": [created, kubectl]}}),
        );
        let (patch, respond) = expect(&mut server, Method::PATCH, &format!("{path}?")).await;
        let mut applied = created.clone();
        applied["operation"] = json!("Apply");
        assert_eq!(patch, json!({"metadata": {"resourceVersion": "41", "managedFields": [kubectl, applied]}}));
        ok(respond, &json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": {}}));
        expect_apply(&mut server, path, "ConfigMap").await;
        expect_event(&mut server, "Updated").await;
        expect_ready(&mut server).await;
    });
    reconcile(Arc::new(balancer.into()), ctx).await.expect("reconcile succeeds");
    verifier.await.unwrap();
}

/// A client whose requests go through the controller's throttle, over a mock API server.
fn throttled_context() -> (Arc<Context>, ApiServer, Arc<Metrics>) {
    let (ctx, server, metrics, _shutdown) = throttled_context_until_shutdown();
    (ctx, server, metrics)
}

/// [`throttled_context`], and the shutdown token its throttle obeys.
fn throttled_context_until_shutdown() -> (Arc<Context>, ApiServer, Arc<Metrics>, CancellationToken) {
    use tower::Layer;
    let (service, handle) = mock_api::service_pair();
    let metrics = Arc::new(Metrics::default());
    let shutdown = CancellationToken::new();
    let layer = ThrottleLayer::new(Rate { qps: 100.0, burst: 100 }, metrics.throttle.clone(), shutdown.clone());
    let client = Client::new(layer.layer(service), "default");
    let (children, _) = child_caches();
    (Arc::new(Context::new(client, children, settings(), metrics.controller.clone())), handle, metrics, shutdown)
}

fn too_many_requests(respond: Respond, retry_after: Option<u64>) {
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Too many requests, please try again later.", "reason": "TooManyRequests", "code": 429});
    let mut response = Response::builder().status(StatusCode::TOO_MANY_REQUESTS);
    if let Some(seconds) = retry_after {
        response = response.header("Retry-After", seconds.to_string());
    }
    respond.send_response(response.body(Body::from(serde_json::to_vec(&status).unwrap())).unwrap());
}

/// Four Balancers reconciled at once against an API server that answers every request 429
/// (Retry-After: 1): the whole controller waits out each answer, not just the request that got
/// it, so about one request a second reaches the server, where four reconciles retrying on their
/// own would send four times as many; and no reconcile spins.
#[tokio::test]
async fn a_burst_of_429s_slows_the_whole_controller_down() {
    let (ctx, mut server, metrics) = throttled_context();
    let reconciles: Vec<_> = (0..4)
        .map(|i| {
            let mut balancer = sample();
            balancer.metadata.name = Some(format!("b{i}"));
            balancer.metadata.uid = Some(format!("uid-{i}"));
            tokio::spawn(reconcile(Arc::new(balancer.into()), ctx.clone()))
        })
        .collect();
    let started = std::time::Instant::now();
    let mut arrivals = Vec::new();
    while started.elapsed() < Duration::from_millis(3500) {
        let left = Duration::from_millis(3500).saturating_sub(started.elapsed());
        let Some(received) = server.next_within(left).await else { break };
        arrivals.push(started.elapsed());
        too_many_requests(received.respond, Some(1));
    }
    for reconcile in &reconciles {
        reconcile.abort();
    }
    // The first wave: at most one request per reconcile, already on its way. Then nothing until
    // Retry-After has passed, for every reconcile; then one request per (growing) pause, since the
    // rate was halved and the first refusal pauses everybody again.
    let first_wave = arrivals.iter().filter(|t| **t < Duration::from_millis(100)).count();
    assert!((1..=4).contains(&first_wave), "{arrivals:?}");
    let paused = Duration::from_millis(100)..Duration::from_millis(950);
    assert!(!arrivals.iter().any(|t| paused.contains(t)), "a request did not wait out Retry-After: {arrivals:?}");
    assert!(arrivals.len() <= first_wave + 3, "{} requests in 3.5 s: {arrivals:?}", arrivals.len());
    let text = metrics.encode().unwrap();
    let refused = format!("balancer_api_overload_responses_total{{code=\"429\"}} {}", arrivals.len());
    assert!(text.contains(&refused), "{text}");
}

/// Without Retry-After, refusals of requests sent after a pause lengthen the next pause
/// (0.5 s, 1 s, 2 s …), and the first success ends the episode.
#[tokio::test]
async fn repeated_429s_without_retry_after_back_off_exponentially() {
    let (ctx, mut server, _metrics) = throttled_context();
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(ctx.client.clone(), NS);
    let get = tokio::spawn(async move { api.get("x").await });
    let started = std::time::Instant::now();
    let mut arrivals = Vec::new();
    for _ in 0..3 {
        let respond = server.next().await.respond;
        arrivals.push(started.elapsed());
        too_many_requests(respond, None);
    }
    let respond = server.next().await.respond;
    arrivals.push(started.elapsed());
    ok(respond, &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": NS}}));
    get.await.unwrap().expect("retried until it succeeds");
    let gaps: Vec<f64> = arrivals.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
    for (gap, want) in gaps.iter().zip([0.5, 1.0, 2.0]) {
        assert!(*gap >= want * 0.95 && *gap < want + 0.5, "pauses {gaps:?}, wanted 0.5, 1, 2 s");
    }
}

/// A pause of 30 s (Retry-After) ends as soon as shutdown begins: the request waiting it out
/// returns the refusal instead of retrying, and a new request is not held back, so the
/// reconciles in flight end within the 10 s drain (and a leader then releases its Lease).
#[tokio::test]
async fn shutdown_ends_a_pause_at_once() {
    let (ctx, mut server, _metrics, shutdown) = throttled_context_until_shutdown();
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(ctx.client.clone(), NS);
    let waiting = tokio::spawn({
        let api = api.clone();
        async move { api.get("x").await }
    });
    too_many_requests(server.next().await.respond, Some(30));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "the refused request waits out the pause");
    let cancelled = std::time::Instant::now();
    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(2), waiting).await.expect("the wait ended").unwrap();
    assert!(matches!(result, Err(kube::Error::Api(status)) if status.code == 429));
    // A request made during shutdown goes out at once, pause or not.
    let late = tokio::spawn(async move { api.get("y").await });
    let respond = server.next_within(Duration::from_secs(2)).await.expect("not held back by the pause").respond;
    ok(respond, &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "y", "namespace": NS}}));
    late.await.unwrap().expect("answered");
    assert!(cancelled.elapsed() < Duration::from_secs(3));
}

/// A repeat of one event is counted into its series (one PATCH), not created again, and the
/// publisher remembers only its name and count.
#[tokio::test]
async fn a_repeated_event_is_folded_into_its_series() {
    use balancer::runtime::events::{EventType, Events, Note, Published};
    let (client, mut server) = mock_api::pair();
    let events = Events::new(client, "balancer");
    let regarding = sample().object_ref(&());
    let verifier = tokio::spawn(async move {
        let (event, respond) = expect(&mut server, Method::POST, EVENTS).await;
        assert_eq!((event["reason"].as_str(), event["type"].as_str()), (Some("Updated"), Some("Normal")));
        let name = event["metadata"]["name"].as_str().unwrap().to_string();
        ok(respond, &event);
        let path = format!("/apis/events.k8s.io/v1/namespaces/ns/events/{name}?");
        let (patch, respond) = expect(&mut server, Method::PATCH, &path).await;
        assert_eq!(patch["series"]["count"], 2, "{patch}");
        ok(respond, &event);
    });
    for _ in 0..2 {
        let note = Note::new(EventType::Normal, Reason::Updated, "updated ConfigMap x");
        assert_eq!(events.publish(&regarding, note).await.unwrap(), Published::Sent);
    }
    verifier.await.unwrap();
}

/// `kubectl scale bal/example-balancer --replicas=3` (or an HPA) sets `spec.replicas`: the
/// proxy Deployment is applied again with 3 replicas, and the status reports the pods the
/// Deployment has while it scales (the scale subresource's `status.replicas`).
#[tokio::test]
async fn scaling_a_balancer_scales_its_proxy_deployment() {
    let (ctx, mut server, mut caches) = context();
    let mut balancer = sample();
    converged(&mut caches, &balancer);
    balancer.spec.replicas = Some(3);
    let verifier = tokio::spawn(async move {
        let path = "/apis/apps/v1/namespaces/ns/deployments/example-balancer-proxy";
        let (body, respond) = expect(&mut server, Method::PATCH, &format!("{path}{SSA}")).await;
        assert_eq!(body["spec"]["replicas"], 3, "{body}");
        // As the API server answers: the new generation, not yet observed, the old pod still there.
        let mut stored = body.clone();
        stored["metadata"]["generation"] = json!(2);
        stored["status"] = json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                                  "readyReplicas": 1, "availableReplicas": 1});
        ok(respond, &stored);
        // More than one pod: a budget lets a drain take one at a time.
        let path = "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/example-balancer-proxy";
        let budget = expect_create(&mut server, path, "PodDisruptionBudget").await;
        assert_eq!(
            budget["spec"],
            json!({"maxUnavailable": 1, "selector": {"matchLabels": {
            "app.kubernetes.io/component": "proxy", "balancer.exposer.hliangzhao.io/balancer-name": NAME}}})
        );
        assert_eq!(budget["metadata"]["ownerReferences"][0]["uid"], UID);
        let event = expect_event(&mut server, "Created").await;
        assert_eq!(
            event["note"],
            "created PodDisruptionBudget example-balancer-proxy; updated Deployment example-balancer-proxy"
        );
        let status = expect_status(&mut server, &sample()).await;
        assert_status(
            &status,
            (1, 1),
            (3, 0),
            json!({"status": "False", "reason": "ProxyNotAvailable",
                   "message": "waiting for proxy Deployment example-balancer-proxy to roll out (1/3 available)"}),
        );
        expect_done(&mut server).await;
    });
    reconcile(Arc::new(balancer.into()), ctx).await.expect("reconcile succeeds");
    verifier.await.unwrap();
}

/// A Balancer without `spec.replicas` (stored before the mutating webhook wrote it) gets the
/// operator's default, not the Deployment's own default of 1.
#[tokio::test]
async fn a_balancer_without_replicas_gets_the_operators_default() {
    let (client, mut server) = mock_api::pair();
    let (children, _caches) = child_caches();
    let settings = ProxySettings { policy: SpecPolicy { replicas: 4, ..SpecPolicy::default() }, ..settings() };
    let ctx = Arc::new(Context::new(client, children, settings, Metrics::default().controller));
    let balancer = sample();
    assert_eq!(balancer.spec.replicas, None);
    let verifier = tokio::spawn(async move {
        for backend in ["v1", "v2", "v3"] {
            let path = format!("/api/v1/namespaces/ns/services/example-balancer-{backend}-backend");
            expect_create(&mut server, &path, "Service").await;
        }
        let path = "/api/v1/namespaces/ns/configmaps/example-balancer-proxy-configmap";
        expect_create(&mut server, path, "ConfigMap").await;
        let path = "/apis/apps/v1/namespaces/ns/deployments/example-balancer-proxy";
        let deployment = expect_create(&mut server, path, "Deployment").await;
        assert_eq!(deployment["spec"]["replicas"], 4);
        let path = "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/example-balancer-proxy";
        expect_create(&mut server, path, "PodDisruptionBudget").await;
        expect_create(&mut server, "/api/v1/namespaces/ns/services/example-balancer", "Service").await;
        expect_event(&mut server, "Created").await;
        let status = expect_status(&mut server, &sample()).await;
        assert_status(
            &status,
            (0, 0),
            (3, 0),
            json!({"status": "False", "reason": "ProxyNotAvailable",
                   "message": "waiting for proxy Deployment example-balancer-proxy to roll out (0/4 available)"}),
        );
        expect_done(&mut server).await;
    });
    reconcile(Arc::new(balancer.into()), ctx).await.expect("reconcile succeeds");
    verifier.await.unwrap();
}

/// Scaled to zero: nothing to wait for, and nothing serves; `Ready` says so rather than
/// "waiting for the rollout" forever.
#[tokio::test]
async fn a_balancer_scaled_to_zero_is_not_ready_and_says_why() {
    let (ctx, mut server, mut caches) = context();
    let mut balancer = sample();
    balancer.spec.replicas = Some(0);
    converged(&mut caches, &balancer);
    let verifier = tokio::spawn(async move {
        let status = expect_status(&mut server, &sample()).await;
        assert_status(
            &status,
            (0, 0),
            (3, 0),
            json!({"status": "False", "reason": "ScaledToZero",
                   "message": "proxy Deployment example-balancer-proxy is scaled to zero: no traffic is served"}),
        );
        let event = expect_event(&mut server, "ScaledToZero").await;
        assert_eq!(event["type"], "Warning");
    });
    reconcile(Arc::new(balancer.into()), ctx).await.expect("reconcile succeeds");
    verifier.await.unwrap();
}

/// After the upgrade from the v1alpha1-only release, the children in the caches point at
/// their Balancer as `exposer.hliangzhao.io/v1alpha1`: still its children (the uid is what
/// counts), re-applied once with the storage version in their owner reference, in one event.
#[tokio::test]
async fn children_of_the_v1alpha1_release_are_taken_over_once() {
    let (ctx, mut server, mut caches) = context();
    let balancer = sample();
    converged(&mut caches, &balancer);
    let old_reference = |meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        for reference in meta.owner_references.iter_mut().flatten() {
            reference.api_version = "exposer.hliangzhao.io/v1alpha1".into();
        }
    };
    for service in ctx.children.services.state() {
        let mut service = service.as_ref().clone();
        old_reference(service.meta_mut());
        caches.services.apply_watcher_event(&watcher::Event::Apply(service));
    }
    let mut config_map = ctx.children.config_maps.state()[0].as_ref().clone();
    old_reference(config_map.meta_mut());
    caches.config_maps.apply_watcher_event(&watcher::Event::Apply(config_map));
    let mut deployment = ctx.children.deployments.state()[0].as_ref().clone();
    old_reference(deployment.meta_mut());
    caches.deployments.apply_watcher_event(&watcher::Event::Apply(deployment));

    let verifier = tokio::spawn(async move {
        let mut paths: Vec<String> = ["v1", "v2", "v3"]
            .iter()
            .map(|b| format!("/api/v1/namespaces/ns/services/example-balancer-{b}-backend"))
            .collect();
        paths.push("/api/v1/namespaces/ns/configmaps/example-balancer-proxy-configmap".into());
        paths.push("/apis/apps/v1/namespaces/ns/deployments/example-balancer-proxy".into());
        paths.push("/api/v1/namespaces/ns/services/example-balancer".into());
        let kinds = ["Service", "Service", "Service", "ConfigMap", "Deployment", "Service"];
        for (path, kind) in paths.iter().zip(kinds) {
            // Known from the caches: no read first, an apply.
            let (body, respond) = expect(&mut server, Method::PATCH, &format!("{path}{SSA}")).await;
            assert_eq!(body["kind"], kind);
            assert_eq!(body["metadata"]["ownerReferences"][0]["apiVersion"], "exposer.hliangzhao.io/v1beta1");
            assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], UID);
            let mut stored = body.clone();
            if kind == "Service" {
                stored["spec"]["clusterIP"] = json!(CLUSTER_IP);
            }
            if kind == "Deployment" {
                stored["metadata"]["generation"] = json!(1);
                stored["status"] = json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                                          "readyReplicas": 1, "availableReplicas": 1});
            }
            ok(respond, &stored);
        }
        let event = expect_event(&mut server, "Updated").await;
        let note = event["note"].as_str().unwrap();
        assert!(note.starts_with("updated Service example-balancer-v1-backend, "), "{note}");
        assert!(note.ends_with("Deployment example-balancer-proxy, Service example-balancer"), "{note}");
        expect_ready(&mut server).await;
    });
    reconcile(Arc::new(balancer.into()), ctx).await.expect("reconcile succeeds");
    verifier.await.unwrap();
}

/// A Balancer the Go operator ran (a status with counts, no condition): one look for its proxy
/// Deployment `<name>proxy`; controlled by this Balancer, it keeps serving: the front Service
/// selects both proxies' pods while this operator's rolls out, and the status says so.
#[tokio::test]
async fn the_go_operators_proxy_serves_until_ours_is_available() {
    let (ctx, mut server, _caches) = context();
    let verifier = tokio::spawn(async move {
        let path = "/apis/apps/v1/namespaces/ns/deployments/example-balancerproxy";
        let (_, respond) = expect(&mut server, Method::GET, path).await;
        ok(
            respond,
            &json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": {
                "name": "example-balancerproxy", "namespace": NS, "uid": "go-proxy",
                "ownerReferences": [{"apiVersion": "exposer.hliangzhao.io/v1alpha1", "kind": "Balancer",
                                     "name": NAME, "uid": UID, "controller": true}]}}),
        );
        for backend in ["v1", "v2", "v3"] {
            let path = format!("/api/v1/namespaces/ns/services/example-balancer-{backend}-backend");
            expect_create(&mut server, &path, "Service").await;
        }
        expect_create(&mut server, "/api/v1/namespaces/ns/configmaps/example-balancer-proxy-configmap", "ConfigMap")
            .await;
        expect_create(&mut server, "/apis/apps/v1/namespaces/ns/deployments/example-balancer-proxy", "Deployment")
            .await;
        let front = expect_create(&mut server, "/api/v1/namespaces/ns/services/example-balancer", "Service").await;
        assert_eq!(
            front["spec"]["selector"],
            json!({"balancer.exposer.hliangzhao.io/balancer-name": NAME}),
            "both proxies' pods"
        );
        expect_event(&mut server, "Created").await;
        let status = expect_status(&mut server, &sample()).await;
        let takeover =
            status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "GoOperatorProxy").cloned();
        let takeover = takeover.expect("the takeover's condition");
        assert_eq!((takeover["status"].as_str(), takeover["reason"].as_str()), (Some("True"), Some("Serving")));
        assert_eq!(
            takeover["message"],
            "the Go operator's proxy Deployment example-balancerproxy serves alongside example-balancer-proxy until it is available"
        );
        expect_done(&mut server).await;
    });
    let mut balancer = sample();
    balancer.status = Some(BalancerStatus { active_backends: 3, ..BalancerStatus::default() });
    reconcile(Arc::new(balancer.into()), ctx).await.expect("reconcile succeeds");
    verifier.await.unwrap();
}

/// Back to one proxy pod: the budget goes (only this Balancer's own, by UID), and says so.
#[tokio::test]
async fn scaling_down_to_one_pod_deletes_the_disruption_budget() {
    let (ctx, mut server, mut caches) = context();
    let balancer = sample();
    converged(&mut caches, &balancer);
    let owner = Owner::of(&balancer).unwrap();
    let mut budget = serde_json::to_value(proxy::proxy_disruption_budget(&owner)).unwrap();
    budget["metadata"]["uid"] = json!("budget-uid");
    caches.budgets.apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(budget).unwrap()));
    let verifier = tokio::spawn(async move {
        let path = "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/example-balancer-proxy?";
        let (body, respond) = expect(&mut server, Method::DELETE, path).await;
        assert_eq!(body["preconditions"]["uid"], "budget-uid", "{body}");
        ok(respond, &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}));
        let event = expect_event(&mut server, "Deleted").await;
        assert_eq!(event["note"], "deleted PodDisruptionBudget example-balancer-proxy: the proxy has one pod at most");
        expect_ready(&mut server).await;
        expect_done(&mut server).await;
    });
    reconcile(Arc::new(balancer.into()), ctx).await.expect("reconcile succeeds");
    verifier.await.unwrap();
}

/// The backend Services' EndpointSlices as the EndpointSlice controller writes them for a
/// dual-stack Service: an IPv4 and an IPv6 slice, each listing the same `ready` pods of each
/// backend named (and one terminating pod, which does not count).
fn endpoint_slices(caches: &mut Caches, ready: &[(&str, usize)]) {
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

#[tokio::test]
async fn each_backend_shows_its_ready_endpoints_and_share_and_the_missing_one_is_named() {
    let (ctx, mut server, mut caches) = context();
    let balancer = sample();
    converged(&mut caches, &balancer);
    endpoint_slices(&mut caches, &[("v1", 2), ("v2", 0), ("v3", 1)]);
    let verifier = tokio::spawn(async move {
        let status = expect_status(&mut server, &sample()).await;
        expect_event(&mut server, "ProxyAvailable").await;
        status
    });
    reconcile(Arc::new(balancer.into()), ctx).await.expect("reconcile succeeds");
    let status = verifier.await.unwrap();
    assert_eq!(
        status["backends"],
        json!([{"name": "v1", "weight": 40, "readyEndpoints": 2, "share": 50},
               {"name": "v2", "weight": 20, "readyEndpoints": 0, "share": 0},
               {"name": "v3", "weight": 40, "readyEndpoints": 1, "share": 50}])
    );
    assert_eq!(status["backendsReady"], "2/3");
    let available = &status["conditions"][1];
    assert_eq!((&available["type"], &available["status"]), (&json!("BackendsAvailable"), &json!("False")));
    assert_eq!(available["message"], "no ready endpoint behind v2; their share goes to the other backends");
    assert_eq!(status["conditions"][0]["status"], "True", "Ready still means the proxy serves");
}

/// A pod flapping behind a backend costs at most one status write per interval: a change of
/// readiness alone, just after a write, waits (no request) and comes back when it may be
/// written.
#[tokio::test]
async fn a_change_of_readiness_alone_just_after_a_write_waits_for_the_interval() {
    let (ctx, mut server, mut caches) = context();
    let balancer = sample();
    converged(&mut caches, &balancer);
    endpoint_slices(&mut caches, &[("v1", 1), ("v2", 1), ("v3", 1)]);
    let verifier = tokio::spawn(async move {
        let status = expect_status(&mut server, &sample()).await;
        expect_event(&mut server, "ProxyAvailable").await;
        (status, server)
    });
    reconcile(Arc::new(balancer.clone().into()), ctx.clone()).await.expect("reconcile succeeds");
    let (status, mut server) = verifier.await.unwrap();
    assert_eq!(status["backendsReady"], "3/3");
    assert_eq!(status["conditions"][1]["status"], "True");

    endpoint_slices(&mut caches, &[("v2", 0)]);
    let mut settled = balancer;
    settled.status = Some(serde_json::from_value(status).unwrap());
    let action = tokio::time::timeout(Duration::from_secs(5), reconcile(Arc::new(settled.into()), ctx))
        .await
        .expect("a held status write made an API request")
        .expect("reconcile succeeds");
    let interval = controller::READINESS_WRITE_INTERVAL.as_millis() as u64;
    let held = (1..=interval).any(|ms| action == Action::requeue(Duration::from_millis(ms)));
    assert!(held, "{action:?}: not requeued within the interval");
    server.assert_none_within(Duration::from_millis(50)).await;
}

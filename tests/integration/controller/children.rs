//! Each child applied in order, kept as the spec says, taken back when edited, never adopted
//! when it is another's, and deleted once obsolete.

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use balancer::controller::{self, Cached, Context, ErrorKind, reconcile};
use balancer::manager::Metrics;
use balancer::proxy::{self, Owner, ProxySettings};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use serde_json::json;

use super::harness::{
    ApiServer, CLUSTER_IP, NAME, SSA, UID, admitted, assert_status, child_caches, context, converged, expect,
    expect_apply, expect_create, expect_create_refused, expect_done, expect_event, expect_ready, expect_status, sample,
    settings,
};
use crate::support::mock_api::{self, ok};

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
        let [account, role, deployment] = expect_children_with_the_sidecar(&mut server).await;
        assert_eq!(account["automountServiceAccountToken"], false);
        assert_eq!(
            role["rules"],
            json!([{"apiGroups": [""], "resources": ["configmaps"],
                    "resourceNames": ["example-balancer-proxy-configmap"], "verbs": ["get", "list", "watch"]}])
        );
        assert_eq!(deployment["spec"]["template"]["spec"]["serviceAccountName"], "example-balancer-proxy");
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

/// A new Balancer's children as the first reconcile creates them with the metrics sidecar, in
/// order: the backend Services, the proxy identity, the ConfigMap, the Deployment and the front
/// Service. Returns the bodies of the ServiceAccount, the Role and the Deployment.
async fn expect_children_with_the_sidecar(server: &mut ApiServer) -> [serde_json::Value; 3] {
    for backend in ["v1", "v2", "v3"] {
        let path = format!("/api/v1/namespaces/ns/services/example-balancer-{backend}-backend");
        expect_create(server, &path, "Service").await;
    }
    let account =
        expect_create(server, "/api/v1/namespaces/ns/serviceaccounts/example-balancer-proxy", "ServiceAccount").await;
    let rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/ns";
    let role = expect_create(server, &format!("{rbac}/roles/example-balancer-proxy"), "Role").await;
    expect_create(server, &format!("{rbac}/rolebindings/example-balancer-proxy"), "RoleBinding").await;
    expect_create(server, "/api/v1/namespaces/ns/configmaps/example-balancer-proxy-configmap", "ConfigMap").await;
    let deployment =
        expect_create(server, "/apis/apps/v1/namespaces/ns/deployments/example-balancer-proxy", "Deployment").await;
    expect_create(server, "/api/v1/namespaces/ns/services/example-balancer", "Service").await;
    [account, role, deployment]
}

/// The reconcile never asks a proxy pod's sidecar (the prober does, outside the reconcile
/// workers): with a proxy pod whose sidecar would never answer, the reconcile makes no
/// connection to it, and the status counts it as not serving yet.
#[tokio::test]
async fn a_reconcile_never_waits_for_a_proxy_pods_sidecar() {
    // A "pod" on a loopback address of its own whose sidecar accepts and never answers.
    let pod = "127.0.0.77";
    let sidecar = tokio::net::TcpListener::bind((pod, 9113)).await.expect("the sidecar's port");
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = sidecar.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(stream);
        }
    });
    let (client, mut server) = mock_api::pair();
    let (children, caches) = child_caches();
    let slice: balancer::controller::ReadySlice = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": format!("{NAME}-front"), "namespace": "ns",
                     "labels": {"kubernetes.io/service-name": NAME, proxy::BALANCER_NAME_LABEL: NAME,
                                proxy::COMPONENT_LABEL: proxy::COMPONENT_FRONTEND}},
        "endpoints": [{"addresses": [pod], "conditions": {"ready": true, "serving": true, "terminating": false},
                       "targetRef": {"kind": "Pod", "namespace": "ns", "name": format!("{NAME}-proxy-7d9c-x2p4q")}}],
        "ports": [{"port": 80, "protocol": "TCP"}]
    }))
    .expect("an EndpointSlice");
    caches.endpoint_slices.apply(&watcher::Event::Apply(slice));
    let settings = ProxySettings { metrics_image: Some("registry.example.com/balancer:1".into()), ..settings() };
    let ctx = Arc::new(Context::new(client, children, settings, Metrics::default().controller));
    let verifier = tokio::spawn(async move {
        expect_children_with_the_sidecar(&mut server).await;
        expect_event(&mut server, "Created").await;
        let status = expect_status(&mut server, &sample()).await;
        let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
        let programmed = conditions.into_iter().find(|c| c["type"] == "Programmed").expect("a Programmed condition");
        expect_done(&mut server).await;
        (status["configuredReplicas"].clone(), programmed)
    });
    reconcile(Arc::new(sample().into()), ctx).await.expect("reconcile succeeds");
    let (configured, programmed) = verifier.await.expect("the API server saw exactly the expected requests");
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0, "the reconcile connected to the sidecar");
    assert_eq!(configured, 0);
    assert_eq!(
        (&programmed["status"], &programmed["reason"], &programmed["message"]),
        (&json!("False"), &json!("Applying"), &json!("0 of 1 proxy pods serve the current configuration"))
    );
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

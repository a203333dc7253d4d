//! Taking over from the Go operator and from the v1alpha1 release, once and without a gap.

use std::sync::Arc;

use axum::http::Method;
use balancer::api::BalancerStatus;
use balancer::controller::reconcile;
use kube::Resource;
use kube::runtime::watcher;
use serde_json::json;

use super::harness::{
    CLUSTER_IP, NAME, NS, SSA, UID, context, converged, expect, expect_create, expect_done, expect_event, expect_ready,
    expect_status, sample,
};
use crate::support::mock_api::ok;

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

//! `spec.replicas` (the scale subresource), the operator's default, zero, and the disruption
//! budget that follows the count.

use std::sync::Arc;

use axum::http::Method;
use balancer::controller::{Context, reconcile};
use balancer::manager::Metrics;
use balancer::proxy::{self, Owner, ProxySettings};
use balancer::spec::SpecPolicy;
use kube::runtime::watcher;
use serde_json::json;

use super::harness::{
    NAME, SSA, UID, assert_status, child_caches, context, converged, expect, expect_create, expect_done, expect_event,
    expect_ready, expect_status, sample, settings,
};
use crate::support::mock_api::{self, ok};

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

//! A reconcile that fails, or a spec that cannot be served: reported in the status (or an
//! event), with nothing built from an invalid spec.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, Response, StatusCode};
use balancer::api::BalancerStatus;
use balancer::controller::StoredBalancer;
use balancer::controller::{ErrorKind, error_policy, reconcile};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::client::Body;
use kube::runtime::controller::Action;
use serde_json::json;

use super::harness::{STATUS, assert_status, context, expect, expect_event, expect_status, sample};

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

/// A stored Balancer that a newly configured scheduling policy refuses is reported on itself,
/// naming the field, and nothing of it is written: its running proxy is left as it was.
#[tokio::test]
async fn a_stored_balancer_outside_a_new_scheduling_policy_is_reported_and_its_proxy_left_alone() {
    use balancer::api::v1beta1::ProxySpec;
    use balancer::controller::Context;
    use balancer::manager::Metrics;
    use balancer::proxy::ProxySettings;
    use balancer::spec::{SchedulingPolicy, SpecPolicy};
    let (client, mut server) = crate::support::mock_api::pair();
    let (children, _caches) = super::harness::child_caches();
    let scheduling =
        SchedulingPolicy { priority_classes: Some(vec!["balancer-proxy".into()]), ..SchedulingPolicy::ANY };
    let settings = super::harness::settings();
    let settings = ProxySettings { policy: SpecPolicy { scheduling, ..settings.policy.clone() }, ..settings };
    let ctx = Arc::new(Context::new(client, children, settings, Metrics::default().controller));
    let mut balancer = sample();
    balancer.spec.proxy =
        Some(ProxySpec { priority_class_name: Some("system-node-critical".into()), ..ProxySpec::default() });
    let verifier = tokio::spawn(async move {
        let status = expect_status(&mut server, &sample()).await;
        let message = "Balancer \"example-balancer\" is invalid: spec.proxy.priorityClassName: is not one of the \
                       priority classes the operator allows (--allowed-priority-classes): \"balancer-proxy\"; got \
                       \"system-node-critical\"";
        assert_status(&status, (0, 0), (0, 0), json!({"status": "False", "reason": "InvalidSpec", "message": message}));
        expect_event(&mut server, "InvalidSpec").await;
    });
    let action = reconcile(Arc::new(balancer.into()), ctx).await.expect("a refused spec is not a reconcile error");
    assert_eq!(action, Action::await_change());
    verifier.await.unwrap();
}

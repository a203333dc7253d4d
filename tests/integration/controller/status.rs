//! What the status and events report: each backend's ready endpoints and share, when a change
//! of readiness alone is written, and repeated events folded into a series.

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use balancer::controller::{self, Reason, reconcile};
use kube::Resource;
use kube::runtime::controller::Action;
use serde_json::json;

use super::harness::{EVENTS, context, converged, endpoint_slices, expect, expect_event, expect_status, sample};
use crate::support::mock_api::{self, ok};

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

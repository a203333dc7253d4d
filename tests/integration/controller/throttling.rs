//! The API server's 429s slow the whole controller down, and shutdown ends a pause at once.

use std::sync::Arc;
use std::time::Duration;

use balancer::controller::reconcile;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;

use super::harness::{NS, sample, throttled_context, throttled_context_until_shutdown, too_many_requests};
use crate::support::mock_api::ok;

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

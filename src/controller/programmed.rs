//! Which proxy pods serve a Balancer's current configuration. With live configuration (see
//! [`reload`](crate::proxy::reload)) a change reaches running pods without a rollout, so the
//! Deployment cannot tell; each pod's metrics sidecar can: the controller asks it
//! ([`CONFIG_PATH`] on the pod network) which configuration nginx serves.
//!
//! The pods are the front Service's endpoints that are not terminating, from its
//! EndpointSlices, which the controller already watches: it reads no pod.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use super::conditions::{ConditionType, Finding};
use super::reasons::Reason;
use super::sidecar;
use super::stored::StoredBalancer;
use crate::api::ConditionStatus;
use crate::proxy::nginx::config_hash;
use crate::proxy::reload::{CONFIG_PATH, short_id};

/// The most of an answer read: 16 hex digits and a newline.
const MAX_ANSWER_BYTES: usize = 64;

/// How many of the proxy pods serve the current configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Programmed {
    /// Pods whose sidecar says they serve it.
    pub serving: usize,
    /// Pods that are not terminating.
    pub pods: usize,
}

impl Programmed {
    /// Every pod serves it (and there is one).
    pub(super) fn all(self) -> bool {
        self.pods > 0 && self.serving == self.pods
    }

    /// The `Programmed` condition: `True` once every proxy pod serves the current configuration.
    pub(super) fn condition(self, balancer: &StoredBalancer, now: Timestamp) -> Condition {
        let Programmed { serving, pods } = self;
        let (status, reason, message) = match (self.all(), pods) {
            (true, _) => (
                ConditionStatus::True,
                Reason::Applied,
                format!("all {pods} proxy pods serve the current configuration"),
            ),
            (false, 0) => (ConditionStatus::False, Reason::NoProxyPods, "no proxy pod is running".to_string()),
            (false, _) => (
                ConditionStatus::False,
                Reason::Applying,
                format!("{serving} of {pods} proxy pods serve the current configuration"),
            ),
        };
        Finding { type_: ConditionType::Programmed, status, reason, message: &message }.replacing(balancer, now)
    }
}

/// The short id a sidecar gives for `nginx_conf` (see [`CONFIG_PATH`]).
pub(super) fn config_id(nginx_conf: &str) -> String {
    short_id(&config_hash(nginx_conf)).to_string()
}

/// What each pod's sidecar said it serves; `None` for a pod that said nothing in time.
pub(super) type Answers = Vec<(IpAddr, Option<String>)>;

/// Asks the sidecar of every pod at `addresses` (on `port`) which configuration it serves,
/// [`ASKED_PER_BALANCER`](sidecar::ASKED_PER_BALANCER) at a time; a pod that does not answer in time says nothing (`None`).
pub(super) async fn ask(addresses: &[IpAddr], port: u16) -> Answers {
    sidecar::ask_each(addresses, port, served_by).await
}

/// The id the sidecar at `address` gives; `None` when it gives none in time.
async fn served_by(address: SocketAddr) -> Option<String> {
    let body = sidecar::get(address, CONFIG_PATH, MAX_ANSWER_BYTES).await?;
    Some(std::str::from_utf8(&body).ok()?.trim().to_string())
}

/// When a reconcile looks again while some proxy pods do not serve the configuration they have
/// been taking up `since`: often at first, since nginx applies a change within a second, then
/// seldom (a pod whose sidecar cannot reach the API server, say).
pub(super) fn recheck(since: Timestamp, now: Timestamp) -> Duration {
    let waited = now.duration_since(since).unsigned_abs();
    if waited < FAST_RECHECK_FOR { FAST_RECHECK } else { SLOW_RECHECK }
}

/// How often to look while a change is being applied, and for how long.
const FAST_RECHECK: Duration = Duration::from_millis(250);
const FAST_RECHECK_FOR: Duration = Duration::from_secs(30);
/// How often after that.
const SLOW_RECHECK: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::routing::get;

    use super::*;

    /// A sidecar on loopback that says it serves `id`; its port.
    async fn sidecar(id: &'static str) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = listener.local_addr().expect("an address").port();
        let router = Router::new().route(CONFIG_PATH, get(move || async move { format!("{id}\n") }));
        tokio::spawn(async move { axum::serve(listener, router).await });
        port
    }

    #[tokio::test]
    async fn each_sidecar_says_which_configuration_its_pod_serves() {
        let current = config_id("stream {}\n");
        let serving = sidecar(Box::leak(current.clone().into_boxed_str())).await;
        let pod = IpAddr::from([127, 0, 0, 1]);
        assert_eq!(ask(&[pod], serving).await, vec![(pod, Some(current))]);
        let stale = sidecar("0123456789abcdef").await;
        assert_eq!(ask(&[pod], stale).await, vec![(pod, Some("0123456789abcdef".to_string()))]);
        // Nothing listens there: a pod whose sidecar does not answer says nothing.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = closed.local_addr().expect("an address").port();
        drop(closed);
        assert_eq!(ask(&[pod], port).await, vec![(pod, None)]);
    }

    #[tokio::test]
    async fn a_sidecar_that_never_answers_costs_at_most_the_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = listener.local_addr().expect("an address").port();
        // Accepts, then says nothing.
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let started = std::time::Instant::now();
        let pod = IpAddr::from([127, 0, 0, 1]);
        assert_eq!(ask(&[pod], port).await, vec![(pod, None)]);
        assert!(started.elapsed() < sidecar::ANSWER_TIMEOUT + Duration::from_millis(500), "{:?}", started.elapsed());
    }

    #[test]
    fn a_change_is_looked_at_often_for_its_first_30_seconds_then_seldom() {
        let since = Timestamp::UNIX_EPOCH;
        let after = |seconds: i64| recheck(since, since + k8s_openapi::jiff::SignedDuration::from_secs(seconds));
        assert_eq!((after(0), after(29)), (FAST_RECHECK, FAST_RECHECK));
        assert_eq!((after(30), after(3600)), (SLOW_RECHECK, SLOW_RECHECK));
    }

    #[test]
    fn programmed_once_every_pod_serves_it() {
        let balancer = StoredBalancer {
            metadata: Default::default(),
            spec: Err(crate::spec::FieldError::new("spec", "not read here")),
            status: None,
        };
        let now = Timestamp::UNIX_EPOCH;
        let condition = |serving, pods| Programmed { serving, pods }.condition(&balancer, now);
        let all = condition(2, 2);
        assert_eq!((all.status.as_str(), all.reason.as_str()), ("True", Reason::Applied.as_str()));
        assert_eq!(all.message, "all 2 proxy pods serve the current configuration");
        let some = condition(1, 2);
        assert_eq!(
            (some.status.as_str(), some.message.as_str()),
            ("False", "1 of 2 proxy pods serve the current configuration")
        );
        assert_eq!(condition(0, 0).reason, Reason::NoProxyPods.as_str());
    }
}

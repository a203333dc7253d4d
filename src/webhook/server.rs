//! The HTTPS webhook server's routes and handlers: `/validate`, `/mutate` and `/convert`, each
//! reading its body within [`body`](super::body)'s limits (connections are handled by
//! [`crate::runtime::listener`]).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRef, Request, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};

use super::admission::{self, Outcome, Webhook};
use super::body::{BodyLimit, read_review_body};
use super::budget::Budget;
use super::conversion::{Converted, conversion_review};
use super::metrics::{AdmissionMetrics, ConversionResult};
use super::review::BadRequest;
use crate::deploy::CONVERT_PATH;
use crate::runtime::http::{error, json_bytes, not_found};
use crate::runtime::listener::{ConnectionLimits, MinRate, Serve};
use crate::runtime::probes::{Readiness, healthz, readyz};
use crate::spec::SpecPolicy;

/// Limits on what a client may cost the webhook server.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Per-connection bounds of the webhook and metrics listeners.
    pub connections: ConnectionLimits,
    /// Per-connection bounds of the probe listener, kept apart so the kubelet always gets in.
    pub probe_connections: ConnectionLimits,
    /// Largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// Largest ConversionReview body accepted: it carries a whole list page of Balancers.
    pub max_conversion_body_bytes: usize,
    /// Bytes of review bodies held at once, by all reviews together (bodies of at most 16 KiB
    /// aside: each connection may hold one of those).
    pub max_body_bytes_in_flight: usize,
    /// How long a review may wait for room in that budget before it gets 503; the wait counts
    /// against `body_timeout`, so a queued review is still answered inside the API server's timeout.
    pub budget_wait: Duration,
    /// A body that falls behind this rate gets 408 at once (the time it waits for room in the
    /// budget aside), rather than holding its connection until `body_timeout`.
    pub min_body_rate: MinRate,
    /// Time allowed to send the request body (408 past it); shorter than the API server's timeout.
    pub body_timeout: Duration,
    /// The same for a ConversionReview, which may be 16 times larger; the API server waits
    /// 30 s for a conversion.
    pub conversion_body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: ConnectionLimits::default(),
            probe_connections: ConnectionLimits {
                max_connections: 128,
                header_timeout: Duration::from_secs(5),
                first_byte_timeout: Duration::from_secs(2),
                max_header_bytes: 8 * 1024,
                ..ConnectionLimits::default()
            },
            max_body_bytes: 1024 * 1024,
            max_conversion_body_bytes: 16 * 1024 * 1024,
            max_body_bytes_in_flight: 32 * 1024 * 1024,
            budget_wait: Duration::from_secs(2),
            min_body_rate: MinRate { bytes_per_second: 64 * 1024, grace: Duration::from_secs(1) },
            body_timeout: Duration::from_secs(3),
            conversion_body_timeout: Duration::from_secs(10),
        }
    }
}

impl Limits {
    /// The defaults with `--max-body-bytes` and `--min-body-rate`: the rate, after the first
    /// second, below which a body gets 408, and after a quarter of a second, below which an
    /// upload is among the first connections closed for a newcomer.
    pub fn with_body_limits(max_body_bytes: usize, min_body_rate: u64) -> Self {
        let defaults = Limits::default();
        Limits {
            max_body_bytes,
            min_body_rate: MinRate { bytes_per_second: min_body_rate, ..defaults.min_body_rate },
            connections: ConnectionLimits {
                slow_upload: MinRate { bytes_per_second: min_body_rate, ..defaults.connections.slow_upload },
                ..defaults.connections.clone()
            },
            ..defaults
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub metrics: Arc<AdmissionMetrics>,
    pub readiness: Readiness,
    pub limits: Arc<Limits>,
    /// What the operator's flags decide about every spec: the default `spec.replicas` the
    /// mutating webhook fills in, and the proxy images the validating webhook allows.
    pub policy: SpecPolicy,
    /// Bytes of review bodies that may be held at once (see [`Limits::max_body_bytes_in_flight`]).
    pub body_budget: Arc<Budget>,
    /// Bytes of ConversionReview bodies that may be held at once: a budget of their own, so
    /// that large conversions never turn admission reviews away.
    pub conversion_budget: Arc<Budget>,
}

impl AppState {
    /// An AdmissionReview's body: paid for as it grows, from the shared budget.
    fn admission_limit(&self) -> BodyLimit {
        BodyLimit {
            bytes: self.limits.max_body_bytes,
            time: self.limits.body_timeout,
            budget: self.body_budget.clone(),
            wait: self.limits.budget_wait,
            min_rate: self.limits.min_body_rate,
        }
    }

    /// A ConversionReview's body: paid for as it grows, from the conversions' own budget.
    fn conversion_limit(&self) -> BodyLimit {
        BodyLimit {
            bytes: self.limits.max_conversion_body_bytes,
            time: self.limits.conversion_body_timeout,
            budget: self.conversion_budget.clone(),
            wait: self.limits.budget_wait,
            min_rate: self.limits.min_body_rate,
        }
    }
}

impl FromRef<AppState> for Readiness {
    fn from_ref(state: &AppState) -> Readiness {
        state.readiness.clone()
    }
}

/// Routes of the TLS webhook port.
pub(super) fn webhook_router(state: AppState) -> Router {
    Router::new()
        .route("/validate", post(validate))
        .route("/mutate", post(mutate))
        .route(CONVERT_PATH, post(convert))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(state)
}

/// The webhook port: reviews go straight to their handler, everything else through
/// [`webhook_router`].
///
/// The reviews are the hot path (thousands a second from an API server under a bulk apply):
/// dispatched here they skip the router's per-request work (a clone of every `Arc` in
/// [`AppState`], boxing the body, route matching), measured in the README's performance section.
#[derive(Clone)]
pub(crate) struct WebhookService {
    state: Arc<AppState>,
    router: Router,
}

impl WebhookService {
    pub(crate) fn new(state: AppState) -> Self {
        WebhookService { router: webhook_router(state.clone()), state: Arc::new(state) }
    }
}

impl Serve for WebhookService {
    fn call(
        &self,
        request: hyper::Request<hyper::body::Incoming>,
    ) -> impl Future<Output = Response> + Send + 'static + use<> {
        let webhook = match (request.method(), request.uri().path()) {
            (&Method::POST, "/validate") => Some(Webhook::Validate),
            (&Method::POST, "/mutate") => Some(Webhook::Mutate),
            _ => None,
        };
        match webhook {
            Some(webhook) => {
                let state = self.state.clone();
                futures::future::Either::Left(async move { admit(&state, webhook, request).await })
            }
            None => futures::future::Either::Right(Serve::call(&self.router, request)),
        }
    }
}

async fn validate(State(state): State<AppState>, request: Request) -> Response {
    admit(&state, Webhook::Validate, request).await
}

async fn mutate(State(state): State<AppState>, request: Request) -> Response {
    admit(&state, Webhook::Mutate, request).await
}

/// Reads, judges and answers one review; `B` is hyper's body on the hot path, axum's via the router.
async fn admit<B>(state: &AppState, webhook: Webhook, request: hyper::Request<B>) -> Response
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let _in_flight = state.metrics.started(webhook);
    let started = Instant::now();
    let (outcome, response) = match read_review_body(request, state.admission_limit()).await {
        Err(refused) => {
            state.metrics.body_refused(refused.reason);
            (Outcome::BadRequest, refused.response)
        }
        // The budget stays held until the answer is built: parsing borrows from the body.
        Ok((body, _budget)) => match admission::review(webhook, &body, &state.policy) {
            Err(bad) => (Outcome::BadRequest, bad_request(&bad)),
            Ok(answer) => match answer.to_json() {
                Ok(body) => (answer.outcome, json_bytes(StatusCode::OK, body)),
                Err(e) => (
                    answer.outcome,
                    error(StatusCode::INTERNAL_SERVER_ERROR, &format!("cannot encode the review: {e}")),
                ),
            },
        },
    };
    if outcome == Outcome::BadRequest {
        tracing::debug!(?webhook, status = %response.status(), "rejected an unusable admission request");
    }
    state.metrics.finished(webhook, outcome, started.elapsed());
    response
}

/// Answers a ConversionReview: v1alpha1 ↔ v1beta1 for the API server.
async fn convert(State(state): State<AppState>, request: Request) -> Response {
    let started = Instant::now();
    let (result, response) = match read_review_body(request, state.conversion_limit()).await {
        // Counted by reason, and logged at debug only: a client that trickles its body or
        // fills the budget (as a hostile pod may, thousands of times a second) must not flood
        // the log.
        Err(refused) => {
            state.metrics.body_refused(refused.reason);
            tracing::debug!(status = %refused.response.status(), reason = ?refused.reason, "refused a conversion body");
            state.metrics.converted(ConversionResult::BadRequest, started.elapsed());
            return refused.response;
        }
        // Converting a large page takes seconds of CPU, so it runs off the connection's worker
        // thread, which also serves admission reviews. The budget is held until the answer is
        // built.
        Ok((body, budget)) => match tokio::task::spawn_blocking(move || (conversion_review(&body), budget)).await {
            Err(e) => (ConversionResult::Failed, error(StatusCode::INTERNAL_SERVER_ERROR, &format!("conversion: {e}"))),
            Ok((Err(bad), _)) => (ConversionResult::BadRequest, bad_request(&bad)),
            Ok((Ok(Converted { body, success: true }), _)) => {
                (ConversionResult::Converted, json_bytes(StatusCode::OK, body))
            }
            Ok((Ok(Converted { body, success: false }), _)) => {
                (ConversionResult::Failed, json_bytes(StatusCode::OK, body))
            }
        },
    };
    if result != ConversionResult::Converted {
        tracing::warn!(status = %response.status(), ?result, "a conversion request was not answered with success");
    }
    state.metrics.converted(result, started.elapsed());
    response
}

fn bad_request(bad: &BadRequest) -> Response {
    error(StatusCode::BAD_REQUEST, &bad.to_string())
}

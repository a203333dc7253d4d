//! The routes and handlers of the HTTPS webhook server, the protected metrics server
//! and the plain-HTTP probe server (connections are handled by [`crate::listener`]).
//!
//! Review bodies are read within a size limit, a time limit shorter than the API
//! server's webhook timeout, and a budget of bytes shared by every review being read
//! or answered at once, so concurrent large reviews cannot exhaust memory.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::BodyExt;
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::admission::{self, BadRequest, Outcome, Webhook};
use crate::api::CONVERT_PATH;
use crate::convert::{Converted, conversion_review};
use crate::defaulting::SpecPolicy;
use crate::listener::{ConnectionLimits, Serve};
use crate::metrics_auth::{MetricsAuth, ReviewError, Verdict};
use crate::telemetry::ConversionResult;
use crate::telemetry::Metrics;

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
    /// Bytes of review bodies held at once, by all reviews together.
    pub max_body_bytes_in_flight: usize,
    /// How long a review may wait for room in that budget before it gets 503; the wait counts
    /// against `body_timeout`, so a queued review is still answered inside the API server's timeout.
    pub budget_wait: Duration,
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
            body_timeout: Duration::from_secs(3),
            conversion_body_timeout: Duration::from_secs(10),
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    pub limits: Arc<Limits>,
    /// What the mutating webhook fills in that the operator's flags decide.
    pub policy: SpecPolicy,
    /// Bytes of review bodies that may be held at once (see [`Limits::max_body_bytes_in_flight`]).
    pub body_budget: Arc<Semaphore>,
    /// Bytes of ConversionReview bodies that may be held at once: a budget of their own, so
    /// that large conversions never turn admission reviews away.
    pub conversion_budget: Arc<Semaphore>,
    /// Reviews scrape tokens on the protected metrics port; `None` without a cluster.
    pub metrics_auth: Option<Arc<MetricsAuth>>,
}

/// Readiness flags that `/readyz` reports: each part must be ready.
///
/// Readiness means "can answer the API server": reviews and conversions. It never waits for
/// the controller's caches, because listing Balancers stored as v1alpha1 needs this very
/// conversion webhook, which the API server reaches only through Ready pods (see the
/// README, "Versions and conversion").
#[derive(Clone, Default)]
pub struct Readiness {
    /// A serving certificate is loaded.
    pub certificate: Arc<AtomicBool>,
    /// Set on SIGTERM, so endpoints drop this replica before it stops listening.
    pub shutting_down: Arc<AtomicBool>,
}

impl Readiness {
    fn problems(&self) -> Vec<&'static str> {
        let mut problems = Vec::new();
        if self.shutting_down.load(Ordering::Acquire) {
            problems.push("shutting down");
        }
        if !self.certificate.load(Ordering::Acquire) {
            problems.push("serving certificate not loaded");
        }
        problems
    }
}

/// Routes of the TLS webhook port.
pub fn webhook_router(state: AppState) -> Router {
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
pub struct WebhookService {
    state: Arc<AppState>,
    router: Router,
}

impl WebhookService {
    pub fn new(state: AppState) -> Self {
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

/// Routes of the plain-HTTP probe port; `/metrics` too when it is not protected.
pub fn probe_router(state: AppState, with_metrics: bool) -> Router {
    let router = Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz));
    let router = if with_metrics { router.route("/metrics", get(metrics)) } else { router };
    router.fallback(not_found).with_state(state)
}

/// Routes of the protected metrics port (HTTPS): `/metrics` for authorized bearer tokens.
pub fn protected_metrics_router(state: AppState) -> Router {
    Router::new().route("/metrics", get(protected_metrics)).fallback(not_found).with_state(state)
}

/// Admits a scrape whose bearer token the API server authenticates and authorizes for `get /metrics`.
async fn protected_metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(auth) = &state.metrics_auth else {
        let message = "protected metrics need the Kubernetes API to review tokens; run with --insecure-metrics \
                       to serve /metrics on the probe port instead";
        return error(StatusCode::SERVICE_UNAVAILABLE, message);
    };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let unauthorized = |message: &str| {
        let mut response = error(StatusCode::UNAUTHORIZED, message);
        response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        response
    };
    let Some(token) = token else { return unauthorized("a bearer token is required") };
    match auth.review(token).await {
        Ok(Verdict::Allowed) => metrics(State(state)).await,
        Ok(Verdict::Unauthenticated) => unauthorized("the token is not valid"),
        Ok(Verdict::Forbidden) => error(StatusCode::FORBIDDEN, "the token may not get /metrics"),
        Err(ReviewError::Busy) => error(StatusCode::TOO_MANY_REQUESTS, "too many token reviews under way"),
        Err(e) => {
            tracing::warn!(error = %e, "cannot review a scrape token");
            error(StatusCode::SERVICE_UNAVAILABLE, "cannot review the token now")
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
    let _in_flight = state.metrics.admission.started(webhook);
    let started = Instant::now();
    let limit = BodyLimit {
        bytes: state.limits.max_body_bytes,
        time: state.limits.body_timeout,
        budget: state.body_budget.clone(),
        whole_at_once: false,
    };
    let (outcome, response) = match read_review_body(state, request, limit).await {
        Err(rejection) => (Outcome::BadRequest, rejection),
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
    state.metrics.admission.finished(webhook, outcome, started.elapsed());
    response
}

/// Answers a ConversionReview: v1alpha1 ↔ v1beta1 for the API server.
async fn convert(State(state): State<AppState>, request: Request) -> Response {
    let started = Instant::now();
    let limit = BodyLimit {
        bytes: state.limits.max_conversion_body_bytes,
        time: state.limits.conversion_body_timeout,
        budget: state.conversion_budget.clone(),
        whole_at_once: true,
    };
    let (result, response) = match read_review_body(&state, request, limit).await {
        Err(rejection) => (ConversionResult::BadRequest, rejection),
        // A large page is seconds of CPU: off the connection's worker thread, which also
        // serves admission reviews. The budget is held until the answer is built.
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
    state.metrics.admission.converted(result, started.elapsed());
    response
}

/// How large a body may be, and how long it may take to arrive.
struct BodyLimit {
    bytes: usize,
    time: Duration,
    /// The budget the body's bytes are paid from.
    budget: Arc<Semaphore>,
    /// Pay for the declared length at once, when the first bytes arrive, rather than as the
    /// buffer doubles. For conversions, whose budget holds one largest body: two large ones
    /// paying as they grow would each hold half and wait for the other, both until 503.
    whole_at_once: bool,
}

/// Checks the content type and reads the body within the size and time `limit`, and the memory budget.
async fn read_review_body<B>(
    state: &AppState,
    request: hyper::Request<B>,
    limit: BodyLimit,
) -> Result<(Vec<u8>, BodyBudget), Response>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let (parts, mut body) = request.into_parts();
    if !is_json(&parts.headers) {
        return Err(error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "Content-Type must be application/json"));
    }
    let limits = &state.limits;
    let deadline = tokio::time::Instant::now() + limit.time;
    let pool = limit.budget;
    let limit_whole = limit.whole_at_once;
    let limit = limit.bytes;
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        // A client waiting for `100 Continue` has sent no byte of the body yet: it gets its 413
        // at once, and the connection closes with nothing unread that could turn into a reset.
        if expects_continue(&parts.headers) {
            return Err(closing(too_large(limit)));
        }
        return Err(too_large_after_draining(&mut body, limit, deadline).await);
    }
    let budget = BodyBudget { pool, held: None, wait: limits.budget_wait };
    // The declared length sizes the first allocation (never past FIRST_ALLOCATION_MAX unless
    // the whole body is paid at once), still paid for only when the first bytes arrive.
    let declared = declared.map(|len| len as usize);
    let first = match (declared, limit_whole) {
        (Some(len), true) => len,
        (Some(len), false) => len.min(FIRST_ALLOCATION_MAX),
        (None, _) => FIRST_ALLOCATION_MAX,
    };
    let size = BodySize { limit, first, declared };
    match tokio::time::timeout_at(deadline, read_within(&mut body, size, budget)).await {
        Err(_) => Err(error(StatusCode::REQUEST_TIMEOUT, "the body was not received in time")),
        Ok(Err(BodyError::TooLarge)) => Err(too_large_after_draining(&mut body, limit, deadline).await),
        Ok(Err(BodyError::Busy)) => Err(error(StatusCode::SERVICE_UNAVAILABLE, "too many reviews being read; retry")),
        Ok(Err(BodyError::Read(e))) => Err(error(StatusCode::BAD_REQUEST, &format!("cannot read the body: {e}"))),
        Ok(Ok(read)) => Ok(read),
    }
}

/// Bytes of an oversized body read and thrown away before its 413, at most.
///
/// Closing a connection with unread bytes in its socket resets it, and a client still sending
/// then gets the reset instead of the 413 (nginx's lingering close exists for this). A client
/// that sends more than this much too much, or sends it too slowly, still gets the reset.
const DRAIN_MAX_BYTES: usize = 1024 * 1024;

/// Discards the rest of `body` (at most [`DRAIN_MAX_BYTES`], until `deadline`), then the 413.
async fn too_large_after_draining<B>(body: &mut B, limit: usize, deadline: tokio::time::Instant) -> Response
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    let drain = async {
        let mut left = DRAIN_MAX_BYTES;
        while let Some(Ok(frame)) = body.frame().await {
            let Some(data) = frame.data_ref() else { continue };
            let Some(rest) = left.checked_sub(data.len()) else { return };
            left = rest;
        }
    };
    let _ = tokio::time::timeout_at(deadline, drain).await;
    too_large(limit)
}

enum BodyError {
    TooLarge,
    Busy,
    /// The client's stream failed (reset, bad chunking): its message.
    Read(String),
}

/// Bytes of the shared body budget held by one review, returned when dropped.
struct BodyBudget {
    pool: Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
    wait: Duration,
}

impl BodyBudget {
    /// Takes `bytes` more from the budget, waiting at most `wait` for them (no timer when
    /// there is room, the usual case).
    async fn grow(&mut self, bytes: usize) -> Result<(), BodyError> {
        let Ok(bytes) = u32::try_from(bytes) else { return Err(BodyError::TooLarge) };
        let permit = match self.pool.clone().try_acquire_many_owned(bytes) {
            Ok(permit) => permit,
            Err(_) => match tokio::time::timeout(self.wait, self.pool.clone().acquire_many_owned(bytes)).await {
                Ok(Ok(permit)) => permit,
                _ => return Err(BodyError::Busy),
            },
        };
        match &mut self.held {
            Some(held) => held.merge(permit),
            None => self.held = Some(permit),
        }
        Ok(())
    }
}

/// Largest first allocation for a body: a client's declared length alone cannot reserve more.
const FIRST_ALLOCATION_MAX: usize = 64 * 1024;

/// How large a body's buffer may and should grow.
struct BodySize {
    /// Hard limit (413 past it).
    limit: usize,
    /// First allocation.
    first: usize,
    /// The declared Content-Length: growth stops there while the body keeps to it, so a body
    /// of exactly the declared size costs exactly that much of the budget.
    declared: Option<usize>,
}

impl BodySize {
    /// The capacity to grow to when `needed` bytes do not fit in `current`.
    fn next_capacity(&self, current: usize, needed: usize) -> usize {
        let doubled = needed.max(current.saturating_mul(2)).max(self.first).min(self.limit);
        match self.declared {
            Some(declared) if needed <= declared => doubled.min(declared),
            _ => doubled,
        }
    }
}

/// Reads `body` into a buffer at most `size.limit` bytes long, whose capacity is paid for from
/// `budget` before it is allocated, so that what a client declares costs nothing until it is sent.
async fn read_within<B>(
    body: &mut B,
    size: BodySize,
    mut budget: BodyBudget,
) -> Result<(Vec<u8>, BodyBudget), BodyError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|e| BodyError::Read(e.to_string()))?.into_data() else { continue };
        let needed = buffer.len() + data.len();
        if needed > size.limit {
            return Err(BodyError::TooLarge);
        }
        if needed > buffer.capacity() {
            let capacity = size.next_capacity(buffer.capacity(), needed);
            budget.grow(capacity - buffer.capacity()).await?;
            buffer.reserve_exact(capacity - buffer.len());
        }
        buffer.extend_from_slice(&data);
    }
    Ok((buffer, budget))
}

/// Whether the client waits for `100 Continue` before it sends the body.
fn expects_continue(headers: &HeaderMap) -> bool {
    headers.get(header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// `response`, after which the connection closes.
fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    response
}

fn too_large(limit: usize) -> Response {
    error(StatusCode::PAYLOAD_TOO_LARGE, &format!("the body exceeds the limit of {limit} bytes"))
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

fn bad_request(bad: &BadRequest) -> Response {
    error(StatusCode::BAD_REQUEST, &bad.to_string())
}

fn error(status: StatusCode, message: &str) -> Response {
    json_bytes(status, json!({ "error": message }).to_string().into_bytes())
}

fn json_bytes(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AppState>) -> Response {
    let problems = state.readiness.problems();
    if problems.is_empty() {
        "ok".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, problems.join("; ")).into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    match state.metrics.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode metrics: {e}")).into_response(),
    }
}

/// A 404 in the same JSON shape as the other errors.
async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such route")
}

//! The HTTPS webhook server and the plain-HTTP probe server.
//!
//! The webhook listener runs its own accept loop over tokio-rustls so it can
//! bound everything a client controls: handshake time, header time (which also
//! closes idle keep-alive connections), body size and body time, and the
//! number of open connections.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::limit::GlobalConcurrencyLimitLayer;

use crate::admission::{self, BadRequest, Outcome, Webhook};
use crate::metrics_auth::{MetricsAuth, ReviewError, Verdict};
use crate::telemetry::Metrics;

/// Limits on what a client may cost the webhook server.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// Time allowed to complete the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time allowed to send complete request headers; also how long an idle keep-alive connection lives.
    pub header_timeout: Duration,
    /// Time allowed to send the request body.
    pub body_timeout: Duration,
    /// Connections served at once; further clients wait in the listen backlog.
    pub max_connections: usize,
    /// Time allowed for each write of a response; a client that stops reading is dropped.
    pub write_timeout: Duration,
    /// Admission reviews read and answered at once; more wait their turn before their body is read.
    pub max_concurrent_reviews: usize,
    /// Time in-flight requests get to finish on shutdown.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 1024 * 1024,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(10),
            max_connections: 1024,
            write_timeout: Duration::from_secs(10),
            max_concurrent_reviews: 32,
            shutdown_grace: Duration::from_secs(20),
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    pub limits: Arc<Limits>,
    /// Reviews scrape tokens on the protected metrics port; `None` without a cluster.
    pub metrics_auth: Option<Arc<MetricsAuth>>,
}

/// Readiness flags that `/readyz` reports: each part must be ready.
#[derive(Clone, Default)]
pub struct Readiness {
    /// A serving certificate is loaded.
    pub certificate: Arc<AtomicBool>,
    /// `None` when the controller is off; otherwise whether its caches have synced.
    pub controller: Option<Arc<AtomicBool>>,
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
        if let Some(synced) = &self.controller
            && !synced.load(Ordering::Acquire)
        {
            problems.push("controller caches not synced");
        }
        problems
    }
}

/// Routes of the TLS webhook port.
pub fn webhook_router(state: AppState) -> Router {
    // Bounds the memory and CPU that reviews can take at once, whatever the number of connections.
    let reviews = GlobalConcurrencyLimitLayer::new(state.limits.max_concurrent_reviews);
    Router::new()
        .route("/validate", post(validate))
        .route("/mutate", post(mutate))
        .route_layer(reviews)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(state)
}

/// Routes of the plain-HTTP probe port.
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

async fn admit(state: &AppState, webhook: Webhook, request: Request) -> Response {
    let _in_flight = state.metrics.admission_started(webhook);
    let started = Instant::now();
    let (outcome, response) = match read_review_body(state, request).await {
        Err(rejection) => (Outcome::BadRequest, rejection),
        Ok(body) => match admission::review(webhook, &body) {
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
    state.metrics.admission_finished(webhook, outcome, started.elapsed());
    response
}

/// Checks the content type and reads the body within the size and time limits.
async fn read_review_body(state: &AppState, request: Request) -> Result<Bytes, Response> {
    let (parts, body) = request.into_parts();
    if !is_json(&parts.headers) {
        return Err(error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "Content-Type must be application/json"));
    }
    let limit = state.limits.max_body_bytes;
    let too_large = || error(StatusCode::PAYLOAD_TOO_LARGE, &format!("the body exceeds the limit of {limit} bytes"));
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(state.limits.body_timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => Err(error(StatusCode::REQUEST_TIMEOUT, "the body was not received in time")),
        Ok(Err(e)) if is_length_limit(&e) => Err(too_large()),
        Ok(Err(e)) => Err(error(StatusCode::BAD_REQUEST, &format!("cannot read the body: {e}"))),
        Ok(Ok(bytes)) => Ok(bytes),
    }
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
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

/// Serves `router` on `listener` until `shutdown`, over TLS when `tls` is given,
/// then lets in-flight requests finish. Both servers get the same client bounds.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    router: Router,
    limits: Arc<Limits>,
    shutdown: CancellationToken,
) {
    let acceptor = tls.map(TlsAcceptor::from);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = accept(&listener, &slots) => accepted,
        };
        let Some((tcp, peer, permit)) = accepted else { continue };
        let acceptor = acceptor.clone();
        let router = router.clone();
        let limits = limits.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            // A client that stops reading its response must not hold the connection forever.
            let mut io = TimeoutStream::new(tcp);
            io.set_write_timeout(Some(limits.write_timeout));
            let io = Box::pin(io);
            let service = TowerToHyperService::new(router);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
            let result = match acceptor {
                None => watcher.watch(builder.serve_connection(TokioIo::new(io), service)).await,
                Some(acceptor) => match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(io)).await {
                    Ok(Ok(stream)) => watcher.watch(builder.serve_connection(TokioIo::new(stream), service)).await,
                    Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
                },
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("in-flight requests did not finish within the grace period");
    }
}

/// Waits for a connection slot, then a connection; `None` after a failed accept.
async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> Option<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    let permit = slots.clone().acquire_owned().await.ok()?;
    match listener.accept().await {
        Ok((tcp, peer)) => {
            let _ = tcp.set_nodelay(true);
            Some((tcp, peer, permit))
        }
        Err(e) => {
            // Usually EMFILE: back off instead of spinning.
            tracing::warn!(error = %e, "accept failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

/// Binds a TCP listener, naming the address on failure.
pub async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, std::io::Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen for {what} on {addr}: {e}")))
}

/// A 404 in the same JSON shape as the other errors.
async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such route")
}

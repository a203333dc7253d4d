//! How the controller limits its load on the API server: a client-side rate limit on every
//! request, and a pause of all of them when the API server says it is overloaded.
//!
//! kube's own retry answers a `429 Too Many Requests` by retrying that one request later
//! while every other request carries on at full speed, so a burst keeps the server
//! saturated: 1,000 new Balancers once drew 23,917 answers 429. Here a 429 or 503 (or another
//! 5xx with a `Retry-After`) pauses *every* request for its `Retry-After` (else an exponential
//! delay) and halves the request rate, which then grows back as answers succeed (additive
//! increase, multiplicative decrease, as TCP does). Transient refusals (429, 503, 504) are
//! retried behind that pause.
//!
//! A pause is as long as the API server's `Retry-After` asks, up to 30 s; without one it is
//! 0.5 s, doubling while refusals continue, up to 4 s. An API server that lost etcd answers 503
//! until etcd is back: a longer guess would only hold the controller back after that.
//!
//! Watches and the initial lists go around this layer (see [`crate::runtime::retry`]): they are a few
//! long-lived requests, and a pause must never keep the controller from seeing that the API
//! server is back. So do the leader Lease and the metrics endpoint's token reviews.
//!
//! Once the process is shutting down, nothing waits any more: a pause (up to 30 s) would
//! outlast the drain, and under leader election the Lease is released only after it.

use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{self, Request, Response, StatusCode};
use kube::client::Body;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service, ServiceExt};

use super::contact::Contact;
use crate::util::token_bucket::TokenBucket;

/// How many times a request refused as transient (429, 503, 504) is sent again.
pub const MAX_RETRIES: u32 = 5;
/// The first pause when the API server gives no `Retry-After`; it doubles while refusals continue.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
/// The longest pause, whatever `Retry-After` asks.
pub const MAX_PAUSE: Duration = Duration::from_secs(30);
/// The longest pause the API server did not ask for with `Retry-After`.
pub const MAX_UNASKED_PAUSE: Duration = Duration::from_secs(4);
/// The rate never falls below this many requests per second.
const MIN_QPS: f64 = 1.0;

/// The steady rate and the burst: the most requests that may start at once after a lull.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    /// Requests a second, on average.
    pub qps: f64,
    /// Requests that may go at once after a quiet time.
    pub burst: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: String,
}

/// How the client treats the API server: the answers saying it is overloaded, and the time
/// requests waited.
#[derive(Clone)]
pub struct ThrottleMetrics {
    refusals: Family<CodeLabels, Counter>,
    waited: Counter<f64, AtomicU64>,
}

impl ThrottleMetrics {
    /// Registers the throttle's series in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = ThrottleMetrics { refusals: Family::default(), waited: Counter::default() };
        registry.register(
            "api_overload_responses",
            "Answers from the API server that it is overloaded (429, 503, 504, 5xx with Retry-After), by code",
            metrics.refusals.clone(),
        );
        registry.register(
            "api_throttle_wait_seconds",
            "Time requests to the API server waited for the client-side rate limit or an overload pause",
            metrics.waited.clone(),
        );
        let _ = metrics.refusals.get_or_create(&CodeLabels { code: "429".into() });
        metrics
    }

    /// Counts a request the API server refused with `code` (429, say).
    pub fn refused(&self, code: u16) {
        self.refusals.get_or_create(&CodeLabels { code: code.to_string() }).inc();
    }

    /// Records how long a request waited for the throttle.
    pub fn waited(&self, waited: Duration) {
        self.waited.inc_by(waited.as_secs_f64());
    }
}

/// A [`Layer`] whose services share one rate limit and one overload pause.
#[derive(Clone)]
pub struct ThrottleLayer {
    shared: Arc<Shared>,
}

impl ThrottleLayer {
    /// Requests stop waiting (for the rate limit or a pause) and are no longer retried once
    /// `shutdown` is cancelled: the reconciles in flight then end within the drain.
    pub fn new(rate: Rate, metrics: ThrottleMetrics, shutdown: CancellationToken) -> Self {
        let qps = rate.qps.max(MIN_QPS);
        let burst = f64::from(rate.burst.max(1));
        let now = Instant::now();
        let limiter = Limiter { bucket: TokenBucket::full(burst, qps, now), paused_until: now, epoch: 0, strikes: 0 };
        let limiter = Mutex::new(limiter);
        ThrottleLayer { shared: Arc::new(Shared { max_qps: qps, limiter, metrics, shutdown }) }
    }
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttled<S>;

    fn layer(&self, inner: S) -> Throttled<S> {
        Throttled { inner, shared: self.shared.clone() }
    }
}

/// The throttled service (the inner service must be cheap to clone, e.g. a `Buffer`).
#[derive(Clone)]
pub struct Throttled<S> {
    inner: S,
    shared: Arc<Shared>,
}

struct Shared {
    max_qps: f64,
    limiter: Mutex<Limiter>,
    metrics: ThrottleMetrics,
    shutdown: CancellationToken,
}

/// A token bucket whose rate adapts, and the pause every request waits out.
struct Limiter {
    /// Its rate adapts: halved on overload, grown back on success.
    bucket: TokenBucket,
    paused_until: Instant,
    /// Counts pauses: a refusal of a request sent before the current pause began belongs to
    /// the episode that pause answers, and neither lengthens it nor halves the rate again.
    epoch: u64,
    /// Pauses in a row without a success in between, for the exponential delay.
    strikes: u32,
}

/// What an answer says about the API server's load.
enum Signal {
    Fine,
    /// Overloaded: slow down; `retry` when the request may simply be sent again.
    Overloaded {
        retry_after: Option<Duration>,
        retry: bool,
    },
}

/// The pause after `strikes` episodes of refusals in a row, when the API server did not say
/// how long (`Retry-After`): [`FIRST_PAUSE`], doubling, at most [`MAX_UNASKED_PAUSE`].
fn unasked_pause(strikes: u32) -> Duration {
    FIRST_PAUSE.saturating_mul(1 << strikes.saturating_sub(1).min(16)).min(MAX_UNASKED_PAUSE)
}

/// 429, 503 and 504 say "overloaded" whatever else they carry; another 5xx says so only with a
/// `Retry-After` (as client-go reads it). A plain 500 is that request's failure ("failed to
/// allocate a serviceIP: range is full", a webhook's error), not the server's load: it fails its
/// reconcile, which backs off on its own, and does not slow the others.
fn signal<B>(response: &Response<B>) -> Signal {
    let status = response.status();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let retry =
        matches!(status, StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT);
    if retry || (status.is_server_error() && retry_after.is_some()) {
        Signal::Overloaded { retry_after, retry }
    } else {
        Signal::Fine
    }
}

impl Shared {
    fn limiter(&self) -> MutexGuard<'_, Limiter> {
        self.limiter.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the pause to end and a token; returns the epoch the request starts in, or
    /// `None` when shutdown began while it waited (nothing waits then).
    async fn admit(&self) -> Option<u64> {
        let asked = Instant::now();
        loop {
            let wait = {
                let mut limiter = self.limiter();
                let now = Instant::now();
                if now < limiter.paused_until {
                    limiter.paused_until - now
                } else {
                    if limiter.bucket.try_take(now) {
                        // The epoch is read under the lock the token was taken under: a pause
                        // that starts right after this counts the request as admitted before it.
                        let epoch = limiter.epoch;
                        drop(limiter);
                        let waited = asked.elapsed();
                        if !waited.is_zero() {
                            self.metrics.waited(waited);
                        }
                        return Some(epoch);
                    }
                    limiter.bucket.next_token_in()
                }
            };
            tokio::select! {
                _ = self.shutdown.cancelled() => return None,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// A request admitted in `epoch` was answered without a sign of overload: the rate grows back.
    fn succeeded(&self, epoch: u64) {
        let mut limiter = self.limiter();
        if limiter.epoch == epoch {
            limiter.strikes = 0;
        }
        // Back from half to full speed over about a hundred answers.
        let qps = (limiter.bucket.per_second() + self.max_qps / 200.0).min(self.max_qps);
        limiter.bucket.set_per_second(qps);
    }

    /// A request admitted in `epoch` was refused as overload: every request waits.
    fn overloaded(&self, epoch: u64, retry_after: Option<Duration>, status: StatusCode) {
        self.metrics.refused(status.as_u16());
        let mut limiter = self.limiter();
        let now = Instant::now();
        let mut until = limiter.paused_until;
        if limiter.epoch == epoch {
            // A new episode: the first refusal of requests sent since the last pause.
            limiter.epoch += 1;
            limiter.strikes = limiter.strikes.saturating_add(1);
            let qps = (limiter.bucket.per_second() / 2.0).max(MIN_QPS);
            limiter.bucket.set_per_second(qps);
            until = until.max(now + unasked_pause(limiter.strikes));
            // Resume gently rather than with a full burst.
            limiter.bucket.empty();
        }
        if let Some(asked) = retry_after {
            until = until.max(now + asked.min(MAX_PAUSE));
        }
        if until > limiter.paused_until {
            limiter.paused_until = until;
            limiter.bucket.refill_from(until);
            tracing::debug!(pause = ?(until - now), qps = limiter.bucket.per_second(), "the API server is overloaded: pausing requests");
        }
    }
}

impl<S, B> Service<Request<Body>> for Throttled<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, S::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is awaited per attempt inside the call, after the limiter.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        Box::pin(send(inner, shared, request))
    }
}

async fn send<S, B>(mut inner: S, shared: Arc<Shared>, mut request: Request<Body>) -> Result<Response<B>, S::Error>
where
    S: Service<Request<Body>, Response = Response<B>>,
{
    // A 503 or 504 without `Retry-After` may come after the write went through (the handler
    // timed out): only requests that mean the same when sent twice are sent again then.
    let idempotent = request.method() != http::Method::POST;
    let mut attempt = 0;
    // The refusal being retried; returned unchanged if shutdown ends the wait before the retry.
    let mut refused = None;
    loop {
        let epoch = match (shared.admit().await, refused.take()) {
            (Some(epoch), _) => epoch,
            (None, Some(refusal)) => return Ok(refusal),
            // A first attempt during shutdown goes out at once.
            (None, None) => shared.limiter().epoch,
        };
        let again = (attempt < MAX_RETRIES).then(|| clone_request(&request)).flatten();
        let response = inner.ready().await?.call(request).await?;
        match signal(&response) {
            Signal::Fine => {
                shared.succeeded(epoch);
                return Ok(response);
            }
            Signal::Overloaded { retry_after, retry } => {
                let status = response.status();
                shared.overloaded(epoch, retry_after, status);
                let unprocessed = status == StatusCode::TOO_MANY_REQUESTS || retry_after.is_some();
                // When shutting down there is no retry: the refusal goes back to the reconcile,
                // which then ends.
                let stopping = shared.shutdown.is_cancelled();
                match again.filter(|_| retry && (unprocessed || idempotent) && !stopping) {
                    Some(next) => {
                        request = next;
                        attempt += 1;
                        refused = Some(response);
                    }
                    None => return Ok(response),
                }
            }
        }
    }
}

/// A copy of a request whose body is in memory (every request but a streamed upload).
fn clone_request(request: &Request<Body>) -> Option<Request<Body>> {
    let body = request.body().try_clone()?;
    let mut copy = Request::builder().method(request.method().clone()).uri(request.uri().clone());
    if let Some(headers) = copy.headers_mut() {
        headers.extend(request.headers().clone());
    }
    let mut copy = copy.version(request.version()).body(body).ok()?;
    *copy.extensions_mut() = request.extensions().clone();
    Some(copy)
}

/// A client whose every request goes through `layer`, and whose answers `contact` watches (kube's
/// own retry is off: the layer retries).
pub fn client(config: kube::Config, contact: &Contact, layer: &ThrottleLayer) -> Result<kube::Client, kube::Error> {
    let builder = kube::client::ClientBuilder::try_from(Contact::config(config))?;
    Ok(builder.with_layer(contact).with_layer(&tower::buffer::BufferLayer::new(1024)).with_layer(layer).build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_nobody_asked_for_doubles_to_four_seconds() {
        let pauses: Vec<f64> = (1..=7).map(|strikes| unasked_pause(strikes).as_secs_f64()).collect();
        assert_eq!(pauses, [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]);
        assert_eq!(unasked_pause(u32::MAX), MAX_UNASKED_PAUSE);
    }
}

//! Whether the API server answers the operator: one watch over every client's requests.
//!
//! The API server is *lost* when a request cannot reach it (the connection fails or times out),
//! is answered 503 or 504, or gets no answer: none within [`SLOW_ANSWER`], or none before its
//! caller gave up on it after [`GIVEN_UP`] (an API server without etcd holds requests for up
//! to a minute, and the leader's Lease requests do not wait that long). It is *back* at its
//! next answer of any other kind. Each change is logged once, and
//! `balancer_api_unreachable_since_timestamp_seconds` says since when it is lost (0 while it
//! answers). A 429 is an API server at work asking for patience, not a lost one.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::{Request, Response, StatusCode};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tower::{BoxError, Layer, Service};

/// A request with no answer after this long counts as a lost API server (until an answer comes).
/// Longer than a slow admission webhook usually takes.
pub(crate) const SLOW_ANSWER: Duration = Duration::from_secs(10);
/// A request its caller gave up on after this long with no answer counts as a lost API server.
pub(crate) const GIVEN_UP: Duration = Duration::from_secs(3);

/// Whether the API server answers, shared by every client of the process.
#[derive(Clone)]
pub struct Contact {
    /// When it was lost, for the log line that says it is back.
    lost: Arc<Mutex<Option<Instant>>>,
    /// `balancer_api_unreachable_since_timestamp_seconds`.
    since: Gauge,
}

impl Contact {
    /// Exported through `since` (Unix seconds, 0 while the API server answers).
    pub fn new(since: Gauge) -> Self {
        Contact { lost: Arc::default(), since }
    }

    /// A contact exported as `api_unreachable_since_timestamp_seconds` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let since = Gauge::default();
        registry.register(
            "api_unreachable_since_timestamp_seconds",
            "When the API server stopped answering (a failed connection, 503/504, or no answer), as a Unix time; 0 while it answers",
            since.clone(),
        );
        Contact::new(since)
    }

    /// A client that reports to this contact, and retries nothing itself: its callers retry on
    /// their own terms (kube's default retry waits up to minutes between attempts).
    pub fn client(&self, config: kube::Config) -> Result<kube::Client, kube::Error> {
        Ok(kube::client::ClientBuilder::try_from(Contact::config(config))?.with_layer(self).build())
    }

    /// `config` without kube's own retry.
    pub fn config(mut config: kube::Config) -> kube::Config {
        config.default_retry = false;
        config
    }

    /// Whether the API server is lost now.
    pub fn is_lost(&self) -> bool {
        self.lost.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// A request reached the API server and it answered `status`.
    fn answered(&self, status: StatusCode) {
        if matches!(status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT) {
            self.lose(&format!("it answers {status}"));
        } else {
            self.regain();
        }
    }

    fn lose(&self, why: &str) {
        let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        if lost.is_some() {
            return;
        }
        *lost = Some(Instant::now());
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.since.set(i64::try_from(unix).unwrap_or(i64::MAX));
        tracing::warn!(reason = why, "lost the API server: retrying every few seconds");
    }

    fn regain(&self) {
        let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = lost.take() {
            self.since.set(0);
            tracing::info!(after = ?at.elapsed(), "the API server answers again");
        }
    }
}

impl<S> Layer<S> for Contact {
    type Service = Watched<S>;

    fn layer(&self, inner: S) -> Watched<S> {
        Watched { inner, contact: self.clone() }
    }
}

/// A client service whose answers (and failures to get one) update a [`Contact`].
#[derive(Clone)]
pub struct Watched<S> {
    inner: S,
    contact: Contact,
}

impl<S, B, R> Service<Request<R>> for Watched<S>
where
    S: Service<Request<R>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    B: Send,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<R>) -> Self::Future {
        let mut pending = Pending { contact: self.contact.clone(), sent: Instant::now(), answered: false };
        let answer = self.inner.call(request);
        Box::pin(async move {
            tokio::pin!(answer);
            let answer = tokio::select! {
                answer = &mut answer => answer,
                _ = tokio::time::sleep(SLOW_ANSWER) => {
                    pending.contact.lose(&format!("no answer within {SLOW_ANSWER:?}"));
                    answer.await
                }
            };
            pending.answered = true;
            let answer = answer.map_err(Into::into);
            match &answer {
                Ok(response) => pending.contact.answered(response.status()),
                Err(e) => pending.contact.lose(&format!("a request failed: {}", causes(e.as_ref()))),
            }
            answer
        })
    }
}

/// A request in flight. Dropped without an answer after [`GIVEN_UP`] or more, it marks the API
/// server as lost.
struct Pending {
    contact: Contact,
    sent: Instant,
    answered: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let waited = self.sent.elapsed();
        if !self.answered && waited >= GIVEN_UP {
            self.contact.lose(&format!("a request was given up after {waited:?} with no answer"));
        }
    }
}

/// An error and its sources, `: `-separated ("client error (Connect): tcp connect error: …").
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_on_503_and_504_back_on_any_other_answer() {
        let contact = Contact::new(Gauge::default());
        contact.answered(StatusCode::TOO_MANY_REQUESTS);
        assert!(!contact.is_lost(), "429 is a server at work");
        contact.answered(StatusCode::SERVICE_UNAVAILABLE);
        assert!(contact.is_lost());
        let since = contact.since.get();
        assert!(since > 1_700_000_000, "a Unix time: {since}");
        contact.answered(StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(contact.since.get(), since, "still lost since the first");
        contact.answered(StatusCode::NOT_FOUND);
        assert!(!contact.is_lost());
        assert_eq!(contact.since.get(), 0);
    }
}

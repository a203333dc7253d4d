//! The metrics registry's serving side: the exposition every scrape gets, on the probe port
//! (`--insecure-metrics`) or on the protected HTTPS port for bearer tokens the API server
//! authenticates and authorizes for `get /metrics`.
//!
//! Each area registers its own series in the one registry (as controller-runtime's packages
//! do); only the `run` wiring (`manager`) knows them all.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::http::{error, not_found};
use super::metrics_auth::{MetricsAuth, ReviewError, Verdict};

/// Decrements an in-flight gauge when the work ends, however it ends.
pub struct InFlight(Gauge);

impl InFlight {
    /// Counts one more in `gauge` until the guard is dropped.
    pub fn enter(gauge: &Gauge) -> InFlight {
        gauge.inc();
        InFlight(gauge.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The OpenMetrics text exposition of every series in `registry`.
pub(crate) fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

/// `GET /metrics`: the exposition, as Prometheus asks for it.
pub(crate) async fn exposition(State(registry): State<Arc<Registry>>) -> Response {
    match encode(&registry) {
        Ok(text) => ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode metrics: {e}")).into_response(),
    }
}

/// What the protected metrics port serves, and whom to.
#[derive(Clone)]
struct Protected {
    registry: Arc<Registry>,
    /// Reviews scrape tokens; `None` without a cluster.
    auth: Option<Arc<MetricsAuth>>,
}

/// Routes of the protected metrics port (HTTPS): `/metrics` for authorized bearer tokens.
pub(crate) fn protected_router(registry: Arc<Registry>, auth: Option<Arc<MetricsAuth>>) -> Router {
    Router::new().route("/metrics", get(protected_metrics)).fallback(not_found).with_state(Protected { registry, auth })
}

/// Admits a scrape whose bearer token the API server authenticates and authorizes for `get /metrics`.
async fn protected_metrics(State(protected): State<Protected>, headers: HeaderMap) -> Response {
    let Some(auth) = &protected.auth else {
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
        Ok(Verdict::Allowed) => exposition(State(protected.registry.clone())).await,
        Ok(Verdict::Unauthenticated) => unauthorized("the token is not valid"),
        Ok(Verdict::Forbidden) => error(StatusCode::FORBIDDEN, "the token may not get /metrics"),
        Err(ReviewError::Busy) => error(StatusCode::TOO_MANY_REQUESTS, "too many token reviews under way"),
        Err(e) => {
            tracing::warn!(error = %e, "cannot review a scrape token");
            error(StatusCode::SERVICE_UNAVAILABLE, "cannot review the token now")
        }
    }
}

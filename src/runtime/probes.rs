//! `/healthz` and `/readyz`, on the plain-HTTP probe port (with `/metrics` when it is not
//! protected) and on the webhook port.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;

use super::http::not_found;
use super::metrics::exposition;

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
    /// Cancelled on SIGTERM, so endpoints drop this replica before it stops listening; the
    /// listeners then close each connection after its next answer (see
    /// [`ServeOptions::draining`](super::listener::ServeOptions::draining)).
    pub draining: CancellationToken,
}

impl Readiness {
    fn problems(&self) -> Vec<&'static str> {
        let mut problems = Vec::new();
        if self.draining.is_cancelled() {
            problems.push("shutting down");
        }
        if !self.certificate.load(Ordering::Acquire) {
            problems.push("serving certificate not loaded");
        }
        problems
    }
}

/// Routes of the plain-HTTP probe port; `/metrics` too when `metrics` is given (unprotected).
pub(crate) fn router(readiness: Readiness, metrics: Option<Arc<Registry>>) -> Router {
    let probes = Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).with_state(readiness);
    let router = match metrics {
        Some(registry) => probes.merge(Router::new().route("/metrics", get(exposition)).with_state(registry)),
        None => probes,
    };
    router.fallback(not_found)
}

/// The process is alive.
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// Every part is ready, or 503 with what is not.
pub(crate) async fn readyz(State(readiness): State<Readiness>) -> Response {
    let problems = readiness.problems();
    if problems.is_empty() {
        "ok".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, problems.join("; ")).into_response()
    }
}

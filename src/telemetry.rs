//! Logs (`tracing`) and Prometheus metrics (`prometheus-client`).
//!
//! Every metric lives under the `balancer_` prefix in one registry that the
//! probe server encodes on `GET /metrics`.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tracing_subscriber::EnvFilter;

use crate::admission::{Outcome, Webhook};
use crate::controller::ErrorKind;

/// Result of an attempt to load a changed certificate.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ReloadResult {
    Success,
    Failure,
}

impl EncodeLabelValue for ReloadResult {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        match self {
            ReloadResult::Success => "success",
            ReloadResult::Failure => "failure",
        }
        .encode(encoder)
    }
}

/// How a reconcile ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ReconcileResult {
    Success,
    Error,
}

impl EncodeLabelValue for ReconcileResult {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        match self {
            ReconcileResult::Success => "success",
            ReconcileResult::Error => "error",
        }
        .encode(encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    result: ReconcileResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReadyLabels {
    ready: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: ErrorKind,
}

impl EncodeLabelValue for ErrorKind {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        self.as_str().encode(encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    webhook: Webhook,
    outcome: Outcome,
}

/// How a ConversionReview ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ConversionResult {
    /// Every object converted.
    Converted,
    /// Answered with `Failure`: an object could not be converted.
    Failed,
    /// The HTTP request itself was unusable (HTTP 4xx).
    BadRequest,
}

impl EncodeLabelValue for ConversionResult {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        let value = match self {
            ConversionResult::Converted => "converted",
            ConversionResult::Failed => "failed",
            ConversionResult::BadRequest => "bad_request",
        };
        value.encode(encoder)
    }
}

const CONVERSION_RESULTS: [ConversionResult; 3] =
    [ConversionResult::Converted, ConversionResult::Failed, ConversionResult::BadRequest];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConversionLabels {
    result: ConversionResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabels {
    webhook: Webhook,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: ReloadResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: String,
}

/// Latency buckets from 50µs to ~0.8s: admission is sub-millisecond when healthy.
fn latency_histogram() -> Histogram {
    Histogram::new([0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0])
}

/// One webhook's series, resolved once: the review path then touches no label map.
struct AdmissionSeries {
    in_flight: Gauge,
    duration: Histogram,
    /// By [`Outcome`], in declaration order.
    requests: [Counter; 4],
}

const OUTCOMES: [Outcome; 4] = [Outcome::Allowed, Outcome::Denied, Outcome::Patched, Outcome::BadRequest];
const WEBHOOKS: [Webhook; 2] = [Webhook::Validate, Webhook::Mutate];

/// The operator's metrics, one area each, and the registry that exposes them.
///
/// Each area registers its own series (the controller-rs layout) and creates every series it
/// knows at zero, so a fresh process already exports them: `rate()` sees the first increment
/// and `absent()` alerts mean what they say.
pub struct Metrics {
    registry: Registry,
    pub admission: AdmissionMetrics,
    pub tls: TlsMetrics,
    pub controller: ControllerMetrics,
    pub api: ApiMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("balancer");
        let admission = AdmissionMetrics::register(&mut registry);
        let tls = TlsMetrics::register(&mut registry);
        let controller = ControllerMetrics::register(&mut registry);
        let api = ApiMetrics::register(&mut registry);
        Metrics { registry, admission, tls, controller, api }
    }
}

impl Metrics {
    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// The webhooks: reviews by outcome, their latency, and those in flight.
pub struct AdmissionMetrics {
    /// By [`Webhook`], in declaration order.
    series: [AdmissionSeries; 2],
    /// ConversionReviews by [`ConversionResult`], in declaration order.
    conversions: [Counter; 3],
    conversion_duration: Histogram,
}

impl AdmissionMetrics {
    fn register(registry: &mut Registry) -> Self {
        let requests = Family::<AdmissionLabels, Counter>::default();
        let duration = Family::<WebhookLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> Histogram);
        let in_flight = Family::<WebhookLabels, Gauge>::default();
        registry.register("admission_requests", "Admission reviews served, by webhook and outcome", requests.clone());
        registry.register(
            "admission_duration_seconds",
            "Time to answer an admission review, body read to response",
            duration.clone(),
        );
        registry.register("admission_in_flight_requests", "Admission reviews being answered now", in_flight.clone());
        let series = WEBHOOKS.map(|webhook| AdmissionSeries {
            in_flight: in_flight.get_or_create(&WebhookLabels { webhook }).clone(),
            duration: duration.get_or_create(&WebhookLabels { webhook }).clone(),
            requests: OUTCOMES.map(|outcome| requests.get_or_create(&AdmissionLabels { webhook, outcome }).clone()),
        });
        let conversions = Family::<ConversionLabels, Counter>::default();
        let conversion_duration = latency_histogram();
        registry.register("conversion_requests", "ConversionReviews served, by result", conversions.clone());
        registry.register(
            "conversion_duration_seconds",
            "Time to answer a ConversionReview, body read to response",
            conversion_duration.clone(),
        );
        let conversions =
            CONVERSION_RESULTS.map(|result| conversions.get_or_create(&ConversionLabels { result }).clone());
        AdmissionMetrics { series, conversions, conversion_duration }
    }

    pub fn converted(&self, result: ConversionResult, elapsed: Duration) {
        self.conversions[result as usize].inc();
        self.conversion_duration.observe(elapsed.as_secs_f64());
    }

    /// Marks a review as started; the guard counts it out of the in-flight gauge when dropped.
    pub fn started(&self, webhook: Webhook) -> InFlight {
        let gauge = &self.series[webhook as usize].in_flight;
        gauge.inc();
        InFlight(gauge.clone())
    }

    pub fn finished(&self, webhook: Webhook, outcome: Outcome, elapsed: Duration) {
        let series = &self.series[webhook as usize];
        series.requests[outcome as usize].inc();
        series.duration.observe(elapsed.as_secs_f64());
    }
}

/// The serving certificate: reloads and expiry.
pub struct TlsMetrics {
    reloads: Family<ReloadLabels, Counter>,
    certificate_expiry: Gauge,
}

impl TlsMetrics {
    fn register(registry: &mut Registry) -> Self {
        let reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "tls_certificate_reloads",
            "Attempts to load a changed serving certificate, by result",
            reloads.clone(),
        );
        let certificate_expiry = Gauge::default();
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "When the serving certificate expires (notAfter), as a Unix time",
            certificate_expiry.clone(),
        );
        for result in [ReloadResult::Success, ReloadResult::Failure] {
            let _ = reloads.get_or_create(&ReloadLabels { result });
        }
        TlsMetrics { reloads, certificate_expiry }
    }

    pub fn reloaded(&self, result: ReloadResult) {
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    pub fn set_certificate_expiry(&self, unix_seconds: i64) {
        self.certificate_expiry.set(unix_seconds);
    }
}

/// The reconcile loop: reconciles, their errors and duration, children written, leadership.
pub struct ControllerMetrics {
    reconciles: Family<ReconcileLabels, Counter>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: Histogram,
    reconciles_in_flight: Gauge,
    children_applied: Family<KindLabels, Counter>,
    children_deleted: Family<KindLabels, Counter>,
    events_dropped: Counter,
    leader: Gauge,
    balancers: Family<ReadyLabels, Gauge>,
}

impl ControllerMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = ControllerMetrics {
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Histogram::new([0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            reconciles_in_flight: Gauge::default(),
            children_applied: Family::default(),
            children_deleted: Family::default(),
            events_dropped: Counter::default(),
            leader: Gauge::default(),
            balancers: Family::default(),
        };
        registry.register(
            "balancers",
            "Balancers seen by the leader, by their Ready condition (true, false, unknown)",
            metrics.balancers.clone(),
        );
        registry.register("reconciles", "Balancer reconciles, by result", metrics.reconciles.clone());
        registry.register("reconcile_errors", "Failed reconciles, by error kind", metrics.reconcile_errors.clone());
        registry.register("reconcile_duration_seconds", "Time one reconcile takes", metrics.reconcile_duration.clone());
        registry.register(
            "reconciles_in_flight",
            "Reconciles running now (the controller's work in progress)",
            metrics.reconciles_in_flight.clone(),
        );
        registry.register(
            "children_applied",
            "Child objects created or updated, by kind",
            metrics.children_applied.clone(),
        );
        registry.register("children_deleted", "Child objects deleted, by kind", metrics.children_deleted.clone());
        registry.register(
            "events_dropped",
            "Events not published because their Balancer exceeded its event budget",
            metrics.events_dropped.clone(),
        );
        registry.register(
            "controller_leader",
            "1 while this replica runs the reconcile loop (leader, or leader election off), else 0",
            metrics.leader.clone(),
        );
        for result in [ReconcileResult::Success, ReconcileResult::Error] {
            let _ = metrics.reconciles.get_or_create(&ReconcileLabels { result });
        }
        for kind in ErrorKind::ALL {
            let _ = metrics.reconcile_errors.get_or_create(&ErrorLabels { kind });
        }
        for kind in ["Service", "ConfigMap", "Deployment"] {
            let _ = metrics.children_applied.get_or_create(&KindLabels { kind: kind.into() });
        }
        let _ = metrics.children_deleted.get_or_create(&KindLabels { kind: "Service".into() });
        metrics.set_balancers(0, 0, 0);
        metrics
    }

    /// Marks a reconcile as started; the guard counts it out when dropped.
    pub fn reconcile_started(&self) -> InFlight {
        self.reconciles_in_flight.inc();
        InFlight(self.reconciles_in_flight.clone())
    }

    pub fn reconciled(&self, result: ReconcileResult, error_kind: Option<ErrorKind>, elapsed: Duration) {
        self.reconciles.get_or_create(&ReconcileLabels { result }).inc();
        if let Some(kind) = error_kind {
            self.reconcile_errors.get_or_create(&ErrorLabels { kind }).inc();
        }
        self.reconcile_duration.observe(elapsed.as_secs_f64());
    }

    pub fn child_applied(&self, kind: &str) {
        self.children_applied.get_or_create(&KindLabels { kind: kind.to_string() }).inc();
    }

    pub fn child_deleted(&self, kind: &str) {
        self.children_deleted.get_or_create(&KindLabels { kind: kind.to_string() }).inc();
    }

    pub fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    /// Balancers by Ready condition; all zero when this replica does not reconcile.
    pub fn set_balancers(&self, ready: i64, not_ready: i64, unknown: i64) {
        for (label, count) in [("true", ready), ("false", not_ready), ("unknown", unknown)] {
            self.balancers.get_or_create(&ReadyLabels { ready: label }).set(count);
        }
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }
}

/// The client's manners towards the API server (see [`crate::throttle`]), and whether it answers
/// (see [`crate::contact`]).
#[derive(Clone)]
pub struct ApiMetrics {
    refusals: Family<CodeLabels, Counter>,
    waited: Counter<f64, AtomicU64>,
    /// Set by [`crate::contact::Contact`].
    pub unreachable_since: Gauge,
}

impl ApiMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics =
            ApiMetrics { refusals: Family::default(), waited: Counter::default(), unreachable_since: Gauge::default() };
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
        registry.register(
            "api_unreachable_since_timestamp_seconds",
            "When the API server stopped answering (a failed connection, 503/504, or no answer), as a Unix time; 0 while it answers",
            metrics.unreachable_since.clone(),
        );
        let _ = metrics.refusals.get_or_create(&CodeLabels { code: "429".into() });
        metrics
    }

    pub fn refused(&self, code: u16) {
        self.refusals.get_or_create(&CodeLabels { code: code.to_string() }).inc();
    }

    pub fn waited(&self, waited: Duration) {
        self.waited.inc_by(waited.as_secs_f64());
    }
}

/// Decrements the in-flight gauge when the review ends, however it ends.
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// Installs the global `tracing` subscriber; `RUST_LOG` overrides `default_level`.
pub fn init_logging(format: LogFormat, default_level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Its fallback report of a failed write uses eprintln!, which panics when stderr is gone.
        .log_internal_errors(false);
    // try_init: a second call (tests) keeps the first subscriber instead of panicking.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_indexed_by_declaration_order() {
        for (i, webhook) in WEBHOOKS.iter().enumerate() {
            assert_eq!(*webhook as usize, i);
        }
        for (i, outcome) in OUTCOMES.iter().enumerate() {
            assert_eq!(*outcome as usize, i);
        }
    }

    #[test]
    fn an_admission_is_counted_under_its_labels() {
        let metrics = Metrics::default();
        metrics.admission.finished(Webhook::Mutate, Outcome::Patched, Duration::from_micros(80));
        let text = metrics.encode().unwrap();
        let line = "balancer_admission_requests_total{webhook=\"mutate\",outcome=\"patched\"} 1";
        assert!(text.contains(line), "{text}");
    }
}

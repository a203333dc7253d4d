//! The webhooks' metrics: reviews by webhook and outcome, their latency, those in flight, and
//! ConversionReviews by result.

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::admission::{Outcome, Webhook};
use super::body::Refusal;
use crate::runtime::listener::ConnectionMetrics;
use crate::runtime::metrics::InFlight;

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
struct RefusalLabels {
    reason: Refusal,
}

impl EncodeLabelValue for Refusal {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        <&'static str>::from(*self).encode(encoder)
    }
}

const REFUSALS: &[Refusal] = <Refusal as strum::VariantArray>::VARIANTS;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabels {
    webhook: Webhook,
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

const OUTCOMES: &[Outcome] = <Outcome as strum::VariantArray>::VARIANTS;
const WEBHOOKS: &[Webhook] = <Webhook as strum::VariantArray>::VARIANTS;
// The series arrays are sized by these: a new variant must grow them.
const _: () = assert!(WEBHOOKS.len() == 2 && OUTCOMES.len() == 4);

/// The webhooks: reviews by outcome, their latency, and those in flight.
pub struct AdmissionMetrics {
    /// By [`Webhook`], in declaration order.
    series: [AdmissionSeries; 2],
    /// ConversionReviews by [`ConversionResult`], in declaration order.
    conversions: [Counter; 3],
    conversion_duration: Histogram,
    /// Review bodies not read, by [`Refusal`], in declaration order.
    body_refusals: [Counter; 6],
    /// Connections to the webhook port closed for newcomers, and newcomers refused.
    pub connections: ConnectionMetrics,
}

// Sized by the refusals: a new one must grow the array.
const _: () = assert!(REFUSALS.len() == 6);

impl AdmissionMetrics {
    pub fn register(registry: &mut Registry) -> Self {
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
        let series = std::array::from_fn(|w| {
            let webhook = WEBHOOKS[w];
            AdmissionSeries {
                in_flight: in_flight.get_or_create(&WebhookLabels { webhook }).clone(),
                duration: duration.get_or_create(&WebhookLabels { webhook }).clone(),
                requests: std::array::from_fn(|o| {
                    requests.get_or_create(&AdmissionLabels { webhook, outcome: OUTCOMES[o] }).clone()
                }),
            }
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
        let refusals = Family::<RefusalLabels, Counter>::default();
        registry.register(
            "webhook_body_refusals",
            "Review and conversion bodies not read, by reason (answered 4xx or 503)",
            refusals.clone(),
        );
        let body_refusals =
            std::array::from_fn(|r| refusals.get_or_create(&RefusalLabels { reason: REFUSALS[r] }).clone());
        let connections = ConnectionMetrics::register(registry, "webhook");
        AdmissionMetrics { series, conversions, conversion_duration, body_refusals, connections }
    }

    /// Counts a body not read.
    pub fn body_refused(&self, reason: Refusal) {
        self.body_refusals[reason as usize].inc();
    }

    pub fn converted(&self, result: ConversionResult, elapsed: Duration) {
        self.conversions[result as usize].inc();
        self.conversion_duration.observe(elapsed.as_secs_f64());
    }

    /// Marks a review as started; the guard counts it out of the in-flight gauge when dropped.
    pub fn started(&self, webhook: Webhook) -> InFlight {
        InFlight::enter(&self.series[webhook as usize].in_flight)
    }

    pub fn finished(&self, webhook: Webhook, outcome: Outcome, elapsed: Duration) {
        let series = &self.series[webhook as usize];
        series.requests[outcome as usize].inc();
        series.duration.observe(elapsed.as_secs_f64());
    }
}

impl EncodeLabelValue for Webhook {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        self.as_str().encode(encoder)
    }
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        self.as_str().encode(encoder)
    }
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
        for (i, refusal) in REFUSALS.iter().enumerate() {
            assert_eq!(*refusal as usize, i);
        }
    }

    #[test]
    fn an_admission_is_counted_under_its_labels() {
        let mut registry = Registry::with_prefix("balancer");
        let metrics = AdmissionMetrics::register(&mut registry);
        metrics.finished(Webhook::Mutate, Outcome::Patched, Duration::from_micros(80));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let line = "balancer_admission_requests_total{webhook=\"mutate\",outcome=\"patched\"} 1";
        assert!(text.contains(line), "{text}");
    }

    #[test]
    fn refusals_and_evictions_are_counted_under_their_reasons_from_zero() {
        let mut registry = Registry::with_prefix("balancer");
        let metrics = AdmissionMetrics::register(&mut registry);
        metrics.body_refused(Refusal::TooSlow);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("balancer_webhook_body_refusals_total{reason=\"too_slow\"} 1"), "{text}");
        assert!(text.contains("balancer_webhook_body_refusals_total{reason=\"budget\"} 0"), "{text}");
        assert!(text.contains("balancer_webhook_connection_evictions_total{reason=\"slow_upload\"} 0"), "{text}");
        assert!(text.contains("balancer_webhook_connection_refusals_total 0"), "{text}");
    }
}

//! The proxy's series, per Balancer, port and backend: what each session's log line counts.
//!
//! Every label value comes from the `nginx.conf` the proxy runs (the Balancer's own spec): a
//! line naming a port or a server the file does not have is skipped and counted as such, so
//! the series grow with the spec, never with traffic or client addresses.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::proxy::access_log::{LineError, Outcome, Upstreams};

/// Session durations, in seconds: from a one-request connection to an hour-long stream.
pub const SESSION_BUCKETS: [f64; 12] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 3600.0];

/// Upstream connect times, in seconds (nginx measures milliseconds): a backend Service on the
/// same node takes under 1 ms.
pub const CONNECT_BUCKETS: [f64; 10] = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0];

/// One backend at one port of one Balancer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BackendLabels {
    balancer: String,
    port: u16,
    protocol: String,
    /// The spec's backend name; empty for a session that reached no backend.
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SessionLabels {
    #[prometheus(flatten)]
    backend: BackendLabels,
    /// nginx's `$status`, named (`ok`, `bad_gateway`, …).
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SkippedLabels {
    balancer: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BalancerLabels {
    balancer: String,
}

fn session_histogram() -> Histogram {
    Histogram::new(SESSION_BUCKETS)
}

fn connect_histogram() -> Histogram {
    Histogram::new(CONNECT_BUCKETS)
}

/// Every series the sidecar exports.
pub(super) struct ProxyMetrics {
    upstreams: Upstreams,
    sessions: Family<SessionLabels, Counter>,
    received: Family<BackendLabels, Counter>,
    sent: Family<BackendLabels, Counter>,
    duration: Family<BackendLabels, Histogram, fn() -> Histogram>,
    connect: Family<BackendLabels, Histogram, fn() -> Histogram>,
    connect_failures: Family<BackendLabels, Counter>,
    skipped: Family<SkippedLabels, Counter>,
    lost: Family<BalancerLabels, Counter>,
    weights: Family<BackendLabels, Gauge>,
    /// The kernel's drop count for the log socket when last read.
    lost_seen: std::sync::atomic::AtomicU64,
    /// Each backend's series, by port, as made so far.
    made: Mutex<Made>,
}

/// The series made, by backend name, then by port and protocol (at most 32 each).
#[derive(Default)]
struct Made(HashMap<String, Vec<(Port, Arc<Series>)>>);

/// A port and its protocol (`TCP`, `UDP`).
type Port = (u16, &'static str);

/// One backend's series at one port: handles sharing the registered families' values.
struct Series {
    /// By [`Outcome`], in its order.
    sessions: [Counter; Outcome::ALL.len()],
    received: Counter,
    sent: Counter,
    duration: Histogram,
    connect: Histogram,
    connect_failures: Counter,
}

impl ProxyMetrics {
    /// The series for the proxy that runs `upstreams`, registered in `registry`.
    pub(super) fn register(upstreams: Upstreams, registry: &mut Registry) -> ProxyMetrics {
        let metrics = ProxyMetrics {
            upstreams,
            sessions: Family::default(),
            received: Family::default(),
            sent: Family::default(),
            duration: Family::new_with_constructor(session_histogram),
            connect: Family::new_with_constructor(connect_histogram),
            connect_failures: Family::default(),
            skipped: Family::default(),
            lost: Family::default(),
            weights: Family::default(),
            lost_seen: std::sync::atomic::AtomicU64::new(0),
            made: Mutex::default(),
        };
        // Present from the start, so that a rate over them is defined before the first loss.
        metrics.lost_up_to(0);
        let reasons = LineError::ALL.map(|e| e.name()).into_iter().chain([UNKNOWN_PORT, UNKNOWN_SERVER]);
        for reason in reasons {
            let labels = SkippedLabels { balancer: metrics.upstreams.balancer.clone(), reason: reason.to_string() };
            let _ = metrics.skipped.get_or_create(&labels);
        }
        for weight in metrics.upstreams.weights() {
            let labels = BackendLabels {
                balancer: metrics.upstreams.balancer.clone(),
                port: weight.port,
                protocol: weight.protocol.to_string(),
                backend: weight.backend.clone(),
            };
            metrics.weights.get_or_create(&labels).set(i64::from(weight.weight));
        }
        let proxy = registry.sub_registry_with_prefix("balancer_proxy");
        proxy.register(
            "sessions",
            "Sessions the proxy ended, by backend and outcome (nginx's $status)",
            metrics.sessions.clone(),
        );
        proxy.register_with_unit("received", "Bytes received from clients", Unit::Bytes, metrics.received.clone());
        proxy.register_with_unit("sent", "Bytes sent to clients", Unit::Bytes, metrics.sent.clone());
        proxy.register_with_unit(
            "session_duration",
            "How long sessions lasted",
            Unit::Seconds,
            metrics.duration.clone(),
        );
        proxy.register_with_unit(
            "upstream_connect_duration",
            "How long connecting to the backend that served a session took",
            Unit::Seconds,
            metrics.connect.clone(),
        );
        proxy.register(
            "upstream_connect_failures",
            "Connections to a backend that failed (nginx then tries the next backend, TCP only)",
            metrics.connect_failures.clone(),
        );
        proxy.register(
            "backend_weight",
            "Each backend's weight at each port, as the proxy runs it (0: down); its share of the weights is the share of sessions it is meant to get",
            metrics.weights.clone(),
        );
        proxy.register(
            "log_lines_skipped",
            "Log lines not counted: garbled, or naming a port or server the proxy's nginx.conf does not have",
            metrics.skipped.clone(),
        );
        proxy.register(
            "log_lines_lost",
            "Log lines dropped before the sidecar read them (the log socket's buffer was full)",
            metrics.lost.clone(),
        );
        metrics
    }

    /// Counts one datagram from nginx.
    pub(super) fn record(&self, datagram: &[u8]) {
        let line = std::str::from_utf8(datagram).map_err(|_| Skip::Line(LineError::Malformed));
        if let Err(reason) = line.and_then(|line| self.count(line)) {
            self.skip(reason.name());
        }
    }

    fn count(&self, datagram: &str) -> Result<(), Skip> {
        let session = crate::proxy::access_log::parse(datagram).map_err(Skip::Line)?;
        let protocol = match session.protocol {
            "UDP" => "UDP",
            _ => "TCP",
        };
        if !self.upstreams.listens(session.port, protocol) {
            return Err(Skip::UnknownPort);
        }
        // Every server first: a line naming one the file does not have counts nothing.
        for attempt in &session.attempts {
            self.upstreams.backend(attempt.address).ok_or(Skip::UnknownServer)?;
        }
        let at =
            |address: &str| self.series(session.port, protocol, self.upstreams.backend(address).unwrap_or_default());
        let last = session.attempts.len().checked_sub(1);
        for (i, attempt) in session.attempts.iter().enumerate() {
            match attempt.connect_seconds {
                None => {
                    at(attempt.address).connect_failures.inc();
                }
                Some(seconds) if Some(i) == last => {
                    at(attempt.address).connect.observe(seconds);
                }
                Some(_) => {}
            }
        }
        let served_by = at(session.attempts.last().map_or("", |a| a.address));
        served_by.received.inc_by(session.bytes_received);
        served_by.sent.inc_by(session.bytes_sent);
        served_by.duration.observe(session.seconds);
        served_by.sessions[session.outcome as usize].inc();
        Ok(())
    }

    /// The series of `backend` at `port`, made once: counting a session then allocates nothing.
    fn series(&self, port: u16, protocol: &'static str, backend: &str) -> Arc<Series> {
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        let known = made.0.get(backend).and_then(|list| list.iter().find(|(key, _)| *key == (port, protocol)));
        if let Some((_, series)) = known {
            return series.clone();
        }
        let labels = BackendLabels {
            balancer: self.upstreams.balancer.clone(),
            port,
            protocol: protocol.to_string(),
            backend: backend.to_string(),
        };
        let session = |outcome: Outcome| {
            let labels = SessionLabels { backend: labels.clone(), outcome: outcome.name().to_string() };
            self.sessions.get_or_create(&labels).clone()
        };
        let series = Arc::new(Series {
            sessions: Outcome::ALL.map(session),
            received: self.received.get_or_create(&labels).clone(),
            sent: self.sent.get_or_create(&labels).clone(),
            duration: self.duration.get_or_create(&labels).clone(),
            connect: self.connect.get_or_create(&labels).clone(),
            connect_failures: self.connect_failures.get_or_create(&labels).clone(),
        });
        made.0.entry(backend.to_string()).or_default().push(((port, protocol), series.clone()));
        series
    }

    fn skip(&self, reason: &str) {
        let labels = SkippedLabels { balancer: self.upstreams.balancer.clone(), reason: reason.to_string() };
        self.skipped.get_or_create(&labels).inc();
    }

    /// Brings the lost-lines counter up to the kernel's drop count for the log socket.
    pub(super) fn lost_up_to(&self, drops: u64) {
        let before = self.lost_seen.fetch_max(drops, std::sync::atomic::Ordering::Relaxed);
        let labels = BalancerLabels { balancer: self.upstreams.balancer.clone() };
        self.lost.get_or_create(&labels).inc_by(drops.saturating_sub(before));
    }
}

const UNKNOWN_PORT: &str = "unknown_port";
const UNKNOWN_SERVER: &str = "unknown_server";

/// Why a line was not counted.
enum Skip {
    Line(LineError),
    UnknownPort,
    UnknownServer,
}

impl Skip {
    fn name(&self) -> &'static str {
        match self {
            Skip::Line(error) => error.name(),
            Skip::UnknownPort => UNKNOWN_PORT,
            Skip::UnknownServer => UNKNOWN_SERVER,
        }
    }
}

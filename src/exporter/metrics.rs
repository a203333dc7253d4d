//! The proxy's Prometheus series, per Balancer, port and backend, and how each session's log
//! line adds to them.
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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use super::window::CanaryWindow;
use crate::api::Protocol;
use crate::proxy::access_log::{LineError, Outcome};
use crate::proxy::reload::{RELOAD_POLICY, short_id};
use crate::proxy::signals::Signals;
use crate::proxy::upstreams::{Upstreams, Weight};

/// Session durations, in seconds: from a one-request connection to an hour-long stream.
pub const SESSION_BUCKETS: [f64; 12] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 3600.0];

/// Upstream connect times: the same bounds as a canary's connect-time gate reads.
pub use crate::proxy::signals::CONNECT_BUCKETS;

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
pub(super) struct ReasonLabels {
    balancer: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BalancerLabels {
    balancer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ConfigLabels {
    balancer: String,
    /// The first 16 hex digits of the SHA-256 of the `nginx.conf` nginx serves.
    id: String,
}

fn session_histogram() -> Histogram {
    Histogram::new(SESSION_BUCKETS)
}

fn connect_histogram() -> Histogram {
    Histogram::new(CONNECT_BUCKETS)
}

/// Every series the sidecar exports.
pub(super) struct ProxyMetrics {
    /// The Balancer, whose name labels every series.
    balancer: String,
    /// The configuration nginx serves, and the ones before it whose workers may still drain.
    upstreams: RwLock<Served>,
    sessions: Family<SessionLabels, Counter>,
    received: Family<BackendLabels, Counter>,
    sent: Family<BackendLabels, Counter>,
    duration: Family<BackendLabels, Histogram, fn() -> Histogram>,
    connect: Family<BackendLabels, Histogram, fn() -> Histogram>,
    connect_failures: Family<BackendLabels, Counter>,
    skipped: Family<ReasonLabels, Counter>,
    unread: Family<BalancerLabels, Gauge>,
    weights: Family<BackendLabels, Gauge>,
    reloads: Family<BalancerLabels, Counter>,
    refused: Family<ReasonLabels, Counter>,
    config: Family<ConfigLabels, Gauge>,
    /// The id of the configuration nginx serves.
    served_id: Mutex<String>,
    /// Each backend's series, by port, as made so far.
    series_by_backend: Mutex<SeriesByBackend>,
    /// A running canary's window, when nginx serves a configuration made for one of its steps.
    window: Mutex<CanaryWindow>,
}

/// The configurations a proxy's workers may run: the one nginx serves, and the ones before it,
/// whose old workers still log the sessions they drain. A line is read against the newest that
/// knows its port or server.
struct Served {
    current: Upstreams,
    /// Newest first, at most [`DRAINING_CONFIGS`].
    previous: VecDeque<Upstreams>,
}

/// How many earlier configurations still name the servers of old workers' sessions: one for
/// each worker nginx may keep draining (see [`RELOAD_POLICY`]), at most one generation each.
const DRAINING_CONFIGS: usize = RELOAD_POLICY.max_draining_workers as usize;

impl Served {
    fn all(&self) -> impl Iterator<Item = &Upstreams> {
        std::iter::once(&self.current).chain(&self.previous)
    }

    fn listens(&self, port: u16, protocol: Protocol) -> bool {
        self.all().any(|u| u.listens(port, protocol))
    }

    fn is_upstream(&self, address: &str) -> bool {
        self.all().any(|u| u.is_upstream(address))
    }

    fn backend(&self, address: &str) -> Option<String> {
        self.all().find_map(|u| u.backend(address)).map(str::to_string)
    }
}

/// The series made so far, by backend name, then by port and protocol (at most 32 each).
#[derive(Default)]
struct SeriesByBackend(HashMap<String, Vec<(Port, Arc<Series>)>>);

/// A port and its protocol.
type Port = (u16, Protocol);

/// One backend's series at one port: handles to the same values the registered families hold,
/// so counting a session needs no label lookup.
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
    /// `id` is the configuration nginx serves, when known (a live sidecar learns it from nginx:
    /// see [`started`](Self::started)).
    pub(super) fn register(id: Option<&str>, upstreams: Upstreams, registry: &mut Registry) -> ProxyMetrics {
        let metrics = ProxyMetrics {
            balancer: upstreams.balancer.clone(),
            upstreams: RwLock::new(Served { current: upstreams, previous: VecDeque::new() }),
            sessions: Family::default(),
            received: Family::default(),
            sent: Family::default(),
            duration: Family::new_with_constructor(session_histogram),
            connect: Family::new_with_constructor(connect_histogram),
            connect_failures: Family::default(),
            skipped: Family::default(),
            unread: Family::default(),
            weights: Family::default(),
            reloads: Family::default(),
            refused: Family::default(),
            config: Family::default(),
            served_id: Mutex::new(String::new()),
            series_by_backend: Mutex::default(),
            window: Mutex::default(),
        };
        metrics.set_unread(0);
        let reasons = LineError::ALL.map(|e| e.name()).into_iter().chain([UNKNOWN_PORT, UNKNOWN_SERVER]);
        for reason in reasons {
            let labels = ReasonLabels { balancer: metrics.balancer.clone(), reason: reason.to_string() };
            let _ = metrics.skipped.get_or_create(&labels);
        }
        for reason in Refusal::ALL {
            let labels = ReasonLabels { balancer: metrics.balancer.clone(), reason: reason.as_str().to_string() };
            let _ = metrics.refused.get_or_create(&labels);
        }
        let _ = metrics.reloads.get_or_create(&BalancerLabels { balancer: metrics.balancer.clone() });
        metrics.set_weights(&[], metrics.read().current.weights());
        if let Some(id) = id {
            metrics.set_served(id);
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
            "config_info",
            "The configuration nginx serves: 1 for its id (the start of the SHA-256 of its nginx.conf)",
            metrics.config.clone(),
        );
        proxy.register(
            "config_reloads",
            "New configurations nginx applied without a restart (graceful reloads)",
            metrics.reloads.clone(),
        );
        proxy.register(
            "config_refused",
            "Configurations refused and not applied, by reason; the last good one keeps serving",
            metrics.refused.clone(),
        );
        proxy.register(
            "log_lines_skipped",
            "Log lines not counted: garbled, or naming a port or server the proxy's nginx.conf does not have",
            metrics.skipped.clone(),
        );
        proxy.register(
            "log_unread_bytes",
            "Bytes of the access log nginx has written and the sidecar not yet read: at the log volume's size, nginx drops lines",
            metrics.unread.clone(),
        );
        metrics
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Served> {
        self.upstreams.read().unwrap_or_else(|e| e.into_inner())
    }

    /// nginx now serves `upstreams`: its weights are exported, and lines are read against it
    /// first (and against the configurations before it, for the sessions old workers drain).
    pub(super) fn serve(&self, id: &str, upstreams: Upstreams) {
        self.switch(id, upstreams);
        self.reloads.get_or_create(&BalancerLabels { balancer: self.balancer.clone() }).inc();
    }

    /// nginx started on `upstreams`: as [`serve`](Self::serve), but no reload.
    pub(super) fn started(&self, id: &str, upstreams: Upstreams) {
        self.switch(id, upstreams);
    }

    fn switch(&self, id: &str, upstreams: Upstreams) {
        self.set_served(id);
        let mut served = self.upstreams.write().unwrap_or_else(|e| e.into_inner());
        if served.current == upstreams {
            return;
        }
        self.set_weights(served.current.weights(), upstreams.weights());
        let previous = std::mem::replace(&mut served.current, upstreams);
        served.previous.push_front(previous);
        served.previous.truncate(DRAINING_CONFIGS);
    }

    /// The short id of the configuration nginx serves (see [`short_id`]).
    pub(super) fn served_id(&self) -> String {
        self.served_id.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The info series of the configuration `id` (a full hash), in place of the one before.
    fn set_served(&self, id: &str) {
        let short = short_id(id).to_string();
        let mut served = self.served_id.lock().unwrap_or_else(|e| e.into_inner());
        let label = |id: &str| ConfigLabels { balancer: self.balancer.clone(), id: id.to_string() };
        self.config.remove(&label(&served));
        self.config.get_or_create(&label(&short)).set(1);
        *served = short;
    }

    /// nginx serves a configuration made for the canary window `mark` (none: for no step).
    pub(super) fn serve_window(&self, mark: Option<&str>) {
        self.window.lock().unwrap_or_else(|e| e.into_inner()).serve(mark, Instant::now());
    }

    /// What the controller reads of a running canary: the window's counts, and each backend's
    /// weight at the first port nginx listens on.
    pub(super) fn signals(&self) -> Signals {
        let weights: BTreeMap<String, u32> = {
            let served = self.read();
            let all = served.current.weights();
            let first = all.first().map(|w| (w.port, w.protocol));
            all.iter().filter(|w| Some((w.port, w.protocol)) == first).map(|w| (w.backend.clone(), w.weight)).collect()
        };
        let window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        window.signals(self.served_id(), weights, Instant::now())
    }

    /// Counts a configuration that was not applied.
    pub(super) fn refuse(&self, reason: Refusal) {
        let labels = ReasonLabels { balancer: self.balancer.clone(), reason: reason.as_str().to_string() };
        self.refused.get_or_create(&labels).inc();
    }

    /// The weight series of `new`, without those of `old` that `new` no longer has.
    fn set_weights(&self, old: &[Weight], new: &[Weight]) {
        let labels = |weight: &Weight| BackendLabels {
            balancer: self.balancer.clone(),
            port: weight.port,
            protocol: weight.protocol.to_string(),
            backend: weight.backend.clone(),
        };
        for gone in old {
            self.weights.remove(&labels(gone));
        }
        for weight in new {
            self.weights.get_or_create(&labels(weight)).set(i64::from(weight.weight));
        }
    }

    /// Counts one line of nginx's access log.
    pub(super) fn record(&self, line: &[u8]) {
        let line = std::str::from_utf8(line).map_err(|_| Skip::Line(LineError::Malformed));
        if let Err(reason) = line.and_then(|line| self.count(line)) {
            self.skip(reason.name());
        }
    }

    fn count(&self, line: &str) -> Result<(), Skip> {
        let session = crate::proxy::access_log::parse(line).map_err(Skip::Line)?;
        let served = self.read();
        if !served.listens(session.port, session.protocol) {
            return Err(Skip::UnknownPort);
        }
        // nginx names the upstream itself, not a server, when it found none left to try
        // ("no live upstreams"); a line naming a server the file does not have counts nothing.
        let mut servers = Vec::with_capacity(session.attempts.len());
        for attempt in &session.attempts {
            if served.is_upstream(attempt.address) {
                continue;
            }
            let backend = served.backend(attempt.address).ok_or(Skip::UnknownServer)?;
            servers.push((backend, attempt.connect_seconds));
        }
        drop(served);
        self.window.lock().unwrap_or_else(|e| e.into_inner()).count(&session, &servers, Instant::now());
        let at = |backend: &str| self.series(session.port, session.protocol, backend);
        for (backend, connected) in &servers {
            if connected.is_none() {
                at(backend).connect_failures.inc();
            }
        }
        // The last server tried served the session only if nginx connected to it; otherwise no
        // backend served it.
        let served =
            servers.last().and_then(|(backend, connected)| connected.map(|seconds| (backend.as_str(), seconds)));
        if let Some((backend, seconds)) = served {
            at(backend).connect.observe(seconds);
        }
        let served_by = at(served.map_or("", |(backend, _)| backend));
        served_by.received.inc_by(session.bytes_received);
        served_by.sent.inc_by(session.bytes_sent);
        served_by.duration.observe(session.seconds);
        served_by.sessions[session.outcome as usize].inc();
        Ok(())
    }

    /// The series of `backend` at `port`, made once: counting a session then allocates nothing.
    fn series(&self, port: u16, protocol: Protocol, backend: &str) -> Arc<Series> {
        let mut made = self.series_by_backend.lock().unwrap_or_else(|e| e.into_inner());
        let known = made.0.get(backend).and_then(|list| list.iter().find(|(key, _)| *key == (port, protocol)));
        if let Some((_, series)) = known {
            return series.clone();
        }
        let labels = BackendLabels {
            balancer: self.balancer.clone(),
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
        let labels = ReasonLabels { balancer: self.balancer.clone(), reason: reason.to_string() };
        self.skipped.get_or_create(&labels).inc();
    }

    /// Sets how much of the access log is written and not yet read.
    pub(super) fn set_unread(&self, bytes: u64) {
        let labels = BalancerLabels { balancer: self.balancer.clone() };
        self.unread.get_or_create(&labels).set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
}

/// Why a configuration from the ConfigMap was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub(super) enum Refusal {
    /// Larger than the sidecar reads.
    TooLarge,
    /// Not a file balancer rendered, or one for another Balancer.
    NotRendered,
    /// Not signed by the operator for this pod's Balancer (see
    /// [`signature`](crate::proxy::signature)): written by someone else.
    Unsigned,
    /// Signed by the operator, but older than the newest configuration the pod took: an
    /// earlier one written back.
    Replayed,
    /// nginx's own check (`nginx -t`) refused it.
    Nginx,
}

impl Refusal {
    const ALL: &'static [Refusal] = <Refusal as strum::VariantArray>::VARIANTS;

    pub(super) fn as_str(self) -> &'static str {
        self.into()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Two backends of one Service each at port 80.
    const MODEL: &str = r#"{"balancer": "lb", "drainTimeout": "1h", "listeners": [{"port": 80, "protocol": "TCP",
        "method": "RoundRobin", "servers": [{"address": "10.0.0.1:80", "backend": "v1", "weight": 1},
        {"address": "10.0.0.2:80", "backend": "v2", "weight": 1}]}]}"#;

    fn exposition(lines: &[&str]) -> String {
        let mut registry = Registry::default();
        let metrics = ProxyMetrics::register(
            Some("0123456789abcdef0"),
            Upstreams::of(&crate::proxy::model::ProxyConfig::from_json(MODEL).expect("a model")),
            &mut registry,
        );
        for line in lines {
            metrics.record(line.as_bytes());
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        text
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    const AT: &str = "balancer=\"lb\",port=\"80\",protocol=\"TCP\"";

    #[test]
    fn a_session_counts_for_the_backend_that_served_it_and_a_failed_connect_for_the_one_that_refused() {
        let text = exposition(&["80 TCP 200 5 7 0.010 \"10.0.0.1:80, 10.0.0.2:80\" \"-, 0.001\""]);
        let ok = |backend: &str| {
            value(&text, &format!("balancer_proxy_sessions_total{{{AT},backend=\"{backend}\",outcome=\"ok\"}}"))
        };
        assert_eq!((ok("v1"), ok("v2")), (Some(0.0), Some(1.0)), "{text}");
        let failures = format!("balancer_proxy_upstream_connect_failures_total{{{AT},backend=\"v1\"}}");
        assert_eq!(value(&text, &failures), Some(1.0));
        assert_eq!(value(&text, &format!("balancer_proxy_sent_bytes_total{{{AT},backend=\"v2\"}}")), Some(7.0));
    }

    #[test]
    fn a_session_no_backend_served_counts_for_none() {
        // Every connect failed; then nginx had no server left and named the upstream.
        let text = exposition(&[
            "80 TCP 502 0 0 0.002 \"10.0.0.1:80, 10.0.0.2:80\" \"-, -\"",
            "80 TCP 502 0 0 0.000 \"port_80_tcp\" \"-\"",
            "80 TCP 502 0 0 0.001 \"10.0.0.2:80, port_80_tcp\" \"-, -\"",
        ]);
        let none = format!("balancer_proxy_sessions_total{{{AT},backend=\"\",outcome=\"bad_gateway\"}}");
        assert_eq!(value(&text, &none), Some(3.0), "{text}");
        let failures =
            |b: &str| value(&text, &format!("balancer_proxy_upstream_connect_failures_total{{{AT},backend=\"{b}\"}}"));
        assert_eq!((failures("v1"), failures("v2")), (Some(1.0), Some(2.0)));
        let skipped = "balancer_proxy_log_lines_skipped_total{balancer=\"lb\",reason=\"unknown_server\"}";
        assert_eq!(value(&text, skipped), Some(0.0));
    }

    #[test]
    fn a_line_naming_what_the_file_does_not_have_is_skipped_as_such() {
        let text = exposition(&[
            "81 TCP 200 1 1 0.001 \"10.0.0.1:81\" \"0.000\"",
            "80 TCP 200 1 1 0.001 \"10.9.9.9:80\" \"0.000\"",
            "garbage",
        ]);
        let skipped = |reason: &str| {
            value(&text, &format!("balancer_proxy_log_lines_skipped_total{{balancer=\"lb\",reason=\"{reason}\"}}"))
        };
        assert_eq!(
            (skipped("unknown_port"), skipped("unknown_server"), skipped("malformed")),
            (Some(1.0), Some(1.0), Some(1.0))
        );
        assert!(!text.contains("balancer_proxy_sessions_total{"), "nothing counted: {text}");
    }
}

//! The proxy's access log, which its metrics sidecar counts: nginx's own stream log, one line
//! per session, buffered by each worker and written to a file on a small memory-backed volume
//! that the proxy container and the sidecar share.
//!
//! A buffered file, because it costs nginx a copy per session and one `write` per
//! [`BUFFER`], where a syslog datagram cost each session a send through the loopback (5–8 µs of
//! a worker, which showed in the proxy's p99 at saturation). The sidecar reads what nginx
//! appended and then frees it (it punches a hole over what it has read: see
//! [`exporter`](crate::exporter)), so the file never needs rotating and holds only what is
//! still unread. The volume is a tmpfs of [`LOG_VOLUME_BYTES`]: a sidecar that stalls or is
//! gone fills it, and then nginx's writes fail (`ENOSPC`, after which nginx skips the log for
//! the rest of that second) and those lines are lost, while nginx serves on and the pod is never
//! evicted for it. A FIFO would block nginx's workers when its reader stalls, and a Unix
//! datagram socket queues only `net.unix.max_dgram_qlen` lines (10 on many hosts).
//!
//! Both ends live here: the directives [`nginx::render`](super::nginx::render) writes, and the
//! reading of what they produce ([`parse`]). The backend behind each logged address comes from
//! [`upstreams`](super::upstreams).

use std::fmt::Write as _;

use crate::api::Protocol;

/// The name of the log format.
const FORMAT_NAME: &str = "balancer";

/// The fields of a line, in order. Upstream lists are quoted: one entry per server tried.
const FORMAT: &str = "$server_port $protocol $status $bytes_received $bytes_sent $session_time \
                      \"$upstream_addr\" \"$upstream_connect_time\"";

/// What each nginx worker gathers before it writes, and how long a line waits at most: the
/// sidecar's counts trail the sessions by up to [`FLUSH`] (and its own read interval).
const BUFFER: &str = "64k";

/// See [`BUFFER`].
const FLUSH: &str = "1s";

/// Where a proxy pod mounts the log's volume, in nginx's container and in the sidecar.
pub const LOG_DIR: &str = "/var/log/balancer";

/// The access log in a proxy pod.
pub const LOG_FILE: &str = "/var/log/balancer/access.log";

/// The log's volume: a tmpfs this large (the emptyDir's `sizeLimit`), about 75,000 unread
/// lines, 7 s of sessions at 10,000 a second. nginx's container pays for what is unread in its
/// memory, so this is also the most the log adds to the proxy's.
pub const LOG_VOLUME_BYTES: u64 = 8 << 20;

/// The port the metrics sidecar serves `/metrics` on in the proxy pod: 9113
/// (nginx-prometheus-exporter's), or the next port nginx does not listen on (`taken`: every
/// port of the proxy, a Balancer's `spec.ports` or a Gateway's listeners).
pub fn metrics_port(taken: impl IntoIterator<Item = i32>) -> u16 {
    let taken: Vec<i32> = taken.into_iter().collect();
    let taken = |port: u16| taken.contains(&i32::from(port));
    (9113..=u16::MAX).find(|&p| !taken(p)).unwrap_or(9113)
}

/// The `stream` block's directives that log every session to the file at `path`.
pub(super) fn directives(path: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "    log_format {FORMAT_NAME} '{FORMAT}';");
    let _ = writeln!(out, "    access_log {path} {FORMAT_NAME} buffer={BUFFER} flush={FLUSH};");
    out
}

/// How a session ended: nginx's stream `$status`, named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Outcome {
    /// 200: the session completed.
    Ok = 0,
    /// 400: the client's data could not be parsed (PROXY protocol, for instance).
    BadRequest = 1,
    /// 403: access was refused.
    Forbidden = 2,
    /// 500: nginx failed.
    InternalError = 3,
    /// 502: no backend could be connected to.
    BadGateway = 4,
    /// 503: a limit refused the session.
    Unavailable = 5,
}

impl Outcome {
    /// Every outcome, for documentation and tests.
    pub const ALL: [Outcome; 6] = [
        Outcome::Ok,
        Outcome::BadRequest,
        Outcome::Forbidden,
        Outcome::InternalError,
        Outcome::BadGateway,
        Outcome::Unavailable,
    ];

    fn from_status(status: &str) -> Option<Outcome> {
        Some(match status {
            "200" => Outcome::Ok,
            "400" => Outcome::BadRequest,
            "403" => Outcome::Forbidden,
            "500" => Outcome::InternalError,
            "502" => Outcome::BadGateway,
            "503" => Outcome::Unavailable,
            _ => return None,
        })
    }

    /// The label value.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// One backend server nginx tried for a session.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attempt<'a> {
    /// `ip:port`, as in `nginx.conf`'s `server` lines.
    pub address: &'a str,
    /// Seconds to connect; `None` when the connection failed.
    pub connect_seconds: Option<f64>,
}

/// One session, as its log line tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct Session<'a> {
    /// The port nginx took the session on.
    pub port: u16,
    /// Its protocol.
    pub protocol: Protocol,
    /// How the session went, and to which server.
    pub outcome: Outcome,
    /// Bytes from the client.
    pub bytes_received: u64,
    /// Bytes to the client.
    pub bytes_sent: u64,
    /// The session's duration, in seconds.
    pub seconds: f64,
    /// The servers tried, in order; the last one served the session if any did.
    pub attempts: Vec<Attempt<'a>>,
}

/// Why a line was not counted: each is a label value of the sidecar's skipped-lines counter.
#[allow(missing_docs, reason = "each variant's #[error] message says what it is")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum LineError {
    #[error("a field is missing or malformed")]
    Malformed,
    #[error("an unknown $status")]
    UnknownStatus,
    #[error("more servers tried than a Balancer has backends")]
    TooManyAttempts,
}

impl LineError {
    /// Every reason, for the counter's series.
    pub const ALL: [LineError; 3] = [LineError::Malformed, LineError::UnknownStatus, LineError::TooManyAttempts];

    /// The label value.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// A Balancer has at most this many backends, so nginx tries at most this many servers.
const MAX_ATTEMPTS: usize = crate::api::MAX_BACKENDS;

/// Reads one line: `80 TCP 200 2 3 0.001 "a, b" "-, 0.000"`.
pub fn parse(line: &str) -> Result<Session<'_>, LineError> {
    let line = line.trim_end_matches(['\n', '\r']);
    let (plain, quoted) = line.split_once(" \"").ok_or(LineError::Malformed)?;
    let mut fields = plain.split(' ');
    let mut next = || fields.next().ok_or(LineError::Malformed);
    let port = next()?.parse().map_err(|_| LineError::Malformed)?;
    let protocol = next()?.parse().map_err(|_| LineError::Malformed)?;
    let outcome = Outcome::from_status(next()?).ok_or(LineError::UnknownStatus)?;
    let bytes_received = next()?.parse().map_err(|_| LineError::Malformed)?;
    let bytes_sent = next()?.parse().map_err(|_| LineError::Malformed)?;
    let seconds = seconds(next()?).ok_or(LineError::Malformed)?;
    if fields.next().is_some() {
        return Err(LineError::Malformed);
    }
    let (addresses, times) = quoted.split_once("\" \"").ok_or(LineError::Malformed)?;
    let times = times.strip_suffix('"').ok_or(LineError::Malformed)?;
    let attempts = attempts(addresses, times)?;
    Ok(Session { port, protocol, outcome, bytes_received, bytes_sent, seconds, attempts })
}

/// The servers tried and their connect times, two lists of the same length (a lone `-` means
/// no server was tried).
fn attempts<'a>(addresses: &'a str, times: &'a str) -> Result<Vec<Attempt<'a>>, LineError> {
    if addresses == "-" {
        return Ok(Vec::new());
    }
    let (addresses, times) = (addresses.split(", "), times.split(", "));
    let mut attempts = Vec::new();
    for pair in addresses.zip_longest(times) {
        let (Some(address), Some(time)) = pair else { return Err(LineError::Malformed) };
        if attempts.len() == MAX_ATTEMPTS {
            return Err(LineError::TooManyAttempts);
        }
        let connect_seconds = match time {
            "-" => None,
            time => Some(seconds(time).ok_or(LineError::Malformed)?),
        };
        attempts.push(Attempt { address, connect_seconds });
    }
    Ok(attempts)
}

/// nginx's `1.234` (milliseconds resolution), as seconds; never negative or infinite.
fn seconds(text: &str) -> Option<f64> {
    let bounded = text.len() <= 16 && text.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    bounded.then(|| text.parse().ok()).flatten().filter(|s: &f64| s.is_finite())
}

/// Pairs two iterators to the end of the longer one.
trait ZipLongest: Iterator + Sized {
    fn zip_longest<J: Iterator>(self, other: J) -> impl Iterator<Item = (Option<Self::Item>, Option<J::Item>)> {
        let (mut a, mut b) = (self, other);
        std::iter::from_fn(move || match (a.next(), b.next()) {
            (None, None) => None,
            pair => Some(pair),
        })
    }
}

impl<I: Iterator> ZipLongest for I {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tcp_session_that_tried_two_servers() {
        let line = "80 TCP 200 2 3 0.012 \"10.0.0.1:80, 10.0.0.2:80\" \"-, 0.001\"";
        let session = parse(line).unwrap();
        assert_eq!((session.port, session.protocol, session.outcome), (80, Protocol::Tcp, Outcome::Ok));
        assert_eq!((session.bytes_received, session.bytes_sent, session.seconds), (2, 3, 0.012));
        assert_eq!(
            session.attempts,
            [
                Attempt { address: "10.0.0.1:80", connect_seconds: None },
                Attempt { address: "10.0.0.2:80", connect_seconds: Some(0.001) }
            ]
        );
    }

    #[test]
    fn a_session_that_reached_no_server_and_an_ipv6_one() {
        let none = parse("53 UDP 502 1 0 0.000 \"-\" \"-\"\n").unwrap();
        assert_eq!((none.outcome, none.attempts.len()), (Outcome::BadGateway, 0));
        let six = parse("80 TCP 200 0 0 1.5 \"[fd00::1]:80\" \"0.000\"").unwrap();
        assert_eq!(six.attempts[0].address, "[fd00::1]:80");
    }

    #[test]
    fn a_garbled_or_hostile_line_is_an_error_never_a_panic() {
        let cases = [
            ("", LineError::Malformed),
            ("<190>Nov 24 12:21:47 balancer: 80 TCP 200 1 1 0.1 \"a\" \"0\"", LineError::Malformed),
            ("80 TCP 200 1 1 0.1", LineError::Malformed),
            ("99999 TCP 200 1 1 0.1 \"a\" \"0\"", LineError::Malformed),
            ("80 SCTP 200 1 1 0.1 \"a\" \"0\"", LineError::Malformed),
            ("80 TCP 418 1 1 0.1 \"a\" \"0\"", LineError::UnknownStatus),
            ("80 TCP 200 -1 1 0.1 \"a\" \"0\"", LineError::Malformed),
            ("80 TCP 200 1 1 NaN \"a\" \"0\"", LineError::Malformed),
            ("80 TCP 200 1 1 1e999 \"a\" \"0\"", LineError::Malformed),
            ("80 TCP 200 1 1 0.1 extra \"a\" \"0\"", LineError::Malformed),
            ("80 TCP 200 1 1 0.1 \"a, b\" \"0\"", LineError::Malformed),
            ("80 TCP 200 1 1 0.1 \"a\" \"0", LineError::Malformed),
        ];
        for (line, error) in cases {
            assert_eq!(parse(line), Err(error), "{line:?}");
        }
        let many = vec!["a"; MAX_ATTEMPTS + 1].join(", ");
        let times = vec!["0"; MAX_ATTEMPTS + 1].join(", ");
        let line = format!("80 TCP 200 1 1 0.1 \"{many}\" \"{times}\"");
        assert_eq!(parse(&line), Err(LineError::TooManyAttempts));
    }

    #[test]
    fn the_outcomes_are_in_discriminant_order() {
        assert!(Outcome::ALL.iter().enumerate().all(|(i, o)| *o as usize == i), "ALL is in discriminant order");
    }

    #[test]
    fn the_label_values_are_the_documented_ones() {
        let outcomes = Outcome::ALL.map(Outcome::name);
        assert_eq!(outcomes, ["ok", "bad_request", "forbidden", "internal_error", "bad_gateway", "unavailable"]);
        let reasons = LineError::ALL.map(LineError::name);
        assert_eq!(reasons, ["malformed", "unknown_status", "too_many_attempts"]);
    }
}

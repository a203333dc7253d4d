//! What a proxy pod's metrics sidecar says of each backend for a canary's gates: counts of the
//! sessions opened since the pod began serving the configuration it serves now (the step's
//! window: every step of a canary is a configuration of its own), summed over ports. Both ends
//! read this one type: the sidecar counts into it, the controller asks each pod for it at
//! [`SIGNALS_PATH`], adds the pods' answers up ([`Window::add`]) and the gates read ratios and a
//! percentile from the sum.
//!
//! Counts, not a time series: the controller needs no metrics server, and a window has no more
//! values than the configuration has backends.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where the sidecar answers with its pod's [`Signals`], as JSON.
pub const SIGNALS_PATH: &str = "/signals";

/// The most of an answer the controller reads: a Balancer has at most 64 backends, each well
/// under 400 bytes of counts.
pub const MAX_SIGNALS_BYTES: usize = 64 * 1024;

/// Upstream connect times, in seconds (nginx measures milliseconds): a backend on the same node
/// takes under 1 ms. The bounds of the sidecar's histogram and of a connect-time gate's values.
pub const CONNECT_BUCKETS: [f64; 10] = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0];

/// One pod's window.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Signals {
    /// The short id of the configuration nginx serves.
    pub config: String,
    /// The canary window the counts belong to: the step the configuration nginx serves was made
    /// for (empty when it was made for none).
    pub window: String,
    /// How long the window has been open, in milliseconds.
    pub window_ms: u64,
    /// Each backend's weight at the first port, as nginx serves it.
    pub weights: BTreeMap<String, u32>,
    /// Each backend's counts, by its name in the configuration.
    pub backends: BTreeMap<String, Window>,
}

/// One backend's counts over a window.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Window {
    /// Sessions that nginx sent to this backend first and that the backend's side ended:
    /// nginx's status 200, 500 or 502 (400, 403 and 503 are the client's or the proxy's own
    /// limits, and say nothing of the backend; nor does a 200 in which neither side sent a
    /// byte, a TCP health check).
    pub sessions: u64,
    /// Of those, the ones nginx ended with 500 or 502 (no backend could be connected to).
    pub errors: u64,
    /// Of those, the ones that ended 200 with the client's bytes never answered: a backend that
    /// accepts and then resets or closes.
    pub unanswered: u64,
    /// Connects to this backend, in any try of a session.
    pub connects: u64,
    /// Of those, the ones that failed (refused, reset, timed out).
    pub connect_failures: u64,
    /// Successful connects by time: one count per [`CONNECT_BUCKETS`] bound (at most that
    /// long, and longer than the bound before), then one for longer than the last.
    pub connect_times: Vec<u64>,
}

impl Window {
    /// A window of no sessions, with every connect-time bucket.
    pub fn empty() -> Window {
        Window { connect_times: vec![0; CONNECT_BUCKETS.len() + 1], ..Window::default() }
    }

    /// Adds `other`'s counts (another pod's, or another port's); a histogram of the wrong
    /// length (a sidecar of another release) adds nothing to the times.
    pub fn add(&mut self, other: &Window) {
        self.sessions = self.sessions.saturating_add(other.sessions);
        self.errors = self.errors.saturating_add(other.errors);
        self.unanswered = self.unanswered.saturating_add(other.unanswered);
        self.connects = self.connects.saturating_add(other.connects);
        self.connect_failures = self.connect_failures.saturating_add(other.connect_failures);
        if self.connect_times.len() != CONNECT_BUCKETS.len() + 1 {
            self.connect_times = vec![0; CONNECT_BUCKETS.len() + 1];
        }
        if other.connect_times.len() == self.connect_times.len() {
            for (sum, count) in self.connect_times.iter_mut().zip(&other.connect_times) {
                *sum = sum.saturating_add(*count);
            }
        }
    }

    /// Counts one successful connect that took `seconds`.
    pub fn connected(&mut self, seconds: f64) {
        if self.connect_times.len() != CONNECT_BUCKETS.len() + 1 {
            self.connect_times = vec![0; CONNECT_BUCKETS.len() + 1];
        }
        let bucket = CONNECT_BUCKETS.iter().position(|&bound| seconds <= bound).unwrap_or(CONNECT_BUCKETS.len());
        self.connect_times[bucket] = self.connect_times[bucket].saturating_add(1);
    }

    /// Failed connects of those tried, 0 to 1; `None` before the first.
    pub fn connect_failure_ratio(&self) -> Option<f64> {
        ratio(self.connect_failures, self.connects)
    }

    /// Sessions ended in error or unanswered, of the sessions, 0 to 1; `None` before the first.
    pub fn error_session_ratio(&self) -> Option<f64> {
        ratio(self.errors.saturating_add(self.unanswered), self.sessions)
    }

    /// The bound, in seconds, of the histogram's bucket that holds the 95th percentile of
    /// connect times (infinite above the last bound); `None` before the first connect.
    pub fn connect_time_p95(&self) -> Option<f64> {
        // Wide enough for any counts a sidecar may send.
        let total: u128 = self.connect_times.iter().map(|&n| u128::from(n)).sum();
        if total == 0 {
            return None;
        }
        // The smallest bucket with at least 95 % of the connects at or below it.
        let mut seen = 0u128;
        for (i, count) in self.connect_times.iter().enumerate() {
            seen += u128::from(*count);
            if seen * 100 >= total * 95 {
                return Some(CONNECT_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY));
            }
        }
        Some(f64::INFINITY)
    }
}

fn ratio(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part.min(whole) as f64 / whole as f64)
}

impl Signals {
    /// Every backend's counts summed over `pods`' windows.
    pub fn sum<'a>(pods: impl IntoIterator<Item = &'a Signals>) -> BTreeMap<String, Window> {
        let mut sum: BTreeMap<String, Window> = BTreeMap::new();
        for pod in pods {
            for (backend, window) in &pod.backends {
                sum.entry(backend.clone()).or_insert_with(Window::empty).add(window);
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_count_what_the_backend_ended_and_none_before_the_first_session() {
        let mut window = Window::empty();
        assert_eq!(window.error_session_ratio(), None, "no data is not a ratio of 0");
        window.sessions = 200;
        window.errors = 3;
        window.unanswered = 1;
        assert_eq!(window.error_session_ratio(), Some(0.02));
        window.connects = 50;
        window.connect_failures = 5;
        assert_eq!(window.connect_failure_ratio(), Some(0.1));
        window.connect_failures = 500;
        assert_eq!(window.connect_failure_ratio(), Some(1.0), "never above 1");
    }

    #[test]
    fn the_p95_is_the_bound_of_the_bucket_that_holds_it() {
        let mut window = Window::empty();
        assert_eq!(window.connect_time_p95(), None);
        for _ in 0..95 {
            window.connected(0.0004);
        }
        for _ in 0..5 {
            window.connected(0.3);
        }
        assert_eq!(window.connect_time_p95(), Some(0.001));
        window.connected(0.3);
        assert_eq!(window.connect_time_p95(), Some(0.5));
        for _ in 0..200 {
            window.connected(9.0);
        }
        assert_eq!(window.connect_time_p95(), Some(f64::INFINITY), "above the last bound");
    }

    #[test]
    fn pods_add_up_and_a_histogram_of_another_length_adds_no_times() {
        let mut one = Window::empty();
        one.sessions = 10;
        one.connected(0.001);
        let other = Window { sessions: 5, connect_times: vec![1, 2], ..Window::default() };
        let pod = |backends: Vec<(&str, Window)>| Signals {
            backends: backends.into_iter().map(|(name, window)| (name.to_string(), window)).collect(),
            ..Signals::default()
        };
        let sum = Signals::sum(&[pod(vec![("v1", one.clone()), ("v2", one.clone())]), pod(vec![("v1", other)])]);
        assert_eq!(sum["v1"].sessions, 15);
        assert_eq!(sum["v1"].connect_times.iter().sum::<u64>(), 1);
        assert_eq!(sum["v2"], one);
    }
}

//! A running canary's window in one proxy pod: each backend's counts of the sessions opened
//! since nginx began serving the configuration made for the canary's step (its mark, from the
//! model), which the controller reads at [`SIGNALS_PATH`](crate::proxy::signals::SIGNALS_PATH).
//! A session counts when it began after the window opened: nginx logs a session when it ends,
//! so its start is the time it was read less its duration (its log line waits up to a second
//! in nginx's buffer, which moves a start that much later at most).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::proxy::access_log::{Outcome, Session};
use crate::proxy::signals::{Signals, Window};

/// The window, when a canary step's configuration is served.
#[derive(Debug, Default)]
pub(super) struct CanaryWindow {
    open: Option<Open>,
}

#[derive(Debug)]
struct Open {
    mark: String,
    since: Instant,
    backends: BTreeMap<String, Window>,
}

impl CanaryWindow {
    /// nginx serves a configuration made for `mark` (none: for no canary step) from `now`: a new
    /// mark opens a new window, the same one keeps counting.
    pub(super) fn serve(&mut self, mark: Option<&str>, now: Instant) {
        match (mark, &self.open) {
            (Some(mark), Some(open)) if open.mark == mark => {}
            (Some(mark), _) => self.open = Some(Open { mark: mark.to_string(), since: now, backends: BTreeMap::new() }),
            (None, _) => self.open = None,
        }
    }

    /// Counts a session read at `now`, whose tries reached `servers` (backend, connect seconds or
    /// `None` for a failed connect), in order.
    pub(super) fn count(&mut self, session: &Session<'_>, servers: &[(String, Option<f64>)], now: Instant) {
        let Some(open) = self.open.as_mut() else { return };
        let lasted = Duration::try_from_secs_f64(session.seconds).unwrap_or(Duration::MAX);
        if now.checked_sub(lasted).is_none_or(|began| began < open.since) {
            return;
        }
        let backends = &mut open.backends;
        for (backend, connected) in servers {
            let window = at(backends, backend);
            window.connects += 1;
            match connected {
                Some(seconds) => window.connected(*seconds),
                None => window.connect_failures += 1,
            }
        }
        // A session belongs to the backend nginx picked for it: the first it tried.
        let Some((first, _)) = servers.first() else { return };
        let window = at(backends, first);
        match session.outcome {
            // Nothing said either way: a TCP health check (the kubelet's probe of the proxy pod,
            // a cloud load balancer's of the front Service), which tells nothing of the backend.
            Outcome::Ok if session.bytes_received == 0 && session.bytes_sent == 0 => {}
            Outcome::Ok => {
                window.sessions += 1;
                // Asked and never answered.
                if session.bytes_sent == 0 {
                    window.unanswered += 1;
                }
            }
            Outcome::InternalError | Outcome::BadGateway => {
                window.sessions += 1;
                window.errors += 1;
            }
            Outcome::BadRequest | Outcome::Forbidden | Outcome::Unavailable => {}
        }
    }

    /// What the controller reads: the window's counts, with the configuration nginx serves and
    /// each backend's weight there.
    pub(super) fn signals(&self, config: String, weights: BTreeMap<String, u32>, now: Instant) -> Signals {
        let Some(open) = &self.open else { return Signals { config, weights, ..Signals::default() } };
        Signals {
            config,
            window: open.mark.clone(),
            window_ms: u64::try_from(now.duration_since(open.since).as_millis()).unwrap_or(u64::MAX),
            weights,
            backends: open.backends.clone(),
        }
    }
}

/// `backend`'s counts, made empty on its first session.
fn at<'a>(backends: &'a mut BTreeMap<String, Window>, backend: &str) -> &'a mut Window {
    backends.entry(backend.to_string()).or_insert_with(Window::empty)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Protocol;

    fn session(outcome: Outcome, bytes_sent: u64, seconds: f64) -> Session<'static> {
        asked(10, outcome, bytes_sent, seconds)
    }

    fn asked(bytes_received: u64, outcome: Outcome, bytes_sent: u64, seconds: f64) -> Session<'static> {
        Session { port: 80, protocol: Protocol::Tcp, outcome, bytes_received, bytes_sent, seconds, attempts: vec![] }
    }

    fn tried(servers: &[(&str, Option<f64>)]) -> Vec<(String, Option<f64>)> {
        servers.iter().map(|(b, c)| (b.to_string(), *c)).collect()
    }

    #[test]
    fn sessions_opened_in_the_window_count_for_the_backend_picked_first() {
        let start = Instant::now();
        let mut window = CanaryWindow::default();
        window.count(&session(Outcome::Ok, 5, 0.0), &tried(&[("v2", Some(0.0005))]), start);
        assert_eq!(window.signals("c".into(), BTreeMap::new(), start).window, "", "no window: nothing counted");
        window.serve(Some("r/1/0"), start);
        let later = start + Duration::from_secs(10);
        window.count(&session(Outcome::Ok, 5, 0.2), &tried(&[("v2", Some(0.0005))]), later);
        window.count(&session(Outcome::Ok, 0, 0.1), &tried(&[("v2", Some(0.0005))]), later);
        window.count(&session(Outcome::Ok, 5, 0.1), &tried(&[("v2", None), ("v1", Some(0.001))]), later);

        window.count(&session(Outcome::BadGateway, 0, 0.1), &tried(&[("v2", None), ("v1", None)]), later);
        window.count(&session(Outcome::Unavailable, 0, 0.0), &tried(&[("v2", Some(0.001))]), later);
        window.count(&session(Outcome::Ok, 5, 60.0), &tried(&[("v2", Some(0.001))]), later);
        window.count(&session(Outcome::Ok, 5, f64::NAN), &tried(&[("v2", Some(0.001))]), later);
        // A health check's session: connected, nothing said either way.
        window.count(&asked(0, Outcome::Ok, 0, 0.0), &tried(&[("v2", Some(0.001))]), later);
        let signals = window.signals("c".into(), BTreeMap::from([("v2".into(), 5)]), later);
        assert_eq!((signals.window.as_str(), signals.window_ms), ("r/1/0", 10_000));
        let canary = &signals.backends["v2"];
        assert_eq!((canary.sessions, canary.errors, canary.unanswered), (4, 1, 1), "the 503 and the check in neither");
        assert_eq!((canary.connects, canary.connect_failures), (6, 2), "the check's connect counts");
        let stable = &signals.backends["v1"];
        assert_eq!((stable.sessions, stable.connects, stable.connect_failures), (0, 2, 1), "tried second only");
    }

    #[test]
    fn a_new_mark_opens_a_new_window_and_the_same_one_keeps_counting() {
        let start = Instant::now();
        let mut window = CanaryWindow::default();
        window.serve(Some("a"), start);
        window.count(&session(Outcome::Ok, 5, 0.0), &tried(&[("v2", Some(0.001))]), start);
        window.serve(Some("a"), start + Duration::from_secs(1));
        assert_eq!(window.signals(String::new(), BTreeMap::new(), start).backends["v2"].sessions, 1);
        window.serve(Some("b"), start);
        assert!(window.signals(String::new(), BTreeMap::new(), start).backends.is_empty());
        window.serve(None, start);
        assert_eq!(window.signals(String::new(), BTreeMap::new(), start).window, "");
    }
}

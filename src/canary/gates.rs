//! A step's gates, judged on the windows the proxy pods measured: each gate's verdict, and the
//! step's. Too little data holds a gate; it never fails one.

use std::fmt;

use crate::api::canary::GateSignal;
use crate::proxy::signals::Window;
use crate::spec::canary::{Analysis, Gate};

/// One gate's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
pub enum Verdict {
    /// Within its bounds, on enough sessions.
    Passed,
    /// Past a bound, on enough sessions.
    Failed,
    /// Too little data to say.
    Held,
}

/// One gate's check: the values beside the verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Check<'a> {
    /// The gate.
    pub gate: &'a Gate,
    /// The canary's value; `None` before its first session.
    pub canary: Option<f64>,
    /// The stable backend's value in the same window.
    pub stable: Option<f64>,
    /// The verdict.
    pub verdict: Verdict,
}

/// A step's check: every gate's, and what they come to.
#[derive(Debug, Clone, PartialEq)]
pub struct StepCheck<'a> {
    /// Each gate's, in spec order.
    pub checks: Vec<Check<'a>>,
    /// The gates that act (not observe-only): failed if one failed, passed if all passed on
    /// enough sessions, else held.
    pub verdict: Verdict,
    /// Sessions the canary had in the window.
    pub canary_sessions: u64,
    /// Sessions the stable backend had in the window.
    pub stable_sessions: u64,
}

/// Judges every gate of `analysis` on the canary's and the stable backend's windows. When the
/// stable backend takes no new connection (`stable_serves` false: the canary at 100 %), a
/// relative bound has nothing to compare with and only `max` is judged.
pub fn judge<'a>(analysis: &'a Analysis, canary: &Window, stable: &Window, stable_serves: bool) -> StepCheck<'a> {
    let enough = |window: &Window| window.sessions >= analysis.min_sessions;
    let checks: Vec<Check<'a>> = analysis
        .gates
        .iter()
        .map(|gate| check(gate, canary, stable, enough(canary), stable_serves.then(|| enough(stable))))
        .collect();
    let acting = || checks.iter().filter(|c| !c.gate.observe_only);
    let verdict = if acting().any(|c| c.verdict == Verdict::Failed) {
        Verdict::Failed
    } else if enough(canary) && acting().all(|c| c.verdict == Verdict::Passed) {
        Verdict::Passed
    } else {
        Verdict::Held
    };
    StepCheck { checks, verdict, canary_sessions: canary.sessions, stable_sessions: stable.sessions }
}

/// One gate; `stable_enough` is `None` when the stable backend takes no new connection.
fn check<'a>(
    gate: &'a Gate,
    canary: &Window,
    stable: &Window,
    canary_enough: bool,
    stable_enough: Option<bool>,
) -> Check<'a> {
    let (canary_value, stable_value) = (value(gate.signal, canary), value(gate.signal, stable));
    let verdict = match canary_value.filter(|_| canary_enough) {
        None => Verdict::Held,
        Some(value) if gate.max.is_some_and(|max| value > max) => Verdict::Failed,
        Some(value) => match (gate.max_over_stable.filter(|_| stable_enough.is_some()), stable_value) {
            (None, _) => Verdict::Passed,
            (Some(_), stable) if stable_enough != Some(true) || stable.is_none() => Verdict::Held,
            (Some(_), None) => Verdict::Held,
            (Some(over), Some(stable)) if value - stable > over + f64::EPSILON => Verdict::Failed,
            (Some(_), Some(_)) => Verdict::Passed,
        },
    };
    Check { gate, canary: canary_value, stable: stable_value, verdict }
}

/// A window's value of `signal`.
fn value(signal: GateSignal, window: &Window) -> Option<f64> {
    match signal {
        GateSignal::ConnectFailureRatio => window.connect_failure_ratio(),
        GateSignal::ErrorSessionRatio => window.error_session_ratio(),
        GateSignal::ConnectTimeP95 => window.connect_time_p95(),
    }
}

/// A value as the status and events write it: a ratio as a percentage, a time in ms.
pub struct Shown(pub GateSignal, pub f64);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Shown(signal, value) = *self;
        if !signal.is_time() {
            let percent = format!("{:.2}", value * 100.0);
            let trimmed = percent.trim_end_matches('0').trim_end_matches('.');
            write!(f, "{trimmed}%")
        } else if value.is_infinite() {
            write!(f, "over 5s")
        } else {
            write!(f, "{}ms", (value * 1000.0).round())
        }
    }
}

impl Gate {
    /// The bounds as a phrase: `max 1%, stable + 0.5%`.
    pub fn bounds(&self) -> String {
        let max = self.max.map(|max| format!("max {}", Shown(self.signal, max)));
        let over = self.max_over_stable.map(|over| format!("stable + {}", Shown(self.signal, over)));
        max.into_iter().chain(over).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::spec::canary::{DEFAULT_INTERVAL, DEFAULT_STEP_TIMEOUT};

    fn analysis(gates: Vec<Gate>) -> Analysis {
        Analysis {
            interval: DEFAULT_INTERVAL,
            min_sessions: 100,
            min_duration: Duration::ZERO,
            step_timeout: DEFAULT_STEP_TIMEOUT,
            on_timeout: Default::default(),
            failure_limit: 1,
            gates,
        }
    }

    fn gate(signal: GateSignal, max: Option<f64>, over: Option<f64>) -> Gate {
        Gate { signal, max, max_over_stable: over, observe_only: false }
    }

    fn judge_all<'a>(analysis: &'a Analysis, canary: &Window, stable: &Window) -> StepCheck<'a> {
        judge(analysis, canary, stable, true)
    }

    fn sessions(sessions: u64, errors: u64) -> Window {
        Window { sessions, errors, ..Window::empty() }
    }

    #[test]
    fn too_few_sessions_hold_and_never_fail() {
        let errors = analysis(vec![gate(GateSignal::ErrorSessionRatio, Some(0.01), None)]);
        let check = judge_all(&errors, &sessions(99, 99), &sessions(1000, 0));
        assert_eq!(check.verdict, Verdict::Held, "99 failed sessions of 99 are not yet enough");
        assert_eq!(check.checks[0].canary, Some(1.0), "the value is still shown");
        assert_eq!(judge_all(&errors, &sessions(100, 2), &sessions(0, 0)).verdict, Verdict::Failed);
        assert_eq!(judge_all(&errors, &sessions(100, 1), &sessions(0, 0)).verdict, Verdict::Passed);
        let none = analysis(vec![]);
        assert_eq!(judge_all(&none, &sessions(99, 0), &sessions(0, 0)).verdict, Verdict::Held, "sample size alone");
        assert_eq!(judge_all(&none, &sessions(100, 0), &sessions(0, 0)).verdict, Verdict::Passed);
    }

    #[test]
    fn a_relative_bound_compares_with_the_stable_backend_in_the_same_window() {
        let relative = analysis(vec![gate(GateSignal::ErrorSessionRatio, None, Some(0.005))]);
        assert_eq!(judge_all(&relative, &sessions(1000, 7), &sessions(1000, 3)).verdict, Verdict::Passed, "0.7 - 0.3");
        assert_eq!(judge_all(&relative, &sessions(1000, 9), &sessions(1000, 3)).verdict, Verdict::Failed, "0.9 - 0.3");
        assert_eq!(judge_all(&relative, &sessions(1000, 9), &sessions(10, 0)).verdict, Verdict::Held, "a quiet stable");
        let both = analysis(vec![gate(GateSignal::ErrorSessionRatio, Some(0.01), Some(0.005))]);
        assert_eq!(judge_all(&both, &sessions(1000, 20), &sessions(10, 0)).verdict, Verdict::Failed, "max alone fails");
        let at_100 = judge(&relative, &sessions(1000, 9), &sessions(0, 0), false);
        assert_eq!(at_100.verdict, Verdict::Passed, "no stable traffic: the relative bound is not judged");
    }

    #[test]
    fn connect_gates_read_connects_and_observe_only_gates_never_act() {
        let mut refused = sessions(200, 0);
        refused.connects = 200;
        refused.connect_failures = 200;
        let mut gates = vec![gate(GateSignal::ConnectFailureRatio, Some(0.01), None)];
        assert_eq!(judge_all(&analysis(gates.clone()), &refused, &sessions(0, 0)).verdict, Verdict::Failed);
        gates[0].observe_only = true;
        let observed = analysis(gates);
        let check = judge_all(&observed, &refused, &sessions(0, 0));
        assert_eq!((check.verdict, check.checks[0].verdict), (Verdict::Passed, Verdict::Failed));

        let mut slow = sessions(100, 0);
        for _ in 0..100 {
            slow.connected(0.04);
        }
        let p95 = analysis(vec![gate(GateSignal::ConnectTimeP95, Some(0.02), None)]);
        let check = judge_all(&p95, &slow, &sessions(0, 0));
        assert_eq!((check.verdict, check.checks[0].canary), (Verdict::Failed, Some(0.05)));
        assert_eq!(Shown(GateSignal::ConnectTimeP95, 0.05).to_string(), "50ms");
    }

    #[test]
    fn values_and_bounds_read_as_people_write_them() {
        assert_eq!(Shown(GateSignal::ErrorSessionRatio, 0.0075).to_string(), "0.75%");
        assert_eq!(Shown(GateSignal::ErrorSessionRatio, 0.0).to_string(), "0%");
        assert_eq!(Shown(GateSignal::ConnectFailureRatio, 1.0).to_string(), "100%");
        assert_eq!(Shown(GateSignal::ConnectTimeP95, f64::INFINITY).to_string(), "over 5s");
        assert_eq!(gate(GateSignal::ErrorSessionRatio, Some(0.01), Some(0.005)).bounds(), "max 1%, stable + 0.5%");
    }
}

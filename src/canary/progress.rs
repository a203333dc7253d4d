//! Where a canary goes next: the step machine, a pure function of the plan, the status it left
//! last time, and what was observed since ([`decide`]). Everything it needs to resume is in the
//! status it returns, so a restart, a new leader or an API server outage resumes the same step
//! with the same weight on the wire.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::gates::{self, Shown, StepCheck, Verdict};
use crate::api::canary::{
    CanaryAction, CanaryDecision, CanaryPhase, CanaryRequest, CanaryStatus, GateSignal, GateStatus, RollbackMode,
    SessionCounts, TimeoutAction,
};
use crate::proxy::signals::Window;
use crate::spec::canary::{CanaryPlan, DEFAULT_INTERVAL, DEFAULT_STEP_TIMEOUT, Step};

/// What was observed since the last decision.
#[derive(Debug, Clone, Default)]
pub struct Observed<'a> {
    /// The window every proxy pod serves (see [`window`]), when they all serve the same one:
    /// the step's weight is on the wire once it is the step's.
    pub serving: Option<String>,
    /// A check taken since the last decision, if one was.
    pub measured: Option<Measured>,
    /// The request a person wrote last.
    pub request: Option<&'a CanaryRequest>,
}

/// A check of the step's window, summed over the proxy pods.
#[derive(Debug, Clone, PartialEq)]
pub enum Measured {
    /// Every proxy pod answered for the step's window.
    Windows {
        /// The canary backend's.
        canary: Window,
        /// The stable backend's.
        stable: Window,
    },
    /// Some did not: a pod that does not answer is not a passed check.
    Incomplete {
        /// Pods that answered for the step's window.
        answered: usize,
        /// Proxy pods.
        pods: usize,
    },
}

/// Why a canary did what it did: each decision's and each event's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
pub enum Reason {
    /// A step's weight is on every proxy pod: its window starts.
    StepStarted,
    /// A step's gates have too little data.
    HeldForData,
    /// A step passed; the next one is set.
    StepPassed,
    /// A check failed (the canary is aborted once the failure limit is reached).
    GateFailed,
    /// A step held for data longer than its timeout.
    StepTimedOut,
    /// A `pause {}` step waits for `balancer canary promote`.
    WaitingForPromotion,
    /// A person promoted it.
    Promoted,
    /// Every step passed: the spec's weights serve.
    Completed,
    /// A person aborted it.
    Aborted,
    /// Going back down the weights taken.
    RollingBack,
    /// Back on the stable backend.
    RolledBack,
    /// A person started it again.
    Retried,
    /// A new canary (its backends or steps changed).
    Started,
    /// A request that does nothing in this phase.
    RequestIgnored,
    /// The operator runs without the proxy's metrics sidecar: nothing measures a canary.
    Unmeasured,
}

impl Reason {
    /// The reason as the status and events write it.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Something worth an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Why.
    pub reason: Reason,
    /// What, with the numbers.
    pub message: String,
    /// Whether it is a warning (a failed gate, a rollback).
    pub warning: bool,
}

/// The decision: the status to write, the events to record, and when to decide again at the
/// latest (a pause or a rollback step ending; a check is a wake of its own).
#[derive(Debug, Clone, PartialEq)]
pub struct Next {
    /// The canary's status.
    pub status: CanaryStatus,
    /// What happened, in order.
    pub events: Vec<Event>,
    /// When to look again at the latest.
    pub wake_after: Option<Duration>,
}

/// Decides the canary's next status from its last one (`None` before it started) and what was
/// observed since. `goal` is the canary's percentage of the pair in the spec's own weights.
pub fn decide(plan: &CanaryPlan, goal: u8, last: Option<&CanaryStatus>, observed: &Observed, now: Timestamp) -> Next {
    let mut machine = Machine { plan, goal, now, status: CanaryStatus::default(), events: Vec::new(), wake: None };
    match last {
        Some(last) if last.revision == plan.revision => machine.status = last.clone(),
        _ => machine.start(last),
    }
    machine.handle(observed.request);
    let applied = observed.serving.as_deref() == Some(window(&machine.status).as_str());
    match machine.status.phase {
        CanaryPhase::Completed | CanaryPhase::Aborted => {}
        CanaryPhase::RollingBack => machine.roll_back(applied),
        CanaryPhase::Progressing | CanaryPhase::Paused => machine.progress(applied, observed.measured.as_ref()),
    }
    Next { status: machine.status, events: machine.events, wake_after: machine.wake }
}

/// The window mark of the status's step: what the proxy pods' sidecars count under, so that each
/// step, each attempt and each weight on a way back is measured apart.
pub fn window(status: &CanaryStatus) -> String {
    match status.phase {
        CanaryPhase::RollingBack | CanaryPhase::Aborted => {
            format!("{}/{}/back/{}", status.revision, status.attempt, status.weight)
        }
        _ => format!("{}/{}/{}", status.revision, status.attempt, status.step),
    }
}

/// How often the proxy pods' signals are read, and the canary looked at again, while a step's
/// weight is on its way to them: the step starts once every pod serves it.
pub const WHILE_APPLYING: Duration = Duration::from_secs(1);

/// How often the proxy pods' signals are read for `status`'s step: every
/// [`WHILE_APPLYING`] until its weight is `applied` on every pod (a paused canary waits for a
/// person, not for its pods), then at the analysis's interval; a canary without an analysis, or
/// aborted, needs only to see its split applied, at the default interval.
pub fn reading_interval(plan: &CanaryPlan, status: &CanaryStatus, applied: bool) -> Duration {
    match &plan.analysis {
        _ if !applied && status.phase != CanaryPhase::Paused => WHILE_APPLYING,
        Some(analysis) if status.phase != CanaryPhase::Aborted => analysis.interval,
        _ => DEFAULT_INTERVAL,
    }
}

struct Machine<'a> {
    plan: &'a CanaryPlan,
    goal: u8,
    now: Timestamp,
    status: CanaryStatus,
    events: Vec<Event>,
    wake: Option<Duration>,
}

impl Machine<'_> {
    /// A new canary: step 0 of attempt 1; a person's last request stays handled.
    fn start(&mut self, last: Option<&CanaryStatus>) {
        let request = last.and_then(|l| l.request.clone());
        let pending =
            request.as_ref().filter(|r| last.and_then(|l| l.handled_request.as_deref()) != Some(r.id.as_str()));
        self.status = CanaryStatus {
            revision: self.plan.revision.clone(),
            attempt: 1,
            handled_request: request.as_ref().map(|r| r.id.clone()).or(last.and_then(|l| l.handled_request.clone())),
            request: request.clone(),
            ..CanaryStatus::default()
        };
        self.set_step(0);
        let message = format!(
            "canary {} from {} in {} steps, revision {}",
            self.plan.canary,
            self.plan.stable,
            self.plan.steps.len(),
            self.plan.revision
        );
        self.event(Reason::Started, message, false);
        if let Some(pending) = pending {
            let message = format!("{} (request {}) was for the canary before this one", pending.action, pending.id);
            self.event(Reason::RequestIgnored, message, true);
        }
    }

    /// Acts on a request not yet handled.
    fn handle(&mut self, request: Option<&CanaryRequest>) {
        let Some(request) = request.filter(|r| self.status.handled_request.as_deref() != Some(r.id.as_str())) else {
            return;
        };
        self.status.handled_request = Some(request.id.clone());
        let phase = self.status.phase;
        let active = matches!(phase, CanaryPhase::Progressing | CanaryPhase::Paused);
        match (request.action.parse::<CanaryAction>(), phase) {
            (Ok(CanaryAction::Promote), _) if active => {
                let step = self.status.step;
                self.event(
                    Reason::Promoted,
                    format!("step {} promoted by request {}", step.saturating_add(1), request.id),
                    false,
                );
                self.advance();
            }
            (Ok(CanaryAction::PromoteFull), _) if active || phase == CanaryPhase::RollingBack => {
                self.event(Reason::Promoted, format!("promoted to the end by request {}", request.id), false);
                self.complete();
            }
            (Ok(CanaryAction::Abort), _) if active => {
                let message =
                    format!("aborted by request {} at step {}", request.id, self.status.step.saturating_add(1));
                self.abort(Reason::Aborted, message);
            }
            (Ok(CanaryAction::Retry), CanaryPhase::Aborted | CanaryPhase::RollingBack) => {
                self.status.attempt = self.status.attempt.saturating_add(1);
                self.status.phase = CanaryPhase::Progressing;
                self.set_step(0);
                let message = format!("attempt {} started by request {}", self.status.attempt, request.id);
                self.event(Reason::Retried, message, false);
            }
            (action, _) => {
                let message = format!("{} does nothing to a canary that is {phase}", request.action);
                let message =
                    if action.is_err() { format!("{} is not a canary action", request.action) } else { message };
                self.event(Reason::RequestIgnored, message, true);
            }
        }
    }

    /// One step forward while progressing or paused.
    fn progress(&mut self, applied: bool, measured: Option<&Measured>) {
        let Some(started) = self.started() else {
            if !applied {
                // Paused (after the timeout below), a person decides: no need to look often.
                if self.status.phase == CanaryPhase::Progressing {
                    self.wake_at(WHILE_APPLYING);
                }
                return self.time_out_applying();
            }
            self.status.step_started_at = Some(Time(self.now));
            let message = format!(
                "step {} of {}: canary at {}%",
                self.status.step.saturating_add(1),
                self.plan.steps.len(),
                self.status.weight
            );
            self.event(Reason::StepStarted, message, false);
            return self.progress(applied, measured);
        };
        let elapsed = self.since(started);
        if let Some(measured) = measured
            && self.check(measured)
        {
            return;
        }
        if self.status.phase == CanaryPhase::Paused {
            // Waiting for a person: a failing gate still aborts (above), nothing else moves.
            return;
        }
        let step = self.plan.steps.get(self.step_index()).copied();
        let pause = match step {
            Some(Step::Pause(Some(duration))) => duration,
            _ => Duration::ZERO,
        };
        let own_terms = match step {
            Some(Step::SetWeight(_)) => true,
            Some(Step::Pause(Some(duration))) => {
                if elapsed < duration {
                    self.wake_at(duration - elapsed);
                }
                elapsed >= duration
            }
            Some(Step::Pause(None)) | None => false,
        };
        let gates_passed = match &self.plan.analysis {
            None => true,
            Some(analysis) => {
                // A new check wakes the reconcile by itself; only the end of `minDuration` needs a wake.
                if elapsed < analysis.min_duration {
                    self.wake_at(analysis.min_duration - elapsed);
                }
                self.status.verdict.as_deref() == Some(Verdict::Passed.into()) && elapsed >= analysis.min_duration
            }
        };
        if own_terms && gates_passed {
            let message = format!("step {} passed after {}s", self.status.step.saturating_add(1), elapsed.as_secs());
            self.event(Reason::StepPassed, message, false);
            return self.advance();
        }
        if step == Some(Step::Pause(None)) {
            self.status.phase = CanaryPhase::Paused;
            let message = format!("step {} waits for balancer canary promote", self.status.step.saturating_add(1));
            return self.event(Reason::WaitingForPromotion, message, false);
        }
        let min_duration = self.plan.analysis.as_ref().map_or(Duration::ZERO, |a| a.min_duration);
        self.time_out(elapsed.saturating_sub(pause.max(min_duration)));
    }

    /// Takes a check; returns whether it aborted the canary.
    fn check(&mut self, measured: &Measured) -> bool {
        let Some(analysis) = &self.plan.analysis else { return false };
        let (canary, stable) = match measured {
            Measured::Windows { canary, stable } => (canary, stable),
            Measured::Incomplete { answered, pods } => {
                self.status.verdict = Some(Verdict::Held.as_str().to_string());
                let message =
                    format!("{answered} of {pods} proxy pods answered for step {}", self.status.step.saturating_add(1));
                self.hold(message);
                return false;
            }
        };
        let check = gates::judge(analysis, canary, stable, self.status.weight < 100);
        self.record(&check);
        match check.verdict {
            Verdict::Passed => self.status.consecutive_failures = 0,
            Verdict::Held => {
                let message = format!(
                    "step {}: {} of {} canary sessions",
                    self.status.step.saturating_add(1),
                    check.canary_sessions,
                    analysis.min_sessions
                );
                self.hold(message);
            }
            Verdict::Failed => {
                self.status.consecutive_failures = self.status.consecutive_failures.saturating_add(1);
                let failures = self.status.consecutive_failures;
                let message = format!(
                    "step {} at {}%: {} (check {failures} of {} in a row)",
                    self.status.step.saturating_add(1),
                    self.status.weight,
                    failed_gates(&check, canary),
                    analysis.failure_limit
                );
                if u32::try_from(failures).unwrap_or(u32::MAX) >= analysis.failure_limit {
                    self.abort(Reason::GateFailed, message);
                    return true;
                }
                self.event(Reason::GateFailed, message, true);
            }
        }
        false
    }

    /// Records a check's values in the status.
    fn record(&mut self, check: &StepCheck) {
        self.status.verdict = Some(check.verdict.as_str().to_string());
        self.status.sessions = Some(SessionCounts {
            canary: i64::try_from(check.canary_sessions).unwrap_or(i64::MAX),
            stable: i64::try_from(check.stable_sessions).unwrap_or(i64::MAX),
        });
        self.status.gates = check
            .checks
            .iter()
            .map(|c| GateStatus {
                signal: c.gate.signal.as_str().to_string(),
                canary: c.canary.map(|v| Shown(c.gate.signal, v).to_string()),
                stable: c.stable.map(|v| Shown(c.gate.signal, v).to_string()),
                bounds: c.gate.bounds(),
                verdict: c.verdict.as_str().to_string(),
                observe_only: c.gate.observe_only,
            })
            .collect();
    }

    /// A held check: one event per step.
    fn hold(&mut self, message: String) {
        let held = self.status.decision.as_ref().is_some_and(|d| d.reason == Reason::HeldForData.as_str());
        if held {
            self.decided(Reason::HeldForData, message);
        } else {
            self.event(Reason::HeldForData, message, false);
        }
    }

    /// A step held for data past its timeout pauses or aborts, as the spec says. `held` counts
    /// from when the step could have passed (its pause and `minDuration` over): a long pause is
    /// not held, nor a step whose gates passed.
    fn time_out(&mut self, held: Duration) {
        let Some(analysis) = &self.plan.analysis else { return };
        if self.status.verdict.as_deref() == Some(Verdict::Passed.as_str()) {
            return;
        }
        if held < analysis.step_timeout {
            self.wake_at(analysis.step_timeout - held);
            return;
        }
        let message = format!("step {} held for data for {}s", self.status.step.saturating_add(1), held.as_secs());
        self.timed_out(message);
    }

    /// A step whose weight is not on every proxy pod a step timeout after it was set (a pod's
    /// sidecar does not answer, nginx refused the configuration) pauses or aborts likewise.
    fn time_out_applying(&mut self) {
        let Some(set) = self.status.step_set_at.as_ref().map(|t| t.0) else { return };
        let timeout = self.plan.analysis.as_ref().map_or(DEFAULT_STEP_TIMEOUT, |a| a.step_timeout);
        let waited = self.since(set);
        if self.status.phase != CanaryPhase::Progressing || waited < timeout {
            return;
        }
        let message = format!(
            "step {} is not on every proxy pod after {}s (a pod's sidecar does not answer, or nginx refused the configuration)",
            self.status.step.saturating_add(1),
            waited.as_secs()
        );
        self.timed_out(message);
    }

    fn timed_out(&mut self, message: String) {
        let on_timeout = self.plan.analysis.as_ref().map(|a| a.on_timeout).unwrap_or_default();
        match on_timeout {
            TimeoutAction::Pause => {
                self.status.phase = CanaryPhase::Paused;
                let message = format!("{message}: paused until promoted or aborted (a failing gate still aborts)");
                self.event(Reason::StepTimedOut, message, true);
            }
            TimeoutAction::Abort => self.abort(Reason::StepTimedOut, message),
        }
    }

    /// How long from `from` to now; nothing for a time in the future (another clock's, or a
    /// status someone wrote).
    fn since(&self, from: Timestamp) -> Duration {
        Duration::try_from(self.now.duration_since(from)).unwrap_or(Duration::ZERO)
    }

    /// The next step, or the end.
    fn advance(&mut self) {
        let next = self.step_index() + 1;
        if next >= self.plan.steps.len() {
            return self.complete();
        }
        self.status.phase = CanaryPhase::Progressing;
        self.status.consecutive_failures = 0;
        self.set_step(next);
    }

    /// Every step taken: the spec's weights serve.
    fn complete(&mut self) {
        self.status.phase = CanaryPhase::Completed;
        self.status.step = i32::try_from(self.plan.steps.len()).unwrap_or(i32::MAX);
        self.status.weight = i32::from(self.goal);
        self.clear_step();
        let message = format!("every step taken: the spec's weights serve, canary at {}%", self.goal);
        self.event(Reason::Completed, message, false);
    }

    /// Rolls back: at once, or down the weights taken.
    fn abort(&mut self, reason: Reason, message: String) {
        let from = u8::try_from(self.status.weight).unwrap_or(0);
        let next = match self.plan.rollback.mode {
            RollbackMode::Immediate => 0,
            RollbackMode::Stepped => self.plan.way_back(self.step_index(), from).first().copied().unwrap_or(0),
        };
        self.event(reason, message, true);
        self.go_back_to(next);
    }

    /// One weight down on the way back.
    fn go_back_to(&mut self, weight: u8) {
        self.status.weight = i32::from(weight);
        self.clear_step();
        if weight == 0 {
            self.status.phase = CanaryPhase::Aborted;
            self.event(Reason::RolledBack, "canary at 0%: the stable backend takes the pair's traffic".into(), true);
        } else {
            self.status.phase = CanaryPhase::RollingBack;
            self.event(Reason::RollingBack, format!("canary at {weight}% on the way back"), true);
        }
    }

    /// While rolling back a step at a time: each weight holds its time once applied.
    fn roll_back(&mut self, applied: bool) {
        let Some(started) = self.started() else {
            if applied {
                self.status.step_started_at = Some(Time(self.now));
                self.wake_at(self.plan.rollback.step_duration);
            } else {
                self.wake_at(WHILE_APPLYING);
            }
            return;
        };
        let elapsed = self.since(started);
        let hold = self.plan.rollback.step_duration;
        if elapsed < hold {
            return self.wake_at(hold - elapsed);
        }
        let from = u8::try_from(self.status.weight).unwrap_or(0);
        let next = self.plan.way_back(self.step_index(), from).first().copied().unwrap_or(0);
        self.go_back_to(next);
    }

    fn set_step(&mut self, index: usize) {
        self.status.step = i32::try_from(index).unwrap_or(i32::MAX);
        self.status.weight = i32::from(self.plan.weight_at(index));
        self.clear_step();
    }

    /// A new step's window: nothing measured yet.
    fn clear_step(&mut self) {
        self.status.step_set_at = Some(Time(self.now));
        self.status.step_started_at = None;
        self.status.verdict = None;
        self.status.sessions = None;
        self.status.gates.clear();
        self.status.consecutive_failures = 0;
    }

    fn started(&self) -> Option<Timestamp> {
        self.status.step_started_at.as_ref().map(|t| t.0)
    }

    fn step_index(&self) -> usize {
        usize::try_from(self.status.step).unwrap_or(0)
    }

    fn wake_at(&mut self, after: Duration) {
        let after = after.max(Duration::from_millis(100));
        self.wake = Some(self.wake.map_or(after, |wake| wake.min(after)));
    }

    fn decided(&mut self, reason: Reason, message: String) {
        self.status.decision =
            Some(CanaryDecision { reason: reason.as_str().to_string(), message, at: Time(self.now) });
    }

    fn event(&mut self, reason: Reason, message: String, warning: bool) {
        self.decided(reason, message.clone());
        self.events.push(Event { reason, message, warning });
    }
}

impl Verdict {
    /// The verdict as the status writes it.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// `ErrorSessionRatio 12.5% past max 1% (…)`: each acting gate that failed, with its numbers,
/// and the canary's counts behind them.
fn failed_gates(check: &StepCheck, canary: &Window) -> String {
    check
        .checks
        .iter()
        .filter(|c| c.verdict == Verdict::Failed && !c.gate.observe_only)
        .map(|c| {
            let shown = |v: Option<f64>| v.map_or("none".to_string(), |v| Shown(c.gate.signal, v).to_string());
            let stable = c.gate.max_over_stable.map(|_| format!(" (stable {})", shown(c.stable))).unwrap_or_default();
            let counts = match c.gate.signal {
                GateSignal::ConnectFailureRatio => {
                    format!("{} of {} connects failed", canary.connect_failures, canary.connects)
                }
                GateSignal::ErrorSessionRatio => format!(
                    "{} of {} sessions ended in error, {} unanswered",
                    canary.errors, canary.sessions, canary.unanswered
                ),
                GateSignal::ConnectTimeP95 => format!("{} connects timed", canary.connect_times.iter().sum::<u64>()),
            };
            format!("{} {}{stable} past {} ({counts})", c.gate.signal, shown(c.canary), c.gate.bounds())
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use crate::spec::canary::{Analysis, Gate, Rollback};

    use super::*;

    fn analysis(failure_limit: u32, on_timeout: TimeoutAction) -> Analysis {
        Analysis {
            interval: Duration::from_secs(1),
            min_sessions: 100,
            min_duration: Duration::from_secs(10),
            step_timeout: Duration::from_secs(60),
            on_timeout,
            failure_limit,
            gates: vec![Gate {
                signal: GateSignal::ErrorSessionRatio,
                max: Some(0.01),
                max_over_stable: None,
                observe_only: false,
            }],
        }
    }

    fn plan(steps: Vec<Step>, analysis: Option<Analysis>, mode: RollbackMode) -> CanaryPlan {
        CanaryPlan {
            stable: "v1".into(),
            canary: "v2".into(),
            steps,
            analysis,
            rollback: Rollback { mode, step_duration: Duration::from_secs(10) },
            revision: "rev".into(),
        }
    }

    #[test]
    fn signals_are_read_every_second_until_applied_then_at_the_interval() {
        let at = |phase| CanaryStatus { phase, ..CanaryStatus::default() };
        let mut judged = good_plan();
        if let Some(analysis) = judged.analysis.as_mut() {
            analysis.interval = Duration::from_secs(3);
        }
        let unjudged = plan(vec![Step::SetWeight(5)], None, RollbackMode::Immediate);
        let every = |plan: &CanaryPlan, phase, applied| reading_interval(plan, &at(phase), applied);
        assert_eq!(every(&judged, CanaryPhase::Progressing, false), WHILE_APPLYING);
        assert_eq!(every(&judged, CanaryPhase::RollingBack, false), WHILE_APPLYING);
        assert_eq!(every(&judged, CanaryPhase::Progressing, true), Duration::from_secs(3), "the analysis's");
        assert_eq!(every(&judged, CanaryPhase::Paused, false), Duration::from_secs(3), "a person, not its pods");
        assert_eq!(every(&judged, CanaryPhase::Aborted, true), DEFAULT_INTERVAL);
        assert_eq!(every(&unjudged, CanaryPhase::Progressing, true), DEFAULT_INTERVAL);
    }

    fn good_plan() -> CanaryPlan {
        let pause = Step::Pause(Some(Duration::from_secs(20)));
        plan(
            vec![Step::SetWeight(5), pause, Step::SetWeight(25), pause, Step::SetWeight(50), pause],
            Some(analysis(2, TimeoutAction::Pause)),
            RollbackMode::Immediate,
        )
    }

    fn windows(sessions: u64, errors: u64) -> Measured {
        Measured::Windows {
            canary: Window { sessions, errors, ..Window::empty() },
            stable: Window { sessions: sessions * 10, ..Window::empty() },
        }
    }

    /// Drives the machine: each call is one decision `seconds` after the first.
    struct Run {
        plan: CanaryPlan,
        status: Option<CanaryStatus>,
        start: Timestamp,
        events: Vec<(Reason, String)>,
    }

    impl Run {
        fn new(plan: CanaryPlan) -> Run {
            Run { plan, status: None, start: Timestamp::UNIX_EPOCH, events: Vec::new() }
        }

        /// `observed.serving` is [`APPLIED`] for "the current step's window".
        fn at(&mut self, seconds: i64, mut observed: Observed) -> &CanaryStatus {
            let now = self.start + SignedDuration::from_secs(seconds);
            if observed.serving.as_deref() == Some(APPLIED) {
                observed.serving = self.status.as_ref().map(window);
            }
            let next = decide(&self.plan, 100, self.status.as_ref(), &observed, now);
            self.events.extend(next.events.into_iter().map(|e| (e.reason, e.message)));
            self.status.insert(next.status)
        }

        fn reasons(&self) -> Vec<Reason> {
            self.events.iter().map(|(reason, _)| *reason).collect()
        }
    }

    use k8s_openapi::jiff::SignedDuration;

    const APPLIED: &str = "the current step's window";

    fn applied() -> Observed<'static> {
        Observed { serving: Some(APPLIED.into()), ..Observed::default() }
    }

    fn measured(measured: Measured) -> Observed<'static> {
        Observed { measured: Some(measured), ..applied() }
    }

    fn asked(request: &CanaryRequest, applied_before: bool) -> Observed<'_> {
        let serving = applied_before.then(|| APPLIED.to_string());
        Observed { serving, measured: None, request: Some(request) }
    }

    #[test]
    fn a_good_canary_takes_every_step_once_each_passed_and_long_enough() {
        let mut run = Run::new(good_plan());
        let status = run.at(0, Observed::default());
        assert_eq!((status.phase, status.step, status.weight, status.attempt), (CanaryPhase::Progressing, 0, 5, 1));
        assert_eq!(status.step_started_at, None, "not applied yet: the window has not started");
        assert_eq!(window(status), "rev/1/0");
        run.at(1, applied());
        assert_eq!(
            run.status.as_ref().and_then(|s| s.step_started_at.clone()),
            Some(Time(run.start + SignedDuration::from_secs(1)))
        );
        let status = run.at(5, measured(windows(500, 0)));
        assert_eq!((status.step, status.verdict.as_deref()), (0, Some("Passed")), "passed, but not 10 s yet");
        let status = run.at(11, applied());
        assert_eq!((status.step, status.weight), (1, 5), "the pause step keeps the weight, in a window of its own");
        assert_eq!(window(status), "rev/1/1");
        let mut seconds = 11;
        for _ in 0..5 {
            seconds += 1;
            run.at(seconds, applied());
            seconds += 1;
            run.at(seconds, measured(windows(500, 2)));
            seconds += 20;
            run.at(seconds, applied());
        }
        let status = run.status.clone().expect("a status");
        assert_eq!((status.phase, status.step, status.weight), (CanaryPhase::Completed, 6, 100));
        let passed = run.reasons().iter().filter(|r| **r == Reason::StepPassed).count();
        let started = run.reasons().iter().filter(|r| **r == Reason::StepStarted).count();
        assert_eq!((passed, started), (6, 6), "{:?}", run.events);
        assert_eq!(run.reasons().last(), Some(&Reason::Completed));
        let again = run.at(seconds + 100, measured(windows(500, 500)));
        assert_eq!(again.phase, CanaryPhase::Completed, "a completed canary judges nothing");
    }

    #[test]
    fn a_failing_canary_rolls_back_at_the_failure_limit_and_stays_back() {
        let mut run = Run::new(good_plan());
        run.at(0, applied());
        let status = run.at(1, measured(windows(200, 40)));
        assert_eq!((status.phase, status.consecutive_failures), (CanaryPhase::Progressing, 1));
        let status = run.at(2, measured(windows(400, 80)));
        assert_eq!((status.phase, status.weight, status.step), (CanaryPhase::Aborted, 0, 0));
        assert_eq!(
            run.reasons(),
            [Reason::Started, Reason::StepStarted, Reason::GateFailed, Reason::GateFailed, Reason::RolledBack]
        );
        let failed = &run.events[3].1;
        assert_eq!(
            failed,
            "step 1 at 5%: ErrorSessionRatio 20% past max 1% (80 of 400 sessions ended in error, 0 unanswered) \
             (check 2 of 2 in a row)"
        );
        let status = run.at(30, measured(windows(1000, 0)));
        assert_eq!((status.phase, status.weight), (CanaryPhase::Aborted, 0), "an aborted canary stays back");
        assert_eq!(window(status), "rev/1/back/0");
    }

    #[test]
    fn a_pass_between_failures_resets_the_count() {
        let mut run = Run::new(good_plan());
        run.at(0, applied());
        run.at(1, measured(windows(200, 40)));
        run.at(2, measured(windows(2000, 1)));
        let status = run.at(3, measured(windows(200, 40)));
        assert_eq!((status.phase, status.consecutive_failures), (CanaryPhase::Progressing, 1));
    }

    #[test]
    fn quiet_traffic_holds_with_a_reason_then_times_out_into_a_pause() {
        let mut run = Run::new(good_plan());
        run.at(0, applied());
        run.at(1, applied());
        let status = run.at(5, measured(windows(20, 20)));
        assert_eq!((status.phase, status.verdict.as_deref()), (CanaryPhase::Progressing, Some("Held")));
        let decision = status.decision.clone().expect("a decision");
        assert_eq!(
            (decision.reason.as_str(), decision.message.as_str()),
            ("HeldForData", "step 1: 20 of 100 canary sessions")
        );
        run.at(30, measured(windows(40, 40)));
        let held = run.reasons().iter().filter(|r| **r == Reason::HeldForData).count();
        assert_eq!(held, 1, "one event per step, the decision kept up to date");
        let status = run.at(61, applied());
        assert_eq!(status.phase, CanaryPhase::Progressing, "held 50 s past its 10 s minimum: not yet timed out");
        let status = run.at(71, applied());
        assert_eq!(status.phase, CanaryPhase::Paused, "held 60 s past its minimum: paused, never failed");
        assert_eq!(run.reasons().last(), Some(&Reason::StepTimedOut));

        let mut run = Run::new(good_plan());
        run.at(0, applied());
        run.at(1, applied());
        run.at(5, measured(windows(20, 0)));
        let status = run.at(12, measured(windows(150, 0)));
        assert_eq!(status.step, 1, "traffic back: it proceeds");
    }

    #[test]
    fn a_pod_that_does_not_answer_is_not_a_passed_check() {
        let mut run = Run::new(good_plan());
        run.at(0, applied());
        let status = run.at(20, measured(Measured::Incomplete { answered: 1, pods: 2 }));
        assert_eq!((status.step, status.verdict.as_deref()), (0, Some("Held")));
        assert_eq!(status.decision.as_ref().map(|d| d.message.as_str()), Some("1 of 2 proxy pods answered for step 1"));
    }

    #[test]
    fn a_pause_waits_for_promote_and_a_request_is_acted_on_once() {
        let steps = vec![Step::SetWeight(10), Step::Pause(None), Step::SetWeight(50)];
        let mut run = Run::new(plan(steps, None, RollbackMode::Immediate));
        run.at(0, applied());
        let status = run.at(1, applied());
        assert_eq!((status.step, status.phase), (1, CanaryPhase::Progressing), "step 1 set, being applied");
        let status = run.at(2, applied());
        assert_eq!((status.step, status.phase), (1, CanaryPhase::Paused));
        let status = run.at(500, applied());
        assert_eq!((status.step, status.phase), (1, CanaryPhase::Paused), "a pause {{}} has no end of its own");
        let promote = CanaryRequest { id: "a".into(), action: "Promote".into() };
        let status = run.at(501, asked(&promote, true));
        assert_eq!((status.step, status.weight, status.handled_request.as_deref()), (2, 50, Some("a")));
        let status = run.at(502, asked(&promote, false));
        assert_eq!(status.step, 2, "the same request again (a re-apply, a resync) does nothing");
        let abort = CanaryRequest { id: "b".into(), action: "Abort".into() };
        let status = run.at(503, asked(&abort, false));
        assert_eq!((status.phase, status.weight), (CanaryPhase::Aborted, 0));
        let status = run.at(504, asked(&promote, true));
        assert_eq!(status.phase, CanaryPhase::Aborted, "an old request is not acted on again");
        let retry = CanaryRequest { id: "c".into(), action: "Retry".into() };
        let status = run.at(505, asked(&retry, false));
        assert_eq!((status.phase, status.step, status.weight, status.attempt), (CanaryPhase::Progressing, 0, 10, 2));
        assert_eq!(window(status), "rev/2/0", "measured apart from the first attempt");
        let ignored = CanaryRequest { id: "d".into(), action: "Retry".into() };
        run.at(506, asked(&ignored, false));
        assert_eq!(
            run.events.last().map(|(_, m)| m.as_str()),
            Some("Retry does nothing to a canary that is Progressing")
        );
    }

    #[test]
    fn a_stepped_rollback_goes_down_the_weights_taken_each_held_once_applied() {
        let steps = vec![Step::SetWeight(5), Step::SetWeight(25), Step::SetWeight(50), Step::Pause(None)];
        let mut run = Run::new(plan(steps, None, RollbackMode::Stepped));
        for second in 0..8 {
            run.at(second, applied());
        }
        assert_eq!(run.status.as_ref().map(|s| (s.step, s.weight, s.phase)), Some((3, 50, CanaryPhase::Paused)));
        let abort = CanaryRequest { id: "x".into(), action: "Abort".into() };
        let status = run.at(10, asked(&abort, false));
        assert_eq!((status.phase, status.weight), (CanaryPhase::RollingBack, 25));
        run.at(11, Observed::default());
        run.at(12, applied());
        let status = run.at(21, applied());
        assert_eq!(status.weight, 25, "held 10 s from when it was applied");
        let status = run.at(22, applied());
        assert_eq!(status.weight, 5);
        run.at(23, applied());
        let status = run.at(33, applied());
        assert_eq!((status.phase, status.weight), (CanaryPhase::Aborted, 0));
    }

    #[test]
    fn a_restart_resumes_the_same_step_and_a_new_revision_starts_over() {
        let mut run = Run::new(good_plan());
        run.at(0, applied());
        run.at(5, measured(windows(500, 0)));
        let before = run.status.clone().expect("a status");
        // A new process decides from the stored status alone, with nothing measured yet.
        let after =
            decide(&run.plan, 100, Some(&before), &Observed::default(), run.start + SignedDuration::from_secs(6));
        assert_eq!(after.status, before, "nothing repeated, nothing skipped, the same weight");
        assert!(after.events.is_empty());

        let promote = CanaryRequest { id: "p".into(), action: "Promote".into() };
        let with_request = CanaryStatus { request: Some(promote.clone()), handled_request: Some("p".into()), ..before };
        let mut edited = run.plan.clone();
        edited.steps.insert(0, Step::SetWeight(1));
        edited.revision = "rev2".into();
        let next = decide(
            &edited,
            100,
            Some(&with_request),
            &Observed { request: Some(&promote), ..Observed::default() },
            run.start,
        );
        assert_eq!((next.status.revision.as_str(), next.status.step, next.status.weight), ("rev2", 0, 1));
        assert_eq!(
            next.status.handled_request.as_deref(),
            Some("p"),
            "the old request is not acted on in the new canary"
        );
    }

    #[test]
    fn a_step_never_applied_times_out_and_a_timed_out_pause_waits_for_a_person() {
        let mut run = Run::new(good_plan());
        run.at(0, Observed::default());
        let status = run.at(59, Observed::default());
        assert_eq!((status.phase, status.step_started_at.is_some()), (CanaryPhase::Progressing, false));
        let status = run.at(60, Observed::default());
        assert_eq!(status.phase, CanaryPhase::Paused, "a minute without its weight on every pod");
        let timed_out = run.events.last().map(|(_, m)| m.clone()).unwrap_or_default();
        assert!(timed_out.starts_with("step 1 is not on every proxy pod after 60s"), "{timed_out}");
        // Paused: good checks do not move it on; a failing one still aborts.
        run.at(61, applied());
        let status = run.at(200, measured(windows(5000, 0)));
        assert_eq!((status.phase, status.step), (CanaryPhase::Paused, 0), "a person decides");
        let status = run.at(201, measured(windows(5000, 500)));
        assert_eq!(status.consecutive_failures, 1);
        let status = run.at(202, measured(windows(5000, 500)));
        assert_eq!(status.phase, CanaryPhase::Aborted);
    }

    #[test]
    fn a_start_in_the_future_counts_no_time() {
        let mut run = Run::new(good_plan());
        run.at(0, applied());
        run.at(1, applied());
        let mut status = run.status.clone().expect("a status");
        status.step_started_at = Some(Time(run.start + SignedDuration::from_secs(3600)));
        status.verdict = Some("Passed".into());
        run.status = Some(status);
        let status = run.at(2, applied());
        assert_eq!(status.step, 0, "a start an hour ahead is not an hour elapsed");
    }

    #[test]
    fn a_request_left_for_the_canary_before_is_said_to_be_ignored() {
        let old = CanaryStatus {
            revision: "old".into(),
            request: Some(CanaryRequest { id: "r1".into(), action: "Abort".into() }),
            ..CanaryStatus::default()
        };
        let next = decide(&good_plan(), 100, Some(&old), &Observed::default(), Timestamp::UNIX_EPOCH);
        assert_eq!(next.status.handled_request.as_deref(), Some("r1"));
        assert_eq!(next.events[0].reason, Reason::Started);
        assert_eq!(next.events[1].message, "Abort (request r1) was for the canary before this one");
    }

    #[test]
    fn every_reason_keeps_its_wire_name() {
        let names: Vec<&str> = [
            Reason::StepStarted,
            Reason::HeldForData,
            Reason::StepPassed,
            Reason::GateFailed,
            Reason::StepTimedOut,
            Reason::WaitingForPromotion,
            Reason::Promoted,
            Reason::Completed,
            Reason::Aborted,
            Reason::RollingBack,
            Reason::RolledBack,
            Reason::Retried,
            Reason::Started,
            Reason::RequestIgnored,
            Reason::Unmeasured,
        ]
        .map(Reason::as_str)
        .to_vec();
        assert_eq!(
            names,
            [
                "StepStarted",
                "HeldForData",
                "StepPassed",
                "GateFailed",
                "StepTimedOut",
                "WaitingForPromotion",
                "Promoted",
                "Completed",
                "Aborted",
                "RollingBack",
                "RolledBack",
                "Retried",
                "Started",
                "RequestIgnored",
                "Unmeasured",
            ]
        );
    }

    #[test]
    fn a_pause_longer_than_the_step_timeout_is_not_held_until_it_is_over() {
        // Pauses of 20 s, a step timeout of 60 s; here a pause of 100 s with no data at all.
        let mut plan = good_plan();
        plan.steps[1] = Step::Pause(Some(Duration::from_secs(100)));
        let mut run = Run::new(plan);
        run.at(0, applied());
        run.at(1, applied());
        run.at(20, measured(windows(150, 0)));
        assert_eq!(run.status.as_ref().map(|s| s.step), Some(1), "step 1 passed; the pause is next");
        run.at(21, applied());
        assert!(run.status.as_ref().is_some_and(|s| s.step_started_at.is_some()), "the pause started at 21 s");
        let at = |run: &mut Run, seconds| run.at(seconds, measured(windows(5, 0))).phase;
        assert_eq!(at(&mut run, 115), CanaryPhase::Progressing, "94 s into a 100 s pause: not held");
        assert_eq!(at(&mut run, 175), CanaryPhase::Progressing, "held 54 s past the pause");
        assert_eq!(at(&mut run, 182), CanaryPhase::Paused, "held 61 s past the pause: timed out");
        assert_eq!(run.reasons().last(), Some(&Reason::StepTimedOut));
    }

    #[test]
    fn a_step_held_past_its_minimum_waits_for_the_next_check_not_a_timer() {
        let mut run = Run::new(good_plan());
        run.at(0, applied());
        run.at(1, applied());
        let last = run.at(20, measured(windows(5, 0))).clone();
        let now = run.start + SignedDuration::from_secs(21);
        let serving = Some(window(&last));
        let next = decide(&run.plan, 100, Some(&last), &Observed { serving, ..Observed::default() }, now);
        assert_eq!(next.status.verdict.as_deref(), Some("Held"));
        assert_eq!(
            next.wake_after,
            Some(Duration::from_secs(50)),
            "only the step timeout, 60 s after its 10 s minimum"
        );
    }
}

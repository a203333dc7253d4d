//! A Balancer's canary as the controller runs it: `spec.canary` read into typed values, with its
//! defaults, by the same rules that admit it ([`validation`](super::validation)), so the two
//! cannot disagree.

use std::time::Duration;

use crate::api::canary::{GateSignal, RollbackMode, TimeoutAction};

/// `spec.canary.analysis.interval` when unset.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// `spec.canary.analysis.minSessions` when unset.
pub const DEFAULT_MIN_SESSIONS: u64 = 100;
/// `spec.canary.analysis.minDuration` when unset.
pub const DEFAULT_MIN_DURATION: Duration = Duration::from_secs(30);
/// `spec.canary.analysis.stepTimeout` when unset.
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(600);
/// `spec.canary.analysis.failureLimit` when unset.
pub const DEFAULT_FAILURE_LIMIT: u32 = 2;
/// `spec.canary.rollback.stepDuration` when unset.
pub const DEFAULT_ROLLBACK_STEP: Duration = Duration::from_secs(10);

/// A canary, read.
#[derive(Debug, Clone, PartialEq)]
pub struct CanaryPlan {
    /// The backend the traffic moves from.
    pub stable: String,
    /// The backend it moves to.
    pub canary: String,
    /// The steps, at least one.
    pub steps: Vec<Step>,
    /// How steps are judged; `None`: on their own terms.
    pub analysis: Option<Analysis>,
    /// How an aborted canary goes back.
    pub rollback: Rollback,
    /// A hash of the backends and the steps: another one is another canary.
    pub revision: String,
}

/// One step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// The canary's percentage of the pair's new connections.
    SetWeight(u8),
    /// A wait: for a time, or (`None`) until promoted.
    Pause(Option<Duration>),
}

/// How each step is judged.
#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    /// How often the gates are checked.
    pub interval: Duration,
    /// Canary sessions a step needs before its gates can pass or fail.
    pub min_sessions: u64,
    /// How long a step lasts at least before its gates can pass.
    pub min_duration: Duration,
    /// How long a step may hold for want of data.
    pub step_timeout: Duration,
    /// What a step that held too long does.
    pub on_timeout: TimeoutAction,
    /// Failed checks in a row that abort.
    pub failure_limit: u32,
    /// What is judged.
    pub gates: Vec<Gate>,
}

/// One gate: bounds on a signal, in its unit (a ratio from 0 to 1, or seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// What is measured.
    pub signal: GateSignal,
    /// The most the canary's value may be.
    pub max: Option<f64>,
    /// The most it may exceed the stable backend's.
    pub max_over_stable: Option<f64>,
    /// Whether the verdict is only recorded.
    pub observe_only: bool,
}

/// How an aborted canary goes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rollback {
    /// At once, or down the weights taken.
    pub mode: RollbackMode,
    /// How long each weight holds on a stepped way back.
    pub step_duration: Duration,
}

impl CanaryPlan {
    /// The canary's weight at step `index`: the last weight set at or before it (0 before any).
    pub fn weight_at(&self, index: usize) -> u8 {
        self.steps
            .iter()
            .take(index + 1)
            .rev()
            .find_map(|step| match step {
                Step::SetWeight(weight) => Some(*weight),
                Step::Pause(_) => None,
            })
            .unwrap_or(0)
    }

    /// The weights a stepped rollback from step `index` (at `from` percent) goes through, down to
    /// 0: the distinct weights set before it and below `from`, highest first.
    pub fn way_back(&self, index: usize, from: u8) -> Vec<u8> {
        let mut weights: Vec<u8> = self
            .steps
            .iter()
            .take(index)
            .filter_map(|step| match step {
                Step::SetWeight(weight) if *weight < from && *weight > 0 => Some(*weight),
                _ => None,
            })
            .collect();
        weights.sort_unstable_by(|a, b| b.cmp(a));
        weights.dedup();
        weights.push(0);
        weights
    }
}

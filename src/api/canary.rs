//! A Balancer's canary (v1beta1): traffic moved from a stable backend to a canary backend a step
//! at a time, each step judged on what the proxy itself measured of the sessions it opened, and
//! moved back when a gate fails. The spec's own weights are the goal: the canary is the way
//! there (see `docs/canary.md`).
//!
//! Text fields stay strings on the wire, as the rest of the spec's, so that a wrong value gets
//! validation's message: [`GateSignal`], [`TimeoutAction`] and [`RollbackMode`] read them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strum::{Display, EnumString, IntoStaticStr, VariantNames};

use super::{MAX_CANARY_GATES, MAX_CANARY_STEPS, duration_schema};
use crate::util::bounded;

/// `spec.canary`: which backend the traffic leaves, which it moves to, and how.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanarySpec {
    /// The backend the traffic moves from (a `spec.backends[].name`).
    #[schemars(length(max = 63))]
    pub stable_backend: String,
    /// The backend it moves to (another `spec.backends[].name`).
    #[schemars(length(max = 63))]
    pub canary_backend: String,
    /// The steps, in order, at most 32. After the last, the spec's own weights serve.
    #[serde(deserialize_with = "read_steps")]
    #[schemars(schema_with = "steps_schema")]
    pub steps: Vec<CanaryStep>,
    /// How each step is judged; unset: steps pass on their own terms (time, a promotion) alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<CanaryAnalysis>,
    /// How an aborted canary goes back to the stable backend; unset: at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<CanaryRollback>,
}

/// One step: exactly one of `setWeight` and `pause`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStep {
    /// The canary's percentage (0..=100) of the new connections the stable and canary backends
    /// take together; the other backends keep their shares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub set_weight: Option<i32>,
    /// Wait at the current weight: for `duration`, or, with no duration, until promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<CanaryPause>,
}

/// A pause step's length.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryPause {
    /// How long (`30s`, `5m`), 1s to 24h; unset: until `balancer canary promote`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub duration: Option<String>,
}

/// How each step is judged: on the sessions the proxy opened to each backend since the step's
/// weight was on every proxy pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryAnalysis {
    /// How often the gates are checked, 1s to 5m; unset: 5s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub interval: Option<String>,
    /// Sessions the canary backend must have had in a step before its gates can pass (or fail),
    /// 1 to 1,000,000; unset: 100. Fewer hold the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub min_sessions: Option<i32>,
    /// How long a step lasts at least before its gates can pass, 0s to 24h; unset: 30s. A gate
    /// that fails on `minSessions` sessions fails at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub min_duration: Option<String>,
    /// How long a step may hold for want of data once it could have passed (its pause and
    /// `minDuration` over), 1s to 24h; unset: 10m. Then `onTimeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub step_timeout: Option<String>,
    /// `Pause` (the default: wait for a person) or `Abort` (roll back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["Pause", "Abort"]))]
    pub on_timeout: Option<String>,
    /// Failed checks in a row that abort the canary, 1 to 100; unset: 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub failure_limit: Option<i32>,
    /// What is judged, at most 8.
    #[serde(default, deserialize_with = "read_gates")]
    #[schemars(schema_with = "gates_schema")]
    pub gates: Vec<CanaryGate>,
}

/// One gate: a signal the proxy measures of the canary backend, and its bounds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryGate {
    /// `ConnectFailureRatio`, `ErrorSessionRatio` or `ConnectTimeP95`.
    #[schemars(extend("enum" = ["ConnectFailureRatio", "ErrorSessionRatio", "ConnectTimeP95"]))]
    pub signal: String,
    /// The most the canary's value may be: a percentage for a ratio (`1%`, `0.5%`), a duration
    /// for a connect time (`20ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub max: Option<String>,
    /// The most the canary's value may exceed the stable backend's in the same window, in the
    /// same units: `0.5%` passes a canary at 0.7 % beside a stable backend at 0.3 %.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub max_over_stable: Option<String>,
    /// Record the verdict, never act on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observe_only: Option<bool>,
}

/// How an aborted canary goes back.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryRollback {
    /// `Immediate` (the default: the canary's weight to 0 at once) or `Stepped` (back down the
    /// weights taken, one every `stepDuration`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["Immediate", "Stepped"]))]
    pub mode: Option<String>,
    /// How long each weight holds on a stepped way back, 1s to 1h; unset: 10s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub step_duration: Option<String>,
}

/// `spec.canary.analysis.gates[].signal`: what the proxy measures of a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, EnumString, IntoStaticStr, VariantNames)]
pub enum GateSignal {
    /// Connects to the backend that failed (refused, reset or timed out), of those tried. TCP.
    ConnectFailureRatio,
    /// Sessions first sent to the backend that nginx ended with 500 or 502, or in which the
    /// backend never sent a byte back, of those first sent to it (400, 403 and 503 are the
    /// client's or the proxy's own limits and count in neither).
    ErrorSessionRatio,
    /// The 95th percentile of the time to connect to the backend, at the bounds of the proxy's
    /// connect-time histogram. TCP.
    #[strum(serialize = "ConnectTimeP95")]
    ConnectTimeP95,
}

impl GateSignal {
    /// Whether it can be measured on a UDP port: a UDP "connect" opens a local socket only.
    pub fn holds_for_udp(self) -> bool {
        self == GateSignal::ErrorSessionRatio
    }

    /// Whether its value is a duration (else a ratio).
    pub fn is_time(self) -> bool {
        self == GateSignal::ConnectTimeP95
    }
}

/// `spec.canary.analysis.onTimeout`: what a step that held for want of data too long does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Display, EnumString, IntoStaticStr, VariantNames)]
pub enum TimeoutAction {
    /// Wait for a person to promote or abort.
    #[default]
    Pause,
    /// Roll back.
    Abort,
}

/// `spec.canary.rollback.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Display, EnumString, IntoStaticStr, VariantNames)]
pub enum RollbackMode {
    /// The canary's weight to 0 at once.
    #[default]
    Immediate,
    /// Back down the weights the canary took, one every `stepDuration`.
    Stepped,
}

/// Where a canary is.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    Display,
    EnumString,
    IntoStaticStr,
    VariantNames,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum CanaryPhase {
    /// Taking its steps.
    #[default]
    Progressing,
    /// Waiting for a person: a `pause {}` step, or a step that held too long.
    Paused,
    /// Going back to the stable backend, a step at a time.
    RollingBack,
    /// Back on the stable backend after a failed gate or an abort; `retry` starts it again.
    Aborted,
    /// Every step taken: the spec's own weights serve.
    Completed,
}

/// What a person asks of a canary, through the status subresource (`status.canary.request`), so
/// that a GitOps sync of the spec never undoes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, EnumString, IntoStaticStr, VariantNames)]
pub enum CanaryAction {
    /// End the current step (a pause, or one held for data) and take the next.
    Promote,
    /// Take every step left at once: the spec's weights serve.
    PromoteFull,
    /// Roll back, as `spec.canary.rollback` says.
    Abort,
    /// Start an aborted canary again from its first step.
    Retry,
}

super::values::wire_name!(GateSignal, TimeoutAction, RollbackMode, CanaryPhase, CanaryAction);

/// `status.canary`: where the canary is, what it measured and what it decided. The controller
/// keeps the live split here, so that a restart, a new leader or an API server outage resumes
/// the same step with the same weight on the wire.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatus {
    /// Which canary this is: a hash of its backends and steps. Another one starts a new canary.
    #[serde(default)]
    pub revision: String,
    /// Where it is.
    #[serde(default)]
    pub phase: CanaryPhase,
    /// The step it is on (0-based); the number of steps once completed.
    #[serde(default)]
    pub step: i32,
    /// The canary backend's percentage of the pair's new connections, as the controller set it.
    #[serde(default)]
    pub weight: i32,
    /// Starts of this canary so far (1, then one more per `retry`): steps of a new attempt are
    /// measured apart from the last one's.
    #[serde(default)]
    pub attempt: i32,
    /// When the current step's weight was set (sent to the proxies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_set_at: Option<Time>,
    /// When the current step's weight was on every proxy pod: its window starts here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_started_at: Option<Time>,
    /// Failed checks in a row in this step.
    #[serde(default)]
    pub consecutive_failures: i32,
    /// The step's last check: `Passed`, `Failed` or `Held`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// Sessions in the step's window, as last measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<SessionCounts>,
    /// Each gate's last measured value beside its bounds.
    #[serde(default)]
    #[schemars(length(max = 8))]
    pub gates: Vec<GateStatus>,
    /// The last decision, with its reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<CanaryDecision>,
    /// The canary's weight each proxy pod serves, as its sidecar says.
    #[serde(default)]
    #[schemars(length(max = 100))]
    pub pods: Vec<PodSplit>,
    /// What a person asked last (written by `balancer canary`, never by the controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<CanaryRequest>,
    /// The `id` of the last request the controller acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handled_request: Option<String>,
}

/// One gate's last check.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GateStatus {
    /// The signal.
    pub signal: String,
    /// The canary's value (`0.8%`, `2ms`); unset while there is too little data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<String>,
    /// The stable backend's value in the same window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable: Option<String>,
    /// The bounds, as the spec writes them: `max 1%`, `stable + 0.5%`.
    pub bounds: String,
    /// `Passed`, `Failed` or `Held`.
    pub verdict: String,
    /// Whether the verdict is only recorded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observe_only: bool,
}

/// What the controller last decided, and why.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryDecision {
    /// A CamelCase word: `StepStarted`, `HeldForData`, `StepPassed`, `GateFailed`, …
    pub reason: String,
    /// The decision in a sentence, with the numbers behind it.
    pub message: String,
    /// When.
    pub at: Time,
}

/// Sessions the proxy opened to each backend of the pair in a step.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionCounts {
    /// To the canary backend.
    pub canary: i64,
    /// To the stable backend.
    pub stable: i64,
}

/// One proxy pod's applied split.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSplit {
    /// The pod's address.
    pub pod: String,
    /// The canary backend's percentage of the pair there; unset when its sidecar did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

/// A person's request.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryRequest {
    /// Unique per request: the controller acts once on each.
    #[schemars(length(max = 64))]
    pub id: String,
    /// `Promote`, `PromoteFull`, `Abort` or `Retry`.
    #[schemars(extend("enum" = ["Promote", "PromoteFull", "Abort", "Retry"]))]
    pub action: String,
}

fn read_steps<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<CanaryStep>, D::Error> {
    bounded::list(d, MAX_CANARY_STEPS, "steps")
}

fn read_gates<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<CanaryGate>, D::Error> {
    bounded::list(d, MAX_CANARY_GATES, "gates")
}

fn steps_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<CanaryStep>>();
    schema.insert("minItems".into(), serde_json::json!(1));
    schema.insert("maxItems".into(), serde_json::json!(MAX_CANARY_STEPS));
    schema
}

fn gates_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<CanaryGate>>();
    schema.insert("maxItems".into(), serde_json::json!(MAX_CANARY_GATES));
    schema
}

/// A percentage as a gate's ratio bound writes it: up to 3 digits, an optional fraction of up
/// to 3 digits, and `%` (`1%`, `0.25%`), at most 100 %; as a ratio (0 to 1).
pub fn percent(text: &str) -> Option<f64> {
    let number = text.strip_suffix('%')?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str, max: usize| s.len() <= max && s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole, 3) || !digits(fraction, 3) || (number.contains('.') && fraction.is_empty()) {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    (value <= 100.0).then_some(value / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_read_as_ratios_within_bounds() {
        assert_eq!(percent("1%"), Some(0.01));
        assert_eq!(percent("0.5%"), Some(0.005));
        assert_eq!(percent("100%"), Some(1.0));
        for wrong in ["", "%", "1", "101%", "1.%", ".5%", "0.0001%", "-1%", "1e1%", "1000%", " 1%"] {
            assert_eq!(percent(wrong), None, "{wrong:?}");
        }
    }

    #[test]
    fn a_canary_reads_from_yaml_with_its_lists_bounded() {
        let spec: CanarySpec = serde_json::from_value(serde_json::json!({
            "stableBackend": "v1",
            "canaryBackend": "v2",
            "steps": [{"setWeight": 5}, {"pause": {"duration": "30s"}}, {"pause": {}}],
            "analysis": {"gates": [{"signal": "ErrorSessionRatio", "max": "1%"}]},
        }))
        .expect("a canary");
        assert_eq!(spec.steps[2].pause, Some(CanaryPause { duration: None }));
        let steps: Vec<_> = (0..=MAX_CANARY_STEPS).map(|_| serde_json::json!({"setWeight": 1})).collect();
        let refused = serde_json::from_value::<CanarySpec>(
            serde_json::json!({"stableBackend": "v1", "canaryBackend": "v2", "steps": steps}),
        );
        assert!(refused.is_err(), "at most {MAX_CANARY_STEPS} steps are read");
        assert_eq!(GateSignal::VARIANTS, ["ConnectFailureRatio", "ErrorSessionRatio", "ConnectTimeP95"]);
        assert!(GateSignal::ErrorSessionRatio.holds_for_udp() && !GateSignal::ConnectTimeP95.holds_for_udp());
    }
}

//! `spec.canary`: its backends, steps, gates and rollback, read into a [`CanaryPlan`] by the
//! rules that admit it.

use std::time::Duration;

use super::fields::{DurationBounds, one_of, validate_duration};
use crate::api::canary::{CanaryAnalysis, CanaryGate, CanaryRollback, CanarySpec, CanaryStep, GateSignal, percent};
use crate::api::{
    self, BalancerSpec, MAX_CANARY_FAILURE_LIMIT, MAX_CANARY_GATES, MAX_CANARY_MIN_SESSIONS, MAX_CANARY_STEPS,
    MAX_WEIGHT, Protocol,
};
use crate::spec::canary::{self, Analysis, CanaryPlan, Gate, Rollback, Step};
use crate::spec::report::Report;
use crate::util::echo::quoted;
use crate::util::hash::sha256_hex;

const PAUSE: DurationBounds = DurationBounds { min: (1_000, "1s"), max: (86_400_000, "24h") };
const INTERVAL: DurationBounds = DurationBounds { min: (1_000, "1s"), max: (300_000, "5m") };
const MIN_DURATION: DurationBounds = DurationBounds { min: (0, "0s"), max: (86_400_000, "24h") };
const STEP_TIMEOUT: DurationBounds = DurationBounds { min: (1_000, "1s"), max: (86_400_000, "24h") };
const ROLLBACK_STEP: DurationBounds = DurationBounds { min: (1_000, "1s"), max: (3_600_000, "1h") };
/// A connect-time bound past the histogram's last bound (5 s) could never be told apart.
const CONNECT_TIME: DurationBounds = DurationBounds { min: (1, "1ms"), max: (5_000, "5s") };

/// Checks `canary` against `spec` (its backends and ports); the plan when every rule holds.
pub fn read_canary(canary: &CanarySpec, spec: &BalancerSpec, report: &mut Report) -> Option<CanaryPlan> {
    let errors = report.errors.len();
    check_backends(canary, spec, report);
    let steps = read_steps(&canary.steps, report);
    let analysis = canary.analysis.as_ref().map(|a| read_analysis(a, spec, report));
    let rollback = read_rollback(canary.rollback.as_ref(), report);
    if report.errors.len() > errors {
        return None;
    }
    let revision = revision(canary, spec);
    Some(CanaryPlan {
        stable: canary.stable_backend.clone(),
        canary: canary.canary_backend.clone(),
        steps: steps?,
        analysis: analysis.flatten(),
        rollback: rollback?,
        revision,
    })
}

/// Which canary this is: its backends, the canary's pods (its selector: a new version is
/// usually a new label) and its steps; not its analysis, which may change on the way.
fn revision(canary: &CanarySpec, spec: &BalancerSpec) -> String {
    let steps = serde_json::to_string(&canary.steps).unwrap_or_default();
    let selector = spec
        .backends
        .iter()
        .find(|b| b.name == canary.canary_backend)
        .map(|b| serde_json::to_string(&spec.merged_selector_refs(b)).unwrap_or_default())
        .unwrap_or_default();
    let identity = format!("{}\n{}\n{selector}\n{steps}", canary.stable_backend, canary.canary_backend);
    sha256_hex(&identity)[..16].to_string()
}

fn check_backends(canary: &CanarySpec, spec: &BalancerSpec, report: &mut Report) {
    let find = |name: &str| spec.backends.iter().find(|b| b.name == name);
    let mut pair = 0;
    for (field, name) in [("stableBackend", &canary.stable_backend), ("canaryBackend", &canary.canary_backend)] {
        match find(name) {
            None => report
                .error(format!("spec.canary.{field}"), format!("must name one of spec.backends, got {}", quoted(name))),
            Some(backend) if backend.backup == Some(true) => report.error(
                format!("spec.canary.{field}"),
                format!("must not name a backup backend ({} takes traffic only when no other can)", quoted(name)),
            ),
            Some(backend) => pair += backend.effective_weight(),
        }
    }
    if canary.stable_backend == canary.canary_backend {
        report.error("spec.canary.canaryBackend", "must not be the stable backend");
    } else if pair == 0 && find(&canary.stable_backend).is_some() && find(&canary.canary_backend).is_some() {
        report.error(
            "spec.canary",
            "the stable and canary backends' weights add up to 0: the pair would get no traffic to split",
        );
    }
}

fn read_steps(steps: &[CanaryStep], report: &mut Report) -> Option<Vec<Step>> {
    if steps.is_empty() || steps.len() > MAX_CANARY_STEPS {
        report.error("spec.canary.steps", format!("must have 1 to {MAX_CANARY_STEPS} steps, got {}", steps.len()));
        return None;
    }
    let read: Vec<Option<Step>> = steps.iter().enumerate().map(|(i, step)| read_step(i, step, report)).collect();
    read.into_iter().collect()
}

fn read_step(i: usize, step: &CanaryStep, report: &mut Report) -> Option<Step> {
    let at = format!("spec.canary.steps[{i}]");
    match (step.set_weight, &step.pause) {
        (Some(weight), None) => match u8::try_from(weight).ok().filter(|w| i32::from(*w) <= MAX_WEIGHT) {
            Some(weight) => Some(Step::SetWeight(weight)),
            None => {
                report.error(format!("{at}.setWeight"), format!("must be between 0 and 100, got {weight}"));
                None
            }
        },
        (None, Some(pause)) => {
            let duration = pause.duration.as_deref();
            let field = format!("{at}.pause.duration");
            Some(Step::Pause(read_duration(&field, duration, PAUSE, report)?))
        }
        _ => {
            report.error(at, "must have exactly one of setWeight and pause");
            None
        }
    }
}

/// `None` when the duration is wrong (reported); `Some(None)` when unset.
fn read_duration(
    field: &str,
    text: Option<&str>,
    bounds: DurationBounds,
    report: &mut Report,
) -> Option<Option<Duration>> {
    let errors = report.errors.len();
    validate_duration(&field, text, bounds, report);
    if report.errors.len() > errors {
        return None;
    }
    Some(text.and_then(api::duration_millis).map(Duration::from_millis))
}

fn read_analysis(analysis: &CanaryAnalysis, spec: &BalancerSpec, report: &mut Report) -> Option<Analysis> {
    let at = "spec.canary.analysis";
    let duration = |field: &str, text: &Option<String>, bounds, default, report: &mut Report| {
        read_duration(&format!("{at}.{field}"), text.as_deref(), bounds, report).map(|d| d.unwrap_or(default))
    };
    let interval = duration("interval", &analysis.interval, INTERVAL, canary::DEFAULT_INTERVAL, report);
    let min_duration =
        duration("minDuration", &analysis.min_duration, MIN_DURATION, canary::DEFAULT_MIN_DURATION, report);
    let step_timeout =
        duration("stepTimeout", &analysis.step_timeout, STEP_TIMEOUT, canary::DEFAULT_STEP_TIMEOUT, report);
    let min_sessions = match analysis.min_sessions {
        None => Some(canary::DEFAULT_MIN_SESSIONS),
        Some(n) if (1..=MAX_CANARY_MIN_SESSIONS).contains(&n) => u64::try_from(n).ok(),
        Some(n) => {
            report.error(
                format!("{at}.minSessions"),
                format!("must be between 1 and {MAX_CANARY_MIN_SESSIONS}, got {n}"),
            );
            None
        }
    };
    let failure_limit = match analysis.failure_limit {
        None => Some(canary::DEFAULT_FAILURE_LIMIT),
        Some(n) if (1..=MAX_CANARY_FAILURE_LIMIT).contains(&n) => u32::try_from(n).ok(),
        Some(n) => {
            report.error(
                format!("{at}.failureLimit"),
                format!("must be between 1 and {MAX_CANARY_FAILURE_LIMIT}, got {n}"),
            );
            None
        }
    };
    let on_timeout = match analysis.on_timeout.as_deref() {
        None => Some(Default::default()),
        Some(text) => one_of(format!("{at}.onTimeout"), text, report),
    };
    let gates = read_gates(&analysis.gates, spec, report);
    Some(Analysis {
        interval: interval?,
        min_sessions: min_sessions?,
        min_duration: min_duration?,
        step_timeout: step_timeout?,
        on_timeout: on_timeout?,
        failure_limit: failure_limit?,
        gates: gates?,
    })
}

fn read_gates(gates: &[CanaryGate], spec: &BalancerSpec, report: &mut Report) -> Option<Vec<Gate>> {
    if gates.len() > MAX_CANARY_GATES {
        report.error(
            "spec.canary.analysis.gates",
            format!("must have at most {MAX_CANARY_GATES} gates, got {}", gates.len()),
        );
        return None;
    }
    let udp_port = spec.ports.iter().position(|p| p.protocol.as_deref() == Some(Protocol::Udp.as_str()));
    let read: Vec<Option<Gate>> =
        gates.iter().enumerate().map(|(i, gate)| read_gate(i, gate, udp_port, report)).collect();
    read.into_iter().collect()
}

fn read_gate(i: usize, gate: &CanaryGate, udp_port: Option<usize>, report: &mut Report) -> Option<Gate> {
    let at = format!("spec.canary.analysis.gates[{i}]");
    let signal: GateSignal = one_of(format!("{at}.signal"), &gate.signal, report)?;
    if let Some(port) = udp_port.filter(|_| !signal.holds_for_udp()) {
        report.error(
            format!("{at}.signal"),
            format!(
                "{signal} cannot be measured on a UDP port (spec.ports[{port}] is UDP): a UDP connect opens a \
                 local socket only, so nothing fails or takes time; ErrorSessionRatio (sessions that end in \
                 error or get no reply) can"
            ),
        );
        return None;
    }
    if gate.max.is_none() && gate.max_over_stable.is_none() {
        report.error(at, "must have max, maxOverStable or both");
        return None;
    }
    let max = read_bound(&format!("{at}.max"), signal, gate.max.as_deref(), report);
    let over = read_bound(&format!("{at}.maxOverStable"), signal, gate.max_over_stable.as_deref(), report);
    Some(Gate { signal, max: max?, max_over_stable: over?, observe_only: gate.observe_only.unwrap_or(false) })
}

/// A bound in the signal's unit: a ratio, or seconds. `Some(None)` when unset.
fn read_bound(field: &str, signal: GateSignal, text: Option<&str>, report: &mut Report) -> Option<Option<f64>> {
    let Some(text) = text else { return Some(None) };
    if signal.is_time() {
        let read = read_duration(field, Some(text), CONNECT_TIME, report)?;
        return Some(read.map(|d| d.as_secs_f64()));
    }
    match percent(text) {
        Some(ratio) => Some(Some(ratio)),
        None => {
            report.error(
                field,
                format!("must be a percentage from 0% to 100% (such as 1% or 0.5%), got {}", quoted(text)),
            );
            None
        }
    }
}

fn read_rollback(rollback: Option<&CanaryRollback>, report: &mut Report) -> Option<Rollback> {
    let Some(rollback) = rollback else {
        return Some(Rollback { mode: Default::default(), step_duration: canary::DEFAULT_ROLLBACK_STEP });
    };
    let mode = match rollback.mode.as_deref() {
        None => Some(Default::default()),
        Some(text) => one_of("spec.canary.rollback.mode", text, report),
    };
    let step =
        read_duration("spec.canary.rollback.stepDuration", rollback.step_duration.as_deref(), ROLLBACK_STEP, report);
    Some(Rollback { mode: mode?, step_duration: step?.unwrap_or(canary::DEFAULT_ROLLBACK_STEP) })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::spec::canary::Step;

    fn spec(ports: serde_json::Value) -> BalancerSpec {
        serde_json::from_value(json!({
            "ports": ports,
            "backends": [{"name": "v1", "weight": 100}, {"name": "v2", "weight": 0}, {"name": "old", "weight": 1, "backup": true}],
        }))
        .expect("a spec")
    }

    fn read(canary: serde_json::Value, ports: serde_json::Value) -> Result<CanaryPlan, Vec<String>> {
        let canary: CanarySpec = serde_json::from_value(canary).expect("a canary");
        let mut report = Report::default();
        let plan = read_canary(&canary, &spec(ports), &mut report);
        match plan {
            Some(plan) if report.is_valid() => Ok(plan),
            _ => Err(report.errors.iter().map(ToString::to_string).collect()),
        }
    }

    fn tcp() -> serde_json::Value {
        json!([{"port": 80}])
    }

    #[test]
    fn a_canary_reads_with_its_defaults() {
        let plan = read(
            json!({"stableBackend": "v1", "canaryBackend": "v2",
                   "steps": [{"setWeight": 5}, {"pause": {"duration": "30s"}}, {"setWeight": 50}, {"pause": {}}],
                   "analysis": {"gates": [{"signal": "ConnectFailureRatio", "max": "1%", "maxOverStable": "0.5%"},
                                          {"signal": "ConnectTimeP95", "max": "20ms", "observeOnly": true}]}}),
            tcp(),
        )
        .expect("a plan");
        assert_eq!(
            plan.steps,
            [Step::SetWeight(5), Step::Pause(Some(Duration::from_secs(30))), Step::SetWeight(50), Step::Pause(None)]
        );
        let analysis = plan.analysis.as_ref().expect("an analysis");
        assert_eq!(
            (analysis.interval, analysis.min_sessions, analysis.min_duration, analysis.failure_limit),
            (canary::DEFAULT_INTERVAL, 100, canary::DEFAULT_MIN_DURATION, 2)
        );
        assert_eq!(analysis.gates[0].max, Some(0.01));
        assert_eq!(analysis.gates[0].max_over_stable, Some(0.005));
        assert_eq!(analysis.gates[1].max, Some(0.02));
        assert!(analysis.gates[1].observe_only);
        assert_eq!((plan.weight_at(0), plan.weight_at(1), plan.weight_at(3)), (5, 5, 50));
        assert_eq!(plan.way_back(3, 50), [5, 0]);
        assert_eq!(plan.revision.len(), 16);
    }

    #[test]
    fn every_wrong_field_is_named() {
        let errors = read(
            json!({"stableBackend": "old", "canaryBackend": "v9",
                   "steps": [{"setWeight": 101}, {"setWeight": 5, "pause": {}}, {"pause": {"duration": "0s"}}],
                   "analysis": {"interval": "10m", "minSessions": 0, "failureLimit": 0, "onTimeout": "Wait",
                                "gates": [{"signal": "Latency", "max": "1%"}, {"signal": "ErrorSessionRatio"},
                                          {"signal": "ErrorSessionRatio", "max": "1"}, {"signal": "ConnectTimeP95", "max": "6s"}]},
                   "rollback": {"mode": "Slowly", "stepDuration": "2h"}}),
            tcp(),
        )
        .expect_err("refused");
        let expected = [
            "spec.canary.stableBackend: must not name a backup backend (\"old\" takes traffic only when no other can)",
            "spec.canary.canaryBackend: must name one of spec.backends, got \"v9\"",
            "spec.canary.steps[0].setWeight: must be between 0 and 100, got 101",
            "spec.canary.steps[1]: must have exactly one of setWeight and pause",
            "spec.canary.steps[2].pause.duration: must be between 1s and 24h, got \"0s\"",
            "spec.canary.analysis.interval: must be between 1s and 5m, got \"10m\"",
            "spec.canary.analysis.minSessions: must be between 1 and 1000000, got 0",
            "spec.canary.analysis.failureLimit: must be between 1 and 100, got 0",
            "spec.canary.analysis.onTimeout: must be Pause or Abort, got \"Wait\"",
            "spec.canary.analysis.gates[0].signal: must be ConnectFailureRatio, ErrorSessionRatio or ConnectTimeP95, got \"Latency\"",
            "spec.canary.analysis.gates[1]: must have max, maxOverStable or both",
            "spec.canary.analysis.gates[2].max: must be a percentage from 0% to 100% (such as 1% or 0.5%), got \"1\"",
            "spec.canary.analysis.gates[3].max: must be between 1ms and 5s, got \"6s\"",
            "spec.canary.rollback.mode: must be Immediate or Stepped, got \"Slowly\"",
            "spec.canary.rollback.stepDuration: must be between 1s and 1h, got \"2h\"",
        ];
        assert_eq!(errors, expected);
    }

    #[test]
    fn a_udp_port_takes_only_the_gates_that_hold_for_udp() {
        let canary = |signal: &str| {
            json!({"stableBackend": "v1", "canaryBackend": "v2", "steps": [{"setWeight": 5}],
                   "analysis": {"gates": [{"signal": signal, "max": if signal == "ConnectTimeP95" { "5ms" } else { "1%" }}]}})
        };
        let ports = json!([{"port": 53, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]);
        assert!(read(canary("ErrorSessionRatio"), ports.clone()).is_ok());
        for signal in ["ConnectFailureRatio", "ConnectTimeP95"] {
            let errors = read(canary(signal), ports.clone()).expect_err("refused");
            assert_eq!(errors.len(), 1);
            assert!(
                errors[0].starts_with(&format!(
                    "spec.canary.analysis.gates[0].signal: {signal} cannot be measured on a UDP port (spec.ports[1] is UDP)"
                )),
                "{errors:?}"
            );
        }
    }

    #[test]
    fn the_pair_must_have_traffic_to_split_and_be_two_backends() {
        let mut spec = spec(tcp());
        spec.backends[0].weight = Some(0);
        let canary: CanarySpec =
            serde_json::from_value(json!({"stableBackend": "v1", "canaryBackend": "v2", "steps": [{"setWeight": 5}]}))
                .expect("a canary");
        let mut report = Report::default();
        assert_eq!(read_canary(&canary, &spec, &mut report), None);
        assert_eq!(report.errors[0].field, "spec.canary");
        let same = read(json!({"stableBackend": "v1", "canaryBackend": "v1", "steps": [{"setWeight": 5}]}), tcp());
        assert_eq!(same.expect_err("refused"), ["spec.canary.canaryBackend: must not be the stable backend"]);
    }

    #[test]
    fn the_revision_is_the_backends_and_steps_and_not_the_analysis() {
        let plan = |steps: serde_json::Value, interval: &str| {
            read(
                json!({"stableBackend": "v1", "canaryBackend": "v2", "steps": steps,
                       "analysis": {"interval": interval}}),
                tcp(),
            )
            .expect("a plan")
            .revision
        };
        let first = plan(json!([{"setWeight": 5}]), "5s");
        assert_eq!(first, plan(json!([{"setWeight": 5}]), "1s"));
        assert_ne!(first, plan(json!([{"setWeight": 10}]), "5s"));
        let canary: CanarySpec = serde_json::from_value(
            json!({"stableBackend": "v1", "canaryBackend": "v2", "steps": [{"setWeight": 5}], "analysis": {"interval": "5s"}}),
        )
        .expect("a canary");
        let mut relabelled = spec(tcp());
        relabelled.backends[1].selector = Some([("version".to_string(), "3".to_string())].into());
        let mut report = Report::default();
        let again = read_canary(&canary, &relabelled, &mut report).expect("a plan").revision;
        assert_ne!(first, again, "new pods behind the canary backend: a new canary");
    }
}

//! What a canary reads from outside the operator: a proxy pod's sidecar answer at `/signals`
//! (anything on the pod network can answer at its address) and the stored `status.canary` (anyone
//! granted `balancers/status` can write it), split at the first NUL. Read as the controller
//! reads them, summed and judged, and the step machine run on the status: never a panic.
#![no_main]

use std::time::Duration;

use balancer::api::canary::{CanaryRequest, CanaryStatus, GateSignal, RollbackMode, TimeoutAction};
use balancer::canary::gates::judge;
use balancer::canary::progress::{Measured, Observed, decide, window};
use balancer::canary::split::weights;
use balancer::proxy::signals::Signals;
use balancer::spec::canary::{Analysis, CanaryPlan, Gate, Rollback, Step};
use k8s_openapi::jiff::Timestamp;
use libfuzzer_sys::fuzz_target;

fn plan() -> CanaryPlan {
    let gate = |signal| Gate { signal, max: Some(0.01), max_over_stable: Some(0.005), observe_only: false };
    CanaryPlan {
        stable: "v1".into(),
        canary: "v2".into(),
        steps: vec![Step::SetWeight(5), Step::Pause(Some(Duration::from_secs(5))), Step::Pause(None), Step::SetWeight(50)],
        analysis: Some(Analysis {
            interval: Duration::from_secs(1),
            min_sessions: 10,
            min_duration: Duration::from_secs(1),
            step_timeout: Duration::from_secs(60),
            on_timeout: TimeoutAction::Abort,
            failure_limit: 2,
            gates: [GateSignal::ConnectFailureRatio, GateSignal::ErrorSessionRatio, GateSignal::ConnectTimeP95]
                .into_iter()
                .map(gate)
                .collect(),
        }),
        rollback: Rollback { mode: RollbackMode::Stepped, step_duration: Duration::from_secs(1) },
        revision: "r".into(),
    }
}

fuzz_target!(|data: &[u8]| {
    let (answer, stored) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &data[..0]),
    };
    let plan = plan();
    let signals: Option<Signals> = serde_json::from_slice(answer).ok();
    let sum = Signals::sum(signals.iter());
    let of = |name: &str| sum.get(name).cloned().unwrap_or_default();
    let (canary, stable) = (of("v2"), of("v1"));
    if let Some(analysis) = &plan.analysis {
        let _ = judge(analysis, &canary, &stable, true);
    }
    let status: Option<CanaryStatus> = serde_json::from_slice(stored).ok();
    let request = CanaryRequest { id: "fuzz".into(), action: "Promote".into() };
    let observed = Observed {
        serving: status.as_ref().map(window),
        measured: Some(Measured::Windows { canary, stable }),
        request: Some(&request),
    };
    let next = decide(&plan, 100, status.as_ref(), &observed, Timestamp::UNIX_EPOCH);
    let _ = weights(&[("v1", 100), ("v2", 0), ("v3", 7)], &plan, Some(&next.status));
    let _ = window(&next.status);
});

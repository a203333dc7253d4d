//! `balancer canary promote|abort|retry|status NAME`: a person's control of a running canary,
//! through the status subresource (`status.canary.request`), which a GitOps sync of the spec
//! never writes, so that no re-apply undoes it. As `kubectl-balancer` on the PATH, the same
//! binary is a kubectl plugin: `kubectl balancer canary promote NAME`.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::args::{CanaryArgs, CanaryCommand, CanaryTarget};
use super::io::{fail, out};
use crate::api::Balancer;
use crate::api::canary::{CanaryAction, CanaryPhase, CanaryStatus};

/// How long a request waits for the controller to act on it.
const WAIT: Duration = Duration::from_secs(30);

/// Runs `balancer canary …`.
pub(super) fn command(args: &CanaryArgs) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    match runtime.block_on(run(&args.command)) {
        Ok(text) => out(&text),
        Err(message) => fail(&message),
    }
}

async fn run(command: &CanaryCommand) -> Result<String, String> {
    let (target, action) = match command {
        CanaryCommand::Status(target) => return status(target).await,
        CanaryCommand::Promote { target, full: false } => (target, CanaryAction::Promote),
        CanaryCommand::Promote { target, full: true } => (target, CanaryAction::PromoteFull),
        CanaryCommand::Abort(target) => (target, CanaryAction::Abort),
        CanaryCommand::Retry(target) => (target, CanaryAction::Retry),
    };
    request(target, action).await
}

async fn api(target: &CanaryTarget) -> Result<Api<Balancer>, String> {
    let client = Client::try_default().await.map_err(|e| format!("cannot reach the cluster: {e}"))?;
    Ok(match &target.namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::default_namespaced(client),
    })
}

async fn get(api: &Api<Balancer>, name: &str) -> Result<Balancer, String> {
    api.get(name).await.map_err(|e| format!("cannot read Balancer {name}: {e}"))
}

/// `balancer canary status NAME`.
async fn status(target: &CanaryTarget) -> Result<String, String> {
    let api = api(target).await?;
    let balancer = get(&api, &target.name).await?;
    Ok(describe(&target.name, &balancer))
}

/// Writes the request, then waits for the controller's decision on it.
async fn request(target: &CanaryTarget, action: CanaryAction) -> Result<String, String> {
    let api = api(target).await?;
    let name = &target.name;
    let balancer = get(&api, name).await?;
    let canary = balancer.status.as_ref().and_then(|s| s.canary.as_ref());
    refusal(balancer.spec.canary.is_some(), canary, action).map_or(Ok(()), Err)?;
    let id = request_id(action);
    let patch = Patch::Merge(request_patch(&id, action));
    api.patch_status(name, &PatchParams::default(), &patch)
        .await
        .map_err(|e| format!("cannot write the request to Balancer {name}'s status: {e}"))?;
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        let now = get(&api, name).await?;
        let canary = now.status.as_ref().and_then(|s| s.canary.as_ref());
        if canary.and_then(|c| c.handled_request.as_deref()) == Some(id.as_str()) {
            return Ok(format!("{action} {name}: done\n{}", describe(name, &now)));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!(
        "{action} {name}: written as request {id}, but the controller has not acted on it in {}s",
        WAIT.as_secs()
    ))
}

/// Why `action` makes no sense now, before it is written.
pub fn refusal(has_canary: bool, canary: Option<&CanaryStatus>, action: CanaryAction) -> Option<String> {
    if !has_canary {
        return Some("the Balancer has no spec.canary".to_string());
    }
    let phase = canary.map(|c| c.phase).unwrap_or_default();
    let fits = match action {
        CanaryAction::Promote | CanaryAction::Abort => matches!(phase, CanaryPhase::Progressing | CanaryPhase::Paused),
        CanaryAction::PromoteFull => {
            matches!(phase, CanaryPhase::Progressing | CanaryPhase::Paused | CanaryPhase::RollingBack)
        }
        CanaryAction::Retry => matches!(phase, CanaryPhase::Aborted | CanaryPhase::RollingBack),
    };
    (!fits).then(|| format!("{action} does nothing to a canary that is {phase}"))
}

/// The merge patch of the status subresource that asks for `action`.
pub fn request_patch(id: &str, action: CanaryAction) -> Value {
    json!({ "status": { "canary": { "request": { "id": id, "action": action.as_str() } } } })
}

/// A request id no other request has: the action, the time and this process.
fn request_id(action: CanaryAction) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    format!("{}-{nanos:x}-{:x}", action.as_str().to_lowercase(), std::process::id())
}

/// The canary as a person reads it: where it is, what it measured, what it decided.
pub fn describe(name: &str, balancer: &Balancer) -> String {
    let Some(plan) = &balancer.spec.canary else { return format!("Balancer {name} has no canary\n") };
    let Some(canary) = balancer.status.as_ref().and_then(|s| s.canary.as_ref()) else {
        return format!("Balancer {name}: canary {} not started yet\n", plan.canary_backend);
    };
    let steps = plan.steps.len();
    let mut text = String::new();
    let step = if canary.phase == CanaryPhase::Completed {
        format!("all {steps} steps")
    } else {
        format!("step {} of {steps}", canary.step + 1)
    };
    let _ = writeln!(
        text,
        "Balancer {name}: canary {} from {}: {}, {step}, canary at {}%, attempt {}",
        plan.canary_backend, plan.stable_backend, canary.phase, canary.weight, canary.attempt
    );
    if let Some(started) = &canary.step_started_at {
        let _ = writeln!(text, "  step started: {}", started.0);
    }
    if let Some(sessions) = &canary.sessions {
        let _ = writeln!(text, "  sessions this step: canary {}, stable {}", sessions.canary, sessions.stable);
    }
    for gate in &canary.gates {
        let value = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_string());
        let observe = if gate.observe_only { " (observe only)" } else { "" };
        let _ = writeln!(
            text,
            "  gate {}: canary {}, stable {}, bounds {}: {}{observe}",
            gate.signal,
            value(&gate.canary),
            value(&gate.stable),
            gate.bounds,
            gate.verdict
        );
    }
    for pod in &canary.pods {
        let weight = pod.weight.map_or("unknown".to_string(), |w| format!("{w}%"));
        let _ = writeln!(text, "  pod {}: canary at {weight}", pod.pod);
    }
    if let Some(decision) = &canary.decision {
        let _ = writeln!(text, "  last decision: {} ({}): {}", decision.reason, decision.at.0, decision.message);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::canary::{CanaryDecision, GateStatus, PodSplit, SessionCounts};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn balancer(status: Option<CanaryStatus>) -> Balancer {
        let spec = serde_json::from_value(json!({
            "ports": [{"port": 80}],
            "backends": [{"name": "v1", "weight": 0}, {"name": "v2", "weight": 100}],
            "canary": {"stableBackend": "v1", "canaryBackend": "v2", "steps": [{"setWeight": 5}, {"pause": {}}]},
        }))
        .expect("a spec");
        let mut balancer = Balancer::new("web", spec);
        balancer.status = Some(crate::api::BalancerStatus { canary: status, ..Default::default() });
        balancer
    }

    #[test]
    fn a_request_is_refused_where_it_would_do_nothing() {
        let paused = CanaryStatus { phase: CanaryPhase::Paused, ..CanaryStatus::default() };
        assert_eq!(refusal(true, Some(&paused), CanaryAction::Promote), None);
        assert_eq!(
            refusal(true, Some(&paused), CanaryAction::Retry).as_deref(),
            Some("Retry does nothing to a canary that is Paused")
        );
        let aborted = CanaryStatus { phase: CanaryPhase::Aborted, ..CanaryStatus::default() };
        assert_eq!(refusal(true, Some(&aborted), CanaryAction::Retry), None);
        assert_eq!(refusal(false, None, CanaryAction::Abort).as_deref(), Some("the Balancer has no spec.canary"));
        assert_eq!(refusal(true, None, CanaryAction::Abort), None, "a canary not yet started is Progressing");
    }

    #[test]
    fn a_request_patches_only_the_request() {
        assert_eq!(
            request_patch("p-1", CanaryAction::PromoteFull),
            json!({"status": {"canary": {"request": {"id": "p-1", "action": "PromoteFull"}}}})
        );
        assert!(request_id(CanaryAction::Abort).starts_with("abort-"));
    }

    #[test]
    fn the_status_tells_the_step_the_gates_the_pods_and_the_last_decision() {
        let at = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let canary = CanaryStatus {
            phase: CanaryPhase::Paused,
            step: 1,
            weight: 5,
            attempt: 1,
            sessions: Some(SessionCounts { canary: 120, stable: 2300 }),
            gates: vec![GateStatus {
                signal: "ErrorSessionRatio".into(),
                canary: Some("0.83%".into()),
                stable: Some("0.1%".into()),
                bounds: "max 1%".into(),
                verdict: "Passed".into(),
                observe_only: false,
            }],
            pods: vec![
                PodSplit { pod: "10.0.0.7".into(), weight: Some(5) },
                PodSplit { pod: "10.0.0.8".into(), weight: None },
            ],
            decision: Some(CanaryDecision {
                reason: "WaitingForPromotion".into(),
                message: "step 2 waits for balancer canary promote".into(),
                at,
            }),
            ..CanaryStatus::default()
        };
        let text = describe("web", &balancer(Some(canary)));
        assert_eq!(
            text,
            "Balancer web: canary v2 from v1: Paused, step 2 of 2, canary at 5%, attempt 1\n\
             \x20 sessions this step: canary 120, stable 2300\n\
             \x20 gate ErrorSessionRatio: canary 0.83%, stable 0.1%, bounds max 1%: Passed\n\
             \x20 pod 10.0.0.7: canary at 5%\n\
             \x20 pod 10.0.0.8: canary at unknown\n\
             \x20 last decision: WaitingForPromotion (1970-01-01T00:00:00Z): step 2 waits for balancer canary promote\n"
        );
        assert_eq!(describe("web", &balancer(None)), "Balancer web: canary v2 not started yet\n");
    }
}

//! A Balancer's canary, reconciled: the step machine ([`progress`]) is fed what the prober last
//! measured, and its decision is written to the status before the split it sets reaches a
//! proxy, so that whoever reconciles next (after a restart, a new leader, an API server outage)
//! resumes the same step with the same weight on the wire. The measuring itself runs outside
//! the reconcile workers (see [`measuring`](super::measuring)).

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::Error;
use super::context::Context;
use super::measuring::{Reading, SignalsProbe, SignalsWant};
use super::probing;
use super::report::{publish, written_form};
use super::stored::StoredBalancer;
use crate::api::canary::{CanaryPhase, CanaryStatus};
use crate::api::{self};
use crate::canary::progress::{self, Event, Observed, Reason};
use crate::canary::split;
use crate::proxy::{self, Owner};
use crate::runtime::events::{Budget, EventReason, EventType, Note};
use crate::spec::canary::CanaryPlan;
use crate::spec::{Admitted, LiveSplit};

impl EventReason for Reason {}

/// The most proxy pods `status.canary.pods` lists (its schema's bound; a rollout may run more).
const MAX_PODS_SHOWN: usize = 100;

/// What a canary's turn comes to for the rest of the reconcile.
pub(super) struct Turn {
    /// The spec, with the canary's split on it.
    pub spec: Admitted,
    /// The canary's status: `Some(None)` clears it (the spec has no canary).
    pub status: Option<Option<CanaryStatus>>,
    /// When to look again at the latest.
    pub wake_after: Option<Duration>,
}

/// Takes the canary's next step, if the spec has a canary: decides, writes a new step to the
/// status first, records its events, and puts its split on the spec.
pub(super) async fn take_turn(
    balancer: &StoredBalancer,
    ctx: &Context,
    owner: &Owner,
    spec: Admitted,
    now: Timestamp,
) -> Result<Turn, Error> {
    let uid = balancer.uid().unwrap_or_default();
    let last = balancer.status.as_ref().and_then(|s| s.canary.as_ref());
    let Some(plan) = spec.canary().cloned() else {
        ctx.records.with(&uid, |record| record.signals = None);
        return Ok(Turn { spec, status: Some(None), wake_after: None });
    };
    if ctx.settings.metrics_image.is_none() {
        // Nothing measures the steps, nor says when one is on the wire: the spec's weights serve.
        if last.is_some() || balancer.meta().generation != balancer.status.as_ref().and_then(|s| s.observed_generation)
        {
            let message = "spec.canary is not run: the operator runs without the proxy's metrics sidecar (--proxy-metrics-image), which measures the steps; the spec's weights serve";
            publish(balancer, ctx, Note::new(EventType::Warning, Reason::Unmeasured, message)).await;
        }
        return Ok(Turn { spec, status: Some(None), wake_after: None });
    }
    let backends = spec_weights(&spec);
    let goal = split::goal(&pairs(&backends), &plan);
    let reading = match last.filter(|l| l.revision == plan.revision && l.phase != CanaryPhase::Completed) {
        Some(_) => measure(balancer, ctx),
        None => Reading::default(),
    };
    let request = last.and_then(|l| l.request.as_ref());
    let serving = reading.serving.clone();
    // A check of another window than the last status's step (a cache that does not show the
    // last commit yet) is not this step's.
    let this_window = last.is_some_and(|l| reading.window == progress::window(l));
    let measured = reading.measured.filter(|_| this_window);
    let observed = Observed { serving: reading.serving, measured, request };
    let next = progress::decide(&plan, goal, last, &observed, now);
    let mut status = next.status;
    status.pods = reading.pods.into_iter().take(MAX_PODS_SHOWN).collect();
    if moved(last, &status) {
        commit(balancer, ctx, &status).await?;
    }
    for event in &next.events {
        announce(balancer, ctx, event).await;
    }
    // What is measured next: the new step's window, or nothing once it is over.
    let applied = serving.as_deref() == Some(progress::window(&status).as_str());
    aim(balancer, ctx, owner, &spec, &plan, &status, applied);
    let weights = split::weights(&pairs(&backends), &plan, Some(&status));
    let running = matches!(status.phase, CanaryPhase::Progressing | CanaryPhase::Paused);
    let window = (status.phase != CanaryPhase::Completed).then(|| progress::window(&status));
    let measured = spec.backends.iter().position(|b| b.name == plan.canary).filter(|_| running);
    let spec = spec.with_split(LiveSplit { weights, window, measured });
    Ok(Turn { spec, status: Some(Some(status)), wake_after: next.wake_after })
}

/// Each backend's name and spec weight.
fn spec_weights(spec: &Admitted) -> Vec<(String, u32)> {
    spec.backends.iter().map(|b| (b.name.clone(), u32::try_from(b.effective_weight()).unwrap_or(0))).collect()
}

fn pairs(backends: &[(String, u32)]) -> Vec<(&str, u32)> {
    backends.iter().map(|(name, weight)| (name.as_str(), *weight)).collect()
}

/// The last reading of the window last aimed at (see [`aim`]); a check in it is given once.
fn measure(balancer: &StoredBalancer, ctx: &Context) -> Reading {
    ctx.records.with(&balancer.uid().unwrap_or_default(), |record| SignalsProbe::read(&mut record.signals))
}

/// Has the prober measure the window of `status`'s step next (and, once rolled back, which
/// split each pod serves); nothing once the canary has completed.
fn aim(
    balancer: &StoredBalancer,
    ctx: &Context,
    owner: &Owner,
    spec: &Admitted,
    plan: &CanaryPlan,
    status: &CanaryStatus,
    applied: bool,
) {
    let uid = balancer.uid().unwrap_or_default();
    if status.phase == CanaryPhase::Completed {
        ctx.records.with(&uid, |record| record.signals = None);
        return;
    }
    let want = signals_want(ctx, owner, spec, plan, status, applied);
    let whose = ObjectRef::from_obj(balancer);
    ctx.records.with(&uid, |record| SignalsProbe::aim(&mut record.signals, whose, want, Instant::now()));
    ctx.probes_wanted.notify_one();
}

/// What to ask the proxy pods about `status`'s step, and how often
/// ([`progress::reading_interval`]).
fn signals_want(
    ctx: &Context,
    owner: &Owner,
    spec: &Admitted,
    plan: &CanaryPlan,
    status: &CanaryStatus,
    applied: bool,
) -> SignalsWant {
    let ours = format!("{}-", api::proxy_deployment_name(&owner.name));
    let mut pods = ctx.children.endpoint_slices.live_addresses(&owner.namespace, &owner.name, &ours);
    pods.truncate(probing::most_asked(spec.replicas()));
    SignalsWant {
        pods,
        port: proxy::access_log::metrics_port(spec.ports.iter().map(|p| p.port)),
        window: progress::window(status),
        pair: (plan.stable.clone(), plan.canary.clone()),
        every: progress::reading_interval(plan, status, applied),
    }
}

/// Whether the step, the phase, the weight, the attempt, the verdict or the count of failed
/// checks changed: what must be in the status before the split reaches a proxy, and before a
/// check is forgotten (a later failure of the reconcile must not leave an older verdict).
fn moved(last: Option<&CanaryStatus>, next: &CanaryStatus) -> bool {
    let key = |s: &CanaryStatus| {
        (
            s.revision.clone(),
            s.phase,
            s.step,
            s.weight,
            s.attempt,
            s.step_started_at.is_some(),
            s.verdict.clone(),
            s.consecutive_failures,
            s.handled_request.clone(),
        )
    };
    last.is_none_or(|last| key(last) != key(next))
}

/// Writes the canary's status, without the request a person writes (see
/// [`written_form`]).
async fn commit(balancer: &StoredBalancer, ctx: &Context, status: &CanaryStatus) -> Result<(), Error> {
    let name = balancer.name_any();
    let api: Api<StoredBalancer> = Api::namespaced(ctx.client.clone(), &balancer.namespace().unwrap_or_default());
    let patch = Patch::Merge(json!({ "status": { "canary": written_form(status) } }));
    let status_error = |e| Error::api("update status of", "Balancer", &name, e);
    api.patch_status(&name, &PatchParams::default(), &patch).await.map_err(status_error)?;
    Ok(())
}

async fn announce(balancer: &StoredBalancer, ctx: &Context, event: &Event) {
    let type_ = if event.warning { EventType::Warning } else { EventType::Normal };
    publish(balancer, ctx, Note::new(type_, event.reason, &event.message).in_budget(CANARY_EVENTS)).await;
}

/// A canary's events take from a budget of their own, so that its story is told whole beside
/// the Balancer's other events: its steps bound them (at most 32, about three events each), then
/// one every 5 s (a failure limit of 100 checks, a person's requests).
const CANARY_EVENTS: Budget = Budget::apart("canary", 128, Duration::from_secs(5));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_step_or_verdict_is_written_first_and_new_values_alone_are_not() {
        let last = CanaryStatus { revision: "r".into(), step: 1, weight: 5, attempt: 1, ..CanaryStatus::default() };
        assert!(moved(None, &last));
        let held = CanaryStatus { verdict: Some("Held".into()), ..last.clone() };
        assert!(moved(Some(&last), &held), "a new verdict is never lost to a later failure");
        let sessions = Some(crate::api::canary::SessionCounts { canary: 10, stable: 90 });
        assert!(!moved(Some(&held), &CanaryStatus { sessions, ..held.clone() }), "new counts alone wait");
        assert!(moved(Some(&last), &CanaryStatus { step: 2, ..last.clone() }));
        assert!(moved(Some(&last), &CanaryStatus { phase: CanaryPhase::Aborted, weight: 0, ..last.clone() }));
        let request = crate::api::canary::CanaryRequest { id: "a".into(), action: "Abort".into() };
        let written = written_form(&CanaryStatus { request: Some(request), ..last.clone() });
        assert_eq!(written.get("request"), None, "a person's request is never overwritten");
        // A merge patch leaves what it does not name: what a new step unsets is written as null.
        let mut stored = serde_json::to_value(CanaryStatus {
            step_started_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            )),
            verdict: Some("Passed".into()),
            ..last.clone()
        })
        .expect("json");
        json_patch::merge(&mut stored, &written_form(&CanaryStatus { step: 2, ..last }));
        let merged: CanaryStatus = serde_json::from_value(stored).expect("a status");
        assert_eq!((merged.step, merged.step_started_at, merged.verdict), (2, None, None));
    }
}

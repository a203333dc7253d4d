//! A Balancer's canary, reconciled: the step machine ([`progress`]) is fed what the prober last
//! measured, and its decision is written to the status before the split it sets reaches a
//! proxy, so that whoever reconciles next (after a restart, a new leader, an API server outage)
//! resumes the same step with the same weight on the wire. The measuring itself runs outside
//! the reconcile workers (see [`measuring`](super::measuring)).

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::Error;
use super::context::Context;
use super::measuring::{Reading, SignalsProbe, SignalsWant, WHILE_APPLYING};
use super::report::{publish, written_form};
use super::stored::StoredBalancer;
use crate::api::canary::{CanaryPhase, CanaryStatus};
use crate::api::{self};
use crate::canary::progress::{self, Event, Observed, Reason};
use crate::canary::split;
use crate::proxy::{self, Owner};
use crate::runtime::events::{EventReason, EventType, Note};
use crate::spec::canary::CanaryPlan;
use crate::spec::{Admitted, LiveSplit};

impl EventReason for Reason {}

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
    let backends = spec_weights(&spec);
    let goal = split::goal(&pairs(&backends), &plan);
    let reading = measure(balancer, ctx, owner, &spec, &plan, last.filter(|l| l.revision == plan.revision));
    let request = last.and_then(|l| l.request.as_ref());
    let observed = Observed { serving: reading.serving, measured: reading.measured, request };
    let next = progress::decide(&plan, goal, last, &observed, now);
    let mut status = next.status;
    status.pods = reading.pods;
    if moved(last, &status) {
        commit(balancer, ctx, &status).await?;
    }
    for event in &next.events {
        announce(balancer, ctx, event).await;
    }
    // What is measured next: the new step's window, or nothing once it is over.
    measure(balancer, ctx, owner, &spec, &plan, Some(&status));
    let weights = split::weights(&pairs(&backends), &plan, Some(&status));
    let window = (status.phase != CanaryPhase::Completed).then(|| progress::window(&status));
    let spec = spec.with_split(LiveSplit { weights, window });
    Ok(Turn { spec, status: Some(Some(status)), wake_after: next.wake_after })
}

/// Each backend's name and spec weight.
fn spec_weights(spec: &Admitted) -> Vec<(String, u32)> {
    spec.backends.iter().map(|b| (b.name.clone(), u32::try_from(b.effective_weight()).unwrap_or(0))).collect()
}

fn pairs(backends: &[(String, u32)]) -> Vec<(&str, u32)> {
    backends.iter().map(|(name, weight)| (name.as_str(), *weight)).collect()
}

/// Has the prober measure the window of `status`'s step (none once the canary is over); returns
/// the last reading.
fn measure(
    balancer: &StoredBalancer,
    ctx: &Context,
    owner: &Owner,
    spec: &Admitted,
    plan: &CanaryPlan,
    status: Option<&CanaryStatus>,
) -> Reading {
    let uid = balancer.uid().unwrap_or_default();
    let over = status.is_some_and(|s| matches!(s.phase, CanaryPhase::Completed | CanaryPhase::Aborted));
    if over || ctx.settings.metrics_image.is_none() {
        ctx.records.with(&uid, |record| record.signals = None);
        return Reading::default();
    }
    let window = status.map(progress::window).unwrap_or_default();
    let started = status.is_some_and(|s| s.step_started_at.is_some());
    let every = match &plan.analysis {
        Some(analysis) if started => analysis.interval,
        _ => WHILE_APPLYING,
    };
    let ours = format!("{}-", api::proxy_deployment_name(&owner.name));
    let want = SignalsWant {
        pods: ctx.children.endpoint_slices.live_addresses(&owner.namespace, &owner.name, &ours),
        port: proxy::access_log::metrics_port(spec.ports.iter().map(|p| p.port)),
        window,
        pair: (plan.stable.clone(), plan.canary.clone()),
        every,
    };
    let whose = ObjectRef::from_obj(balancer);
    let reading =
        ctx.records.with(&uid, |record| SignalsProbe::observe(&mut record.signals, whose, want, Instant::now()));
    ctx.probes_wanted.notify_one();
    reading
}

/// Whether the step, the phase, the weight or the attempt changed: what must be in the status
/// before the split reaches a proxy.
fn moved(last: Option<&CanaryStatus>, next: &CanaryStatus) -> bool {
    last.is_none_or(|last| {
        (&last.revision, last.phase, last.step, last.weight, last.attempt, last.step_started_at.is_some())
            != (&next.revision, next.phase, next.step, next.weight, next.attempt, next.step_started_at.is_some())
    })
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
    publish(balancer, ctx, Note::new(type_, event.reason, &event.message)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_step_is_written_before_its_split_and_a_new_check_is_not() {
        let last = CanaryStatus { revision: "r".into(), step: 1, weight: 5, attempt: 1, ..CanaryStatus::default() };
        assert!(moved(None, &last));
        let checked = CanaryStatus { verdict: Some("Held".into()), ..last.clone() };
        assert!(!moved(Some(&last), &checked));
        assert!(moved(Some(&last), &CanaryStatus { step: 2, ..last.clone() }));
        assert!(moved(Some(&last), &CanaryStatus { phase: CanaryPhase::Aborted, weight: 0, ..last.clone() }));
        let request = crate::api::canary::CanaryRequest { id: "a".into(), action: "Abort".into() };
        let written = written_form(&CanaryStatus { request: Some(request), ..last });
        assert_eq!(serde_json::to_value(&written).expect("json").get("request"), None);
    }
}

//! What a reconcile tells: the status subresource (written only when it changes), and events
//! for the children written and for changes of `Ready`.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use super::Error;
use super::conditions::{ConditionType, find};
use super::context::Context;
use super::exposure::Exposure;
use super::plan::owned_backend_services;
use super::reasons::Reason;
use super::status::{Observed, ProxyCounts, hold, interval_left, next_status, ready_event};
use super::stored::StoredBalancer;
use crate::api::BalancerStatus;
use crate::api::canary::CanaryStatus;
use crate::proxy::Owner;
use crate::runtime::events::{EventType, Note, Published};
use crate::util::echo::cut;

/// How a child was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verb {
    Created,
    Updated,
}

/// The children one reconcile wrote, reported in one event: a new Balancer gets one `Created`
/// event for its children, not one per child.
#[derive(Default)]
pub(super) struct Written {
    children: Vec<(Verb, ObjectReference)>,
}

impl Written {
    /// Records a child just written (and counts it); returns it for the caller to use.
    pub(super) fn add<K: Resource<DynamicType = ()>>(&mut self, ctx: &Context, verb: Verb, child: K) -> K {
        ctx.metrics.child_applied(&K::kind(&()));
        self.children.push((verb, child.object_ref(&())));
        child
    }
}

/// Publishes one event for the children written so far, and forgets them:
/// `created Service a, ConfigMap b; updated Deployment c`.
pub(super) async fn announce(balancer: &StoredBalancer, ctx: &Context, written: &mut Written) {
    let children = std::mem::take(&mut written.children);
    let Some((_, first)) = children.first() else { return };
    let list = |verb: Verb| {
        let names: Vec<String> = children
            .iter()
            .filter(|(v, _)| *v == verb)
            .map(|(_, r)| {
                format!("{} {}", r.kind.as_deref().unwrap_or_default(), r.name.as_deref().unwrap_or_default())
            })
            .collect();
        (!names.is_empty()).then(|| names.join(", "))
    };
    let (created, updated) = (list(Verb::Created), list(Verb::Updated));
    let reason = if created.is_some() { Reason::Created } else { Reason::Updated };
    let parts: Vec<String> = [("created", created), ("updated", updated)]
        .into_iter()
        .filter_map(|(verb, names)| names.map(|n| format!("{verb} {n}")))
        .collect();
    // The first child written becomes the event's `related` object: it is part of what
    // identifies a series, so events about different children are not folded together.
    let note = parts.join("; ");
    publish(balancer, ctx, Note::new(EventType::Normal, reason, &note).related(Some(first.clone()))).await;
}

/// What the caches alone show (when a reconcile could not finish): owned backend Services the
/// spec names, and those it no longer names; the rest as the status said.
pub(super) fn observed_from_cache(balancer: &StoredBalancer, ctx: &Context) -> Observed {
    let proxy = ProxyCounts::previous(balancer);
    let exposure = Exposure::previous(balancer.status.as_ref());
    let Ok(owner) = Owner::of(balancer) else {
        return Observed { active: 0, obsolete: 0, proxy, exposure, backends: None, programmed: None, canary: None };
    };
    // An unreadable spec names no backend: every owned one counts as obsolete.
    let backends = balancer.spec.as_ref().map(|s| s.backends.as_slice()).unwrap_or_default();
    let named: Vec<String> = backends.iter().map(|b| crate::api::backend_service_name(&owner.name, &b.name)).collect();
    let (active, obsolete): (Vec<_>, Vec<_>) =
        owned_backend_services(&ctx.children.services, &owner).into_iter().partition(|s| named.contains(&s.name_any()));
    Observed {
        active: active.len(),
        obsolete: obsolete.len(),
        proxy,
        exposure,
        backends: None,
        programmed: None,
        canary: None,
    }
}

/// What became of a status write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StatusWrite {
    /// Written, or nothing to write.
    Done,
    /// Only backend readiness changed, too soon after the last write, or nothing changed right
    /// after one (the cache may not show it yet): look again after this.
    Held(Duration),
}

/// Patches the status subresource only when it changes, and a change of backend readiness
/// alone no sooner than [`hold`] allows; announces Ready flips as events.
pub(super) async fn write_status(
    balancer: &StoredBalancer,
    ctx: &Context,
    observed: Observed,
    ready: Condition,
    takeover: Option<Condition>,
    now: Timestamp,
) -> Result<StatusWrite, Error> {
    let status = next_status(balancer, observed, ready.clone(), takeover);
    let uid = balancer.uid().unwrap_or_default();
    let last = ctx.records.with(&uid, |record| record.status_written);
    if balancer.status.as_ref() == Some(&status) {
        // Right after a write of its own, the cache may not show it yet: look again then.
        return Ok(interval_left(last, now).map_or(StatusWrite::Done, StatusWrite::Held));
    }
    if let Some(stored) = &balancer.status
        && let Some(wait) = hold(stored, &status, last, now)
    {
        return Ok(StatusWrite::Held(wait));
    }
    let name = balancer.name_any();
    let api: Api<StoredBalancer> = Api::namespaced(ctx.client.clone(), &balancer.namespace().unwrap_or_default());
    let patch = Patch::Merge(json!({ "status": status_patch(balancer.status.as_ref(), &status) }));
    let status_error = |e| Error::api("update status of", "Balancer", &name, e);
    api.patch_status(&name, &PatchParams::default(), &patch).await.map_err(status_error)?;
    ctx.records.with(&uid, |record| record.status_written = Some(now));
    let was = find(balancer.status.as_ref(), ConditionType::Ready);
    if let Some(type_) = ready_event(was, &ready)
        && let Some(reason) = Reason::of(&ready.reason)
    {
        publish(balancer, ctx, Note::new(type_, reason, &ready.message)).await;
    }
    Ok(StatusWrite::Done)
}

/// The status as a merge patch writes it: the canary's as [`written_form`] gives it, and
/// `null` for a canary the spec no longer has.
fn status_patch(stored: Option<&BalancerStatus>, status: &BalancerStatus) -> serde_json::Value {
    let mut patch = serde_json::to_value(status).unwrap_or_default();
    if let Some(fields) = patch.as_object_mut() {
        match &status.canary {
            Some(canary) => drop(fields.insert("canary".into(), written_form(canary))),
            None if stored.is_some_and(|s| s.canary.is_some()) => drop(fields.insert("canary".into(), Value::Null)),
            None => {}
        }
    }
    patch
}

/// The canary's status as a merge patch writes it: every field the controller owns, an unset
/// one as `null` (a merge patch leaves a key it does not name as it was: a new step's unset
/// start would keep the last step's), and never `request`, so that the patch cannot overwrite
/// one a person wrote meanwhile.
pub(super) fn written_form(status: &CanaryStatus) -> Value {
    let mut written = serde_json::to_value(CanaryStatus { request: None, ..status.clone() }).unwrap_or_default();
    if let Some(fields) = written.as_object_mut() {
        for unset in CONTROLLER_OPTIONAL_FIELDS {
            fields.entry(unset).or_insert(Value::Null);
        }
    }
    written
}

/// The optional fields of `status.canary` that the controller writes (not `request`).
const CONTROLLER_OPTIONAL_FIELDS: [&str; 6] =
    ["stepSetAt", "stepStartedAt", "verdict", "sessions", "decision", "handledRequest"];

/// Publishes an event about a Balancer or a Gateway. Events are for people: failing to record
/// one does not fail the reconcile. The note's `related` names the child concerned, which also
/// keeps the recorder from folding events about different children into one series.
pub(super) async fn publish<K: Resource<DynamicType = ()>>(object: &K, ctx: &Context, note: Note<'_>) {
    // The events API refuses notes over 1 KiB.
    let cut_note = cut(note.note, 1024);
    let reason = note.reason();
    match ctx.events.publish(&object.object_ref(&()), note.with_note(&cut_note)).await {
        Ok(Published::Sent) => {}
        Ok(Published::Dropped) => {
            ctx.metrics.event_dropped();
            tracing::debug!(reason, note = %cut_note, "event budget spent: not published");
        }
        Err(e) => tracing::debug!(error = %e, reason, "could not record an event"),
    }
}

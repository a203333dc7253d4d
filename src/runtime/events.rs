//! Events on Balancers, published as kube's `Recorder` does (events.k8s.io/v1, a repeat folded
//! into a series) but remembering only a digest, the event's name and its count: kube's recorder
//! keeps every event it published, whole, for 6 minutes, which at 1,000 new Balancers was 7 MiB
//! of the operator's memory.
//!
//! Each Balancer also has a budget of events, as client-go's spam filter keeps per object: a burst
//! of [`BURST`], then one per [`REFILL`]. Repeats are already folded into series; the budget bounds
//! the rest (a child edited by hand in a loop, a Ready condition that flaps).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::time::Instant;

use crate::util::token_bucket::TokenBucket;

/// Events one Balancer may publish at once; then one per [`REFILL`].
pub const BURST: f64 = 8.0;
/// How often a Balancer's budget gains one event back.
pub const REFILL: Duration = Duration::from_secs(60);
/// A budget of events per object: a burst, then one per interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Its name, which keys it beside the object's uid (empty: the object's own).
    name: &'static str,
    burst: u32,
    refill: Duration,
}

impl Budget {
    /// Every event's, by default: [`BURST`], then one per [`REFILL`].
    pub const OBJECT: Budget = Budget { name: "", burst: BURST as u32, refill: REFILL };

    /// A budget of its own, apart from the object's: for a story told in several events whose
    /// number the object's spec bounds (a canary's steps, say).
    pub const fn apart(name: &'static str, burst: u32, refill: Duration) -> Budget {
        Budget { name, burst, refill }
    }
}

/// How long a published event is remembered, to fold a repeat into its series (kube's figure).
const REMEMBER: Duration = Duration::from_secs(360);

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Something went as it should.
    Normal,
    /// Something a person may need to look at.
    Warning,
}

/// A reason an event gives: the typed enum of the layer that publishes it, written by its wire
/// name. This layer knows no Balancer, so the reasons themselves live with the controller.
pub trait EventReason: Copy + Into<&'static str> {}

/// One event: about `regarding`, optionally naming a `related` object.
#[derive(Debug, Clone)]
pub struct Note<'a> {
    /// Normal or Warning.
    pub type_: EventType,
    /// Only from an [`EventReason`], so that no event carries a reason written inline.
    reason: &'static str,
    /// What happened, for a person (at most 1 KiB).
    pub note: &'a str,
    /// The object the event is about besides the Balancer (a child), if any.
    pub related: Option<ObjectReference>,
    /// Whose tokens it takes.
    budget: Budget,
}

impl<'a> Note<'a> {
    /// A note for `reason`, about no other object.
    pub fn new(type_: EventType, reason: impl EventReason, note: &'a str) -> Self {
        Note { type_, reason: reason.into(), note, related: None, budget: Budget::OBJECT }
    }

    /// The same note, taking its token from `budget`.
    pub fn in_budget(self, budget: Budget) -> Self {
        Note { budget, ..self }
    }

    /// The same note, naming `related` (part of what tells two series apart).
    pub fn related(self, related: Option<ObjectReference>) -> Self {
        Note { related, ..self }
    }

    /// The same note with another text (a cut one, say).
    pub fn with_note<'b>(self, note: &'b str) -> Note<'b> {
        Note { type_: self.type_, reason: self.reason, note, related: self.related, budget: self.budget }
    }

    /// The reason's wire name.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

/// Whether an event went out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// Created, or counted into its series.
    Sent,
    /// The Balancer's budget was spent.
    Dropped,
}

/// The publisher; cheap to share between reconciles.
pub struct Events {
    client: Client,
    reporter: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Event tokens left, and when they were counted, by Balancer uid.
    budgets: HashMap<String, TokenBucket>,
    /// Events published lately, by digest: their name, namespace, count and last time.
    series: HashMap<u64, Series>,
    pruned: Option<Instant>,
}

struct Series {
    name: String,
    count: i32,
    at: Instant,
}

impl Events {
    /// A publisher that reports as `reporter`.
    pub fn new(client: Client, reporter: &str) -> Self {
        Events { client, reporter: reporter.into(), state: Mutex::default() }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes `note` about `regarding` (whose uid keys the budget), or counts a repeat.
    pub async fn publish(&self, regarding: &ObjectReference, note: Note<'_>) -> Result<Published, kube::Error> {
        let uid = regarding.uid.clone().unwrap_or_default();
        let digest = digest(regarding, &note);
        let repeat = {
            let mut state = self.state();
            state.prune();
            if !state.take_token(&uid, note.budget) {
                return Ok(Published::Dropped);
            }
            state.series.get(&digest).map(|s| (s.name.clone(), s.count + 1))
        };
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let now = Timestamp::now();
        if let Some((name, count)) = repeat {
            let series = json!({"series": {"count": count, "lastObservedTime": MicroTime(now)}});
            match api.patch(&name, &PatchParams::default(), &Patch::Merge(&series)).await {
                Ok(_) => {
                    self.remember(digest, name, count);
                    return Ok(Published::Sent);
                }
                // The event has expired on the server since: create a new one.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let event = self.event(regarding, &note, now);
        let created = api.create(&PostParams::default(), &event).await?;
        self.remember(digest, created.metadata.name.unwrap_or_default(), 1);
        Ok(Published::Sent)
    }

    fn remember(&self, digest: u64, name: String, count: i32) {
        self.state().series.insert(digest, Series { name, count, at: Instant::now() });
    }

    /// The event as kube's recorder writes it.
    fn event(&self, regarding: &ObjectReference, note: &Note<'_>, now: Timestamp) -> Event {
        let regarding_name = regarding.name.as_deref().unwrap_or(&self.reporter);
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{regarding_name}.{:x}", now.as_nanosecond())),
                namespace: regarding.namespace.clone(),
                ..ObjectMeta::default()
            },
            action: Some("Reconcile".into()),
            reason: Some(note.reason.into()),
            note: Some(note.note.into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: note.related.clone(),
            reporting_controller: Some(self.reporter.clone()),
            reporting_instance: Some(self.reporter.clone()),
            type_: Some(match note.type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            ..Event::default()
        }
    }
}

impl State {
    /// Forgets full budgets and old series, at most once a minute (O(n) each time).
    fn prune(&mut self) {
        let now = Instant::now();
        if self.pruned.is_some_and(|at| now.duration_since(at) < REFILL) {
            return;
        }
        // A budget untouched for this long has refilled completely, which is the same as
        // having none: a new one starts full. (The object's own fills slowest.)
        let full_after = REFILL.mul_f64(BURST);
        self.budgets.retain(|_, budget| now.duration_since(budget.refilled_at()) < full_after);
        self.series.retain(|_, s| now.duration_since(s.at) < REMEMBER);
        self.pruned = Some(now);
    }

    /// Takes a token from `budget` of the Balancer `uid`; false when it is spent.
    fn take_token(&mut self, uid: &str, budget: Budget) -> bool {
        let now = Instant::now();
        let key = if budget.name.is_empty() { uid.to_string() } else { format!("{uid}/{}", budget.name) };
        let per_second = 1.0 / budget.refill.as_secs_f64();
        let bucket = self.budgets.entry(key);
        bucket.or_insert_with(|| TokenBucket::full(f64::from(budget.burst), per_second, now)).try_take(now)
    }
}

/// What makes two events the same one: the object, the type, the reason, the note, the related object.
fn digest(regarding: &ObjectReference, note: &Note<'_>) -> u64 {
    let mut hasher = DefaultHasher::new();
    (&regarding.uid, &regarding.name, &regarding.namespace, note.type_, note.reason, note.note).hash(&mut hasher);
    note.related.as_ref().map(|r| (&r.kind, &r.name)).hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_allows_a_burst_then_one_a_minute() {
        let mut state = State::default();
        let allowed = (0..20).filter(|_| state.take_token("u", Budget::OBJECT)).count();
        assert_eq!(allowed, BURST as usize);
        assert!(state.take_token("other", Budget::OBJECT), "budgets are per Balancer");
        let story = Budget::apart("story", 64, Duration::from_secs(5));
        assert_eq!((0..100).filter(|_| state.take_token("u", story)).count(), 64, "a budget apart is its own");
    }

    #[test]
    fn the_same_event_has_the_same_digest_and_another_note_another() {
        let regarding = ObjectReference { uid: Some("u".into()), name: Some("b".into()), ..Default::default() };
        #[derive(Clone, Copy, strum::IntoStaticStr)]
        enum Test {
            Updated,
        }
        impl EventReason for Test {}
        let note = |text| Note::new(EventType::Normal, Test::Updated, text);
        assert_eq!(digest(&regarding, &note("updated ConfigMap x")), digest(&regarding, &note("updated ConfigMap x")));
        assert_ne!(digest(&regarding, &note("updated ConfigMap x")), digest(&regarding, &note("updated Deployment y")));
    }
}

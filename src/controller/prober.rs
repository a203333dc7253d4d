//! Which configuration each proxy pod serves, and what a running canary's pods measured, learnt
//! outside the reconcile workers: the prober asks the sidecars what the reconciles want known
//! (see [`probing`](super::probing) and [`measuring`](super::measuring)) and wakes the
//! Balancer's reconcile when the count of pods serving changes, or a canary reading arrives. So
//! a sidecar that never answers costs its own Balancer's probe, never a reconcile worker: at
//! most [`ASKED_PER_BALANCER`](super::sidecar::ASKED_PER_BALANCER) of its pods are asked at
//! once, each for 1 s at most, and the Balancers asked about at once are bounded by
//! [`probing::pick`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::context::Context;
use super::measuring::{SignalsAnswers, SignalsProbe, SignalsWant};
use super::probing::{self, Due, PodProbe, Want, Whose};
use super::programmed::{self, Answers};
use super::signals;
use super::stored::StoredBalancer;
use crate::gateway::api::gateways::Gateway;

/// Where the prober wakes the reconcile of a Balancer, or of a Gateway.
pub(super) struct Wakers {
    /// The Balancers' controller.
    pub balancers: UnboundedSender<ObjectRef<StoredBalancer>>,
    /// The Gateways' controller (none runs without Gateway API: nothing is sent).
    pub gateways: UnboundedSender<ObjectRef<Gateway>>,
}

/// How long the prober waits when nothing is due (a new want wakes it at once).
const IDLE: Duration = Duration::from_secs(1);

/// One probe to run: whose, where it counts, and what to ask.
struct Started {
    uid: String,
    namespace: String,
    ask: Ask,
}

/// What a probe asks the sidecars.
enum Ask {
    /// Which configuration they serve.
    Config(Want),
    /// What they measured for a canary.
    Signals(SignalsWant),
}

/// Their answers.
enum Told {
    Config(Answers),
    Signals(SignalsAnswers),
}

/// Which of a record's probes a due one is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Config,
    Signals,
}

/// Runs the prober until `stop`: asks the sidecars the reconciles want known, and sends on
/// `wake` each Balancer whose count changed, or who has a new canary reading.
pub(super) async fn run(ctx: Arc<Context>, wake: Wakers, stop: CancellationToken) {
    let mut probes: JoinSet<(Started, Told)> = JoinSet::new();
    let mut running: HashMap<String, usize> = HashMap::new();
    loop {
        let (started, next) = start_due(&ctx, &running, Instant::now());
        for start in started {
            *running.entry(start.namespace.clone()).or_default() += 1;
            probes.spawn(async move {
                let told = match &start.ask {
                    Ask::Config(want) => Told::Config(programmed::ask(&want.pods, want.port).await),
                    Ask::Signals(want) => Told::Signals(signals::ask(&want.pods, want.port).await),
                };
                (start, told)
            });
        }
        let idle = next.unwrap_or_else(|| Instant::now() + IDLE);
        tokio::select! {
            _ = stop.cancelled() => {
                probes.abort_all();
                return;
            }
            Some(done) = probes.join_next() => {
                // A probe does not panic; one that did is asked again when its entry is next due.
                if let Ok((start, told)) = done {
                    finish(&ctx, &wake, &mut running, start, told);
                }
            }
            _ = ctx.probes_wanted.notified() => {}
            _ = tokio::time::sleep_until(idle.into()) => {}
        }
    }
}

/// Marks the probes that start now as asking; returns them, and when the next one is due.
fn start_due(ctx: &Context, running: &HashMap<String, usize>, now: Instant) -> (Vec<Started>, Option<Instant>) {
    let mut due: Vec<Due<(String, Kind)>> = Vec::new();
    let mut next: Option<Instant> = None;
    ctx.records.each(|uid, record| {
        let config = record.probe.as_ref().map(|p| (p.candidate((uid.to_string(), Kind::Config), now), p.next_due()));
        let signals =
            record.signals.as_ref().map(|p| (p.candidate((uid.to_string(), Kind::Signals), now), p.next_due()));
        for (candidate, next_due) in [config, signals].into_iter().flatten() {
            match candidate {
                Some(candidate) => due.push(candidate),
                None => next = next.into_iter().chain(next_due).min(),
            }
        }
    });
    let started = probing::pick(due, running)
        .into_iter()
        .filter_map(|Due { key: (uid, kind), namespace, .. }| {
            let ask = ctx.records.existing(&uid, |record| match kind {
                Kind::Config => record.probe.as_mut().map(PodProbe::start).map(Ask::Config),
                Kind::Signals => record.signals.as_mut().map(SignalsProbe::start).map(Ask::Signals),
            })??;
            Some(Started { uid, namespace, ask })
        })
        .collect();
    (started, next)
}

/// Takes a finished probe's answers into its Balancer's record (if it still has one) and wakes
/// the Balancer when its count changed, or when it has a new canary reading.
fn finish(ctx: &Context, wake: &Wakers, running: &mut HashMap<String, usize>, start: Started, told: Told) {
    if let Some(count) = running.get_mut(&start.namespace) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            running.remove(&start.namespace);
        }
    }
    let (now, clock) = (Instant::now(), Timestamp::now());
    let woken = ctx.records.existing(&start.uid, |record| match (start.ask, told) {
        (Ask::Config(want), Told::Config(answers)) => {
            record.probe.as_mut().and_then(|probe| probe.answered(&want, answers, now, clock))
        }
        (Ask::Signals(want), Told::Signals(answers)) => {
            record.signals.as_mut().map(|probe| Whose::Balancer(probe.answered(&want, answers, now)))
        }
        _ => None,
    });
    // The controller has stopped when nobody receives: nothing is left to wake.
    match woken.flatten() {
        Some(Whose::Balancer(balancer)) => drop(wake.balancers.unbounded_send(balancer)),
        Some(Whose::Gateway(gateway)) => drop(wake.gateways.unbounded_send(gateway)),
        None => {}
    }
}

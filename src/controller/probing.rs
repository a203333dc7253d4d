//! When a Balancer's proxy pods are asked which configuration they serve, and what their answers
//! count to: the pure half of the [`prober`](super::prober), kept in each Balancer's record.
//!
//! A reconcile says what it wants known (a [`Want`]: the pods, their sidecars' port, the
//! configuration they should serve) and reads, at once, what was last learnt. Pods that do not
//! all serve it are asked again after [`programmed::recheck`]; every reconcile has them asked
//! once more. The slots are shared fairly: at most [`AT_ONCE`] Balancers are asked about at once,
//! and one namespace holds at most [`PER_NAMESPACE`] of those slots, oldest due first, so that
//! one tenant's silent pods cannot delay another's.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;

use super::programmed::{self, Answers, Programmed};
use super::stored::StoredBalancer;
use crate::gateway::api::gateways::Gateway;

/// Balancers probed at once.
pub(super) const AT_ONCE: usize = 8;
/// Of those, how many one namespace may hold.
pub(super) const PER_NAMESPACE: usize = 4;
/// What a reconcile wants known of a Balancer's proxy pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Want {
    /// The addresses of the pods asked.
    pub pods: Vec<IpAddr>,
    /// How many more pods the proxy's Service selects than a probe asks ([`Want::new`]):
    /// never asked, so never counted as serving.
    pub unasked: usize,
    /// Their sidecars' port.
    pub port: u16,
    /// The id of the configuration they should serve (see [`programmed::config_id`]).
    pub id: String,
}

/// The most pods of a proxy of `replicas` that one probe asks: twice `replicas` (a rollout's
/// surge and the pods still stopping fit), so that pods someone labelled into the proxy's
/// Service cannot make a probe long: each costs it up to a second, [`ASKED_PER_BALANCER`] at a
/// time, while it holds one of the prober's [`AT_ONCE`] slots.
///
/// [`ASKED_PER_BALANCER`]: super::sidecar::ASKED_PER_BALANCER
pub(super) fn most_asked(replicas: i32) -> usize {
    usize::try_from(replicas).unwrap_or_default().max(1).saturating_mul(2)
}

impl Want {
    /// The pods at `pods` to serve `id`, for a proxy of `replicas`: at most [`most_asked`] are
    /// asked, and any more count as not serving.
    pub(super) fn new(mut pods: Vec<IpAddr>, replicas: i32, port: u16, id: String) -> Want {
        let most = most_asked(replicas);
        let unasked = pods.len().saturating_sub(most);
        pods.truncate(most);
        Want { pods, unasked, port, id }
    }
}

/// Whose proxy pods a probe asks about: a Balancer's or a Gateway's. A new count wakes its
/// reconcile.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Whose {
    /// A Balancer's.
    Balancer(ObjectRef<StoredBalancer>),
    /// A Gateway's.
    Gateway(ObjectRef<Gateway>),
}

impl Whose {
    fn namespace(&self) -> Option<&str> {
        match self {
            Whose::Balancer(balancer) => balancer.namespace.as_deref(),
            Whose::Gateway(gateway) => gateway.namespace.as_deref(),
        }
    }
}

impl From<ObjectRef<StoredBalancer>> for Whose {
    fn from(balancer: ObjectRef<StoredBalancer>) -> Self {
        Whose::Balancer(balancer)
    }
}

impl From<ObjectRef<Gateway>> for Whose {
    fn from(gateway: ObjectRef<Gateway>) -> Self {
        Whose::Gateway(gateway)
    }
}

/// What the prober knows and wants of one Balancer's proxy pods; kept in its record.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PodProbe {
    /// Whose reconcile a new count wakes.
    whose: Whose,
    /// What the last reconcile wants known.
    want: Want,
    /// What each pod that answered its last question said.
    answers: BTreeMap<IpAddr, String>,
    /// Since when the pods have been taking up `want.id`.
    since: Timestamp,
    /// When the pods are asked next; `None` while all of them serve `want.id`.
    due: Option<Instant>,
    /// Whether they are being asked now.
    asking: bool,
    /// The count the last reconcile was given: another one wakes it.
    seen: Programmed,
}

impl PodProbe {
    /// Takes a reconcile's `want` into `slot`; returns the count as last learnt. The pods are
    /// asked again soon: at once when the want is new, or when they all served the last one
    /// (each reconcile looks again, as a resync would).
    pub(super) fn observe(
        slot: &mut Option<PodProbe>,
        whose: impl Into<Whose>,
        want: Want,
        now: Instant,
        clock: Timestamp,
    ) -> Programmed {
        let whose = whose.into();
        let probe = slot.get_or_insert_with(|| PodProbe {
            whose: whose.clone(),
            want: want.clone(),
            answers: BTreeMap::new(),
            since: clock,
            due: Some(now),
            asking: false,
            seen: Programmed { serving: 0, pods: 0 },
        });
        if probe.want.id != want.id {
            probe.since = clock;
        }
        if probe.want != want || probe.due.is_none() {
            probe.due = Some(now);
        }
        probe.whose = whose;
        probe.want = want;
        probe.answers.retain(|pod, _| probe.want.pods.contains(pod));
        probe.seen = probe.count();
        probe.seen
    }

    /// How many of the wanted pods last said they serve the wanted configuration.
    fn count(&self) -> Programmed {
        let serving = self.want.pods.iter().filter(|pod| self.answers.get(pod) == Some(&self.want.id)).count();
        Programmed { serving, pods: self.want.pods.len() + self.want.unasked }
    }

    /// Whether the pods are due to be asked at `now` (and are not being asked).
    fn due_at(&self, now: Instant) -> bool {
        !self.asking && self.due.is_some_and(|due| due <= now)
    }

    /// The probe as a candidate to start at `now`, under `key`; `None` when it is not due.
    pub(super) fn candidate<K>(&self, key: K, now: Instant) -> Option<Due<K>> {
        let since = self.due.filter(|_| self.due_at(now))?;
        Some(Due { key, namespace: self.whose.namespace().unwrap_or_default().to_string(), since })
    }

    /// When it is due next, unless it is being asked or has nothing to ask.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.due.filter(|_| !self.asking)
    }

    /// Marks the pods as being asked; returns what to ask.
    pub(super) fn start(&mut self) -> Want {
        self.asking = true;
        self.want.clone()
    }

    /// Takes the answers to `asked`; returns the Balancer to wake when the count is not the one
    /// its last reconcile was given. Pods that still do not all serve the configuration are
    /// asked again after [`programmed::recheck`].
    pub(super) fn answered(&mut self, asked: &Want, answers: Answers, now: Instant, clock: Timestamp) -> Option<Whose> {
        self.asking = false;
        for (pod, answer) in answers {
            match answer {
                Some(id) => self.answers.insert(pod, id),
                None => self.answers.remove(&pod),
            };
        }
        self.answers.retain(|pod, _| self.want.pods.contains(pod));
        let count = self.count();
        self.due = if *asked != self.want {
            Some(now)
        } else if count.pods == 0 || count.all() {
            None
        } else {
            Some(now + programmed::recheck(self.since, clock))
        };
        (count != self.seen).then(|| self.whose.clone())
    }
}

/// A probe that may start: when it was due, and the namespace it counts against.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Due<K> {
    pub key: K,
    pub namespace: String,
    pub since: Instant,
}

/// Which of the `due` probes start now: the longest due first, while fewer than [`AT_ONCE`] run,
/// and none in a namespace that already runs [`PER_NAMESPACE`] (`running` counts by namespace).
pub(super) fn pick<K>(mut due: Vec<Due<K>>, running: &HashMap<String, usize>) -> Vec<Due<K>> {
    due.sort_by_key(|d| d.since);
    let mut running = running.clone();
    let mut total: usize = running.values().sum();
    let mut picked = Vec::new();
    for candidate in due {
        if total >= AT_ONCE {
            break;
        }
        let in_namespace = running.entry(candidate.namespace.clone()).or_default();
        if *in_namespace >= PER_NAMESPACE {
            continue;
        }
        *in_namespace += 1;
        total += 1;
        picked.push(candidate);
    }
    picked
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn balancer(namespace: &str, name: &str) -> ObjectRef<StoredBalancer> {
        ObjectRef::new(name).within(namespace)
    }

    fn want(pods: &[u8], id: &str) -> Want {
        let pods = pods.iter().map(|last| IpAddr::from([10, 0, 0, *last])).collect();
        Want { pods, unasked: 0, port: 9113, id: id.into() }
    }

    fn pod(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn a_new_want_is_due_at_once_and_counts_only_pods_that_named_it() {
        let (now, clock) = (Instant::now(), Timestamp::UNIX_EPOCH);
        let mut slot = None;
        let seen = PodProbe::observe(&mut slot, balancer("a", "x"), want(&[1, 2], "one"), now, clock);
        assert_eq!(seen, Programmed { serving: 0, pods: 2 }, "nothing learnt yet");
        let probe = slot.as_mut().expect("a probe");
        assert!(probe.due_at(now));
        probe.asking = true;
        assert!(!probe.due_at(now), "not twice at once");

        let asked = want(&[1, 2], "one");
        let woken = probe.answered(&asked, vec![(pod(1), Some("one".into())), (pod(2), None)], now, clock);
        assert_eq!(woken, Some(balancer("a", "x").into()), "1 of 2 is news to the reconcile");
        assert_eq!(probe.due, Some(now + programmed::recheck(clock, clock)), "asked again soon");
        let seen = PodProbe::observe(&mut slot, balancer("a", "x"), want(&[1, 2], "one"), now, clock);
        assert_eq!(seen, Programmed { serving: 1, pods: 2 });
        let probe = slot.as_mut().expect("a probe");
        assert_eq!(
            probe.answered(&asked, vec![(pod(2), Some("one".into()))], now, clock),
            Some(balancer("a", "x").into())
        );
        assert_eq!(probe.due, None, "all serve it: nothing more to ask");
        assert_eq!(
            probe.answered(&asked, vec![(pod(2), Some("one".into()))], now, clock),
            Some(balancer("a", "x").into())
        );
        PodProbe::observe(&mut slot, balancer("a", "x"), want(&[1, 2], "one"), now, clock);
        let probe = slot.as_mut().expect("a probe");
        assert_eq!(probe.answered(&asked, vec![], now, clock), None, "the same count wakes nobody");
    }

    #[test]
    fn pods_past_twice_the_replicas_are_not_asked_and_never_count_as_serving() {
        let pods: Vec<IpAddr> = (1..=7).map(|last| IpAddr::from([10, 0, 0, last])).collect();
        let want = Want::new(pods, 2, 9113, "a".into());
        assert_eq!((want.pods.len(), want.unasked), (4, 3), "four asked, three never");
        let mut slot = None;
        let (now, clock) = (Instant::now(), Timestamp::now());
        PodProbe::observe(&mut slot, balancer("a", "x"), want.clone(), now, clock);
        let probe = slot.as_mut().expect("a probe");
        let asked = probe.start();
        assert_eq!(asked.pods, want.pods, "only the first four are asked");
        let answers = asked.pods.iter().map(|pod| (*pod, Some("a".to_string()))).collect();
        probe.answered(&asked, answers, now, clock);
        assert_eq!(probe.count(), Programmed { serving: 4, pods: 7 }, "not all: three were never asked");
        assert_eq!(most_asked(0), 2, "a proxy scaled to nothing still asks its stopping pods");
    }

    #[test]
    fn a_new_configuration_restarts_the_clock_and_keeps_what_pods_said() {
        let (now, clock) = (Instant::now(), Timestamp::UNIX_EPOCH);
        let later = clock + k8s_openapi::jiff::SignedDuration::from_secs(60);
        let mut slot = None;
        PodProbe::observe(&mut slot, balancer("a", "x"), want(&[1, 2], "one"), now, clock);
        let probe = slot.as_mut().expect("a probe");
        probe.asking = true;
        probe.answered(&want(&[1, 2], "one"), vec![(pod(1), Some("two".into()))], now, clock);
        let seen = PodProbe::observe(&mut slot, balancer("a", "x"), want(&[1, 3], "two"), now, later);
        assert_eq!(seen, Programmed { serving: 1, pods: 2 }, "pod 1 already serves two");
        let probe = slot.as_ref().expect("a probe");
        assert_eq!((probe.since, probe.due), (later, Some(now)));
        assert!(!probe.answers.contains_key(&pod(2)), "a pod gone is forgotten");
    }

    #[test]
    fn answers_to_an_older_want_are_kept_and_the_new_one_is_asked_at_once() {
        let (now, clock) = (Instant::now(), Timestamp::UNIX_EPOCH);
        let mut slot = None;
        PodProbe::observe(&mut slot, balancer("a", "x"), want(&[1], "one"), now, clock);
        slot.as_mut().expect("a probe").asking = true;
        PodProbe::observe(&mut slot, balancer("a", "x"), want(&[1, 2], "one"), now, clock);
        let probe = slot.as_mut().expect("a probe");
        assert!(probe.asking, "still asking the old want");
        probe.answered(&want(&[1], "one"), vec![(pod(1), Some("one".into()))], now, clock);
        assert_eq!(probe.count(), Programmed { serving: 1, pods: 2 });
        assert_eq!(probe.due, Some(now), "pod 2 was never asked");
    }

    #[test]
    fn a_namespace_holds_at_most_its_share_and_the_longest_due_go_first() {
        let now = Instant::now();
        let due = |key: u32, namespace: &str, ago: u64| Due {
            key,
            namespace: namespace.into(),
            since: now - Duration::from_millis(ago),
        };
        let noisy: Vec<_> = (0..10).map(|i| due(i, "noisy", 1000 + u64::from(i))).collect();
        let mut all = noisy.clone();
        all.push(due(100, "quiet", 1));
        let picked: Vec<u32> = pick(all, &HashMap::new()).into_iter().map(|d| d.key).collect();
        assert_eq!(picked, vec![9, 8, 7, 6, 100], "four of the noisy namespace, then the quiet one");

        let running = HashMap::from([("noisy".to_string(), PER_NAMESPACE), ("other".to_string(), 4)]);
        let picked: Vec<u32> = pick(vec![due(1, "noisy", 5), due(2, "quiet", 1), due(3, "third", 2)], &running)
            .into_iter()
            .map(|d| d.key)
            .collect();
        assert!(picked.is_empty(), "all eight slots are taken");
        let running = HashMap::from([("noisy".to_string(), PER_NAMESPACE)]);
        let picked: Vec<u32> = pick(vec![due(1, "noisy", 5), due(2, "quiet", 1), due(3, "third", 2)], &running)
            .into_iter()
            .map(|d| d.key)
            .collect();
        assert_eq!(picked, vec![3, 2], "the noisy namespace has its share already");
    }
}

//! What a running canary's proxy pods measured, learnt outside the reconcile workers: the pure
//! half of the signals probe, kept in each Balancer's record beside the configuration probe
//! ([`probing`](super::probing)) and run by the same [`prober`](super::prober), under the same
//! fair share of slots. A reconcile says what it wants measured (a [`SignalsWant`]: the pods,
//! their sidecars' port, the step's window, how often) and reads, at once, the last reading:
//! which window the pods serve, and a check of the step's window when one is new.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use kube::runtime::reflector::ObjectRef;

use super::probing::Due;
use super::stored::StoredBalancer;
use crate::api::canary::PodSplit;
use crate::canary::progress::Measured;
use crate::proxy::signals::{Signals, Window};

/// What a reconcile wants measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SignalsWant {
    /// The proxy pods' addresses.
    pub pods: Vec<IpAddr>,
    /// Their sidecars' port.
    pub port: u16,
    /// The step's window.
    pub window: String,
    /// The canary's two backends: (stable, canary).
    pub pair: (String, String),
    /// How often to ask.
    pub every: Duration,
}

/// One pod's answer; `None` when it said nothing usable in time.
pub(super) type SignalsAnswers = Vec<(IpAddr, Option<Signals>)>;

/// The signals probe of one Balancer.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SignalsProbe {
    whose: ObjectRef<StoredBalancer>,
    want: SignalsWant,
    due: Option<Instant>,
    asking: bool,
    /// The last answers, in the order of the pods asked.
    answers: SignalsAnswers,
    /// Whether the last answers are news to the reconcile.
    fresh: bool,
}

/// What the last reading says, for the canary's step machine.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Reading {
    /// The window every proxy pod serves, when they all serve the same one.
    pub serving: Option<String>,
    /// A check of the wanted window, when the reading is new.
    pub measured: Option<Measured>,
    /// The canary's share of the pair that each pod asked serves, as its sidecar said.
    pub pods: Vec<PodSplit>,
    /// The window the reading was asked about: a check is of this window only.
    pub window: String,
}

impl SignalsProbe {
    /// Takes a reconcile's `want` into `slot`: a new window or set of pods is asked about at
    /// once, a shorter interval from now.
    pub(super) fn aim(
        slot: &mut Option<SignalsProbe>,
        whose: ObjectRef<StoredBalancer>,
        want: SignalsWant,
        now: Instant,
    ) {
        let probe = slot.get_or_insert_with(|| SignalsProbe {
            whose: whose.clone(),
            want: want.clone(),
            due: Some(now),
            asking: false,
            answers: Vec::new(),
            fresh: false,
        });
        if probe.want.window != want.window || probe.want.pods != want.pods || probe.want.port != want.port {
            probe.due = Some(now);
        } else if want.every < probe.want.every {
            probe.due = probe.due.map(|due| due.min(now + want.every));
        }
        probe.whose = whose;
        probe.want = want;
    }

    /// What the last reading says of the window last aimed at (nothing before the first); a
    /// check in it is given once.
    pub(super) fn read(slot: &mut Option<SignalsProbe>) -> Reading {
        let Some(probe) = slot.as_mut() else { return Reading::default() };
        let reading = probe.reading();
        probe.fresh = false;
        reading
    }

    fn reading(&self) -> Reading {
        let pods = self.want.pods.len();
        let answered: Vec<&Signals> = self
            .want
            .pods
            .iter()
            .filter_map(|pod| self.answers.iter().find(|(ip, _)| ip == pod).and_then(|(_, a)| a.as_ref()))
            .collect();
        let first = answered.first().map(|s| s.window.clone());
        let same = answered.len() == pods && answered.iter().all(|s| Some(&s.window) == first.as_ref());
        let serving = first.filter(|w| same && pods > 0 && !w.is_empty());
        let measured = self.fresh.then(|| {
            let in_window: Vec<&Signals> = answered.into_iter().filter(|s| s.window == self.want.window).collect();
            if pods == 0 || in_window.len() < pods {
                return Measured::Incomplete { answered: in_window.len(), pods };
            }
            let sum = Signals::sum(in_window);
            let of = |name: &str| sum.get(name).cloned().unwrap_or_else(Window::empty);
            Measured::Windows { canary: of(&self.want.pair.1), stable: of(&self.want.pair.0) }
        });
        let pods = self.want.pods.iter().map(|pod| self.pod_split(*pod)).collect();
        Reading { serving, measured, pods, window: self.want.window.clone() }
    }

    /// The canary's share of the pair at `pod`, as its last answer said.
    fn pod_split(&self, pod: IpAddr) -> PodSplit {
        let answer = self.answers.iter().find(|(ip, _)| *ip == pod).and_then(|(_, a)| a.as_ref());
        let weight = answer.and_then(|signals| {
            let of = |name: &str| u64::from(signals.weights.get(name).copied().unwrap_or(0));
            let (stable, canary) = (of(&self.want.pair.0), of(&self.want.pair.1));
            let pair = stable + canary;
            (pair > 0).then(|| i32::try_from((canary * 200 + pair) / (pair * 2)).unwrap_or(100))
        });
        PodSplit { pod: pod.to_string(), weight }
    }

    /// The probe as a candidate to start at `now`, under `key`; `None` when it is not due.
    pub(super) fn candidate<K>(&self, key: K, now: Instant) -> Option<Due<K>> {
        let since = self.due.filter(|due| !self.asking && *due <= now)?;
        Some(Due { key, namespace: self.whose.namespace.clone().unwrap_or_default(), since })
    }

    /// When it is due next, unless it is being asked.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.due.filter(|_| !self.asking)
    }

    /// Marks the pods as being asked; returns what to ask.
    pub(super) fn start(&mut self) -> SignalsWant {
        self.asking = true;
        self.want.clone()
    }

    /// Takes the answers to `asked`; returns the Balancer to wake: every reading is a check.
    /// Asked again after the want's interval, or at once when the want changed meanwhile.
    pub(super) fn answered(
        &mut self,
        asked: &SignalsWant,
        answers: SignalsAnswers,
        now: Instant,
    ) -> ObjectRef<StoredBalancer> {
        self.asking = false;
        if asked.window == self.want.window && asked.pods == self.want.pods {
            self.answers = answers;
            self.fresh = true;
            self.due = Some(now + self.want.every);
        } else {
            self.due = Some(now);
        }
        self.whose.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn want(window: &str, pods: &[u8]) -> SignalsWant {
        SignalsWant {
            pods: pods.iter().map(|last| IpAddr::from([10, 0, 0, *last])).collect(),
            port: 9113,
            window: window.into(),
            pair: ("v1".into(), "v2".into()),
            every: Duration::from_secs(5),
        }
    }

    fn answer(last: u8, window: &str, canary_sessions: u64) -> (IpAddr, Option<Signals>) {
        let backends = BTreeMap::from([("v2".to_string(), Window { sessions: canary_sessions, ..Window::empty() })]);
        let signals = Signals { window: window.into(), backends, ..Signals::default() };
        (IpAddr::from([10, 0, 0, last]), Some(signals))
    }

    #[test]
    fn a_check_sums_every_pod_in_the_window_and_is_given_once() {
        let now = Instant::now();
        let whose: ObjectRef<StoredBalancer> = ObjectRef::new("b").within("a");
        let mut slot = None;
        SignalsProbe::aim(&mut slot, whose.clone(), want("w/1", &[1, 2]), now);
        let first = SignalsProbe::read(&mut slot);
        assert_eq!((first.serving, first.measured), (None, None), "nothing asked yet");
        assert!(first.pods.iter().all(|p| p.weight.is_none()));
        let probe = slot.as_mut().expect("a probe");
        assert!(probe.candidate((), now).is_some());
        let asked = probe.start();
        assert!(probe.candidate((), now).is_none(), "not twice at once");
        probe.answered(&asked, vec![answer(1, "w/1", 30), answer(2, "w/1", 20)], now);
        assert_eq!(probe.next_due(), Some(now + Duration::from_secs(5)));
        let reading = SignalsProbe::read(&mut slot);
        assert_eq!(reading.serving.as_deref(), Some("w/1"));
        let Some(Measured::Windows { canary, stable }) = reading.measured else { panic!("{reading:?}") };
        assert_eq!((canary.sessions, stable.sessions), (50, 0));
        SignalsProbe::aim(&mut slot, whose, want("w/1", &[1, 2]), now);
        let again = SignalsProbe::read(&mut slot);
        assert_eq!((again.serving.as_deref(), again.measured), (Some("w/1"), None), "a check counts once");
        assert_eq!(again.pods.len(), 2);
    }

    #[test]
    fn a_pod_silent_or_in_another_window_leaves_the_check_incomplete() {
        let now = Instant::now();
        let whose: ObjectRef<StoredBalancer> = ObjectRef::new("b").within("a");
        let mut slot = None;
        SignalsProbe::aim(&mut slot, whose.clone(), want("w/2", &[1, 2, 3]), now);
        let probe = slot.as_mut().expect("a probe");
        let asked = probe.start();
        probe.answered(
            &asked,
            vec![answer(1, "w/2", 30), answer(2, "w/1", 20), (IpAddr::from([10, 0, 0, 3]), None)],
            now,
        );
        let reading = SignalsProbe::read(&mut slot);
        assert_eq!(reading.serving, None, "the pods do not all serve one window");
        assert_eq!(reading.measured, Some(Measured::Incomplete { answered: 1, pods: 3 }));
        // An answer to an older want is dropped, and the new one is asked at once.
        let probe = slot.as_mut().expect("a probe");
        let asked = probe.start();
        SignalsProbe::aim(&mut slot, whose.clone(), want("w/3", &[1, 2, 3]), now);
        let probe = slot.as_mut().expect("a probe");
        probe.answered(&asked, vec![answer(1, "w/2", 30)], now);
        assert_eq!(probe.next_due(), Some(now));
        SignalsProbe::aim(&mut slot, whose, want("w/3", &[1, 2, 3]), now);
        assert_eq!(SignalsProbe::read(&mut slot).measured, None);
    }
}

//! What the controller remembers of each Balancer between reconciles: one record per Balancer,
//! by uid (a recreated namesake starts afresh), dropped whole when the Balancer goes.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;

use super::measuring::SignalsProbe;
use super::probing::PodProbe;

/// What the controller remembers of one Balancer. A record that holds nothing is not kept.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct BalancerRecord {
    /// Consecutive failed reconciles, for the backoff.
    pub failures: u32,
    /// When its status was last written: a change of backend readiness alone waits for
    /// [`READINESS_WRITE_INTERVAL`](super::status::READINESS_WRITE_INTERVAL).
    pub status_written: Option<Timestamp>,
    /// Which configuration its proxy pods serve, as the [`prober`](super::prober) learns it.
    pub probe: Option<PodProbe>,
    /// What its proxy pods measured for a running canary, as the prober learns it.
    pub signals: Option<SignalsProbe>,
    /// The newest sequence this operator signed for its proxy's configuration: the next is
    /// later, whatever a cache that has not seen that write, or a ConfigMap written back, says.
    pub signed_sequence: u64,
}

/// Every Balancer's record.
#[derive(Debug, Default)]
pub(super) struct Records(Mutex<HashMap<String, BalancerRecord>>);

impl Records {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, BalancerRecord>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads or changes the record of the Balancer `uid` (an empty one when there is none).
    pub(super) fn with<T>(&self, uid: &str, f: impl FnOnce(&mut BalancerRecord) -> T) -> T {
        let mut records = self.lock();
        let mut record = records.remove(uid).unwrap_or_default();
        let out = f(&mut record);
        if record != BalancerRecord::default() {
            records.insert(uid.to_string(), record);
        }
        out
    }

    /// Changes the record of the Balancer `uid` when there is one: what finishes after a
    /// Balancer is gone makes no record for it.
    pub(super) fn existing<T>(&self, uid: &str, f: impl FnOnce(&mut BalancerRecord) -> T) -> Option<T> {
        let mut records = self.lock();
        let record = records.get_mut(uid)?;
        let out = f(record);
        if *record == BalancerRecord::default() {
            records.remove(uid);
        }
        Some(out)
    }

    /// Reads every record, by uid.
    pub(super) fn each(&self, mut f: impl FnMut(&str, &BalancerRecord)) {
        for (uid, record) in self.lock().iter() {
            f(uid, record);
        }
    }

    /// Drops the record of the Balancer `uid`.
    pub(super) fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Drops the records of every Balancer but those `present`; returns how many are left.
    pub(super) fn keep_only(&self, present: &HashSet<String>) -> usize {
        let mut records = self.lock();
        records.retain(|uid, _| present.contains(uid));
        records.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_that_holds_nothing_is_not_kept_and_a_gone_balancers_is_dropped_whole() {
        let records = Records::default();
        let both = HashSet::from(["a".to_string(), "b".to_string()]);
        assert_eq!(records.with("a", |r| r.failures), 0);
        assert_eq!(records.keep_only(&both), 0, "reading kept nothing");
        let now = Timestamp::now();
        records.with("a", |r| r.failures = 2);
        records.with("b", |r| r.status_written = Some(now));
        records.with("c", |r| r.failures = 3);
        records.with("c", |r| r.failures = 0);
        assert_eq!(records.keep_only(&both), 2, "c held nothing more");
        assert_eq!(records.existing("a", |r| r.failures), Some(2), "a keeps all it holds");
        assert_eq!(records.existing("d", |r| r.failures = 1), None, "no record is made for d");
        records.each(|uid, _| assert_ne!(uid, "d"));
        records.forget("a");
        assert_eq!(records.with("a", |r| r.clone()), BalancerRecord::default(), "a dropped whole");
        assert_eq!(records.keep_only(&both), 1);
        assert_eq!(records.keep_only(&HashSet::new()), 0, "b is gone");
    }
}

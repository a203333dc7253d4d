//! The bytes of review bodies held at once, shared by every review being read or answered: a
//! body pays for its buffer as its bytes arrive, never for a length it only declares, so a
//! client that declares much and sends little holds nothing another review needs.
//!
//! Paying as bodies grow could leave two large bodies each holding part of the budget and
//! waiting for the rest, which the other holds, until both fail. So a payment is granted only
//! while every body being paid for could still be completed in some order (the banker's rule,
//! each body's claim being its declared length, or the limit when it declares none): a body may
//! wait for others to finish, never for one that waits for it. The body needing least can always
//! be paid, and a body whose client stops sending is cut off by its minimum rate
//! ([`super::body`]), which returns what it held.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

/// One body's account: what it may come to hold in all, and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Account {
    claim: usize,
    paid: usize,
}

impl Account {
    fn need(&self) -> usize {
        self.claim.saturating_sub(self.paid)
    }
}

/// Whether every account could still be paid in full from `free`, one after another: the
/// banker's rule for a single resource, in which the account needing least can always go first
/// if any can, and returns what it held when done.
fn safe(mut accounts: Vec<Account>, free: usize) -> bool {
    accounts.sort_unstable_by_key(Account::need);
    let mut free = free;
    for account in accounts {
        if account.need() > free {
            return false;
        }
        free = free.saturating_add(account.paid);
    }
    true
}

/// A payment waiting for room.
struct Pending {
    id: u64,
    claim: usize,
    amount: usize,
    granted: oneshot::Sender<()>,
}

/// Who holds what.
struct Ledger {
    free: usize,
    /// The accounts that hold bytes.
    accounts: HashMap<u64, Account>,
    /// Payments waiting, oldest first; each is granted as soon as it may be.
    queue: VecDeque<Pending>,
}

impl Ledger {
    /// Whether `id`, which may come to hold `claim`, may pay `amount` more now.
    fn may_pay(&self, id: u64, claim: usize, amount: usize) -> bool {
        if amount > self.free {
            return false;
        }
        let paid = self.accounts.get(&id).map_or(0, |a| a.paid);
        let after = Account { claim, paid: paid.saturating_add(amount) };
        let others = self.accounts.iter().filter(|(other, _)| **other != id).map(|(_, a)| *a);
        safe(others.chain([after]).collect(), self.free - amount)
    }

    fn grant(&mut self, id: u64, claim: usize, amount: usize) {
        self.free -= amount;
        self.accounts.entry(id).or_insert(Account { claim, paid: 0 }).paid += amount;
    }

    /// Grants every waiting payment that may be paid now, oldest first.
    fn settle(&mut self) {
        let mut i = 0;
        while let Some(pending) = self.queue.get(i) {
            if self.may_pay(pending.id, pending.claim, pending.amount) {
                if let Some(pending) = self.queue.remove(i) {
                    self.grant(pending.id, pending.claim, pending.amount);
                    let _ = pending.granted.send(());
                }
            } else {
                i += 1;
            }
        }
    }
}

/// A budget of bytes that bodies pay from (see the module's documentation).
pub struct Budget {
    ledger: Mutex<Ledger>,
    next_id: AtomicU64,
}

/// No room came within the wait.
#[derive(Debug, thiserror::Error)]
#[error("no room in the body budget in time")]
pub(super) struct Busy;

impl Budget {
    /// A budget of `total` bytes, none of them held.
    pub fn new(total: usize) -> Arc<Budget> {
        let ledger = Ledger { free: total, accounts: HashMap::new(), queue: VecDeque::new() };
        Arc::new(Budget { ledger: Mutex::new(ledger), next_id: AtomicU64::new(0) })
    }

    /// Bytes no body holds now.
    #[cfg(test)]
    fn free(&self) -> usize {
        self.ledger().free
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new body's account, which may come to hold `claim` bytes; it pays nothing yet.
    pub(super) fn open(self: &Arc<Self>, claim: usize) -> Tab {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        Tab { budget: self.clone(), id, claim, used: false }
    }
}

/// One body's account in a [`Budget`]: what it paid returns when dropped.
pub(super) struct Tab {
    budget: Arc<Budget>,
    id: u64,
    claim: usize,
    /// Whether it ever paid or waited: a body that never did (most are small) has nothing to
    /// return, and leaves without taking the lock.
    used: bool,
}

impl Tab {
    /// Pays `amount` more if that may be done at once.
    pub(super) fn try_pay(&mut self, amount: usize) -> bool {
        self.used = true;
        let mut ledger = self.budget.ledger();
        let may = ledger.may_pay(self.id, self.claim, amount);
        if may {
            ledger.grant(self.id, self.claim, amount);
        }
        may
    }

    /// Pays `amount` more, waiting at most `wait` for it, behind the payments already waiting.
    pub(super) async fn pay(&mut self, amount: usize, wait: Duration) -> Result<(), Busy> {
        self.used = true;
        let granted = {
            let mut ledger = self.budget.ledger();
            if ledger.may_pay(self.id, self.claim, amount) {
                ledger.grant(self.id, self.claim, amount);
                return Ok(());
            }
            let (granted, receiver) = oneshot::channel();
            ledger.queue.push_back(Pending { id: self.id, claim: self.claim, amount, granted });
            receiver
        };
        let mut queued = Queued { budget: &self.budget, id: self.id, done: false };
        let result = tokio::time::timeout(wait, granted).await;
        // Granted just as the wait ended: the payment is on the account.
        let granted_anyway = !queued.leave();
        match result {
            Ok(Ok(())) => Ok(()),
            _ if granted_anyway => Ok(()),
            _ => Err(Busy),
        }
    }

    /// Bytes this body holds.
    #[cfg(test)]
    fn paid(&self) -> usize {
        self.budget.ledger().accounts.get(&self.id).map_or(0, |a| a.paid)
    }
}

/// A waiting payment taken out of the queue when its wait ends, however it ends.
struct Queued<'a> {
    budget: &'a Budget,
    id: u64,
    done: bool,
}

impl Queued<'_> {
    /// Leaves the queue; whether the payment was still waiting there (not granted).
    fn leave(&mut self) -> bool {
        self.done = true;
        let mut ledger = self.budget.ledger();
        let before = ledger.queue.len();
        ledger.queue.retain(|pending| pending.id != self.id);
        ledger.queue.len() < before
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.leave();
        }
    }
}

impl Drop for Tab {
    fn drop(&mut self) {
        if !self.used {
            return;
        }
        let mut ledger = self.budget.ledger();
        ledger.queue.retain(|pending| pending.id != self.id);
        if let Some(account) = ledger.accounts.remove(&self.id) {
            ledger.free += account.paid;
            ledger.settle();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(claim: usize, paid: usize) -> Account {
        Account { claim, paid }
    }

    #[test]
    fn a_state_is_safe_when_the_accounts_can_be_completed_one_after_another() {
        assert!(safe(vec![], 0));
        assert!(safe(vec![account(10, 10)], 0), "a complete body needs nothing more");
        assert!(safe(vec![account(10, 4), account(10, 4)], 6), "one finishes, then the other");
        assert!(!safe(vec![account(10, 5), account(10, 5)], 4), "each waits for the other");
        assert!(safe(vec![account(100, 1), account(5, 5), account(20, 10)], 90), "the least needy first");
        assert!(!safe(vec![account(100, 1), account(20, 10)], 80));
    }

    #[tokio::test]
    async fn a_declared_length_reserves_nothing() {
        let budget = Budget::new(100);
        let mut large = budget.open(100);
        let mut small = budget.open(30);
        assert!(small.try_pay(30), "a body that declares the whole budget holds none of it");
        assert!(large.try_pay(10));
        assert_eq!((budget.free(), large.paid(), small.paid()), (60, 10, 30));
        drop((large, small));
        assert_eq!(budget.free(), 100, "everything comes back");
    }

    #[tokio::test]
    async fn two_large_bodies_never_hold_half_each_the_second_waits_for_the_first() {
        let budget = Budget::new(100);
        let mut first = budget.open(100);
        let mut second = budget.open(100);
        assert!(first.try_pay(10));
        assert!(!second.try_pay(10), "the first could not be completed any more");
        assert!(second.pay(10, Duration::from_millis(20)).await.is_err(), "it waits, then gives up");
        assert!(first.try_pay(90), "the first completes");
        let waiting = tokio::spawn(async move {
            let paid = second.pay(60, Duration::from_secs(5)).await;
            (paid.is_ok(), second)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        let (paid, second) = waiting.await.expect("the task");
        assert!(paid, "the first's bytes went to the second");
        assert_eq!(second.paid(), 60);
    }

    #[tokio::test]
    async fn a_small_body_is_paid_beside_a_large_one_that_holds_little() {
        let budget = Budget::new(100);
        let mut large = budget.open(100);
        assert!(large.try_pay(5));
        let mut small = budget.open(20);
        assert!(small.try_pay(20), "the small one completes, then the large one can");
        let mut another_large = budget.open(100);
        assert!(!another_large.try_pay(5), "but not a second large one");
    }

    #[tokio::test]
    async fn a_waiter_dropped_leaves_nothing_behind() {
        let budget = Budget::new(10);
        let mut holder = budget.open(10);
        assert!(holder.try_pay(10));
        let mut waiter = budget.open(10);
        let pay = waiter.pay(5, Duration::from_secs(5));
        assert!(tokio::time::timeout(Duration::from_millis(20), pay).await.is_err());
        assert!(budget.ledger().queue.is_empty(), "the cancelled wait left the queue");
        drop(holder);
        assert_eq!(budget.free(), 10);
        assert_eq!(waiter.paid(), 0);
    }
}

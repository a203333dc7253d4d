//! The one token bucket: the client throttle, the metrics endpoint's reviews of new tokens, and
//! each Balancer's budget of events all spend from one of these.

use std::time::Duration;

use tokio::time::Instant;

/// Admits at most `burst` at once and `per_second` on average. Time is passed in, so the
/// owner decides which clock (and tests need no sleeping).
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    tokens: f64,
    burst: f64,
    per_second: f64,
    refilled_at: Instant,
}

impl TokenBucket {
    /// A bucket holding its whole burst at `now`.
    pub(crate) fn full(burst: f64, per_second: f64, now: Instant) -> Self {
        TokenBucket { tokens: burst, burst, per_second, refilled_at: now }
    }

    /// Takes a token if one is there at `now`.
    pub(crate) fn try_take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.refilled_at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.refilled_at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How long after a refused [`try_take`](Self::try_take) the next token is due.
    pub(crate) fn next_token_in(&self) -> Duration {
        Duration::from_secs_f64((1.0 - self.tokens).max(0.0) / self.per_second)
    }

    /// When tokens were last counted.
    pub(crate) fn refilled_at(&self) -> Instant {
        self.refilled_at
    }

    /// The average rate now.
    pub(crate) fn per_second(&self) -> f64 {
        self.per_second
    }

    /// Changes the average rate from now on.
    pub(crate) fn set_per_second(&mut self, per_second: f64) {
        self.per_second = per_second;
    }

    /// Removes every token; the bucket then refills from zero.
    pub(crate) fn empty(&mut self) {
        self.tokens = 0.0;
    }

    /// Adds no tokens before `at`; refilling starts from then. Used to pause the bucket until `at`.
    pub(crate) fn refill_from(&mut self, at: Instant) {
        self.refilled_at = at;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(3.0, 2.0, start);
        assert_eq!((0..10).filter(|_| bucket.try_take(start)).count(), 3);
        assert_eq!(bucket.next_token_in(), Duration::from_millis(500));
        assert!(!bucket.try_take(start + Duration::from_millis(400)));
        assert!(bucket.try_take(start + Duration::from_millis(500)));
        let later = start + Duration::from_secs(60);
        assert_eq!((0..10).filter(|_| bucket.try_take(later)).count(), 3, "never more than the burst");
    }

    #[test]
    fn an_emptied_bucket_held_until_a_pause_ends_refills_from_then() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(5.0, 1.0, start);
        bucket.empty();
        bucket.refill_from(start + Duration::from_secs(10));
        assert!(!bucket.try_take(start + Duration::from_secs(10)));
        assert!(bucket.try_take(start + Duration::from_secs(11)));
    }
}

//! How the operator comes back when the API server was away: retries a few seconds apart at
//! most, and a re-list at once when a watch's resource version has expired.
//!
//! kube-runtime's default watch backoff is client-go's (0.8 s doubling to 30 s, up to 100 %
//! jitter on top, reset only by an event or after 2 minutes), and it sleeps after every error,
//! the `410 Gone` included, which only asks for a re-list. After a 15 s outage a watch then tried
//! again up to a minute after the API server was back, and each watch slept once more before it
//! re-listed. Here the next attempt is never more than [`MAX_DELAY`] away, and a watch re-lists
//! as soon as it learns its resource version expired, as client-go's reflector does.
//!
//! A handful of long-lived requests retrying every 2 s costs a down API server nothing worth
//! saving, and an overloaded one answers them 429, which they wait out the same way.

use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;
use ring::rand::{SecureRandom, SystemRandom};

/// The first retry's delay.
pub(crate) const FIRST_DELAY: Duration = Duration::from_millis(250);
/// The longest delay between two attempts (plus at most a tenth of it at random).
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(2);
/// A second expired resource version within this long of the first goes to the backoff like any
/// other error: a server that answered every watch 410 would otherwise be listed in a tight loop.
pub(crate) const RELIST_AT_ONCE_EVERY: Duration = Duration::from_secs(10);

/// Delays between attempts: [`FIRST_DELAY`] doubling to [`MAX_DELAY`], each up to a tenth
/// longer at random so that many clients do not retry in step; back to the first after a success.
#[derive(Debug, Clone)]
pub(crate) struct RetryDelay {
    next: Duration,
}

impl Default for RetryDelay {
    fn default() -> Self {
        RetryDelay { next: FIRST_DELAY }
    }
}

impl Iterator for RetryDelay {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let base = self.next;
        self.next = base.saturating_mul(2).min(MAX_DELAY);
        Some(base + jitter(base / 10))
    }
}

impl Backoff for RetryDelay {
    fn reset(&mut self) {
        self.next = FIRST_DELAY;
    }
}

/// A random duration up to `most` (none when the system's randomness fails: jitter is a nicety).
fn jitter(most: Duration) -> Duration {
    let mut bytes = [0u8; 2];
    if SystemRandom::new().fill(&mut bytes).is_err() {
        return Duration::ZERO;
    }
    most.mul_f64(f64::from(u16::from_le_bytes(bytes)) / f64::from(u16::MAX))
}

/// Whether a watch error says its resource version is too old (`410 Gone`): kube's watcher has
/// already reset itself, and its next step is a fresh list.
pub(crate) fn is_expired(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchError(status) if status.code == 410)
}

/// A watch stream without its expired-resource-version errors, so that the backoff after it
/// never sleeps before the re-list those errors lead to. At most one is dropped per
/// [`RELIST_AT_ONCE_EVERY`]: a second one within that time is passed on, and backed off like
/// any other error.
pub(crate) fn relist_at_once<K, S>(watch: S) -> impl Stream<Item = S::Item>
where
    K: Resource<DynamicType = ()>,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut last: Option<Instant> = None;
    watch.filter(move |item| {
        let expired = matches!(item, Err(e) if is_expired(e));
        let at_once = expired && last.is_none_or(|at| at.elapsed() >= RELIST_AT_ONCE_EVERY);
        if at_once {
            last = Some(Instant::now());
            tracing::info!(kind = %K::kind(&()), "watch expired (410 Gone): re-listing at once");
        }
        std::future::ready(!at_once)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::core::Status;

    #[test]
    fn delays_double_to_a_bound_with_a_little_jitter_and_reset() {
        let mut delays = RetryDelay::default();
        let seen: Vec<Duration> = delays.by_ref().take(8).collect();
        let bases = [250, 500, 1000, 2000, 2000, 2000, 2000, 2000].map(Duration::from_millis);
        for (delay, base) in seen.iter().zip(bases) {
            assert!(*delay >= base && *delay <= base + base / 10, "{seen:?}");
        }
        delays.reset();
        assert!(delays.next().unwrap() < Duration::from_millis(300));
    }

    fn gone() -> Result<watcher::Event<ConfigMap>, watcher::Error> {
        let status = Status::failure("too old resource version: 251 (275)", "Expired").with_code(410);
        Err(watcher::Error::WatchError(Box::new(status)))
    }

    fn other() -> Result<watcher::Event<ConfigMap>, watcher::Error> {
        Err(watcher::Error::WatchError(Box::new(Status::failure("gateway timeout", "Timeout").with_code(504))))
    }

    #[tokio::test]
    async fn the_first_expiry_is_dropped_and_a_quick_second_one_passed_on() {
        let items = vec![gone(), Ok(watcher::Event::Init), gone(), other()];
        let left: Vec<_> = relist_at_once(stream::iter(items)).collect().await;
        assert_eq!(left.len(), 3, "{left:?}");
        assert!(matches!(left[0], Ok(watcher::Event::Init)));
        assert!(matches!(&left[1], Err(e) if is_expired(e)), "a second 410 at once is backed off");
        assert!(matches!(&left[2], Err(e) if !is_expired(e)), "other errors are kept");
    }
}

//! Who may scrape `/metrics`: like controller-runtime's metrics filter, a bearer
//! token is authenticated with a TokenReview and authorized with a
//! SubjectAccessReview for `get` on the non-resource URL `/metrics`.
//!
//! Verdicts on authenticated tokens are cached so a scrape every few seconds costs
//! the API server two requests a minute, not two per scrape:
//!
//! - younger than [`VERDICT_TTL`], a verdict is served as is;
//! - older, but younger than [`MAX_STALENESS`], it is still served at once while one
//!   review refreshes it in the background (stale-while-revalidate), so a scraper
//!   never waits on, nor competes for, a review it has already passed;
//! - older still, the caller waits for a fresh review.
//!
//! Reviews of tokens that are not cached ("new" tokens) are what a client flooding
//! random tokens can cause, so they are bounded twice: a token bucket caps their rate
//! and a semaphore their concurrency; past either the caller gets [`ReviewError::Busy`]
//! at once. Tokens with a cached verdict ("known" tokens, whatever its age) are
//! reviewed in slots of their own, outside the bucket, so the flood cannot starve them.
//! Concurrent callers with the same token share one review.
//!
//! The verdict cache, its two review lanes and the in-flight reviews share one lock and one
//! set of invariants, so they stay in one module where the invariants can be read together.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;

use crate::util::token_bucket::TokenBucket;

/// How long a verdict is served without asking the API server again; a Prometheus
/// scraping every 15–30 s thus costs one review pair a minute.
pub const VERDICT_TTL: Duration = Duration::from_secs(60);
/// How long past its review a verdict may still be served while it is being refreshed.
/// Five minutes rides out a slow or briefly unavailable API server, and bounds how long
/// a revoked token or permission keeps working, as the API server's own token cache does.
pub const MAX_STALENESS: Duration = Duration::from_secs(5 * 60);
/// Tokens remembered at most (only authenticated ones are); when full, the verdict
/// reviewed longest ago is forgotten.
pub const CACHE_CAPACITY: usize = 1024;
/// Reviews of new tokens sent to the API server at once; more get 429.
pub const MAX_NEW_TOKEN_REVIEWS_IN_FLIGHT: usize = 4;
/// Reviews of known tokens (mostly refreshes) sent at once, apart from those of new
/// tokens so that a flood of new tokens cannot starve them. Each known token has at most
/// one under way and needs one per TTL, so two serve a Prometheus HA pair and more; a
/// stale verdict that finds no free slot is still served and retried on the next scrape.
pub const MAX_KNOWN_TOKEN_REVIEWS_IN_FLIGHT: usize = 2;
/// Sustained rate at which reviews of new tokens may start: enough for scrapers
/// appearing or rotating their tokens, far below what would load the API server.
pub const NEW_TOKEN_REVIEWS_PER_SECOND: u32 = 5;
/// Reviews of new tokens that may start back to back after a quiet spell, e.g. when
/// several scrapers start together.
pub const NEW_TOKEN_REVIEW_BURST: u32 = 10;
/// Time one review (TokenReview then SubjectAccessReview) may take.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// The answer for one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated and allowed to `get /metrics`.
    Allowed,
    /// Not a valid token: HTTP 401.
    Unauthenticated,
    /// A valid token without the permission: HTTP 403.
    Forbidden,
}

/// Why a token could not be reviewed. Cloneable because callers sharing a review
/// share its outcome.
#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReviewError {
    #[error("cannot review the token with the API server: {0}")]
    Api(#[source] Arc<kube::Error>),
    #[error("the API server did not answer the token review in time")]
    Timeout,
    #[error("too many token reviews under way")]
    Busy,
    #[error("the token review ended without an answer")]
    Interrupted,
}

impl From<kube::Error> for ReviewError {
    fn from(error: kube::Error) -> Self {
        ReviewError::Api(Arc::new(error))
    }
}

/// The cache and rate limits of [`MetricsAuth`]; the defaults are the constants above.
#[derive(Debug, Clone)]
pub struct Limits {
    /// See [`VERDICT_TTL`].
    pub verdict_ttl: Duration,
    /// See [`MAX_STALENESS`].
    pub max_staleness: Duration,
    /// See [`CACHE_CAPACITY`].
    pub cache_capacity: usize,
    /// See [`MAX_NEW_TOKEN_REVIEWS_IN_FLIGHT`].
    pub max_new_token_reviews_in_flight: usize,
    /// See [`MAX_KNOWN_TOKEN_REVIEWS_IN_FLIGHT`].
    pub max_known_token_reviews_in_flight: usize,
    /// See [`NEW_TOKEN_REVIEWS_PER_SECOND`].
    pub new_token_reviews_per_second: u32,
    /// See [`NEW_TOKEN_REVIEW_BURST`].
    pub new_token_review_burst: u32,
    /// See [`REVIEW_TIMEOUT`].
    pub review_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            verdict_ttl: VERDICT_TTL,
            max_staleness: MAX_STALENESS,
            cache_capacity: CACHE_CAPACITY,
            max_new_token_reviews_in_flight: MAX_NEW_TOKEN_REVIEWS_IN_FLIGHT,
            max_known_token_reviews_in_flight: MAX_KNOWN_TOKEN_REVIEWS_IN_FLIGHT,
            new_token_reviews_per_second: NEW_TOKEN_REVIEWS_PER_SECOND,
            new_token_review_burst: NEW_TOKEN_REVIEW_BURST,
            review_timeout: REVIEW_TIMEOUT,
        }
    }
}

/// Reviews scrape tokens against the cluster, caching verdicts.
pub struct MetricsAuth {
    shared: Arc<Shared>,
}

impl MetricsAuth {
    /// Reviews with `client`, within the default [`Limits`].
    pub fn new(client: Client) -> Self {
        Self::with_limits(client, Limits::default())
    }

    /// Reviews with `client`, within `limits` (tests shrink them).
    pub fn with_limits(client: Client, limits: Limits) -> Self {
        let state = State {
            verdicts: HashMap::new(),
            in_flight: HashMap::new(),
            new_token_bucket: TokenBucket::full(
                f64::from(limits.new_token_review_burst),
                f64::from(limits.new_token_reviews_per_second),
                Instant::now(),
            ),
        };
        let shared = Shared {
            client,
            new_token_slots: Arc::new(Semaphore::new(limits.max_new_token_reviews_in_flight)),
            known_token_slots: Arc::new(Semaphore::new(limits.max_known_token_reviews_in_flight)),
            limits,
            state: Mutex::new(state),
        };
        MetricsAuth { shared: Arc::new(shared) }
    }

    /// The verdict on `token`: from the cache (refreshing it if stale), from a review
    /// under way for the same token, or from a new review.
    pub async fn review(&self, token: &str) -> Result<Verdict, ReviewError> {
        let Lookup { answer, admitted } = self.shared.look_up(token, Instant::now())?;
        if let Some(admitted) = admitted {
            self.shared.spawn_review(admitted, token);
        }
        match answer {
            Answer::Served(verdict) => Ok(verdict),
            Answer::Pending(review) => outcome_of(review).await,
        }
    }
}

/// Only a SHA-256 digest of a token is kept in memory.
type Key = [u8; 32];
type Outcome = Result<Verdict, ReviewError>;
/// Receives the outcome of a review under way; `None` until it is known.
type PendingReview = watch::Receiver<Option<Outcome>>;

struct Shared {
    client: Client,
    limits: Limits,
    state: Mutex<State>,
    new_token_slots: Arc<Semaphore>,
    known_token_slots: Arc<Semaphore>,
}

struct State {
    /// Verdicts on authenticated tokens only: invalid tokens are never remembered, so
    /// a flood of random ones cannot evict the scrapers' verdicts. A verdict past max
    /// staleness is no longer served but still marks its token as known, until a review
    /// replaces or drops it or the cache is full.
    verdicts: HashMap<Key, Cached>,
    /// Reviews under way, one per token at most; each holds a review slot, so this
    /// map is as bounded as the slots.
    in_flight: HashMap<Key, PendingReview>,
    new_token_bucket: TokenBucket,
}

#[derive(Debug, Clone, Copy)]
struct Cached {
    verdict: Verdict,
    /// When the review that gave the verdict started.
    reviewed_at: Instant,
}

/// What [`Shared::look_up`] found, and the review it admitted, if any. The review is spawned
/// only once the state is unlocked: a task dropped at spawn (as when the runtime shuts down)
/// takes the lock to remove itself from [`State::in_flight`], and would wait for it forever.
struct Lookup {
    answer: Answer,
    admitted: Option<Admitted>,
}

enum Answer {
    Served(Verdict),
    Pending(PendingReview),
}

/// A review that holds a slot and its entry in [`State::in_flight`].
struct Admitted {
    slot: OwnedSemaphorePermit,
    key: Key,
    pending: PendingReview,
    done: watch::Sender<Option<Outcome>>,
    asked_at: Instant,
}

enum Freshness {
    Fresh,
    Stale,
    Expired,
}

/// Which limits a review is subject to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// A token without a cached verdict: the token bucket and the new-token slots.
    NewToken,
    /// A token with a cached verdict, however old: the known-token slots only.
    KnownToken,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn look_up(&self, token: &str, now: Instant) -> Result<Lookup, ReviewError> {
        let key = digest(token);
        let mut state = self.state();
        let cached = state.verdicts.get(&key).copied();
        match cached.map(|cached| (cached.verdict, self.freshness(cached, now))) {
            Some((verdict, Freshness::Fresh)) => Ok(Lookup { answer: Answer::Served(verdict), admitted: None }),
            Some((verdict, Freshness::Stale)) => {
                let admitted = self.admit_refresh(&mut state, key, now);
                Ok(Lookup { answer: Answer::Served(verdict), admitted })
            }
            expired_or_unknown => {
                if let Some(review) = state.in_flight.get(&key) {
                    return Ok(Lookup { answer: Answer::Pending(review.clone()), admitted: None });
                }
                let lane = if expired_or_unknown.is_some() { Lane::KnownToken } else { Lane::NewToken };
                let admitted = self.admit_review(&mut state, key, lane, now)?;
                Ok(Lookup { answer: Answer::Pending(admitted.pending.clone()), admitted: Some(admitted) })
            }
        }
    }

    fn freshness(&self, cached: Cached, now: Instant) -> Freshness {
        let age = now.saturating_duration_since(cached.reviewed_at);
        if age < self.limits.verdict_ttl {
            Freshness::Fresh
        } else if age < self.limits.max_staleness {
            Freshness::Stale
        } else {
            Freshness::Expired
        }
    }

    /// Admits a refresh of a stale verdict unless one is under way; without a free
    /// slot, the next scrape tries again.
    fn admit_refresh(&self, state: &mut State, key: Key, now: Instant) -> Option<Admitted> {
        if state.in_flight.contains_key(&key) {
            return None;
        }
        match self.admit_review(state, key, Lane::KnownToken, now) {
            Ok(admitted) => {
                tracing::debug!("refreshing a stale scrape verdict");
                Some(admitted)
            }
            Err(error) => {
                tracing::debug!(%error, "cannot refresh a stale scrape verdict yet");
                None
            }
        }
    }

    /// Takes a review slot for `lane` and registers the review as under way.
    fn admit_review(&self, state: &mut State, key: Key, lane: Lane, now: Instant) -> Result<Admitted, ReviewError> {
        let slot = self.take_slot(state, lane, now)?;
        let (done, pending) = watch::channel(None);
        state.in_flight.insert(key, pending.clone());
        Ok(Admitted { slot, key, pending, done, asked_at: now })
    }

    /// Runs an admitted review in its own task, so that it completes and fills the
    /// cache even when the caller that started it goes away.
    fn spawn_review(self: &Arc<Self>, admitted: Admitted, token: &str) {
        let Admitted { slot, key, pending, done, asked_at } = admitted;
        let in_flight = InFlight { shared: Arc::clone(self), key, pending };
        let token = token.to_owned();
        tokio::spawn(async move {
            let _slot = slot;
            let outcome = in_flight.shared.ask_in_time(&token).await;
            drop(token);
            in_flight.finish(outcome, asked_at, &done);
        });
    }

    /// A review slot for `lane`, or [`ReviewError::Busy`] at once.
    fn take_slot(&self, state: &mut State, lane: Lane, now: Instant) -> Result<OwnedSemaphorePermit, ReviewError> {
        let slots = match lane {
            Lane::NewToken => &self.new_token_slots,
            Lane::KnownToken => &self.known_token_slots,
        };
        // The slot is taken first, so a review turned away for lack of a slot does not also
        // spend a token from the bucket.
        let slot = Arc::clone(slots).try_acquire_owned().map_err(|_| ReviewError::Busy)?;
        if lane == Lane::NewToken && !state.new_token_bucket.try_take(now) {
            return Err(ReviewError::Busy);
        }
        Ok(slot)
    }

    async fn ask_in_time(&self, token: &str) -> Outcome {
        tokio::time::timeout(self.limits.review_timeout, ask(&self.client, token))
            .await
            .map_err(|_| ReviewError::Timeout)?
    }

    /// Caches a verdict on an authenticated token, forgets an unauthenticated one, and
    /// keeps the cached verdict (until it expires) when the review failed.
    fn record(&self, state: &mut State, key: Key, outcome: &Outcome, reviewed_at: Instant) {
        match outcome {
            Ok(Verdict::Unauthenticated) => {
                state.verdicts.remove(&key);
            }
            Ok(verdict) => self.remember(state, key, Cached { verdict: *verdict, reviewed_at }),
            Err(error) if state.verdicts.contains_key(&key) => {
                tracing::warn!(%error, "cannot refresh a cached scrape verdict; it is kept until max staleness");
            }
            Err(_) => {}
        }
    }

    fn remember(&self, state: &mut State, key: Key, cached: Cached) {
        if !state.verdicts.contains_key(&key) && state.verdicts.len() >= self.limits.cache_capacity {
            let oldest = state.verdicts.iter().min_by_key(|(_, cached)| cached.reviewed_at).map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                state.verdicts.remove(&oldest);
            }
        }
        if self.limits.cache_capacity > 0 {
            state.verdicts.insert(key, cached);
        }
    }
}

/// A review under way: its entry in [`State::in_flight`] goes when the review ends,
/// however its task ends, so that no token is left waiting on a dead review.
struct InFlight {
    shared: Arc<Shared>,
    key: Key,
    pending: PendingReview,
}

impl InFlight {
    fn finish(&self, outcome: Outcome, reviewed_at: Instant, done: &watch::Sender<Option<Outcome>>) {
        {
            let mut state = self.shared.state();
            self.shared.record(&mut state, self.key, &outcome, reviewed_at);
            self.leave(&mut state);
        }
        done.send_replace(Some(outcome));
    }

    fn leave(&self, state: &mut State) {
        if state.in_flight.get(&self.key).is_some_and(|pending| pending.same_channel(&self.pending)) {
            state.in_flight.remove(&self.key);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        self.leave(&mut state);
    }
}

async fn outcome_of(mut review: PendingReview) -> Outcome {
    let outcome = review.wait_for(Option::is_some).await.map_err(|_| ReviewError::Interrupted)?.clone();
    outcome.unwrap_or(Err(ReviewError::Interrupted))
}

async fn ask(client: &Client, token: &str) -> Outcome {
    let review = TokenReview {
        spec: TokenReviewSpec { token: Some(token.to_string()), audiences: None },
        ..TokenReview::default()
    };
    let reviewed = Api::<TokenReview>::all(client.clone()).create(&PostParams::default(), &review).await?;
    let status = reviewed.status.unwrap_or_default();
    let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
        return Ok(Verdict::Unauthenticated);
    };
    let access = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username,
            uid: user.uid,
            groups: user.groups,
            extra: user.extra,
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some("/metrics".into()),
                verb: Some("get".into()),
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let decided = Api::<SubjectAccessReview>::all(client.clone()).create(&PostParams::default(), &access).await?;
    let allowed = decided.status.is_some_and(|s| s.allowed);
    Ok(if allowed { Verdict::Allowed } else { Verdict::Forbidden })
}

fn digest(token: &str) -> Key {
    let mut key = [0u8; 32];
    key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
    key
}

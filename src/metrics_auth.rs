//! Who may scrape `/metrics`: like controller-runtime's metrics filter, a bearer
//! token is authenticated with a TokenReview and authorized with a
//! SubjectAccessReview for `get` on the non-resource URL `/metrics`.
//! Verdicts are cached briefly so a scrape every few seconds costs the API
//! server two requests a minute, not two per scrape.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::PostParams;
use kube::{Api, Client};

/// How long a verdict on a token is reused.
pub const VERDICT_TTL: Duration = Duration::from_secs(60);
/// Tokens remembered at most; expired verdicts are pruned first, then the cache starts over.
const CACHE_CAPACITY: usize = 1024;
/// Reviews sent to the API server at once; more scrapes with unknown tokens get 429.
const MAX_REVIEWS_IN_FLIGHT: usize = 4;
/// Time a review may take.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

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

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("cannot review the token with the API server: {0}")]
    Api(#[from] kube::Error),
    #[error("the API server did not answer the token review in time")]
    Timeout,
    #[error("too many token reviews under way")]
    Busy,
}

/// Reviews scrape tokens against the cluster, caching verdicts.
pub struct MetricsAuth {
    client: Client,
    /// Verdicts on authenticated tokens only: invalid tokens are never remembered, so
    /// a flood of random ones cannot evict the scrapers' verdicts.
    cache: Mutex<HashMap<[u8; 32], (Verdict, Instant)>>,
    /// Bounds the review requests one scraper flood can send to the API server.
    reviews: tokio::sync::Semaphore,
}

impl MetricsAuth {
    pub fn new(client: Client) -> Self {
        MetricsAuth {
            client,
            cache: Mutex::new(HashMap::new()),
            reviews: tokio::sync::Semaphore::new(MAX_REVIEWS_IN_FLIGHT),
        }
    }

    /// The verdict on `token`, from the cache or from the API server.
    pub async fn review(&self, token: &str) -> Result<Verdict, ReviewError> {
        // Only a digest of the token is kept in memory.
        let key = digest(token);
        if let Some(verdict) = self.cached(&key) {
            return Ok(verdict);
        }
        let _permit = self.reviews.try_acquire().map_err(|_| ReviewError::Busy)?;
        let verdict =
            tokio::time::timeout(REVIEW_TIMEOUT, self.ask(token)).await.map_err(|_| ReviewError::Timeout)??;
        if verdict != Verdict::Unauthenticated {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if cache.len() >= CACHE_CAPACITY {
                cache.retain(|_, (_, at)| at.elapsed() < VERDICT_TTL);
            }
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
            cache.insert(key, (verdict, Instant::now()));
        }
        Ok(verdict)
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Verdict> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.get(key).filter(|(_, at)| at.elapsed() < VERDICT_TTL).map(|(verdict, _)| *verdict)
    }

    async fn ask(&self, token: &str) -> Result<Verdict, ReviewError> {
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), audiences: None },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone()).create(&PostParams::default(), &review).await?;
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
        let decided =
            Api::<SubjectAccessReview>::all(self.client.clone()).create(&PostParams::default(), &access).await?;
        let allowed = decided.status.is_some_and(|s| s.allowed);
        Ok(if allowed { Verdict::Allowed } else { Verdict::Forbidden })
    }
}

fn digest(token: &str) -> [u8; 32] {
    let mut key = [0u8; 32];
    key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
    key
}

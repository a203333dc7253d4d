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
/// Tokens remembered at most; the cache starts over when full.
const CACHE_CAPACITY: usize = 1024;

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
#[error("cannot review the token with the API server: {0}")]
pub struct ReviewError(#[from] kube::Error);

/// Reviews scrape tokens against the cluster, caching verdicts.
pub struct MetricsAuth {
    client: Client,
    cache: Mutex<HashMap<[u8; 32], (Verdict, Instant)>>,
}

impl MetricsAuth {
    pub fn new(client: Client) -> Self {
        MetricsAuth { client, cache: Mutex::new(HashMap::new()) }
    }

    /// The verdict on `token`, from the cache or from the API server.
    pub async fn review(&self, token: &str) -> Result<Verdict, ReviewError> {
        // Only a digest of the token is kept in memory.
        let key = digest(token);
        if let Some(verdict) = self.cached(&key) {
            return Ok(verdict);
        }
        let verdict = self.ask(token).await?;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(key, (verdict, Instant::now()));
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

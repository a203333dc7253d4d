//! Scrape-token reviews against kube's `Client` over a tower-test mock API server, on a
//! paused clock: every TokenReview and SubjectAccessReview is asserted, the cache and
//! its stale-while-revalidate refreshes are timed with `tokio::time::advance`, and a
//! flood of invalid tokens must neither reach the API server past the rate limit nor
//! crowd out the real scraper.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{Method, StatusCode};
use balancer::runtime::metrics_auth::{
    Limits, MAX_NEW_TOKEN_REVIEWS_IN_FLIGHT, MAX_STALENESS, MetricsAuth, NEW_TOKEN_REVIEW_BURST,
    NEW_TOKEN_REVIEWS_PER_SECOND, REVIEW_TIMEOUT, ReviewError, VERDICT_TTL, Verdict,
};
use futures::FutureExt;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::support::mock_api::{self, MockApi, Respond, reply};

type ApiServer = MockApi;
type Reviewed = JoinHandle<Result<Verdict, ReviewError>>;

const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews?";
const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews?";
/// The only valid token: Prometheus' service account.
const SCRAPER: &str = "scraper-token";
const FLOOD: usize = 200;

fn auth_with(limits: Limits) -> (Arc<MetricsAuth>, ApiServer) {
    let (client, server) = mock_api::pair();
    (Arc::new(MetricsAuth::with_limits(client, limits)), server)
}

fn auth() -> (Arc<MetricsAuth>, ApiServer) {
    auth_with(Limits::default())
}

fn spawn_review(auth: &Arc<MetricsAuth>, token: &str) -> Reviewed {
    let (auth, token) = (Arc::clone(auth), token.to_string());
    tokio::spawn(async move { auth.review(&token).await })
}

fn invalid_token(i: usize) -> String {
    format!("invalid-token-{i:03}")
}

/// The verdict, which must be known without waiting on the API server.
fn at_once(auth: &MetricsAuth, token: &str) -> Result<Verdict, ReviewError> {
    auth.review(token).now_or_never().expect("the review waited instead of answering at once")
}

fn token_review_request(token: &str) -> Value {
    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
           "spec": {"token": token}})
}

fn scraper_user() -> Value {
    json!({"username": "system:serviceaccount:monitoring:prometheus", "uid": "prometheus-uid",
           "groups": ["system:serviceaccounts", "system:serviceaccounts:monitoring", "system:authenticated"],
           "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]}})
}

fn access_review_request() -> Value {
    let user = scraper_user();
    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {},
           "spec": {"user": user["username"], "uid": user["uid"], "groups": user["groups"], "extra": user["extra"],
                    "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}})
}

/// Takes the next request (failing if none comes), checks it is a POST and returns its
/// URI, its JSON body and the responder.
async fn next_request(server: &mut ApiServer) -> (String, Value, Respond) {
    let received = server.next_within(Duration::from_secs(1)).await.expect("no request arrived");
    assert_eq!(received.method, Method::POST);
    (received.uri, received.body, received.respond)
}

/// The next request is a TokenReview; returns the token it reviews.
async fn next_token_review(server: &mut ApiServer) -> (String, Respond) {
    let (uri, body, respond) = next_request(server).await;
    assert_eq!(uri, TOKEN_REVIEWS);
    let token = body["spec"]["token"].as_str().expect("a TokenReview without a token").to_string();
    assert_eq!(body, token_review_request(&token));
    (token, respond)
}

async fn expect_token_review(server: &mut ApiServer, token: &str) -> Respond {
    let (reviewed, respond) = next_token_review(server).await;
    assert_eq!(reviewed, token);
    respond
}

/// The next request is the SubjectAccessReview for the scraper's user on `get /metrics`.
async fn expect_access_review(server: &mut ApiServer) -> Respond {
    let (uri, body, respond) = next_request(server).await;
    assert_eq!(uri, ACCESS_REVIEWS);
    assert_eq!(body, access_review_request());
    respond
}

/// The scraper is allowed at once, and no request goes to the API server for it.
async fn allowed_from_the_cache(auth: &MetricsAuth, server: &mut ApiServer) {
    assert!(matches!(at_once(auth, SCRAPER), Ok(Verdict::Allowed)));
    assert_no_request(server).await;
}

/// A verdict refreshed now is still served from the cache just before one more TTL is over.
async fn still_fresh_just_before_another_ttl(auth: &MetricsAuth, server: &mut ApiServer) {
    tokio::time::advance(VERDICT_TTL - Duration::from_secs(1)).await;
    allowed_from_the_cache(auth, server).await;
}

/// No request arrives once every task has run as far as it can.
async fn assert_no_request(server: &mut ApiServer) {
    // On the paused clock the timeout only fires when every task is idle.
    server.assert_none_within(Duration::from_millis(1)).await;
}

fn authenticated(respond: Respond, token: &str) {
    let mut review = token_review_request(token);
    review["status"] =
        json!({"authenticated": true, "user": scraper_user(), "audiences": ["https://kubernetes.default.svc"]});
    reply(respond, StatusCode::CREATED, &review);
}

fn unauthenticated(respond: Respond, token: &str) {
    let mut review = token_review_request(token);
    review["status"] = json!({"authenticated": false, "error": "invalid bearer token"});
    reply(respond, StatusCode::CREATED, &review);
}

fn access(respond: Respond, allowed: bool) {
    let mut review = access_review_request();
    review["status"] = json!({"allowed": allowed});
    reply(respond, StatusCode::CREATED, &review);
}

fn server_error(respond: Respond) {
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500});
    reply(respond, StatusCode::INTERNAL_SERVER_ERROR, &status);
}

/// Answers the scraper's review pair: authenticated, then allowed.
async fn answer_scraper(server: &mut ApiServer) {
    authenticated(expect_token_review(server, SCRAPER).await, SCRAPER);
    access(expect_access_review(server).await, true);
}

/// A fresh authorizer whose cache holds the scraper's verdict, and its API server.
async fn auth_with_the_scraper_cached() -> (Arc<MetricsAuth>, ApiServer) {
    let (auth, mut server) = auth();
    cache_scraper(&auth, &mut server).await;
    (auth, server)
}

/// Reviews the scraper's token for the first time: its verdict is then cached.
async fn cache_scraper(auth: &Arc<MetricsAuth>, server: &mut ApiServer) {
    let review = spawn_review(auth, SCRAPER);
    answer_scraper(server).await;
    assert!(matches!(review.await.unwrap(), Ok(Verdict::Allowed)));
}

/// Reviews an invalid token, answering its TokenReview.
async fn review_invalid(auth: &Arc<MetricsAuth>, server: &mut ApiServer, token: &str) {
    let review = spawn_review(auth, token);
    unauthenticated(expect_token_review(server, token).await, token);
    let verdict = review.await.unwrap();
    assert!(matches!(verdict, Ok(Verdict::Unauthenticated)), "{verdict:?}");
}

/// Starts the flood at once: every review of a new token the limits admit reaches the
/// API server and is held there, unanswered; the others must be refused at once.
async fn hold_flood(auth: &Arc<MetricsAuth>, server: &mut ApiServer) -> (Vec<Reviewed>, Vec<(String, Respond)>) {
    let flood: Vec<Reviewed> = (0..FLOOD).map(|i| spawn_review(auth, &invalid_token(i))).collect();
    let mut held = Vec::new();
    for _ in 0..MAX_NEW_TOKEN_REVIEWS_IN_FLIGHT {
        held.push(next_token_review(server).await);
    }
    assert_no_request(server).await;
    assert_eq!(flood.iter().filter(|review| review.is_finished()).count(), FLOOD - held.len());
    (flood, held)
}

/// Answers the held reviews: the flood got only 401s and 429s.
async fn end_flood(flood: Vec<Reviewed>, held: Vec<(String, Respond)>) {
    let held_count = held.len();
    for (token, respond) in held {
        assert!(token.starts_with("invalid-token-"), "{token}");
        unauthenticated(respond, &token);
    }
    let (mut unauthenticated, mut busy) = (0, 0);
    for review in flood {
        match review.await.unwrap() {
            Ok(Verdict::Unauthenticated) => unauthenticated += 1,
            Err(ReviewError::Busy) => busy += 1,
            other => panic!("a flooding token got {other:?}"),
        }
    }
    assert_eq!((unauthenticated, busy), (held_count, FLOOD - held_count));
}

/// Stands in for the API server, knowing only [`SCRAPER`] as a valid token, and
/// records every token reviewed.
struct FakeApiServer {
    reviewed: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl FakeApiServer {
    fn start(mut server: ApiServer) -> Self {
        let reviewed = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&reviewed);
        let task = tokio::spawn(async move {
            while let Some(request) = server.recv().await {
                let (uri, body, respond) = (request.uri, request.body, request.respond);
                assert_eq!(request.method, Method::POST);
                if uri == ACCESS_REVIEWS {
                    assert_eq!(body, access_review_request());
                    access(respond, true);
                    continue;
                }
                assert_eq!(uri, TOKEN_REVIEWS);
                let token = body["spec"]["token"].as_str().unwrap().to_string();
                assert_eq!(body, token_review_request(&token));
                log.lock().unwrap().push(token.clone());
                if token == SCRAPER { authenticated(respond, &token) } else { unauthenticated(respond, &token) }
            }
        });
        FakeApiServer { reviewed, task }
    }

    fn reviews_of(&self, is: impl Fn(&str) -> bool) -> usize {
        self.reviewed.lock().unwrap().iter().filter(|token| is(token)).count()
    }

    /// Stops answering, failing the test if a request was not as expected.
    async fn stop(self) {
        self.task.abort();
        if let Err(error) = self.task.await
            && error.is_panic()
        {
            std::panic::resume_unwind(error.into_panic());
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_valid_token_is_reviewed_once_then_served_from_the_cache() {
    let (auth, mut server) = auth_with_the_scraper_cached().await;

    assert!(matches!(at_once(&auth, SCRAPER), Ok(Verdict::Allowed)));
    still_fresh_just_before_another_ttl(&auth, &mut server).await;
}

#[tokio::test(start_paused = true)]
async fn a_forbidden_verdict_is_cached_too() {
    let (auth, mut server) = auth();
    let review = spawn_review(&auth, SCRAPER);
    authenticated(expect_token_review(&mut server, SCRAPER).await, SCRAPER);
    access(expect_access_review(&mut server).await, false);
    assert!(matches!(review.await.unwrap(), Ok(Verdict::Forbidden)));

    assert!(matches!(at_once(&auth, SCRAPER), Ok(Verdict::Forbidden)));
    assert_no_request(&mut server).await;
}

#[tokio::test(start_paused = true)]
async fn concurrent_callers_with_one_token_share_one_review() {
    let (auth, mut server) = auth();
    let reviews: Vec<Reviewed> = (0..3).map(|_| spawn_review(&auth, SCRAPER)).collect();
    answer_scraper(&mut server).await;
    for review in reviews {
        assert!(matches!(review.await.unwrap(), Ok(Verdict::Allowed)));
    }
    assert_no_request(&mut server).await;
}

#[tokio::test(start_paused = true)]
async fn a_stale_verdict_is_served_at_once_while_exactly_one_refresh_goes_out() {
    let (auth, mut server) = auth_with_the_scraper_cached().await;
    tokio::time::advance(VERDICT_TTL).await;

    for _ in 0..3 {
        assert!(matches!(at_once(&auth, SCRAPER), Ok(Verdict::Allowed)));
    }
    let refresh = expect_token_review(&mut server, SCRAPER).await;
    // While the refresh is under way, scrapes are still served and start no other one.
    allowed_from_the_cache(&auth, &mut server).await;
    authenticated(refresh, SCRAPER);
    access(expect_access_review(&mut server).await, true);
    assert_no_request(&mut server).await;

    // The refreshed verdict is fresh for another TTL.
    still_fresh_just_before_another_ttl(&auth, &mut server).await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_refresh_keeps_the_verdict_until_max_staleness_then_callers_wait() {
    let (auth, mut server) = auth_with_the_scraper_cached().await;
    tokio::time::advance(VERDICT_TTL).await;

    assert!(matches!(at_once(&auth, SCRAPER), Ok(Verdict::Allowed)));
    server_error(expect_token_review(&mut server, SCRAPER).await);
    assert_no_request(&mut server).await;
    tokio::time::advance(MAX_STALENESS - VERDICT_TTL - Duration::from_secs(1)).await;
    assert!(matches!(at_once(&auth, SCRAPER), Ok(Verdict::Allowed)));
    server_error(expect_token_review(&mut server, SCRAPER).await);
    assert_no_request(&mut server).await;

    // Past max staleness the verdict is not served: the caller waits for a review.
    tokio::time::advance(Duration::from_secs(1)).await;
    let review = spawn_review(&auth, SCRAPER);
    let respond = expect_token_review(&mut server, SCRAPER).await;
    assert!(!review.is_finished());
    server_error(respond);
    assert!(matches!(review.await.unwrap(), Err(ReviewError::Api(_))));

    let review = spawn_review(&auth, SCRAPER);
    answer_scraper(&mut server).await;
    assert!(matches!(review.await.unwrap(), Ok(Verdict::Allowed)));
}

#[tokio::test(start_paused = true)]
async fn a_refresh_that_says_unauthenticated_drops_the_verdict() {
    let (auth, mut server) = auth_with_the_scraper_cached().await;
    tokio::time::advance(VERDICT_TTL).await;

    assert!(matches!(at_once(&auth, SCRAPER), Ok(Verdict::Allowed)));
    unauthenticated(expect_token_review(&mut server, SCRAPER).await, SCRAPER);
    assert_no_request(&mut server).await;

    // The revoked token is reviewed again, not served.
    review_invalid(&auth, &mut server, SCRAPER).await;
}

#[tokio::test(start_paused = true)]
async fn unauthenticated_tokens_are_not_cached_and_their_reviews_are_rate_limited() {
    let (auth, mut server) = auth_with(Limits { new_token_review_burst: 2, ..Limits::default() });
    review_invalid(&auth, &mut server, "invalid-token").await;
    review_invalid(&auth, &mut server, "invalid-token").await;

    assert!(matches!(at_once(&auth, "invalid-token"), Err(ReviewError::Busy)));
    assert_no_request(&mut server).await;
}

#[tokio::test(start_paused = true)]
async fn a_review_that_takes_too_long_times_out_and_frees_its_slot() {
    let (auth, mut server) = auth_with(Limits { max_new_token_reviews_in_flight: 1, ..Limits::default() });
    let review = spawn_review(&auth, SCRAPER);
    let _unanswered = expect_token_review(&mut server, SCRAPER).await;
    tokio::time::advance(REVIEW_TIMEOUT - Duration::from_millis(1)).await;
    assert!(!review.is_finished());
    tokio::time::advance(Duration::from_millis(1)).await;
    let verdict =
        tokio::time::timeout(Duration::from_millis(1), review).await.expect("the review outlived its timeout");
    assert!(matches!(verdict.unwrap(), Err(ReviewError::Timeout)));

    cache_scraper(&auth, &mut server).await;
}

#[tokio::test(start_paused = true)]
async fn a_full_cache_forgets_the_verdict_reviewed_longest_ago() {
    let (auth, mut server) = auth_with(Limits { cache_capacity: 2, ..Limits::default() });
    for token in ["first-token", "second-token", "third-token"] {
        let review = spawn_review(&auth, token);
        authenticated(expect_token_review(&mut server, token).await, token);
        access(expect_access_review(&mut server).await, true);
        assert!(matches!(review.await.unwrap(), Ok(Verdict::Allowed)));
        tokio::time::advance(Duration::from_secs(1)).await;
    }

    assert!(matches!(at_once(&auth, "second-token"), Ok(Verdict::Allowed)));
    assert!(matches!(at_once(&auth, "third-token"), Ok(Verdict::Allowed)));
    assert_no_request(&mut server).await;
    let review = spawn_review(&auth, "first-token");
    authenticated(expect_token_review(&mut server, "first-token").await, "first-token");
    access(expect_access_review(&mut server).await, true);
    assert!(matches!(review.await.unwrap(), Ok(Verdict::Allowed)));
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_invalid_tokens_sends_at_most_a_burst_of_token_reviews_and_the_scraper_stays_allowed() {
    let (auth, server) = auth();
    let api = FakeApiServer::start(server);
    assert!(matches!(auth.review(SCRAPER).await, Ok(Verdict::Allowed)));
    tokio::time::advance(VERDICT_TTL).await;

    let (mut unauthenticated, mut busy) = (0, 0);
    for i in 0..FLOOD {
        if i % 20 == 0 {
            // Stale at first, then refreshed during the flood: allowed either way.
            assert!(matches!(at_once(&auth, SCRAPER), Ok(Verdict::Allowed)), "scrape during the flood");
        }
        match auth.review(&invalid_token(i)).await {
            Ok(Verdict::Unauthenticated) => unauthenticated += 1,
            Err(ReviewError::Busy) => busy += 1,
            other => panic!("a flooding token got {other:?}"),
        }
    }

    let burst = NEW_TOKEN_REVIEW_BURST as usize;
    assert_eq!((unauthenticated, busy), (burst, FLOOD - burst));
    assert_eq!(api.reviews_of(|token| token != SCRAPER), burst);
    assert_eq!(api.reviews_of(|token| token == SCRAPER), 2, "one review, then one refresh");
    api.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_new_token_bucket_refills_at_its_rate() {
    let (auth, server) = auth();
    let api = FakeApiServer::start(server);
    let mut tokens = (0..).map(invalid_token);
    let mut admitted = async |count: usize| {
        for _ in 0..count {
            let token = tokens.next().unwrap();
            assert!(matches!(auth.review(&token).await, Ok(Verdict::Unauthenticated)), "{token}");
        }
        let token = tokens.next().unwrap();
        assert!(matches!(auth.review(&token).await, Err(ReviewError::Busy)), "{token}");
    };

    admitted(NEW_TOKEN_REVIEW_BURST as usize).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    admitted(NEW_TOKEN_REVIEWS_PER_SECOND as usize).await;
    assert_eq!(api.reviews_of(|_| true), (NEW_TOKEN_REVIEW_BURST + NEW_TOKEN_REVIEWS_PER_SECOND) as usize);
    api.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_stale_scraper_is_allowed_at_once_and_refreshed_while_a_flood_holds_every_review_slot() {
    let (auth, mut server) = auth_with_the_scraper_cached().await;
    tokio::time::advance(VERDICT_TTL).await;
    let (flood, held) = hold_flood(&auth, &mut server).await;

    assert!(matches!(at_once(&auth, SCRAPER), Ok(Verdict::Allowed)));
    answer_scraper(&mut server).await;
    assert_no_request(&mut server).await;
    end_flood(flood, held).await;

    // Refreshed during the flood: fresh for another TTL.
    still_fresh_just_before_another_ttl(&auth, &mut server).await;
}

#[tokio::test(start_paused = true)]
async fn an_expired_scraper_is_reviewed_while_a_flood_holds_every_slot_and_the_bucket_is_empty() {
    let (auth, mut server) = auth_with_the_scraper_cached().await;
    tokio::time::advance(MAX_STALENESS).await;
    // Spend the bucket but for what the flood will take, so that it ends empty.
    let spare = NEW_TOKEN_REVIEW_BURST as usize - MAX_NEW_TOKEN_REVIEWS_IN_FLIGHT;
    for i in 0..spare {
        review_invalid(&auth, &mut server, &format!("early-invalid-token-{i}")).await;
    }
    let (flood, held) = hold_flood(&auth, &mut server).await;
    assert!(matches!(at_once(&auth, "one-more-invalid-token"), Err(ReviewError::Busy)));

    let review = spawn_review(&auth, SCRAPER);
    answer_scraper(&mut server).await;
    assert!(matches!(review.await.unwrap(), Ok(Verdict::Allowed)));
    assert_no_request(&mut server).await;
    end_flood(flood, held).await;
}

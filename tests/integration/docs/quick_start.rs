//! The README's quick start, run as written against the real server: the review it builds is
//! sent to `/validate` and `/mutate`, and the answers are the ones the README shows (the
//! mutating webhook's patch decoded from base64, as the README decodes it).

use base64::Engine;
use serde_json::Value;

use crate::support::TestServer;
use crate::support::repo::repo_file;

/// The README's quick start section.
fn quick_start() -> String {
    let readme = repo_file("README.md");
    let start = readme.find("\n## Quick start").expect("a quick start section");
    let rest = &readme[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    rest[..end].to_string()
}

/// The review the quick start writes to /tmp/review.json.
fn review(section: &str) -> Value {
    let body = section.split("<<'EOF'\n").nth(1).expect("a here-document").split("\nEOF").next().expect("its end");
    serde_json::from_str(body).expect("the review is JSON")
}

/// The `json` blocks, in order: the answers the quick start shows.
fn answers(section: &str) -> Vec<Value> {
    section
        .split("```json\n")
        .skip(1)
        .map(|block| serde_json::from_str(block.split("```").next().expect("a block")).expect("an answer is JSON"))
        .collect()
}

#[tokio::test]
async fn the_quick_start_answers_are_the_servers() {
    let section = quick_start();
    let review = review(&section);
    let shown = answers(&section);
    assert_eq!(shown.len(), 2, "the /validate answer and the /mutate patch");
    let server = TestServer::start().await;
    let post = |path: &'static str| {
        let client = server.client();
        let url = server.url(path);
        let review = review.clone();
        async move { client.post(url).json(&review).send().await.expect("answered").json::<Value>().await.expect("JSON") }
    };
    let validated = post("/validate").await;
    assert_eq!(validated, shown[0], "README's /validate answer");
    let mutated = post("/mutate").await;
    let patch = mutated["response"]["patch"].as_str().expect("a patch");
    let patch = base64::engine::general_purpose::STANDARD.decode(patch).expect("base64");
    let patch: Value = serde_json::from_slice(&patch).expect("a JSON Patch");
    assert_eq!(patch, shown[1], "README's decoded /mutate patch");
    server.stop().await;
}

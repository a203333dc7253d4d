//! The rows of the table of attacks, one each: reviews full of tiny JSON objects, a name that
//! makes every error long, connections that never speak, bodies sent a byte at a time, headers
//! that never end, ConversionReviews full of tiny JSON objects.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use serde_json::{Value, json};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::support::conversion_review;
use crate::support::fixtures::sample_v1alpha1 as sample_balancer_v1alpha1;
use crate::{
    MEASURE_CAP, PadAt, Server, after_attack, alone_and_warm, del_name_review, describe, http_get, idle_connections,
    left_out_count, mib, one_at_a_time, padded_headers, post_concurrently, require_open_files,
    review_on_fresh_connection, send_headers, status_for_headers, tally, timed, tiny_objects, tiny_objects_review,
};

// Row 1: reviews full of tiny JSON objects

/// 32 concurrent reviews (as many as the server reviews at once) whose object is
/// ~1 MB of `{"a":0}`: every one answered 200, and the server grows by at most 64 MiB.
async fn tiny_objects_row(at: PadAt) {
    const REVIEWS: usize = 32;
    const BOUND: u64 = 64 * 1024 * 1024;
    let (_alone, mut server, baseline) = alone_and_warm().await;
    let body = Bytes::from(tiny_objects_review(at));
    let started = Instant::now();
    let outcomes = post_concurrently(&server, "/validate", &body, REVIEWS, |status, answer| match status {
        200 => status.to_string(),
        _ => format!("{status} {}", String::from_utf8_lossy(&answer[..answer.len().min(100)])),
    })
    .await;
    let took = started.elapsed();
    let growth = after_attack(&mut server, "row 1", baseline);
    eprintln!(
        "hostile: row 1 ({at:?}): {REVIEWS} reviews of {} bytes: outcomes {outcomes:?} in {} ms; {growth} (bound {} MiB)",
        body.len(),
        took.as_millis(),
        BOUND >> 20
    );
    let grew = growth.bytes;
    assert_eq!(outcomes.get("200"), Some(&REVIEWS), "row 1 ({at:?}): every review must be answered 200: {outcomes:?}");
    assert!(grew <= BOUND, "row 1 ({at:?}): the server grew by {:.1} MiB, over the 64 MiB bound", mib(grew));
}

/// Wherever in the review the tiny objects are: in the spec, the metadata, the request around
/// the object, or a Kubernetes type inside the spec (an affinity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row1_tiny_objects_anywhere_cost_bounded_memory() {
    for at in [PadAt::Spec, PadAt::Metadata, PadAt::Request, PadAt::Affinity] {
        tiny_objects_row(at).await;
    }
}

// Row 2: a name that makes every error long

/// A 60,000-character DEL name with 64 backends: denied, in an answer of at most
/// 64 KiB that says how many errors it left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row2_a_huge_invalid_name_gets_a_bounded_denial() {
    const BOUND: usize = 64 * 1024;
    let (_alone, mut server, baseline) = alone_and_warm().await;
    let body = del_name_review();
    let client = server.client(Duration::from_secs(60));
    let started = Instant::now();
    let response = client
        .post(server.url("/validate"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.clone())
        .send()
        .await
        .expect("row 2: the review is answered");
    let status = response.status().as_u16();
    let answer = response.bytes().await.expect("row 2: the answer is read");
    let took = started.elapsed();
    let grew = after_attack(&mut server, "row 2", baseline).bytes;
    let parsed: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
    let allowed = parsed.pointer("/response/allowed").cloned().unwrap_or(Value::Null);
    let message = parsed.pointer("/response/status/message").and_then(Value::as_str).unwrap_or_default();
    let causes = parsed.pointer("/response/status/details/causes").and_then(Value::as_array).map_or(0, Vec::len);
    let left_out = left_out_count(message);
    eprintln!(
        "hostile: row 2: review of {} bytes: HTTP {status} in {} ms, allowed {allowed}, answer {} bytes \
         (bound {BOUND}), message {} bytes, {causes} causes, left out {left_out:?}; RSS growth {:.1} MiB",
        body.len(),
        took.as_millis(),
        answer.len(),
        message.len(),
        mib(grew)
    );
    assert_eq!(status, 200, "row 2: the review must be answered 200");
    assert!(answer.len() <= BOUND, "row 2: the answer is {} bytes, over the 64 KiB bound", answer.len());
    assert_eq!(allowed, json!(false), "row 2: the Balancer must be denied");
    assert!(
        left_out.is_some_and(|n| n > 0),
        "row 2: the message must say how many errors were left out (\"and N more\"); it ends {:?}",
        message.chars().rev().take(200).collect::<String>().chars().rev().collect::<String>()
    );
}

// Rows 3 and 4: connections that never speak

const IDLE_CONNECTIONS: usize = 1_100;

/// Opens [`IDLE_CONNECTIONS`] idle connections to `port`, then times `request` (at most
/// [`MEASURE_CAP`]) while they stay open.
async fn among_idle_connections<T>(
    port: SocketAddr,
    row: &str,
    request: impl Future<Output = T>,
) -> (Option<T>, Duration) {
    let idle = idle_connections(port, IDLE_CONNECTIONS).await;
    assert_eq!(idle.len(), IDLE_CONNECTIONS, "{row}: every idle connection must connect");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let measured = timed(MEASURE_CAP, request).await;
    drop(idle);
    measured
}

/// 1,100 idle connections to the probe port: a kubelet probe on a fresh
/// connection is still answered within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row3_idle_connections_do_not_starve_the_probe_port() {
    const BOUND: Duration = Duration::from_secs(1);
    let _serial = one_at_a_time().await;
    require_open_files(2 * IDLE_CONNECTIONS as u64 + 200);
    let mut server = Server::start().await;
    let (result, took) = among_idle_connections(server.probe, "row 3", http_get(server.probe, "/healthz")).await;
    server.assert_alive("row 3");
    eprintln!(
        "hostile: row 3: {IDLE_CONNECTIONS} idle connections to the probe port; GET /healthz: {}",
        describe(&result, took)
    );
    let line = match result {
        Some(Ok(line)) => line,
        other => panic!("row 3: GET /healthz was not answered: {}", describe(&other, took)),
    };
    assert!(line.contains(" 200 "), "row 3: /healthz answered {line:?}");
    assert!(took < BOUND, "row 3: /healthz took {} ms, over the 1 s bound", took.as_millis());
}

/// 1,100 idle connections to the webhook port: a review over a fresh TLS
/// connection is still answered within 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row4_idle_connections_do_not_starve_the_webhook_port() {
    const BOUND: Duration = Duration::from_secs(2);
    let _serial = one_at_a_time().await;
    require_open_files(2 * IDLE_CONNECTIONS as u64 + 200);
    let mut server = Server::start().await;
    let (result, took) = among_idle_connections(server.webhook, "row 4", review_on_fresh_connection(&server)).await;
    server.assert_alive("row 4");
    eprintln!(
        "hostile: row 4: {IDLE_CONNECTIONS} idle connections to the webhook port; a review: {}",
        describe(&result, took)
    );
    match result {
        Some(Ok(200)) => {}
        other => panic!("row 4: the review was not answered 200: {}", describe(&other, took)),
    }
    assert!(took < BOUND, "row 4: the review took {} ms, over the 2 s bound", took.as_millis());
}

// Row 5: bodies sent a byte at a time

/// 40 clients declare a ~100 KB review and send it a byte every 200 ms: a
/// normal review on a fresh connection is still answered within 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row5_slow_bodies_do_not_starve_reviews() {
    const CLIENTS: usize = 40;
    const BOUND: Duration = Duration::from_secs(2);
    let _serial = one_at_a_time().await;
    let mut server = Server::start().await;
    server.warm_up().await;
    let stop = Arc::new(AtomicBool::new(false));
    let started_sending = Arc::new(AtomicUsize::new(0));
    let mut tricklers = JoinSet::new();
    for _ in 0..CLIENTS {
        let stream = server.tls_connect().await.expect("row 5: a slow client connects");
        tricklers.spawn(trickle(stream, stop.clone(), started_sending.clone()));
    }
    // Bounded wait until every slow client has sent its headers.
    let deadline = Instant::now() + Duration::from_secs(10);
    while started_sending.load(Ordering::Acquire) < CLIENTS && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (result, took) = timed(MEASURE_CAP, review_on_fresh_connection(&server)).await;
    stop.store(true, Ordering::Release);
    let outcomes = tally(tricklers.join_all().await);
    server.assert_alive("row 5");
    eprintln!(
        "hostile: row 5: {CLIENTS} slow bodies ({} sending); a review: {}; slow clients: {outcomes:?}",
        started_sending.load(Ordering::Acquire),
        describe(&result, took)
    );
    match result {
        Some(Ok(200)) => {}
        other => panic!("row 5: the review was not answered 200: {}", describe(&other, took)),
    }
    assert!(took < BOUND, "row 5: the review took {} ms, over the 2 s bound", took.as_millis());
}

/// One slow client: complete headers of a ~100 KB POST /validate, then a byte of the
/// body every 200 ms until told to stop, the server cuts it off, or 40 s pass.
async fn trickle<S>(mut stream: S, stop: Arc<AtomicBool>, started: Arc<AtomicUsize>) -> String
where
    S: AsyncWrite + Unpin,
{
    let head = "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                Content-Length: 100000\r\n\r\n";
    if stream.write_all(head.as_bytes()).await.is_err() || stream.flush().await.is_err() {
        return "headers refused".into();
    }
    started.fetch_add(1, Ordering::AcqRel);
    let began = Instant::now();
    while !stop.load(Ordering::Acquire) && began.elapsed() < Duration::from_secs(40) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let wrote = async {
            stream.write_all(b" ").await?;
            stream.flush().await
        };
        if !matches!(tokio::time::timeout(Duration::from_secs(5), wrote).await, Ok(Ok(()))) {
            return format!("cut off after ~{} s", began.elapsed().as_secs());
        }
    }
    "still sending when stopped".into()
}

// Row 6: headers that never end

/// 100 plain connections to the probe port and 100 TLS connections to the webhook
/// port each send 360 KB of headers: the server grows by at most 96 MiB, and
/// headers that long are refused with `431`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row6_huge_headers_cost_bounded_memory_and_get_431() {
    const PER_PORT: usize = 100;
    const HEADER_BYTES: usize = 360 * 1024;
    const BOUND: u64 = 96 * 1024 * 1024;
    let (_alone, mut server, baseline) = alone_and_warm().await;
    let block = Arc::new(padded_headers(HEADER_BYTES));
    let mut senders = JoinSet::new();
    for _ in 0..PER_PORT {
        let tcp = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(server.probe))
            .await
            .expect("row 6: probe connect in time")
            .expect("row 6: probe connect");
        senders.spawn(send_headers(tcp, block.clone()));
        let tls = server.tls_connect().await.expect("row 6: webhook connect");
        senders.spawn(send_headers(tls, block.clone()));
    }
    let sent = senders.join_all().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let growth = after_attack(&mut server, "row 6", baseline);
    let outcomes = tally(sent.iter().map(|(_, outcome)| outcome.to_string()));
    let probe_status =
        status_for_headers(TcpStream::connect(server.probe).await.expect("connect"), block.clone()).await;
    let webhook_status = status_for_headers(server.tls_connect().await.expect("connect"), block.clone()).await;
    drop(sent);
    eprintln!(
        "hostile: row 6: {} connections x {} bytes of headers: {outcomes:?}; {growth} (bound 96 MiB); \
         complete long headers answered: probe {probe_status:?}, webhook {webhook_status:?}",
        2 * PER_PORT,
        block.len(),
    );
    let grew = growth.bytes;
    assert!(grew <= BOUND, "row 6: the server grew by {:.1} MiB, over the 96 MiB bound", mib(grew));
    for (port, status) in [("probe", &probe_status), ("webhook", &webhook_status)] {
        assert!(
            status.as_ref().is_ok_and(|line| line.starts_with("HTTP/1.1 431")),
            "row 6: {} bytes of headers to the {port} port must get a 431 status line, got {status:?}",
            block.len() + 2
        );
    }
}

// Row 7: ConversionReviews full of tiny JSON objects

/// Largest ConversionReview the server accepts by default (16 MiB): a whole list page.
const CONVERSION_BODY_LIMIT: usize = 16 * 1024 * 1024;

/// A ConversionReview just under the conversion limit: `objects` copies of the Go sample,
/// each padded in `spec.x` with `[{"a":0},…]`, to v1beta1.
fn tiny_objects_conversion(objects: usize) -> Vec<u8> {
    const MARK: &str = "@@TINY-OBJECTS@@";
    let mut object = sample_balancer_v1alpha1();
    object["spec"]["x"] = json!(MARK);
    let text = serde_json::to_string(&conversion_review("exposer.hliangzhao.io/v1beta1", vec![object; objects]))
        .expect("serialize");
    let quoted = format!("\"{MARK}\"");
    let room = (CONVERSION_BODY_LIMIT - 64 * 1024 - text.len()) / objects;
    let body = text.replace(&quoted, &tiny_objects(room));
    assert!(body.len() < CONVERSION_BODY_LIMIT, "the hostile body stays under the conversion limit");
    body.into_bytes()
}

/// 2 concurrent ConversionReviews (as many as the 32 MiB body budget holds at once) of ~16 MB
/// of `{"a":0}` (one object, and a page of 500): each is converted (200) or turned away (503 for
/// lack of body budget, 408 when the wait for it leaves too little of the body timeout, or cut
/// off while still sending), never anything else; a normal review is answered meanwhile; and
/// the server grows by at most 96 MiB. Nothing builds a tree of the tiny objects (that alone
/// would cost hundreds of MiB), and an object's text is read in place: a conversion holds its
/// body and its answer, about twice the body (measured 59 and 73 MiB for these two; 80 to
/// 140 MiB before objects were converted straight into the answer).
async fn tiny_objects_conversion_row(objects: usize) {
    const REVIEWS: usize = 2;
    const BOUND: u64 = 96 * 1024 * 1024;
    let (_alone, mut server, baseline) = alone_and_warm().await;
    let body = Bytes::from(tiny_objects_conversion(objects));
    let started = Instant::now();
    let conversions = post_concurrently(&server, "/convert", &body, REVIEWS, |status, answer| {
        if status != 200 {
            return status.to_string();
        }
        let parsed: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
        let result = parsed.pointer("/response/result/status").cloned().unwrap_or(Value::Null);
        let converted = parsed.pointer("/response/convertedObjects").and_then(Value::as_array).map_or(0, Vec::len);
        format!("200 {result} {converted} objects")
    });
    let (normal, took) = timed(MEASURE_CAP, review_on_fresh_connection(&server)).await;
    let outcomes = conversions.await;
    let elapsed = started.elapsed();
    let growth = after_attack(&mut server, "row 7", baseline);
    eprintln!(
        "hostile: row 7 ({objects} objects): {REVIEWS} conversions of {} bytes: outcomes {outcomes:?} in {} ms; \
         a review meanwhile: {}; {growth} (bound {} MiB)",
        body.len(),
        elapsed.as_millis(),
        describe(&normal, took),
        BOUND >> 20
    );
    let grew = growth.bytes;
    let converted = format!("200 \"Success\" {objects} objects");
    assert!(outcomes.contains_key(&converted), "row 7: at least one conversion must succeed: {outcomes:?}");
    assert!(
        outcomes.keys().all(|k| [converted.as_str(), "503", "408", "cut off while sending"].contains(&k.as_str())),
        "row 7: every conversion is converted or turned away: {outcomes:?}"
    );
    assert!(matches!(normal, Some(Ok(200))), "row 7: a review meanwhile: {}", describe(&normal, took));
    assert!(grew <= BOUND, "row 7: the server grew by {:.1} MiB, over the {} MiB bound", mib(grew), BOUND >> 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row7_a_conversion_of_one_huge_object_costs_bounded_memory() {
    tiny_objects_conversion_row(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row7_a_conversion_of_a_full_page_costs_bounded_memory() {
    tiny_objects_conversion_row(500).await;
}

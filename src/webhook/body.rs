//! Review bodies are read within a size limit, a time limit shorter than the API server's
//! webhook timeout, a minimum rate, and a [`Budget`] of bytes shared by every review being read
//! or answered at once, so concurrent large reviews cannot exhaust memory, and slow ones cannot
//! hold what others need.
//!
//! A body of at most [`UNPAID_BYTES`] never touches the budget: every connection may hold one
//! (1,024 connections hold 16 MiB at most). A larger one pays for its whole buffer as it
//! grows, never for the length it declares before those bytes arrive, and the buffer grows by
//! an eighth at a time ([`BodySize::next_capacity`]): what a body holds is what it sent, plus
//! at most an eighth. Its rate is judged over the last [`RATE_WINDOW`] ([`next_due`]), so a burst
//! followed by silence holds the budget for two seconds, not until the body's time limit.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::budget::{Budget, Tab};
use crate::runtime::http::error;
use crate::runtime::listener::{MinRate, Upload};

/// How large a body may be, how long it may take to arrive, and how slowly.
pub(super) struct BodyLimit {
    pub bytes: usize,
    pub time: Duration,
    /// The budget the body's bytes are paid from.
    pub budget: Arc<Budget>,
    /// How long to wait for room in the budget before answering 503.
    pub wait: Duration,
    /// A body that falls behind it gets 408 at once.
    pub min_rate: MinRate,
}

/// The largest body read without paying from the budget.
pub(super) const UNPAID_BYTES: usize = 16 * 1024;

/// Why a body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::VariantArray, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Refusal {
    /// 415: not `application/json`.
    ContentType,
    /// 413: over the size limit, declared or sent.
    TooLarge,
    /// 408: not all in within the body time.
    Timeout,
    /// 408: fell behind the minimum rate.
    TooSlow,
    /// 503: no room in the budget within the wait.
    Budget,
    /// 400: the client's stream failed (reset, bad chunking).
    Unreadable,
}

/// A body not read: why, and the answer to send.
pub(super) struct Refused {
    pub reason: Refusal,
    pub response: Response,
}

impl Refused {
    fn new(reason: Refusal, response: Response) -> Self {
        Refused { reason, response }
    }
}

/// Checks the content type and reads the body within the size, time and rate `limit`, and the
/// memory budget; the body comes with what it holds of the budget.
pub(super) async fn read_review_body<B>(request: hyper::Request<B>, limit: BodyLimit) -> Result<(Vec<u8>, Tab), Refused>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let upload = Upload::of(&request);
    let (parts, mut body) = request.into_parts();
    if !is_json(&parts.headers) {
        let response = error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "Content-Type must be application/json");
        return Err(Refused::new(Refusal::ContentType, response));
    }
    let deadline = Instant::now() + limit.time;
    let bytes = limit.bytes;
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > bytes as u64) {
        // A client waiting for `100 Continue` has sent no byte of the body yet: it gets its 413
        // at once, and the connection closes with nothing unread that could turn into a reset.
        if expects_continue(&parts.headers) {
            return Err(Refused::new(Refusal::TooLarge, closing(too_large(bytes))));
        }
        return Err(Refused::new(Refusal::TooLarge, too_large_after_draining(&mut body, bytes, deadline).await));
    }
    // The declared length sets the size of the first allocation (at most UNPAID_BYTES) and the
    // body's claim on the budget; it is paid for only as the bytes arrive.
    let declared = declared.map(|len| len as usize);
    let size = BodySize { limit: bytes, first: declared.map_or(UNPAID_BYTES, |len| len.min(UNPAID_BYTES)), declared };
    let tab = limit.budget.open(declared.unwrap_or(bytes));
    let pace = Pace { upload, min_rate: limit.min_rate, wait: limit.wait, deadline };
    match tokio::time::timeout_at(deadline, read_within(&mut body, size, tab, pace)).await {
        Err(_) => {
            let response = error(StatusCode::REQUEST_TIMEOUT, "the body was not received in time");
            Err(Refused::new(Refusal::Timeout, response))
        }
        Ok(Err(BodyError::TooLarge)) => {
            Err(Refused::new(Refusal::TooLarge, too_large_after_draining(&mut body, bytes, deadline).await))
        }
        Ok(Err(BodyError::TooSlow)) => {
            let message = format!(
                "the body is arriving too slowly: at least {} bytes a second after the first {} ms",
                limit.min_rate.bytes_per_second,
                limit.min_rate.grace.as_millis()
            );
            Err(Refused::new(Refusal::TooSlow, closing(error(StatusCode::REQUEST_TIMEOUT, &message))))
        }
        Ok(Err(BodyError::Busy)) => {
            let response = error(StatusCode::SERVICE_UNAVAILABLE, "too many reviews being read; retry");
            Err(Refused::new(Refusal::Budget, response))
        }
        Ok(Err(BodyError::Read(e))) => {
            let response = error(StatusCode::BAD_REQUEST, &format!("cannot read the body: {e}"));
            Err(Refused::new(Refusal::Unreadable, response))
        }
        Ok(Ok(read)) => Ok(read),
    }
}

/// Most bytes of an oversized body read and thrown away before its 413 is sent.
///
/// Closing a connection with unread bytes in its socket resets it, and a client still sending
/// then gets the reset instead of the 413 (nginx's lingering close exists for this). A client
/// that sends more than this past the limit, or sends it too slowly, still gets the reset.
const DRAIN_MAX_BYTES: usize = 1024 * 1024;

/// Discards the rest of `body` (at most [`DRAIN_MAX_BYTES`], until `deadline`), then the 413.
async fn too_large_after_draining<B>(body: &mut B, limit: usize, deadline: tokio::time::Instant) -> Response
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    let drain = async {
        let mut left = DRAIN_MAX_BYTES;
        while let Some(Ok(frame)) = body.frame().await {
            let Some(data) = frame.data_ref() else { continue };
            let Some(rest) = left.checked_sub(data.len()) else { return };
            left = rest;
        }
    };
    let _ = tokio::time::timeout_at(deadline, drain).await;
    too_large(limit)
}

enum BodyError {
    TooLarge,
    TooSlow,
    Busy,
    /// The client's stream failed (reset, bad chunking): its message.
    Read(String),
}

/// How large a body's buffer may and should grow.
struct BodySize {
    /// Hard limit (413 past it).
    limit: usize,
    /// First allocation.
    first: usize,
    /// The declared Content-Length: growth stops there while the body keeps to it, so a body
    /// of exactly the declared size costs exactly that much of the budget.
    declared: Option<usize>,
}

impl BodySize {
    /// The capacity to grow to when `needed` bytes do not fit: `needed` and an eighth more
    /// (at least the first allocation), within the limit and, while the body keeps to it, the
    /// declared length. Not doubled: a body that sent half its declared length and stopped
    /// would hold the whole of it. Growing by an eighth copies each byte about eight times
    /// over a body's life, well within a review's time.
    fn next_capacity(&self, needed: usize) -> usize {
        let grown = needed.saturating_add(needed / 8).max(self.first).min(self.limit);
        match self.declared {
            Some(declared) if needed <= declared => grown.min(declared),
            _ => grown,
        }
    }
}

/// How much of a recent burst counts towards a body's rate: bytes sent ahead of the rate buy
/// at most this much silence. Judged from the body's start instead, 8 MiB sent at once would
/// buy two minutes at 64 KiB a second, and with them the budget they were paid from. Two
/// seconds, not one: a TCP retransmission after a lost segment can stall a sender for a
/// second, and the API server's review must not be cut for it (the body time limit, 3 s for a
/// review, bounds the rest).
pub(super) const RATE_WINDOW: Duration = Duration::from_secs(2);

/// When a body's next bytes are due, once `received` more arrived at `now` while the next
/// ones were due at `due`: each byte buys `1 / min_rate` of time, but never beyond
/// [`RATE_WINDOW`] after `now`. `None`: no floor.
fn next_due(due: Instant, received: usize, now: Instant, min_rate: MinRate) -> Option<Instant> {
    if min_rate.bytes_per_second == 0 {
        return None;
    }
    let bought = min_rate.allowed(received as u64).saturating_sub(min_rate.grace);
    let earned = due.max(now).checked_add(bought).unwrap_or(now + RATE_WINDOW);
    Some(earned.min(now + RATE_WINDOW).max(due))
}

/// What a buffer of `capacity` bytes costs the budget: nothing up to [`UNPAID_BYTES`], then all of it.
fn cost(capacity: usize) -> usize {
    if capacity > UNPAID_BYTES { capacity } else { 0 }
}

/// How a body must keep coming: its client's minimum rate, the wait for room in the budget,
/// and the listener's view of the upload.
struct Pace {
    upload: Option<Upload>,
    min_rate: MinRate,
    wait: Duration,
    deadline: Instant,
}

/// Reads `body` into a buffer at most `size.limit` bytes long, whose capacity is paid for from
/// `tab` before it is allocated (see [`cost`]), so that what a client declares costs nothing
/// until it is sent. A body that falls behind `pace.min_rate` is cut off: the time spent
/// waiting for room in the budget is the server's, and does not count against it.
async fn read_within<B>(body: &mut B, size: BodySize, mut tab: Tab, pace: Pace) -> Result<(Vec<u8>, Tab), BodyError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let started = Instant::now();
    // When the next bytes are due: the grace first, then as [`next_due`] says.
    let mut due = started.checked_add(pace.min_rate.grace).filter(|_| pace.min_rate.bytes_per_second > 0);
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let behind = due.unwrap_or(pace.deadline).min(pace.deadline.max(started));
        let frame = match tokio::time::timeout_at(behind, body.frame()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            // At the deadline itself the caller's timeout answers 408 for the time limit.
            Err(_) if behind >= pace.deadline => std::future::pending().await,
            Err(_) => return Err(BodyError::TooSlow),
        };
        let Ok(data) = frame.map_err(|e| BodyError::Read(e.to_string()))?.into_data() else { continue };
        let needed = buffer.len() + data.len();
        if needed > size.limit {
            return Err(BodyError::TooLarge);
        }
        let mut held = Duration::ZERO;
        if needed > buffer.capacity() {
            let capacity = size.next_capacity(needed);
            let more = cost(capacity).saturating_sub(cost(buffer.capacity()));
            if more > 0 && !tab.try_pay(more) {
                let _held = pace.upload.as_ref().map(Upload::hold);
                let waiting = Instant::now();
                let wait = pace.wait.min(pace.deadline.saturating_duration_since(waiting));
                let paid = tab.pay(more, wait).await;
                held = waiting.elapsed();
                paid.map_err(|_| BodyError::Busy)?;
            }
            buffer.reserve_exact(capacity - buffer.len());
        }
        buffer.extend_from_slice(&data);
        // The time spent waiting for room is the server's: the bytes are due that much later.
        let now = Instant::now();
        due = due.and_then(|due| next_due(due.checked_add(held).unwrap_or(due), data.len(), now, pace.min_rate));
        if let Some(upload) = &pace.upload {
            upload.received(buffer.len() as u64);
        }
    }
    if let Some(upload) = &pace.upload {
        upload.complete();
    }
    Ok((buffer, tab))
}

/// Whether the client waits for `100 Continue` before it sends the body.
fn expects_continue(headers: &HeaderMap) -> bool {
    headers.get(header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// `response` with `Connection: close`, so that the connection closes after it.
fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    response
}

fn too_large(limit: usize) -> Response {
    error(StatusCode::PAYLOAD_TOO_LARGE, &format!("the body exceeds the limit of {limit} bytes"))
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1024 * 1024;

    /// A body pays for what it sent and an eighth more: half of a declared 16 MiB holds 9 MiB,
    /// not the 16 MiB a doubled buffer would.
    #[test]
    fn a_buffer_grows_by_an_eighth_within_the_declared_length_and_the_limit() {
        let declared = BodySize { limit: 16 * MIB, first: UNPAID_BYTES, declared: Some(16 * MIB) };
        assert_eq!(declared.next_capacity(8 * MIB + 1), 9 * MIB + 1);
        assert_eq!(declared.next_capacity(15 * MIB), 16 * MIB, "never past the declared length");
        assert_eq!(declared.next_capacity(100), UNPAID_BYTES, "at least the first allocation");
        let undeclared = BodySize { limit: 16 * MIB, first: UNPAID_BYTES, declared: None };
        assert_eq!(undeclared.next_capacity(15 * MIB), 16 * MIB, "never past the limit");
        let lied = BodySize { limit: 16 * MIB, first: UNPAID_BYTES, declared: Some(MIB) };
        assert_eq!(lied.next_capacity(2 * MIB), 2 * MIB + MIB / 4, "past the declared length: as undeclared");
    }

    /// Bytes ahead of the rate buy time, but at most a window of it: 8 MiB sent at once does
    /// not buy two minutes of silence.
    #[test]
    fn a_burst_buys_at_most_the_window() {
        let rate = MinRate { bytes_per_second: 64 * 1024, grace: Duration::from_secs(1) };
        let start = Instant::now();
        let due = start + rate.grace;
        assert_eq!(next_due(due, 8 * MIB, start, rate), Some(start + RATE_WINDOW), "the burst");
        let now = start + Duration::from_millis(1500);
        let steady = next_due(now + Duration::from_millis(100), 32 * 1024, now, rate);
        assert_eq!(steady, Some(now + Duration::from_millis(600)), "half a second bought, within the window");
        let slow = next_due(now, 6_554, now, rate);
        assert_eq!(slow, Some(now + Duration::from_nanos(100_006_103)), "a tenth of a second for a tenth of the rate");
        assert_eq!(next_due(due, 1, start, MinRate::NONE), None, "no floor, no due time");
    }
}

//! Review bodies are read within a size limit, a time limit shorter than the API server's
//! webhook timeout, and a budget of bytes shared by every review being read or answered at
//! once, so concurrent large reviews cannot exhaust memory.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::runtime::http::error;

/// How large a body may be, and how long it may take to arrive.
pub(super) struct BodyLimit {
    pub bytes: usize,
    pub time: Duration,
    /// The budget the body's bytes are paid from.
    pub budget: Arc<Semaphore>,
    /// How long to wait for room in the budget before answering 503.
    pub wait: Duration,
    /// Pay for the declared length at once, when the first bytes arrive, rather than as the
    /// buffer doubles. For conversions, whose budget holds only one body of the largest size:
    /// two large bodies paying as they grow could each hold half the budget and wait for the
    /// other until both get 503.
    pub whole_at_once: bool,
}

/// Checks the content type and reads the body within the size and time `limit`, and the memory budget.
pub(super) async fn read_review_body<B>(
    request: hyper::Request<B>,
    limit: BodyLimit,
) -> Result<(Vec<u8>, BodyBudget), Response>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let (parts, mut body) = request.into_parts();
    if !is_json(&parts.headers) {
        return Err(error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "Content-Type must be application/json"));
    }
    let deadline = tokio::time::Instant::now() + limit.time;
    let pool = limit.budget;
    let limit_whole = limit.whole_at_once;
    let wait = limit.wait;
    let limit = limit.bytes;
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        // A client waiting for `100 Continue` has sent no byte of the body yet: it gets its 413
        // at once, and the connection closes with nothing unread that could turn into a reset.
        if expects_continue(&parts.headers) {
            return Err(closing(too_large(limit)));
        }
        return Err(too_large_after_draining(&mut body, limit, deadline).await);
    }
    let budget = BodyBudget { pool, held: None, wait };
    // The declared length sets the size of the first allocation (at most FIRST_ALLOCATION_MAX,
    // unless the whole body is paid at once). It is still paid for only when the first bytes
    // arrive.
    let declared = declared.map(|len| len as usize);
    let first = match (declared, limit_whole) {
        (Some(len), true) => len,
        (Some(len), false) => len.min(FIRST_ALLOCATION_MAX),
        (None, _) => FIRST_ALLOCATION_MAX,
    };
    let size = BodySize { limit, first, declared };
    match tokio::time::timeout_at(deadline, read_within(&mut body, size, budget)).await {
        Err(_) => Err(error(StatusCode::REQUEST_TIMEOUT, "the body was not received in time")),
        Ok(Err(BodyError::TooLarge)) => Err(too_large_after_draining(&mut body, limit, deadline).await),
        Ok(Err(BodyError::Busy)) => Err(error(StatusCode::SERVICE_UNAVAILABLE, "too many reviews being read; retry")),
        Ok(Err(BodyError::Read(e))) => Err(error(StatusCode::BAD_REQUEST, &format!("cannot read the body: {e}"))),
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
    Busy,
    /// The client's stream failed (reset, bad chunking): its message.
    Read(String),
}

/// Bytes of the shared body budget held by one review, returned when dropped.
pub(super) struct BodyBudget {
    pool: Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
    wait: Duration,
}

impl BodyBudget {
    /// Takes `bytes` more from the budget, waiting at most `wait` for them (no timer when
    /// there is room, the usual case).
    async fn grow(&mut self, bytes: usize) -> Result<(), BodyError> {
        let Ok(bytes) = u32::try_from(bytes) else { return Err(BodyError::TooLarge) };
        let permit = match self.pool.clone().try_acquire_many_owned(bytes) {
            Ok(permit) => permit,
            Err(_) => match tokio::time::timeout(self.wait, self.pool.clone().acquire_many_owned(bytes)).await {
                Ok(Ok(permit)) => permit,
                _ => return Err(BodyError::Busy),
            },
        };
        match &mut self.held {
            Some(held) => held.merge(permit),
            None => self.held = Some(permit),
        }
        Ok(())
    }
}

/// Largest first allocation for a body: a client's declared length alone cannot reserve more.
const FIRST_ALLOCATION_MAX: usize = 64 * 1024;

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
    /// The capacity to grow to when `needed` bytes do not fit in `current`.
    fn next_capacity(&self, current: usize, needed: usize) -> usize {
        let doubled = needed.max(current.saturating_mul(2)).max(self.first).min(self.limit);
        match self.declared {
            Some(declared) if needed <= declared => doubled.min(declared),
            _ => doubled,
        }
    }
}

/// Reads `body` into a buffer at most `size.limit` bytes long, whose capacity is paid for from
/// `budget` before it is allocated, so that what a client declares costs nothing until it is sent.
async fn read_within<B>(
    body: &mut B,
    size: BodySize,
    mut budget: BodyBudget,
) -> Result<(Vec<u8>, BodyBudget), BodyError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|e| BodyError::Read(e.to_string()))?.into_data() else { continue };
        let needed = buffer.len() + data.len();
        if needed > size.limit {
            return Err(BodyError::TooLarge);
        }
        if needed > buffer.capacity() {
            let capacity = size.next_capacity(buffer.capacity(), needed);
            budget.grow(capacity - buffer.capacity()).await?;
            buffer.reserve_exact(capacity - buffer.len());
        }
        buffer.extend_from_slice(&data);
    }
    Ok((buffer, budget))
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

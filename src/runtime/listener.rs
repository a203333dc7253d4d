//! Serving HTTP/1.1 (over TLS or plain) on a listener that bounds every cost a client controls.
//!
//! - A new connection must send its first byte within [`ConnectionLimits::first_byte_timeout`]
//!   and finish the TLS handshake within [`ConnectionLimits::handshake_timeout`].
//! - Request headers are bounded in time (which also ends idle keep-alive connections) and
//!   in size (431 past [`ConnectionLimits::max_header_bytes`]); hyper's read buffer is bounded too.
//! - A client that stops reading its answer is dropped after [`ConnectionLimits::write_timeout`].
//! - At [`ConnectionLimits::max_connections`], a new client closes another connection rather
//!   than being refused ([`victim`]): first one silent for a second without a request, then an
//!   upload that has fallen behind [`ConnectionLimits::slow_upload`], then one in its TLS
//!   handshake or newer, then the one idle longest between requests (as nginx does), and last
//!   the slowest other upload. So neither idle sockets nor
//!   slow uploads can lock out the API server or the kubelet; only when every connection is
//!   being answered, or has just begun its upload, is the new one refused.
//! - The handler that reads a request's body reports its progress through the request's
//!   [`Upload`], so that a slow upload is told from one going well, and a body the server holds
//!   back (waiting for room in a budget) is not counted against its client.
//! - Once [`ServeOptions::draining`] starts, every answer says `Connection: close`, so clients
//!   empty their keep-alive pools of this server before it stops: closing an idle connection
//!   races a client's next request on it, which Go does not retry for a POST.
//! - The webhook's connections are served by [`Workers`]: one thread per core, each with its own
//!   single-threaded runtime, as nginx's worker processes; the probe listener stays on the main
//!   runtime, so a flood of webhook traffic never delays the kubelet's probes.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::HeaderValue;
use axum::http::header::CONNECTION;
use axum::response::Response;
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// What one listener allows each client.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Connections open at once; at the limit another one is closed for a new one ([`victim`]).
    pub max_connections: usize,
    /// Time a new connection has to send its first byte.
    pub first_byte_timeout: Duration,
    /// Time allowed to complete the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time allowed to send complete request headers; also how long an idle keep-alive connection lives.
    pub header_timeout: Duration,
    /// Largest request head (request line and headers); larger gets 431.
    pub max_header_bytes: usize,
    /// Time allowed for each write of a response; a client that stops reading is dropped.
    pub write_timeout: Duration,
    /// Time in-flight requests get to finish on shutdown.
    pub shutdown_grace: Duration,
    /// An upload behind this rate is among the first connections closed for a newcomer.
    pub slow_upload: MinRate,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 1024,
            first_byte_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            // Longer than the API server's 90 s idle keep-alive: a server closing first races a
            // POST, which Go does not retry ("failed calling webhook: EOF"). An idle connection
            // still makes room for a newcomer at the connection limit.
            header_timeout: Duration::from_secs(120),
            max_header_bytes: 16 * 1024,
            write_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(20),
            slow_upload: MinRate::SLOW_UPLOAD,
        }
    }
}

/// A floor under how fast a client sends a body: once `grace` has passed, at least
/// `bytes_per_second`. The listener ranks uploads by their average since the grace
/// ([`MinRate::behind`]); the webhook's body reader judges the rate over a recent window
/// instead, so that a burst cannot buy a long silence. Zero is no floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinRate {
    /// The rate owed once the grace has passed.
    pub bytes_per_second: u64,
    /// How long an upload owes nothing.
    pub grace: Duration,
}

impl MinRate {
    /// 64 KiB a second after a quarter of a second: an upload the listener counts as slow.
    pub const SLOW_UPLOAD: MinRate = MinRate { bytes_per_second: 64 * 1024, grace: Duration::from_millis(250) };

    /// No floor at all.
    pub const NONE: MinRate = MinRate { bytes_per_second: 0, grace: Duration::ZERO };

    /// The longest an upload may have taken to send `received` bytes and still keep to the rate.
    pub fn allowed(&self, received: u64) -> Duration {
        if self.bytes_per_second == 0 {
            return Duration::MAX;
        }
        let rate = self.bytes_per_second;
        let nanos = u128::from(received % rate) * 1_000_000_000 / u128::from(rate);
        // Below a second: the remainder is less than the rate.
        let sending = Duration::new(received / rate, u32::try_from(nanos).unwrap_or(999_999_999));
        self.grace.saturating_add(sending)
    }

    /// Whether an upload that has sent `received` bytes in `elapsed` has fallen behind.
    pub fn behind(&self, received: u64, elapsed: Duration) -> bool {
        elapsed > self.allowed(received)
    }
}

/// hyper's read buffer: a request head must fit, and body chunks are read through it.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// What answers the requests of one listener: an axum [`Router`], or a service that routes its
/// hot paths itself (the webhook server does).
pub trait Serve: Clone + Send + Sync + 'static {
    /// Answers one request. The future owns what it needs, because hyper keeps it beyond the
    /// borrow of `&self`.
    fn call(&self, request: hyper::Request<Incoming>) -> impl Future<Output = Response> + Send + 'static + use<Self>;
}

impl Serve for Router {
    fn call(&self, request: hyper::Request<Incoming>) -> impl Future<Output = Response> + Send + 'static + use<> {
        let response = self.clone().oneshot(request);
        async move {
            match response.await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }
    }
}

/// Threads that serve a listener's connections, each running its own single-threaded tokio
/// runtime, like nginx's worker processes.
///
/// A connection stays on one thread from accept to close: serving a request never wakes
/// another thread or moves a task between cores, which on a busy machine (the API server's
/// node) costs both throughput and tail latency (measured in the README's performance
/// section). A new connection goes to the worker serving the fewest.
pub struct Workers {
    workers: Vec<Worker>,
    /// Ends the threads (and drops what they still hold) once the listener has drained.
    stop: CancellationToken,
}

struct Worker {
    runtime: tokio::runtime::Handle,
    /// Connections this worker serves now.
    connections: Arc<AtomicUsize>,
}

impl Workers {
    /// Starts `count` worker threads (at least one), named `{name}-{i}`.
    pub fn start(count: usize, name: &str) -> std::io::Result<Workers> {
        let mut workers = Workers { workers: Vec::with_capacity(count.max(1)), stop: CancellationToken::new() };
        for i in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let handle = runtime.handle().clone();
            let stop = workers.stop.clone();
            // On an error the threads already started stop when `workers` is dropped.
            std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                runtime.block_on(stop.cancelled());
            })?;
            workers.workers.push(Worker { runtime: handle, connections: Arc::default() });
        }
        Ok(workers)
    }

    /// One worker per core, as nginx's `worker_processes auto`.
    pub fn per_core(name: &str) -> std::io::Result<Workers> {
        Workers::start(std::thread::available_parallelism().map_or(1, usize::from), name)
    }

    /// Moves `tcp` to the least busy worker's runtime and serves it there with `serve`.
    fn spawn<F, Fut>(&self, tcp: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(worker) = self.workers.iter().min_by_key(|w| w.connections.load(Ordering::Relaxed)) else { return };
        // Leaves the accepting runtime's reactor; registered again with the worker's.
        let tcp = match tcp.into_std() {
            Ok(tcp) => tcp,
            Err(e) => return tracing::debug!(error = %e, "cannot hand a connection to a worker"),
        };
        let connections = worker.connections.clone();
        connections.fetch_add(1, Ordering::Relaxed);
        worker.runtime.spawn(async move {
            let _counted = Counted(connections);
            match TcpStream::from_std(tcp) {
                Ok(tcp) => serve(tcp).await,
                Err(e) => tracing::debug!(error = %e, "a worker cannot take a connection"),
            }
        });
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One connection counted against a worker while it lives.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a listener serves its connections.
pub struct ServeOptions {
    /// Over TLS with this configuration, else plain HTTP.
    pub tls: Option<Arc<ServerConfig>>,
    /// The bounds on connections.
    pub limits: ConnectionLimits,
    /// On these threads, else on the caller's runtime.
    pub workers: Option<Workers>,
    /// Once cancelled, each connection closes after its next answer.
    pub draining: CancellationToken,
    /// Where connections closed for newcomers, and newcomers refused, are counted.
    pub metrics: Option<ConnectionMetrics>,
}

impl ServeOptions {
    /// Within `limits`: plain HTTP on the caller's runtime, unless [`Self::tls`] and [`Self::on`]
    /// say otherwise.
    pub fn new(limits: ConnectionLimits) -> Self {
        ServeOptions { tls: None, limits, workers: None, draining: CancellationToken::new(), metrics: None }
    }

    /// Over TLS with `config`.
    pub fn tls(self, config: Arc<ServerConfig>) -> Self {
        ServeOptions { tls: Some(config), ..self }
    }

    /// On `workers`' threads.
    pub fn on(self, workers: Workers) -> Self {
        ServeOptions { workers: Some(workers), ..self }
    }

    /// Closing each connection after its next answer once `draining` is cancelled (the
    /// shutdown delay, while endpoints drop this replica), so that no client is left holding
    /// an idle connection for the shutdown to close under its next request.
    pub fn draining(self, draining: CancellationToken) -> Self {
        ServeOptions { draining, ..self }
    }

    /// Counting connections closed for newcomers, and newcomers refused, in `metrics`.
    pub fn counted(self, metrics: ConnectionMetrics) -> Self {
        ServeOptions { metrics: Some(metrics), ..self }
    }
}

/// Serves `service` on `listener` until `shutdown`, as `options` say; then lets in-flight
/// requests finish within the grace period.
pub async fn serve<S: Serve>(listener: TcpListener, service: S, options: ServeOptions, shutdown: CancellationToken) {
    let ServeOptions { tls, limits, workers, draining, metrics } = options;
    let acceptor = tls.map(TlsAcceptor::from);
    let graceful = GracefulShutdown::new();
    let open = Arc::new(OpenConnections::new(limits.max_connections, limits.slow_upload));
    let limits = Arc::new(limits);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Usually EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let connection = match open.admit() {
            Ok((connection, evicted)) => {
                if let (Some(metrics), Some(reason)) = (&metrics, evicted) {
                    metrics.evicted(reason);
                }
                connection
            }
            Err(Full) => {
                tracing::debug!(%peer, "every connection is being answered or has just begun: refusing a new one");
                if let Some(metrics) = &metrics {
                    metrics.refusals.inc();
                }
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let watcher = graceful.watcher();
        let open = open.clone();
        let task = Connection {
            peer,
            acceptor: acceptor.clone(),
            service: service.clone(),
            limits: limits.clone(),
            draining: draining.clone(),
            shutdown: shutdown.clone(),
        };
        let serve = move |tcp: TcpStream| async move {
            tokio::select! {
                _ = connection.evicted.cancelled() => tracing::debug!(%peer, "closed to make room for a newcomer"),
                _ = task.serve(tcp, connection.clone(), watcher) => {}
            }
            open.remove(connection.id);
        };
        match &workers {
            Some(workers) => workers.spawn(tcp, serve),
            None => drop(tokio::spawn(serve(tcp))),
        }
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("in-flight requests did not finish within the grace period");
    }
}

/// One accepted client and what serving it needs.
struct Connection<S> {
    peer: SocketAddr,
    acceptor: Option<TlsAcceptor>,
    service: S,
    limits: Arc<ConnectionLimits>,
    /// Once cancelled, answers say `Connection: close`.
    draining: CancellationToken,
    /// Ends a connection still waiting for its first byte or handshake; serving ones drain.
    shutdown: CancellationToken,
}

impl<S: Serve> Connection<S> {
    async fn serve(self, tcp: TcpStream, state: Arc<ConnectionState>, watcher: hyper_util::server::graceful::Watcher) {
        let Connection { peer, acceptor, service, limits, draining, shutdown } = self;
        let first_byte = tokio::select! {
            _ = shutdown.cancelled() => return,
            first_byte = tokio::time::timeout(limits.first_byte_timeout, tcp.readable()) => first_byte,
        };
        if first_byte.is_err() {
            return tracing::debug!(%peer, "no first byte in time");
        }
        let phases = state.clone();
        if acceptor.is_some() {
            phases.enter(HANDSHAKING);
        }
        // A client that stops reading its response must not hold the connection forever.
        let mut io = TimeoutStream::new(tcp);
        io.set_write_timeout(Some(limits.write_timeout));
        let io = Box::pin(io);
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            let busy = state.request_started(request.body().is_end_stream());
            request.extensions_mut().insert(Upload(state.clone()));
            let response = service.call(request);
            let draining = draining.clone();
            let answering = state.clone();
            async move {
                let mut response = response.await;
                // Whether or not the handler read the body, it is done with the client's part.
                answering.set(ANSWERING);
                if draining.is_cancelled() {
                    response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
                }
                Ok::<_, Infallible>(response.map(|body| BusyBody { body, _busy: busy }))
            }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_header_size(limits.max_header_bytes)
            .max_buf_size(READ_BUFFER_BYTES.max(limits.max_header_bytes))
            .keep_alive(true);
        let result = match acceptor {
            None => watcher.watch(builder.serve_connection(TokioIo::new(io), service)).await,
            Some(acceptor) => {
                let handshake = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    handshake = tokio::time::timeout(limits.handshake_timeout, acceptor.accept(io)) => handshake,
                };
                match handshake {
                    Ok(Ok(stream)) => {
                        phases.enter(FRESH);
                        watcher.watch(builder.serve_connection(TokioIo::new(stream), service)).await
                    }
                    Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
                }
            }
        };
        if let Err(e) = result {
            tracing::debug!(%peer, error = %e, "connection ended with an error");
        }
    }
}

/// An answer's body that keeps its connection busy until hyper has written it (or dropped it),
/// so a connection is never closed for a newcomer in the middle of an answer.
struct BusyBody {
    body: axum::body::Body,
    _busy: BusyGuard,
}

impl hyper::body::Body for BusyBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Where a connection stands (the phase of [`ConnectionState`]).
const FRESH: u8 = 0;
const IDLE: u8 = 1;
const UPLOADING: u8 = 2;
const ANSWERING: u8 = 3;
const HANDSHAKING: u8 = 4;

/// One open connection as the listener sees it.
struct ConnectionState {
    id: u64,
    epoch: Instant,
    /// [`FRESH`] until its first request (but [`HANDSHAKING`] during its TLS handshake), then
    /// [`UPLOADING`] while a request's body arrives, [`ANSWERING`] until the answer is written
    /// (or while the server holds the body back), [`IDLE`] between requests.
    phase: AtomicU8,
    /// Nanoseconds after the epoch at which the phase began; an upload's start moves later by
    /// the time the server held it back, which is not its client's doing.
    since: AtomicU64,
    /// Body bytes the current upload has received.
    received: AtomicU64,
    /// Cancelled to close the connection for a newcomer.
    evicted: CancellationToken,
}

impl ConnectionState {
    fn now(&self) -> u64 {
        nanos_since(self.epoch)
    }

    fn set(&self, phase: u8) {
        self.phase.store(phase, Ordering::Relaxed);
    }

    /// Enters `phase` now.
    fn enter(&self, phase: u8) {
        self.since.store(self.now(), Ordering::Relaxed);
        self.set(phase);
    }

    /// Marks a request in progress (uploading, or answering one without a body) until the
    /// guard is dropped.
    fn request_started(self: &Arc<Self>, without_body: bool) -> BusyGuard {
        self.received.store(0, Ordering::Relaxed);
        self.since.store(self.now(), Ordering::Relaxed);
        self.set(if without_body { ANSWERING } else { UPLOADING });
        BusyGuard(self.clone())
    }

    /// How the choice of whom to close for a newcomer sees this connection at `now`.
    fn standing(&self, now: u64) -> Standing {
        let since = self.since.load(Ordering::Relaxed);
        let age = Duration::from_nanos(now.saturating_sub(since));
        match self.phase.load(Ordering::Relaxed) {
            FRESH => Standing::Fresh { age, handshaking: false },
            HANDSHAKING => Standing::Fresh { age, handshaking: true },
            IDLE => Standing::Idle { age },
            UPLOADING => Standing::Uploading { age, received: self.received.load(Ordering::Relaxed) },
            _ => Standing::Answering,
        }
    }
}

fn nanos_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

struct BusyGuard(Arc<ConnectionState>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.since.store(self.0.now(), Ordering::Relaxed);
        self.0.set(IDLE);
    }
}

/// The upload of one request's body: the listener puts it in the request's extensions, and
/// the handler that reads the body reports what has arrived.
#[derive(Clone)]
pub struct Upload(Arc<ConnectionState>);

impl Upload {
    /// The request's upload, when a [`serve`]d connection carries it.
    pub fn of<B>(request: &hyper::Request<B>) -> Option<Upload> {
        request.extensions().get::<Upload>().cloned()
    }

    /// `bytes` of the body have arrived so far.
    pub fn received(&self, bytes: u64) {
        self.0.received.store(bytes, Ordering::Relaxed);
    }

    /// The whole body is in: from now on the request is being answered.
    pub fn complete(&self) {
        self.0.set(ANSWERING);
    }

    /// The server holds the body back until the guard is dropped (it waits for room in a
    /// budget): meanwhile the upload is not closed for a newcomer, and the time held is not
    /// counted against its client's rate.
    pub fn hold(&self) -> Held<'_> {
        self.0.set(ANSWERING);
        Held { upload: self, from: self.0.now() }
    }
}

/// An upload held back by the server (see [`Upload::hold`]).
pub struct Held<'a> {
    upload: &'a Upload,
    from: u64,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let state = &self.upload.0;
        let held = state.now().saturating_sub(self.from);
        state.since.fetch_add(held, Ordering::Relaxed);
        state.set(UPLOADING);
    }
}

/// A connection as the choice of whom to close for a newcomer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// No request yet: in its TLS handshake for `age`, or else silent for `age` (since it
    /// connected, or since its handshake ended).
    Fresh { age: Duration, handshaking: bool },
    /// Between requests, having answered one, for `age`.
    Idle { age: Duration },
    /// A request whose body has been arriving for `age` (time held back by the server left
    /// out), `received` bytes of it so far.
    Uploading { age: Duration, received: u64 },
    /// A request being answered, or held back by the server: never closed for a newcomer.
    Answering,
}

/// Why a connection was closed for a newcomer; in the order they are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Eviction {
    /// Silent for [`NEW_CONNECTION_GRACE`] or more without a request (since it connected, or
    /// since its TLS handshake ended): the longest-silent first.
    Unused,
    /// Its upload fell behind [`ConnectionLimits::slow_upload`]: the slowest first.
    SlowUpload,
    /// Without a request yet, but in its TLS handshake (which its own timeout bounds), or
    /// silent for less than [`NEW_CONNECTION_GRACE`]: the longest in that state first.
    New,
    /// Idle between requests: the longest-idle first.
    Idle,
    /// Its upload keeps to the rate, but every other connection is busier: the slowest first.
    Upload,
}

/// How long a new connection may stay silent (before its handshake, or between its handshake
/// and its first request) before it counts as unused. A client in its handshake is closed only
/// after the unused ones and the slow uploads: under a flood of connections, the API server's
/// handshake may take a while.
pub const NEW_CONNECTION_GRACE: Duration = Duration::from_secs(1);

impl Eviction {
    const ALL: [Eviction; 5] =
        [Eviction::Unused, Eviction::SlowUpload, Eviction::New, Eviction::Idle, Eviction::Upload];

    /// The reason as the metrics' label says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Eviction::Unused => "unused",
            Eviction::SlowUpload => "slow_upload",
            Eviction::New => "new",
            Eviction::Idle => "idle",
            Eviction::Upload => "upload",
        }
    }
}

/// Where a connection comes in the order of closing for a newcomer (the lower the sooner), or
/// `None` when it is never closed for one: answering, or an upload still in `slow`'s grace.
fn rank(standing: Standing, slow: MinRate) -> Option<(Eviction, u64)> {
    let longest_first = |age: Duration| u64::MAX - u64::try_from(age.as_micros()).unwrap_or(u64::MAX);
    match standing {
        Standing::Fresh { age, handshaking: false } if age >= NEW_CONNECTION_GRACE => {
            Some((Eviction::Unused, longest_first(age)))
        }
        Standing::Fresh { age, .. } => Some((Eviction::New, longest_first(age))),
        Standing::Idle { age } => Some((Eviction::Idle, longest_first(age))),
        Standing::Answering => None,
        Standing::Uploading { age, .. } if age <= slow.grace => None,
        Standing::Uploading { age, received } => {
            let millis = u64::try_from(age.as_millis()).unwrap_or(u64::MAX).max(1);
            let bytes_per_second = received.saturating_mul(1000) / millis;
            let why = if slow.behind(received, age) { Eviction::SlowUpload } else { Eviction::Upload };
            Some((why, bytes_per_second))
        }
    }
}

/// The connection to close for a newcomer, and why; `None` when none may be closed.
fn victim(connections: impl IntoIterator<Item = (u64, Standing)>, slow: MinRate) -> Option<(u64, Eviction)> {
    connections
        .into_iter()
        .filter_map(|(id, standing)| rank(standing, slow).map(|(why, order)| ((why, order, id), why)))
        .min_by_key(|(key, _)| *key)
        .map(|((_, _, id), why)| (id, why))
}

/// Every connection is being answered or has just begun: the newcomer is refused.
#[derive(Debug)]
struct Full;

/// The open connections of one listener.
struct OpenConnections {
    max: usize,
    slow: MinRate,
    epoch: Instant,
    next_id: AtomicU64,
    all: Mutex<HashMap<u64, Arc<ConnectionState>>>,
}

impl OpenConnections {
    fn new(max: usize, slow: MinRate) -> Self {
        OpenConnections {
            max: max.max(1),
            slow,
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            all: Mutex::default(),
        }
    }

    /// Registers a new connection, closing another when at the limit ([`victim`]), and says
    /// which kind it closed.
    fn admit(&self) -> Result<(Arc<ConnectionState>, Option<Eviction>), Full> {
        let mut all = self.all.lock().unwrap_or_else(|e| e.into_inner());
        let now = nanos_since(self.epoch);
        let mut evicted = None;
        if all.len() >= self.max {
            let (id, why) = victim(all.values().map(|c| (c.id, c.standing(now))), self.slow).ok_or(Full)?;
            if let Some(closed) = all.remove(&id) {
                closed.evicted.cancel();
            }
            evicted = Some(why);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnectionState {
            id,
            epoch: self.epoch,
            phase: AtomicU8::new(FRESH),
            since: AtomicU64::new(now),
            received: AtomicU64::new(0),
            evicted: CancellationToken::new(),
        });
        all.insert(id, state.clone());
        Ok((state, evicted))
    }

    fn remove(&self, id: u64) {
        self.all.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabels {
    reason: Eviction,
}

impl EncodeLabelValue for Eviction {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        self.as_str().encode(encoder)
    }
}

/// Connections a listener closed for newcomers, by [`Eviction`], and newcomers it refused.
#[derive(Clone)]
pub struct ConnectionMetrics {
    /// By [`Eviction`], in declaration order.
    evictions: [Counter; 5],
    refusals: Counter,
}

impl ConnectionMetrics {
    /// Registers `{listener}_connection_evictions` and `{listener}_connection_refusals`, every
    /// series at zero.
    pub fn register(registry: &mut Registry, listener: &str) -> Self {
        let evictions = Family::<EvictionLabels, Counter>::default();
        let refusals = Counter::default();
        registry.register(
            format!("{listener}_connection_evictions"),
            format!("Connections to the {listener} port closed to make room for a new one, by reason"),
            evictions.clone(),
        );
        registry.register(
            format!("{listener}_connection_refusals"),
            format!(
                "New connections to the {listener} port refused because every open one was being answered or had just begun"
            ),
            refusals.clone(),
        );
        let evictions = Eviction::ALL.map(|reason| evictions.get_or_create(&EvictionLabels { reason }).clone());
        ConnectionMetrics { evictions, refusals }
    }

    fn evicted(&self, reason: Eviction) {
        self.evictions[reason as usize].inc();
    }
}

/// Binds a TCP listener, naming the address on failure.
pub async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, std::io::Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen for {what} on {addr}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOW: MinRate = MinRate { bytes_per_second: 1000, grace: Duration::from_secs(1) };

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_rate_allows_its_grace_then_a_second_per_rate_of_bytes() {
        assert_eq!(SLOW.allowed(0), secs(1.0));
        assert_eq!(SLOW.allowed(1500), secs(2.5));
        assert!(!SLOW.behind(1500, secs(2.5)));
        assert!(SLOW.behind(1500, secs(2.6)));
        assert!(!SLOW.behind(0, secs(1.0)), "nothing is owed within the grace");
        assert_eq!(MinRate::NONE.allowed(0), Duration::MAX);
        assert!(!MinRate::NONE.behind(0, Duration::from_secs(86_400)));
        assert!(MinRate { bytes_per_second: 1, grace: Duration::MAX }.allowed(u64::MAX) == Duration::MAX);
    }

    #[test]
    fn never_answering_connections_nor_uploads_in_their_grace() {
        assert_eq!(rank(Standing::Answering, SLOW), None);
        assert_eq!(rank(Standing::Uploading { age: secs(0.5), received: 0 }, SLOW), None);
        assert_eq!(
            victim([(1, Standing::Answering), (2, Standing::Uploading { age: secs(1.0), received: 0 })], SLOW),
            None
        );
    }

    #[test]
    fn unused_connections_go_first_then_slow_uploads_then_idle_ones_then_the_slowest_upload() {
        let unused = (1, Standing::Fresh { age: secs(1.5), handshaking: false });
        let slow = (2, Standing::Uploading { age: secs(5.0), received: 10 });
        let new = (3, Standing::Fresh { age: secs(0.9), handshaking: false });
        let idle = (4, Standing::Idle { age: secs(60.0) });
        let keeping_up = (5, Standing::Uploading { age: secs(5.0), received: 1_000_000 });
        let mut open = vec![keeping_up, idle, new, slow, unused, (6, Standing::Answering)];
        for expected in [
            (1, Eviction::Unused),
            (2, Eviction::SlowUpload),
            (3, Eviction::New),
            (4, Eviction::Idle),
            (5, Eviction::Upload),
        ] {
            assert_eq!(victim(open.clone(), SLOW), Some(expected));
            open.retain(|(id, _)| *id != expected.0);
        }
        assert_eq!(victim(open, SLOW), None);
    }

    #[test]
    fn within_a_kind_the_longest_open_or_idle_and_the_slowest_go_first() {
        let silent = |age| Standing::Fresh { age: secs(age), handshaking: false };
        assert_eq!(victim([(1, silent(1.0)), (2, silent(3.0))], SLOW), Some((2, Eviction::Unused)));
        assert_eq!(victim([(1, silent(0.2)), (2, silent(0.1))], SLOW), Some((1, Eviction::New)));
        let handshaking = (3, Standing::Fresh { age: secs(2.0), handshaking: true });
        assert_eq!(
            victim([(1, silent(0.2)), handshaking], SLOW),
            Some((3, Eviction::New)),
            "a handshake, however long, is never unused; the longest goes first among the new"
        );
        assert_eq!(
            victim([(1, silent(1.2)), handshaking], SLOW),
            Some((1, Eviction::Unused)),
            "a silent connection goes before a handshake"
        );
        let idle = [(1, Standing::Idle { age: secs(3.0) }), (2, Standing::Idle { age: secs(1.0) })];
        assert_eq!(victim(idle, SLOW), Some((1, Eviction::Idle)));
        let slow = [
            (1, Standing::Uploading { age: secs(4.0), received: 400 }),
            (2, Standing::Uploading { age: secs(2.0), received: 100 }),
        ];
        assert_eq!(victim(slow, SLOW), Some((2, Eviction::SlowUpload)), "50 B/s before 100 B/s");
        let fast = [
            (1, Standing::Uploading { age: secs(2.0), received: 1_000_000 }),
            (2, Standing::Uploading { age: secs(2.0), received: 9_000 }),
        ];
        assert_eq!(victim(fast, SLOW), Some((2, Eviction::Upload)));
    }

    #[test]
    fn at_the_limit_the_longest_idle_connection_makes_room() {
        let open = OpenConnections::new(2, SLOW);
        let first = open.admit().expect("room").0;
        drop(first.request_started(true));
        std::thread::sleep(Duration::from_millis(2));
        let second = open.admit().expect("room").0;
        drop(second.request_started(true));
        let (third, evicted) = open.admit().expect("the first, idle longest, makes room");
        assert_eq!(evicted, Some(Eviction::Idle));
        assert!(first.evicted.is_cancelled());
        assert!(!second.evicted.is_cancelled() && !third.evicted.is_cancelled());
    }

    #[test]
    fn answered_connections_are_never_closed_for_a_newcomer() {
        let open = OpenConnections::new(2, SLOW);
        let first = open.admit().expect("room").0;
        let second = open.admit().expect("room").0;
        let _busy_first = first.request_started(true);
        let _busy_second = second.request_started(false);
        Upload(second.clone()).complete();
        assert!(open.admit().is_err(), "every connection is being answered");
        assert!(!first.evicted.is_cancelled() && !second.evicted.is_cancelled());
    }

    #[test]
    fn a_slow_upload_makes_room_once_past_its_grace_but_not_while_held() {
        let quick = MinRate { bytes_per_second: 1_000_000, grace: Duration::from_millis(5) };
        let open = OpenConnections::new(1, quick);
        let only = open.admit().expect("room").0;
        let _busy = only.request_started(false);
        let upload = Upload(only.clone());
        upload.received(10);
        {
            let _held = upload.hold();
            std::thread::sleep(Duration::from_millis(20));
            assert!(open.admit().is_err(), "held back by the server: not its client's fault");
        }
        assert!(open.admit().is_err(), "the time held is not counted: still in its grace");
        std::thread::sleep(Duration::from_millis(20));
        let (_, evicted) = open.admit().expect("a slow upload makes room");
        assert_eq!(evicted, Some(Eviction::SlowUpload));
        assert!(only.evicted.is_cancelled());
    }

    #[test]
    fn a_finished_request_makes_its_connection_idle_again() {
        let open = OpenConnections::new(1, SLOW);
        let only = open.admit().expect("room").0;
        drop(only.request_started(false));
        assert_eq!(open.admit().expect("room").1, Some(Eviction::Idle));
        assert!(only.evicted.is_cancelled());
    }
}

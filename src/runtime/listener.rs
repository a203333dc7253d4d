//! Serving HTTP/1.1 (over TLS or plain) on a listener that bounds every cost a client controls.
//!
//! - A new connection must send its first byte within [`ConnectionLimits::first_byte_timeout`]
//!   and finish the TLS handshake within [`ConnectionLimits::handshake_timeout`].
//! - Request headers are bounded in time (which also ends idle keep-alive connections) and
//!   in size (431 past [`ConnectionLimits::max_header_bytes`]); hyper's read buffer is bounded too.
//! - A client that stops reading its answer is dropped after [`ConnectionLimits::write_timeout`].
//! - At [`ConnectionLimits::max_connections`], a new client closes the connection that has been
//!   idle longest (as nginx does), so idle sockets can never lock out the API server or the
//!   kubelet; only when every connection is busy is the new one refused.
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::HeaderValue;
use axum::http::header::CONNECTION;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// What one listener allows each client.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Connections open at once; at the limit the longest-idle one is closed for a new one.
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
        }
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
}

impl ServeOptions {
    /// Within `limits`: plain HTTP on the caller's runtime, unless [`Self::tls`] and [`Self::on`]
    /// say otherwise.
    pub fn new(limits: ConnectionLimits) -> Self {
        ServeOptions { tls: None, limits, workers: None, draining: CancellationToken::new() }
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
}

/// Serves `service` on `listener` until `shutdown`, as `options` say; then lets in-flight
/// requests finish within the grace period.
pub async fn serve<S: Serve>(listener: TcpListener, service: S, options: ServeOptions, shutdown: CancellationToken) {
    let ServeOptions { tls, limits, workers, draining } = options;
    let acceptor = tls.map(TlsAcceptor::from);
    let graceful = GracefulShutdown::new();
    let open = Arc::new(OpenConnections::new(limits.max_connections));
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
        let Some(connection) = open.admit() else {
            tracing::debug!(%peer, "every connection is busy: refusing a new one");
            continue;
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
                _ = connection.evicted.cancelled() => tracing::debug!(%peer, "closed an idle connection to make room"),
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
        // A client that stops reading its response must not hold the connection forever.
        let mut io = TimeoutStream::new(tcp);
        io.set_write_timeout(Some(limits.write_timeout));
        let io = Box::pin(io);
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let busy = state.busy();
            let response = service.call(request);
            let draining = draining.clone();
            async move {
                let mut response = response.await;
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
                    Ok(Ok(stream)) => watcher.watch(builder.serve_connection(TokioIo::new(stream), service)).await,
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

/// `idle_since` of a connection serving a request.
const BUSY: u64 = u64::MAX;

/// One open connection as the listener sees it.
struct ConnectionState {
    id: u64,
    /// Nanoseconds after the listener's epoch since which no request is in progress, or [`BUSY`].
    idle_since: AtomicU64,
    epoch: Instant,
    /// Cancelled to close the connection for a newcomer.
    evicted: CancellationToken,
}

impl ConnectionState {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(BUSY - 1)
    }

    /// Marks a request in progress until the guard is dropped.
    fn busy(self: &Arc<Self>) -> BusyGuard {
        self.idle_since.store(BUSY, Ordering::Relaxed);
        BusyGuard(self.clone())
    }
}

struct BusyGuard(Arc<ConnectionState>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.idle_since.store(self.0.now(), Ordering::Relaxed);
    }
}

/// The open connections of one listener.
struct OpenConnections {
    max: usize,
    epoch: Instant,
    next_id: AtomicU64,
    all: Mutex<HashMap<u64, Arc<ConnectionState>>>,
}

impl OpenConnections {
    fn new(max: usize) -> Self {
        OpenConnections { max: max.max(1), epoch: Instant::now(), next_id: AtomicU64::new(0), all: Mutex::default() }
    }

    /// Registers a new connection, closing the longest-idle one when at the limit;
    /// `None` when every connection is busy.
    fn admit(&self) -> Option<Arc<ConnectionState>> {
        let mut all = self.all.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() >= self.max {
            let oldest = all
                .values()
                .map(|c| (c.idle_since.load(Ordering::Relaxed), c.id))
                .filter(|(since, _)| *since != BUSY)
                .min()
                .map(|(_, id)| id)?;
            if let Some(evicted) = all.remove(&oldest) {
                evicted.evicted.cancel();
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnectionState {
            id,
            idle_since: AtomicU64::new(0),
            epoch: self.epoch,
            evicted: CancellationToken::new(),
        });
        state.idle_since.store(state.now(), Ordering::Relaxed);
        all.insert(id, state.clone());
        Some(state)
    }

    fn remove(&self, id: u64) {
        self.all.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
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

    #[test]
    fn at_the_limit_the_longest_idle_connection_makes_room() {
        let open = OpenConnections::new(2);
        let first = open.admit().expect("room");
        std::thread::sleep(Duration::from_millis(2));
        let second = open.admit().expect("room");
        let third = open.admit().expect("the first, idle longest, makes room");
        assert!(first.evicted.is_cancelled());
        assert!(!second.evicted.is_cancelled() && !third.evicted.is_cancelled());
    }

    #[test]
    fn busy_connections_are_never_closed_for_a_newcomer() {
        let open = OpenConnections::new(2);
        let first = open.admit().expect("room");
        let second = open.admit().expect("room");
        let _busy_first = first.busy();
        let _busy_second = second.busy();
        assert!(open.admit().is_none(), "every connection is busy");
        assert!(!first.evicted.is_cancelled() && !second.evicted.is_cancelled());
    }

    #[test]
    fn a_finished_request_makes_its_connection_idle_again() {
        let open = OpenConnections::new(1);
        let only = open.admit().expect("room");
        drop(only.busy());
        assert!(open.admit().is_some());
        assert!(only.evicted.is_cancelled());
    }
}

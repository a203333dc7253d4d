//! Backends on loopback addresses that answer with their name, the clients that ask them, and
//! the specs that point at them.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use balancer::api::{BackendSpec, BalancerPort, BalancerSpec};
use balancer::proxy::model::Destination;
use balancer::spec::{Admitted, SpecPolicy};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};
use tokio::task::JoinHandle;
use tokio::time::timeout;

use crate::{BACKEND_IPS, STEP};

/// One test server per backend, answering with its own name and counting what it served.
pub(crate) struct Backend {
    pub(crate) name: String,
    pub(crate) addr: SocketAddr,
    pub(crate) served: Arc<AtomicUsize>,
    pub(crate) task: JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections on `ip`, writes `reply` on each and closes it.
pub(crate) async fn tcp_backend(name: &str, ip: Ipv4Addr, reply: String) -> Backend {
    serving_backend(name, ip, reply, |mut stream, reply| async move {
        let _ = timeout(STEP, async {
            stream.write_all(reply.as_bytes()).await?;
            stream.shutdown().await
        })
        .await;
    })
    .await
}

/// A TCP backend named `name` on `ip`: counts each connection it accepts and serves it with
/// `serve`, given `reply`, in a task of its own.
pub(crate) async fn serving_backend<F, Served>(name: &str, ip: Ipv4Addr, reply: String, serve: F) -> Backend
where
    F: Fn(TcpStream, String) -> Served + Send + 'static,
    Served: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind((ip, 0)).await.expect("bind TCP backend");
    let addr = listener.local_addr().expect("addr");
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(stream, reply.clone()));
        }
    });
    Backend { name: name.to_string(), addr, served, task }
}

/// Answers every datagram on `ip` with `reply`.
pub(crate) async fn udp_backend(name: &str, ip: Ipv4Addr, reply: String) -> Backend {
    let socket = UdpSocket::bind((ip, 0)).await.expect("bind UDP backend");
    let addr = socket.local_addr().expect("addr");
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    let task = tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        while let Ok((_, from)) = socket.recv_from(&mut buf).await {
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = socket.send_to(reply.as_bytes(), from).await;
        }
    });
    Backend { name: name.to_string(), addr, served, task }
}

/// Where nginx reaches each backend: its own loopback address and server port.
pub(crate) fn addresses(backends: &[Backend]) -> impl Fn(&BackendSpec, &BalancerPort) -> Destination + '_ {
    move |backend: &BackendSpec, _: &BalancerPort| {
        let server = backends.iter().find(|b| b.name == backend.name).expect("a server per backend");
        Destination::Address(server.addr)
    }
}

/// One TCP connection through nginx: what the backend answered.
pub(crate) async fn tcp_ask(port: u16) -> String {
    timeout(STEP, async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.expect("connect to nginx");
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.expect("read reply");
        reply
    })
    .await
    .expect("reply through nginx in time")
}

/// One datagram through nginx from a fresh socket, i.e. a fresh nginx UDP session
/// (nginx keys sessions by client address and port): the reply, and the socket.
///
/// Callers that count picks keep the sockets until the end, so the kernel cannot hand
/// an earlier client's port to a later one, whose datagram would then join the earlier,
/// still open session instead of being balanced.
pub(crate) async fn udp_ask(port: u16) -> (String, UdpSocket) {
    timeout(STEP, async {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind client");
        socket.connect(("127.0.0.1", port)).await.expect("connect");
        socket.send(b"who are you?").await.expect("send");
        let mut buf = [0u8; 1500];
        let n = socket.recv(&mut buf).await.expect("recv");
        (String::from_utf8_lossy(&buf[..n]).into_owned(), socket)
    })
    .await
    .expect("datagram answered through nginx in time")
}

pub(crate) fn tally(replies: impl IntoIterator<Item = String>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for reply in replies {
        *counts.entry(reply).or_insert(0) += 1;
    }
    counts
}

/// The original project's sample Balancer, listening on `port`.
pub(crate) fn sample_spec(port: u16) -> BalancerSpec {
    let mut spec = crate::support::fixtures::sample_spec();
    spec.ports[0].port = i32::from(port);
    spec
}

/// A spec through the pipeline the controller renders from: defaulted and validated.
pub(crate) fn admitted(spec: BalancerSpec) -> Admitted {
    crate::support::fixtures::admitted("test", spec, &SpecPolicy::default())
}

pub(crate) fn weights(spec: &BalancerSpec) -> Vec<i32> {
    spec.backends.iter().map(BackendSpec::effective_weight).collect()
}

pub(crate) async fn tcp_backends(names: &[&str]) -> Vec<Backend> {
    let mut backends = Vec::new();
    for (name, ip) in names.iter().zip(BACKEND_IPS) {
        backends.push(tcp_backend(name, ip, name.to_string()).await);
    }
    backends
}

pub(crate) async fn udp_backends(names: &[&str]) -> Vec<Backend> {
    let mut backends = Vec::new();
    for (name, ip) in names.iter().zip(BACKEND_IPS) {
        backends.push(udp_backend(name, ip, name.to_string()).await);
    }
    backends
}

pub(crate) fn served(backends: &[Backend]) -> BTreeMap<String, usize> {
    backends.iter().map(|b| (b.name.clone(), b.served.load(Ordering::SeqCst))).filter(|(_, n)| *n > 0).collect()
}

/// One TCP connection through nginx from the client address `from`: what the backend answered.
pub(crate) async fn tcp_ask_from(from: Ipv4Addr, port: u16) -> String {
    timeout(STEP, async {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.bind(SocketAddr::from((from, 0))).expect("bind the client address");
        let mut stream = socket.connect(SocketAddr::from(([127, 0, 0, 1], port))).await.expect("connect to nginx");
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.expect("read reply");
        reply
    })
    .await
    .expect("reply through nginx in time")
}

/// Distinct loopback addresses for up to 254 backends, at the Balancer port's number.
pub(crate) fn loopback_addresses(spec: &BalancerSpec) -> impl Fn(&BackendSpec, &BalancerPort) -> Destination + '_ {
    move |backend: &BackendSpec, port: &BalancerPort| {
        let i = spec.backends.iter().position(|b| b.name == backend.name).expect("backend of this spec");
        format!("127.0.0.{}:{}", i + 2, port.port).parse().map(Destination::Address).expect("an address")
    }
}

/// Connections or requests a split is measured over.
pub(crate) const REQUESTS: usize = 500;

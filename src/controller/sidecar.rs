//! Asking a proxy pod's metrics sidecar, on the pod network: one bounded `GET`, for the
//! [`prober`](super::prober) only (never a reconcile worker). A sidecar that does not answer in
//! [`ANSWER_TIMEOUT`] says nothing, and no answer is read past its bound.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use futures::StreamExt;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// How many of one Balancer's sidecars are asked at once: with [`ANSWER_TIMEOUT`], a bound on
/// what its silent pods cost the prober (see [`prober`](super::prober)).
pub(super) const ASKED_PER_BALANCER: usize = 4;

/// How long one pod's answer may take: a sidecar on the pod network answers in a millisecond.
pub(super) const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

/// The body the sidecar at `address` gives for `path` (a success, at most `max_bytes`); `None`
/// when it gives none in time.
pub(super) async fn get(address: SocketAddr, path: &str, max_bytes: usize) -> Option<Bytes> {
    let host = address.to_string();
    let ask = async {
        let stream = tokio::net::TcpStream::connect(address).await.ok()?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.ok()?;
        let connection = tokio::spawn(connection);
        let request = hyper::Request::get(path).header("host", &host).body(Empty::<Bytes>::new()).ok()?;
        let response = sender.send_request(request).await.ok()?;
        let ok = response.status().is_success();
        let body = Limited::new(response.into_body(), max_bytes).collect().await.ok()?.to_bytes();
        connection.abort();
        ok.then_some(body)
    };
    tokio::time::timeout(ANSWER_TIMEOUT, ask).await.ok().flatten()
}

/// Asks every pod at `addresses` (on `port`) with `read`, [`ASKED_PER_BALANCER`] at a time.
pub(super) async fn ask_each<T, F, Fut>(addresses: &[IpAddr], port: u16, read: F) -> Vec<(IpAddr, Option<T>)>
where
    F: Fn(SocketAddr) -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let asks = addresses.iter().copied().map(|ip| {
        let answer = read(SocketAddr::new(ip, port));
        async move { (ip, answer.await) }
    });
    futures::stream::iter(asks).buffer_unordered(ASKED_PER_BALANCER).collect().await
}

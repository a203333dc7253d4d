//! What a running canary's proxy pods measured: each sidecar's answer at
//! [`SIGNALS_PATH`], read by the [`prober`](super::prober) within
//! [`MAX_SIGNALS_BYTES`] and [`ANSWER_TIMEOUT`](super::sidecar::ANSWER_TIMEOUT).

use std::net::{IpAddr, SocketAddr};

use super::measuring::SignalsAnswers;
use super::sidecar;
use crate::proxy::signals::{MAX_SIGNALS_BYTES, SIGNALS_PATH, Signals};

/// Asks the sidecar of every pod at `addresses` (on `port`) for its counts; a pod that does not
/// answer in time, or answers what does not read, says nothing (`None`).
pub(super) async fn ask(addresses: &[IpAddr], port: u16) -> SignalsAnswers {
    sidecar::ask_each(addresses, port, measured_by).await
}

async fn measured_by(address: SocketAddr) -> Option<Signals> {
    let body = sidecar::get(address, SIGNALS_PATH, MAX_SIGNALS_BYTES).await?;
    serde_json::from_slice(&body).ok()
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::routing::get;

    use super::*;

    #[tokio::test]
    async fn a_sidecars_counts_are_read_and_what_does_not_read_is_nothing() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = listener.local_addr().expect("an address").port();
        let answer = Signals { window: "w".into(), ..Signals::default() };
        let body = serde_json::to_string(&answer).expect("json");
        let huge = "x".repeat(MAX_SIGNALS_BYTES + 1);
        let router = Router::new()
            .route(SIGNALS_PATH, get(move || async move { body }))
            .route("/huge", get(move || async move { huge }));
        tokio::spawn(async move { axum::serve(listener, router).await });
        let pod = IpAddr::from([127, 0, 0, 1]);
        assert_eq!(ask(&[pod], port).await, vec![(pod, Some(answer))]);
        let at = SocketAddr::new(pod, port);
        assert_eq!(sidecar::get(at, "/huge", MAX_SIGNALS_BYTES).await, None, "an answer past its bound is nothing");
        assert_eq!(sidecar::get(at, "/missing", MAX_SIGNALS_BYTES).await, None, "a 404 is nothing");
    }
}

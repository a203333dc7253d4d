//! `balancer proxy-metrics`: the sidecar in every proxy pod that turns nginx's stream log into
//! Prometheus series per Balancer, port and backend (see [`access_log`] for the route, and
//! [`metrics`] for the series).
//!
//! It reads the `nginx.conf` the proxy runs once, at start (the file does not change under a
//! running pod: a new configuration rolls the pods), receives one datagram per session on the
//! pod's loopback, and serves `/metrics` in plain HTTP.
//!
//! [`access_log`]: crate::proxy::access_log

mod metrics;
mod udp;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use metrics::{CONNECT_BUCKETS, SESSION_BUCKETS};

use crate::proxy::access_log::Upstreams;
use crate::runtime::http::not_found;
use crate::runtime::metrics::exposition;
use metrics::ProxyMetrics;

/// What the sidecar needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The proxy's `nginx.conf`.
    pub config: PathBuf,
    /// Where `/metrics` is served.
    pub listen: SocketAddr,
    /// The UDP port on 127.0.0.1 nginx sends its log to.
    pub log_port: u16,
    /// How long, after SIGTERM, the sidecar goes on counting the sessions the proxy drains.
    pub drain: Duration,
}

/// Why the sidecar cannot run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Config { path: String, source: std::io::Error },
    #[error("{path} is not an nginx.conf balancer rendered")]
    NotRendered { path: String },
    #[error("cannot listen for the log on 127.0.0.1:{port}/udp: {source}")]
    Log { port: u16, source: std::io::Error },
    #[error("cannot serve metrics on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

/// The most of `nginx.conf` read: 64 backends × 32 ports of lines stay far below it.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Runs until `stop`, then for `options.drain` more while lines still arrive.
pub async fn run(options: Options, stop: CancellationToken) -> Result<(), Error> {
    let upstreams = read_config(&options.config).await?;
    let mut registry = Registry::default();
    let metrics = Arc::new(ProxyMetrics::register(upstreams, &mut registry));
    let log_addr = SocketAddr::from(([127, 0, 0, 1], options.log_port));
    let socket = std::net::UdpSocket::bind(log_addr).map_err(|source| Error::Log { port: options.log_port, source })?;
    let listener =
        TcpListener::bind(options.listen).await.map_err(|source| Error::Listen { addr: options.listen, source })?;
    tracing::info!(log = %log_addr, metrics = %options.listen, "counting the proxy's sessions");

    let registry = Arc::new(registry);
    let scrape = {
        let metrics = metrics.clone();
        let registry = registry.clone();
        move || {
            if let Some(drops) = udp::drops(options.log_port) {
                metrics.lost_up_to(drops);
            }
            exposition(axum::extract::State(registry))
        }
    };
    let router = Router::new().route("/metrics", get(scrape)).fallback(not_found);
    let served = CancellationToken::new();
    let server = {
        let served = served.clone();
        axum::serve(listener, router).with_graceful_shutdown(async move { served.cancelled().await })
    };
    let counting = tokio::task::spawn_blocking(move || udp::receive(socket, &metrics, &stop, options.drain));
    let result = tokio::select! {
        result = server.into_future() => result.map_err(|source| Error::Listen { addr: options.listen, source }),
        _ = counting => Ok(()),
    };
    served.cancel();
    result
}

async fn read_config(path: &std::path::Path) -> Result<Upstreams, Error> {
    let shown = path.display().to_string();
    let error = |source| Error::Config { path: shown.clone(), source };
    let file = tokio::fs::File::open(path).await.map_err(error)?;
    let mut text = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut tokio::io::AsyncReadExt::take(file, MAX_CONFIG_BYTES), &mut text)
        .await
        .map_err(error)?;
    Upstreams::read(&text).ok_or(Error::NotRendered { path: shown })
}

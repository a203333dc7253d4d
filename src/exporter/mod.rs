//! `balancer proxy-metrics`: the sidecar in every proxy pod that turns nginx's stream log into
//! Prometheus series per Balancer, port and backend (see [`access_log`] for the route, and
//! [`metrics`] for the series).
//!
//! It follows the proxy's configuration: live, from the ConfigMap, handing each new
//! `nginx.conf` to the proxy container (see [`live`]); or, without live configuration, from the
//! mounted file, read once, when the kubelet has mounted the one the pod was made for. It
//! reads nginx's access log, one line per session, as nginx appends it ([`log_file`]), and
//! serves `/metrics` and [`CONFIG_PATH`] in plain HTTP.
//!
//! [`access_log`]: crate::proxy::access_log

mod live;
mod log_file;
mod metrics;
mod window;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

pub use crate::proxy::model::MAX_CONFIG_BYTES;
pub use live::LiveSource;
pub use metrics::{CONNECT_BUCKETS, SESSION_BUCKETS};

use crate::proxy::model::MODEL_FILE;
use crate::proxy::reload::CONFIG_PATH;
use crate::proxy::signals::SIGNALS_PATH;
use crate::proxy::upstreams::Upstreams;
use crate::runtime::http::not_found;
use crate::runtime::listener::{self, ConnectionLimits, ServeOptions};
use crate::runtime::metrics::exposition;
use metrics::ProxyMetrics;

/// What the sidecar needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where the proxy's `nginx.conf` comes from.
    pub source: Source,
    /// Where `/metrics` is served.
    pub listen: SocketAddr,
    /// The file nginx appends its log to.
    pub log_file: PathBuf,
    /// How long, after SIGTERM, the sidecar goes on counting the sessions the proxy drains.
    pub drain: Duration,
}

/// Where the proxy's `nginx.conf` comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A mounted file, read once; `hash` is the SHA-256 (hex) of the file this pod was made for
    /// (`None`: whatever is there).
    File {
        /// Where the ConfigMap is mounted.
        path: PathBuf,
        /// The SHA-256 the file must have.
        hash: Option<String>,
    },
    /// The ConfigMap, followed live (see [`live`]).
    Live(LiveSource),
}

/// Why the sidecar cannot run.
#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Config { path: String, source: std::io::Error },
    #[error("{path} is not an nginx.conf balancer rendered")]
    NotRendered { path: String },
    #[error(transparent)]
    Live(#[from] live::StartError),
    #[error("cannot open the access log {path}: {source}")]
    Log { path: String, source: std::io::Error },
    #[error("cannot serve metrics on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

/// Runs until `stop`, then for `options.drain` more while lines still arrive.
pub async fn run(options: Options, stop: CancellationToken) -> Result<(), Error> {
    let (id, upstreams, window, follower) = match &options.source {
        Source::File { path, hash } => {
            let reading = read_config(path, hash.as_deref());
            let (id, upstreams, window) = tokio::select! {
                read = reading => read?,
                () = stop.cancelled() => return Ok(()),
            };
            (Some(id), upstreams, window, None)
        }
        Source::Live(source) => {
            let Some((changes, first, trust)) = live::start(source, &stop).await? else { return Ok(()) };
            // Served only once the proxy container says so (see `live::follow`).
            (None, first.upstreams.clone(), None, Some((changes, live::SharedFiles::in_dir(&source.dir), first, trust)))
        }
    };
    let mut registry = Registry::default();
    let metrics = Arc::new(ProxyMetrics::register(id.as_deref(), upstreams, &mut registry));
    // A mounted file is served from the pod's start.
    metrics.serve_window(window.as_deref());
    if let Some((changes, files, first, trust)) = follower {
        let (metrics, stop) = (metrics.clone(), stop.clone());
        tokio::spawn(live::follow(changes, files, first, trust, metrics, stop));
    }
    let log = log_file::LogFile::open(&options.log_file)
        .map_err(|source| Error::Log { path: options.log_file.display().to_string(), source })?;
    let (listener, listen) = bind_metrics(options.listen).await?;
    tracing::info!(log = %options.log_file.display(), metrics = %listen, "counting the proxy's sessions");

    let registry = Arc::new(registry);
    let scrape = move || exposition(axum::extract::State(registry));
    let served_config = {
        let metrics = metrics.clone();
        move || std::future::ready(metrics.served_id() + "\n")
    };
    let signals = {
        let metrics = metrics.clone();
        move || std::future::ready(axum::Json(metrics.signals()))
    };
    let router = Router::new()
        .route("/metrics", get(scrape))
        .route(CONFIG_PATH, get(served_config))
        .route(SIGNALS_PATH, get(signals))
        .fallback(not_found);
    let served = CancellationToken::new();
    let server = listener::serve(listener, router, ServeOptions::new(scraper_limits()), served.clone());
    let counting = tokio::task::spawn_blocking(move || log_file::follow(log, &metrics, &stop, options.drain));
    tokio::select! {
        () = server => {}
        _ = counting => {}
    }
    served.cancel();
    Ok(())
}

/// Listens on `addr`; for IPv6's any address (both families, so that the controller reaches the
/// sidecar at the pod's address in every cluster) on a node without IPv6, on IPv4's instead.
async fn bind_metrics(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), Error> {
    let bound = listener::bind(addr, "metrics").await;
    let ipv4 = SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, addr.port()));
    let (bound, addr) = match bound {
        Err(_) if addr.ip() == std::net::Ipv6Addr::UNSPECIFIED => (listener::bind(ipv4, "metrics").await, ipv4),
        bound => (bound, addr),
    };
    bound.map(|listener| (listener, addr)).map_err(|source| Error::Listen { addr, source })
}

/// The metrics port is open to the pod network: a few scrapers at a time, each bounded in
/// time and size, so that no client can grow the sidecar towards its memory limit (a sidecar
/// killed for it would take the proxy pod out of its Service while it restarts).
fn scraper_limits() -> ConnectionLimits {
    ConnectionLimits {
        max_connections: 16,
        first_byte_timeout: Duration::from_secs(5),
        handshake_timeout: Duration::from_secs(5),
        header_timeout: Duration::from_secs(30),
        max_header_bytes: 8 * 1024,
        write_timeout: Duration::from_secs(10),
        shutdown_grace: Duration::from_secs(1),
        slow_upload: listener::MinRate::SLOW_UPLOAD,
    }
}

/// How often the mounted file is read again while it is not the expected one.
const CONFIG_RECHECK: Duration = Duration::from_secs(1);

/// The hash, upstreams and canary window of the file at `path` (with its model beside it, as
/// the ConfigMap is mounted), once its hash is `expected` (see
/// [`ENTRYPOINT`](crate::proxy::nginx::ENTRYPOINT) for why a mounted file can be an old one).
async fn read_config(
    path: &std::path::Path,
    expected: Option<&str>,
) -> Result<(String, Upstreams, Option<String>), Error> {
    let mut told = false;
    loop {
        let text = read_bounded(path).await?;
        let hash = crate::proxy::nginx::config_hash(&text);
        if expected.is_none_or(|expected| expected == hash) {
            let model = read_bounded(&path.with_file_name(MODEL_FILE)).await?;
            let (upstreams, window) =
                live::rendered(&text, &model).ok_or(Error::NotRendered { path: path.display().to_string() })?;
            return Ok((hash, upstreams, window));
        }
        if !told {
            tracing::info!(path = %path.display(), expected, mounted = %hash, "waiting for the kubelet to mount the pod's configuration");
            told = true;
        }
        tokio::time::sleep(CONFIG_RECHECK).await;
    }
}

async fn read_bounded(path: &std::path::Path) -> Result<String, Error> {
    let error = |source| Error::Config { path: path.display().to_string(), source };
    let file = tokio::fs::File::open(path).await.map_err(error)?;
    let mut text = String::new();
    tokio::io::AsyncReadExt::read_to_string(
        &mut tokio::io::AsyncReadExt::take(file, MAX_CONFIG_BYTES as u64),
        &mut text,
    )
    .await
    .map_err(error)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model with no listener, for Balancer `lb`.
    const MODEL: &str = r#"{"balancer": "lb", "drainTimeout": "1h", "listeners": []}"#;

    /// A kubelet whose ConfigMap cache is behind mounts the previous file first.
    #[tokio::test]
    async fn the_config_is_read_once_it_is_the_expected_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nginx.conf");
        let rendered = crate::proxy::nginx::write(&crate::proxy::model::ProxyConfig::from_json(MODEL).unwrap());
        let new = format!("{rendered}# new\n");
        std::fs::write(dir.path().join(MODEL_FILE), MODEL).unwrap();
        std::fs::write(&path, format!("{rendered}# old\n")).unwrap();
        let expected = crate::proxy::nginx::config_hash(&new);
        let reading = tokio::spawn({
            let path = path.clone();
            async move { read_config(&path, Some(&expected)).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!reading.is_finished(), "read the old file");
        std::fs::write(&path, &new).unwrap();
        let read = tokio::time::timeout(Duration::from_secs(3), reading).await;
        assert!(matches!(read, Ok(Ok(Ok(())))), "{read:?}");
    }
}

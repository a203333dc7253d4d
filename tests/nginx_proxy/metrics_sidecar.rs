//! The metrics sidecar counting the sessions the real nginx logs, per backend, connect
//! failures included.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use balancer::api::{BackendSpec, BalancerPort};
use balancer::exporter;
use balancer::proxy::model::{Destination, MODEL_FILE, ProxyConfig, ServiceUpstreams};
use balancer::proxy::nginx;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use crate::backends::{REQUESTS, addresses, admitted, sample_spec, tally, tcp_ask, tcp_backends};
use crate::process::{nginx_binary, start_nginx};
use crate::support::ports::listen_port;
use crate::{NGINX_DEADLINE, STEP};

/// `GET /metrics` from the sidecar, in plain HTTP.
async fn scrape(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n\r\n").await.ok()?;
    let mut answer = String::new();
    timeout(STEP, stream.read_to_string(&mut answer)).await.ok()?.ok()?;
    answer.starts_with("HTTP/1.1 200").then_some(answer)
}

/// The value of the sample whose name and labels `line` begins with.
fn sample_value(exposition: &str, line: &str) -> Option<f64> {
    exposition.lines().find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
}

#[tokio::test]
async fn the_metrics_sidecar_counts_the_sessions_nginx_logs_per_backend() {
    let Some(bin) = nginx_binary() else { return };
    let backends = tcp_backends(&["v1", "v2", "v3"]).await;
    let address = addresses(&backends);
    let dir = TempDir::new().expect("temp dir");
    let log_file = dir.path().join("access.log");
    let log = log_file.to_str().expect("a UTF-8 path");
    let render = |p| nginx::render("example-balancer", &admitted(sample_spec(p)), &[], Some(log), &address);
    let (_nginx, listen) = start_nginx(&bin, render).await;
    let config = dir.path().join("nginx.conf");
    fs::write(&config, render(listen)).expect("nginx.conf");
    let model = ProxyConfig::of(
        "example-balancer",
        &admitted(sample_spec(listen)),
        &[],
        Some(log),
        &ServiceUpstreams(&address),
    );
    fs::write(dir.path().join(MODEL_FILE), model.to_json()).expect("its model");
    let metrics_port = listen_port();
    let options = exporter::Options {
        source: exporter::Source::File { path: config, hash: Some(nginx::config_hash(&render(listen))) },
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, metrics_port)),
        log_file: log_file.clone(),
        drain: Duration::ZERO,
    };
    let stop = CancellationToken::new();
    // A failed assertion still stops the sidecar: the runtime waits for its blocking log reader.
    let _stop_on_failure = stop.clone().drop_guard();
    let sidecar = tokio::spawn(exporter::run(options, stop.clone()));
    let deadline = Instant::now() + NGINX_DEADLINE;
    while scrape(metrics_port).await.is_none() {
        assert!(Instant::now() < deadline, "the sidecar never served /metrics");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let mut replies = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        replies.push(tcp_ask(listen).await);
    }
    let observed = tally(replies);
    // A garbled line, as anything that can write to the log's volume could write: counted and
    // skipped.
    let mut garbage = fs::OpenOptions::new().append(true).open(&log_file).expect("the log, as nginx made it");
    std::io::Write::write_all(&mut garbage, b"\xff\xfe not a log line\n").expect("append");

    let sessions = |text: &str, backend: &str| {
        let labels = format!(
            "balancer_proxy_sessions_total{{balancer=\"example-balancer\",port=\"{listen}\",protocol=\"TCP\",backend=\"{backend}\",outcome=\"ok\"}}"
        );
        sample_value(text, &labels).unwrap_or(0.0) as usize
    };
    // nginx writes its buffer within a second.
    let mut text = String::new();
    let deadline = Instant::now() + STEP;
    while Instant::now() < deadline {
        text = scrape(metrics_port).await.unwrap_or_default();
        let counted: usize = ["v1", "v2", "v3"].iter().map(|b| sessions(&text, b)).sum();
        if counted == REQUESTS && text.contains("reason=\"malformed\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for backend in ["v1", "v2", "v3"] {
        assert_eq!(sessions(&text, backend), observed[backend], "{backend}: every session counted once\n{text}");
    }
    let weight = |backend: &str| {
        let labels = format!(
            "balancer_proxy_backend_weight{{balancer=\"example-balancer\",port=\"{listen}\",protocol=\"TCP\",backend=\"{backend}\"}}"
        );
        sample_value(&text, &labels)
    };
    assert_eq!((weight("v1"), weight("v2"), weight("v3")), (Some(40.0), Some(20.0), Some(40.0)));
    assert_eq!(sample_value(&text, "balancer_proxy_log_unread_bytes{balancer=\"example-balancer\"}"), Some(0.0));
    let skipped = "balancer_proxy_log_lines_skipped_total{balancer=\"example-balancer\",reason=\"malformed\"}";
    assert_eq!(sample_value(&text, skipped), Some(1.0), "{text}");
    let bytes = format!(
        "balancer_proxy_sent_bytes_total{{balancer=\"example-balancer\",port=\"{listen}\",protocol=\"TCP\",backend=\"v1\"}}"
    );
    assert_eq!(sample_value(&text, &bytes), Some((observed["v1"] * "v1".len()) as f64), "bytes to clients");
    assert!(text.contains("balancer_proxy_session_duration_seconds_bucket{"), "{text}");
    assert!(text.contains("balancer_proxy_upstream_connect_duration_seconds_count{"), "{text}");

    stop.cancel();
    let stopped = timeout(STEP, sidecar).await.expect("the sidecar stops at once without a drain");
    assert!(matches!(stopped, Ok(Ok(()))), "{stopped:?}");
}

/// A backend that refuses connections: nginx moves on, and the sidecar counts the failed
/// connect against that backend, and the session against the one that served it.
#[tokio::test]
async fn the_metrics_sidecar_counts_connect_failures_against_the_refusing_backend() {
    let Some(bin) = nginx_binary() else { return };
    let mut backends = tcp_backends(&["v1", "v2"]).await;
    let refusing = backends.pop().expect("v2");
    let refused_addr = refusing.addr;
    drop(refusing);
    let live = &backends;
    let address = move |backend: &BackendSpec, _: &BalancerPort| match live.iter().find(|b| b.name == backend.name) {
        Some(server) => Destination::Address(server.addr),
        None => Destination::Address(refused_addr),
    };
    let spec = |p| {
        let mut spec = sample_spec(p);
        spec.backends.truncate(2);
        admitted(spec)
    };
    let dir = TempDir::new().expect("temp dir");
    let log_file = dir.path().join("access.log");
    let log = log_file.to_str().expect("a UTF-8 path");
    let render = |p| nginx::render("lb", &spec(p), &[], Some(log), &address);
    let (_nginx, listen) = start_nginx(&bin, render).await;
    fs::write(dir.path().join("nginx.conf"), render(listen)).expect("nginx.conf");
    let model = ProxyConfig::of("lb", &spec(listen), &[], Some(log), &ServiceUpstreams(&address));
    fs::write(dir.path().join(MODEL_FILE), model.to_json()).expect("its model");
    let metrics_port = listen_port();
    let options = exporter::Options {
        source: exporter::Source::File { path: dir.path().join("nginx.conf"), hash: None },
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, metrics_port)),
        log_file: log_file.clone(),
        drain: Duration::ZERO,
    };
    let stop = CancellationToken::new();
    // A failed assertion still stops the sidecar: the runtime waits for its blocking log reader.
    let _stop_on_failure = stop.clone().drop_guard();
    let sidecar = tokio::spawn(exporter::run(options, stop.clone()));
    while scrape(metrics_port).await.is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..20 {
        assert_eq!(tcp_ask(listen).await, "v1");
    }
    let failures = format!(
        "balancer_proxy_upstream_connect_failures_total{{balancer=\"lb\",port=\"{listen}\",protocol=\"TCP\",backend=\"v2\"}}"
    );
    let served = format!(
        "balancer_proxy_sessions_total{{balancer=\"lb\",port=\"{listen}\",protocol=\"TCP\",backend=\"v1\",outcome=\"ok\"}}"
    );
    // nginx writes its buffer within a second.
    let mut text = String::new();
    let deadline = Instant::now() + STEP;
    while Instant::now() < deadline {
        text = scrape(metrics_port).await.unwrap_or_default();
        if sample_value(&text, &served) == Some(20.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sample_value(&text, &served), Some(20.0), "{text}");
    // nginx leaves a refusing server out for its fail_timeout (10 s): one try per worker.
    let failed = sample_value(&text, &failures).unwrap_or(0.0);
    assert!(failed >= 1.0, "{text}");
    stop.cancel();
    let _ = timeout(STEP, sidecar).await;
}

//! What the metrics sidecar tells a canary's gates, counted from the real nginx's log: each
//! backend's sessions, those that ended in error or unanswered, and its connects, for the
//! sessions opened in the step's window (the model's `canaryWindow`).

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use balancer::api::{BackendSpec, BalancerPort};
use balancer::exporter;
use balancer::proxy::model::{Destination, MODEL_FILE, ProxyConfig, ServiceUpstreams};
use balancer::proxy::nginx;
use balancer::proxy::signals::{SIGNALS_PATH, Signals};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use crate::backends::{REQUESTS, admitted, sample_spec, tcp_ask, tcp_backend};
use crate::process::{nginx_binary, start_nginx};
use crate::support::ports::listen_port;
use crate::{BACKEND_IPS, NGINX_DEADLINE, STEP};

/// `GET /signals` from the sidecar, read.
async fn signals(port: u16) -> Option<Signals> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {SIGNALS_PATH} HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    timeout(STEP, stream.read_to_string(&mut answer)).await.ok()?.ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| serde_json::from_str(body).ok())?
}

#[tokio::test]
async fn the_sidecar_counts_a_windows_sessions_by_the_backend_nginx_picked_first() {
    let Some(bin) = nginx_binary() else { return };
    // v1 answers; v2 accepts and closes without a byte; v3 refuses (nothing listens there).
    let v1 = tcp_backend("v1", BACKEND_IPS[0], "v1".into()).await;
    let v2 = tcp_backend("v2", BACKEND_IPS[1], String::new()).await;
    let v3 = tcp_backend("v3", BACKEND_IPS[2], "v3".into()).await;
    let refused = v3.addr;
    drop(v3);
    let (v1_addr, v2_addr) = (v1.addr, v2.addr);
    let address = move |backend: &BackendSpec, _: &BalancerPort| match backend.name.as_str() {
        "v1" => Destination::Address(v1_addr),
        "v2" => Destination::Address(v2_addr),
        _ => Destination::Address(refused),
    };
    let dir = TempDir::new().expect("temp dir");
    let log_file = dir.path().join("access.log");
    let log = log_file.to_str().expect("a UTF-8 path");
    let model = |port| {
        let upstreams = ServiceUpstreams(&address);
        let mut model = ProxyConfig::of("canary", &admitted(sample_spec(port)), &[], Some(log), &upstreams);
        model.canary_window = Some("rev/1/0".into());
        model
    };
    let (_nginx, listen) = start_nginx(&bin, |port| nginx::write(&model(port))).await;
    let config = dir.path().join("nginx.conf");
    let conf = nginx::write(&model(listen));
    fs::write(&config, &conf).expect("nginx.conf");
    fs::write(dir.path().join(MODEL_FILE), model(listen).to_json()).expect("its model");
    let metrics_port = listen_port();
    let options = exporter::Options {
        source: exporter::Source::File { path: config, hash: Some(nginx::config_hash(&conf)) },
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, metrics_port)),
        log_file,
        drain: Duration::ZERO,
    };
    let stop = CancellationToken::new();
    let _stop_on_failure = stop.clone().drop_guard();
    let sidecar = tokio::spawn(exporter::run(options, stop.clone()));
    let deadline = Instant::now() + NGINX_DEADLINE;
    while signals(metrics_port).await.is_none() {
        assert!(Instant::now() < deadline, "the sidecar never served {SIGNALS_PATH}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let mut unanswered = 0;
    for _ in 0..REQUESTS {
        if tcp_ask(listen).await.is_empty() {
            unanswered += 1;
        }
    }
    // nginx writes its buffer within a second.
    let deadline = Instant::now() + STEP;
    let mut read = Signals::default();
    while Instant::now() < deadline {
        read = signals(metrics_port).await.unwrap_or_default();
        if read.backends.values().map(|w| w.sessions).sum::<u64>() == REQUESTS as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(read.window, "rev/1/0");
    assert_eq!(read.config, balancer::proxy::reload::short_id(&nginx::config_hash(&conf)));
    let total = |f: fn(&balancer::proxy::signals::Window) -> u64| read.backends.values().map(f).sum::<u64>();
    assert_eq!(total(|w| w.sessions), REQUESTS as u64, "each session once, by the backend picked first: {read:?}");
    assert_eq!(total(|w| w.errors + w.unanswered), unanswered, "every session that got nothing back: {read:?}");
    assert!(unanswered > 0, "v2 got its share");
    let (one, two, three) = (&read.backends["v1"], &read.backends["v2"], &read.backends["v3"]);
    assert_eq!((one.errors, one.unanswered, one.connect_failures), (0, 0, 0), "{read:?}");
    assert_eq!(two.unanswered + two.errors, two.sessions, "v2 answers nothing: {read:?}");
    assert!(three.connects > 0 && three.connect_failures == three.connects, "v3 refuses every connect: {read:?}");
    assert_eq!(three.connect_times.iter().sum::<u64>(), 0, "no connect to v3 took any time");
    assert_eq!(one.connect_times.iter().sum::<u64>(), one.connects, "each connect to v1 is timed");
    assert_eq!(read.weights.len(), 3, "each backend's weight as nginx serves it: {read:?}");

    stop.cancel();
    let stopped = timeout(STEP, sidecar).await.expect("the sidecar stops at once without a drain");
    assert!(matches!(stopped, Ok(Ok(()))), "{stopped:?}");
}

//! What the metrics sidecar tells a canary's gates, counted from the real nginx's log: each
//! backend's sessions, those that ended in error or unanswered, and its connects, for the
//! sessions opened in the step's window (the model's `canaryWindow`); a health check's
//! connection, in which nothing is said, in no session.

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

use crate::backends::{REQUESTS, admitted, sample_spec, serving_backend, tcp_backend};
use crate::process::{nginx_binary, start_nginx};
use crate::support::ports::listen_port;
use crate::{BACKEND_IPS, NGINX_DEADLINE, STEP};

/// What each client asks.
const QUESTION: &[u8] = b"who are you?\n";

/// One TCP connection through nginx that asks [`QUESTION`]: what came back, until the end.
async fn ask(port: u16) -> String {
    let io = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(QUESTION).await?;
        let mut reply = Vec::new();
        // A backend that closes at once resets what nginx sent it: nginx may then reset the client.
        let _ = stream.read_to_end(&mut reply).await;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&reply).into_owned())
    };
    timeout(STEP, io).await.expect("an end through nginx in time").expect("connect to nginx")
}

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
    // v1 reads the question and answers; v2 accepts and closes at once, its question unread;
    // v3 refuses (nothing listens there).
    let v1 = serving_backend("v1", BACKEND_IPS[0], "v1".into(), |mut stream, reply| async move {
        let _ = timeout(STEP, async {
            let mut question = [0u8; QUESTION.len()];
            stream.read_exact(&mut question).await?;
            stream.write_all(reply.as_bytes()).await?;
            stream.shutdown().await
        })
        .await;
    })
    .await;
    let v2 = serving_backend("v2", BACKEND_IPS[1], String::new(), |stream, _| async move { drop(stream) }).await;
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
        if ask(listen).await.is_empty() {
            unanswered += 1;
        }
        // A health check's connection, which says nothing and counts in no session.
        drop(TcpStream::connect(("127.0.0.1", listen)).await.expect("connect to nginx"));
    }
    let answered = (REQUESTS - unanswered) as u64;
    // A session counts for the backend nginx tried first, answered or not: summed over all.
    let answered_sessions =
        |read: &Signals| read.backends.values().map(|w| w.sessions - w.errors - w.unanswered).sum::<u64>();
    // nginx writes its buffer within a second: read once every answered session is in, and
    // again a second later.
    let deadline = Instant::now() + STEP;
    while Instant::now() < deadline {
        let read = signals(metrics_port).await.unwrap_or_default();
        if answered_sessions(&read) == answered {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let read = signals(metrics_port).await.unwrap_or_default();
    assert_eq!(read.window, "rev/1/0");
    assert_eq!(read.config, balancer::proxy::reload::short_id(&nginx::config_hash(&conf)));
    assert_eq!(answered_sessions(&read), answered, "each answered session once: {read:?}");
    let (one, two, three) = (&read.backends["v1"], &read.backends["v2"], &read.backends["v3"]);
    assert_eq!((one.errors, one.unanswered, one.connect_failures), (0, 0, 0), "{read:?}");
    assert!(unanswered > 0, "v2 got its share");
    assert_eq!(two.unanswered + two.errors, two.sessions, "v2 answers nothing: {read:?}");
    // nginx may end a session whose backend closed at once before it read the client's question:
    // such a session said nothing either way, and counts as a health check's does.
    let counted: u64 = read.backends.values().map(|w| w.errors + w.unanswered).sum();
    let share = counted * 100 / unanswered as u64;
    println!("the sidecar counted {counted} of the {unanswered} sessions v2 closed at once ({share}%)");
    assert!(counted <= unanswered as u64 && share >= 75, "the unanswered sessions counted: {read:?}");
    // Each asked session and each health check connected once to v1 or v2 (after v3, if tried).
    assert_eq!(one.connects + two.connects, 2 * REQUESTS as u64, "every connect counted: {read:?}");
    assert!(three.connects > 0 && three.connect_failures == three.connects, "v3 refuses every connect: {read:?}");
    assert_eq!(three.connect_times.iter().sum::<u64>(), 0, "no connect to v3 took any time");
    assert_eq!(one.connect_times.iter().sum::<u64>(), one.connects, "each connect to v1 is timed");
    assert_eq!(read.weights.len(), 3, "each backend's weight as nginx serves it: {read:?}");

    stop.cancel();
    let stopped = timeout(STEP, sidecar).await.expect("the sidecar stops at once without a drain");
    assert!(matches!(stopped, Ok(Ok(()))), "{stopped:?}");
}

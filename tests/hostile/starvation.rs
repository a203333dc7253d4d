//! Rows 8 and 9: slow, idle, and burst-then-stall clients from many addresses against the API
//! server's requests.
//!
//! 1,200 clients, each from a loopback address of its own (127.1.x.y: the whole of 127/8 is
//! local, so each client socket binds one), hold the webhook port as a hostile pod could:
//! uploads to `/convert` declaring 16 MiB and to `/validate` declaring 1 MiB, each trickled a
//! byte every 250 ms, TLS connections that never send a request, and TCP connections that
//! never send a byte; each starts again 100 ms after the server closes it. Together they are
//! more than the server's 1,024 connections. Meanwhile an "API server" client sends what the
//! API server sends (AdmissionReviews to `/validate` and `/mutate`, ConversionReviews to
//! `/convert`), one after another, on its keep-alive connection and every fifth on a fresh one,
//! as the API server opens new connections when it needs them. Every one must be answered 200
//! with its review, none refused for capacity; the p99 is printed beside the p99 of the same
//! requests without the attack, measured first in the same run.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

use crate::support::fixtures::{sample_json as sample_balancer, sample_v1alpha1};
use crate::support::{conversion_review, review};
use crate::{MEASURE_CAP, Server, normal_review, one_at_a_time, require_open_files};

/// What each hostile client does, and how many do it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// `POST /convert` declaring 16 MiB (the limit), a byte every 250 ms.
    SlowConversion,
    /// `POST /validate` declaring 1 MiB (the limit), a byte every 250 ms.
    SlowReview,
    /// A TLS connection that never sends a request.
    IdleTls,
    /// A TCP connection that never sends a byte.
    IdleTcp,
    /// `POST /convert` declaring 16 MiB, 8 MiB and a byte at once, then nothing.
    BurstConversion,
    /// `POST /validate` declaring 1 MiB, 512 KiB at once, then nothing.
    BurstReview,
}

const CLIENTS: [(Kind, usize); 4] =
    [(Kind::SlowConversion, 400), (Kind::SlowReview, 700), (Kind::IdleTls, 100), (Kind::IdleTcp, 100)];

/// How long the requests are measured without the attack, and under it.
const IDLE_WINDOW: Duration = Duration::from_secs(3);
const ATTACK_WINDOW: Duration = Duration::from_secs(10);
/// Time for the attack to open its connections before the measure starts.
const RAMP: Duration = Duration::from_secs(3);

/// The `i`th client's source address: 127.1.x.y, distinct for every client.
fn source(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 1, (i / 250) as u8, (1 + i % 250) as u8))
}

/// Connects to `to` from `from`, within 5 s.
async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    tokio::time::timeout(Duration::from_secs(5), socket.connect(to)).await.map_err(std::io::Error::other)?
}

/// Outcomes of the hostile clients' connections, by kind.
#[derive(Default)]
struct Outcomes {
    tally: Mutex<BTreeMap<(Kind, String), usize>>,
    /// Connections made, and open now.
    made: AtomicUsize,
    open: AtomicUsize,
    most_open: AtomicUsize,
}

impl Outcomes {
    fn count(&self, kind: Kind, outcome: String) {
        *self.tally.lock().unwrap().entry((kind, outcome)).or_insert(0) += 1;
    }

    fn opened(&self) {
        self.made.fetch_add(1, Ordering::Relaxed);
        let open = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.most_open.fetch_max(open, Ordering::Relaxed);
    }
}

/// One hostile client: connects from `from`, does what its kind does until the server closes
/// the connection, and starts again 100 ms later, until `stop`.
async fn hostile(kind: Kind, from: IpAddr, server: Arc<Server>, stop: Arc<AtomicBool>, outcomes: Arc<Outcomes>) {
    while !stop.load(Ordering::Acquire) {
        let outcome = match connect_from(from, server.webhook).await {
            Err(e) => format!("connect failed: {}", e.kind()),
            Ok(tcp) => {
                outcomes.opened();
                let outcome = match kind {
                    Kind::IdleTcp => until_closed(tcp, &stop).await,
                    _ => match server.tls_handshake(tcp).await {
                        Err(_) => "handshake failed".to_string(),
                        Ok(tls) => match kind {
                            Kind::SlowConversion => trickle(tls, "/convert", 16 * MIB, 0, &stop).await,
                            Kind::SlowReview => trickle(tls, "/validate", MIB, 0, &stop).await,
                            Kind::BurstConversion => trickle(tls, "/convert", 16 * MIB, 8 * MIB + 1, &stop).await,
                            Kind::BurstReview => trickle(tls, "/validate", MIB, MIB / 2, &stop).await,
                            _ => until_closed(tls, &stop).await,
                        },
                    },
                };
                outcomes.open.fetch_sub(1, Ordering::Relaxed);
                outcome
            }
        };
        outcomes.count(kind, outcome);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Holds `stream` without a word until the server closes it or `stop`.
async fn until_closed<S: AsyncRead + Unpin>(mut stream: S, stop: &AtomicBool) -> String {
    let mut byte = [0u8; 1];
    while !stop.load(Ordering::Acquire) {
        match tokio::time::timeout(Duration::from_millis(200), stream.read(&mut byte)).await {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => return "closed".into(),
            Ok(Ok(_)) => return "answered".into(),
        }
    }
    "held until the end".into()
}

const MIB: u64 = 1024 * 1024;

/// Sends the head of a POST declaring `length` bytes, then `burst` bytes at once: with no
/// burst, a byte every 250 ms; after one, nothing. Until the server answers (its status code)
/// or closes without an answer, or `stop`.
async fn trickle<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    path: &str,
    length: u64,
    burst: u64,
    stop: &AtomicBool,
) -> String {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n{{"
    );
    if writer.write_all(head.as_bytes()).await.is_err() || writer.flush().await.is_err() {
        return "closed before its head".into();
    }
    let burst = vec![b' '; usize::try_from(burst).unwrap_or(0)];
    if writer.write_all(&burst).await.is_err() || writer.flush().await.is_err() {
        return "closed during its burst".into();
    }
    let trickling = burst.is_empty();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 512];
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            read = reader.read(&mut chunk) => match read {
                Ok(0) | Err(_) => return "closed without an answer".into(),
                Ok(n) => {
                    answer.extend_from_slice(&chunk[..n]);
                    if let Some(line) = String::from_utf8_lossy(&answer).split("\r\n").next().filter(|_| answer.windows(2).any(|w| w == b"\r\n")) {
                        return line.split(' ').nth(1).unwrap_or("?").to_string();
                    }
                }
            },
            _ = tick.tick() => {
                if stop.load(Ordering::Acquire) {
                    return "held until the end".into();
                }
                if trickling && (writer.write_all(b" ").await.is_err() || writer.flush().await.is_err()) {
                    return "closed without an answer".into();
                }
            }
        }
    }
}

/// What the API server sends, in turn.
#[derive(Clone, Copy, Debug)]
enum Request {
    Validate,
    Mutate,
    Convert,
    /// A review of a Balancer with a 64 KiB annotation.
    LargeValidate,
    /// A ConversionReview of 64 Balancers.
    LargeConvert,
}

impl Request {
    const ALL: [Request; 3] = [Request::Validate, Request::Mutate, Request::Convert];
    /// With reviews over 16 KiB, which pay from the budgets a burst-then-stall client holds.
    const WITH_LARGE: [Request; 5] =
        [Request::Validate, Request::Mutate, Request::Convert, Request::LargeValidate, Request::LargeConvert];

    fn path(self) -> &'static str {
        match self {
            Request::Validate | Request::LargeValidate => "/validate",
            Request::Mutate => "/mutate",
            Request::Convert | Request::LargeConvert => "/convert",
        }
    }

    fn body(self) -> Value {
        match self {
            Request::Validate | Request::Mutate => normal_review(),
            Request::LargeValidate => {
                let mut balancer = sample_balancer();
                balancer["metadata"]["annotations"] = json!({"example.com/note": "x".repeat(64 * 1024)});
                review("CREATE", balancer)
            }
            Request::Convert => conversion_review("exposer.hliangzhao.io/v1beta1", vec![sample_v1alpha1()]),
            Request::LargeConvert => conversion_review("exposer.hliangzhao.io/v1beta1", vec![sample_v1alpha1(); 64]),
        }
    }

    /// Whether `answer` is this request's review, answered.
    fn answered(self, answer: &Value) -> bool {
        match self {
            Request::Validate | Request::Mutate | Request::LargeValidate => answer.pointer("/response/uid").is_some(),
            Request::Convert | Request::LargeConvert => {
                answer.pointer("/response/result/status") == Some(&Value::from("Success"))
            }
        }
    }
}

/// The API server's requests over `window`: each one's latency (and those on fresh
/// connections apart), and what went wrong.
struct Measured {
    latencies: Vec<Duration>,
    fresh: Vec<Duration>,
    failures: BTreeMap<String, usize>,
}

impl Measured {
    /// The `q` quantile (nearest rank), in milliseconds.
    fn quantile(&self, q: f64) -> f64 {
        quantile(&self.latencies, q)
    }

    fn describe(&self) -> String {
        format!(
            "{} requests, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} on fresh connections: p50 {:.1} ms, max {:.1} ms), \
             failures {:?}",
            self.latencies.len(),
            self.quantile(0.5),
            self.quantile(0.99),
            self.quantile(1.0),
            self.fresh.len(),
            quantile(&self.fresh, 0.5),
            quantile(&self.fresh, 1.0),
            self.failures
        )
    }
}

/// The `q` quantile (nearest rank) of `latencies`, in milliseconds.
fn quantile(latencies: &[Duration], q: f64) -> f64 {
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    let Some(last) = sorted.len().checked_sub(1) else { return f64::NAN };
    let rank = ((q * sorted.len() as f64).ceil() as usize).saturating_sub(1).min(last);
    sorted[rank].as_secs_f64() * 1000.0
}

/// [`api_server`] on a thread and runtime of its own, as a separate process would: its
/// latencies are the server's, not this test's runtime busy with the hostile clients.
async fn api_server_apart(server: &Arc<Server>, window: Duration, requests: &'static [Request]) -> Measured {
    let server = server.clone();
    let apart = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(api_server(&server, window, requests))
    });
    apart.await.expect("the API server's thread")
}

/// Sends `requests` in turn, one after another for `window`: on one keep-alive client, and
/// every fifth on a fresh one (a new connection, as the API server opens when it needs one).
async fn api_server(server: &Server, window: Duration, requests: &[Request]) -> Measured {
    let kept = server.client(MEASURE_CAP);
    let mut measured = Measured { latencies: Vec::new(), fresh: Vec::new(), failures: BTreeMap::new() };
    let started = Instant::now();
    let mut n = 0usize;
    while started.elapsed() < window {
        let request = requests[n % requests.len()];
        let fresh = n % 5 == 4;
        let client = if fresh { server.client(MEASURE_CAP) } else { kept.clone() };
        n += 1;
        let sent = Instant::now();
        let outcome = async {
            let response = client.post(server.url(request.path())).json(&request.body()).send().await;
            let response = response.map_err(|e| format!("{request:?}: {}", error_kind(&e)))?;
            let status = response.status().as_u16();
            let answer: Value = response.json().await.map_err(|e| format!("{request:?} {status}: unreadable: {e}"))?;
            match status {
                200 if request.answered(&answer) => Ok(()),
                _ => Err(format!("{request:?} {status} {}", answer.get("error").unwrap_or(&answer))),
            }
        }
        .await;
        measured.latencies.push(sent.elapsed());
        if fresh {
            measured.fresh.push(sent.elapsed());
        }
        if let Err(failure) = outcome {
            *measured.failures.entry(failure).or_insert(0) += 1;
        }
    }
    measured
}

fn error_kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_request() {
        "connection closed"
    } else {
        "failed"
    }
}

/// The value of the series `name` in the exposition `metrics`, 0 when absent.
fn series(metrics: &str, name: &str) -> f64 {
    metrics.lines().find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok())).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row8_slow_and_idle_clients_do_not_starve_the_api_server() {
    let attack = api_server_under_attack("row 8", &CLIENTS, &Request::ALL).await;
    let most_open = attack.most_open;
    assert!(most_open >= 1024, "row 8: the attack must hold more connections than the server's 1,024: {most_open}");
}

/// Row 9: clients that send a large part of a body at once, then stop: 4 on `/convert`
/// (8 MiB and a byte of a declared 16 MiB, enough to take the whole conversion budget with a
/// doubled buffer) and 32 on `/validate` (512 KiB of a declared 1 MiB each, the whole
/// admission budget the same way), each starting again 100 ms after the server closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row9_burst_then_stall_clients_do_not_starve_the_api_server() {
    let clients = [(Kind::BurstConversion, 4), (Kind::BurstReview, 32)];
    let attack = api_server_under_attack("row 9", &clients, &Request::WITH_LARGE).await;
    // The attack took place: every client connected and sent its burst, and bodies were cut.
    assert_eq!(attack.most_open, 36, "row 9: every burst client holds a connection");
    assert!(attack.bodies_cut_for_slowness > 0.0, "row 9: no burst was cut, so none stalled");
}

/// What an attack did: its most connections open at once, and the bodies the server cut for
/// falling behind the rate.
struct Attack {
    most_open: usize,
    bodies_cut_for_slowness: f64,
}

/// The API server's requests measured idle, then under `clients`' attack: every one must be
/// answered.
async fn api_server_under_attack(row: &str, clients: &[(Kind, usize)], requests: &'static [Request]) -> Attack {
    let total: usize = clients.iter().map(|(_, n)| n).sum();
    let _serial = one_at_a_time().await;
    require_open_files(2 * total as u64 + 400);
    let server = Arc::new(Server::start().await);
    server.warm_up().await;
    let idle = api_server_apart(&server, IDLE_WINDOW, requests).await;

    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Outcomes::default());
    let mut attack = JoinSet::new();
    let mut i = 0;
    for &(kind, count) in clients {
        for _ in 0..count {
            attack.spawn(hostile(kind, source(i), server.clone(), stop.clone(), outcomes.clone()));
            i += 1;
        }
    }
    tokio::time::sleep(RAMP).await;
    let attacked = api_server_apart(&server, ATTACK_WINDOW, requests).await;
    let most_open = outcomes.most_open.load(Ordering::Relaxed);
    stop.store(true, Ordering::Release);
    attack.join_all().await;
    let metrics = server.metrics().await;
    let mut server = Arc::into_inner(server).expect("the clients are done with the server");
    server.assert_alive(row);

    let tally = outcomes.tally.lock().unwrap().clone();
    let eviction =
        |reason: &str| series(&metrics, &format!("balancer_webhook_connection_evictions_total{{reason=\"{reason}\"}}"));
    let body = |reason: &str| series(&metrics, &format!("balancer_webhook_body_refusals_total{{reason=\"{reason}\"}}"));
    eprintln!(
        "hostile: {row}: {total} hostile clients from as many addresses ({clients:?}), {} connections made, at most \
         {most_open} open at once; their outcomes {tally:?}",
        outcomes.made.load(Ordering::Relaxed)
    );
    eprintln!(
        "hostile: {row}: the server closed for newcomers {} unused, {} slow uploads, {} idle, {} uploads; refused {} \
         newcomers; bodies cut for slowness {}, timed out {}, refused for the budget {}",
        eviction("unused"),
        eviction("slow_upload"),
        eviction("idle"),
        eviction("upload"),
        series(&metrics, "balancer_webhook_connection_refusals_total"),
        body("too_slow"),
        body("timeout"),
        body("budget"),
    );
    eprintln!("hostile: {row}: the API server's requests idle: {}", idle.describe());
    eprintln!("hostile: {row}: the API server's requests under attack: {}", attacked.describe());
    eprintln!("hostile: {row}: p99 idle {:.1} ms, under attack {:.1} ms", idle.quantile(0.99), attacked.quantile(0.99));
    assert!(idle.failures.is_empty(), "{row}: without the attack every request is answered: {}", idle.describe());
    assert!(
        attacked.failures.is_empty(),
        "{row}: every request the API server sends is answered under the attack: {}",
        attacked.describe()
    );
    assert!(attacked.latencies.len() >= 30, "{row}: too few requests to judge: {}", attacked.describe());
    Attack { most_open, bodies_cut_for_slowness: body("too_slow") }
}

//! HTTP traffic through a proxy: one request, a measured split, and clients that keep sending
//! while a scenario changes something, with the check that none of their requests failed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One `GET /` on a new connection: the body's first line.
pub async fn one_request(address: &str) -> Result<String, String> {
    one_request_from(None, address).await
}

/// [`one_request`] from a given local address (any, if `None`).
pub async fn one_request_from(source: Option<&str>, address: &str) -> Result<String, String> {
    let connect = async {
        let Some(source) = source else { return tokio::net::TcpStream::connect(address).await };
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(std::net::SocketAddr::new(source.parse().map_err(std::io::Error::other)?, 0))?;
        socket.connect(address.parse().map_err(std::io::Error::other)?).await
    };
    let exchange = async {
        let mut stream = connect.await.map_err(|e| e.to_string())?;
        stream.write_all(b"GET / HTTP/1.0\r\nHost: balancer\r\n\r\n").await.map_err(|e| e.to_string())?;
        let mut reply = Vec::with_capacity(256);
        stream.read_to_end(&mut reply).await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&reply);
        let body = text.split("\r\n\r\n").nth(1).ok_or_else(|| format!("no body in {text:?}"))?;
        Ok(body.lines().next().unwrap_or_default().to_string())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange).await.map_err(|_| "timed out".to_string())?
}

/// `requests` HTTP requests to `ip:port`, 16 at a time, each on its own connection:
/// how many got each answer ("failed" for a connection that got none).
pub async fn split(ip: &str, port: u16, requests: usize) -> BTreeMap<String, usize> {
    let address = format!("{ip}:{port}");
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..16 {
        let address = address.clone();
        let share = requests / 16 + usize::from(task < requests % 16);
        tasks.spawn(async move {
            let mut answers = Vec::with_capacity(share);
            for _ in 0..share {
                answers.push(one_request(&address).await.unwrap_or_else(|e| format!("failed: {e}")));
            }
            answers
        });
    }
    let mut counts = BTreeMap::new();
    let mut failures = Vec::new();
    for answer in tasks.join_all().await.into_iter().flatten() {
        let key = if answer.starts_with("failed") {
            failures.push(answer);
            "failed".to_string()
        } else {
            answer
        };
        *counts.entry(key).or_insert(0) += 1;
    }
    if !failures.is_empty() {
        println!("node: failures through {address}, first ones: {:?}", &failures[..failures.len().min(5)]);
    }
    counts
}

/// Whether each answer's share is its weight's, within `points` percentage points.
pub fn shares_match(counts: &BTreeMap<String, usize>, weights: &[(&str, u32)], points: f64) -> bool {
    share_errors(counts, weights, points).is_empty()
}

/// Each answer's share is its weight's, within `points` percentage points.
pub fn assert_shares(counts: &BTreeMap<String, usize>, weights: &[(&str, u32)], points: f64) {
    if let Some(error) = share_errors(counts, weights, points).first() {
        panic!("{error}: {counts:?}");
    }
}

/// One line for each answer whose share is off its weight's by more than `points`.
fn share_errors(counts: &BTreeMap<String, usize>, weights: &[(&str, u32)], points: f64) -> Vec<String> {
    let total: usize = counts.values().sum();
    let weight_sum: u32 = weights.iter().map(|(_, w)| w).sum();
    weights
        .iter()
        .filter_map(|(answer, weight)| {
            let share = 100.0 * *counts.get(*answer).unwrap_or(&0) as f64 / total as f64;
            let expected = 100.0 * f64::from(*weight) / f64::from(weight_sum);
            // Written so that a share of no requests at all (NaN) is off too.
            let within = (share - expected).abs() <= points;
            (!within).then(|| format!("{answer}: {share:.1}% against {expected:.1}% ±{points}"))
        })
        .collect()
}

/// Clients sending requests back to back until stopped: every failure, with its error, and
/// how many requests got each answer so far.
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: tokio::task::JoinSet<(usize, Vec<String>)>,
    answers: Arc<Mutex<BTreeMap<String, usize>>>,
    last_failure: Arc<Mutex<Option<Instant>>>,
}

impl Load {
    /// `clients` clients, each sending `GET /` to `address` on a new connection every 5 ms.
    pub fn start(address: String, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(BTreeMap::new()));
        let last_failure = Arc::new(Mutex::new(None));
        let unreachable = Arc::new(AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..clients {
            let (address, stop, answers) = (address.clone(), stop.clone(), answers.clone());
            let (last_failure, unreachable) = (last_failure.clone(), unreachable.clone());
            tasks.spawn(async move {
                let (mut sent, mut failures) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    sent += 1;
                    match one_request(&address).await {
                        Ok(answer) => *answers.lock().expect("answers").entry(answer).or_insert(0) += 1,
                        Err(e) => {
                            *last_failure.lock().expect("last failure") = Some(Instant::now());
                            if e.contains("os error 113") && unreachable.fetch_add(1, Ordering::Relaxed) < 3 {
                                println!("node: {}", no_route_to_host(&address).await);
                            }
                            failures.push(e);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                (sent, failures)
            });
        }
        Load { stop, tasks, answers, last_failure }
    }

    /// When the last request failed, if one did.
    pub fn last_failure(&self) -> Option<Instant> {
        *self.last_failure.lock().expect("last failure")
    }

    /// How many requests got each answer so far.
    pub fn answers(&self) -> BTreeMap<String, usize> {
        self.answers.lock().expect("answers").clone()
    }

    /// The answers the clients got during the next `window`.
    pub async fn answers_within(&self, window: Duration) -> BTreeMap<String, usize> {
        let before = self.answers();
        tokio::time::sleep(window).await;
        self.answers_since(&before)
    }

    /// The answers the clients got since [`answers`](Self::answers) gave `before`.
    pub fn answers_since(&self, before: &BTreeMap<String, usize>) -> BTreeMap<String, usize> {
        self.answers()
            .into_iter()
            .map(|(answer, n)| {
                let earlier = before.get(&answer).copied().unwrap_or(0);
                (answer, n - earlier)
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Stops the clients: how many requests they sent, and every failure.
    pub async fn finish(self) -> (usize, Vec<String>) {
        let stopped = self.stop().await;
        (stopped.sent, stopped.failures)
    }

    /// Stops the clients, and returns all they did, requests in flight included.
    pub async fn stop(self) -> Stopped {
        self.stop.store(true, Ordering::Relaxed);
        let (sent, failures) =
            self.tasks.join_all().await.into_iter().fold((0, Vec::new()), |(sent, mut failed), (s, f)| {
                failed.extend(f);
                (sent + s, failed)
            });
        let answers = self.answers.lock().expect("answers").clone();
        let last_failure = *self.last_failure.lock().expect("last failure");
        Stopped { sent, failures, answers, last_failure }
    }

    /// Stops the clients, prints how many requests they sent `context` (say, "while scaling")
    /// and how many failed, and fails the scenario if any did, with the first ten errors.
    /// Returns how many were sent.
    pub async fn assert_no_failures(self, context: &str) -> usize {
        let (sent, failures) = self.finish().await;
        assert_no_failures(context, sent, &failures);
        sent
    }
}

/// What the host had for a connect to `address` that found no route to host (EHOSTUNREACH:
/// on the node suite's host, an ARP that went unanswered): its connections to that address
/// still waiting for an answer, as conntrack holds them (the reply's source says where the
/// SYN went: a pod if kube-proxy rewrote a cluster IP, the address itself if not), and the
/// neighbours it could not reach. Printed by [`Load`] for its first three. The one it caught
/// at a front Service was a conntrack entry left untranslated by an earlier connect, made
/// before kube-proxy had synced the Service, and met again on the same source port;
/// `host.sh` now refuses such connects before their entry is kept.
async fn no_route_to_host(address: &str) -> String {
    let ip = address.rsplit_once(':').map_or(address, |(ip, _)| ip).to_string();
    let capture = tokio::task::spawn_blocking(move || {
        let run = |program: &str, args: &[&str]| {
            std::process::Command::new(program)
                .args(args)
                .output()
                .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
                .unwrap_or_else(|e| format!("({program}: {e})"))
        };
        let waiting = run("conntrack", &["-L", "-p", "tcp", "--orig-dst", &ip, "--state", "SYN_SENT"]);
        let neighbours = run("ip", &["neigh", "show", "nud", "failed"]);
        format!(
            "the host's connections to {ip} waiting for an answer: [{waiting}]; unreachable neighbours: [{neighbours}]"
        )
    });
    let capture = capture.await.unwrap_or_else(|e| format!("(no capture: {e})"));
    format!("no route to host at {address}; {capture}")
}

/// What a [`Load`]'s clients did until stopped.
pub struct Stopped {
    pub sent: usize,
    /// Every failed request's error.
    pub failures: Vec<String>,
    /// How many requests got each answer.
    pub answers: BTreeMap<String, usize>,
    /// When the last request failed, if one did.
    pub last_failure: Option<Instant>,
}

/// Prints how many of `sent` requests failed `context`, and panics if any did, with the first
/// ten errors. For callers that read the load's answers after stopping it.
pub fn assert_no_failures(context: &str, sent: usize, failures: &[String]) {
    println!("node: {sent} requests {context}, {} failed", failures.len());
    assert!(
        failures.is_empty(),
        "{} of {sent} failed {context}: {:?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
}

/// Connections opened once and kept open: each sends `GET /` (HTTP/1.1 keep-alive) every
/// second and checks that the same backend answers every time.
pub struct Held {
    stop: Arc<AtomicBool>,
    tasks: tokio::task::JoinSet<Result<(String, usize), String>>,
}

impl Held {
    /// `count` connections to `address`, each with its first answer in.
    pub async fn open(address: &str, count: usize) -> Held {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..count {
            let (address, stop) = (address.to_string(), stop.clone());
            let mut stream = tokio::net::TcpStream::connect(&address).await.expect("a held connection");
            let first = exchange(&mut stream).await.expect("a held connection's first answer");
            tasks.spawn(async move {
                let mut exchanges = 1;
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let answer =
                        exchange(&mut stream).await.map_err(|e| format!("after {exchanges} exchanges: {e}"))?;
                    if answer != first {
                        return Err(format!("answered by {first:?}, then by {answer:?}"));
                    }
                    exchanges += 1;
                }
                Ok((first, exchanges))
            });
        }
        Held { stop, tasks }
    }

    /// Stops the exchanges; every connection must still be open, and on its first backend: how
    /// many were held to each backend.
    pub async fn assert_kept(self, context: &str) -> BTreeMap<String, usize> {
        self.stop.store(true, Ordering::Relaxed);
        let results = self.tasks.join_all().await;
        let broken: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        let mut backends = BTreeMap::new();
        for (backend, _) in results.iter().flatten() {
            *backends.entry(backend.clone()).or_insert(0) += 1;
        }
        let exchanges: usize = results.iter().flatten().map(|(_, n)| n).sum();
        println!(
            "node: {} connections held {context}: {exchanges} exchanges, by backend {backends:?}, {} broken",
            results.len(),
            broken.len()
        );
        assert!(broken.is_empty(), "held connections broken {context}: {broken:?}");
        backends
    }
}

/// One keep-alive request on `stream`: the body's first line.
async fn exchange(stream: &mut tokio::net::TcpStream) -> Result<String, String> {
    let io = async {
        stream.write_all(b"GET / HTTP/1.1\r\nHost: balancer\r\n\r\n").await.map_err(|e| e.to_string())?;
        let mut reply = Vec::with_capacity(256);
        let mut buffer = [0u8; 1024];
        loop {
            let n = stream.read(&mut buffer).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err(format!("closed; had {:?}", String::from_utf8_lossy(&reply)));
            }
            reply.extend_from_slice(&buffer[..n]);
            let text = String::from_utf8_lossy(&reply);
            let Some((head, body)) = text.split_once("\r\n\r\n") else { continue };
            let length = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                .and_then(|v| v.parse::<usize>().ok())
                .ok_or_else(|| format!("no Content-Length in {head:?}"))?;
            if body.len() >= length {
                return Ok(body.lines().next().unwrap_or_default().to_string());
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), io).await.map_err(|_| "timed out".to_string())?
}

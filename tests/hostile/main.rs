//! Hostile clients against the real `balancer` binary.
//!
//! Every test starts its own `balancer run` process (webhooks only, dev
//! certificates, ephemeral loopback ports), attacks it the way a buggy or
//! malicious client inside the cluster could, and asserts a bound on what the
//! attack costs the server: memory (peak `VmHWM` minus the `VmRSS` baseline
//! after a warm-up, both from `/proc/<pid>/status`), the size of an answer, or
//! the latency a well-behaved client sees while the attack is under way.
//!
//! Run with `--nocapture` to see the figures (lines starting `hostile:`).
//! Set `BALANCER_BIN` to attack another build, e.g. `target/release/balancer`.
//! The tests take a file-wide lock so that memory and latency figures are not
//! disturbed by each other even when the harness runs tests in parallel.

#[path = "../support/mod.rs"]
mod support;

mod rows;
mod starvation;

use std::any::Any;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use serde_json::{Value, json};
use support::fixtures::sample_json as sample_balancer;
use support::review;
use tempfile::TempDir;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Mutex, MutexGuard};
use tokio::task::JoinSet;

/// Longest any single measured request may take before it counts as "not answered".
/// Long enough to see today's figures (the server's own timeouts are 10 s and 30 s),
/// short enough that a failing row fails in seconds, not minutes.
pub(crate) const MEASURE_CAP: Duration = Duration::from_secs(15);

/// Largest body the server accepts by default (1 MiB); hostile bodies stay under it.
const BODY_BUDGET: usize = 1_000_000;

const MIB: f64 = 1024.0 * 1024.0;

// ---------------------------------------------------------------------------
// The server under attack
// ---------------------------------------------------------------------------

/// Serialises the tests of this file: each measures one server's memory and latency
/// on a 2-core machine, which another attack running alongside would distort.
/// (An async mutex: the guard is held across awaits, and a panicking test releases it.)
pub(crate) async fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::const_new(());
    LOCK.lock().await
}

/// The binary to attack: `BALANCER_BIN` if set (e.g. a release build), else this crate's.
fn binary() -> PathBuf {
    std::env::var_os("BALANCER_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_balancer")))
}

/// A child process, killed and reaped on drop: also when a test panics.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running `balancer run` process and the client configuration that trusts it.
pub(crate) struct Server {
    child: KillOnDrop,
    webhook: SocketAddr,
    probe: SocketAddr,
    dir: TempDir,
    tls: Arc<rustls::ClientConfig>,
}

impl Server {
    /// Starts the binary and waits until `/healthz` answers; retries when the ports
    /// picked were taken by someone else in between.
    async fn start() -> Server {
        support::install_crypto_provider();
        let mut last = String::new();
        for _ in 0..3 {
            match Server::start_once().await {
                Ok(server) => return server,
                Err(why) => last = why,
            }
        }
        panic!("balancer did not start: {last}");
    }

    async fn start_once() -> Result<Server, String> {
        let dir = TempDir::new().expect("temp dir");
        let [webhook, probe] = support::ports::listen_ports().map(|port| SocketAddr::from(([127, 0, 0, 1], port)));
        let log_path = dir.path().join("balancer.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        let child = support::without_a_cluster(&mut Command::new(binary()))
            .args(["run", "--webhook-addr", &webhook.to_string(), "--probe-addr", &probe.to_string()])
            .args(["--disable-controller", "--insecure-metrics", "--log-level", "warn", "--dev-cert-dir"])
            .arg(dir.path().join("certs"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary().display()));
        let mut child = KillOnDrop(child);
        wait_healthy(&mut child.0, probe)
            .await
            .map_err(|why| format!("{why}; its log:\n{}", std::fs::read_to_string(&log_path).unwrap_or_default()))?;
        // The dev certificates are written before the server listens.
        let tls = Arc::new(support::client_config(&dir.path().join("certs").join("ca.crt")));
        Ok(Server { child, webhook, probe, dir, tls })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("balancer.log")).unwrap_or_default()
    }

    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.webhook.port())
    }

    /// A new reqwest client, so its first request goes over a fresh TLS connection.
    fn client(&self, timeout: Duration) -> reqwest::Client {
        reqwest::Client::builder()
            .tls_backend_preconfigured((*self.tls).clone())
            .timeout(timeout)
            .build()
            .expect("client")
    }

    /// A raw TLS connection to the webhook port, connect and handshake bounded to 10 s.
    async fn tls_connect(&self) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let connect = async {
            let tcp = TcpStream::connect(self.webhook).await?;
            self.tls_handshake(tcp).await
        };
        tokio::time::timeout(Duration::from_secs(10), connect).await.map_err(std::io::Error::other)?
    }

    /// The TLS handshake on `tcp`, a connection to the webhook port, bounded to 10 s.
    async fn tls_handshake(&self, tcp: TcpStream) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let connector = tokio_rustls::TlsConnector::from(self.tls.clone());
        let handshake = connector.connect("127.0.0.1".try_into().expect("server name"), tcp);
        tokio::time::timeout(Duration::from_secs(10), handshake).await.map_err(std::io::Error::other)?
    }

    /// The server's metrics (`--insecure-metrics`: on the probe port).
    async fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.probe);
        let response = reqwest::get(url).await.expect("a scrape");
        response.text().await.expect("the exposition")
    }

    /// The server's `VmRSS` and `VmHWM` (peak RSS), in bytes.
    fn memory(&self) -> Memory {
        let pid = self.child.0.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/<pid>/status");
        let field = |name: &str| -> u64 {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in status"));
            let kib: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().expect("a number of kB");
            kib * 1024
        };
        Memory { rss: field("VmRSS:"), peak: field("VmHWM:") }
    }

    /// A few ordinary reviews, so that the baseline includes what serving one costs.
    async fn warm_up(&self) -> Memory {
        let client = self.client(Duration::from_secs(10));
        for _ in 0..5 {
            let response = client.post(self.url("/validate")).json(&normal_review()).send().await.expect("warm-up");
            assert_eq!(response.status().as_u16(), 200, "a normal review is answered");
            response.bytes().await.expect("warm-up answer");
        }
        self.memory()
    }

    /// Asserts that the server process is still alive (an attack may have killed it).
    fn assert_alive(&mut self, row: &str) {
        if let Some(status) = self.child.0.try_wait().expect("try_wait") {
            panic!("{row}: the server died during the attack ({status}); its log:\n{}", self.log());
        }
    }
}

/// Polls `/healthz` on the probe port for up to 30 s; reports an early exit.
async fn wait_healthy(child: &mut Child, probe: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Err(format!("exited with {status}"));
        }
        if let Ok(Ok(line)) = tokio::time::timeout(Duration::from_secs(1), http_get(probe, "/healthz")).await
            && line.contains(" 200 ")
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("/healthz did not answer 200 within 30 s".into())
}

/// Memory of the server process, in bytes.
#[derive(Clone, Copy, Debug)]
struct Memory {
    rss: u64,
    peak: u64,
}

/// How far the peak after an attack rose above the warm baseline, in bytes.
pub(crate) fn growth(baseline: Memory, after: Memory) -> u64 {
    after.peak.saturating_sub(baseline.rss)
}

pub(crate) fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB
}

// ---------------------------------------------------------------------------
// Well-behaved clients, and timing them
// ---------------------------------------------------------------------------

/// A valid Balancer in a CREATE review: what the API server sends all day.
pub(crate) fn normal_review() -> Value {
    review("CREATE", sample_balancer())
}

/// Runs `work` for at most `cap`; returns its output (`None` if cut off) and how long it took.
pub(crate) async fn timed<T>(cap: Duration, work: impl Future<Output = T>) -> (Option<T>, Duration) {
    let started = Instant::now();
    let output = tokio::time::timeout(cap, work).await.ok();
    (output, started.elapsed())
}

/// One normal review over a fresh TLS connection: the HTTP status, or why there is none.
pub(crate) async fn review_on_fresh_connection(server: &Server) -> Result<u16, String> {
    let client = server.client(MEASURE_CAP);
    let response =
        client.post(server.url("/validate")).json(&normal_review()).send().await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    response.bytes().await.map_err(|e| e.to_string())?;
    Ok(status)
}

/// `GET path` over a fresh plain TCP connection; returns the status line.
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut tcp = TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await?;
    read_status_line(&mut tcp).await
}

/// Reads until the end of the first line of a response (at most 1 KiB).
async fn read_status_line<R: AsyncRead + Unpin>(reader: &mut R) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 256];
    while !line.windows(2).any(|w| w == b"\r\n") && line.len() < 1024 {
        let n = reader.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        line.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&line);
    Ok(text.split("\r\n").next().unwrap_or_default().to_string())
}

/// Describes the outcome of a timed request for the figures line.
pub(crate) fn describe<T: std::fmt::Debug, E: std::fmt::Display>(
    result: &Option<Result<T, E>>,
    took: Duration,
) -> String {
    match result {
        None => format!("no answer within {} ms", MEASURE_CAP.as_millis()),
        Some(Err(e)) => format!("failed after {} ms: {e}", took.as_millis()),
        Some(Ok(v)) => format!("{v:?} after {} ms", took.as_millis()),
    }
}

// ---------------------------------------------------------------------------
// Hostile clients
// ---------------------------------------------------------------------------

/// Fails with the reason up front, rather than with "Too many open files" midway, when this
/// process (and the server, which inherits its limits) may not hold `needed` sockets.
pub(crate) fn require_open_files(needed: u64) {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("read /proc/self/limits");
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|soft| soft.parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    assert!(soft >= needed, "this row needs at least {needed} open files (ulimit -n); the soft limit is {soft}");
}

/// Opens `count` TCP connections to `addr` that never send a byte; each connect is
/// bounded to 5 s (a full listen backlog makes connects hang). Returns the open ones.
pub(crate) async fn idle_connections(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut open = Vec::with_capacity(count);
    for _ in 0..count {
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr)).await {
            Ok(Ok(tcp)) => open.push(tcp),
            Ok(Err(e)) => panic!("idle connection {} failed: {e}", open.len()),
            Err(_) => break,
        }
    }
    open
}

/// Where row 1 hides its tiny objects.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PadAt {
    /// `request.object.spec.x`: an unknown field of the Balancer spec.
    Spec,
    /// `request.object.metadata.x`: an unknown field of the object's metadata.
    Metadata,
    /// `request.x`: an unknown field of the AdmissionRequest itself.
    Request,
    /// `spec.proxy.affinity`'s node selector terms: a Kubernetes type the spec does read.
    Affinity,
}

/// A review just under the body limit whose bulk is `[{"a":0},{"a":0},…]` at `at`:
/// 8 bytes on the wire per object, far more once parsed into a JSON tree.
pub(crate) fn tiny_objects_review(at: PadAt) -> Vec<u8> {
    const MARK: &str = "@@TINY-OBJECTS@@";
    let object = json!({
        "apiVersion": "exposer.hliangzhao.io/v1beta1",
        "kind": "Balancer",
        "metadata": {"name": "tiny", "namespace": "default"},
        "spec": {"ports": [{"port": 80}], "backends": [{"name": "a", "selector": {"app": "a"}}]}
    });
    let mut review = review("CREATE", object);
    let slot = match at {
        PadAt::Spec => &mut review["request"]["object"]["spec"],
        PadAt::Metadata => &mut review["request"]["object"]["metadata"],
        PadAt::Request => &mut review["request"],
        PadAt::Affinity => &mut review["request"]["object"]["spec"]["proxy"]["affinity"]["nodeAffinity"],
    };
    match at {
        PadAt::Affinity => {
            slot["requiredDuringSchedulingIgnoredDuringExecution"] = json!({"nodeSelectorTerms": MARK});
        }
        _ => slot["x"] = json!(MARK),
    }
    let text = serde_json::to_string(&review).expect("serialize");
    let quoted = format!("\"{MARK}\"");
    let room = BODY_BUDGET - 1_000 - (text.len() - quoted.len());
    let body = text.replace(&quoted, &tiny_objects(room));
    assert!(body.len() < BODY_BUDGET, "the hostile body stays under the body limit");
    body.into_bytes()
}

/// A Balancer review whose `metadata.name` is 60,000 DEL characters, with 64 backends.
/// Every backend's derived Service name embeds the Balancer name, so an error list
/// that quotes names in full grows with name length × backends.
pub(crate) fn del_name_review() -> Vec<u8> {
    let backends: Vec<Value> =
        (0..64).map(|i| json!({"name": format!("b{i}"), "selector": {"app": format!("b{i}")}})).collect();
    let object = json!({
        "apiVersion": "exposer.hliangzhao.io/v1beta1",
        "kind": "Balancer",
        "metadata": {"name": "\u{7f}".repeat(60_000), "namespace": "default"},
        "spec": {"ports": [{"name": "http", "port": 80}], "backends": backends}
    });
    let text = serde_json::to_string(&review("CREATE", object)).expect("serialize");
    // serde_json writes DEL raw; written as `\u007f` (as some encoders do) the name
    // costs 6 bytes a character on the wire, in `request.object` and `request.name`.
    text.replace('\u{7f}', "\\u007f").into_bytes()
}

/// "and N more" in a denial message: how many errors it says it left out.
pub(crate) fn left_out_count(message: &str) -> Option<u64> {
    message.match_indices("and ").find_map(|(at, _)| {
        let rest = &message[at + 4..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let after = &rest[digits.len()..];
        (!digits.is_empty() && after.starts_with(" more")).then(|| digits.parse().ok()).flatten()
    })
}

/// Request headers of about `total` bytes, as `X-Pad-N: aaaa…` lines of 4,000 bytes,
/// without the blank line that would end them: the server must buffer or refuse them.
/// Lines are long and few (about 90, under hyper's default of 100 headers) so that the
/// byte limit is what is tested, not a header count.
pub(crate) fn padded_headers(total: usize) -> Vec<u8> {
    const LINE: usize = 4_000;
    let mut block = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n".to_vec();
    let mut n = 0;
    while block.len() + LINE <= total {
        let name = format!("X-Pad-{n}: ");
        block.extend_from_slice(name.as_bytes());
        block.extend(std::iter::repeat_n(b'a', LINE - name.len() - 2));
        block.extend_from_slice(b"\r\n");
        n += 1;
    }
    block
}

/// Writes `block` to `stream` (bounded to 20 s) and hands the stream back to be held open.
/// A server that refuses early may cut the write short: that is reported, not a failure.
pub(crate) async fn send_headers<S>(mut stream: S, block: Arc<Vec<u8>>) -> (Box<dyn Any + Send>, &'static str)
where
    S: AsyncWrite + Unpin + Send + 'static,
{
    let send = async {
        stream.write_all(&block).await?;
        stream.flush().await
    };
    let outcome = match tokio::time::timeout(Duration::from_secs(20), send).await {
        Ok(Ok(())) => "sent",
        Ok(Err(_)) => "cut off",
        Err(_) => "stalled",
    };
    (Box::new(stream), outcome)
}

/// Sends `block` and the blank line ending the headers, reading the answer while
/// writing (a server that refuses early closes before the client is done), and
/// returns the status line.
pub(crate) async fn status_for_headers<S>(stream: S, block: Arc<Vec<u8>>) -> Result<String, String>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(stream);
    let write = tokio::spawn(async move {
        let _ = writer.write_all(&block).await;
        let _ = writer.write_all(b"\r\n").await;
        let _ = writer.flush().await;
        writer
    });
    let read = tokio::time::timeout(Duration::from_secs(10), read_status_line(&mut reader)).await;
    write.abort();
    match read {
        Err(_) => Err("no status line within 10 s".into()),
        Ok(Err(e)) => Err(format!("read failed: {e}")),
        Ok(Ok(line)) if line.is_empty() => Err("closed without a status line".into()),
        Ok(Ok(line)) => Ok(line),
    }
}

/// Sends `count` POSTs of `body` to `path` at once, and tallies their outcomes: `name(status,
/// answer)` for an answer, `cut off while sending` for a server that refused early (503, 408)
/// and closed before the body was all sent, else the error.
pub(crate) fn post_concurrently(
    server: &Server,
    path: &str,
    body: &Bytes,
    count: usize,
    name: fn(u16, Bytes) -> String,
) -> impl Future<Output = BTreeMap<String, usize>> + Send + 'static {
    let client = server.client(Duration::from_secs(60));
    let mut posts = JoinSet::new();
    for _ in 0..count {
        let request =
            client.post(server.url(path)).header(reqwest::header::CONTENT_TYPE, "application/json").body(body.clone());
        posts.spawn(async move {
            match request.send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    match response.bytes().await {
                        Ok(answer) => name(status, answer),
                        Err(e) => format!("{status} with an unreadable body: {e}"),
                    }
                }
                Err(e) if e.is_request() && !e.is_timeout() => "cut off while sending".to_string(),
                Err(e) => format!("error: {e}"),
            }
        });
    }
    async move { tally(posts.join_all().await) }
}

/// Counts equal outcomes, for a compact figures line.
pub(crate) fn tally<I: IntoIterator<Item = String>>(outcomes: I) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for outcome in outcomes {
        *counts.entry(outcome).or_insert(0) += 1;
    }
    counts
}

/// A fresh, warmed-up server for a row that measures memory, with the guard that keeps every
/// other row off the machine meanwhile, and the server's memory before the attack.
pub(crate) async fn alone_and_warm() -> (MutexGuard<'static, ()>, Server, Memory) {
    let alone = one_at_a_time().await;
    let server = Server::start().await;
    let baseline = server.warm_up().await;
    (alone, server, baseline)
}

/// What an attack cost the server's memory.
struct Growth {
    baseline: Memory,
    after: Memory,
    /// Bytes grown over the baseline.
    bytes: u64,
}

impl std::fmt::Display for Growth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (baseline, peak, grew) = (mib(self.baseline.rss), mib(self.after.peak), mib(self.bytes));
        write!(f, "RSS baseline {baseline:.1} MiB, peak {peak:.1} MiB, growth {grew:.1} MiB")
    }
}

/// After an attack: the server must still run; what the attack cost its memory.
pub(crate) fn after_attack(server: &mut Server, row: &str, baseline: Memory) -> Growth {
    server.assert_alive(row);
    let after = server.memory();
    Growth { baseline, after, bytes: growth(baseline, after) }
}

/// A JSON array of `{"a":0}` objects, `bytes` long at most.
pub(crate) fn tiny_objects(bytes: usize) -> String {
    let count = bytes / 8;
    let mut pad = String::with_capacity(count * 8 + 2);
    pad.push('[');
    for i in 0..count {
        pad.push_str(if i == 0 { "{\"a\":0}" } else { ",{\"a\":0}" });
    }
    pad.push(']');
    pad
}

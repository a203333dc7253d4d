//! The rendered `nginx.conf` under a real nginx, with real sockets on 127.0.0.0/8.
//!
//! (a) TCP: the original sample's 40/20/40 split over 500 connections, and a
//!     weight-0 (`down`) backend that must receive nothing;
//! (b) UDP: datagrams proxied to per-backend echo servers, split by weight, and
//!     TCP and UDP on the same port number side by side;
//! (c) `nginx -t` accepts every rendered config in a table of specs;
//! (d) one-shot UDP clients (DNS-like) that must not exhaust nginx's connections;
//! (e) `sessionAffinity: ClientIP`: one client address always reaches the same backend,
//!     and many client addresses still split by weight;
//! (f) passive health: a backend refusing connections is tried once per `failTimeout`
//!     with `maxFails: 1`, and on every connection with `maxFails: 0`;
//! (g) the metrics sidecar counting what nginx logs;
//! (h) least connections, a backup, `maxConnections` across workers, the PROXY protocol both
//!     ways, and `nginx -t` over generated mixes of those settings;
//! and (i) an IPv6 client, in a network namespace of the test's own.
//!
//! nginx is run from the `PATH` (`support::have_tool`): these tests skip loudly
//! outside CI when it (or its stream module) is missing and fail in CI. On
//! Debian the stream module is dynamic, so nginx reads a small wrapper config:
//! `load_module <stream module>; include <rendered file>;`.

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use balancer::api::{BackendSpec, BalancerPort, BalancerSpec};
use balancer::exporter;
use balancer::proxy::model::{Destination, MODEL_FILE, ProxyConfig, ServiceUpstreams, Targets};
use balancer::proxy::nginx;
use balancer::spec::ObjectName;
use balancer::spec::SpecPolicy;
use balancer::spec::{Admitted, AdmittedPort, admit};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use support::fixtures::{backend, port};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

/// Bound on every single network await.
const STEP: Duration = Duration::from_secs(5);
/// How long nginx may take to start, to check a config, or to stop.
const NGINX_DEADLINE: Duration = Duration::from_secs(10);
/// The loopback addresses standing in for the backends, in backend order.
const BACKEND_IPS: [Ipv4Addr; 3] =
    [Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3), Ipv4Addr::new(127, 0, 0, 4)];

// ---------------------------------------------------------------------------
// Finding nginx and its stream module
// ---------------------------------------------------------------------------

/// An nginx binary that can run the rendered config.
struct NginxBinary {
    /// The stream module to `load_module`, when it is dynamic (Debian, Ubuntu, Fedora).
    stream_module: Option<PathBuf>,
}

/// The usable nginx, or `None` (loudly) outside CI; panics in CI when it is missing or unusable.
fn nginx_binary() -> Option<NginxBinary> {
    if !support::have_tool("nginx") {
        return None;
    }
    let out = Command::new("nginx").arg("-V").output().expect("nginx -V runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    let version = text
        .split("nginx/")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(|v| v.split('.').map(|n| n.parse::<u32>().unwrap_or(0)).collect::<Vec<_>>())
        .unwrap_or_default();
    // `-e` (error log on the command line, as the proxy pods use it) arrived in nginx 1.19.5.
    if version < vec![1, 19, 5] {
        return unusable(&format!("nginx >= 1.19.5 is required (for -e), found {version:?}"));
    }
    let args: Vec<&str> = text.split_whitespace().collect();
    if args.contains(&"--with-stream") {
        return Some(NginxBinary { stream_module: None });
    }
    if !args.contains(&"--with-stream=dynamic") {
        return unusable("nginx is built without the stream module");
    }
    let configured = |flag: &str| args.iter().find_map(|a| a.strip_prefix(flag)).map(PathBuf::from);
    let mut dirs: Vec<PathBuf> = configured("--modules-path=").into_iter().collect();
    dirs.extend(configured("--prefix=").map(|p| p.join("modules")));
    for fallback in ["/usr/lib/nginx/modules", "/usr/lib64/nginx/modules", "/etc/nginx/modules"].map(PathBuf::from) {
        if !dirs.contains(&fallback) {
            dirs.push(fallback);
        }
    }
    match dirs.iter().map(|d| d.join("ngx_stream_module.so")).find(|m| m.is_file()) {
        Some(module) => Some(NginxBinary { stream_module: Some(module) }),
        None => unusable(&format!(
            "nginx's stream module is dynamic but ngx_stream_module.so is in none of {dirs:?} \
             (Debian: apt-get install libnginx-mod-stream)"
        )),
    }
}

fn unusable(why: &str) -> Option<NginxBinary> {
    assert!(std::env::var_os("CI").is_none(), "{why}; nginx with the stream module is required in CI");
    eprintln!("SKIPPED: {why}");
    None
}

/// A scratch prefix holding the rendered file, the wrapper nginx reads, its log and pid file.
struct Prefix {
    dir: TempDir,
}

impl Prefix {
    fn new(bin: &NginxBinary, rendered: &str) -> Prefix {
        let dir = TempDir::new().expect("temp dir");
        let conf = dir.path().join(nginx::CONFIG_FILE);
        fs::write(&conf, rendered).expect("write nginx.conf");
        let mut wrapper = String::new();
        if let Some(module) = &bin.stream_module {
            wrapper.push_str(&format!("load_module {};\n", module.display()));
        }
        wrapper.push_str(&format!("include {};\n", conf.display()));
        fs::write(dir.path().join("wrapper.conf"), wrapper).expect("write wrapper");
        Prefix { dir }
    }

    fn path(&self, file: &str) -> String {
        self.dir.path().join(file).to_str().expect("utf-8 temp path").to_string()
    }

    /// `nginx -p <prefix> -c <wrapper> -e stderr` plus `extra` and the `-g` directives.
    fn command(&self, extra: &[&str], directives: &str) -> Command {
        self.command_in(None, extra, directives)
    }

    /// [`Self::command`], in the network namespace `netns` when given (`ip netns exec` execs
    /// nginx, so the child's pid is nginx's).
    fn command_in(&self, netns: Option<&str>, extra: &[&str], directives: &str) -> Command {
        let mut command = match netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns, "nginx"]);
                command
            }
            None => Command::new("nginx"),
        };
        command.args(extra).args(["-p", &self.path(""), "-c", &self.path("wrapper.conf"), "-e", "stderr", "-g"]);
        command.arg(format!("{directives} pid {};", self.path("nginx.pid")));
        let log = fs::File::create(self.path("stderr.log")).expect("log file");
        command.stdin(Stdio::null()).stdout(log.try_clone().expect("log file")).stderr(log);
        command
    }

    fn log(&self) -> String {
        fs::read_to_string(self.path("stderr.log")).unwrap_or_default()
    }
}

/// `nginx -t` on `rendered`: `Err(nginx's output)` when it rejects it.
fn nginx_check(bin: &NginxBinary, rendered: &str) -> Result<(), String> {
    let prefix = Prefix::new(bin, rendered);
    let mut child = prefix.command(&["-t"], "").spawn().expect("spawn nginx -t");
    let deadline = Instant::now() + NGINX_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for nginx -t") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("nginx -t did not finish in {NGINX_DEADLINE:?}\n{}", prefix.log()));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if status.success() { Ok(()) } else { Err(format!("nginx -t: {status}\n{}", prefix.log())) }
}

// ---------------------------------------------------------------------------
// A running nginx
// ---------------------------------------------------------------------------

/// nginx in the foreground in its own process group; stopped (and its workers with it) on drop.
struct Nginx {
    child: Child,
    prefix: Prefix,
}

impl Nginx {
    /// Starts nginx on `rendered` and waits until its listening sockets exist:
    /// the master writes its pid file after binding them and before forking workers,
    /// so traffic sent after that waits in the sockets' queues instead of being refused.
    async fn start(bin: &NginxBinary, rendered: &str) -> Result<Nginx, String> {
        Nginx::start_in(None, bin, rendered).await
    }

    /// [`Self::start`] in the network namespace `netns`, when given.
    async fn start_in(netns: Option<&str>, bin: &NginxBinary, rendered: &str) -> Result<Nginx, String> {
        let prefix = Prefix::new(bin, rendered);
        let child = prefix.command_in(netns, &[], "daemon off;").process_group(0).spawn().expect("spawn nginx");
        let mut nginx = Nginx { child, prefix };
        let pid_file = nginx.prefix.path("nginx.pid");
        let deadline = Instant::now() + NGINX_DEADLINE;
        loop {
            if let Some(status) = nginx.child.try_wait().expect("poll nginx") {
                return Err(format!("nginx exited at startup: {status}\n{}", nginx.prefix.log()));
            }
            let written = fs::read_to_string(&pid_file).unwrap_or_default();
            if written.trim() == nginx.child.id().to_string() {
                return Ok(nginx);
            }
            if Instant::now() > deadline {
                return Err(format!("nginx did not start in {NGINX_DEADLINE:?}\n{}", nginx.prefix.log()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Worker processes (they share each upstream's state through its `zone`).
    fn workers(&self) -> usize {
        let master = self.child.id().to_string();
        let entries = fs::read_dir("/proc").expect("read /proc");
        entries
            .filter_map(|entry| fs::read_to_string(entry.ok()?.path().join("stat")).ok())
            // `pid (comm) state ppid ...`: the fields after the last ')'.
            .filter(|stat| stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(1)) == Some(&master))
            .count()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let pid = self.child.id();
        // SIGTERM: nginx's fast shutdown stops the workers, then the master exits.
        signal("TERM", &pid.to_string());
        let deadline = Instant::now() + NGINX_DEADLINE;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        // Whatever happened, nothing of the group (pgid = master pid) survives the test.
        signal("KILL", &format!("-{pid}"));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(name: &str, target: &str) {
    let _ = Command::new("sh")
        .args(["-c", &format!("kill -s {name} -- {target} 2>/dev/null")])
        .stdin(Stdio::null())
        .status();
}

/// Renders `spec` (with `port` as its first listen port) and starts nginx on it,
/// retrying with a fresh port if another process took the one picked.
async fn start_nginx(bin: &NginxBinary, free_port: impl Fn() -> u16, render: impl Fn(u16) -> String) -> (Nginx, u16) {
    let mut failures = Vec::new();
    for _ in 0..3 {
        let port = free_port();
        match Nginx::start(bin, &render(port)).await {
            Ok(nginx) => return (nginx, port),
            Err(log) if log.contains("Address already in use") => failures.push(log),
            Err(log) => panic!("{log}\n--- rendered ---\n{}", render(port)),
        }
    }
    panic!("no free port after 3 tries:\n{}", failures.join("\n"));
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// A port number free for both TCP and UDP.
fn free_dual_port() -> u16 {
    (0..100)
        .map(|_| free_tcp_port())
        .find(|&port| std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok())
        .expect("a port free for TCP and UDP")
}

// ---------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------

/// One test server per backend, answering with its own name and counting what it served.
struct Backend {
    name: String,
    addr: SocketAddr,
    served: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections on `ip`, writes `reply` on each and closes it.
async fn tcp_backend(name: &str, ip: Ipv4Addr, reply: String) -> Backend {
    let listener = TcpListener::bind((ip, 0)).await.expect("bind TCP backend");
    let addr = listener.local_addr().expect("addr");
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let reply = reply.clone();
            tokio::spawn(async move {
                let _ = timeout(STEP, async {
                    stream.write_all(reply.as_bytes()).await?;
                    stream.shutdown().await
                })
                .await;
            });
        }
    });
    Backend { name: name.to_string(), addr, served, task }
}

/// Answers every datagram on `ip` with `reply`.
async fn udp_backend(name: &str, ip: Ipv4Addr, reply: String) -> Backend {
    let socket = UdpSocket::bind((ip, 0)).await.expect("bind UDP backend");
    let addr = socket.local_addr().expect("addr");
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    let task = tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        while let Ok((_, from)) = socket.recv_from(&mut buf).await {
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = socket.send_to(reply.as_bytes(), from).await;
        }
    });
    Backend { name: name.to_string(), addr, served, task }
}

/// Where nginx reaches each backend: its own loopback address and server port.
fn addresses(backends: &[Backend]) -> impl Fn(&BackendSpec, &BalancerPort) -> Destination + '_ {
    move |backend: &BackendSpec, _: &BalancerPort| {
        let server = backends.iter().find(|b| b.name == backend.name).expect("a server per backend");
        Destination::Address(server.addr)
    }
}

/// One TCP connection through nginx: what the backend answered.
async fn tcp_ask(port: u16) -> String {
    timeout(STEP, async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.expect("connect to nginx");
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.expect("read reply");
        reply
    })
    .await
    .expect("reply through nginx in time")
}

/// One datagram through nginx from a fresh socket, i.e. a fresh nginx UDP session
/// (nginx keys sessions by client address and port): the reply, and the socket.
///
/// Callers that count picks keep the sockets until the end, so the kernel cannot hand
/// an earlier client's port to a later one, whose datagram would then join the earlier,
/// still open session instead of being balanced.
async fn udp_ask(port: u16) -> (String, UdpSocket) {
    timeout(STEP, async {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind client");
        socket.connect(("127.0.0.1", port)).await.expect("connect");
        socket.send(b"who are you?").await.expect("send");
        let mut buf = [0u8; 1500];
        let n = socket.recv(&mut buf).await.expect("recv");
        (String::from_utf8_lossy(&buf[..n]).into_owned(), socket)
    })
    .await
    .expect("datagram answered through nginx in time")
}

fn tally(replies: impl IntoIterator<Item = String>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for reply in replies {
        *counts.entry(reply).or_insert(0) += 1;
    }
    counts
}

// ---------------------------------------------------------------------------
// What nginx's weighted round-robin promises
// ---------------------------------------------------------------------------

/// nginx's smooth weighted round-robin (`ngx_stream_upstream_get_peer`), for `picks` picks:
/// each live peer's current weight grows by its weight, the largest (first on ties)
/// is picked and loses the total. `down` (weight 0) peers are skipped.
fn smooth_wrr(weights: &[i32], picks: usize) -> Vec<usize> {
    let mut current = vec![0i64; weights.len()];
    let total: i64 = weights.iter().map(|&w| i64::from(w)).sum();
    let mut order = Vec::with_capacity(picks);
    for _ in 0..picks {
        let mut best: Option<usize> = None;
        for (i, &w) in weights.iter().enumerate() {
            if w == 0 {
                continue;
            }
            current[i] += i64::from(w);
            if best.is_none_or(|b| current[i] > current[b]) {
                best = Some(i);
            }
        }
        let best = best.expect("a live peer");
        current[best] -= total;
        order.push(best);
    }
    order
}

/// The largest amount by which any prefix of one worker's pick sequence is off the
/// exact weighted share, for any peer. The sequence repeats every `sum(weights)` picks.
fn swrr_max_prefix_deviation(weights: &[i32]) -> f64 {
    let total: i32 = weights.iter().sum();
    let mut counts = vec![0usize; weights.len()];
    let mut worst = 0f64;
    for (n, pick) in smooth_wrr(weights, total as usize).into_iter().enumerate() {
        counts[pick] += 1;
        for (i, &w) in weights.iter().enumerate() {
            let exact = (n + 1) as f64 * f64::from(w) / f64::from(total);
            worst = worst.max((counts[i] as f64 - exact).abs());
        }
    }
    worst
}

/// Checks the observed split against `expected` (the exact weighted share of the requests).
///
/// Smooth weighted round-robin is deterministic, not random, so no statistical tolerance
/// is needed: any run of requests is off its exact share by at most
/// `d = swrr_max_prefix_deviation(weights)` per backend (0.6 for 40/20/40). nginx runs
/// several `workers`, and each upstream's `zone` gives them one shared round-robin state, so
/// the total is off by at most `d` too: ±0 requests for 500 over 40/20/40. Without the zone,
/// each worker would keep its own state, and the total could be off by `workers * d`.
fn assert_split(observed: &BTreeMap<String, usize>, expected: &[(&str, usize)], weights: &[i32], workers: usize) {
    let tolerance = swrr_max_prefix_deviation(weights);
    let total: usize = expected.iter().map(|(_, n)| n).sum();
    assert_eq!(observed.values().sum::<usize>(), total, "every request answered once: {observed:?}");
    for (name, want) in expected {
        let got = observed.get(*name).copied().unwrap_or(0);
        assert!(
            (got as f64 - *want as f64).abs() <= tolerance,
            "backend {name}: {got} of {total} requests, expected {want} ± {tolerance:.1} \
             ({workers} workers sharing the upstream's state, weights {weights:?}); observed split {observed:?}"
        );
    }
    assert!(
        observed.keys().all(|name| expected.iter().any(|(e, _)| e == name)),
        "answers from unexpected backends: {observed:?}"
    );
}

#[test]
fn the_swrr_model_matches_nginx_documented_sequence() {
    // nginx's documented example: weights 5, 1, 1 give a a b a c a a (ngx_http_upstream_round_robin.c).
    assert_eq!(smooth_wrr(&[5, 1, 1], 7), vec![0, 0, 1, 0, 2, 0, 0]);
    // The sample: 40/20/40 repeats v1 v3 v2 v1 v3.
    assert_eq!(smooth_wrr(&[40, 20, 40], 10), vec![0, 2, 1, 0, 2, 0, 2, 1, 0, 2]);
    assert!((swrr_max_prefix_deviation(&[40, 20, 40]) - 0.6).abs() < 1e-9);
    assert_eq!(smooth_wrr(&[40, 0, 10], 5), vec![0, 0, 2, 0, 0]);
}

// ---------------------------------------------------------------------------
// Specs
// ---------------------------------------------------------------------------

/// The original project's sample Balancer, listening on `port`.
fn sample_spec(port: u16) -> BalancerSpec {
    let mut spec = support::fixtures::sample_spec();
    spec.ports[0].port = i32::from(port);
    spec
}

/// A spec through the pipeline the controller renders from: defaulted and validated.
fn admitted(spec: BalancerSpec) -> Admitted {
    support::fixtures::admitted("test", spec, &SpecPolicy::default())
}

fn weights(spec: &BalancerSpec) -> Vec<i32> {
    spec.backends.iter().map(BackendSpec::effective_weight).collect()
}

async fn tcp_backends(names: &[&str]) -> Vec<Backend> {
    let mut backends = Vec::new();
    for (name, ip) in names.iter().zip(BACKEND_IPS) {
        backends.push(tcp_backend(name, ip, name.to_string()).await);
    }
    backends
}

async fn udp_backends(names: &[&str]) -> Vec<Backend> {
    let mut backends = Vec::new();
    for (name, ip) in names.iter().zip(BACKEND_IPS) {
        backends.push(udp_backend(name, ip, name.to_string()).await);
    }
    backends
}

fn served(backends: &[Backend]) -> BTreeMap<String, usize> {
    backends.iter().map(|b| (b.name.clone(), b.served.load(Ordering::SeqCst))).filter(|(_, n)| *n > 0).collect()
}

// ---------------------------------------------------------------------------
// (a) TCP
// ---------------------------------------------------------------------------

const REQUESTS: usize = 500;

#[tokio::test]
async fn tcp_sample_splits_500_connections_40_20_40() {
    let Some(bin) = nginx_binary() else { return };
    let backends = tcp_backends(&["v1", "v2", "v3"]).await;
    let address = addresses(&backends);
    let (nginx, listen) = start_nginx(&bin, free_tcp_port, |p| {
        nginx::render("example-balancer", &admitted(sample_spec(p)), &[], None, &address)
    })
    .await;

    let mut replies = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        replies.push(tcp_ask(listen).await);
    }
    let observed = tally(replies);
    let workers = nginx.workers();
    eprintln!("40/20/40 over {REQUESTS} TCP connections, {workers} nginx workers: {observed:?}");

    assert_eq!(served(&backends), observed, "the backends served exactly what the client saw");
    assert_split(&observed, &[("v1", 200), ("v2", 100), ("v3", 200)], &weights(&sample_spec(listen)), workers);
}

#[tokio::test]
async fn tcp_weight_zero_backend_is_down_and_gets_nothing() {
    let Some(bin) = nginx_binary() else { return };
    let backends = tcp_backends(&["v1", "v2", "v3"]).await;
    let address = addresses(&backends);
    let spec = |p| {
        let mut spec = sample_spec(p);
        spec.backends[1].weight = Some(0);
        spec.backends[2].weight = Some(10);
        admitted(spec)
    };
    let (nginx, listen) = start_nginx(&bin, free_tcp_port, |p| {
        let rendered = nginx::render("example-balancer", &spec(p), &[], None, &address);
        assert!(rendered.contains(&format!("server {} down;", backends[1].addr)), "{rendered}");
        rendered
    })
    .await;

    let mut replies = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        replies.push(tcp_ask(listen).await);
    }
    let observed = tally(replies);
    let workers = nginx.workers();
    eprintln!("40/0/10 over {REQUESTS} TCP connections, {workers} nginx workers: {observed:?}");

    assert_eq!(backends[1].served.load(Ordering::SeqCst), 0, "the drained backend was never connected to");
    assert_eq!(served(&backends), observed);
    assert_split(&observed, &[("v1", 400), ("v3", 100)], &weights(&spec(listen)), workers);
}

// ---------------------------------------------------------------------------
// (b) UDP
// ---------------------------------------------------------------------------

/// Each datagram comes from a fresh socket, so it opens a fresh nginx UDP session and
/// is balanced on its own. Sessions linger (proxy_timeout), so keep the count modest.
const DATAGRAMS: usize = 100;

#[tokio::test]
async fn udp_datagrams_are_answered_by_the_backends_by_weight() {
    let Some(bin) = nginx_binary() else { return };
    let backends = udp_backends(&["v1", "v2", "v3"]).await;
    let address = addresses(&backends);
    let spec = |p: u16| {
        admitted(BalancerSpec {
            replicas: None,
            session_affinity: None,
            algorithm: None,
            service: None,
            proxy: None,
            ports: vec![port(Some("dns"), "UDP", i32::from(p))],
            selector: Some(BTreeMap::from([("app".to_string(), "dns".to_string())])),
            backends: vec![backend("v1", 50), backend("v2", 30), backend("v3", 20)],
        })
    };
    let (nginx, listen) = start_nginx(&bin, free_udp_port, |p| {
        let rendered = nginx::render("dns", &spec(p), &[], None, &address);
        assert!(rendered.contains(&format!("listen {p} udp;")), "{rendered}");
        rendered
    })
    .await;

    let mut replies = Vec::with_capacity(DATAGRAMS);
    let mut clients = Vec::with_capacity(DATAGRAMS);
    for _ in 0..DATAGRAMS {
        let (reply, socket) = udp_ask(listen).await;
        replies.push(reply);
        clients.push(socket);
    }
    let observed = tally(replies);
    let workers = nginx.workers();
    eprintln!("50/30/20 over {DATAGRAMS} UDP sessions, {workers} nginx workers: {observed:?}");

    assert_eq!(served(&backends), observed, "every datagram reached exactly one backend, once");
    assert_split(&observed, &[("v1", 50), ("v2", 30), ("v3", 20)], &weights(&spec(listen)), workers);
}

#[tokio::test]
async fn tcp_and_udp_on_the_same_port_number_reach_their_own_servers() {
    let Some(bin) = nginx_binary() else { return };
    let names = ["v1", "v2"];
    let mut tcp = Vec::new();
    let mut udp = Vec::new();
    for (name, ip) in names.iter().zip(BACKEND_IPS) {
        tcp.push(tcp_backend(name, ip, format!("tcp:{name}")).await);
        udp.push(udp_backend(name, ip, format!("udp:{name}")).await);
    }
    let address = |b: &BackendSpec, p: &BalancerPort| {
        let servers = if p.written_protocol() == "UDP" { &udp } else { &tcp };
        Destination::Address(servers.iter().find(|s| s.name == b.name).expect("server").addr)
    };
    let spec = |p: u16| {
        admitted(BalancerSpec {
            replicas: None,
            session_affinity: None,
            algorithm: None,
            service: None,
            proxy: None,
            ports: vec![port(Some("stream"), "TCP", i32::from(p)), port(Some("dgram"), "UDP", i32::from(p))],
            selector: None,
            backends: vec![backend("v1", 1), backend("v2", 1)],
        })
    };
    let (nginx, listen) =
        start_nginx(&bin, free_dual_port, |p| nginx::render("dual", &spec(p), &[], None, &address)).await;

    let mut tcp_replies = Vec::new();
    let mut udp_replies = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..10 {
        tcp_replies.push(tcp_ask(listen).await);
        let (reply, socket) = udp_ask(listen).await;
        udp_replies.push(reply);
        clients.push(socket);
    }
    let workers = nginx.workers();
    let (tcp_seen, udp_seen) = (tally(tcp_replies), tally(udp_replies));
    eprintln!("same port {listen}, TCP and UDP, 1:1, {workers} nginx workers: {tcp_seen:?} {udp_seen:?}");
    assert_split(&tcp_seen, &[("tcp:v1", 5), ("tcp:v2", 5)], &[1, 1], workers);
    assert_split(&udp_seen, &[("udp:v1", 5), ("udp:v2", 5)], &[1, 1], workers);
}

/// A UDP client that sends one datagram and gets one answer (DNS, syslog-like request/
/// response) must not pin nginx resources for long. The rendered UDP `server` sets neither
/// `proxy_responses` nor `proxy_timeout`, so every session (one per client address:port,
/// i.e. per DNS query from a resolver with random source ports) stays open for nginx's
/// default `proxy_timeout` of 10 minutes and holds 2 of the worker's 1024 connections:
/// after ~511 one-shot clients per worker in 10 minutes, nginx logs
/// "1024 worker_connections are not enough" and drops every further datagram.
/// With `proxy_responses 1;` in the UDP server block this test passes (checked by hand).
#[tokio::test]
async fn udp_sessions_end_once_answered() {
    let Some(bin) = nginx_binary() else { return };
    let backends = udp_backends(&["v1"]).await;
    let address = addresses(&backends);
    let spec = |p: u16| {
        admitted(BalancerSpec {
            replicas: None,
            session_affinity: None,
            algorithm: None,
            service: None,
            proxy: None,
            ports: vec![port(Some("dns"), "UDP", i32::from(p))],
            selector: Some(BTreeMap::from([("app".to_string(), "dns".to_string())])),
            backends: vec![backend("v1", 1)],
        })
    };
    let (nginx, listen) =
        start_nginx(&bin, free_udp_port, |p| nginx::render("dns", &spec(p), &[], None, &address)).await;
    udp_ask(listen).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let workers = nginx.workers();
    // More one-shot clients than all workers together could hold sessions for (~511 each).
    let clients = 600 * workers + 100;
    let started = Instant::now();
    for client in 2..=clients {
        let reply = timeout(Duration::from_secs(1), udp_ask(listen)).await;
        assert!(
            reply.is_ok(),
            "one-shot UDP client #{client} got no answer after {} were answered in {:?} ({workers} workers)\n{}",
            client - 1,
            started.elapsed(),
            nginx.prefix.log()
        );
    }
}

// ---------------------------------------------------------------------------
// (c) nginx -t on a table of rendered configs
// ---------------------------------------------------------------------------

/// Distinct loopback addresses for up to 254 backends, at the Balancer port's number.
fn loopback_addresses(spec: &BalancerSpec) -> impl Fn(&BackendSpec, &BalancerPort) -> Destination + '_ {
    move |backend: &BackendSpec, port: &BalancerPort| {
        let i = spec.backends.iter().position(|b| b.name == backend.name).expect("backend of this spec");
        format!("127.0.0.{}:{}", i + 2, port.port).parse().map(Destination::Address).expect("an address")
    }
}

fn config_table() -> Vec<(&'static str, BalancerSpec)> {
    let three = || vec![backend("v1", 40), backend("v2", 20), backend("v3", 40)];
    let spec = |ports, backends| BalancerSpec {
        replicas: None,
        session_affinity: None,
        algorithm: None,
        service: None,
        proxy: None,
        ports,
        selector: None,
        backends,
    };
    let mut named_target = port(Some("dns"), "UDP", 53);
    named_target.target_port = Some(IntOrString::String("dns".into()));
    let mut named_tcp = port(Some("http"), "TCP", 80);
    named_tcp.target_port = Some(IntOrString::String("http-alt".into()));
    vec![
        ("original sample", sample_spec(80)),
        (
            "single TCP port, defaults left out",
            spec(
                vec![BalancerPort { name: None, protocol: None, port: 8080, target_port: None, ..Default::default() }],
                vec![BackendSpec {
                    name: "a".into(),
                    weight: None,
                    selector: Some(BTreeMap::from([("app".into(), "a".into())])),
                    ..Default::default()
                }],
            ),
        ),
        ("single UDP port", spec(vec![port(None, "UDP", 5353)], three())),
        ("ClientIP affinity, TCP and UDP", {
            let mut affine = spec(vec![port(Some("tcp"), "TCP", 80), port(Some("udp"), "UDP", 53)], three());
            affine.session_affinity = Some("ClientIP".into());
            affine
        }),
        ("53/TCP and 53/UDP", spec(vec![port(Some("dns-tcp"), "TCP", 53), port(Some("dns-udp"), "UDP", 53)], three())),
        (
            "weight-0 backend",
            spec(vec![port(None, "TCP", 80)], vec![backend("v1", 1), backend("v2", 0), backend("v3", 100)]),
        ),
        (
            "64 backends",
            spec(vec![port(None, "TCP", 80)], (0..64).map(|i| backend(&format!("b{i}"), i % 101)).collect()),
        ),
        (
            "32 ports",
            spec(
                (0..32)
                    .map(|i| port(Some(&format!("p{i}")), if i % 2 == 0 { "TCP" } else { "UDP" }, 1000 + i))
                    .collect(),
                three(),
            ),
        ),
        (
            "64 backends x 32 ports",
            spec(
                (0..32).map(|i| port(Some(&format!("p{i}")), "TCP", 65535 - i)).collect(),
                (0..64).map(|i| backend(&format!("b{i}"), 100)).collect(),
            ),
        ),
        ("named targetPort", spec(vec![named_tcp, named_target], three())),
        (
            "backend names with dashes",
            spec(
                vec![port(None, "TCP", 1)],
                vec![backend("blue-green-1", 3), backend("canary--x", 1), backend("a-b-c-d-e", 2)],
            ),
        ),
    ]
}

#[test]
fn nginx_t_accepts_every_rendered_config() {
    let Some(bin) = nginx_binary() else { return };
    let mut rejected = Vec::new();
    for (case, spec) in config_table() {
        let spec = admit(ObjectName::Name("table"), spec, &SpecPolicy::default())
            .unwrap_or_else(|report| panic!("{case}: the table holds valid specs only: {:?}", report.errors));
        let rendered = nginx::render("table", &spec, &[], None, &loopback_addresses(&spec));
        if let Err(log) = nginx_check(&bin, &rendered) {
            rejected.push(format!("--- {case} ---\n{log}\n{rendered}"));
        }
    }
    assert!(rejected.is_empty(), "nginx -t rejected:\n{}", rejected.join("\n"));
}

#[test]
fn nginx_t_rejects_a_broken_config() {
    // The check above must be able to fail: a config nginx cannot load is reported.
    let Some(bin) = nginx_binary() else { return };
    let spec = admitted(sample_spec(80));
    let rendered =
        nginx::render("table", &spec, &[], None, &loopback_addresses(&spec)).replace("weight=40", "weight=0");
    let log = nginx_check(&bin, &rendered).expect_err("weight=0 is invalid for nginx");
    assert!(log.contains("weight"), "{log}");
}

// ---------------------------------------------------------------------------
// (e) Session affinity
// ---------------------------------------------------------------------------

/// One TCP connection through nginx from the client address `from`: what the backend answered.
async fn tcp_ask_from(from: Ipv4Addr, port: u16) -> String {
    timeout(STEP, async {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.bind(SocketAddr::from((from, 0))).expect("bind the client address");
        let mut stream = socket.connect(SocketAddr::from(([127, 0, 0, 1], port))).await.expect("connect to nginx");
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.expect("read reply");
        reply
    })
    .await
    .expect("reply through nginx in time")
}

#[tokio::test]
async fn client_ip_affinity_keeps_each_client_on_one_backend_and_splits_clients_by_weight() {
    let Some(bin) = nginx_binary() else { return };
    let backends = tcp_backends(&["v1", "v2", "v3"]).await;
    let address = addresses(&backends);
    let affine = |p: u16| {
        let mut spec = sample_spec(p);
        spec.session_affinity = Some("ClientIP".into());
        spec
    };
    let (_nginx, listen) = start_nginx(&bin, free_tcp_port, |p| {
        nginx::render("example-balancer", &admitted(affine(p)), &[], None, &address)
    })
    .await;

    // 240 clients (127.0.1.1 ... 127.0.2.120), 3 connections each.
    const CLIENTS: u16 = 240;
    let mut first_picks = Vec::new();
    for i in 0..CLIENTS {
        let client = Ipv4Addr::new(127, 0, 1 + (i / 120) as u8, 1 + (i % 120) as u8);
        let replies = [
            tcp_ask_from(client, listen).await,
            tcp_ask_from(client, listen).await,
            tcp_ask_from(client, listen).await,
        ];
        assert!(replies.iter().all(|r| r == &replies[0]), "client {client} moved between backends: {replies:?}");
        first_picks.push(replies[0].clone());
    }
    let observed = tally(first_picks);
    eprintln!("ClientIP affinity, 40/20/40, {CLIENTS} client addresses: {observed:?}");
    // Consistent hashing places each address by its hash, with points in proportion to the
    // weights: no exact split as round-robin has, but every backend's share near its weight.
    for (name, weight) in [("v1", 40.0), ("v2", 20.0), ("v3", 40.0)] {
        let share = 100.0 * observed.get(name).copied().unwrap_or(0) as f64 / f64::from(CLIENTS);
        assert!(
            (share - weight).abs() <= 12.0,
            "{name}: {share:.0}% of the clients for a weight of {weight}%: {observed:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// (f) Passive health
// ---------------------------------------------------------------------------

/// 100 connections to a Balancer whose heavier backend refuses every connection: each one is
/// answered by the live backend (nginx tries the next one), and nginx's log tells how often it
/// tried the dead one. Returns that count and the number of workers.
async fn refused_attempts(bin: &NginxBinary, max_fails: i32) -> (usize, usize) {
    let live = tcp_backend("live", BACKEND_IPS[0], "live".into()).await;
    // A port nothing listens on: connections to it are refused at once.
    let dead = TcpListener::bind((BACKEND_IPS[1], 0)).await.expect("bind").local_addr().expect("addr");
    let address = move |backend: &BackendSpec, _: &BalancerPort| match backend.name.as_str() {
        "live" => Destination::Address(live.addr),
        _ => Destination::Address(dead),
    };
    let spec = |p: u16| {
        let mut spec = sample_spec(p);
        spec.backends = vec![backend("dead", 90), backend("live", 10)];
        spec.backends[0].max_fails = Some(max_fails);
        spec.backends[0].fail_timeout = Some("30s".into());
        spec
    };
    let (nginx, listen) =
        start_nginx(bin, free_tcp_port, |p| nginx::render("example-balancer", &admitted(spec(p)), &[], None, &address))
            .await;
    for _ in 0..100 {
        assert_eq!(tcp_ask(listen).await, "live", "every connection is answered by the live backend");
    }
    let refused = nginx.prefix.log().matches("Connection refused").count();
    (refused, nginx.workers())
}

#[tokio::test]
async fn a_failing_backend_is_left_alone_for_fail_timeout_after_max_fails() {
    let Some(bin) = nginx_binary() else { return };
    let (with_passive_health, workers) = refused_attempts(&bin, 1).await;
    let (without, _) = refused_attempts(&bin, 0).await;
    eprintln!("refused attempts over 100 connections: maxFails 1: {with_passive_health}, maxFails 0: {without}");
    // maxFails 1: each worker tries the dead backend once, then leaves it alone for 30 s.
    assert!(with_passive_health <= workers, "{with_passive_health} refused attempts with {workers} workers");
    // maxFails 0: it is never marked failed, so most connections try it first (weight 90 of 100).
    assert!(without >= 50, "only {without} refused attempts with maxFails 0");
}

// ---------------------------------------------------------------------------
// (g) The metrics sidecar, fed by the real nginx's log
// ---------------------------------------------------------------------------

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
    let (_nginx, listen) = start_nginx(&bin, free_tcp_port, render).await;
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
    let metrics_port = free_tcp_port();
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
    let (_nginx, listen) = start_nginx(&bin, free_tcp_port, render).await;
    fs::write(dir.path().join("nginx.conf"), render(listen)).expect("nginx.conf");
    let model = ProxyConfig::of("lb", &spec(listen), &[], Some(log), &ServiceUpstreams(&address));
    fs::write(dir.path().join(MODEL_FILE), model.to_json()).expect("its model");
    let metrics_port = free_tcp_port();
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

// ---------------------------------------------------------------------------
// (h) Algorithms, backups, connection limits and the PROXY protocol
// ---------------------------------------------------------------------------

/// Answers each connection with its name and a newline, then holds it until the client closes.
async fn holding_backend(name: &str, ip: Ipv4Addr) -> Backend {
    let listener = TcpListener::bind((ip, 0)).await.expect("bind TCP backend");
    let addr = listener.local_addr().expect("addr");
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    let reply = format!("{name}\n");
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let reply = reply.clone();
            tokio::spawn(async move {
                let _ = stream.write_all(reply.as_bytes()).await;
                let mut rest = Vec::new();
                let _ = stream.read_to_end(&mut rest).await;
            });
        }
    });
    Backend { name: name.to_string(), addr, served, task }
}

/// A connection through nginx kept open: the backend's name, or `None` when nginx closed it
/// without one (no backend could take it).
async fn held(port: u16) -> (Option<String>, TcpStream) {
    let mut stream = timeout(STEP, TcpStream::connect(("127.0.0.1", port))).await.expect("in time").expect("connect");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while timeout(STEP, stream.read(&mut byte)).await.expect("an answer or a close in time").expect("read") == 1 {
        if byte[0] == b'\n' {
            return (Some(String::from_utf8_lossy(&line).into_owned()), stream);
        }
        line.push(byte[0]);
    }
    (None, stream)
}

/// A backend holding one long connection gets no new one while the other has fewer: least
/// connections, with the count shared by nginx's workers (round robin would alternate).
#[tokio::test]
async fn least_connections_sends_new_connections_to_the_less_loaded_backend() {
    let Some(bin) = nginx_binary() else { return };
    let backends = [holding_backend("v1", BACKEND_IPS[0]).await, holding_backend("v2", BACKEND_IPS[1]).await];
    let address = addresses(&backends);
    let spec = |p| {
        let mut spec = sample_spec(p);
        spec.backends = vec![backend("v1", 1), backend("v2", 1)];
        spec.algorithm = Some("LeastConnections".into());
        admitted(spec)
    };
    let (_nginx, listen) =
        start_nginx(&bin, free_tcp_port, |p| nginx::render("lb", &spec(p), &[], None, &address)).await;
    let (Some(busy), _long) = held(listen).await else { panic!("the long connection was not served") };
    let mut short = Vec::new();
    for _ in 0..10 {
        let (answer, stream) = held(listen).await;
        short.push(answer.expect("served"));
        drop(stream);
        // nginx counts the closed session out before the next one arrives.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    eprintln!("least connections: {busy} holds one connection; 10 short ones went to {short:?}");
    assert!(short.iter().all(|s| s != &busy), "{busy} holds a connection, yet took new ones: {short:?}");
}

/// A backup takes nothing while the primary answers, everything once it refuses, and no
/// connection fails on the way.
#[tokio::test]
async fn a_backup_takes_connections_only_when_the_others_refuse() {
    let Some(bin) = nginx_binary() else { return };
    let primary = tcp_backend("primary", BACKEND_IPS[0], "primary".into()).await;
    let spare = tcp_backend("spare", BACKEND_IPS[1], "spare".into()).await;
    let (primary_addr, spare_addr) = (primary.addr, spare.addr);
    let address = move |backend: &BackendSpec, _: &BalancerPort| match backend.name.as_str() {
        "primary" => Destination::Address(primary_addr),
        _ => Destination::Address(spare_addr),
    };
    let spec = |p| {
        let mut spec = sample_spec(p);
        spec.backends = vec![backend("primary", 1), backend("spare", 100)];
        spec.backends[1].backup = Some(true);
        admitted(spec)
    };
    let (_nginx, listen) =
        start_nginx(&bin, free_tcp_port, |p| nginx::render("lb", &spec(p), &[], None, &address)).await;
    let mut before = Vec::new();
    for _ in 0..20 {
        before.push(tcp_ask(listen).await);
    }
    assert_eq!(tally(before), BTreeMap::from([("primary".to_string(), 20)]), "the backup waits, whatever its weight");
    drop(primary);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut after = Vec::new();
    for _ in 0..20 {
        after.push(tcp_ask(listen).await);
    }
    assert_eq!(tally(after), BTreeMap::from([("spare".to_string(), 20)]), "every connection served by the backup");
}

/// `maxConnections: 2` holds across nginx's workers (the upstream's zone): of 6 connections
/// held open at once, 2 reach the backend and nginx closes the others.
#[tokio::test]
async fn max_connections_refuses_past_its_limit_across_workers() {
    let Some(bin) = nginx_binary() else { return };
    let backends = [holding_backend("v1", BACKEND_IPS[0]).await];
    let address = addresses(&backends);
    let spec = |p| {
        let mut spec = sample_spec(p);
        spec.backends = vec![backend("v1", 1)];
        spec.backends[0].max_connections = Some(2);
        admitted(spec)
    };
    let (nginx, listen) =
        start_nginx(&bin, free_tcp_port, |p| nginx::render("lb", &spec(p), &[], None, &address)).await;
    let mut streams = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..6 {
        let (answer, stream) = held(listen).await;
        answers.push(answer);
        streams.push(stream);
    }
    let served = answers.iter().flatten().count();
    eprintln!("maxConnections 2, {} workers, 6 connections held: {answers:?}", nginx.workers());
    assert_eq!(served, 2, "{answers:?}");
    assert_eq!(backends[0].served.load(Ordering::SeqCst), 2);
    drop(streams);
}

/// nginx as the backend, answering with the client address its PROXY protocol header carried.
async fn proxy_protocol_backend(bin: &NginxBinary) -> (Nginx, SocketAddr) {
    let ip = BACKEND_IPS[2];
    let mut failures = Vec::new();
    for _ in 0..3 {
        let addr = SocketAddr::from((ip, free_tcp_port()));
        let conf = format!(
            "events {{}}\nstream {{\n    server {{\n        listen {addr} proxy_protocol;\n        \
             return \"$proxy_protocol_addr\\n\";\n    }}\n}}\n"
        );
        match Nginx::start(bin, &conf).await {
            Ok(nginx) => return (nginx, addr),
            Err(log) => failures.push(log),
        }
    }
    panic!("the PROXY protocol backend did not start: {failures:?}");
}

/// The client's address reaches the backend: from the connection itself, and from a PROXY
/// protocol header an outer load balancer sent (`acceptProxyProtocol`).
#[tokio::test]
async fn the_proxy_protocol_carries_the_clients_address_to_the_backend() {
    let Some(bin) = nginx_binary() else { return };
    let (_backend, backend_addr) = proxy_protocol_backend(&bin).await;
    let address = move |_: &BackendSpec, _: &BalancerPort| Destination::Address(backend_addr);
    let spec = |p, accept: bool| {
        let mut spec = sample_spec(p);
        spec.backends = vec![backend("v1", 1)];
        spec.ports[0].proxy_protocol = Some(true);
        spec.ports[0].accept_proxy_protocol = Some(accept);
        admitted(spec)
    };
    let (_nginx, listen) =
        start_nginx(&bin, free_tcp_port, |p| nginx::render("lb", &spec(p, false), &[], None, &address)).await;
    let client = Ipv4Addr::new(127, 0, 0, 9);
    assert_eq!(tcp_ask_from(client, listen).await, "127.0.0.9\n");

    let (_outer, listen) =
        start_nginx(&bin, free_tcp_port, |p| nginx::render("lb", &spec(p, true), &[], None, &address)).await;
    let answer = timeout(STEP, async {
        let mut stream = TcpStream::connect(("127.0.0.1", listen)).await.expect("connect");
        stream.write_all(b"PROXY TCP4 203.0.113.7 127.0.0.1 40000 80\r\n").await.expect("header");
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.expect("reply");
        reply
    })
    .await
    .expect("in time");
    assert_eq!(answer, "203.0.113.7\n", "the address the outer load balancer saw, passed on");
}

/// Mixes of the L4 settings: algorithm, affinity, backups, limits, PROXY protocol; backups
/// only where nginx takes them (the rules' tests cover the rest), so nearly all are admitted.
fn arb_l4_spec() -> impl proptest::strategy::Strategy<Value = BalancerSpec> {
    use proptest::prelude::*;
    let ports = proptest::collection::vec((any::<bool>(), any::<bool>(), any::<bool>()), 1..5);
    let backends = proptest::collection::vec((0i32..=100, any::<bool>(), proptest::option::of(1i32..=1_000_000)), 1..9);
    let algorithm = proptest::sample::select(<balancer::api::Algorithm as strum::VariantNames>::VARIANTS);
    (algorithm, any::<bool>(), ports, backends).prop_map(|(algorithm, client_ip, ports, backends)| {
        let mut spec = sample_spec(1000);
        spec.algorithm = Some(algorithm.to_string());
        spec.session_affinity = Some(if client_ip { "ClientIP" } else { "None" }.into());
        spec.ports = ports
            .into_iter()
            .enumerate()
            .map(|(i, (udp, send, accept))| {
                let mut port = port(Some(&format!("p{i}")), if udp { "UDP" } else { "TCP" }, 1000 + i as i32);
                port.proxy_protocol = Some(send && !udp);
                port.accept_proxy_protocol = Some(accept && !udp);
                port
            })
            .collect();
        spec.backends = backends
            .into_iter()
            .enumerate()
            .map(|(i, (weight, backup, limit))| {
                let mut backend = backend(&format!("b{i}"), weight);
                backend.backup = Some(backup && i > 0 && !client_ip && algorithm != "PowerOfTwoChoices");
                backend.max_connections = limit;
                backend
            })
            .collect();
        spec
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Every combination the rules admit, nginx accepts; what they refuse is what nginx would.
    #[test]
    fn nginx_t_accepts_every_admitted_mix_of_l4_settings(spec in arb_l4_spec()) {
        let Some(bin) = nginx_binary() else { return Ok(()) };
        match admit(ObjectName::Name("mix"), spec, &SpecPolicy::default()) {
            Ok(spec) => {
                let rendered = nginx::render("mix", &spec, &[], None, &loopback_addresses(&spec));
                if let Err(log) = nginx_check(&bin, &rendered) {
                    proptest::prop_assert!(false, "nginx -t rejected an admitted spec:\n{log}\n{rendered}");
                }
            }
            Err(report) => {
                // Only the combinations nginx refuses, or an all-zero weight sum.
                let known = ["sessionAffinity ClientIP", "sum of weights"];
                for error in &report.errors {
                    proptest::prop_assert!(known.iter().any(|k| error.to_string().contains(k)), "{error}");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// (h2) Pod upstreams: each backend's weight shared across its pods
// ---------------------------------------------------------------------------

/// `counts[i]` pods per backend of the sample (each answers with its backend's name), on their
/// own loopback addresses; and a server of the sample's spec whose backends are those pods.
async fn pod_backends(counts: &[usize]) -> Vec<Vec<Backend>> {
    let names = ["v1", "v2", "v3"];
    let mut backends = Vec::new();
    for (b, &count) in counts.iter().enumerate() {
        let mut pods = Vec::new();
        for i in 0..count {
            let ip = Ipv4Addr::new(127, 0, 1 + b as u8, 2 + i as u8);
            pods.push(tcp_backend(names[b], ip, names[b].to_string()).await);
        }
        backends.push(pods);
    }
    backends
}

/// nginx.conf of `spec` whose upstreams are `pods` (per backend, in the spec's order), with
/// `dead` added to the first backend's.
fn pod_upstream_conf(spec: &Admitted, pods: &[Vec<Backend>], dead: &[SocketAddr]) -> String {
    let position =
        |backend: &BackendSpec| spec.backends.iter().position(|b| b.name == backend.name).expect("a backend");
    let targets = |backend: &BackendSpec, _: AdmittedPort<'_>| {
        let i = position(backend);
        let mut addresses: Vec<SocketAddr> = pods[i].iter().map(|p| p.addr).collect();
        if i == 0 {
            addresses.extend(dead);
        }
        let service = format!("127.0.0.{}:1", 10 + i).parse().map(Destination::Address).expect("an address");
        Targets::Pods { service, pods: addresses }
    };
    nginx::write(&ProxyConfig::of("pods", spec, &[], None, &&targets))
}

/// 10,000 new connections split 40/20/40 within a point, whatever each backend's pod count:
/// one pod of v1 weighs what three of v2 do.
#[tokio::test]
async fn pod_upstreams_keep_the_split_across_unequal_pod_counts() {
    let Some(bin) = nginx_binary() else { return };
    let pods = pod_backends(&[1, 3, 2]).await;
    let (nginx, listen) =
        start_nginx(&bin, free_tcp_port, |p| pod_upstream_conf(&admitted(sample_spec(p)), &pods, &[])).await;
    let connections = 10_000;
    let mut replies = Vec::with_capacity(connections);
    for _ in 0..connections {
        replies.push(tcp_ask(listen).await);
    }
    let observed = tally(replies);
    eprintln!("40/20/40 over pods 1/3/2, {connections} connections, {} workers: {observed:?}", nginx.workers());
    for (backend, wanted) in [("v1", 40.0), ("v2", 20.0), ("v3", 40.0)] {
        let share = 100.0 * *observed.get(backend).unwrap_or(&0) as f64 / connections as f64;
        assert!(
            (share - wanted).abs() <= 1.0,
            "{backend}: {share:.2} % of connections, wanted {wanted} %: {observed:?}"
        );
    }
    let per_pod: Vec<usize> = pods[1].iter().map(|p| p.served.load(Ordering::SeqCst)).collect();
    assert!(per_pod.iter().all(|&n| n > 500), "v2's pods share its connections: {per_pod:?}");
}

/// A pod that refuses connections costs a retry on another pod, never a failed connection, and
/// passive health then leaves it out (per pod, not the whole backend).
#[tokio::test]
async fn a_dead_pod_costs_a_retry_not_a_failure() {
    let Some(bin) = nginx_binary() else { return };
    let pods = pod_backends(&[2, 1, 1]).await;
    // A port nothing listens on: bound, then closed.
    let dead = std::net::TcpListener::bind("127.0.1.9:0").expect("bind").local_addr().expect("addr");
    let (_nginx, listen) =
        start_nginx(&bin, free_tcp_port, |p| pod_upstream_conf(&admitted(sample_spec(p)), &pods, &[dead])).await;
    let connections = 1_000;
    let mut replies = Vec::with_capacity(connections);
    for _ in 0..connections {
        replies.push(tcp_ask(listen).await);
    }
    let observed = tally(replies);
    eprintln!("1,000 connections with a dead pod in v1: {observed:?}");
    assert_eq!(observed.values().sum::<usize>(), connections, "every connection answered");
    let v1_pods: Vec<usize> = pods[0].iter().map(|p| p.served.load(Ordering::SeqCst)).collect();
    assert!(v1_pods.iter().all(|&n| n > 100), "v1's live pods still serve: {v1_pods:?}");
    let v1 = 100.0 * *observed.get("v1").unwrap_or(&0) as f64 / connections as f64;
    // The dead pod's share (a third of v1's) goes to the others while it is marked failed.
    assert!(v1 > 20.0, "the backend is not skipped for one dead pod: v1 got {v1:.1} %");
}

// ---------------------------------------------------------------------------
// (i) IPv6
// ---------------------------------------------------------------------------

/// A network namespace of the test's own, with its loopback up (127.0.0.0/8 and ::1); deleted
/// on drop, also when the test fails.
struct Netns(String);

impl Netns {
    fn new() -> Netns {
        let name = format!("balancer-v6-{}", std::process::id());
        let run = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().expect("ip runs");
            assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        run(&["netns", "add", &name]);
        let netns = Netns(name);
        run(&["-n", &netns.0, "link", "set", "lo", "up"]);
        netns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The proxy listens on IPv6 too: a client in a namespace with IPv6 reaches it at [::1] and
/// is answered by IPv4 backends, by weight. Backends and clients are nginx and bash inside the
/// namespace, since the test's own sockets live outside it.
#[tokio::test]
async fn an_ipv6_client_is_served() {
    let Some(bin) = nginx_binary() else { return };
    if !is_root() {
        return unusable_without("root, for a network namespace");
    }
    let netns = Netns::new();
    let listen = free_tcp_port();
    let backends = "events {}\nstream {\n    server { listen 127.0.0.2:9001; return \"v1\\n\"; }\n    \
                    server { listen 127.0.0.3:9001; return \"v2\\n\"; }\n}\n";
    let _backends = Nginx::start_in(Some(&netns.0), &bin, backends).await.expect("the backends start");
    let address = |backend: &BackendSpec, _: &BalancerPort| match backend.name.as_str() {
        "v1" => Destination::Address(SocketAddr::from(([127, 0, 0, 2], 9001))),
        _ => Destination::Address(SocketAddr::from(([127, 0, 0, 3], 9001))),
    };
    let mut spec = sample_spec(listen);
    spec.backends = vec![backend("v1", 3), backend("v2", 1)];
    let rendered = nginx::render("lb", &admitted(spec), &[], None, &address);
    assert!(rendered.contains(&format!("listen [::]:{listen};")), "{rendered}");
    let _proxy = Nginx::start_in(Some(&netns.0), &bin, &rendered).await.expect("the proxy starts");
    let ask = format!("exec 3<>/dev/tcp/::1/{listen} && head -n1 <&3");
    let mut answers = Vec::new();
    for _ in 0..8 {
        let out = Command::new("ip").args(["netns", "exec", &netns.0, "bash", "-c", &ask]).output().expect("bash runs");
        assert!(out.status.success(), "bash: {}", String::from_utf8_lossy(&out.stderr));
        answers.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    eprintln!("8 connections to [::1]:{listen}: {answers:?}");
    assert_eq!(tally(answers), BTreeMap::from([("v1".to_string(), 6), ("v2".to_string(), 2)]));
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn unusable_without(what: &str) {
    assert!(std::env::var_os("CI").is_none(), "this test needs {what} in CI");
    eprintln!("SKIPPED: this test needs {what}");
}

// ---------------------------------------------------------------------------
// (j) Live configuration: the live entrypoint applying new files to a running nginx
// ---------------------------------------------------------------------------

use balancer::proxy::reload::{self, LiveFiles, RELOAD_POLICY, ReloadPolicy};
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// Answers every line a client sends with its name and a newline, for as long as the client
/// holds the connection.
async fn naming_backend(name: &str, ip: Ipv4Addr) -> Backend {
    let listener = TcpListener::bind((ip, 0)).await.expect("bind TCP backend");
    let addr = listener.local_addr().expect("addr");
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    let reply = format!("{name}\n");
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let reply = reply.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(_)) = lines.next_line().await {
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Backend { name: name.to_string(), addr, served, task }
}

/// A connection through nginx that asks the backend its name on demand.
struct Asker {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    write: tokio::net::tcp::OwnedWriteHalf,
}

impl Asker {
    async fn connect(port: u16) -> Asker {
        Asker::try_connect(port).await.expect("connect")
    }

    /// [`Asker::connect`], or why it could not, for clients that must not panic.
    async fn try_connect(port: u16) -> Result<Asker, String> {
        let stream = timeout(STEP, TcpStream::connect(("127.0.0.1", port)))
            .await
            .map_err(|_| "connect timed out".to_string())?
            .map_err(|e| format!("connect: {e}"))?;
        let (read, write) = stream.into_split();
        Ok(Asker { lines: BufReader::new(read).lines(), write })
    }

    /// The backend's name, or `None` once the connection is closed.
    async fn ask(&mut self) -> Option<String> {
        self.write.write_all(b"who are you?\n").await.ok()?;
        timeout(STEP, self.lines.next_line()).await.ok()?.ok()?
    }
}

/// One new connection's answer.
async fn ask_once(port: u16) -> Option<String> {
    Asker::connect(port).await.ask().await
}

/// The live entrypoint (`/bin/sh -c`) running the real nginx, with all its files in a
/// temporary directory; in its own process group, killed with nginx and its workers on drop.
struct LivePod {
    dir: TempDir,
    child: Child,
}

impl LivePod {
    fn start(policy: ReloadPolicy) -> LivePod {
        let dir = TempDir::new().expect("temp dir");
        let at = |file: &str| dir.path().join(file).to_str().expect("utf-8 temp path").to_string();
        let (desired, running, candidate, pid_file) =
            (at("desired.conf"), at("running.conf"), at("candidate.conf"), at("nginx.pid"));
        let (served, rejected) = (at("served"), at("rejected"));
        let files = LiveFiles {
            desired: &desired,
            running: &running,
            candidate: &candidate,
            pid_file: &pid_file,
            ipv6_probe: reload::LIVE_POD_FILES.ipv6_probe,
            served: &served,
            rejected: &rejected,
        };
        let script = reload::live_entrypoint(&files, policy);
        let log = fs::File::create(at("stderr.log")).expect("log file");
        let (mut shell, tools) = support::shell::shell(dir.path());
        let child = shell
            .env("PATH", format!("{tools}{}", std::env::var("PATH").unwrap_or_default()))
            .args(["-c", &script, "nginx", "-c", &running, "-e", "stderr", "-g"])
            .arg(format!("daemon off; pid {pid_file};"))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("/bin/sh runs");
        LivePod { dir, child }
    }

    fn read(&self, file: &str) -> String {
        fs::read_to_string(self.dir.path().join(file)).unwrap_or_default()
    }

    fn log(&self) -> String {
        self.read("stderr.log")
    }

    /// As the sidecar does: the file written next to its place, then renamed into it. Returns
    /// its id line.
    fn desire(&self, contents: &str) -> String {
        let next = self.dir.path().join("desired.conf.tmp");
        fs::write(&next, contents).expect("the new file");
        fs::rename(next, self.dir.path().join("desired.conf")).expect("renamed into place");
        contents.lines().next().unwrap_or_default().to_string()
    }

    /// Waits until `done` holds; panics with the log after `within`.
    async fn until(&self, within: Duration, what: &str, done: impl Fn(&LivePod) -> bool) {
        let deadline = Instant::now() + within;
        while !done(self) {
            assert!(Instant::now() < deadline, "{what} not within {within:?}\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until nginx serves the file `id` names: the entrypoint says so, and nginx's master
    /// has written its pid file (on the first file, the entrypoint may say so first).
    async fn serving(&self, id: &str) {
        let line = format!("{id}\n");
        self.until(NGINX_DEADLINE, "served", |pod| pod.read("served") == line).await;
        self.until(NGINX_DEADLINE, "nginx's pid file", |pod| !pod.master().is_empty()).await;
    }

    /// nginx's master, once it wrote its pid file.
    fn master(&self) -> String {
        self.read("nginx.pid").trim().to_string()
    }

    /// The master's workers: pid and whether it is draining (finishing the connections of an
    /// older configuration).
    fn workers(&self) -> Vec<(String, bool)> {
        let master = self.master();
        let mut workers = Vec::new();
        for entry in fs::read_dir("/proc").expect("read /proc").flatten() {
            let stat = fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            if stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(1)) != Some(&master) {
                continue;
            }
            let title = fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let title = String::from_utf8_lossy(&title);
            let draining = title.starts_with("nginx: worker process is shutting down");
            workers.push((entry.file_name().to_string_lossy().into_owned(), draining));
        }
        workers
    }

    fn draining(&self) -> Vec<String> {
        self.workers().into_iter().filter(|(_, draining)| *draining).map(|(pid, _)| pid).collect()
    }
}

impl Drop for LivePod {
    fn drop(&mut self) {
        // The group: the shell, nginx's master and all its workers.
        signal("KILL", &format!("-{}", self.child.id()));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A worker's memory and open sockets.
#[derive(Debug)]
#[allow(dead_code)] // Read through Debug, in the tests' output.
struct WorkerMemory {
    /// `VmRSS`, kB: counts the pages shared with the master and the other workers too.
    rss: u64,
    /// `Private_Clean` + `Private_Dirty` of `smaps_rollup`, kB: the pages only this worker
    /// holds, what stopping it gives back.
    private: u64,
    /// Open sockets: 2 per proxied connection, plus nginx's channels to its other processes.
    sockets: usize,
}

fn worker_memory(pid: &str) -> WorkerMemory {
    let kb = |file: &str, field: &str| -> u64 {
        let text = fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let sockets = fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter(|fd| fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:")))
                .count()
        })
        .unwrap_or(0);
    let private = kb("smaps_rollup", "Private_Clean:") + kb("smaps_rollup", "Private_Dirty:");
    WorkerMemory { rss: kb("status", "VmRSS:"), private, sockets }
}

/// The live files for a Balancer on `port` sending everything to `to` (of backends a and b),
/// with the stream module loaded where it is dynamic.
fn live_conf(bin: &NginxBinary, backends: &[Backend], port: u16, to: &str) -> String {
    live_conf_on(bin, backends, sample_spec(port), to)
}

/// [`live_conf`] for a UDP port.
fn live_udp_conf(bin: &NginxBinary, backends: &[Backend], number: u16, to: &str) -> String {
    let mut spec = sample_spec(number);
    spec.ports = vec![port(Some("dns"), "UDP", i32::from(number))];
    live_conf_on(bin, backends, spec, to)
}

/// The live files for `spec` with backends a and b, everything to `to`.
fn live_conf_on(bin: &NginxBinary, backends: &[Backend], mut spec: BalancerSpec, to: &str) -> String {
    spec.backends = vec![backend("a", i32::from(to == "a")), backend("b", i32::from(to == "b"))];
    let modules: Vec<String> = bin.stream_module.iter().map(|m| m.display().to_string()).collect();
    reload::desired_file(&nginx::render("live", &admitted(spec), &modules, None, &addresses(backends)))
}

/// Asks the backend's name every 100 ms until `stop`: every answer, with when it came.
async fn chatter(mut asker: Asker, stop: CancellationToken) -> Vec<(Instant, Option<String>)> {
    let mut answers = Vec::new();
    while !stop.is_cancelled() {
        answers.push((Instant::now(), asker.ask().await));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    answers
}

/// A live pod with the default policy, on a free port, serving the naming backends a and b,
/// everything to a: what the live tests start from.
struct Serving {
    backends: [Backend; 2],
    listen: u16,
    pod: LivePod,
    /// The id line of the configuration it serves.
    id: String,
}

async fn serving_a(bin: &NginxBinary) -> Serving {
    let backends = [naming_backend("a", BACKEND_IPS[0]).await, naming_backend("b", BACKEND_IPS[1]).await];
    let listen = free_tcp_port();
    let pod = LivePod::start(RELOAD_POLICY);
    let id = pod.desire(&live_conf(bin, &backends, listen, "a"));
    pod.serving(&id).await;
    Serving { backends, listen, pod, id }
}

/// A new configuration reaches every new connection within a second, while the connections
/// opened before keep talking to the old backend; a file nginx refuses changes nothing.
#[tokio::test]
async fn a_live_configuration_moves_new_connections_and_keeps_the_open_ones() {
    let Some(bin) = nginx_binary() else { return };
    let Serving { backends, listen, pod, .. } = serving_a(&bin).await;
    assert_eq!(ask_once(listen).await.as_deref(), Some("a"), "{}", pod.log());

    let stop = CancellationToken::new();
    let mut chatters = Vec::new();
    for _ in 0..20 {
        chatters.push(tokio::spawn(chatter(Asker::connect(listen).await, stop.clone())));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let written = Instant::now();
    let to_b = pod.desire(&live_conf(&bin, &backends, listen, "b"));
    let (mut probes, mut served_after) = (Vec::new(), None);
    while written.elapsed() < Duration::from_millis(1500) {
        if served_after.is_none() && pod.read("served") == format!("{to_b}\n") {
            served_after = Some(written.elapsed());
        }
        probes.push((written.elapsed(), ask_once(listen).await));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let last_a = probes.iter().filter(|(_, answer)| answer.as_deref() != Some("b")).map(|(t, _)| *t).max();
    let first_b = probes.iter().find(|(_, answer)| answer.as_deref() == Some("b")).map(|(t, _)| *t);
    eprintln!(
        "switch a -> b: {} new connections probed over 1.5 s; first reached b {first_b:?} after the write, \
         the last not reaching b {last_a:?} after it; the served file named b {served_after:?} after it",
        probes.len()
    );
    assert!(served_after.is_some(), "{}", pod.log());
    let settled = last_a.map_or(Duration::ZERO, |t| t);
    assert!(settled < Duration::from_secs(1), "new connections reached a until {settled:?}: {probes:?}");
    assert!(first_b.is_some(), "{probes:?}");

    // The 20 connections opened before the switch are held by the old generation's workers.
    let draining = pod.draining();
    for pid in &draining {
        eprintln!("draining worker {pid}: {:?}", worker_memory(pid));
    }
    assert!(!draining.is_empty(), "the old connections are drained by the old workers");
    stop.cancel();
    for (n, chatter) in chatters.into_iter().enumerate() {
        let answers = timeout(STEP, chatter).await.expect("in time").expect("the chatter");
        let after: Vec<_> = answers.iter().filter(|(t, _)| *t > written).collect();
        assert!(after.len() >= 10, "connection {n} talked {} times after the switch", after.len());
        assert!(
            answers.iter().all(|(_, answer)| answer.as_deref() == Some("a")),
            "connection {n} was cut or moved: {answers:?}"
        );
    }

    // A file nginx refuses: reported, and nothing changes.
    let garbage = reload::desired_file("garbage;\n");
    let refused = pod.desire(&garbage);
    pod.until(Duration::from_secs(2), "the refusal", |pod| pod.read("rejected").starts_with(&refused)).await;
    let rejected = pod.read("rejected");
    assert!(rejected.contains("unknown directive \"garbage\""), "{rejected}");
    assert_eq!(pod.read("served"), format!("{to_b}\n"));
    for _ in 0..10 {
        assert_eq!(ask_once(listen).await.as_deref(), Some("b"), "{}", pod.log());
    }
    assert!(pod.log().contains("refused configuration"), "{}", pod.log());
}

/// Each reload leaves the previous workers draining their connections: 12 reloads in a row,
/// each generation holding a connection, leave no more than the bound, the oldest closed.
#[tokio::test]
async fn rapid_reloads_leave_at_most_the_bound_of_workers_draining() {
    let Some(bin) = nginx_binary() else { return };
    let backends = [naming_backend("a", BACKEND_IPS[0]).await, naming_backend("b", BACKEND_IPS[1]).await];
    let listen = free_tcp_port();
    let policy =
        ReloadPolicy { poll: Duration::from_millis(50), min_interval: Duration::from_millis(100), ..RELOAD_POLICY };
    let bound = policy.max_draining_workers as usize;
    let pod = LivePod::start(policy);
    let mut pinned = Vec::new();
    let started = Instant::now();
    let mut most_draining = 0;
    for generation in 0..=12 {
        let to = if generation % 2 == 0 { "a" } else { "b" };
        let id = pod.desire(&live_conf(&bin, &backends, listen, to));
        pod.serving(&id).await;
        // A connection of this generation: one the previous one's workers accepted before they
        // stopped listening answers with the other name.
        let mut asker = Asker::connect(listen).await;
        for _ in 0..20 {
            if asker.ask().await.as_deref() == Some(to) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            asker = Asker::connect(listen).await;
        }
        pinned.push(asker);
        most_draining = most_draining.max(pod.draining().len());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let draining = pod.draining();
    let mut alive = Vec::new();
    for asker in &mut pinned {
        alive.push(asker.ask().await.is_some());
    }
    let memory: Vec<WorkerMemory> = draining.iter().map(|pid| worker_memory(pid)).collect();
    eprintln!(
        "12 reloads in {:?}: {} workers draining (at most {most_draining} seen, bound {bound}), \
         each: {memory:?}; pinned connections alive, oldest first: {alive:?}",
        started.elapsed(),
        draining.len()
    );
    assert!(draining.len() <= bound, "{draining:?}\n{}", pod.log());
    assert!(most_draining <= bound, "{most_draining}\n{}", pod.log());
    let closed = alive.iter().filter(|a| !**a).count();
    assert!(closed >= 12 - bound, "without the bound 12 generations would drain: {alive:?}\n{}", pod.log());
    assert!(alive.iter().skip_while(|a| !**a).all(|a| *a), "the oldest are closed first: {alive:?}");
    assert!(alive.last() == Some(&true), "the serving generation's connection is untouched");
    let log = pod.log();
    let stops: Vec<&str> = log.lines().filter(|l| l.contains("oldest draining")).collect();
    eprintln!("{}", stops.join("\n"));
    assert!(!stops.is_empty(), "{log}");
}

/// A new connection's answer, or why it got none: for clients that must not panic.
async fn try_ask(port: u16) -> Result<String, String> {
    Asker::try_connect(port).await?.ask().await.ok_or_else(|| "closed without an answer".to_string())
}

/// No reload refuses or resets a new connection: clients connecting without pause through
/// ten reloads all get their answer. The listening socket stays open in the master, so
/// connections that arrive while a generation of workers hands over wait in its queue for the
/// next.
#[tokio::test]
async fn reloads_refuse_no_new_connection() {
    let Some(bin) = nginx_binary() else { return };
    let Serving { backends, listen, pod, .. } = serving_a(&bin).await;
    let stop = CancellationToken::new();
    let clients: Vec<JoinHandle<Vec<Result<String, String>>>> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.is_cancelled() {
                    answers.push(try_ask(listen).await);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                answers
            })
        })
        .collect();
    for generation in 1..=10 {
        let id = pod.desire(&live_conf(&bin, &backends, listen, if generation % 2 == 0 { "a" } else { "b" }));
        pod.serving(&id).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.cancel();
    let mut answers = Vec::new();
    for client in clients {
        // A client's last connection may take a connect and an answer's time.
        answers.extend(timeout(3 * STEP, client).await.expect("in time").expect("the client"));
    }
    let failed: Vec<&String> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    eprintln!("10 reloads: {} new connections, {} failed: {failed:?}", answers.len(), failed.len());
    assert!(answers.len() >= 400, "the clients kept connecting: {}", answers.len());
    assert!(failed.is_empty(), "{failed:?}\n{}", pod.log());
}

/// Answers every datagram on `ip` with `name`, `delay` after it came.
async fn late_udp_backend(name: &str, ip: Ipv4Addr, delay: Duration) -> Backend {
    let socket = Arc::new(UdpSocket::bind((ip, 0)).await.expect("bind UDP backend"));
    let addr = socket.local_addr().expect("addr");
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    let reply = name.to_string();
    let task = tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        while let Ok((_, from)) = socket.recv_from(&mut buf).await {
            counter.fetch_add(1, Ordering::SeqCst);
            let (socket, reply) = (socket.clone(), reply.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = socket.send_to(reply.as_bytes(), from).await;
            });
        }
    });
    Backend { name: name.to_string(), addr, served, task }
}

/// One datagram through nginx from a fresh socket: when it was sent (since `since`), and
/// whether a reply came within a second.
async fn udp_exchange(port: u16, since: Instant) -> (Duration, bool) {
    let Ok(socket) = UdpSocket::bind("127.0.0.1:0").await else { return (since.elapsed(), false) };
    let sent = socket.connect(("127.0.0.1", port)).await.is_ok() && socket.send(b"who are you?").await.is_ok();
    let at = since.elapsed();
    let mut buf = [0u8; 64];
    (at, sent && matches!(timeout(Duration::from_secs(1), socket.recv(&mut buf)).await, Ok(Ok(_))))
}

/// What a reload costs UDP: the exchanges whose reply is on its way at that moment, and only
/// those. A retiring worker closes the listening socket its replies would leave from and ends
/// its pending sessions (nginx's stream proxy: "disconnected on shutdown"), while the master
/// keeps the socket, so the new workers answer every datagram after it. Here replies come
/// 200 ms late and an exchange starts every 25 ms: about 8 are pending at the reload.
#[tokio::test]
async fn a_reload_loses_only_the_udp_replies_pending_at_its_moment() {
    const LATE: Duration = Duration::from_millis(200);
    let Some(bin) = nginx_binary() else { return };
    let backends =
        [late_udp_backend("a", BACKEND_IPS[0], LATE).await, late_udp_backend("b", BACKEND_IPS[1], LATE).await];
    let listen = free_udp_port();
    let pod = LivePod::start(RELOAD_POLICY);
    let to_a = pod.desire(&live_udp_conf(&bin, &backends, listen, "a"));
    pod.serving(&to_a).await;
    assert!(udp_exchange(listen, Instant::now()).await.1, "{}", pod.log());

    // An exchange every 25 ms for 3 s, and the reload 1 s in.
    let started = Instant::now();
    let starter = tokio::spawn(async move {
        let mut exchanges = Vec::new();
        while started.elapsed() < Duration::from_secs(3) {
            exchanges.push(tokio::spawn(udp_exchange(listen, started)));
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        exchanges
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let written = started.elapsed();
    let to_b = pod.desire(&live_udp_conf(&bin, &backends, listen, "b"));
    pod.serving(&to_b).await;
    let served = started.elapsed();
    let exchanges = timeout(STEP, starter).await.expect("in time").expect("the starter");
    let mut lost = Vec::new();
    for exchange in exchanges {
        let (at, answered) = exchange.await.expect("the exchange");
        if !answered {
            lost.push(at);
        }
    }
    lost.sort();
    eprintln!(
        "UDP exchanges every 25 ms, replies {LATE:?} late, the new workers serving {served:?} in, \
         the new configuration written {written:?} in, lost those started at {lost:?}"
    );
    // Lost: the exchanges pending when the old workers retire, i.e. those sent in the `LATE`
    // before, one every 25 ms (about 8). That moment is after the write, and at most 0.1 s (nginx's
    // pause before it retires them) plus a poll of the entrypoint (0.25 s) after the new workers
    // were named served. The 100 ms beyond `LATE` are for a stall of this busy test process.
    let (Some(first), Some(last)) = (lost.first(), lost.last()) else {
        panic!("a reload with replies pending lost none: has nginx changed?\n{}", pod.log());
    };
    assert!(served < Duration::from_secs(3), "the reload came after the exchanges: {served:?}");
    assert!(lost.len() <= 14, "{lost:?}\n{}", pod.log());
    let spread = *last - *first;
    assert!(spread <= LATE + Duration::from_millis(100), "lost over {spread:?}: {lost:?}\n{}", pod.log());
    let after = written.saturating_sub(LATE);
    assert!(*first >= after && *last <= served + Duration::from_millis(350), "{lost:?}\n{}", pod.log());
}

/// A file `nginx -t` accepts that nginx cannot load, as its port is held by another process:
/// nginx keeps serving the previous one, and the entrypoint says so instead of naming it served.
#[tokio::test]
async fn a_configuration_nginx_cannot_load_is_reported_and_the_previous_one_kept() {
    let Some(bin) = nginx_binary() else { return };
    let Serving { backends, listen, pod, id: to_a } = serving_a(&bin).await;
    assert_eq!(ask_once(listen).await.as_deref(), Some("a"), "{}", pod.log());

    let held = std::net::TcpListener::bind("0.0.0.0:0").expect("bind");
    let taken = held.local_addr().expect("addr").port();
    let unloadable = pod.desire(&live_conf(&bin, &backends, taken, "b"));
    let written = Instant::now();
    pod.until(NGINX_DEADLINE, "the report", |pod| pod.read("rejected").starts_with(&unloadable)).await;
    eprintln!("a file nginx could not load reported {:?} after it was written", written.elapsed());
    assert!(pod.read("rejected").contains("did not apply"), "{}", pod.read("rejected"));
    assert_eq!(pod.read("served"), format!("{to_a}\n"), "{}", pod.log());
    assert_eq!(ask_once(listen).await.as_deref(), Some("a"), "{}", pod.log());
    let log = pod.log();
    assert!(log.contains("Address already in use") && log.contains("nginx did not apply configuration"), "{log}");
    drop(held);
}

//! Live configuration: the live entrypoint applying new files to a running nginx, moving new
//! connections and keeping open ones, within its bound of draining workers.

use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use balancer::api::BalancerSpec;
use balancer::proxy::nginx;
use balancer::proxy::reload::{self, LiveFiles, RELOAD_POLICY, ReloadPolicy};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpStream, UdpSocket};
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use crate::backends::{Backend, addresses, admitted, sample_spec, serving_backend};
use crate::process::{NginxBinary, nginx_binary, signal};
use crate::support::fixtures::{backend, port};
use crate::support::ports::listen_port;
use crate::{BACKEND_IPS, NGINX_DEADLINE, STEP};

/// Answers every line a client sends with its name and a newline, for as long as the client
/// holds the connection.
async fn naming_backend(name: &str, ip: Ipv4Addr) -> Backend {
    serving_backend(name, ip, format!("{name}\n"), |stream, reply| async move {
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        while let Ok(Some(_)) = lines.next_line().await {
            if write.write_all(reply.as_bytes()).await.is_err() {
                break;
            }
        }
    })
    .await
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
        let log = fs::File::create(at("stderr.log")).expect("log file");
        let (mut shell, tools) = crate::support::shell::shell(dir.path());
        let child = shell
            .env("PATH", format!("{tools}{}", std::env::var("PATH").unwrap_or_default()))
            .envs(reload::live_environment(&files, policy))
            .args(["-c", reload::LIVE_ENTRYPOINT, "nginx", "-c", &running, "-e", "stderr", "-g"])
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
    let listen = listen_port();
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
    let listen = listen_port();
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
    let listen = listen_port();
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

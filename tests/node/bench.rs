//! Benchmarks on the real node (`BALANCER_NODE_BENCH=1`; without it they print how to run them
//! and pass): each measures copies of the sample's proxy side by side, on the same node, in
//! interleaved rounds, and prints its figures for docs/performance.md. They assert nothing.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::fixtures::{Sample, balancers, front_ip, proxy_conf, wait_available, wait_ready_balancer};
use crate::node::Node;
use crate::sidecar::sidecar_counts;
use crate::toolkit::load::one_request;
use crate::toolkit::runner::eventually;
use crate::{NS, SAMPLE, World};
use balancer::proxy::{Owner, ProxySettings};
use balancer::spec::{ObjectName, SpecPolicy, admit};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

/// Whether benchmarks run (`BALANCER_NODE_BENCH`); says how to run `what` when they do not.
fn enabled(what: &str) -> bool {
    let enabled = std::env::var_os("BALANCER_NODE_BENCH").is_some();
    if !enabled {
        println!("node: {what} is measured with BALANCER_NODE_BENCH=1");
    }
    enabled
}

/// `conf` without nginx's access log (the metrics sidecar's feed).
fn without_access_log(conf: &str) -> String {
    conf.lines().filter(|l| !l.contains("log_format") && !l.contains("access_log")).map(|l| format!("{l}\n")).collect()
}

/// A Balancer `name` with the sample's backends (40/20/40) and one proxy pod, its upstreams
/// `upstreams` (`Pods` or `Services`), as the operator builds it (live configuration, the
/// metrics sidecar, nginx's access log): its front Service's address, once Ready, and its
/// `nginx.conf`.
async fn bench_balancer(world: &World, name: &str, upstreams: &str) -> (String, String) {
    let yaml = format!(
        "apiVersion: exposer.hliangzhao.io/v1beta1\nkind: Balancer\nmetadata: {{name: {name}, namespace: {NS}}}\n\
         spec:\n  replicas: 1\n  ports: [{{name: http, protocol: TCP, port: 80, targetPort: 5678}}]\n\
         \x20 selector: {{app: test}}\n  proxy: {{upstreams: {upstreams}}}\n\
         \x20 backends:\n  - {{name: v1, weight: 40, selector: {{version: v1}}}}\n\
         \x20 - {{name: v2, weight: 20, selector: {{version: v2}}}}\n  - {{name: v3, weight: 40, selector: {{version: v3}}}}\n"
    );
    world.kubectl.apply(&yaml);
    wait_ready_balancer(world, name, Duration::from_secs(120)).await;
    let address = format!("{}:80", front_ip(world, name).await);
    eventually(&format!("{name} answering"), Duration::from_secs(30), || async { one_request(&address).await.ok() })
        .await;
    (address, proxy_conf(world, name).await.expect("its nginx.conf"))
}

/// The sample's proxy pod template as the operator builds it without the metrics sidecar: nginx
/// reads the mounted ConfigMap once (its hash in `BALANCER_CONFIG_HASH`). The copies below run
/// a file of their own in it.
async fn mounted_template(world: &World) -> Value {
    let sample = balancers(world).get(SAMPLE).await.expect("the sample");
    let owner = Owner::of(&sample).expect("a stored Balancer");
    let spec = admit(ObjectName::Name(SAMPLE), sample.spec.clone(), &SpecPolicy::default())
        .unwrap_or_else(|report| panic!("the sample is valid: {:?}", report.errors));
    let deployments: Api<Deployment> = Api::namespaced(world.admin.clone(), NS);
    let live = deployments.get("example-balancer-proxy").await.expect("the proxy Deployment");
    let image = live.spec.and_then(|s| s.template.spec?.containers.into_iter().next()?.image).expect("an image");
    let settings = ProxySettings {
        image,
        load_modules: Vec::new(),
        metrics_image: None,
        policy: SpecPolicy::default(),
        signer: None,
    };
    let deployment = balancer::proxy::proxy_deployment(&owner, &spec, &settings, "");
    serde_json::to_value(deployment.spec.expect("spec").template).expect("template")
}

/// A ConfigMap, Deployment and Service `name`: the proxy's pod `template` running `conf`
/// (with or without the metrics sidecar), told the hash of `conf` so that its entrypoint
/// starts on it.
fn proxy_copy(template: &Value, name: &str, conf: &str, sidecar: bool) -> [Value; 3] {
    let mut template = template.clone();
    template["metadata"] = json!({"labels": {"app": name}});
    if !sidecar {
        // The metrics sidecar is the pod's one (native sidecar) init container.
        template["spec"].as_object_mut().expect("spec").remove("initContainers");
    }
    let hash = balancer::proxy::nginx::config_hash(conf);
    let spec = &mut template["spec"];
    for list in ["containers", "initContainers"] {
        for container in spec[list].as_array_mut().into_iter().flatten() {
            // The hash of `conf` in place of the template's; the entrypoint's other variables stay.
            let name = balancer::proxy::nginx::CONFIG_HASH_ENV;
            let mut env = container["env"].as_array().cloned().unwrap_or_default();
            env.retain(|variable| variable["name"] != name);
            env.insert(0, json!({"name": name, "value": hash}));
            container["env"] = Value::Array(env);
        }
    }
    for volume in template["spec"]["volumes"].as_array_mut().expect("volumes") {
        if volume.get("configMap").is_some() {
            volume["configMap"]["name"] = json!(name);
        }
    }
    [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS},
               "data": {"nginx.conf": conf}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
               "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 80}]}}),
    ]
}

/// Applies `objects` (a List) and waits until each of `names` answers at its Service: their
/// addresses, in order.
async fn deploy(world: &World, objects: &str, names: &[&str]) -> Vec<String> {
    world.kubectl.apply(objects);
    let mut addresses = Vec::new();
    for name in names {
        wait_available(world, NS, name, 1).await;
        let address = format!("{}:80", front_ip(world, name).await);
        eventually(&format!("{name} answering"), Duration::from_secs(30), || async {
            one_request(&address).await.ok()
        })
        .await;
        addresses.push(address);
    }
    addresses
}

/// Sessions per second through two fresh copies of the sample's proxy, one as the operator
/// builds it (the metrics sidecar, nginx's access log) and one without either: same image,
/// node, backends and rounds, a new connection per request, interleaved rounds. Prints the
/// figures; asserts nothing.
pub async fn the_metrics_sidecar_costs_little(world: &mut World) {
    if !enabled("the sidecar's cost") {
        return;
    }
    world.ensure_sample(Sample::ANY).await;
    // Both are new pods: each new connection takes a port of its proxy pod towards a backend
    // pod, which keeps the closed connection in TIME_WAIT for a minute, so a proxy that served
    // the earlier scenarios would meet those and wait for SYN retransmissions sooner than a
    // fresh one.
    let (with_sidecar, conf) = bench_balancer(world, "bench-sidecar", "Pods").await;
    let template = mounted_template(world).await;
    let objects = json!({"apiVersion": "v1", "kind": "List",
                         "items": proxy_copy(&template, "bench-plain", &without_access_log(&conf), false)})
    .to_string();
    let without = deploy(world, &objects, &["bench-plain"]).await.remove(0);

    // Short rounds, so that neither copy comes near a backend's TIME_WAIT ports (about 14,000
    // connections a minute from one proxy pod to one backend pod).
    let (mut ratios, mut rates) = (Vec::new(), Vec::new());
    for round in 0..6 {
        // Alternate which goes first (the second of a round does worse), as often each way.
        let order = if round % 2 == 0 { [&with_sidecar, &without] } else { [&without, &with_sidecar] };
        let mut rate = BTreeMap::new();
        for address in order {
            rate.insert(address.clone(), sessions_per_second(address, Duration::from_secs(1)).await);
        }
        let (a, b) = (rate[&with_sidecar], rate[&without]);
        println!("node: bench round {round}: {a:.0} sessions/s with the sidecar, {b:.0} without: {:.3}×", a / b);
        ratios.push(a / b);
        rates.push((a.round(), b.round()));
    }
    let pod = Api::<Pod>::namespaced(world.admin.clone(), NS)
        .list(&ListParams::default().labels(&balancer::proxy::proxy_selector_string("bench-sidecar")))
        .await
        .expect("pods")
        .items
        .into_iter()
        .find_map(|p| p.status?.pod_ip)
        .expect("the copy's pod");
    let unread = proxy_series(&format!("{pod}:9113"), "balancer_proxy_log_unread_bytes").await;
    let counted = proxy_series(&format!("{pod}:9113"), "balancer_proxy_sessions_total").await;
    println!(
        "node: bench: the metrics sidecar's cost, median of 6 interleaved rounds: {:.3}× ({rates:?}); \
         sessions counted {counted:?}, log bytes unread {unread:?}",
        median(ratios)
    );
    world.kubectl.ok_with(&["delete", "-f", "-", "--wait=false"], &objects);
    world.kubectl.ok(&["-n", NS, "delete", "balancer", "bench-sidecar", "--wait=false"]);
}

/// New connection per request, 32 clients, for `duration`: answered requests per second.
async fn sessions_per_second(address: &str, duration: Duration) -> f64 {
    let deadline = Instant::now() + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let address = address.to_string();
        tasks.spawn(async move {
            let mut answered = 0usize;
            while Instant::now() < deadline {
                answered += usize::from(one_request(&address).await.is_ok());
            }
            answered
        });
    }
    let answered: usize = tasks.join_all().await.into_iter().sum();
    answered as f64 / duration.as_secs_f64()
}

/// The sum of a series' samples from a proxy pod's metrics sidecar.
async fn proxy_series(address: &str, name: &str) -> Option<f64> {
    Some(sidecar_counts(address, name, "").await?.values().sum())
}

/// Stops HAProxy as the proxy's entrypoint stops nginx: the kubelet's SIGTERM becomes a soft
/// stop (SIGUSR1: stop listening, let open connections finish).
const HAPROXY_ENTRYPOINT: &str = "trap 'kill -USR1 \"$p\"; wait \"$p\"; exit $?' TERM; haproxy -W -db -f /etc/balancer/haproxy.cfg & p=$!; wait \"$p\"";

/// HAProxy in TCP mode in the proxy's place: the proxy's pod template (resources, security,
/// probes, stop hook, node, image base) with HAProxy's command, two threads as nginx has two
/// workers, and `servers` (address, weight) in weighted round robin, as nginx.conf has them.
fn haproxy_copy(template: &Value, name: &str, servers: &[(String, u32)]) -> [Value; 3] {
    let mut config = String::from(
        "global\n    maxconn 8192\n    nbthread 2\n\ndefaults\n    mode tcp\n    timeout connect 5s\n    \
         timeout client 10m\n    timeout server 10m\n\nfrontend front\n    bind :80\n    default_backend backends\n\n\
         backend backends\n    balance roundrobin\n",
    );
    for (i, (address, weight)) in servers.iter().enumerate() {
        config.push_str(&format!("    server b{i} {address} weight {weight}\n"));
    }
    let [_, mut deployment, service] = proxy_copy(template, name, "", false);
    let container = &mut deployment["spec"]["template"]["spec"]["containers"][0];
    container["name"] = json!("haproxy");
    container["command"] = json!(["/bin/sh", "-c", HAPROXY_ENTRYPOINT]);
    container["args"] = Value::Null;
    container["env"] = Value::Null;
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS},
                            "data": {"haproxy.cfg": config}});
    [config_map, deployment, service]
}

/// The upstream servers of the first port in a rendered nginx.conf: (address, weight).
fn upstream_servers(conf: &str) -> Vec<(String, u32)> {
    conf.lines()
        .map(str::trim)
        .skip_while(|l| !l.starts_with("upstream "))
        .skip(1)
        .take_while(|l| *l != "}")
        .filter_map(|l| {
            let rest = l.strip_prefix("server ")?;
            let address = rest.split(' ').next()?.to_string();
            let weight = rest.split(' ').find_map(|w| w.strip_prefix("weight="))?.parse().ok()?;
            Some((address, weight))
        })
        .collect()
}

/// conntrack's TIME_WAIT timeout on the host, shortened to 1 s while the data-plane benchmark
/// runs, and restored on drop. Every proxied connection leaves two entries (client to the front
/// Service, proxy to a backend Service), for 120 s by default: a few runs with a new connection
/// per request fill the host's table (262,144 here), after which the kernel drops packets and
/// every later run measures SYN retransmissions, not the proxy.
struct ShortTimeWait(Option<String>);

const TIME_WAIT: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_time_wait";

impl ShortTimeWait {
    fn set() -> ShortTimeWait {
        let before = std::fs::read_to_string(TIME_WAIT).ok();
        if before.is_some() {
            let _ = std::fs::write(TIME_WAIT, "1");
        }
        ShortTimeWait(before)
    }
}

impl Drop for ShortTimeWait {
    fn drop(&mut self) {
        if let Some(before) = &self.0 {
            let _ = std::fs::write(TIME_WAIT, before.trim());
        }
    }
}

/// Waits (up to 30 s) until the host's conntrack table is below a quarter full; returns how
/// full it is, as a fraction.
async fn settled_conntrack() -> f64 {
    let read = |file: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/netfilter/{file}")).ok()?.trim().parse::<f64>().ok()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let full = match (read("nf_conntrack_count"), read("nf_conntrack_max")) {
            (Some(count), Some(max)) if max > 0.0 => count / max,
            _ => return 0.0,
        };
        if full < 0.25 || Instant::now() > deadline {
            return full;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// How long a backend pod keeps a closed connection in TIME_WAIT (Linux's fixed 60 s), and
/// so how long apart two runs of one path with a new connection per request must be. A run
/// connects about 8,000 times from one pod to one backend, and Linux tries only every other
/// local port for a destination (about 14,000): a second run within the minute meets the
/// first's ports still in TIME_WAIT at the backend and waits for SYN retransmissions (a
/// fifth of the throughput, p99 × 4, seen when the order's reversal made a path's two runs
/// 45 s apart).
const CLOSE_RUNS_APART: Duration = Duration::from_secs(62);

/// The kubelets held still (SIGSTOP) while a run measures, and let go (SIGCONT) when this is
/// dropped, on a panic too. Each kubelet's housekeeping (container stats, pod sync) takes 5 % of
/// a CPU on average here, in passes of tens of milliseconds: on a node whose two CPUs the run
/// saturates, such a pass is a stall in some path's p99 and not in another's.
struct KubeletsPaused<'a>(&'a [Node; 2]);

impl<'a> KubeletsPaused<'a> {
    fn new(nodes: &'a [Node; 2]) -> Self {
        nodes.iter().for_each(|node| node.pause_kubelet(true));
        KubeletsPaused(nodes)
    }
}

impl Drop for KubeletsPaused<'_> {
    fn drop(&mut self) {
        self.0.iter().for_each(|node| node.pause_kubelet(false));
    }
}

/// How long the kubelets run between two paused runs, to catch up (their leases, the pods'
/// probes and statuses) away from the measurement.
const KUBELETS_CATCH_UP: Duration = Duration::from_secs(1);

/// The machine's CPU time so far (`/proc/stat`), in ticks: all of it, and what the hypervisor
/// gave to others while this virtual machine wanted to run (steal). A run's p99 on a virtual
/// machine includes the stalls of a virtual CPU descheduled, which no path controls.
struct CpuTimes {
    total: u64,
    steal: u64,
}

impl CpuTimes {
    fn now() -> Option<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        // cpu  user nice system idle iowait irq softirq steal guest guest_nice
        let ticks: Vec<u64> =
            stat.lines().next()?.split_whitespace().skip(1).take(8).filter_map(|t| t.parse().ok()).collect();
        Some(CpuTimes { total: ticks.iter().sum(), steal: *ticks.get(7)? })
    }

    /// The share of the CPU time since `before` that was stolen.
    fn stolen_since(&self, before: &CpuTimes) -> f64 {
        let total = self.total.saturating_sub(before.total).max(1);
        self.steal.saturating_sub(before.steal) as f64 / total as f64
    }
}

/// Rounds of the data-plane benchmark: its figures are medians, since one round's p99 ratio
/// can be far from the others' on a shared node. `BALANCER_NODE_BENCH_ROUNDS` changes it; runs
/// of the same build can be pooled (docs/performance.md says which were).
const ROUNDS: usize = 11;

/// The median throughput and the median p99 of `runs`, taken separately.
fn median_run(runs: &[Run]) -> Run {
    Run {
        requests_per_second: median(runs.iter().map(|r| r.requests_per_second).collect()),
        p99_ms: median(runs.iter().map(|r| r.p99_ms).collect()),
        errors: runs.iter().map(|r| r.errors).sum(),
    }
}

/// The middle value, or the mean of the two middle ones; 0 when there is none.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// What one wrk run measured.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    requests_per_second: f64,
    p99_ms: f64,
    errors: u64,
}

/// How wrk loads a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    /// 2 threads, 16 connections kept alive, 8 s: the node's two CPUs saturated.
    KeepAlive,
    /// 2 threads, 16 connections, a new connection per request, 4 s.
    NewConnection,
}

impl Mode {
    const ALL: [Mode; 2] = [Mode::KeepAlive, Mode::NewConnection];

    fn name(self) -> &'static str {
        match self {
            Mode::KeepAlive => "keep-alive",
            Mode::NewConnection => "new connection",
        }
    }

    /// wrk's arguments before the URL.
    fn args(self) -> &'static [&'static str] {
        match self {
            Mode::KeepAlive => &["-t2", "-c16", "-d8s"],
            Mode::NewConnection => &["-t2", "-c16", "-d4s", "-H", "Connection: close"],
        }
    }
}

/// `wrk --latency` against `address` in `mode`; `None` when wrk is missing or printed no
/// figures.
async fn wrk(address: &str, mode: Mode) -> Option<Run> {
    let mut command = Command::new("wrk");
    command.args(mode.args()).arg("--latency").arg(format!("http://{address}/"));
    let out = tokio::task::spawn_blocking(move || command.output()).await.ok()?.ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let requests_per_second = text.lines().find_map(|l| l.strip_prefix("Requests/sec:"))?.trim().parse().ok()?;
    let p99_ms = millis(text.lines().find_map(|l| l.trim().strip_prefix("99%"))?.trim())?;
    // "Socket errors: connect 0, read 0, write 0, timeout 0" and "Non-2xx or 3xx responses: N".
    let errors = text
        .lines()
        .filter(|l| l.contains("Socket errors") || l.contains("Non-2xx"))
        .flat_map(|l| l.split([',', ':']).filter_map(|w| w.split_whitespace().last()?.parse::<u64>().ok()))
        .sum();
    Some(Run { requests_per_second, p99_ms, errors })
}

/// wrk's latency (`812.00us`, `24.00ms`, `1.20s`) in milliseconds.
fn millis(text: &str) -> Option<f64> {
    if let Some(us) = text.strip_suffix("us") {
        return Some(us.parse::<f64>().ok()? / 1000.0);
    }
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse().ok();
    }
    Some(text.strip_suffix('s')?.parse::<f64>().ok()? * 1000.0)
}

/// The data plane against HAProxy, from the host with wrk in each [`Mode`] (the kubelets
/// paused, [`KubeletsPaused`]), [`ROUNDS`] interleaved rounds, on the same node and backends:
/// one backend's Service directly; the proxy as the operator builds it
/// (with the metrics sidecar); HAProxy in its place; and the same nginx without the access log
/// and sidecar. With `BALANCER_NODE_BENCH_KNOBS=1`, also that nginx with one knob changed each
/// (reuseport, one worker, 500m CPU requested, workers pinned to CPUs, 64k buffers). Prints
/// each path's medians and, for the comparisons, the median of the ratios taken within each
/// round, for docs/performance.md.
pub async fn the_data_plane_keeps_up_with_haproxy(world: &mut World) {
    if !enabled("the data plane's speed") {
        return;
    }
    world.ensure_sample(Sample::ANY).await;
    if Command::new("wrk").arg("--version").output().is_err() {
        println!("node: the data-plane benchmark needs wrk (apt-get install wrk)");
        return;
    }
    let rounds = std::env::var("BALANCER_NODE_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(ROUNDS);
    // balancer as the operator builds it, with each kind of upstream; HAProxy and nginx alone
    // (no sidecar, no access log) in the same pod template, on the same pods.
    let (pods, conf) = bench_balancer(world, "bench-pods", "Pods").await;
    let (services, _) = bench_balancer(world, "bench-services", "Services").await;
    let template = mounted_template(world).await;
    let plain = without_access_log(&conf);
    let servers = upstream_servers(&plain);
    assert!(servers.len() >= 3, "the sample's backends' pods: {plain}");
    let mut copies = vec![
        ("bench-haproxy", haproxy_copy(&template, "bench-haproxy", &servers)),
        ("bench-nginx", proxy_copy(&template, "bench-nginx", &plain, false)),
    ];
    if std::env::var_os("BALANCER_NODE_BENCH_KNOBS").is_some() {
        copies.extend(knob_copies(&template, &plain));
    }
    let names: Vec<&str> = copies.iter().map(|(name, _)| *name).collect();
    let items: Vec<Value> = copies.into_iter().flat_map(|(_, objects)| objects).collect();
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    let copied = deploy(world, &objects, &names).await;
    // The product and HAProxy side by side, so that reversing the order keeps them neighbours.
    let mut targets: Vec<(String, String)> = vec![
        ("direct (v1's Service)".into(), format!("{}:80", front_ip(world, "example-balancer-v1-backend").await)),
        ("bench-services".into(), services),
        ("bench-pods".into(), pods),
    ];
    targets.extend(names.iter().map(|n| n.to_string()).zip(copied));

    let _time_wait = ShortTimeWait::set();
    let mut runs = Runs::new();
    // When each path's last run with a new connection per request ended.
    let mut closed: BTreeMap<String, Instant> = BTreeMap::new();
    for round in 0..rounds {
        for mode in Mode::ALL {
            // Every other round in reverse, so that no path always follows the same one (the
            // run after direct's 65,000 requests a second starts on a busier node).
            let mut order = targets.clone();
            if round % 2 == 1 {
                order.reverse();
            }
            for (name, address) in &order {
                let new_connections = mode == Mode::NewConnection;
                if let Some(ended) = closed.get(name).filter(|_| new_connections) {
                    tokio::time::sleep(CLOSE_RUNS_APART.saturating_sub(ended.elapsed())).await;
                }
                let full = settled_conntrack().await;
                let before = CpuTimes::now();
                let run = {
                    let _still = KubeletsPaused::new(&world.nodes);
                    wrk(address, mode).await
                };
                let stolen = before.and_then(|before| Some(CpuTimes::now()?.stolen_since(&before)));
                // The kubelets' work of the pause, done before the next run.
                tokio::time::sleep(KUBELETS_CATCH_UP).await;
                if new_connections {
                    closed.insert(name.clone(), Instant::now());
                }
                let Some(run) = run else { continue };
                println!(
                    "node: bench round {round}, {name}, {} (conntrack {:.0} % full, stolen {}): {run:?}",
                    mode.name(),
                    full * 100.0,
                    stolen.map_or("?".to_string(), |s| format!("{:.1} %", s * 100.0)),
                );
                runs.entry((name.clone(), mode)).or_default().insert(round, run);
            }
        }
    }
    let errors: u64 = runs.values().flat_map(BTreeMap::values).map(|r| r.errors).sum();
    println!(
        "node: bench: the data plane, medians of {rounds} rounds (errors in all runs: {errors}):\n{}\n{}",
        medians_table(&targets, &runs),
        ratios_table(&runs),
    );
    world.kubectl.ok_with(&["delete", "-f", "-", "--wait=false"], &objects);
    world.kubectl.ok(&["-n", NS, "delete", "balancer", "bench-pods", "bench-services", "--wait=false"]);
}

/// nginx without the access log and sidecar (`plain`), with one knob changed each.
fn knob_copies(template: &Value, plain: &str) -> Vec<(&'static str, [Value; 3])> {
    let reuseport =
        plain.replace("listen 80;", "listen 80 reuseport;").replace("listen [::]:80;", "listen [::]:80 reuseport;");
    let one_worker = plain.replace("worker_processes 2;", "worker_processes 1;");
    let pinned = plain.replace("worker_processes 2;", "worker_processes 2;\nworker_cpu_affinity auto;");
    let buffers = plain.replace("stream {\n", "stream {\n    proxy_buffer_size 64k;\n");
    assert!(pinned != plain && buffers != plain, "the knobs apply to the rendered file");
    let mut more_cpu = template.clone();
    more_cpu["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("500m");
    vec![
        ("bench-reuseport", proxy_copy(template, "bench-reuseport", &reuseport, false)),
        ("bench-one-worker", proxy_copy(template, "bench-one-worker", &one_worker, false)),
        ("bench-cpu", proxy_copy(&more_cpu, "bench-cpu", plain, false)),
        ("bench-affinity", proxy_copy(template, "bench-affinity", &pinned, false)),
        ("bench-buffers", proxy_copy(template, "bench-buffers", &buffers, false)),
    ]
}

/// Runs by path and mode, each with its round.
type Runs = BTreeMap<(String, Mode), BTreeMap<usize, Run>>;

/// Each path's median throughput and p99, by mode, and their ratios to HAProxy's medians.
fn medians_table(targets: &[(String, String)], runs: &Runs) -> String {
    let at = |name: &str, mode: Mode| {
        median_run(
            &runs.get(&(name.to_string(), mode)).map(|r| r.values().copied().collect::<Vec<_>>()).unwrap_or_default(),
        )
    };
    let mut table = String::from("| path |");
    for mode in Mode::ALL {
        table.push_str(&format!(" {} req/s (p99 ms) | ÷ HAProxy (p99) |", mode.name()));
    }
    table.push_str(&format!("\n|---|{}\n", "---|---|".repeat(Mode::ALL.len())));
    for (name, _) in targets {
        table.push_str(&format!("| {name} |"));
        for mode in Mode::ALL {
            let (run, haproxy) = (at(name, mode), at("bench-haproxy", mode));
            table.push_str(&format!(
                " {:.0} ({:.2}) | {:.2}× ({:.2}×) |",
                run.requests_per_second,
                run.p99_ms,
                run.requests_per_second / haproxy.requests_per_second,
                run.p99_ms / haproxy.p99_ms,
            ));
        }
        table.push('\n');
    }
    table
}

/// balancer and nginx against HAProxy, and balancer against nginx: the median of the ratios of
/// runs in the same round (which share the node's state of the moment), its 95 % interval, the
/// lowest and highest, and for p99 how many rounds were over the goal's 1.2×.
fn ratios_table(runs: &Runs) -> String {
    let mut table = String::from("| ratio (median of rounds; 95 % interval; range) |");
    for mode in Mode::ALL {
        table.push_str(&format!(" {} |", mode.name()));
    }
    table.push_str(&format!("\n|---|{}\n", "---|".repeat(Mode::ALL.len())));
    let pairs = [
        ("bench-pods", "bench-haproxy"),
        ("bench-services", "bench-haproxy"),
        ("bench-nginx", "bench-haproxy"),
        ("bench-pods", "bench-nginx"),
    ];
    for (over, under) in pairs {
        for (what, figure) in
            [("throughput", (|r: &Run| r.requests_per_second) as fn(&Run) -> f64), ("p99", |r: &Run| r.p99_ms)]
        {
            table.push_str(&format!("| {over} ÷ {under}, {what} |"));
            for mode in Mode::ALL {
                let (Some(a), Some(b)) = (runs.get(&(over.to_string(), mode)), runs.get(&(under.to_string(), mode)))
                else {
                    table.push_str(" - |");
                    continue;
                };
                let mut ratios: Vec<f64> =
                    a.iter().filter_map(|(round, run)| Some(figure(run) / figure(b.get(round)?))).collect();
                ratios.sort_by(f64::total_cmp);
                let (Some(low), Some(high)) = (ratios.first(), ratios.last()) else {
                    table.push_str(" - |");
                    continue;
                };
                let interval =
                    median_interval(&ratios).map(|(from, to)| format!("95 %: {from:.2}–{to:.2}; ")).unwrap_or_default();
                let tail = if what == "p99" {
                    format!("; {} of {} over 1.2×", ratios.iter().filter(|r| **r > 1.2).count(), ratios.len())
                } else {
                    String::new()
                };
                table.push_str(&format!(" {:.2}× ({interval}{low:.2}–{high:.2}{tail}) |", median(ratios.clone())));
            }
            table.push('\n');
        }
    }
    table
}

/// A 95 % interval of the median of `sorted` values, free of any assumption on their
/// distribution (the sign test's): the `k`th lowest and the `k`th highest, for the largest `k`
/// with P(Binomial(n, ½) < k) ≤ 2.5 %. `None` below 6 values, which cannot give one.
fn median_interval(sorted: &[f64]) -> Option<(f64, f64)> {
    let n = sorted.len();
    // P(X < k) and P(X = k), for X ~ Binomial(n, ½).
    let (mut k, mut below, mut exactly) = (0, 0.0, 0.5f64.powi(i32::try_from(n).ok()?));
    while k < n / 2 && below + exactly <= 0.025 {
        below += exactly;
        k += 1;
        exactly *= (n - k + 1) as f64 / k as f64;
    }
    (k > 0).then(|| (sorted[k - 1], sorted[n - k]))
}

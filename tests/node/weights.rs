//! The sample Balancer's traffic: the README's walkthrough split by weight, a backend without
//! pods, weights changed and a backend removed under load, scaling, and deleting it; and the
//! watch on kube-proxy's rules that tells when a split can be measured.

use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::Api;
use kube::api::ListParams;

use crate::fixtures::{
    self, Sample, balancers, change_backends, front_ip, pod_ips, proxy_conf, refuses_root_pods, restricted_namespace,
    wait_available, wait_backends, wait_ready_balancer,
};
use crate::sidecar::{container_id, proxy_sessions, sidecar_counts};
use crate::toolkit::load::{Held, Load, assert_shares, one_request, shares_match, split};
use crate::toolkit::runner::eventually;
use crate::toolkit::wait::{self, balancer_until};
use crate::{NS, SAMPLE, World, nodes};

/// The README's walkthrough in a namespace that enforces `restricted`: the echo backends, the
/// sample, and the proxy pods balancer makes are all admitted.
pub async fn the_walkthrough_splits_traffic_by_weight(world: &mut World) {
    world.ensure_operator().await;
    restricted_namespace(world, NS);
    fixtures::namespace_made(world);
    let (refused, answer) = refuses_root_pods(world, NS);
    assert!(refused, "{NS} does not enforce `restricted`: {answer}");
    fixtures::make_echo_backends(world).await;
    fixtures::apply_shipped_sample(world);
    wait_ready_balancer(world, SAMPLE, Duration::from_secs(120)).await;
    // Ready means served: the first 100 connections after it already follow the split. The
    // front Service's cluster IP is kube-proxy's to program (a sync a second at most), from the
    // same EndpointSlice that Ready waits for: its first answer is awaited, and timed.
    let ready = Instant::now();
    let front = front_ip(world, SAMPLE).await;
    let address = format!("{front}:80");
    eventually("the front Service's first answer", Duration::from_secs(10), || async {
        one_request(&address).await.ok()
    })
    .await;
    let programmed = ready.elapsed();
    let first = split(&front, 80, 100).await;
    println!(
        "node: kube-proxy answered for the front Service {:.2} s after Ready; the first 100 connections: {first:?}",
        programmed.as_secs_f64()
    );
    assert_eq!(first.get("failed"), None, "every connection answered: {first:?}");
    assert_shares(&first, &[("hello world v1", 40), ("hello world v2", 20), ("hello world v3", 40)], 6.0);

    // The proxy pod runs as the builders say: uid 101, read-only root, the port-80 sysctl.
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let params = ListParams::default().labels(&format!("balancer.exposer.hliangzhao.io/balancer-name={SAMPLE}"));
    let proxy = pods.list(&params).await.expect("pods").items.into_iter().next().expect("a proxy pod");
    let spec = proxy.spec.expect("spec");
    assert_eq!(spec.security_context.as_ref().and_then(|s| s.run_as_user), Some(101));
    assert_eq!(spec.containers[0].security_context.as_ref().and_then(|s| s.read_only_root_filesystem), Some(true));
    // …with the metrics sidecar, in the operator's own image (deploy/'s env, set by `images:`).
    let sidecar = spec.init_containers.iter().flatten().next().expect("the metrics sidecar");
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"), "a native sidecar");
    assert_eq!((sidecar.name.as_str(), sidecar.image.as_deref()), ("metrics", Some("localhost/balancer:test")));

    let metrics = format!("{}:9113", proxy.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("a pod IP"));
    // The count before, once the sessions of the requests above are all in (nginx's workers
    // write their lines within a second; the sidecar reads them within 0.2 s).
    let before = eventually("the proxy's metrics sidecar to settle", Duration::from_secs(30), || async {
        let first = proxy_sessions(&metrics).await?;
        tokio::time::sleep(Duration::from_millis(2500)).await;
        (proxy_sessions(&metrics).await? == first).then_some(first)
    })
    .await;
    let counts = split(&front, 80, 3000).await;
    println!("node: 3000 requests through {front}:80: {counts:?}");
    assert_eq!(counts.get("failed"), None, "every request answered: {counts:?}");
    assert_shares(&counts, &[("hello world v1", 40), ("hello world v2", 20), ("hello world v3", 40)], 3.0);

    // The sidecar counts what the clients saw, per backend, within 1 % (the readiness probe's
    // sessions are counted too). Lines arrive as sessions end: it gets a moment to settle.
    let seen = |backend: &str| counts.get(&format!("hello world {backend}")).copied().unwrap_or(0) as f64;
    let counted = eventually("the sidecar's counts to settle", Duration::from_secs(10), || async {
        let after = proxy_sessions(&metrics).await?;
        let delta = |b: &str| after.get(b).copied().unwrap_or(0.0) - before.get(b).copied().unwrap_or(0.0);
        let all = ["v1", "v2", "v3"].map(delta);
        (all.iter().sum::<f64>() >= 3000.0).then_some(all)
    })
    .await;
    println!("node: the proxy's metrics sidecar counted {counted:?} sessions of v1, v2, v3 (clients saw {counts:?})");
    for (backend, counted) in ["v1", "v2", "v3"].iter().zip(counted) {
        let error = (counted - seen(backend)).abs() / seen(backend);
        assert!(error <= 0.01, "{backend}: the sidecar counted {counted}, the clients saw {}", seen(backend));
    }

    // Each backend in the status: one ready endpoint, and the share the weights give it.
    wait_backends(world, SAMPLE, &[1, 1, 1], &[40, 20, 40], "True", Duration::from_secs(15)).await;
    println!("node: kubectl get bal:\n{}", world.kubectl.ok(&["-n", NS, "get", "bal"]));
}

/// Backend v2 scaled to 0 under continuous TCP load: the status says so within 15 s, the
/// others take its share on the wire, and no request fails; scaled back, all returns.
pub async fn a_backend_without_pods_loses_its_share_without_a_failed_request(world: &mut World) {
    world.ensure_sample(Sample::AS_SHIPPED).await;
    let front = front_ip(world, SAMPLE).await;
    let load = Load::start(format!("{front}:80"), 4);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let v2 = leaving(world, "app=test,version=v2", "v2's pod").await;
    world.kubectl.ok(&["-n", NS, "scale", "deployment/echo-v2", "--replicas=0"]);
    let scaled = Instant::now();
    let sample = wait_backends(world, SAMPLE, &[1, 0, 1], &[50, 0, 50], "False", Duration::from_secs(15)).await;
    println!("node: v2 without endpoints in the status {:.1} s after scaling it to 0", scaled.elapsed().as_secs_f64());
    let status = sample.status.as_ref().expect("a status");
    assert_eq!(status.backends_ready.as_deref(), Some("2/3"), "{status:?}");
    let condition = wait::condition(&sample, "BackendsAvailable").expect("BackendsAvailable");
    let message = condition.message.as_str();
    assert!(message.contains("v2") && !message.contains("v1"), "{message}");
    println!("node: kubectl get bal -o wide:\n{}", world.kubectl.ok(&["-n", NS, "get", "bal", SAMPLE, "-o", "wide"]));

    // The split on the wire, over 5 s of the clients' requests once v2's pod is gone: until
    // then its terminating pod still answers the connections it had.
    v2.gone();
    let split = load.answers_within(Duration::from_secs(5)).await;
    println!("node: with v2 scaled to 0, 5 s of requests: {split:?}");
    assert_eq!(split.get("hello world v2").copied().unwrap_or(0), 0, "{split:?}");
    assert_shares(&split, &[("hello world v1", 50), ("hello world v3", 50)], 5.0);

    world.kubectl.ok(&["-n", NS, "scale", "deployment/echo-v2", "--replicas=1"]);
    wait_available(world, NS, "echo-v2", 1).await;
    wait_backends(world, SAMPLE, &[1, 1, 1], &[40, 20, 40], "True", Duration::from_secs(15)).await;
    load.assert_no_failures("while v2 went to 0 pods and back").await;
}

/// Every pod of backend v1 replaced under continuous load (`kubectl rollout restart`). With
/// upstreams of pods a terminating pod leaves nginx's configuration as soon as its endpoint says
/// so, and a connection that still meets it is retried on another: no request fails.
pub async fn a_backend_rolled_under_load_fails_no_request(world: &mut World) {
    world.ensure_sample(Sample::AS_SHIPPED).await;
    let front = front_ip(world, SAMPLE).await;
    let selector = "app=test,version=v1";
    let before = pod_ips(world, NS, selector).await;
    let load = Load::start(format!("{front}:80"), 4);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    world.kubectl.ok(&["-n", NS, "rollout", "restart", "deployment/echo-v1"]);
    world.kubectl.ok(&["-n", NS, "rollout", "status", "deployment/echo-v1", "--timeout=120s"]);
    let rolled = started.elapsed();
    let replaced = eventually("v1's old pods gone", Duration::from_secs(60), || async {
        let now = pod_ips(world, NS, selector).await;
        (!now.is_empty() && now.iter().all(|ip| !before.contains(ip))).then_some(now)
    })
    .await;
    wait_backends(world, SAMPLE, &[1, 1, 1], &[40, 20, 40], "True", Duration::from_secs(15)).await;
    let after = load.answers_within(Duration::from_secs(3)).await;
    assert!(after.contains_key("hello world v1"), "v1's new pods answer: {after:?}");
    let sent = load.assert_no_failures("while every pod of v1 was replaced").await;
    println!(
        "node: v1's pods {before:?} replaced by {replaced:?} (rolled out in {:.1} s): {sent} requests, 0 failed",
        rolled.as_secs_f64()
    );
}

/// The upstream lines of the sample's proxy configuration: in its ConfigMap, and as each proxy
/// pod mounted it (a failure's diagnosis).
fn print_proxy_configs(world: &World) {
    let upstreams = |conf: &str| conf.lines().filter(|l| l.contains("weight=")).collect::<Vec<_>>().join(" | ");
    let (_, conf, _) = world.kubectl.run(
        &["-n", NS, "get", "configmap", "example-balancer-proxy-configmap", "-o", "jsonpath={.data.nginx\\.conf}"],
        None,
    );
    println!("node: the ConfigMap's upstreams: {}", upstreams(&conf));
    let selector = "balancer.exposer.hliangzhao.io/balancer-name=example-balancer,app.kubernetes.io/component=proxy";
    let (_, pods, _) = world.kubectl.run(&["-n", NS, "get", "pods", "-l", selector, "-o", "name"], None);
    for pod in pods.lines() {
        let (_, conf, _) = world.kubectl.run(&["-n", NS, "exec", pod, "--", "cat", "/etc/balancer/nginx.conf"], None);
        let (_, hash, _) = world.kubectl.run(
            &[
                "-n",
                NS,
                "get",
                pod,
                "-o",
                "jsonpath={.metadata.annotations.balancer\\.exposer\\.hliangzhao\\.io/config-hash}",
            ],
            None,
        );
        println!("node: {pod} (config-hash {hash}) mounted: {}", upstreams(&conf));
    }
    for args in [
        &["-n", NS, "get", "services", "-o", "wide"][..],
        // What kube-proxy reads: a stale slice would send a share to a gone pod.
        &["-n", NS, "get", "endpointslices", "-o", "wide"][..],
        &["-n", NS, "get", "pods", "-o", "wide", "--show-labels"][..],
    ] {
        let (_, out, _) = world.kubectl.run(args, None);
        println!("node: kubectl {}:\n{out}", args.join(" "));
    }
    // kube-proxy's rules for the backend Services, as the node runs them.
    if let Ok(out) = Command::new("iptables-save").args(["-t", "nat"]).output() {
        let rules = String::from_utf8_lossy(&out.stdout);
        let ours: Vec<&str> =
            rules.lines().filter(|l| l.contains("example-balancer-v") && l.contains("-j KUBE-SEP")).collect();
        println!("node: kube-proxy's endpoint rules for the backends:\n{}", ours.join("\n"));
    }
}

/// Pods about to go (scaled away, or replaced by a rollout), watched in kube-proxy's rules.
pub struct Leaving {
    what: &'static str,
    dropped: std::thread::JoinHandle<Result<f64, String>>,
}

/// Takes the pods `selector` matches now, before the change that removes them.
pub async fn leaving(world: &World, selector: &str, what: &'static str) -> Leaving {
    Leaving { what, dropped: dropped_by_kube_proxy(pod_ips(world, NS, selector).await, Instant::now()) }
}

impl Leaving {
    /// Waits until kube-proxy no longer sends to the pods. A pod leaving serves through its stop
    /// hook (5 s for a proxy, 3 s for an echo backend), kube-proxy sends to such a terminating
    /// pod while its Service has no ready one (KEP-1669, on since v1.26), and it syncs at most
    /// once a second (from v1.28 on): a split measured before would still reach them.
    pub fn gone(self) {
        let dropped = self.dropped.join().expect("the kube-proxy watch");
        let dropped = dropped.unwrap_or_else(|e| panic!("kube-proxy and {}: {e}", self.what));
        println!("node: kube-proxy stopped sending to {} {dropped:.1} s after the change", self.what);
    }
}

/// Watches kube-proxy's NAT rules (every 200 ms, for up to 150 s: a proxy rollout may take
/// 120 s) until none sends to `ips`, which the first look must find: when that was, in seconds
/// from `since`, or why it is not known.
pub fn dropped_by_kube_proxy(ips: Vec<String>, since: Instant) -> std::thread::JoinHandle<Result<f64, String>> {
    std::thread::spawn(move || {
        let sends_to_them = || -> Result<bool, String> {
            let rules = Command::new("iptables-save").args(["-t", "nat"]).output().map_err(|e| e.to_string())?;
            let rules = String::from_utf8_lossy(&rules.stdout);
            Ok(ips.iter().any(|ip| rules.contains(&format!("--to-destination {ip}:"))))
        };
        if ips.is_empty() || !sends_to_them()? {
            return Err(format!("kube-proxy's rules never sent to {ips:?}"));
        }
        while since.elapsed() < Duration::from_secs(150) {
            std::thread::sleep(Duration::from_millis(200));
            if !sends_to_them()? {
                return Ok(since.elapsed().as_secs_f64());
            }
        }
        Err("still there after 150 s".into())
    })
}

/// How the live-change scenario flips the sample between v1 and v2: how many times, at least
/// how far apart (from one write to the next), and how many connections it holds open.
pub struct Flips {
    pub count: usize,
    pub apart: Duration,
    pub held: usize,
}

impl Flips {
    /// CI's 6 flips with 20 held connections; `BALANCER_NODE_FLIPS=full`, the 20 flips
    /// 5 s apart with 50; `=long`, 20 flips 30 s apart, so that the connections are held for
    /// 10 minutes under the default `drainTimeout` (1 h).
    pub fn from_env() -> Flips {
        match std::env::var("BALANCER_NODE_FLIPS").as_deref() {
            Ok("full") => Flips { count: 20, apart: Duration::from_secs(5), held: 50 },
            Ok("long") => Flips { count: 20, apart: Duration::from_secs(30), held: 50 },
            _ => Flips { count: 6, apart: Duration::ZERO, held: 20 },
        }
    }
}

/// The `q`-quantile of sorted `values` (nearest rank).
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let rank = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len().max(1));
    values.get(rank - 1).copied().unwrap_or(f64::NAN)
}

/// Weight changes reach the running proxy pods. Flipped between v1 and v2 under load, each flip
/// is on the wire within 2 s of the write, no request fails, no proxy pod is replaced, and
/// connections opened before the flips keep their backend through all of them. Then a backend
/// is removed, live too, and its Service goes.
pub async fn weights_change_live_without_a_new_pod_or_a_cut_connection(world: &mut World) {
    world.ensure_sample(Sample::AS_SHIPPED).await;
    let address = format!("{}:80", front_ip(world, SAMPLE).await);
    let pods = proxy_pod_uids(world).await;
    let size = Flips::from_env();
    let flips = size.count;
    let held = Held::open(&address, size.held).await;
    let load = Load::start(address.clone(), 4);
    let (mut seconds, mut reported, mut steps) = (Vec::with_capacity(flips), Vec::with_capacity(flips), Vec::new());
    let mut slowest_of_all = 0.0_f64;
    let replicas = i32::try_from(pods.len()).expect("a few pods");
    for flip in 0..flips {
        let (to, weights) = match flip % 2 {
            0 => ("hello world v1", [("v1", 100), ("v2", 0), ("v3", 0)]),
            _ => ("hello world v2", [("v1", 0), ("v2", 100), ("v3", 0)]),
        };
        // Where the time goes: the controller's write of the ConfigMap, each proxy pod's nginx
        // serving it (its sidecar says so), new connections to each pod getting it, and the
        // clients of the front Service getting it.
        let before_conf = proxy_conf(world, SAMPLE).await;
        let proxies = pod_ips(world, NS, &nodes::proxy_pods()).await;
        let mut before_served = Vec::new();
        for ip in &proxies {
            before_served.push(crate::sidecar::served_config(&format!("{ip}:9113")).await);
        }
        let written = Instant::now();
        change_backends(world, SAMPLE, &weights, &[]).await;
        let served = futures::future::join_all(proxies.iter().zip(before_served).map(|(ip, before)| {
            let sidecar = format!("{ip}:9113");
            async move { changed_after(written, before, || crate::sidecar::served_config(&sidecar)).await }
        }));
        let direct = futures::future::join_all(proxies.iter().map(|ip| only_answer(format!("{ip}:80"), to, written)));
        let ((on_wire, slowest), conf_at, served_at, direct_at) = tokio::join!(
            only_answer(address.clone(), to, written),
            changed_after(written, before_conf, || proxy_conf(world, SAMPLE)),
            served,
            direct,
        );
        let direct_at: Vec<f64> = direct_at.into_iter().map(|(at, _)| at).collect();
        steps.push(format!("{conf_at:.2}/{served_at:.2?}/{direct_at:.2?}/{on_wire:.2} (slowest {slowest:.2})"));
        seconds.push(on_wire);
        slowest_of_all = slowest_of_all.max(slowest);
        let seen = Instant::now();
        let what = "every proxy pod reported serving the change";
        balancer_until(&balancers(world), SAMPLE, what, Duration::from_secs(10), wait::programmed(replicas)).await;
        reported.push(seen.elapsed().as_secs_f64());
        tokio::time::sleep(Duration::from_secs(2).max(size.apart.saturating_sub(written.elapsed()))).await;
    }
    reported.sort_by(f64::total_cmp);
    println!(
        "node: the status reported every proxy pod configured at most {:.2} s after the clients saw each flip (all {reported:.2?})",
        reported[flips - 1]
    );
    assert!(reported[flips - 1] <= 1.0, "the status reported a flip more than 1 s late: {reported:?}");
    seconds.sort_by(f64::total_cmp);
    println!(
        "node: {flips} flips on the wire after (s, from the write): p50 {:.2}, p90 {:.2}, max {:.2}, all {seconds:.2?}",
        quantile(&seconds, 0.5),
        quantile(&seconds, 0.9),
        seconds[flips - 1]
    );
    println!(
        "node: each flip's ConfigMap written / served by each pod's nginx / on the wire at each pod / through the front Service, s from the write: {steps:?}"
    );
    assert!(seconds[flips - 1] <= 2.0, "a flip took longer than 2 s: {seconds:?}");
    // Connections are dated by their opening: none may wait longer than two SYN retransmissions
    // (1 s, then 2 s more) for its answer, so that a proxy slow to accept is not dated away.
    assert!(slowest_of_all <= 3.5, "a connection waited {slowest_of_all:.2} s for its answer: {steps:?}");

    // Removing a backend: live too, and its Service goes.
    change_backends(world, SAMPLE, &[("v1", 80), ("v2", 10), ("v3", 10)], &[]).await;
    change_backends(world, SAMPLE, &[], &["v3"]).await;
    let sample = wait_ready_balancer(world, SAMPLE, Duration::from_secs(60)).await;
    wait_live_as_the_guide_says(world);
    nodes::settled(world, NS, &nodes::proxy_pods(), pods.len()).await;
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    eventually("the removed backend's Service deleted", Duration::from_secs(30), || async {
        services.get_opt("example-balancer-v3-backend").await.ok()?.is_none().then_some(())
    })
    .await;
    let counts = split(&address.replace(":80", ""), 80, 1200).await;
    assert_shares(&counts, &[("hello world v1", 80), ("hello world v2", 10)], 4.0);
    load.assert_no_failures("during the live changes").await;
    held.assert_kept(&format!("through {flips} flips and a removed backend")).await;
    assert_eq!(proxy_pod_uids(world).await, pods, "the same proxy pods serve every change");
    assert_eq!(sample.status.expect("a status").active_backends, 2);
}

/// The guide's block that waits for a change to be live, run as it is, with `kubectl` pointed at
/// the suite's cluster and the sample's namespace.
fn wait_live_as_the_guide_says(world: &World) {
    let block = fixtures::sh_block("docs/guide.md", "--for=condition=Programmed");
    let kubeconfig = world.plane.kubeconfig("admin");
    let kubectl = format!("kubectl() {{ command kubectl --kubeconfig={} -n {NS} \"$@\"; }}", kubeconfig.display());
    let status = Command::new("bash").args(["-ec", &format!("{kubectl}\n{block}")]).status().expect("bash runs");
    assert!(status.success(), "the guide's wait block failed:\n{block}");
}

/// The UIDs of the sample's live proxy pods.
async fn proxy_pod_uids(world: &World) -> Vec<String> {
    live_pod_uids(world, &nodes::proxy_pods()).await
}

/// The UIDs of the live (not terminating) pods in [`NS`] that `selector` selects, sorted.
pub async fn live_pod_uids(world: &World, selector: &str) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let listed = pods.list(&ListParams::default().labels(selector)).await.expect("pods");
    let mut uids: Vec<String> = listed
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.uid)
        .collect();
    uids.sort();
    uids
}

/// When the clients see only `answer`, in seconds from `written`: the opening time of the first
/// connection after the last one answered otherwise, once 16 opened since are all `answer`
/// (within 10 s); and the slowest connection's time. A connection is opened every 10 ms, each
/// dated by when it was opened rather than by when it was answered: a client port reused while
/// the server still holds it in TIME_WAIT may get its SYN answered only by the retransmission a
/// second later, which says nothing about the configuration.
pub async fn only_answer(address: String, answer: &'static str, written: Instant) -> (f64, f64) {
    let mut pending = tokio::task::JoinSet::new();
    let mut opened_pending = std::collections::BTreeMap::new();
    let (mut last_other, mut answered_since, mut slowest) = (f64::NEG_INFINITY, Vec::new(), 0.0_f64);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    for id in 0_u64.. {
        tokio::select! {
            _ = tick.tick() => {
                let (address, opened) = (address.clone(), written.elapsed().as_secs_f64());
                opened_pending.insert(id, opened);
                pending.spawn(async move { (id, opened, one_request(&address).await) });
            }
            Some(joined) = pending.join_next() => {
                let (id, opened, result) = joined.expect("a connection task");
                opened_pending.remove(&id);
                slowest = slowest.max(written.elapsed().as_secs_f64() - opened);
                if result.as_deref() == Ok(answer) {
                    answered_since.push(opened);
                } else {
                    last_other = last_other.max(opened);
                }
            }
        }
        answered_since.retain(|opened| *opened > last_other);
        answered_since.sort_by(f64::total_cmp);
        let first_pending = opened_pending.values().copied().fold(f64::INFINITY, f64::min);
        if let (Some(first), Some(sixteenth)) = (answered_since.first(), answered_since.get(15))
            && first_pending > *sixteenth
        {
            return (*first, slowest);
        }
        assert!(written.elapsed() < Duration::from_secs(10), "not only {answer:?} 10 s after the write");
    }
    unreachable!("the loop returns or fails")
}

/// Seconds from `written` until `read` gives something other than `before`.
pub async fn changed_after<T: PartialEq, F: Future<Output = T>>(
    written: Instant,
    before: T,
    read: impl Fn() -> F,
) -> f64 {
    loop {
        if read().await != before {
            return written.elapsed().as_secs_f64();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn scaling_the_balancer_brings_up_proxy_pods(world: &mut World) {
    world.ensure_sample(Sample::ANY.replicas(1)).await;
    let front = front_ip(world, SAMPLE).await;
    let load = Load::start(format!("{front}:80"), 2);
    world.kubectl.ok(&["-n", NS, "scale", &format!("balancer/{SAMPLE}"), "--replicas=2"]);
    let proxy = format!("{SAMPLE}-proxy");
    wait_available(world, NS, &proxy, 2).await;
    let what = "status.readyReplicas 2";
    let sample =
        balancer_until(&balancers(world), SAMPLE, what, Duration::from_secs(60), wait::replicas_ready(2)).await;
    let selector = sample.status.and_then(|s| s.selector).expect("status.selector");
    println!("node: scaled to 2 proxy pods: {selector:?}");
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let selector = selector.as_str();
    // Pods of the earlier rollouts may still be draining (terminating): they are not counted.
    let live = |pods: Vec<Pod>| pods.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).count();
    let running = live(pods.list(&ListParams::default().labels(selector)).await.expect("pods").items);
    assert_eq!(running, 2, "pods selected by status.selector");

    // Back to one, with the load still running: scaling drops no connection either.
    world.kubectl.ok(&["-n", NS, "scale", &format!("balancer/{SAMPLE}"), "--replicas=1"]);
    wait_available(world, NS, &proxy, 1).await;
    eventually("one proxy pod left", Duration::from_secs(60), || async {
        let left = live(pods.list(&ListParams::default().labels(selector)).await.ok()?.items);
        (left == 1).then_some(())
    })
    .await;
    load.assert_no_failures("while scaling 1 → 2 → 1").await;
}

/// Once the change is Ready, 1,200 requests split by the new weights. Right after an API server
/// restart kube-proxy may still route the front Service by its old endpoints until its own
/// watch is back (client-go's reflector waits up to 30 s between attempts): the split is
/// measured again, each second, for up to 60 s, the time it took is printed, and a failure
/// prints the proxy pods' configuration and the Services' endpoints.
pub async fn weights_on_the_wire(world: &World, v1: u32, v2: u32) {
    wait_ready_balancer(world, SAMPLE, Duration::from_secs(120)).await;
    let ready = Instant::now();
    let weights = [("hello world v1", v1), ("hello world v2", v2)];
    loop {
        let counts = split(&front_ip(world, SAMPLE).await, 80, 1200).await;
        println!("node: after the change to {v1}/{v2}, 1200 requests: {counts:?}");
        if shares_match(&counts, &weights, 4.0) || ready.elapsed() > Duration::from_secs(60) {
            if !shares_match(&counts, &weights, 4.0) {
                print_proxy_configs(world);
            }
            assert_shares(&counts, &weights, 4.0);
            println!("node: the new weights on the wire {:.1} s after Ready", ready.elapsed().as_secs_f64());
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub async fn deleting_the_balancer_removes_every_child_and_pod(world: &mut World) {
    world.ensure_sample(Sample::ANY).await;
    world.kubectl.ok(&["-n", NS, "delete", "balancer", SAMPLE, "--wait=false"]);
    let selector = format!("balancer.exposer.hliangzhao.io/balancer-name={SAMPLE}");
    let params = ListParams::default().labels(&selector);
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(world.admin.clone(), NS);
    let deployments: Api<Deployment> = Api::namespaced(world.admin.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let deleted = Instant::now();
    eventually("every child gone", Duration::from_secs(60), || async {
        let left = services.list(&params).await.ok()?.items.len()
            + config_maps.list(&params).await.ok()?.items.len()
            + deployments.list(&params).await.ok()?.items.len();
        (left == 0).then_some(())
    })
    .await;
    let children_gone = deleted.elapsed();
    // 5-30 s of preStop and up to 20 s of draining: the probes' sessions wait on backend
    // Services that garbage collection has already removed.
    eventually("every proxy pod gone", Duration::from_secs(90), || async {
        pods.list(&params).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    println!(
        "node: children collected {:.1} s after the delete, proxy pods gone after {:.1} s",
        children_gone.as_secs_f64(),
        deleted.elapsed().as_secs_f64()
    );
}

/// The churn scenario's size: changes, how far apart, and connections held open meanwhile.
#[derive(Debug, Clone, Copy)]
struct Churn {
    changes: usize,
    interval: Duration,
    connections: usize,
}

impl Churn {
    /// 40 changes at the proxy's own reload rate (two a second) with 200 connections, to keep
    /// the suite's time; `BALANCER_NODE_CHURN=full` runs the 120 changes in two minutes
    /// with 500 connections.
    fn from_env() -> Churn {
        match std::env::var("BALANCER_NODE_CHURN").as_deref() {
            Ok("full") => Churn { changes: 120, interval: Duration::from_secs(1), connections: 500 },
            _ => Churn { changes: 40, interval: Duration::from_millis(500), connections: 200 },
        }
    }
}

/// Weight changes in a burst, at the proxy's own reload rate, with connections held open and
/// clients sending meanwhile: no request fails, no held connection is cut (the old workers that
/// hold them are the only long-lived draining ones, far within the bound), nginx applies them
/// coalesced (the sidecar counts its reloads), and the proxy pod's nginx processes stay far
/// under the container's memory limit (their resident memory summed, sampled every 100 ms:
/// shared pages count once per process, so this overstates).
pub async fn churn_fails_nothing_and_stays_under_the_memory_limit(world: &mut World) {
    let Churn { changes, interval, connections } = Churn::from_env();
    world.ensure_sample(Sample::AS_SHIPPED).await;
    let address = format!("{}:80", front_ip(world, SAMPLE).await);
    let pods = proxy_pod_uids(world).await;
    assert_eq!(pods.len(), 1, "one proxy pod: {pods:?}");
    let proxy_ip = pod_ips(world, NS, &nodes::proxy_pods()).await.pop().expect("the proxy pod's address");
    let metrics = format!("{proxy_ip}:9113");
    let reloads = || sidecar_counts(&metrics, "balancer_proxy_config_reloads_total", "");
    let before = reloads().await.and_then(|c| c.get("").copied()).unwrap_or_default();
    let proxies: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let listed = proxies.list(&ListParams::default().labels(&nodes::proxy_pods())).await.expect("proxy pods");
    let nginx = listed.items.iter().find_map(|pod| container_id(pod, "nginx")).expect("the nginx container's ID");
    let memory = ResidentMemory::sample(&nginx);
    let held = Held::open(&address, connections).await;
    let load = Load::start(address.clone(), 4);
    let weights = [
        [("v1", 40), ("v2", 20), ("v3", 40)],
        [("v1", 10), ("v2", 80), ("v3", 10)],
        [("v1", 30), ("v2", 30), ("v3", 40)],
    ];
    let started = tokio::time::Instant::now();
    for change in 0..changes {
        change_backends(world, SAMPLE, &weights[change % weights.len()], &[]).await;
        let next = u32::try_from(change + 1).expect("a few changes");
        tokio::time::sleep_until(started + interval * next).await;
    }
    let churned = started.elapsed().as_secs_f64();
    let replicas = i32::try_from(pods.len()).expect("a few pods");
    let what = "every proxy pod serving the last change";
    balancer_until(&balancers(world), SAMPLE, what, Duration::from_secs(10), wait::programmed(replicas)).await;
    let after = reloads().await.and_then(|c| c.get("").copied()).unwrap_or_default();
    let peak = memory.finish();
    load.assert_no_failures(&format!("during {changes} changes in {churned:.0} s")).await;
    held.assert_kept(&format!("through {changes} changes")).await;
    println!(
        "node: {changes} weight changes in {churned:.1} s: nginx reloaded {} times; the proxy's nginx processes peaked at {:.1} MiB resident (limit 128 MiB)",
        after - before,
        peak as f64 / 1048576.0
    );
    assert!(after > before && after - before <= changes as f64, "reloads counted: {before} → {after}");
    assert!(peak > 0, "no nginx process found in the proxy container's cgroup");
    assert!(peak < 96 << 20, "nginx's resident memory peaked at {peak} bytes");
    assert_eq!(proxy_pod_uids(world).await, pods, "the same proxy pod throughout");
}

/// The resident memory of one pod's nginx processes, summed, sampled until finished: its peak.
struct ResidentMemory {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sampler: std::thread::JoinHandle<u64>,
}

impl ResidentMemory {
    /// Samples the nginx processes in the cgroup of the container `id` (the host sees them all;
    /// the node's kubelet makes no pod cgroups, and the runtime names each container's after it).
    fn sample(id: &str) -> ResidentMemory {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let marks = [id.to_string()];
        let sampler = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut peak = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    peak = peak.max(nginx_resident(&marks));
                    std::thread::sleep(Duration::from_millis(100));
                }
                peak
            }
        });
        ResidentMemory { stop, sampler }
    }

    fn finish(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.sampler.join().expect("the memory sampler")
    }
}

/// The summed `VmRSS` of the `nginx` processes whose cgroup names one of `marks`, in bytes.
fn nginx_resident(marks: &[String]) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    let mut total = 0;
    for entry in entries.flatten() {
        let dir = entry.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != "nginx" {
            continue;
        }
        let cgroup = std::fs::read_to_string(dir.join("cgroup")).unwrap_or_default();
        if !marks.iter().any(|mark| cgroup.contains(mark.as_str())) {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok());
        total += kib.unwrap_or(0) * 1024;
    }
    total
}

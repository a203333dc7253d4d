//! A Balancer's canary under continuous load: a good version promoted step by step, one that
//! refuses connections and one that accepts and answers nothing rolled back by their gates, a
//! quiet one held for data, one kept at its step through the operator's kill and an API server
//! outage, docs/canary.md's walkthrough as written, a UDP canary, and a person's control through
//! the status that a GitOps re-apply does not undo.
//!
//! The Balancer `canary-web` sends to the echo backends' pods (v1, v2) and to two made here: pods
//! whose port 5678 refuses (`broken`: nothing listens there) and pods that close every connection
//! without a byte (`silent`: nginx's `return 444`). All are ready through their probe port.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use balancer::api::Balancer;
use balancer::api::canary::{CanaryPhase, CanaryStatus};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

use crate::faults::operator_pid;
use crate::fixtures::{
    backend_deployment, balancers, front_ip, lease_holder, lease_identity, wait_available, wait_ready_balancer,
};
use crate::toolkit::load::{Held, Load};
use crate::toolkit::runner::eventually;
use crate::weights::live_pod_uids;
use crate::{NS, World};

const NAME: &str = "canary-web";
/// Its proxy pods.
const PROXY_PODS: &str = "balancer.exposer.hliangzhao.io/balancer-name=canary-web";

/// The Balancer before a release: everything on `stable`, none yet on `next`.
fn before(stable: &str, next: &str) -> String {
    balancer(stable, next, None)
}

/// `canary-web` sending to the pods of `stable` (weight 100, or 0 with a canary) and `canary`
/// (0, or 100 with a canary: the goal), with `canary` as `spec.canary` when given.
fn balancer(stable: &str, canary: &str, spec: Option<serde_json::Value>) -> String {
    let (stable_weight, canary_weight) = if spec.is_some() { (0, 100) } else { (100, 0) };
    let mut manifest = json!({
        "apiVersion": "exposer.hliangzhao.io/v1beta1", "kind": "Balancer",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "replicas": 2,
            "ports": [{"port": 80, "targetPort": 5678}],
            "selector": {"app": "test"},
            "backends": [
                {"name": "stable", "weight": stable_weight, "selector": {"version": stable}},
                {"name": "canary", "weight": canary_weight, "selector": {"version": canary}},
            ],
        },
    });
    if let Some(spec) = spec {
        manifest["spec"]["canary"] = spec;
    }
    manifest.to_string()
}

/// A canary from `stable` to `canary` in `steps`, judged every second on 20 sessions and 2 s: a
/// misbehaving canary is caught within seconds at 5 %. The kubelet's TCP readiness probes of the
/// proxy pods (each a session in which nothing is said) land on either backend by weight, and
/// count in no session: one among 20 would be 5 %.
fn canary(steps: serde_json::Value) -> serde_json::Value {
    json!({
        "stableBackend": "stable",
        "canaryBackend": "canary",
        "steps": steps,
        "analysis": {
            "interval": "1s", "minSessions": 20, "minDuration": "2s", "failureLimit": 1,
            "gates": [
                {"signal": "ConnectFailureRatio", "max": "1%"},
                {"signal": "ErrorSessionRatio", "max": "5%", "maxOverStable": "1%"},
                {"signal": "ConnectTimeP95", "max": "100ms", "observeOnly": true},
            ],
        },
    })
}

/// Pods labelled `version` that are ready (their probe port answers) and whose port 5678 runs
/// `server`: `None` listens on nothing there (connections are refused).
fn misbehaving_backend(version: &str, server: Option<&str>) -> String {
    let main = server.map(|s| format!("  server {{\n    listen 5678;\n    {s}\n  }}\n")).unwrap_or_default();
    let conf = format!(
        "worker_processes 1;\npid /tmp/nginx.pid;\nevents {{}}\nhttp {{\n  access_log off;\n  \
         client_body_temp_path /tmp/client_body;\n  proxy_temp_path /tmp/proxy;\n  \
         fastcgi_temp_path /tmp/fastcgi;\n  uwsgi_temp_path /tmp/uwsgi;\n  scgi_temp_path /tmp/scgi;\n\
         {main}  server {{\n    listen 5679;\n    location /ready {{ return 200; }}\n  }}\n}}\n"
    );
    let name = format!("echo-{version}");
    let config_map = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS},
        "data": {"nginx.conf": conf},
    });
    let container = json!({
        "name": "echo",
        "command": ["nginx", "-c", "/etc/echo/nginx.conf", "-e", "stderr", "-g", "daemon off;"],
        "ports": [{"containerPort": 5678}],
        "readinessProbe": {"httpGet": {"port": 5679, "path": "/ready"}, "periodSeconds": 1},
        "volumeMounts": [{"name": "conf", "mountPath": "/etc/echo"}],
    });
    let mut deployment = backend_deployment(NS, &name, json!({"app": "test", "version": version}), container);
    deployment["spec"]["template"]["spec"]["volumes"] = json!([{"name": "conf", "configMap": {"name": name}}]);
    json!({"apiVersion": "v1", "kind": "List", "items": [config_map, deployment]}).to_string()
}

/// The echo backends and the two misbehaving ones (`broken`, `silent`), each with a ready pod.
async fn ensure_backends(world: &mut World) {
    world.ensure_echo_backends().await;
    world.kubectl.apply(&misbehaving_backend("broken", None));
    world.kubectl.apply(&misbehaving_backend("silent", Some("location / { return 444; }")));
    wait_available(world, NS, "echo-broken", 1).await;
    wait_available(world, NS, "echo-silent", 1).await;
}

/// [`ensure_backends`], and `canary-web` all on `stable` (`next` at weight 0), Ready.
async fn ensure_canary_web(world: &mut World, stable: &str, next: &str) {
    ensure_backends(world).await;
    canary_web_on(world, stable, next).await;
}

/// `canary-web` all on `stable` (`next` at weight 0), Ready and answering.
async fn canary_web_on(world: &World, stable: &str, next: &str) {
    world.kubectl.apply(&before(stable, next));
    wait_ready_balancer(world, NAME, Duration::from_secs(120)).await;
    // kube-proxy programs the front Service a moment after Ready: its first answer is awaited.
    let address = format!("{}:80", front_ip(world, NAME).await);
    eventually("the front Service's first answer", Duration::from_secs(10), || async {
        crate::toolkit::load::one_request(&address).await.ok()
    })
    .await;
}

/// `canary-web`'s canary status, as stored.
async fn status(world: &World) -> Option<CanaryStatus> {
    status_of(world, NAME).await
}

/// Balancer `name`'s canary status, as stored.
async fn status_of(world: &World, name: &str) -> Option<CanaryStatus> {
    let balancer: Balancer = balancers(world).get(name).await.ok()?;
    balancer.status?.canary
}

/// Waits for `canary-web`'s canary status to satisfy `done`; returns it.
async fn follow(world: &World, what: &str, timeout: Duration, done: impl Fn(&CanaryStatus) -> bool) -> CanaryStatus {
    follow_of(world, NAME, what, timeout, done).await
}

/// Waits for Balancer `name`'s canary status to satisfy `done`; returns it.
async fn follow_of(
    world: &World,
    name: &str,
    what: &str,
    timeout: Duration,
    done: impl Fn(&CanaryStatus) -> bool,
) -> CanaryStatus {
    let deadline = Instant::now() + timeout;
    loop {
        let canary = status_of(world, name).await;
        if let Some(canary) = canary.as_ref().filter(|c| done(c)) {
            return canary.clone();
        }
        assert!(Instant::now() < deadline, "{what} within {timeout:?}: the canary is at {canary:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Releases `canary-web` from `stable` to the misbehaving `canary` (5 %, then a long pause) and
/// waits for its rollback to be on every proxy pod: how long that took from the step's start
/// (which the status shows once the weight is on every pod, so its first session was a moment
/// before), and the message of the failed gate.
async fn released_then_rolled_back(world: &World, stable: &str, canary: &str) -> (Duration, String) {
    let steps = json!([{"setWeight": 5}, {"pause": {"duration": "30s"}}]);
    world.kubectl.apply(&balancer(stable, canary, Some(self::canary(steps))));
    // The first check may already fail the step it starts: then the status shows it aborted.
    follow(world, "step 1 started", Duration::from_secs(30), |c| {
        c.step_started_at.is_some() || c.phase == CanaryPhase::Aborted
    })
    .await;
    let step_started = Instant::now();
    let back = follow(world, "rolled back, on every proxy pod", Duration::from_secs(30), |c| {
        c.phase == CanaryPhase::Aborted && !c.pods.is_empty() && c.pods.iter().all(|p| p.weight == Some(0))
    })
    .await;
    let detected = step_started.elapsed();
    assert_eq!(back.decision.map(|d| d.reason).as_deref(), Some("RolledBack"));
    let failed = told(world, "GateFailed").await.pop().map(|(message, _)| message).unwrap_or_default();
    (detected, failed)
}

/// The events about `canary-web` as it is now (by its uid), oldest first: each one's reason,
/// message, and how many times it was told (a repeat within minutes is a series of one event).
async fn events(world: &World) -> Vec<(String, String, i32)> {
    let uid = balancers(world).get(NAME).await.ok().and_then(|b| b.metadata.uid);
    let listed = Api::<Event>::namespaced(world.admin.clone(), NS).list(&ListParams::default()).await;
    let mut ours: Vec<Event> = listed
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| uid.is_some() && e.regarding.as_ref().and_then(|r| r.uid.as_ref()) == uid.as_ref())
        .collect();
    ours.sort_by_key(|e| e.metadata.creation_timestamp.clone());
    let told = |e: &Event| e.series.as_ref().map_or(1, |s| s.count);
    ours.iter().map(|e| (e.reason.clone().unwrap_or_default(), e.note.clone().unwrap_or_default(), told(e))).collect()
}

/// The events of `reason` about `canary-web`, oldest first: each one's message and how many
/// times it was told.
async fn told(world: &World, reason: &str) -> Vec<(String, i32)> {
    events(world).await.into_iter().filter(|(r, _, _)| r == reason).map(|(_, m, n)| (m, n)).collect()
}

/// Whether `canary`'s share of `counts` is within 3 binomial standard deviations of `percent`.
fn within_three_sigma(
    counts: &BTreeMap<String, usize>,
    canary: &str,
    stable: &str,
    percent: f64,
) -> (bool, f64, usize) {
    let (c, s) = (counts.get(canary).copied().unwrap_or(0), counts.get(stable).copied().unwrap_or(0));
    let n = c + s;
    let p = percent / 100.0;
    let share = if n == 0 { 0.0 } else { c as f64 / n as f64 };
    let sigma = (p * (1.0 - p) / n.max(1) as f64).sqrt();
    ((share - p).abs() <= 3.0 * sigma + f64::EPSILON, share * 100.0, n)
}

/// A good version (v2) promoted from v1 in 5 → 25 → 50 → 100 % with 5 s pauses under continuous
/// load: each step's split, measured by the clients over the step's connections, is within 3
/// binomial standard deviations of its weight; no request fails, no proxy pod is replaced, and
/// the status and the events tell each step.
pub async fn a_good_canary_is_promoted_step_by_step(world: &mut World) {
    world.ensure_operator().await;
    ensure_canary_web(world, "v1", "v2").await;
    let front = front_ip(world, NAME).await;
    let pods = live_pod_uids(world, PROXY_PODS).await;
    let load = Load::start(format!("{front}:80"), 4);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let steps = json!([
        {"setWeight": 5}, {"pause": {"duration": "5s"}},
        {"setWeight": 25}, {"pause": {"duration": "5s"}},
        {"setWeight": 50}, {"pause": {"duration": "5s"}},
    ]);
    let released = Instant::now();
    world.kubectl.apply(&balancer("v1", "v2", Some(canary(steps))));
    let mut splits = Vec::new();
    for (step, weight) in [(0, 5.0), (2, 25.0), (4, 50.0)] {
        follow(world, &format!("step {} started", step + 1), Duration::from_secs(60), |c| {
            c.step == step && c.step_started_at.is_some()
        })
        .await;
        // The step and the pause after it keep the weight for at least 7 s: 4 s of it measured.
        let counts = load.answers_within(Duration::from_secs(4)).await;
        let (within, share, n) = within_three_sigma(&counts, "hello world v2", "hello world v1", weight);
        println!("node: canary at {weight}%: the clients' {n} connections gave v2 {share:.2}% ({counts:?})");
        splits.push((weight, share, n));
        assert!(n > 1000 && within, "canary at {weight}%: v2 got {share:.2}% of {n} connections: {counts:?}");
    }
    let done =
        follow(world, "the canary completed", Duration::from_secs(90), |c| c.phase == CanaryPhase::Completed).await;
    let promoted = released.elapsed();
    assert_eq!((done.step, done.weight), (6, 100));
    let after = eventually("only v2 answers", Duration::from_secs(10), || async {
        let counts = load.answers_within(Duration::from_secs(1)).await;
        (counts.keys().all(|k| k == "hello world v2") && !counts.is_empty()).then_some(counts)
    })
    .await;
    let sent = load.assert_no_failures("while the canary went 5 → 25 → 50 → 100 %").await;
    assert_eq!(live_pod_uids(world, PROXY_PODS).await, pods, "no proxy pod replaced");
    let told = events(world).await;
    let reasons: Vec<&str> = told.iter().map(|(reason, _, _)| reason.as_str()).collect();
    let count = |reason: &str| told.iter().filter(|(r, _, _)| r == reason).map(|(_, _, n)| *n as usize).sum::<usize>();
    println!(
        "node: a good canary promoted in {:.1} s, {sent} requests, 0 failed; then {after:?}; events {reasons:?}",
        promoted.as_secs_f64()
    );
    assert_eq!((count("StepStarted"), count("StepPassed"), count("Completed")), (6, 6, 1), "{reasons:?}");
    println!("node: the canary's splits (weight, v2's share, connections): {splits:?}");
}

/// A canary whose pods refuse every connection, at its first step (5 %): the connect-failure gate
/// fails and the rollback is on every proxy pod within 10 s of the step's start; nginx moves each
/// refused connect to the stable backend, so no client fails; connections held to the stable
/// backend throughout are untouched; the status names the gate, its value and its bound.
pub async fn a_refusing_canary_is_rolled_back(world: &mut World) {
    world.ensure_operator().await;
    ensure_canary_web(world, "v2", "broken").await;
    let front = front_ip(world, NAME).await;
    let held = Held::open(&format!("{front}:80"), 20).await;
    let load = Load::start(format!("{front}:80"), 4);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (detected, failed) = released_then_rolled_back(world, "v2", "broken").await;
    println!(
        "node: a refusing canary rolled back on every proxy pod {:.1} s after its step started: {failed}",
        detected.as_secs_f64()
    );
    assert!(detected < Duration::from_secs(10), "the rollback took {detected:?}");
    assert!(failed.contains("ConnectFailureRatio") && failed.contains("past max 1%"), "{failed}");
    let stopped = load.stop().await;
    println!(
        "node: {} requests while the refusing canary ran and was rolled back, {} failed",
        stopped.sent,
        stopped.failures.len()
    );
    assert!(
        stopped.failures.is_empty(),
        "nginx retried every refused connect: {:?}",
        &stopped.failures[..stopped.failures.len().min(5)]
    );
    held.assert_kept("to the stable backend while a refusing canary was rolled back").await;
}

/// A canary whose pods accept and close without a byte (`return 444`): the error-session gate rolls
/// it back. Its failed requests are reported, and stay within its weight × the request rate × the
/// time to detect (from the step's start to the rollback on every pod).
pub async fn a_canary_that_accepts_and_answers_nothing_is_rolled_back(world: &mut World) {
    world.ensure_operator().await;
    ensure_canary_web(world, "v2", "silent").await;
    let front = front_ip(world, NAME).await;
    let load = Load::start(format!("{front}:80"), 4);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let begun = Instant::now();
    let sent_before = load.answers().values().sum::<usize>();
    let (detected, failed) = released_then_rolled_back(world, "v2", "silent").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stopped = load.stop().await;
    let rate = (stopped.sent - sent_before) as f64 / begun.elapsed().as_secs_f64();
    // From the release, not the step's start: the weight reaches the wire a moment before the
    // status says so.
    let exposure = begun.elapsed().as_secs_f64() - 1.0;
    let bound = 0.05 * rate * exposure;
    println!(
        "node: a canary that answers nothing: rolled back {:.1} s after its step started; {} of {} requests failed \
         (bound: 5 % × {rate:.0}/s × {exposure:.1} s = {bound:.0}): {failed}",
        detected.as_secs_f64(),
        stopped.failures.len(),
        stopped.sent
    );
    assert!(failed.contains("ErrorSessionRatio"), "{failed}");
    assert!(detected < Duration::from_secs(10), "the rollback took {detected:?}");
    assert!(!stopped.failures.is_empty(), "the clients met the canary");
    assert!((stopped.failures.len() as f64) <= bound, "{} failed, over {bound:.0}", stopped.failures.len());
}

/// A `pause {}` step waits for `balancer canary promote`; `abort` rolls back; `retry` starts again;
/// re-applying the same spec, as a GitOps sync does, undoes none of them.
pub async fn a_canary_is_promoted_aborted_and_retried_by_a_person_and_a_reapply_undoes_nothing(world: &mut World) {
    world.ensure_operator().await;
    ensure_canary_web(world, "v1", "v2").await;
    let steps = json!([{"setWeight": 10}, {"pause": {}}, {"setWeight": 50}, {"pause": {}}]);
    let release = balancer("v1", "v2", Some(canary(steps)));
    let front = front_ip(world, NAME).await;
    let load = Load::start(format!("{front}:80"), 2);
    world.kubectl.apply(&release);
    follow(world, "waiting for promotion", Duration::from_secs(60), |c| c.phase == CanaryPhase::Paused).await;
    world.kubectl.apply(&release);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let paused = status(world).await.expect("a status");
    assert_eq!((paused.phase, paused.step, paused.weight), (CanaryPhase::Paused, 1, 10), "a re-apply changes nothing");

    let promoted = canary_cli(world, &["promote", NAME]);
    println!("node: balancer canary promote: {promoted}");
    follow(world, "the second pause", Duration::from_secs(60), |c| c.step == 3 && c.phase == CanaryPhase::Paused).await;
    // Connections opened at 50 %, about half of them to the canary, held through the abort.
    let held = Held::open(&format!("{front}:80"), 20).await;
    let aborted = canary_cli(world, &["abort", NAME]);
    println!("node: balancer canary abort: {aborted}");
    let back = status(world).await.expect("a status");
    assert_eq!((back.phase, back.weight), (CanaryPhase::Aborted, 0));
    follow(world, "the abort on every proxy pod", Duration::from_secs(10), |c| {
        !c.pods.is_empty() && c.pods.iter().all(|p| p.weight == Some(0))
    })
    .await;
    world.kubectl.apply(&release);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(status(world).await.map(|c| c.phase), Some(CanaryPhase::Aborted), "a re-apply does not undo an abort");
    let kept = held.assert_kept("through the abort (the drain timeout is an hour)").await;
    let on_the_canary = kept.get("hello world v2").copied().unwrap_or(0);
    println!("node: {on_the_canary} of 20 connections held to the canary survived its abort, on the canary");
    assert!(on_the_canary > 0, "some held connections went to the canary at 50 %: {kept:?}");
    let refused = canary_cli_fails(world, &["promote", NAME]);
    assert!(refused.contains("Promote does nothing to a canary that is Aborted"), "{refused}");

    canary_cli(world, &["retry", NAME]);
    let retried = follow(world, "the retry waiting for promotion", Duration::from_secs(60), |c| {
        c.attempt == 2 && c.phase == CanaryPhase::Paused
    })
    .await;
    assert_eq!((retried.step, retried.weight), (1, 10));
    canary_cli(world, &["promote", "--full", NAME]);
    follow(world, "completed", Duration::from_secs(30), |c| c.phase == CanaryPhase::Completed).await;
    let shown = canary_cli(world, &["status", NAME]);
    assert!(shown.contains("Completed, all 4 steps, canary at 100%, attempt 2"), "{shown}");
    load.assert_no_failures("while a person promoted, aborted, retried and promoted to the end").await;
    // What the canary scenarios made goes, for the scenarios after them.
    world.kubectl.ok(&["-n", NS, "delete", "balancer", NAME, "--wait=true", "--timeout=60s"]);
    for made in ["echo-broken", "echo-silent"] {
        world.kubectl.ok(&["-n", NS, "delete", "deployment,configmap", made, "--wait=true", "--timeout=60s"]);
    }
}

/// Too few sessions hold a step with a reason, and never roll it back; with traffic restored the
/// canary proceeds.
pub async fn a_quiet_canary_holds_then_proceeds_with_traffic(world: &mut World) {
    world.ensure_operator().await;
    ensure_canary_web(world, "v1", "v2").await;
    let steps = json!([{"setWeight": 10}, {"pause": {"duration": "2s"}}]);
    world.kubectl.apply(&balancer("v1", "v2", Some(canary(steps))));
    let held = follow(world, "held for data", Duration::from_secs(30), |c| {
        c.decision.as_ref().is_some_and(|d| d.reason == "HeldForData")
    })
    .await;
    let reason = held.decision.map(|d| d.message).unwrap_or_default();
    println!("node: a quiet canary: {reason}");
    assert!(reason.starts_with("step 1: ") && reason.ends_with(" of 20 canary sessions"), "{reason}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let still = status(world).await.expect("a status");
    assert_eq!((still.phase, still.step, still.weight), (CanaryPhase::Progressing, 0, 10), "held, not rolled back");
    let front = front_ip(world, NAME).await;
    let load = Load::start(format!("{front}:80"), 2);
    let started = Instant::now();
    follow(world, "completed once traffic is back", Duration::from_secs(60), |c| c.phase == CanaryPhase::Completed)
        .await;
    println!("node: with traffic back, the quiet canary completed {:.1} s later", started.elapsed().as_secs_f64());
    load.assert_no_failures("while a quiet canary held and then proceeded").await;
}

/// `balancer canary ARGS -n NS` as a person runs it, with the suite's kubeconfig: its output.
fn canary_cli(world: &World, args: &[&str]) -> String {
    let (ok, out, err) = run_canary_cli(world, args);
    assert!(ok, "balancer canary {args:?}: {err}");
    out
}

/// [`canary_cli`] that must fail: its error.
fn canary_cli_fails(world: &World, args: &[&str]) -> String {
    let (ok, out, err) = run_canary_cli(world, args);
    assert!(!ok, "balancer canary {args:?} succeeded: {out}");
    err
}

fn run_canary_cli(world: &World, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_balancer"))
        .arg("canary")
        .args(args)
        .args(["-n", NS])
        .env("KUBECONFIG", world.plane.kubeconfig("admin"))
        .output()
        .expect("balancer runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// How long the faults scenario's step lasts: past the leader's kill (the Lease runs out after
/// 15 s), the API server's 15 s away, and their recovery.
const FAULTED_STEP: Duration = Duration::from_secs(70);

/// In the middle of a step (20 %, then a 70 s pause), under load: the operator's leader is
/// killed, then the API server is stopped for 15 s. The clients' split stays the step's all
/// along, no proxy pod is replaced, the canary is on the same step with the same start once each
/// fault is over, and then takes each step left once.
pub async fn a_canary_keeps_its_step_through_the_operators_kill_and_an_api_server_outage(world: &mut World) {
    world.ensure_operator().await;
    world.ensure_echo_backends().await;
    canary_web_on(world, "v1", "v2").await;
    let front = front_ip(world, NAME).await;
    let pods = live_pod_uids(world, PROXY_PODS).await;
    let load = Load::start(format!("{front}:80"), 4);
    let pause = format!("{}s", FAULTED_STEP.as_secs());
    let steps =
        json!([{"setWeight": 20}, {"pause": {"duration": pause}}, {"setWeight": 60}, {"pause": {"duration": "2s"}}]);
    world.kubectl.apply(&balancer("v1", "v2", Some(canary(steps))));
    let step =
        follow(world, "the pause started", Duration::from_secs(60), |c| c.step == 1 && c.step_started_at.is_some())
            .await;
    let same_step = |c: &CanaryStatus| {
        (c.phase, c.step, c.weight, c.attempt, c.step_started_at.clone())
            == (CanaryPhase::Progressing, 1, 20, step.attempt, step.step_started_at.clone())
    };
    let on_the_wire = |what: &str, counts: &BTreeMap<String, usize>| {
        let (within, share, n) = within_three_sigma(counts, "hello world v2", "hello world v1", 20.0);
        println!("node: canary at 20% {what}: the clients' {n} connections gave v2 {share:.2}%");
        assert!(n > 1000 && within, "{what}: v2 got {share:.2}% of {n} connections: {counts:?}");
    };

    let leader = eventually("a leader", Duration::from_secs(30), || lease_holder(world)).await;
    let killed_identity = eventually("a leader", Duration::from_secs(30), || lease_identity(world)).await;
    let pid = operator_pid(&leader).unwrap_or_else(|| panic!("no balancer process for pod {leader} on the host"));
    let measured = |c: &CanaryStatus| c.sessions.as_ref().map_or(0, |s| s.canary);
    let at_kill = measured(&status_now(world).await);
    let before = load.answers();
    let status = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().expect("kill runs");
    assert!(status.success(), "kill -KILL {pid}");
    let killed = Instant::now();
    let successor = eventually("a new leader", Duration::from_secs(40), || async {
        lease_identity(world).await.filter(|holder| *holder != killed_identity)
    })
    .await;
    // The new leader checks the step once a second, on the same window: more sessions.
    let resumed = follow(world, "a check by the new leader", Duration::from_secs(10), |c| measured(c) > at_kill).await;
    on_the_wire("from the leader's kill until a new leader checked the step", &load.answers_since(&before));
    println!(
        "node: {successor} leads {:.1} s after the leader's kill; the canary: {:?}",
        killed.elapsed().as_secs_f64(),
        resumed.decision
    );
    assert!(same_step(&resumed), "the same step after the leader's kill: {resumed:#?}");

    world.plane.process("kube-apiserver").kill();
    let counts = load.answers_within(Duration::from_secs(15)).await;
    world.plane.process("kube-apiserver").restart();
    world.plane.wait_ready().await;
    on_the_wire("while the API server was away", &counts);
    let before = load.answers();
    tokio::time::sleep(Duration::from_secs(4)).await;
    on_the_wire("once the API server was back", &load.answers_since(&before));
    let resumed = status_now(world).await;
    assert!(same_step(&resumed), "the same step after the API server's outage: {resumed:#?}");
    println!("node: the faults took {:.1} s of the step's {FAULTED_STEP:?}", killed.elapsed().as_secs_f64());

    let done =
        follow(world, "completed", FAULTED_STEP + Duration::from_secs(30), |c| c.phase == CanaryPhase::Completed).await;
    assert_eq!((done.step, done.weight, done.attempt), (4, 100, 1));
    load.assert_no_failures("while the operator was killed and the API server stopped mid-step").await;
    assert_eq!(live_pod_uids(world, PROXY_PODS).await, pods, "no proxy pod replaced");
    // Each step started once: a step's message names its number, the count and its weight.
    let started = told(world, "StepStarted").await;
    println!("node: steps started: {started:?}");
    for (n, weight) in [(1, 20), (2, 20), (3, 60), (4, 60)] {
        let step = format!("step {n} of 4: canary at {weight}%");
        let times: i32 = started.iter().filter(|(m, _)| *m == step).map(|(_, n)| n).sum();
        assert_eq!(times, 1, "{step:?} started once: {started:?}");
    }
    wait_available(world, crate::OPERATOR_NS, "balancer", 2).await;
    world.kubectl.ok(&["-n", NS, "delete", "balancer", NAME, "--wait=true", "--timeout=60s"]);
}

/// The canary's status now, which must be there.
async fn status_now(world: &World) -> CanaryStatus {
    status(world).await.expect("a canary status")
}

/// docs/canary.md's walkthrough, its blocks run as they are written (`kubectl` and `balancer`
/// pointed at the suite's cluster and namespace), under 4 clients: `v2` promoted, `broken`
/// rolled back, no request failed.
pub async fn the_canary_walkthrough_runs_as_written(world: &mut World) {
    world.ensure_operator().await;
    ensure_backends(world).await;
    run_walkthrough_block(world, "--for=condition=Ready");
    let address = format!("{}:80", front_ip(world, "web").await);
    eventually("web's first answer", Duration::from_secs(10), || async {
        crate::toolkit::load::one_request(&address).await.ok()
    })
    .await;
    let load = Load::start(address, 4);
    let promoted = run_walkthrough_block(world, "=Completed");
    println!("node: docs/canary.md's walkthrough, v2 released:\n{promoted}");
    assert!(promoted.contains("Completed, all 4 steps, canary at 100%"), "{promoted}");
    let rolled_back = run_walkthrough_block(world, "=Aborted");
    println!("node: docs/canary.md's walkthrough, broken released:\n{rolled_back}");
    assert!(rolled_back.contains("Aborted") && rolled_back.contains("GateFailed"), "{rolled_back}");
    assert!(rolled_back.contains("ConnectFailureRatio"), "{rolled_back}");
    load.assert_no_failures("through docs/canary.md's walkthrough").await;
    world.kubectl.ok(&["-n", NS, "delete", "balancer", "web", "--wait=true", "--timeout=60s"]);
}

/// docs/canary.md's `sh` block holding `marker`, run by bash with `kubectl` and `balancer` on the
/// suite's cluster in [`NS`]: what it printed.
fn run_walkthrough_block(world: &World, marker: &str) -> String {
    let block = crate::fixtures::sh_block("docs/canary.md", marker);
    let kubeconfig = world.plane.kubeconfig("admin").display().to_string();
    let prelude = format!(
        "kubectl() {{ command kubectl --kubeconfig={kubeconfig} -n {NS} \"$@\"; }}\n\
         balancer() {{ KUBECONFIG={kubeconfig} command {} \"$@\" -n {NS}; }}\n",
        env!("CARGO_BIN_EXE_balancer")
    );
    let out = std::process::Command::new("timeout")
        .args(["300", "bash", "-ec", &format!("{prelude}{block}")])
        .output()
        .expect("bash runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "docs/canary.md's block failed:\n{block}\n{text}");
    text
}

/// The UDP canary scenario's Balancer.
const UDP_CANARY: &str = "udp-canary";

/// `udp-canary` over the UDP echo pods, a canary from u1 to u2 (25 %, a 2 s pause) judged by
/// `gates`.
fn udp_canary(gates: &[&str]) -> String {
    let gates: Vec<serde_json::Value> = gates.iter().map(|g| json!({"signal": g, "max": "1%"})).collect();
    json!({
        "apiVersion": "exposer.hliangzhao.io/v1beta1", "kind": "Balancer",
        "metadata": {"name": UDP_CANARY, "namespace": NS},
        "spec": {
            "ports": [{"name": "echo", "protocol": "UDP", "port": 53, "targetPort": 5353}],
            "selector": {"app": "udp-echo"},
            "backends": [
                {"name": "u1", "weight": 0, "selector": {"version": "u1"}},
                {"name": "u2", "weight": 100, "selector": {"version": "u2"}},
            ],
            "canary": {
                "stableBackend": "u1", "canaryBackend": "u2",
                "steps": [{"setWeight": 25}, {"pause": {"duration": "2s"}}],
                "analysis": {"interval": "1s", "minSessions": 20, "minDuration": "2s", "gates": gates},
            },
        },
    })
    .to_string()
}

/// A UDP Balancer's canary: a connect gate is refused with the reason when the spec is written;
/// with the error-session gate (a datagram that got no reply) the canary is judged on the UDP
/// sessions and completes under continuous exchanges.
pub async fn a_udp_canary_is_judged_on_the_signals_udp_has(world: &mut World) {
    world.ensure_operator().await;
    world.ensure_udp_backends().await;
    let refused = world.kubectl.try_apply(&udp_canary(&["ErrorSessionRatio", "ConnectFailureRatio"]));
    let refused = refused.expect_err("a connect gate on a UDP port is refused");
    println!("node: a UDP canary with a connect gate: {}", refused.trim());
    assert!(refused.contains("ConnectFailureRatio cannot be measured on a UDP port"), "{refused}");

    world.kubectl.apply(&udp_canary(&["ErrorSessionRatio"]));
    wait_ready_balancer(world, UDP_CANARY, Duration::from_secs(120)).await;
    let front = front_ip(world, UDP_CANARY).await;
    eventually("a first UDP reply", Duration::from_secs(30), || crate::protocols::udp_exchange(&front, "hello")).await;
    let exchanges = crate::protocols::UdpLoad::start(front.clone(), 4);
    let judged = follow_of(world, UDP_CANARY, "the gate judged", Duration::from_secs(60), |c| {
        c.phase == CanaryPhase::Completed || c.gates.iter().any(|g| g.canary.is_some())
    })
    .await;
    let gates: Vec<&str> = judged.gates.iter().map(|g| g.signal.as_str()).collect();
    println!("node: a UDP canary judged: {:?} on {:?}", judged.gates, judged.sessions);
    assert!(judged.phase == CanaryPhase::Completed || gates == ["ErrorSessionRatio"], "{judged:#?}");
    follow_of(world, UDP_CANARY, "completed", Duration::from_secs(60), |c| c.phase == CanaryPhase::Completed).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (sent, lost, answers) = exchanges.finish().await;
    println!("node: {sent} UDP exchanges while the canary ran: answers {answers:?}, {lost} lost");
    assert!(answers.contains_key("u2") && answers.contains_key("u1"), "both versions answered: {answers:?}");
    assert!(lost * 100 <= sent, "{lost} of {sent} UDP exchanges lost");
    world.kubectl.ok(&["-n", NS, "delete", "balancer", UDP_CANARY, "--wait=true", "--timeout=60s"]);
}

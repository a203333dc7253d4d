//! A Balancer's canary under continuous load: a good version promoted step by step, one that
//! refuses connections and one that accepts and answers nothing rolled back by their gates, and
//! a person's control through the status that a GitOps re-apply does not undo.
//!
//! The Balancer `canary-web` sends to the echo backends' pods (v1, v2) and to two made here: pods
//! whose port 5678 refuses (nothing listens there) and pods that close every connection without a
//! byte (nginx's `return 444`). All are ready through their probe port.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use balancer::api::Balancer;
use balancer::api::canary::{CanaryPhase, CanaryStatus};
use serde_json::json;

use crate::fixtures::{backend_deployment, balancers, front_ip, wait_available, wait_ready_balancer};
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

/// A canary from `stable` to `canary` in `steps`, judged every second on `min_sessions` and 2 s; its
/// error sessions are bounded relative to the stable backend's too, as a user whose clients may
/// open silent connections would (see docs/canary.md).
fn canary_judged_on(steps: serde_json::Value, min_sessions: u32) -> serde_json::Value {
    json!({
        "stableBackend": "stable",
        "canaryBackend": "canary",
        "steps": steps,
        "analysis": {
            "interval": "1s", "minSessions": min_sessions, "minDuration": "2s", "failureLimit": 1,
            "gates": [
                {"signal": "ConnectFailureRatio", "max": "1%"},
                {"signal": "ErrorSessionRatio", "max": "5%", "maxOverStable": "1%"},
                {"signal": "ConnectTimeP95", "max": "100ms", "observeOnly": true},
            ],
        },
    })
}

/// [`canary_judged_on`] 20 sessions: a misbehaving canary is caught within seconds at 5 %.
fn canary(steps: serde_json::Value) -> serde_json::Value {
    canary_judged_on(steps, 20)
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

/// The echo backends, the two misbehaving ones, and `canary-web` all on `stable` (`next` at
/// weight 0), Ready.
async fn ensure_canary_web(world: &mut World, stable: &str, next: &str) {
    world.ensure_echo_backends().await;
    world.kubectl.apply(&misbehaving_backend("refuse", None));
    world.kubectl.apply(&misbehaving_backend("silent", Some("location / { return 444; }")));
    wait_available(world, NS, "echo-refuse", 1).await;
    wait_available(world, NS, "echo-silent", 1).await;
    world.kubectl.apply(&before(stable, next));
    wait_ready_balancer(world, NAME, Duration::from_secs(120)).await;
    // kube-proxy programs the front Service a moment after Ready: its first answer is awaited.
    let address = format!("{}:80", front_ip(world, NAME).await);
    eventually("the front Service's first answer", Duration::from_secs(10), || async {
        crate::toolkit::load::one_request(&address).await.ok()
    })
    .await;
}

/// The canary's status, as stored.
async fn status(world: &World) -> Option<CanaryStatus> {
    let balancer: Balancer = balancers(world).get(NAME).await.ok()?;
    balancer.status?.canary
}

/// Waits for the canary's status to satisfy `done`; returns it.
async fn follow(world: &World, what: &str, timeout: Duration, done: impl Fn(&CanaryStatus) -> bool) -> CanaryStatus {
    let deadline = Instant::now() + timeout;
    loop {
        let canary = status(world).await;
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
    (detected, reasons_message(world, "GateFailed"))
}

/// The reasons of the events about `canary-web`, oldest first.
fn event_reasons(world: &World) -> Vec<String> {
    let out = world.kubectl.ok(&[
        "-n",
        NS,
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={NAME}"),
        "--sort-by=.metadata.creationTimestamp",
        "-o",
        "jsonpath={range .items[*]}{.reason}{\"\\n\"}{end}",
    ]);
    out.lines().map(str::to_string).collect()
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
    // Judged on 200 sessions a step: the kubelet's TCP readiness probes of the proxy pods open
    // sessions that send nothing and get nothing, and one of them among 20 sessions is 5 %.
    world.kubectl.apply(&balancer("v1", "v2", Some(canary_judged_on(steps, 200))));
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
    let reasons = event_reasons(world);
    let count = |reason: &str| reasons.iter().filter(|r| *r == reason).count();
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
    ensure_canary_web(world, "v2", "refuse").await;
    let front = front_ip(world, NAME).await;
    let held = Held::open(&format!("{front}:80"), 20).await;
    let load = Load::start(format!("{front}:80"), 4);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (detected, failed) = released_then_rolled_back(world, "v2", "refuse").await;
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
    let aborted = canary_cli(world, &["abort", NAME]);
    println!("node: balancer canary abort: {aborted}");
    let back = status(world).await.expect("a status");
    assert_eq!((back.phase, back.weight), (CanaryPhase::Aborted, 0));
    world.kubectl.apply(&release);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(status(world).await.map(|c| c.phase), Some(CanaryPhase::Aborted), "a re-apply does not undo an abort");
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
    for made in ["echo-refuse", "echo-silent"] {
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

/// The message of the last event about `canary-web` with `reason`.
fn reasons_message(world: &World, reason: &str) -> String {
    let out = world.kubectl.ok(&[
        "-n",
        NS,
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={NAME},reason={reason}"),
        "--sort-by=.metadata.creationTimestamp",
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]);
    out.lines().last().unwrap_or_default().to_string()
}

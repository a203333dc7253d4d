//! The scale benchmark: N copies of the sample Balancer against the real API server.
//!
//! `cargo test --test e2e -- --ignored scale` (not part of the suite, not timed in CI). It
//! starts a fresh control plane (with a /16 of Service IPs), the operator out of cluster as the
//! token user bound to `deploy/rbac.yaml`, applies
//! `BALANCER_SCALE_N` Balancers (default 1000) in batches of `BALANCER_SCALE_BATCH` (200),
//! and prints:
//! - the time from the first apply until every Balancer has its children and
//!   `activeBackends: 3` for its current generation;
//! - the operator's requests per Balancer over that time, from the audit log;
//! - the answers `429 Too Many Requests` it got, by resource;
//! - the events it created or patched;
//! - its RSS (and peak) once converged;
//! - when kube-controller-manager has settled: every proxy Deployment has its pod (they stay
//!   Pending: no kubelet). It runs at `BALANCER_SCALE_KCM_QPS` requests a second (default 100,
//!   not its own 20, which takes minutes over a thousand Deployments). Each Balancer's status
//!   follows its Deployment's `status.replicas` (the scale subresource): one write as it moves;
//! - the operator's requests per Balancer up to then;
//! - its writes while things settle (`BALANCER_SCALE_SETTLE`, seconds, default 10), then in a
//!   quiet window (`BALANCER_SCALE_QUIET`, default 30).
//!
//! The webhooks are not registered unless `BALANCER_SCALE_WEBHOOKS=1`: the applies are then
//! faster and the burst on the controller sharper. `BALANCER_SCALE_FLAGS` adds `balancer run` flags (space-separated), to measure one lever at a time;
//! `BALANCER_SCALE_TIMEOUT` (seconds, default 900) bounds the wait; `BALANCER_E2E_BINARY` runs
//! another build of `balancer` (e.g. main's, for a before/after in the same conditions), with
//! `BALANCER_E2E_RBAC` naming that build's `deploy/rbac.yaml`.
//!
//! The operator is `CARGO_BIN_EXE_balancer`, built with the test's profile: `--release` measures
//! a release operator but also builds this harness with fat LTO. Quicker: `cargo build --release
//! --bin balancer` and `BALANCER_E2E_BINARY=target/release/balancer` with the debug harness.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use balancer::api::Balancer;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde::Deserialize;
use serde_json::json;

use crate::operator::Operator;
use crate::toolkit::cluster::{ControlPlane, OPERATOR, PlaneOptions};
use crate::toolkit::kubectl::Kubectl;
use crate::{NS, World, apply_shipped_rbac, as_list, install_shipped_crd, register_webhooks};

pub(crate) fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs the benchmark.
pub async fn run(assets: &Path) -> ExitCode {
    let n: usize = env_or("BALANCER_SCALE_N", 1000);
    let batch: usize = env_or("BALANCER_SCALE_BATCH", 200).max(1);
    let settle = Duration::from_secs(env_or("BALANCER_SCALE_SETTLE", 10));
    let kcm_qps: u32 = env_or("BALANCER_SCALE_KCM_QPS", 100);
    let quiet = Duration::from_secs(env_or("BALANCER_SCALE_QUIET", 30));
    let timeout = Duration::from_secs(env_or("BALANCER_SCALE_TIMEOUT", 900));
    let flags: Vec<String> =
        std::env::var("BALANCER_SCALE_FLAGS").unwrap_or_default().split_whitespace().map(String::from).collect();

    // Four Services per Balancer: a /16 of cluster IPs.
    let options = PlaneOptions {
        service_cidr: "10.0.0.0/16".into(),
        controller_manager_qps: Some(kcm_qps),
        ..PlaneOptions::default()
    };
    let plane = ControlPlane::start_with(assets, &options).await;
    let admin = plane.client("admin").await;
    let mut world = World { plane, admin, operators: Vec::new() };
    install_shipped_crd(&world);
    apply_shipped_rbac(&world);
    let flag_refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = Operator::start(&world.plane, "operator-scale", &flag_refs).await;
    let webhooks = env_or("BALANCER_SCALE_WEBHOOKS", 0) != 0;
    if webhooks {
        register_webhooks(&world, &operator).await;
        // The API server picks up webhook configurations a moment later: one Balancer through them first.
        wait_for_webhooks(&world).await;
    }
    let pid = operator.process.child.id();
    world.operators.push(operator);
    println!("scale: {n} Balancers in batches of {batch}; webhooks: {webhooks}; operator flags: {flags:?}");

    let audit_start = audit_len(&world.plane.audit_log);
    let started = Instant::now();
    let applies = apply_in_batches(world.plane.kubectl("admin"), n, batch, started);
    let converged = wait_converged(&world.admin, n, started, timeout);
    let (applied_in, converged_in) = tokio::join!(applies, converged);
    let rss = memory(pid);
    let audit_converged = audit_len(&world.plane.audit_log);
    let during = audit_summary(&world.plane.audit_log, audit_start, audit_converged);

    // The Deployment controller gives every Deployment its pod; the statuses follow.
    let pods_in = wait_deployments_settled(&world.admin, n, started, timeout).await;
    let audit_pods = audit_len(&world.plane.audit_log);
    let to_pods = audit_summary(&world.plane.audit_log, audit_start, audit_pods);
    tokio::time::sleep(settle).await;
    let audit_settled = audit_len(&world.plane.audit_log);
    let settling = audit_summary(&world.plane.audit_log, audit_pods, audit_settled);
    tokio::time::sleep(quiet).await;
    let after = audit_summary(&world.plane.audit_log, audit_settled, audit_len(&world.plane.audit_log));
    let metrics = world.operators[0].metrics(&world.plane).await;

    println!("scale: ---- {n} Balancers ----");
    println!("scale: kubectl apply of all batches       {:.1} s", applied_in.as_secs_f64());
    println!("scale: first apply -> all converged        {}", took(converged_in, timeout));
    println!("scale: requests by the operator            {}", per_balancer(during.requests, n));
    println!("scale:   by verb and resource             {:?}", during.by_kind);
    println!("scale: 429 answers to the operator        {} {:?}", during.throttled, during.throttled_by_kind);
    println!("scale: events created/patched             {}", per_balancer(during.events, n));
    println!("scale: operator RSS when converged        {:.1} MiB (peak {:.1} MiB)", rss.0, rss.1);
    println!("scale: first apply -> every Deployment's pod {}", took(pods_in, timeout));
    println!("scale: requests by the operator up to then {} {:?}", per_balancer(to_pods.requests, n), to_pods.by_kind);
    println!(
        "scale: settling {:>3} s after: operator writes {} (of {} requests) {:?}",
        settle.as_secs(),
        settling.writes,
        settling.requests,
        settling.by_kind
    );
    println!(
        "scale: quiet {:>3} s after that: operator writes {} (of {} requests) {:?}",
        quiet.as_secs(),
        after.writes,
        after.requests,
        after.write_list
    );
    for line in metrics.lines().filter(|l| l.starts_with("balancer_reconcile") || l.starts_with("balancer_api_")) {
        println!("scale:   {line}");
    }
    let held = records_held(&world).await;
    let records = forget_every_balancer(&world, n).await;
    println!(
        "scale: Balancers the operator holds a record of: {held:?} with all {n}, {records:?} once all were deleted (half in the middle of a change)"
    );
    drop(world);
    if converged_in.is_some() && records == Some(0) { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// `balancer_records`, from the operator's metrics.
async fn records_held(world: &World) -> Option<i64> {
    let metrics = world.operators[0].metrics(&world.plane).await;
    metrics.lines().find_map(|l| l.strip_prefix("balancer_records ")?.trim().parse().ok())
}

/// Changes the weights of every other Balancer, deletes them all at once (so that half are
/// deleted in the middle of a change), and returns how many Balancers the operator still holds a
/// record of (`balancer_records`) once its next count is due.
async fn forget_every_balancer(world: &World, n: usize) -> Option<i64> {
    let balancers: Api<Balancer> = Api::namespaced(world.admin.clone(), NS);
    let backend = |name: &str, weight: u32| json!({"name": name, "weight": weight, "selector": {"version": name}});
    let change = json!({"spec": {"backends": [backend("v1", 20), backend("v2", 40), backend("v3", 40)]}});
    for i in (0..n).step_by(2) {
        let _ = balancers.patch(&format!("scale-{i:05}"), &PatchParams::default(), &Patch::Merge(&change)).await;
    }
    let kubectl = world.plane.kubectl("admin");
    tokio::task::spawn_blocking(move || kubectl.ok(&["-n", NS, "delete", "balancers", "--all", "--wait=false"]))
        .await
        .expect("the delete");
    // The records are counted, and those of deleted Balancers dropped, every 10 s.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        tokio::time::sleep(Duration::from_secs(11)).await;
        let records = records_held(world).await;
        if records == Some(0) || Instant::now() > deadline {
            return records;
        }
    }
}

/// `12.3 s`, or `NOT within …` for what did not happen before `timeout`.
pub(crate) fn took(elapsed: Option<Duration>, timeout: Duration) -> String {
    elapsed.map_or_else(|| format!("NOT within {timeout:?}"), |took| format!("{:.1} s", took.as_secs_f64()))
}

/// `count (x.y per Balancer)` for `n` Balancers.
fn per_balancer(count: usize, n: usize) -> String {
    format!("{count} ({:.1} per Balancer)", count as f64 / n as f64)
}

async fn wait_for_webhooks(world: &World) {
    let probe = crate::balancer_yaml(
        "scale-probe",
        "spec:\n  ports: [{port: 80}]\n  backends: [{name: a, selector: {app: a}}]\n",
    );
    crate::eventually("the webhooks to be called", Duration::from_secs(30), || async {
        // The mutating webhook's default (weight 1) shows the webhook ran.
        let (ok, _) = crate::apply(world, "admin", &probe);
        let stored = crate::balancers(world).get_opt("scale-probe").await.ok().flatten()?;
        (ok && stored.spec.backends[0].weight == Some(1)).then_some(())
    })
    .await;
    crate::balancers(world).delete("scale-probe", &Default::default()).await.expect("delete the probe");
}

/// The sample Balancer named `scale-<i>`.
fn sample(i: usize) -> serde_json::Value {
    let mut doc = crate::yaml_docs(&crate::repo_file("deploy/samples/balancer.yaml")).remove(0);
    doc["metadata"] = json!({"name": format!("scale-{i:05}"), "namespace": NS});
    // The storage version: no conversion webhook in the way unless the webhooks are registered.
    doc["apiVersion"] = json!(format!("{}/{}", balancer::api::GROUP, balancer::api::STORAGE_VERSION));
    doc
}

/// `kubectl apply` of `n` Balancers, `batch` per call, as the user would; returns how long it took.
async fn apply_in_batches(kubectl: Kubectl, n: usize, batch: usize, started: Instant) -> Duration {
    tokio::task::spawn_blocking(move || {
        let docs: Vec<serde_json::Value> = (0..n).map(sample).collect();
        for (i, chunk) in docs.chunks(batch).enumerate() {
            let list = as_list(chunk.to_vec());
            let t = Instant::now();
            let applied = kubectl.try_apply(&list);
            if let Err(err) = &applied {
                println!("scale: kubectl apply: {}", err.lines().take(3).collect::<Vec<_>>().join(" | "));
            }
            println!(
                "scale: batch {} applied in {:.1} s (at {:.1} s){}",
                i + 1,
                t.elapsed().as_secs_f64(),
                started.elapsed().as_secs_f64(),
                if applied.is_ok() { "" } else { " with errors" }
            );
        }
        started.elapsed()
    })
    .await
    .expect("the apply task")
}

/// Waits until `n` Balancers report `activeBackends: 3` for their generation and every child
/// exists; `None` past `timeout`.
async fn wait_converged(admin: &Client, n: usize, started: Instant, timeout: Duration) -> Option<Duration> {
    let balancers: Api<Balancer> = Api::namespaced(admin.clone(), NS);
    // From the API server's watch cache: cheap enough to poll every second.
    let cached = ListParams::default().match_any();
    let period = Duration::from_secs(1);
    let converged = |b: &Balancer| {
        b.status.as_ref().is_some_and(|s| {
            s.active_backends == 3 && s.observed_generation.is_some() && s.observed_generation == b.metadata.generation
        })
    };
    count_until_done(n, "converged", started, timeout, period, || async {
        let done = count_listed(&balancers, &cached, converged).await?;
        Some((done, done >= n && children_complete(admin, n).await))
    })
    .await
}

/// Waits until kube-controller-manager has given every proxy Deployment the pods it asks for
/// (and reported so); `None` past `timeout`.
async fn wait_deployments_settled(admin: &Client, n: usize, started: Instant, timeout: Duration) -> Option<Duration> {
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), NS);
    let lp = ListParams::default().labels("app.kubernetes.io/managed-by=balancer").match_any();
    let period = Duration::from_secs(2);
    let has_its_pods = |d: &Deployment| {
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let status = d.status.as_ref();
        status.is_some_and(|s| s.observed_generation == d.metadata.generation && s.replicas.unwrap_or(0) == want)
    };
    count_until_done(n, "Deployments have their pods", started, timeout, period, || async {
        let settled = count_listed(&deployments, &lp, has_its_pods).await?;
        Some((settled, settled >= n))
    })
    .await
}

/// How many of the objects `api` lists with `params` are `counted`; `None` if the list fails.
pub(crate) async fn count_listed<K>(api: &Api<K>, params: &ListParams, counted: impl Fn(&K) -> bool) -> Option<usize>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Some(api.list(params).await.ok()?.items.iter().filter(|k| counted(k)).count())
}

/// Every `period`, `count` says how many of `n` are done and whether that is all it waits
/// for (`None`: no answer this time). Prints the count every 15 s as `{done}/{n} {what}`.
/// Returns the time since `started` once done, or `None` past `timeout`.
pub(crate) async fn count_until_done<F, Fut>(
    n: usize,
    what: &str,
    started: Instant,
    timeout: Duration,
    period: Duration,
    mut count: F,
) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<(usize, bool)>>,
{
    let mut last_report = Instant::now();
    loop {
        if started.elapsed() > timeout {
            return None;
        }
        tokio::time::sleep(period).await;
        let Some((done, finished)) = count().await else { continue };
        if last_report.elapsed() > Duration::from_secs(15) {
            println!("scale: {done}/{n} {what} at {:.0} s", started.elapsed().as_secs_f64());
            last_report = Instant::now();
        }
        if finished {
            return Some(started.elapsed());
        }
    }
}

/// Every Balancer's six children exist (4 Services, a ConfigMap, a Deployment).
async fn children_complete(admin: &Client, n: usize) -> bool {
    let lp = ListParams::default().labels("app.kubernetes.io/managed-by=balancer").match_any();
    let services = Api::<Service>::namespaced(admin.clone(), NS).list_metadata(&lp).await.map(|l| l.items.len());
    let maps = Api::<ConfigMap>::namespaced(admin.clone(), NS).list_metadata(&lp).await.map(|l| l.items.len());
    let deployments = Api::<Deployment>::namespaced(admin.clone(), NS).list_metadata(&lp).await.map(|l| l.items.len());
    matches!((services, maps, deployments), (Ok(s), Ok(c), Ok(d)) if s >= 4 * n && c >= n && d >= n)
}

/// The operator's resident and peak memory, in MiB, from /proc.
pub(crate) fn memory(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

fn audit_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The fields of an audit event the summary reads.
#[derive(Deserialize)]
struct AuditEvent {
    #[serde(rename = "auditID")]
    audit_id: String,
    verb: String,
    user: AuditUser,
    #[serde(rename = "objectRef", default)]
    object_ref: Option<AuditObject>,
    #[serde(rename = "responseStatus", default)]
    response_status: Option<AuditStatus>,
    #[serde(rename = "requestURI")]
    request_uri: String,
}

#[derive(Deserialize)]
struct AuditUser {
    username: String,
}

#[derive(Deserialize)]
struct AuditObject {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
}

#[derive(Deserialize)]
struct AuditStatus {
    #[serde(default)]
    code: u16,
}

#[derive(Default, Debug)]
struct AuditSummary {
    requests: usize,
    by_kind: BTreeMap<String, usize>,
    throttled: usize,
    throttled_by_kind: BTreeMap<String, usize>,
    events: usize,
    writes: usize,
    write_list: Vec<String>,
}

/// The operator's requests in the audit log between two byte offsets, each counted once
/// (a watch logs a start and an end stage).
fn audit_summary(path: &Path, from: u64, to: u64) -> AuditSummary {
    let mut summary = AuditSummary::default();
    let Ok(mut file) = std::fs::File::open(path) else { return summary };
    if file.seek(SeekFrom::Start(from)).is_err() {
        return summary;
    }
    let mut seen = HashSet::new();
    let mut reader = BufReader::new(file).take(to.saturating_sub(from));
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap_or(0) > 0 {
        let event: Option<AuditEvent> = serde_json::from_str(&line).ok();
        line.clear();
        let Some(event) = event.filter(|e| e.user.username == OPERATOR.name) else { continue };
        if !seen.insert(event.audit_id.clone()) {
            continue;
        }
        let resource = event.object_ref.as_ref().map_or_else(String::new, |o| match o.subresource.as_str() {
            "" => o.resource.clone(),
            sub => format!("{}/{sub}", o.resource),
        });
        let kind = format!("{} {resource}", event.verb);
        summary.requests += 1;
        *summary.by_kind.entry(kind.clone()).or_default() += 1;
        if event.response_status.as_ref().is_some_and(|s| s.code == 429) {
            summary.throttled += 1;
            *summary.throttled_by_kind.entry(kind.clone()).or_default() += 1;
        }
        if resource == "events" {
            summary.events += 1;
        }
        if ["create", "update", "patch", "delete"].contains(&event.verb.as_str()) {
            summary.writes += 1;
            if summary.write_list.len() < 10 {
                summary.write_list.push(format!("{} {}", event.verb, event.request_uri));
            }
        }
    }
    summary
}

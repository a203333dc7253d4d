//! Faults of the control plane: etcd or kube-apiserver killed with SIGKILL, kept down, started
//! again on the same port and data; then a Balancer is changed. The controller must catch up
//! within seconds, with and without leader election, replay nothing, and stay up; the webhooks
//! keep serving all along.
//!
//! Three operators run at once, each on a namespace of its own: one without leader election,
//! and two electing a leader (a 6 s Lease). They serve `/metrics` on the probe port
//! (`--insecure-metrics`): a protected scrape needs the API server to review its token.
//!
//! These scenarios run beside the other scenarios, in two tracks, each on a control plane of
//! its own: they kill its processes, and their 3½ minutes are mostly spent waiting.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;

use crate::operator::Operator;
use crate::toolkit::cluster::OPERATOR;
use crate::toolkit::runner::{self, Filter, Scenario, eventually, scenarios};
use crate::{World, apply, apply_shipped_rbac, diagnose, install_shipped_crd, register_webhooks, webhook_answers};

/// The namespaces of the two operators the fault scenarios run: one alone, one elected leader.
const PLAIN: &str = "faults-plain";
const ELECTED: &str = "faults-elected";
/// The Balancer changed after each fault, and the one left alone, in both namespaces.
const MOVING: &str = "moving";
const STEADY: &str = "steady";

/// With `BALANCER_E2E_MEASURE=1` the fault scenarios only report what they find, and wait up to
/// 3 minutes for a change: to measure another build (`BALANCER_E2E_BINARY`, with its
/// `BALANCER_E2E_RBAC`), which may be slower or lack the metric.
fn measuring() -> bool {
    std::env::var("BALANCER_E2E_MEASURE").as_deref() == Ok("1")
}

/// How long after the API server answers again the change must be reconciled: generous for CI
/// (the goal is 10 s).
fn recovery_limit() -> Duration {
    Duration::from_secs(if measuring() { 180 } else { 30 })
}

/// The outages, in tracks that run at once, each on a control plane of its own (the first
/// scenario of each starts its operators); within a track, in order.
fn tracks() -> Vec<Vec<(&'static str, Scenario<World>)>> {
    vec![
        scenarios![World:
            the_controller_catches_up_after_the_api_server_restarts,
            the_controller_catches_up_after_etcd_restarts,
        ],
        scenarios![World: the_controller_catches_up_after_two_minutes_without_the_api_server],
    ]
}

/// The outages running beside the other scenarios, a thread per track. Dropped before
/// [`Outages::finish`] (the other scenarios' thread panicked), it still waits for them, so
/// that their control planes and operators are stopped, not left behind.
pub struct Outages(Vec<JoinHandle<(usize, usize)>>);

impl Outages {
    /// Starts the tracks that hold a scenario the command line selects, each on a new control
    /// plane with the shipped CRD and RBAC.
    pub fn start(assets: &Path) -> Outages {
        let selected = tracks().into_iter().filter(|track| {
            let names: Vec<&str> = track.iter().map(|(name, _)| *name).collect();
            runner::selects_any(&names, Filter::RunsUpToTheNamed)
        });
        let threads = selected.map(|track| {
            let assets: PathBuf = assets.to_path_buf();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Runtime::new().expect("runtime");
                runtime.block_on(async move {
                    let mut world = World::start(&assets).await;
                    install_shipped_crd(&world);
                    apply_shipped_rbac(&world);
                    let outcome = runner::run(&mut world, track, Filter::RunsUpToTheNamed, diagnose).await;
                    world.stop();
                    outcome
                })
            })
        });
        Outages(threads.collect())
    }

    /// Waits for every track to end: how many scenarios passed and failed (a track whose setup
    /// panicked, one failure).
    pub fn finish(mut self) -> (usize, usize) {
        let (mut passed, mut failed) = (0, 0);
        for thread in std::mem::take(&mut self.0) {
            let (track_passed, track_failed) = thread.join().unwrap_or_else(|_| {
                println!("e2e: a control plane for the outages could not be set up");
                (0, 1)
            });
            passed += track_passed;
            failed += track_failed;
        }
        (passed, failed)
    }
}

impl Drop for Outages {
    fn drop(&mut self) {
        for thread in self.0.drain(..) {
            let _ = thread.join();
        }
    }
}

async fn the_controller_catches_up_after_the_api_server_restarts(world: &mut World) {
    start_operators(world).await;
    let fault = Fault { process: "kube-apiserver", down: Duration::from_secs(15) };
    survive(world, fault, 20).await;
}

async fn the_controller_catches_up_after_etcd_restarts(world: &mut World) {
    let fault = Fault { process: "etcd", down: Duration::from_secs(15) };
    survive(world, fault, 30).await;
}

async fn the_controller_catches_up_after_two_minutes_without_the_api_server(world: &mut World) {
    start_operators(world).await;
    let fault = Fault { process: "kube-apiserver", down: Duration::from_secs(120) };
    survive(world, fault, 40).await;
}

fn balancer(namespace: &str, name: &str, weight: u32) -> String {
    format!(
        "apiVersion: exposer.hliangzhao.io/v1beta1\nkind: Balancer\nmetadata:\n  name: {name}\n  namespace: {namespace}\n\
         spec:\n  ports: [{{port: 80}}]\n  backends:\n  - {{name: a, weight: {weight}, selector: {{app: a}}}}\n  \
         - {{name: b, weight: 1, selector: {{app: b}}}}\n"
    )
}

/// Whether `name`'s proxy configuration gives backend `a` weight `weight`.
async fn configured(world: &World, namespace: &str, name: &str, weight: u32) -> bool {
    let config_maps: Api<ConfigMap> = Api::namespaced(world.admin.clone(), namespace);
    let Ok(Some(cm)) = config_maps.get_opt(&format!("{name}-proxy-configmap")).await else { return false };
    cm.data.and_then(|d| d.get("nginx.conf").cloned()).is_some_and(|conf| conf.contains(&format!("weight={weight} ")))
}

/// The three operators of a track, started by its first scenario.
async fn start_operators(world: &mut World) {
    for mut op in world.operators.drain(..) {
        op.stop();
    }
    for namespace in [PLAIN, ELECTED] {
        let (ok, out, err) = world.plane.kubectl("admin").run(&["create", "namespace", namespace], None);
        assert!(ok || err.contains("AlreadyExists"), "{out}{err}");
    }
    let plain = Operator::start(&world.plane, PLAIN, &[&format!("--namespace={PLAIN}"), "--insecure-metrics"]).await;
    register_webhooks(world, &plain).await;
    world.operators.push(plain);
    for replica in ["faults-elected-1", "faults-elected-2"] {
        let namespace = format!("--namespace={ELECTED}");
        let flags = [
            "--leader-elect",
            "--lease-duration=6",
            "--leader-election-id=faults-leader",
            &namespace,
            "--insecure-metrics",
        ];
        world.operators.push(Operator::start(&world.plane, replica, &flags).await);
    }
    for namespace in [PLAIN, ELECTED] {
        for name in [MOVING, STEADY] {
            let (ok, out) = apply(world, "admin", &balancer(namespace, name, 1));
            assert!(ok, "{out}");
        }
    }
    for namespace in [PLAIN, ELECTED] {
        for name in [MOVING, STEADY] {
            eventually(&format!("{namespace}/{name} reconciled"), Duration::from_secs(30), || async {
                configured(world, namespace, name, 1).await.then_some(())
            })
            .await;
        }
    }
    // Let the first status writes and events settle before the first fault.
    tokio::time::sleep(Duration::from_secs(3)).await;
}

/// A control-plane process killed, and how long it stays down.
#[derive(Clone, Copy)]
struct Fault {
    process: &'static str,
    down: Duration,
}

/// Kills `fault.process`, waits, starts it again, changes `moving` in both namespaces to `weight`,
/// and checks how the operators come back.
async fn survive(world: &mut World, fault: Fault, weight: u32) {
    let audit_mark = world.plane.audit_events().len();
    let fault_at = Timestamp::now();
    world.plane.process(fault.process).kill();
    let killed = Instant::now();
    let noticed = while_down(world, fault, killed).await;
    let left = fault.down.saturating_sub(killed.elapsed());
    tokio::time::sleep(left).await;
    world.plane.process(fault.process).restart();
    eventually("the API server to answer again", Duration::from_secs(90), || async {
        world.plane.is_ready().await.then_some(())
    })
    .await;
    let back = Instant::now();

    for namespace in [PLAIN, ELECTED] {
        let patch = format!(r#"[{{"op": "replace", "path": "/spec/backends/0/weight", "value": {weight}}}]"#);
        let args = ["-n", namespace, "patch", "balancer", MOVING, "--type=json", "-p", &patch];
        eventually(&format!("the change to {namespace}/{MOVING} accepted"), Duration::from_secs(20), || async {
            world.plane.kubectl("admin").run(&args, None).0.then_some(())
        })
        .await;
    }
    let changed = back.elapsed();
    let recovery = recover(world, weight, back).await;
    let name = format!("{} down {} s", fault.process, fault.down.as_secs());
    println!(
        "e2e: {name}: change accepted {:.1} s after the API server answered; reconciled after {} without \
         leader election, {} with; a leader back after {}",
        changed.as_secs_f64(),
        seconds(recovery.plain),
        seconds(recovery.elected),
        seconds(recovery.leader),
    );
    let mut problems: Vec<String> = noticed.into_iter().collect();
    for op in &mut world.operators {
        if !op.process.running() {
            problems.push(format!("{} did not survive", op.name));
        }
    }
    if recovery.plain.is_none() {
        problems.push(format!("not reconciled within {:?} without leader election", recovery_limit()));
    }
    if recovery.elected.is_none() {
        problems.push(format!("not reconciled within {:?} with leader election", recovery_limit()));
    }
    if !recovery.both_led.is_empty() {
        problems.push(format!("two replicas led at once, at {:?}", recovery.both_led));
    }
    // Nothing is written again for what did not change: no status, no event, no child.
    tokio::time::sleep(Duration::from_secs(3)).await;
    problems.extend(replayed_writes(world, audit_mark).into_iter().map(|w| format!("{STEADY} written again: {w}")));
    problems.extend(events_since(world, fault_at).await.into_iter().map(|e| format!("an event about {STEADY}: {e}")));
    if measuring() {
        println!("e2e: {name}: {problems:#?}");
    } else {
        assert!(problems.is_empty(), "{name}: {problems:#?}");
    }
}

/// While the process is down: the operators stay ready and their webhooks answer, and those
/// whose requests go unanswered say so in the metric: with the API server gone, all of them;
/// with etcd gone (the API server holds requests), the two electing a leader, whose Lease
/// requests get no answer (the third sends nothing while nothing changes). Returns what was missed.
async fn while_down(world: &World, fault: Fault, killed: Instant) -> Option<String> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    for op in &world.operators {
        assert_eq!(op.probe("/readyz").await, Some(200), "{} not ready while {} is down", op.name, fault.process);
        assert!(
            webhook_answers(world, op).await,
            "{}'s webhook does not answer while {} is down",
            op.name,
            fault.process
        );
    }
    let noticing = if fault.process == "kube-apiserver" { &world.operators[..] } else { &world.operators[1..] };
    let deadline = killed + fault.down.saturating_sub(Duration::from_millis(500));
    // Since when the operator has not reached the API server (0 while it does).
    const UNREACHABLE: &str = "balancer_api_unreachable_since_timestamp_seconds";
    for op in noticing {
        loop {
            if op.metric(&world.plane, UNREACHABLE).await.is_some_and(|since| since > 0.0) {
                break;
            }
            if Instant::now() > deadline {
                return Some(format!("{} never reported the API server lost ({UNREACHABLE})", op.name));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    None
}

/// How long after `back` each namespace's change was reconciled and a leader was back (`None`:
/// not within [`recovery_limit`]), and the moments two replicas said they led.
struct Recovery {
    plain: Option<Duration>,
    elected: Option<Duration>,
    leader: Option<Duration>,
    both_led: Vec<Duration>,
}

fn seconds(took: Option<Duration>) -> String {
    took.map_or_else(
        || format!("never (over {} s)", recovery_limit().as_secs()),
        |d| format!("{:.1} s", d.as_secs_f64()),
    )
}

async fn recover(world: &World, weight: u32, back: Instant) -> Recovery {
    let limit = recovery_limit();
    let (mut plain, mut elected, mut leader) = (None, None, None);
    let mut both_led = Vec::new();
    while back.elapsed() <= limit && (plain.is_none() || elected.is_none() || leader.is_none()) {
        if plain.is_none() && configured(world, PLAIN, MOVING, weight).await {
            plain = Some(back.elapsed());
        }
        if elected.is_none() && configured(world, ELECTED, MOVING, weight).await {
            elected = Some(back.elapsed());
        }
        let mut leading = 0;
        for op in &world.operators[1..] {
            leading += usize::from(op.metric(&world.plane, "balancer_controller_leader").await == Some(1.0));
        }
        if leading > 1 {
            both_led.push(back.elapsed());
        }
        if leading == 1 && leader.is_none() {
            leader = Some(back.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Recovery { plain, elected, leader, both_led }
}

/// The operators' writes since `mark` that concern the Balancers left alone.
fn replayed_writes(world: &World, mark: usize) -> Vec<String> {
    let events = world.plane.audit_events();
    events[mark.min(events.len())..]
        .iter()
        .filter(|e| e["user"]["username"] == OPERATOR.name)
        .filter(|e| ["create", "update", "patch", "delete"].contains(&e["verb"].as_str().unwrap_or("")))
        .filter(|e| {
            let name = e["objectRef"]["name"].as_str().unwrap_or("");
            name == STEADY || name.starts_with(&format!("{STEADY}-"))
        })
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect()
}

/// Events about the Balancers left alone, last seen after `at`.
async fn events_since(world: &World, at: Timestamp) -> Vec<String> {
    let mut found = Vec::new();
    for namespace in [PLAIN, ELECTED] {
        let events: Api<Event> = Api::namespaced(world.admin.clone(), namespace);
        let Ok(list) = events.list(&ListParams::default()).await else { continue };
        for event in list {
            let about = event.regarding.as_ref().and_then(|r| r.name.as_deref());
            let seen = event.series.as_ref().map(|s| s.last_observed_time.0).or(event.event_time.as_ref().map(|t| t.0));
            if about == Some(STEADY) && seen.is_some_and(|t| t > at) {
                found.push(format!(
                    "{namespace}: {} {}",
                    event.reason.unwrap_or_default(),
                    event.note.unwrap_or_default()
                ));
            }
        }
    }
    found
}

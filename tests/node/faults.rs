//! Faults of the operator and the control plane under load: the leader's pod deleted, the API
//! server killed and restarted, the leader's process killed in the middle of a change; and
//! the Balancer writer that checks the webhooks answer all along.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::fixtures::{
    Sample, backends_patch, balancers, change_backends, configured_as, configured_weights, front_ip, lease_holder,
    lease_identity, operator_pod_restarts, reconciled, set_weights, wait_available,
};
use crate::toolkit::load::{Load, assert_no_failures};
use crate::toolkit::runner::eventually;
use crate::weights::weights_on_the_wire;
use crate::{NS, OPERATOR_NS, SAMPLE, World};

pub async fn the_other_replica_takes_over_when_the_leader_pod_is_deleted(world: &mut World) {
    world.ensure_sample(Sample::ANY).await;
    let leader = eventually("a leader", Duration::from_secs(30), || lease_holder(world)).await;
    // Balancer writes go through the webhooks all along.
    let applies = Applies::start(world, "failover-probe");
    let deleted = Instant::now();
    world.kubectl.ok(&["-n", OPERATOR_NS, "delete", "pod", &leader, "--wait=false"]);
    let successor = eventually("a new leader", Duration::from_secs(40), || async {
        lease_holder(world).await.filter(|holder| *holder != leader)
    })
    .await;
    let took = deleted.elapsed();
    println!("node: {successor} took the Lease {:.1} s after {leader} was deleted", took.as_secs_f64());
    assert!(took <= Duration::from_secs(20), "the Lease lasts 15 s; the new leader took {took:?}");

    // The new leader reconciles a change.
    change_backends(world, SAMPLE, &[("v2", 30)], &[]).await;
    let changed = reconciled(world, SAMPLE, Duration::from_secs(60)).await;
    let v1 = changed.spec.backends.iter().find(|b| b.name == "v1").map_or(0, |b| b.effective_weight());
    eventually("the new leader applies the change", Duration::from_secs(60), || async {
        configured_as(world, SAMPLE, &[("v1", v1.unsigned_abs()), ("v2", 30)]).await.then_some(())
    })
    .await;
    // Through the old leader's replacement starting, too.
    wait_available(world, OPERATOR_NS, "balancer", 2).await;
    let (writes, failures) = applies.finish(world);
    println!("node: {writes} Balancer applies during the failover, {} failed", failures.len());
    assert!(failures.is_empty(), "applies failed during the failover: {failures:?}");
}

/// A Balancer with no pods behind it (`app: nothing`), one backend of `weight`, and the label
/// `write: <write>`; in v1alpha1, so that applying it goes through the conversion webhook too.
pub fn probe_balancer(name: &str, weight: u32, write: usize) -> String {
    format!(
        "apiVersion: exposer.hliangzhao.io/v1alpha1\nkind: Balancer\nmetadata:\n  name: {name}\n  namespace: {NS}\n\
         \x20 labels: {{write: \"{write}\"}}\n\
         spec:\n  ports: [{{port: 8080}}]\n  selector: {{app: nothing}}\n  backends: [{{name: a, weight: {weight}, selector: {{v: a}}}}]\n"
    )
}

/// `kubectl apply` of a small v1alpha1 Balancer every 200 ms, from a thread, through the
/// webhooks (mutating, validating, conversion), until finished. Each apply changes a label,
/// not the spec, so that it does not roll the Balancer's proxy every 200 ms.
pub struct Applies {
    name: String,
    stop: Arc<AtomicBool>,
    writer: Option<std::thread::JoinHandle<(usize, Vec<String>)>>,
}

impl Applies {
    pub fn start(world: &World, name: &str) -> Applies {
        let kubectl = world.kubectl.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, balancer) = (stop.clone(), name.to_string());
        let writer = std::thread::spawn(move || {
            let (mut writes, mut failures) = (0, Vec::new());
            while !flag.load(Ordering::Relaxed) {
                let yaml = probe_balancer(&balancer, 1, writes);
                writes += 1;
                if let Err(e) = kubectl.try_apply(&yaml) {
                    failures.push(e);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            (writes, failures)
        });
        Applies { name: name.to_string(), stop, writer: Some(writer) }
    }

    /// Stops the writer and deletes its Balancer: how many applies there were, and every failure.
    pub fn finish(mut self, world: &World) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let result = self.writer.take().map(|w| w.join().expect("the writer thread")).unwrap_or_default();
        world.kubectl.ok(&["-n", NS, "delete", "balancer", &self.name, "--ignore-not-found"]);
        result
    }
}

/// A scenario that failed stops the writer too.
impl Drop for Applies {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// How soon a change made once the API server answers again after an outage is on the wire:
/// the proxies' sidecars re-watch within 2 s, and a rollout no longer waits for the controller
/// manager and the kubelet (21-23 s when it did).
const CHANGE_AFTER_AN_OUTAGE: Duration = Duration::from_secs(5);

/// The proxy serves on while the API server is away (SIGKILL, 15 s); once it is back, a weight
/// change reaches the wire within [`CHANGE_AFTER_AN_OUTAGE`], and no client request fails all
/// along.
pub async fn a_change_after_an_api_server_restart_reaches_the_wire_without_a_failed_request(world: &mut World) {
    world.ensure_sample(Sample::ANY.backends(&["v1", "v2"])).await;
    let load = Load::start(format!("{}:80", front_ip(world, SAMPLE).await), 2);
    world.plane.process("kube-apiserver").kill();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let during = load.answers().values().sum::<usize>();
    world.plane.process("kube-apiserver").restart();
    world.plane.wait_ready().await;
    let back = Instant::now();
    set_weights(world, 50, 50).await;
    let accepted = back.elapsed();
    configured_weights(world, 50, 50, Duration::from_secs(60)).await;
    let reconciled = back.elapsed();
    weights_on_the_wire(world, 50, 50).await;
    // Counted until the split was measured (1,200 requests), so an overstatement.
    let on_the_wire = back.elapsed();
    println!(
        "node: API server back: the change accepted after {:.1} s, reconciled after {:.1} s, on the wire after {:.1} s",
        accepted.as_secs_f64(),
        reconciled.as_secs_f64(),
        on_the_wire.as_secs_f64()
    );
    assert!(on_the_wire <= CHANGE_AFTER_AN_OUTAGE, "on the wire {on_the_wire:?} after the API server answered");
    // Whether the kubelet's ConfigMap cache was behind (see proxy::nginx::ENTRYPOINT).
    let selector = format!("balancer.exposer.hliangzhao.io/balancer-name={SAMPLE}");
    let args = ["-n", NS, "logs", "-l", &selector, "-c", "nginx", "--tail=-1"];
    let (_, logs, _) = world.kubectl.run(&args, None);
    let waited = logs.lines().filter(|l| l.contains("waiting for the kubelet to mount")).count();
    println!("node: proxy pods that waited for the kubelet to mount their nginx.conf: {waited}");
    let (sent, failures) = load.finish().await;
    assert!(during > 0, "no request was answered while the API server was down");
    assert_no_failures(&format!("through the restart ({during} while it was down)"), sent, &failures);
}

/// The host pid of the operator process in `pod` (its container's process, seen from the host).
pub fn operator_pid(pod: &str) -> Option<u32> {
    let wanted = format!("POD_NAME={pod}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
        let environ = std::fs::read(entry.path().join("environ")).ok()?;
        let ours = comm.trim() == "balancer" && environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes());
        ours.then_some(pid)
    })
}

/// A weight change, and SIGKILL to the leader's process the moment the API server has taken the
/// change (no Lease released, no drain; the controller waits 200 ms to gather changes before it
/// reconciles). Another process takes the Lease once it has run out and finishes the change, and
/// no client request fails. That process is the other replica's or the restarted container's:
/// each process is a new identity, both wait out the Lease, and they race for it; which one won,
/// and whether the killed leader had written anything first, is printed.
pub async fn the_leader_killed_in_the_middle_of_a_change_is_finished_by_a_new_leader(world: &mut World) {
    use kube::api::{Patch, PatchParams};
    world.ensure_sample(Sample::ANY.backends(&["v1", "v2"])).await;
    let killed_identity = eventually("a leader", Duration::from_secs(30), || lease_identity(world)).await;
    let leader = eventually("a leader", Duration::from_secs(30), || lease_holder(world)).await;
    let pid = operator_pid(&leader).unwrap_or_else(|| panic!("no balancer process for pod {leader} on the host"));
    let restarted_before = operator_pod_restarts(world).await.get(&leader).copied().unwrap_or(0);
    let balancers = balancers(world);
    let sample = balancers.get(SAMPLE).await.expect("read the sample");
    let change = backends_patch(&sample, &[("v1", 20), ("v2", 80)], &[]);
    let patch: json_patch::Patch = serde_json::from_value(change).expect("a JSON patch");
    let load = Load::start(format!("{}:80", front_ip(world, SAMPLE).await), 2);
    balancers.patch(SAMPLE, &PatchParams::default(), &Patch::<()>::Json(patch)).await.expect("the weight change");
    let status = Command::new("kill").args(["-KILL", &pid.to_string()]).status().expect("kill runs");
    assert!(status.success(), "kill -KILL {pid}");
    let killed = Instant::now();
    let written_first = configured_as(world, SAMPLE, &[("v1", 20), ("v2", 80)]).await;
    configured_weights(world, 20, 80, Duration::from_secs(60)).await;
    let reconciled = killed.elapsed();
    weights_on_the_wire(world, 20, 80).await;
    let holder = lease_identity(world).await.unwrap_or_default();
    println!(
        "node: leader {killed_identity} killed right after a change (it had {} the proxy's configuration): \
         {holder} had it configured {:.1} s after the kill (the Lease lasts 15 s from its last renewal), on the \
         wire after {:.1} s",
        if written_first { "already written" } else { "not yet written" },
        reconciled.as_secs_f64(),
        killed.elapsed().as_secs_f64()
    );
    assert_ne!(holder, killed_identity, "another process leads after the kill");
    load.assert_no_failures("through the leader's kill").await;
    eventually("the killed container restarted", Duration::from_secs(60), || async {
        let restarts = operator_pod_restarts(world).await.get(&leader).copied().unwrap_or(0);
        (restarts == restarted_before + 1).then_some(())
    })
    .await;
    wait_available(world, OPERATOR_NS, "balancer", 2).await;
}

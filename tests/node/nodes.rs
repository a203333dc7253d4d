//! More than one node: proxies and operator replicas spread, a drain respects the budgets and
//! fails no request, a lost node costs a bounded failure, and an uncordoned node is used again.
//!
//! Node A holds the control plane and kube-proxy, so node B is the one that can be lost.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::faults::{Applies, probe_balancer};
use crate::fixtures::{
    Sample, configured_weights, cordoned_nodes, front_ip, lease_holder, proxy_conf, reconciled, set_weights,
    wait_available, wait_ready_balancer,
};
use crate::node::{NODE_A, NODE_B};
use crate::toolkit::load::{Load, assert_no_failures};
use crate::toolkit::runner::eventually;
use crate::weights::weights_on_the_wire;
use crate::{NODE_MONITOR_GRACE, NS, OPERATOR_NS, SAMPLE, World};

const PROXY: &str = "example-balancer-proxy";
const OPERATOR_PODS: &str = "app.kubernetes.io/name=balancer";
/// The Balancer changed while node B is lost.
const LOSS_BALANCER: &str = "loss-change";

pub fn proxy_pods() -> String {
    balancer::proxy::proxy_selector_string(SAMPLE)
}

/// Live (not terminating) pods matching `selector`: name → node.
async fn placement(world: &World, namespace: &str, selector: &str) -> BTreeMap<String, String> {
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), namespace);
    let list = pods.list(&ListParams::default().labels(selector)).await.expect("pods");
    list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).map(name_and_node).collect()
}

/// A pod's name and the node it is bound to ("" while it is not).
fn name_and_node(pod: Pod) -> (String, String) {
    (pod.name_any(), pod.spec.and_then(|s| s.node_name).unwrap_or_default())
}

fn nodes_used(placement: &BTreeMap<String, String>) -> usize {
    placement.values().collect::<BTreeSet<_>>().len()
}

fn the_other(node: &str) -> &'static str {
    if node == NODE_A.name { NODE_B.name } else { NODE_A.name }
}

/// Waits until `selector` matches exactly `count` live pods, all ready and, for the sample's
/// proxy, all serving the proxy ConfigMap's current `nginx.conf`: their placement.
pub async fn settled(world: &World, namespace: &str, selector: &str, count: usize) -> BTreeMap<String, String> {
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), namespace);
    let proxy = selector == proxy_pods();
    eventually(&format!("{count} ready pods of {selector}"), Duration::from_secs(120), || async {
        let hash =
            if proxy { Some(balancer::proxy::nginx::config_hash(&proxy_conf(world, SAMPLE).await?)) } else { None };
        let live: Vec<Pod> = pods
            .list(&ListParams::default().labels(selector))
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        if live.len() != count || !live.iter().all(is_available) {
            return None;
        }
        for pod in live.iter().filter(|_| hash.is_some()) {
            let served = serves(pod).await;
            (served.as_deref() == hash.as_deref().map(balancer::proxy::reload::short_id)).then_some(())?;
        }
        Some(live.into_iter().map(name_and_node).collect())
    })
    .await
}

/// The id of the `nginx.conf` a proxy pod serves, from its metrics sidecar.
async fn serves(pod: &Pod) -> Option<String> {
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?;
    crate::sidecar::served_config(&format!("{ip}:{}", SIDECAR_METRICS_PORT)).await
}

/// The sample's sidecar serves its metrics here (its ports stay clear of the Balancer's).
const SIDECAR_METRICS_PORT: u16 = 9113;

/// A watch on the sample's proxy pods, counting those available (ready, not terminating)
/// after every event, from its first complete list until finished.
struct Availability {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<usize>>,
}

impl Availability {
    fn watch(world: &World) -> Availability {
        let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let config = watcher::Config::default().labels(&proxy_pods());
            let mut events = std::pin::pin!(watcher(pods, config).default_backoff());
            let (mut available, mut listed, mut counts) = (BTreeMap::new(), false, Vec::new());
            loop {
                let event = tokio::select! {
                    _ = &mut stopped => return counts,
                    event = events.next() => event,
                };
                match event {
                    Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => {
                        available.insert(pod.name_any(), is_available(&pod));
                    }
                    Some(Ok(watcher::Event::Delete(pod))) => {
                        available.remove(&pod.name_any());
                    }
                    Some(Ok(watcher::Event::Init)) => {
                        // A re-list: counted again once it is complete.
                        available.clear();
                        listed = false;
                    }
                    Some(Ok(watcher::Event::InitDone)) => listed = true,
                    Some(Err(_)) => continue,
                    None => return counts,
                }
                if listed {
                    counts.push(available.values().filter(|a| **a).count());
                }
            }
        });
        Availability { stop, task }
    }

    /// Every count the watch saw.
    async fn finish(self) -> Vec<usize> {
        let _ = self.stop.send(());
        self.task.await.expect("the availability watch")
    }
}

fn is_available(pod: &Pod) -> bool {
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    ready && pod.metadata.deletion_timestamp.is_none()
}

/// Two echo replicas per backend and a budget each, as a user's backends would have to
/// survive a drain (one replica, evicted, leaves its backend without endpoints until the
/// replacement is ready).
pub async fn drain_ready_backends(world: &World) {
    for version in ["v1", "v2"] {
        world.kubectl.ok(&["-n", NS, "scale", &format!("deployment/echo-{version}"), "--replicas=2"]);
        let budget = json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": format!("echo-{version}"), "namespace": NS},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "test", "version": version}}},
        });
        world.kubectl.apply(&budget.to_string());
    }
    for version in ["v1", "v2"] {
        wait_available(world, NS, &format!("echo-{version}"), 2).await;
    }
}

/// The operator's two replicas (by then from the Helm chart) and a Balancer's two proxy pods land on both
/// nodes: their `topologySpreadConstraints` (max skew 1 by hostname, `ScheduleAnyway`). Node
/// lifecycle runs from here on (see [`NODE_MONITOR_GRACE`]).
pub async fn proxies_and_operator_replicas_spread_across_the_nodes(world: &mut World) {
    world.ensure_sample(Sample::ANY).await;
    world.ensure_node_lifecycle();
    let operators = settled(world, OPERATOR_NS, OPERATOR_PODS, 2).await;
    world.kubectl.ok(&["-n", NS, "scale", &format!("balancer/{SAMPLE}"), "--replicas=2"]);
    let proxies = settled(world, NS, &proxy_pods(), 2).await;
    println!("node: operator pods on {operators:?}; the sample's 2 proxy pods on {proxies:?}");
    assert_eq!(nodes_used(&operators), 2, "the operator's replicas on both nodes: {operators:?}");
    assert_eq!(nodes_used(&proxies), 2, "the proxy pods on both nodes: {proxies:?}");
}

/// `kubectl drain` of the node holding the leader and, to meet the proxy's budget, both proxy
/// pods (the other node cordoned while they roll onto it, then uncordoned once the budget has
/// refused an eviction). Clients send all along, a Balancer is applied through the webhooks
/// every 200 ms, and a change is made during the drain.
pub async fn a_drain_respects_the_budgets_and_fails_no_request(world: &mut World) {
    world.ensure_sample(Sample::ANY.backends(&["v1", "v2"]).replicas(2)).await;
    world.ensure_node_lifecycle();
    let leader = eventually("a leader", Duration::from_secs(30), || lease_holder(world)).await;
    let operators = placement(world, OPERATOR_NS, OPERATOR_PODS).await;
    let target = operators.get(&leader).expect("the leader pod's node").clone();
    let other = the_other(&target);
    drain_ready_backends(world).await;

    let load = Load::start(format!("{}:80", front_ip(world, SAMPLE).await), 4);
    let applies = Applies::start(world, "drain-probe");
    let availability = Availability::watch(world);
    world.kubectl.ok(&["cordon", other]);
    restart_proxies(world);
    let before = settled(world, NS, &proxy_pods(), 2).await;
    assert!(before.values().all(|node| *node == target), "both proxy pods on {target}: {before:?}");

    let log = tempfile::NamedTempFile::new().expect("a log file");
    // One open file for both streams, so that neither writes over the other.
    let output = log.reopen().expect("log");
    let mut drain = Command::new("kubectl");
    drain
        .arg(format!("--kubeconfig={}", world.plane.kubeconfig("admin").display()))
        .args(["drain", &target, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=300s"])
        .stdout(output.try_clone().expect("log"))
        .stderr(output);
    let started = Instant::now();
    let drain = tokio::task::spawn_blocking(move || drain.status());
    // Twice (kubectl retries every 5 s): the budget holds, not just once.
    let refused = eventually("the proxy's budget refusing an eviction twice", Duration::from_secs(90), || async {
        let text = std::fs::read_to_string(log.path()).ok()?;
        let refusals: Vec<&str> =
            text.lines().filter(|l| l.contains(PROXY) && l.contains("disruption budget")).collect();
        (refusals.len() >= 2).then(|| refusals[0].to_string())
    })
    .await;
    let blocked = started.elapsed();
    println!("node: {:.1} s into the drain of {target}: {refused}", blocked.as_secs_f64());
    set_weights(world, 60, 40).await;
    world.kubectl.ok(&["uncordon", other]);
    let uncordoned = started.elapsed();
    let status = drain.await.expect("the drain task").expect("kubectl runs");
    let drained = started.elapsed();
    let output = std::fs::read_to_string(log.path()).unwrap_or_default();
    assert!(status.success(), "kubectl drain {target} failed:\n{output}");

    configured_weights(world, 60, 40, Duration::from_secs(60)).await;
    let proxies = settled(world, NS, &proxy_pods(), 2).await;
    let operators = settled(world, OPERATOR_NS, OPERATOR_PODS, 2).await;
    weights_on_the_wire(world, 60, 40).await;
    let counts = availability.finish().await;
    let (sent, failures) = load.finish().await;
    let (writes, apply_failures) = applies.finish(world);
    println!(
        "node: drained {target} in {:.1} s (the proxy's budget had refused an eviction twice by {:.1} s; {other} uncordoned at {:.1} s); \
         proxy pods available, as the watch saw them: {counts:?}; now proxy pods on {proxies:?}, operator pods on \
         {operators:?}; {sent} requests, {} failed; {writes} applies, {} failed",
        drained.as_secs_f64(),
        blocked.as_secs_f64(),
        uncordoned.as_secs_f64(),
        failures.len(),
        apply_failures.len()
    );
    assert!(!counts.is_empty(), "the watch on the proxy pods saw nothing");
    assert!(counts.iter().all(|n| *n >= 1), "fewer than replicas − 1 = 1 proxy pods available: {counts:?}");
    assert!(proxies.values().chain(operators.values()).all(|n| n == other), "evicted pods back on {other}");
    assert_no_failures("during the drain", sent, &failures);
    assert!(apply_failures.is_empty(), "applies failed during the drain: {apply_failures:?}");
}

/// Rolls the sample's proxy pods and waits for the rollout, as `kubectl rollout restart` and
/// `rollout status` do: a configuration change
/// reaches the running pods without one. The controller leaves the template annotation alone
/// (it is not one of the fields it applies).
fn restart_proxies(world: &World) {
    let deployment = format!("deployment/{SAMPLE}-proxy");
    world.kubectl.ok(&["-n", NS, "rollout", "restart", &deployment]);
    world.kubectl.ok(&["-n", NS, "rollout", "status", &deployment, "--timeout=120s"]);
}

/// The drained node, uncordoned, takes pods again: the next proxy rollout may use it. Reports
/// where the scheduler put them (a spread preference, not a rule) rather than asserting it.
pub async fn an_uncordoned_node_is_used_by_the_next_rollout(world: &mut World) {
    world.ensure_sample(Sample::ANY.backends(&["v1", "v2"]).replicas(2)).await;
    world.ensure_node_lifecycle();
    world.ensure_a_cordoned_node().await;
    let cordoned = cordoned_nodes(world).await;
    assert_eq!(cordoned.len(), 1, "the drained node is still cordoned: {cordoned:?}");
    world.kubectl.ok(&["uncordon", &cordoned[0]]);
    restart_proxies(world);
    let proxies = settled(world, NS, &proxy_pods(), 2).await;
    println!("node: {} uncordoned; the next rollout placed the proxy pods on {proxies:?}", cordoned[0]);
}

/// The Balancer the lost-node scenario changes: no pods, one backend of `weight`, applied
/// (retrying while the webhooks cannot answer).
async fn change_weight(world: &World, weight: u32) {
    let yaml = probe_balancer(LOSS_BALANCER, weight, 0);
    eventually(&format!("{LOSS_BALANCER} applied"), Duration::from_secs(30), || async {
        world.kubectl.run(&["apply", "-f", "-"], Some(&yaml)).0.then_some(())
    })
    .await;
}

/// Waits (up to 90 s) until the controller has reconciled [`change_weight`]'s Balancer, the
/// last change being to `weight` (its backend has no pod: the weight is in its spec, and its
/// nginx.conf has the backend's Service, down).
async fn weight_configured(world: &World, weight: u32) {
    let balancer = reconciled(world, LOSS_BALANCER, Duration::from_secs(90)).await;
    let written = balancer.spec.backends.first().map(|a| a.effective_weight());
    assert_eq!(written, Some(weight as i32), "{LOSS_BALANCER}'s last change");
}

/// The Balancer of [`a_lost_node_costs_a_bounded_failure`] whose proxy runs on node A only.
const PINNED: &str = "pinned";

/// Its connect timeout: what a connection that meets a lost pod waits before nginx tries another.
const PINNED_CONNECT_TIMEOUT: &str = "1s";

/// [`PINNED`]: v1 and v2 of the echo backends, one proxy pod held on node A.
fn pinned_balancer() -> String {
    format!(
        "apiVersion: exposer.hliangzhao.io/v1beta1\nkind: Balancer\nmetadata:\n  name: {PINNED}\n  namespace: {NS}\n\
         spec:\n  replicas: 1\n  ports: [{{name: http, port: 80, targetPort: 5678, connectTimeout: {PINNED_CONNECT_TIMEOUT}}}]\n\
         \x20 selector: {{app: test}}\n\
         \x20 backends: [{{name: v1, weight: 50, selector: {{version: v1}}}}, {{name: v2, weight: 50, selector: {{version: v2}}}}]\n\
         \x20 proxy: {{nodeSelector: {{kubernetes.io/hostname: {}}}}}\n",
        NODE_A.name
    )
}

/// How long after `since` node B's `Ready` condition stopped being `True` (node lifecycle
/// marks it `Unknown` once its grace period has passed without a heartbeat).
async fn not_ready_after(client: kube::Client, since: Instant) -> Duration {
    let nodes: Api<NodeObject> = Api::all(client);
    loop {
        if let Ok(node) = nodes.get(NODE_B.name).await
            && !super::node::is_ready(&node)
        {
            return since.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How long after `lost` the sample's proxy had two ready pods on its current configuration
/// again, or why not within 60 s. A report, not an assertion: the replacement waits for the
/// taint manager (the pods tolerate an unreachable node for 10 s), whose evictions node
/// lifecycle's zone states can hold back.
async fn two_proxy_pods_again(world: &World, lost: Instant) -> String {
    let selector = proxy_pods();
    let settled = tokio::time::timeout(Duration::from_secs(60), settled(world, NS, &selector, 2));
    match std::panic::AssertUnwindSafe(settled).catch_unwind().await {
        Ok(Ok(_)) => format!("after {:.1} s", lost.elapsed().as_secs_f64()),
        _ => {
            let nodes: Api<NodeObject> = Api::all(world.admin.clone());
            let taints = nodes.get(NODE_B.name).await.ok().and_then(|n| n.spec?.taints);
            format!("not within {:.0} s (node B's taints: {taints:?})", lost.elapsed().as_secs_f64())
        }
    }
}

/// Moves the Lease to the operator replica on node B: while the leader is on node A, deletes
/// its pod, whose replacement on node A races the replica on node B for the Lease (up to 4
/// times).
async fn leader_onto_node_b(world: &World) {
    for _ in 0..4 {
        let leader = eventually("a leader", Duration::from_secs(30), || lease_holder(world)).await;
        if placement(world, OPERATOR_NS, OPERATOR_PODS).await.get(&leader).map(String::as_str) == Some(NODE_B.name) {
            return;
        }
        world.kubectl.ok(&["-n", OPERATOR_NS, "delete", "pod", &leader]);
        eventually("another leader", Duration::from_secs(40), || async {
            lease_holder(world).await.filter(|holder| *holder != leader)
        })
        .await;
        settled(world, OPERATOR_NS, OPERATOR_PODS, 2).await;
        spread_one_each(world, OPERATOR_NS, OPERATOR_PODS, lease_holder(world).await.as_deref()).await;
    }
    panic!("the Lease stayed on node A through 4 leader deletions");
}

/// When both of `selector`'s pods share a node, deletes one (not `keep`), so that the spread
/// puts its replacement on the other node, and waits for it.
async fn spread_one_each(world: &World, namespace: &str, selector: &str, keep: Option<&str>) {
    // The spread is a preference: a replacement may land beside its sibling again.
    for _ in 0..3 {
        let pods = settled(world, namespace, selector, 2).await;
        if nodes_used(&pods) == 2 {
            return;
        }
        let pod = pods.keys().find(|p| Some(p.as_str()) != keep).expect("a pod to move");
        world.kubectl.ok(&["-n", namespace, "delete", "pod", pod]);
    }
    let pods = settled(world, namespace, selector, 2).await;
    assert_eq!(nodes_used(&pods), 2, "{selector}'s pods still on one node after 3 replacements: {pods:?}");
}

/// Node B lost as after a crash (its kubelet, containerd, shims and containers killed, its
/// pod bridge down) while it holds the leader and one proxy pod. Measures what that costs
/// until node lifecycle marks its pods not ready: failed requests, the time until requests stop
/// failing, until the Lease moves, until a change is reconciled, and until the proxy has two
/// pods again (the proxy pods tolerate an unreachable node for 10 s, `spec.proxy.tolerations`).
pub async fn a_lost_node_costs_a_bounded_failure(world: &mut World) {
    world.ensure_sample(Sample::ANY.replicas(2)).await;
    world.ensure_node_lifecycle();
    world.ensure_two_pods_per_backend().await;
    let tolerations = json!({"spec": {"proxy": {"tolerations": [
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10},
    ]}}});
    let patch = tolerations.to_string();
    world.kubectl.ok(&["-n", NS, "patch", "balancer", SAMPLE, "--type=merge", "-p", &patch]);
    let deployments: Api<Deployment> = Api::namespaced(world.admin.clone(), NS);
    eventually("the proxy's pods tolerating 10 s", Duration::from_secs(60), || async {
        let template = deployments.get(PROXY).await.ok()?.spec?.template.spec?;
        let tolerates = template.tolerations?.iter().any(|t| t.toleration_seconds == Some(10));
        tolerates.then_some(())
    })
    .await;
    eventually("the rollout with the tolerations", Duration::from_secs(120), || async {
        let deployment = deployments.get(PROXY).await.ok()?;
        let status = deployment.status?;
        let done = status.observed_generation == deployment.metadata.generation
            && status.updated_replicas == Some(2)
            && status.replicas == Some(2)
            && status.ready_replicas == Some(2);
        done.then_some(())
    })
    .await;
    spread_one_each(world, NS, &proxy_pods(), None).await;
    // One operator replica per node, and the Lease on node B.
    let leader = eventually("a leader", Duration::from_secs(30), || lease_holder(world)).await;
    spread_one_each(world, OPERATOR_NS, OPERATOR_PODS, Some(&leader)).await;
    leader_onto_node_b(world).await;
    // And each backend on both nodes (the drain moved them all to one).
    for version in ["v1", "v2"] {
        spread_one_each(world, NS, &format!("app=test,version={version}"), None).await;
    }
    let leader = eventually("a leader", Duration::from_secs(30), || lease_holder(world)).await;
    let (proxies, operators) =
        (placement(world, NS, &proxy_pods()).await, placement(world, OPERATOR_NS, OPERATOR_PODS).await);
    let backends = placement(world, NS, "app=test").await;
    println!(
        "node: before the loss, the leader is {leader}; proxy pods on {proxies:?}, operator pods on {operators:?}, \
         backend pods on {backends:?}"
    );
    assert_eq!(nodes_used(&proxies), 2, "one proxy pod per node: {proxies:?}");
    assert_eq!(operators.get(&leader).map(String::as_str), Some(NODE_B.name), "the leader on node B");

    // A Balancer whose proxy is on node A only, over the same backends: losing node B loses
    // some of its backends' pods but none of its proxy pods.
    world.kubectl.apply(&pinned_balancer());
    wait_ready_balancer(world, PINNED, Duration::from_secs(120)).await;
    let pinned_front = format!("{}:80", front_ip(world, PINNED).await);
    let pinned_placement = placement(world, NS, &balancer::proxy::proxy_selector_string(PINNED)).await;
    assert!(pinned_placement.values().all(|n| n == NODE_A.name), "{PINNED}'s proxy on node A: {pinned_placement:?}");

    // The change made after the loss goes to another Balancer: one of the sample's would roll
    // its proxy, and which pod the rollout replaces first (the live one, or the lost one the
    // Deployment still counts as available) would decide the failures measured.
    change_weight(world, 10).await;
    weight_configured(world, 10).await;
    let load = Load::start(format!("{}:80", front_ip(world, SAMPLE).await), 4);
    let pinned_in_flight = Load::start(pinned_front.clone(), 4);
    let applies = Applies::start(world, "loss-probe");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lost = Instant::now();
    world.nodes[1].crash();
    // Every connection of this load opens after the loss; the other's were open at it.
    let pinned = Load::start(pinned_front, 4);
    let in_flight = pinned_in_flight.stop().await;
    let not_ready = tokio::spawn(not_ready_after(world.admin.clone(), lost));
    change_weight(world, 20).await;
    let accepted = lost.elapsed();
    eventually("another leader", Duration::from_secs(60), || async {
        lease_holder(world).await.filter(|holder| *holder != leader)
    })
    .await;
    let lease_moved = lost.elapsed();
    weight_configured(world, 20).await;
    let reconciled = lost.elapsed();
    // Node lifecycle first: a lull in the failures before it has marked the node ends nothing.
    let marked = tokio::time::timeout(NODE_MONITOR_GRACE + Duration::from_secs(30), not_ready)
        .await
        .expect("node B marked not ready")
        .expect("the node watch");
    let quiet = Duration::from_secs(5);
    eventually("no failed request for 5 s", Duration::from_secs(45), || async {
        load.last_failure().is_none_or(|at| at.elapsed() >= quiet).then_some(())
    })
    .await;
    let whole = load.last_failure().map_or(Duration::ZERO, |at| at.saturating_duration_since(lost));
    // The pinned Balancer's proxies learn that node B's pods are gone from their endpoints; until
    // then nginx retries another pod, at most its connect timeout later.
    eventually(&format!("{PINNED} without node B's pods"), Duration::from_secs(60), || async {
        let conf = proxy_conf(world, PINNED).await?;
        (!conf.contains(&format!("server {}", NODE_B.pod_cidr.trim_end_matches("0/24")))).then_some(())
    })
    .await;
    let pods_out = lost.elapsed();
    let replaced = two_proxy_pods_again(world, lost).await;
    // A connection refused or unreachable at connect never reached the proxy: that is the front
    // Service's hop (kube-proxy rewrites its rules as node B's endpoints go), reported apart.
    let (pinned_sent, pinned_failures) = pinned.finish().await;
    let (front_hop, proxied): (Vec<&String>, Vec<&String>) =
        pinned_failures.iter().partition(|f| f.contains("os error 111") || f.contains("os error 113"));
    println!(
        "node: node B lost, {PINNED} (proxy on node A, backends on both): of {pinned_sent} connections opened after \
         the loss, {} failed through the proxy and {} at the front Service's hop ({:?}) (connect timeout \
         {PINNED_CONNECT_TIMEOUT}); {} of {} in flight at the loss failed ({:?}); node B's pods left its \
         configuration after {:.1} s",
        proxied.len(),
        front_hop.len(),
        front_hop.first(),
        in_flight.failures.len(),
        in_flight.sent,
        in_flight.failures.iter().take(3).collect::<Vec<_>>(),
        pods_out.as_secs_f64()
    );
    assert!(proxied.is_empty(), "connections through the proxy failed after the loss: {proxied:?}");
    let (sent, failures) = load.finish().await;
    let (writes, apply_failures) = applies.finish(world);
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for failure in &failures {
        *kinds.entry(failure.as_str()).or_default() += 1;
    }
    println!(
        "node: node B lost: {} of {sent} requests failed, the last {:.1} s after the loss ({kinds:?}); node \
         lifecycle marked it not ready after {:.1} s; the Lease moved after {:.1} s; a change (to another Balancer) was accepted after \
         {:.1} s and reconciled after {:.1} s; two proxy pods ready again: {replaced}; {} of {writes} applies failed",
        failures.len(),
        whole.as_secs_f64(),
        marked.as_secs_f64(),
        lease_moved.as_secs_f64(),
        accepted.as_secs_f64(),
        reconciled.as_secs_f64(),
        apply_failures.len()
    );
    let bound = NODE_MONITOR_GRACE + Duration::from_secs(15);
    assert!(whole <= bound, "requests failed for {whole:?}, past node lifecycle's grace and kube-proxy's update");
    assert!(lease_moved <= Duration::from_secs(25), "the Lease lasts 15 s; it moved after {lease_moved:?}");

    // What an administrator does for a node that will not come back: its pods deleted at once
    // (no kubelet will confirm their end) and the node removed.
    world.kubectl.ok(&["-n", NS, "delete", "balancer", LOSS_BALANCER, PINNED]);
    let on_b = format!("spec.nodeName={}", NODE_B.name);
    world.kubectl.ok(&["delete", "pods", "-A", "--field-selector", &on_b, "--force", "--grace-period=0"]);
    world.kubectl.ok(&["delete", "node", NODE_B.name]);
    settled(world, OPERATOR_NS, OPERATOR_PODS, 2).await;
}

//! One tenant's objects cannot slow another's reconciles: a Balancer whose proxy pods never
//! answer the controller's questions costs the sample nothing measurable (see docs/security.md).

use std::process::Command;
use std::time::{Duration, Instant};

use kube::Api;
use serde_json::json;

use crate::fixtures::{Sample, balancers, change_backends, pod_ips, proxy_conf, wait_available};
use crate::toolkit::runner::eventually;
use crate::weights::changed_after;
use crate::{NS, SAMPLE, World, nodes};

/// The silent tenant's namespace, and its Balancers' names (`silent-<i>`).
const SILENT_NS: &str = "silent-tenant";
const SILENT: &str = "silent";
/// Its Balancers' proxy replicas: one Balancer with many, and as many Balancers in all as the
/// controller has reconcile workers (its default `--max-concurrent-reconciles`): a controller
/// that waited on sidecars inside its reconciles would then have none left for the sample.
/// Sixteen pods in all, eight a node, at a request lowered so that both nodes hold them.
const SILENT_REPLICAS: [i32; 8] = [9, 1, 1, 1, 1, 1, 1, 1];
/// The host chain that drops every packet to its sidecars (the suite's bridge CNI enforces no
/// NetworkPolicy): the controller's questions go unanswered until they time out. `host.sh down`
/// removes it too, after a run that was killed.
const SILENT_CHAIN: &str = "BALANCER-NODE-SILENT";
/// Changes to the sample measured alone, then beside the silent tenant. Even: the changes
/// alternate between two splits, and each phase must end on the split the next starts from.
const CHANGES: usize = 4;
/// How often a change's progress is read: the resolution of each time.
const POLL: Duration = Duration::from_millis(20);

/// Balancers with 16 proxy pods in all whose metrics port silently drops packets (one with 9,
/// seven with 1) run in another namespace beside the sample: the sample's reconciles (a change to its status'
/// `observedGeneration`) and its changes on the wire (every proxy pod's nginx serving them) stay
/// within 1.5× of their times without it.
pub async fn a_tenant_whose_sidecars_never_answer_does_not_slow_another_tenant(world: &mut World) {
    world.ensure_sample(Sample::AS_SHIPPED).await;
    let alone = measure_changes(world).await;
    let silent = SilentTenant::start(world).await;
    let beside = measure_changes(world).await;
    let dropped = silent.dropped_packets();
    let silent_programmed = silent_programmed(world).await;
    silent.stop(world);
    println!("node: the silent tenant's sidecars dropped {dropped} packets; its Programmed: {silent_programmed}");
    for (what, alone, beside) in [
        ("reconciled (status.observedGeneration)", &alone.reconciled, &beside.reconciled),
        ("on the wire (every proxy's nginx serves it)", &alone.on_wire, &beside.on_wire),
    ] {
        println!(
            "node: the sample's changes {what}, s from the write, median alone {:.3} / beside the silent tenant {:.3}; all {alone:.3?} / {beside:.3?}",
            median(alone),
            median(beside)
        );
    }
    assert!(dropped > 0, "the host rule dropped nothing: the controller never asked the silent sidecars");
    assert!(
        silent_programmed.contains("0 of"),
        "the silent tenant's pods were counted as serving: {silent_programmed}"
    );
    for (what, alone, beside) in
        [("reconciled", &alone.reconciled, &beside.reconciled), ("on the wire", &alone.on_wire, &beside.on_wire)]
    {
        let bound = 1.5 * median(alone) + POLL.as_secs_f64();
        assert!(
            median(beside) <= bound,
            "{what}: median {:.3} s beside the silent tenant, over 1.5× its {:.3} s alone",
            median(beside),
            median(alone)
        );
    }
}

/// The times of the sample's changes, from each write, in seconds.
struct Times {
    reconciled: Vec<f64>,
    on_wire: Vec<f64>,
}

/// Makes [`CHANGES`] weight changes to the sample, one after the other, and times each.
async fn measure_changes(world: &World) -> Times {
    let balancers = balancers(world);
    let mut times = Times { reconciled: Vec::new(), on_wire: Vec::new() };
    for change in 0..CHANGES {
        let weights = match change % 2 {
            0 => [("v1", 30), ("v2", 20), ("v3", 50)],
            _ => [("v1", 40), ("v2", 20), ("v3", 40)],
        };
        let proxies = pod_ips(world, NS, &nodes::proxy_pods()).await;
        let mut served_before = Vec::new();
        for ip in &proxies {
            served_before.push(crate::sidecar::served_config(&format!("{ip}:9113")).await);
        }
        let before_conf = proxy_conf(world, SAMPLE).await;
        let written = Instant::now();
        change_backends(world, SAMPLE, &weights, &[]).await;
        let generation = balancers.get(SAMPLE).await.expect("the sample").metadata.generation;
        let reconciled = async {
            loop {
                let observed = balancers.get_status(SAMPLE).await.ok().and_then(|b| b.status?.observed_generation);
                if observed.is_some() && observed >= generation {
                    return written.elapsed().as_secs_f64();
                }
                tokio::time::sleep(POLL).await;
            }
        };
        let served = futures::future::join_all(proxies.iter().zip(served_before).map(|(ip, before)| {
            let sidecar = format!("{ip}:9113");
            async move { changed_after(written, before, || crate::sidecar::served_config(&sidecar)).await }
        }));
        let (reconciled, served, _) = tokio::time::timeout(Duration::from_secs(60), async {
            tokio::join!(reconciled, served, changed_after(written, before_conf, || proxy_conf(world, SAMPLE)))
        })
        .await
        .expect("the change reconciled and served within 60 s");
        times.reconciled.push(reconciled);
        times.on_wire.push(served.into_iter().fold(0.0, f64::max));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    times
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// The silent tenant: its namespace and Balancer, and the host chain that drops its sidecars'
/// packets; taken down by [`SilentTenant::stop`], or when dropped.
struct SilentTenant {
    chain: bool,
}

impl SilentTenant {
    /// Creates the namespace and the Balancers, waits for their pods, then drops every packet to
    /// their metrics port.
    async fn start(world: &World) -> SilentTenant {
        world.kubectl.ok(&["create", "namespace", SILENT_NS]);
        let started = Instant::now();
        for (i, replicas) in SILENT_REPLICAS.iter().enumerate() {
            world.kubectl.ok_with(&["apply", "-f", "-"], &silent_balancer(i, *replicas, 1).to_string());
        }
        let mut ips = Vec::new();
        for (i, replicas) in SILENT_REPLICAS.iter().enumerate() {
            wait_available(world, SILENT_NS, &format!("{SILENT}-{i}-proxy"), *replicas).await;
            let pods =
                pod_ips(world, SILENT_NS, &balancer::proxy::proxy_selector_string(&format!("{SILENT}-{i}"))).await;
            assert_eq!(pods.len(), usize::try_from(*replicas).unwrap_or(0), "every silent proxy pod has an address");
            ips.extend(pods);
        }
        println!(
            "node: the silent tenant's {} proxy pods ({} Balancers) available in {:.1} s",
            ips.len(),
            SILENT_REPLICAS.len(),
            started.elapsed().as_secs_f64()
        );
        let mut tenant = SilentTenant { chain: false };
        iptables(&["-t", "mangle", "-N", SILENT_CHAIN]);
        tenant.chain = true;
        for ip in &ips {
            iptables(&["-t", "mangle", "-A", SILENT_CHAIN, "-d", ip, "-p", "tcp", "--dport", "9113", "-j", "DROP"]);
        }
        iptables(&["-t", "mangle", "-I", "FORWARD", "1", "-j", SILENT_CHAIN]);
        // A change each silent Balancer's pods must be asked about: a controller that waited on
        // them would wait now.
        for (i, replicas) in SILENT_REPLICAS.iter().enumerate() {
            world.kubectl.ok_with(&["apply", "-f", "-"], &silent_balancer(i, *replicas, 2).to_string());
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        tenant
    }

    /// Packets the host chain dropped.
    fn dropped_packets(&self) -> u64 {
        let out = Command::new("iptables")
            .args(["-t", "mangle", "-L", SILENT_CHAIN, "-n", "-v", "-x"])
            .output()
            .expect("iptables runs");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|line| line.contains("DROP"))
            .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    /// Deletes the namespace (not waiting) and the host chain.
    fn stop(mut self, world: &World) {
        world.kubectl.ok(&["delete", "namespace", SILENT_NS, "--wait=false"]);
        self.remove_chain();
    }

    fn remove_chain(&mut self) {
        if std::mem::take(&mut self.chain) {
            let _ = Command::new("iptables").args(["-t", "mangle", "-D", "FORWARD", "-j", SILENT_CHAIN]).status();
            let _ = Command::new("iptables").args(["-t", "mangle", "-F", SILENT_CHAIN]).status();
            let _ = Command::new("iptables").args(["-t", "mangle", "-X", SILENT_CHAIN]).status();
        }
    }
}

impl Drop for SilentTenant {
    fn drop(&mut self) {
        self.remove_chain();
    }
}

/// The silent tenant's Balancer `silent-<i>`: `replicas` proxy pods at a lowered request, and a
/// backend that selects no pod, of `weight`.
fn silent_balancer(i: usize, replicas: i32, weight: i32) -> serde_json::Value {
    json!({
        "apiVersion": format!("{}/{}", balancer::api::GROUP, balancer::api::STORAGE_VERSION),
        "kind": "Balancer",
        "metadata": {"name": format!("{SILENT}-{i}"), "namespace": SILENT_NS},
        "spec": {
            "replicas": replicas,
            "ports": [{"name": "tcp", "protocol": "TCP", "port": 80}],
            "backends": [{"name": "none", "weight": weight, "selector": {"app": "none"}}],
            "proxy": {"resources": {"requests": {"cpu": "5m", "memory": "8Mi"}, "limits": {"memory": "128Mi"}}},
        }
    })
}

fn iptables(args: &[&str]) {
    let status = Command::new("iptables").args(args).status().expect("iptables runs");
    assert!(status.success(), "iptables {args:?} failed");
}

/// The `Programmed` condition of the silent tenant's largest Balancer, as `status: message`.
async fn silent_programmed(world: &World) -> String {
    let silent: Api<balancer::api::Balancer> = Api::namespaced(world.admin.clone(), SILENT_NS);
    eventually("the silent tenant's Programmed condition", Duration::from_secs(30), || {
        let silent = silent.clone();
        async move {
            let status = silent.get(&format!("{SILENT}-0")).await.ok()?.status?;
            let programmed = status.conditions.iter().find(|c| c.type_ == "Programmed")?;
            Some(format!("{}: {}", programmed.status, programmed.message))
        }
    })
    .await
}

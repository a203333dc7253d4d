//! The node suite: a real two-node cluster on this machine, and the operator installed on it
//! from `deploy/` as a user would.
//!
//! The toolkit's control plane (`tests/toolkit/cluster.rs`), bound to the pod bridge, plus
//! containerd, the kubelet, kube-proxy and kube-scheduler, all built from the Go module proxy
//! (`tests/kubernetes/build.sh --node`), with images built locally and no registry
//! (`tests/node/images.sh`). `tests/node/host.sh` fences the pod network in: nothing leaves the
//! machine, DNS queries included.
//!
//! Every scenario sets up what it needs through the idempotent `ensure_*` steps of
//! `fixtures.rs`, which cost next to nothing when the scenario before left the cluster as
//! needed: `cargo test --test node -- NAME` runs the scenarios named alone.
//!
//! Needs root. Runs when BALANCER_NODE_E2E=1 (as in CI), which makes it
//! mandatory; otherwise it prints one SKIPPED line.

#[path = "../toolkit/mod.rs"]
mod toolkit;

mod bench;
mod canary;
mod certificates;
mod faults;
mod fixtures;
mod gateway;
mod ingress_nginx;
mod install;
mod isolation;
mod node;
mod nodes;
mod prometheus;
mod protocols;
mod sidecar;
mod starvation;
mod takeover;
mod tenancy;
mod weights;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use bench::{the_data_plane_keeps_up_with_haproxy, the_metrics_sidecar_costs_little};
use canary::{
    a_canary_is_promoted_aborted_and_retried_by_a_person_and_a_reapply_undoes_nothing,
    a_canary_keeps_its_step_through_the_operators_kill_and_an_api_server_outage,
    a_canary_that_accepts_and_answers_nothing_is_rolled_back, a_good_canary_is_promoted_step_by_step,
    a_quiet_canary_holds_then_proceeds_with_traffic, a_refusing_canary_is_rolled_back,
    a_udp_canary_is_judged_on_the_signals_udp_has, the_canary_walkthrough_runs_as_written,
};
use certificates::{
    a_replaced_certificate_is_served_without_a_restart, cert_manager_issues_the_webhook_certificate_and_injects_its_ca,
};
use faults::{
    a_change_after_an_api_server_restart_reaches_the_wire_without_a_failed_request,
    the_leader_killed_in_the_middle_of_a_change_is_finished_by_a_new_leader,
    the_other_replica_takes_over_when_the_leader_pod_is_deleted,
};
use gateway::{
    a_gateway_and_a_balancer_in_one_namespace_coexist, a_gateway_that_leaves_balancer_leaves_nothing_behind,
    a_tcproute_flips_live_like_a_balancer, a_tlsroute_sends_each_server_name_to_its_own_backend,
    gateway_api_conformance_for_tcp_udp_and_tls,
};
use ingress_nginx::{
    ingress_nginx_tcp_and_udp_services_become_a_gateway, ingress_nginx_tcp_and_udp_services_become_balancers,
};
use install::the_operator_installs_from_deploy_as_a_user_would;
use isolation::a_tenant_whose_sidecars_never_answer_does_not_slow_another_tenant;
use node::{ClusterServices, Host, KUBERNETES_SERVICE_IP, NODE_A, NODE_B, NODE_IP, Node, SERVICE_CIDR, host_traces};
use nodes::{
    a_drain_respects_the_budgets_and_fails_no_request, a_lost_node_costs_a_bounded_failure,
    an_uncordoned_node_is_used_by_the_next_rollout, proxies_and_operator_replicas_spread_across_the_nodes,
};
use prometheus::a_real_prometheus_scrapes_the_monitors_and_fires_the_shipped_alerts;
use protocols::{
    a_backend_behind_the_proxy_sees_the_client_pods_address,
    a_node_port_balancer_with_client_ip_affinity_keeps_each_client_on_one_backend, udp_is_proxied_to_udp_echo_pods,
    with_every_primary_scaled_to_0_the_backup_serves_without_a_failed_request,
};
use sidecar::{
    a_stalled_metrics_sidecar_costs_lines_not_the_proxy, the_metrics_sidecar_counts_the_last_session_after_nginx_exits,
};
use starvation::the_webhooks_answer_the_api_server_under_slow_clients;
use takeover::a_go_operator_balancer_is_taken_over_without_a_failed_request;
use tenancy::{a_configmap_writer_cannot_steer_the_proxy, an_earlier_signed_configuration_never_comes_back};
use toolkit::cluster::{ControlPlane, PlaneOptions, commands_first_on_path};
use toolkit::kubectl::Kubectl;
use toolkit::repo::repo;
use toolkit::runner::{self, Filter, scenarios};
use weights::{
    a_backend_rolled_under_load_fails_no_request, a_backend_without_pods_loses_its_share_without_a_failed_request,
    churn_fails_nothing_and_stays_under_the_memory_limit, deleting_the_balancer_removes_every_child_and_pod,
    scaling_the_balancer_brings_up_proxy_pods, the_walkthrough_splits_traffic_by_weight,
    weights_change_live_without_a_new_pod_or_a_cut_connection,
};

const OPERATOR_NS: &str = "balancer-system";
/// The Balancers' namespace: Pod Security `restricted` enforced, so every pod balancer makes
/// and every backend fixture here must be admitted under it.
const NS: &str = "balancers";
const SAMPLE: &str = "example-balancer";
/// The locally built images (`images.sh`).
const BASE_IMAGE: &str = "localhost/balancer-test-base:1";
/// How long node lifecycle waits for a silent node before it marks the node's pods not ready
/// (Kubernetes' default is 40 s). It starts with the two-node scenarios, after the control-plane
/// faults: once the API server is back from the restart scenario's 15 s outage, the controller
/// manager's caches can lag past so short a grace period (client-go's reflector backs off up
/// to 30 s), and node lifecycle then marks every node, and every pod, not ready.
const NODE_MONITOR_GRACE: Duration = Duration::from_secs(30);

/// What the scenarios share, in drop order: the nodes, then the control plane, then the host.
struct World {
    /// Node A, then node B.
    nodes: [Node; 2],
    _services: ClusterServices,
    plane: ControlPlane,
    admin: Client,
    /// `kubectl` as the cluster's administrator.
    kubectl: Kubectl,
    /// The Kubernetes and containerd commands (`tests/kubernetes/build.sh --node`).
    assets: PathBuf,
    /// Helm, and cert-manager's chart (`tests/kubernetes/cert-manager.sh`).
    cert_manager: PathBuf,
    /// Prometheus and promtool (`tests/kubernetes/prometheus.sh`).
    prometheus: PathBuf,
    /// Gateway API's conformance suite (`tests/kubernetes/conformance.sh`).
    conformance: PathBuf,
    /// Which of the fixtures shared by several scenarios the cluster already has.
    fixtures: fixtures::Present,
    host: Host,
}

/// Runs a build script and returns the directory it prints, or panics with its error output.
fn script_output(script: &str, args: &[&str]) -> PathBuf {
    let out = Command::new("bash").arg(repo(script)).args(args).output().expect("bash runs");
    assert!(out.status.success(), "{script} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Why the suite cannot run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !root {
        return Some("the node suite needs root".into());
    }
    let tools = ["runc", "iptables", "conntrack", "ip", "unshare", "nsenter"];
    let missing: Vec<&str> = tools
        .into_iter()
        .filter(|t| {
            Command::new("sh").args(["-c", &format!("command -v {t}")]).output().map_or(true, |o| !o.status.success())
        })
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "missing tools: {} (apt-get install runc iptables conntrack containernetworking-plugins mmdebstrap)",
            missing.join(" ")
        )
    })
}

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    if std::env::var("BALANCER_NODE_E2E").as_deref() != Ok("1") {
        println!("node: SKIPPED: set BALANCER_NODE_E2E=1 (as root) to run the real-node suite, as CI does");
        return ExitCode::SUCCESS;
    }
    if let Some(why) = missing_prerequisite() {
        println!("node: FAILED: {why}");
        return ExitCode::FAILURE;
    }
    let assets = script_output("tests/kubernetes/build.sh", &["--node"]);
    commands_first_on_path(&assets);
    // BALANCER_NODE_BINARY: another build in the operator's image, e.g. the release build for the
    // sidecar's benchmark (the test build is unoptimized).
    let binary = std::env::var("BALANCER_NODE_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_balancer").into());
    let cert_manager = script_output("tests/kubernetes/cert-manager.sh", &[]);
    let prometheus = script_output("tests/kubernetes/prometheus.sh", &[]);
    let conformance = script_output("tests/kubernetes/conformance.sh", &[]);
    let images = script_output(
        "tests/node/images.sh",
        &[
            &assets.display().to_string(),
            &binary,
            &cert_manager.display().to_string(),
            &conformance.display().to_string(),
        ],
    );
    let state = std::env::var_os("BALANCER_NODE_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/balancer-node"));

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        // Dropping the suite's future tears the node down, as the end of a run does.
        tokio::select! {
            code = run_suite(&assets, &images, [&cert_manager, &prometheus, &conformance], &state) => code,
            signal = interrupted() => {
                println!("node: {signal}: tearing the node down");
                ExitCode::FAILURE
            }
        }
    })
}

/// SIGINT or SIGTERM, by name.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    }
}

/// Brings the nodes up, runs the scenarios in order (or the ones a name filter names), and
/// tears everything down.
/// `tools`: the folders of cert-manager's build, of Prometheus's and of Gateway API's
/// conformance suite.
async fn run_suite(assets: &Path, images: &Path, tools: [&Path; 3], state: &Path) -> ExitCode {
    let [cert_manager, prometheus, conformance] = tools;
    let started = Instant::now();
    let traces_before = host_traces();
    let host = Host::up(state);
    let options = PlaneOptions {
        address: NODE_IP.into(),
        service_cidr: SERVICE_CIDR.into(),
        extra_sans: vec![KUBERNETES_SERVICE_IP.into(), "kubernetes.default.svc".into()],
        pods: true,
        evictions: true,
        parent: Some(state.to_path_buf()),
        ..PlaneOptions::default()
    };
    let plane = ControlPlane::start_with(assets, &options).await;
    let services = ClusterServices::start(&host, &plane, assets);
    let (a, b) = tokio::join!(
        Node::start(&host, &plane, assets, images, &NODE_A),
        Node::start(&host, &plane, assets, images, &NODE_B)
    );
    let admin = plane.client("admin").await;
    println!("node: two nodes Ready {:.1} s after start: {}", started.elapsed().as_secs_f64(), versions(&admin).await);
    let mut world = World {
        nodes: [a, b],
        _services: services,
        kubectl: plane.kubectl("admin"),
        plane,
        admin,
        assets: assets.to_path_buf(),
        cert_manager: cert_manager.to_path_buf(),
        prometheus: prometheus.to_path_buf(),
        conformance: conformance.to_path_buf(),
        fixtures: fixtures::Present::default(),
        host,
    };
    let all = scenarios![World:
        the_operator_installs_from_deploy_as_a_user_would,
        the_walkthrough_splits_traffic_by_weight,
        the_metrics_sidecar_counts_the_last_session_after_nginx_exits,
        a_stalled_metrics_sidecar_costs_lines_not_the_proxy,
        a_backend_without_pods_loses_its_share_without_a_failed_request,
        a_backend_rolled_under_load_fails_no_request,
        the_metrics_sidecar_costs_little,
        the_data_plane_keeps_up_with_haproxy,
        weights_change_live_without_a_new_pod_or_a_cut_connection,
        churn_fails_nothing_and_stays_under_the_memory_limit,
        a_good_canary_is_promoted_step_by_step,
        a_refusing_canary_is_rolled_back,
        a_canary_that_accepts_and_answers_nothing_is_rolled_back,
        a_quiet_canary_holds_then_proceeds_with_traffic,
        the_canary_walkthrough_runs_as_written,
        a_udp_canary_is_judged_on_the_signals_udp_has,
        a_canary_is_promoted_aborted_and_retried_by_a_person_and_a_reapply_undoes_nothing,
        a_configmap_writer_cannot_steer_the_proxy,
        an_earlier_signed_configuration_never_comes_back,
        a_tenant_whose_sidecars_never_answer_does_not_slow_another_tenant,
        the_webhooks_answer_the_api_server_under_slow_clients,
        scaling_the_balancer_brings_up_proxy_pods,
        udp_is_proxied_to_udp_echo_pods,
        ingress_nginx_tcp_and_udp_services_become_balancers,
        a_tcproute_flips_live_like_a_balancer,
        a_tlsroute_sends_each_server_name_to_its_own_backend,
        a_gateway_and_a_balancer_in_one_namespace_coexist,
        a_gateway_that_leaves_balancer_leaves_nothing_behind,
        ingress_nginx_tcp_and_udp_services_become_a_gateway,
        gateway_api_conformance_for_tcp_udp_and_tls,
        a_backend_behind_the_proxy_sees_the_client_pods_address,
        with_every_primary_scaled_to_0_the_backup_serves_without_a_failed_request,
        a_node_port_balancer_with_client_ip_affinity_keeps_each_client_on_one_backend,
        the_other_replica_takes_over_when_the_leader_pod_is_deleted,
        // Before the control-plane faults: after an API server restart, kube-proxy (v1.20)
        // has twice lagged past the takeover's 10 s drain here (a few requests failed with "No
        // route to host" to a deleted Go proxy pod).
        a_go_operator_balancer_is_taken_over_without_a_failed_request,
        a_change_after_an_api_server_restart_reaches_the_wire_without_a_failed_request,
        the_leader_killed_in_the_middle_of_a_change_is_finished_by_a_new_leader,
        a_canary_keeps_its_step_through_the_operators_kill_and_an_api_server_outage,
        a_replaced_certificate_is_served_without_a_restart,
        cert_manager_issues_the_webhook_certificate_and_injects_its_ca,
        // After cert-manager: the ServiceMonitor trusts the CA in its Secret.
        a_real_prometheus_scrapes_the_monitors_and_fires_the_shipped_alerts,
        proxies_and_operator_replicas_spread_across_the_nodes,
        a_drain_respects_the_budgets_and_fails_no_request,
        an_uncordoned_node_is_used_by_the_next_rollout,
        // Last but one: node B does not come back.
        a_lost_node_costs_a_bounded_failure,
        deleting_the_balancer_removes_every_child_and_pod,
    ];
    let (passed, failed) = runner::run(&mut world, all, Filter::RunsOnlyTheNamed, diagnose).await;
    println!("node: {passed} passed, {failed} failed, {:.0} s in all", started.elapsed().as_secs_f64());
    hold(&world).await;
    drop(world);
    // The kernel ends network namespaces, and their veths, a moment after their last process.
    let mut left: Vec<String> = host_traces().difference(&traces_before).cloned().collect();
    let teardown = Instant::now();
    while !left.is_empty() && teardown.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(250));
        left = host_traces().difference(&traces_before).cloned().collect();
    }
    if !left.is_empty() {
        println!("node: FAILED: the teardown left on the host:\n  {}", left.join("\n  "));
        return ExitCode::FAILURE;
    }
    println!("node: the teardown left nothing on the host (network namespaces, links, iptables chains)");
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// What runs: the API server's version, and each node's kubelet and container runtime.
async fn versions(admin: &Client) -> String {
    let server = admin.apiserver_version().await.map(|v| v.git_version).unwrap_or_else(|e| e.to_string());
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    let list = nodes.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    let each = list.iter().map(|node| {
        let info = node.status.as_ref().and_then(|s| s.node_info.as_ref());
        let (kubelet, runtime) = info.map_or(("?", "?"), |i| (&i.kubelet_version, &i.container_runtime_version));
        format!("{} kubelet {kubelet}, {runtime}", node.name_any())
    });
    format!("API server {server}; {}", each.collect::<Vec<_>>().join("; "))
}

/// With BALANCER_NODE_HOLD=<seconds>, keeps the cluster up that long for a look
/// (`kubectl --kubeconfig <printed path>`) before tearing it down.
async fn hold(world: &World) {
    let Some(seconds) = std::env::var("BALANCER_NODE_HOLD").ok().and_then(|s| s.parse().ok()) else { return };
    println!("node: holding for {seconds} s: kubectl --kubeconfig {}", world.plane.kubeconfig("admin").display());
    tokio::time::sleep(Duration::from_secs(seconds)).await;
}

/// Each node's name, readiness and taints.
const NODE_COLUMNS: &str =
    "custom-columns=NAME:.metadata.name,READY:.status.conditions[?(@.type==\"Ready\")].status,TAINTS:.spec.taints";

/// What a failed scenario leaves to read: pods, events, and the logs of the operator, the proxies
/// and the node.
fn diagnose(world: &World) {
    for args in [
        &["get", "nodes", "-o", NODE_COLUMNS][..],
        &["get", "pods", "-A", "-o", "wide"][..],
        &["get", "events", "-A", "--field-selector=type=Warning", "--sort-by=.lastTimestamp"][..],
        &["-n", OPERATOR_NS, "logs", "-l", "app.kubernetes.io/name=balancer", "--tail=20", "--prefix"][..],
        &["-n", NS, "logs", "-l", "app.kubernetes.io/component=proxy", "--all-containers", "--tail=20", "--prefix"][..],
    ] {
        let (_, out, err) = world.kubectl.run(args, None);
        println!("--- kubectl {}:\n{out}{err}", args.join(" "));
    }
    for node in &world.nodes {
        println!("--- kubelet of {}:\n{}", node.spec.name, node.log_tail("kubelet", 20));
    }
    // The one kube-proxy: a Service it has not programmed is unreachable ("no route to host").
    let log = std::fs::read_to_string(world.host.state.join("kube-proxy.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    println!("--- kube-proxy:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
}

//! The node suite: a real single-node cluster on this machine, and the operator
//! installed on it from `deploy/` as a user would.
//!
//! The control plane of the e2e suite (`tests/e2e/cluster.rs`), bound to the pod
//! bridge, plus containerd, the kubelet, kube-proxy and kube-scheduler, all built
//! from the Go module proxy (`tests/kubernetes/build.sh --node`), with images built locally
//! and no registry (`tests/node/images.sh`). `tests/node/host.sh` fences the pod
//! network in: nothing leaves the machine, DNS queries included.
//!
//! Needs root. Runs when BALANCER_NODE_E2E=1 (as in CI), which makes it
//! mandatory; otherwise it prints one SKIPPED line.

// Shared with the e2e suite, which uses all of it.
mod bench;
mod cert_manager;
#[allow(dead_code)]
#[path = "../e2e/cluster.rs"]
mod cluster;
mod node;
mod nodes;
#[path = "../e2e/runner.rs"]
mod runner;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use bench::{the_data_plane_keeps_up_with_haproxy, the_metrics_sidecar_costs_little};
use cert_manager::cert_manager_issues_the_webhook_certificate_and_injects_its_ca;
use cluster::{ControlPlane, PlaneOptions, commands_first_on_path};
use node::{
    ClusterServices, Host, KUBERNETES_SERVICE_IP, NODE_A, NODE_B, NODE_IP, Node, POD_BRIDGE, SERVICE_CIDR, host_traces,
};
use nodes::{
    a_drain_respects_the_budgets_and_fails_no_request, a_lost_node_costs_a_bounded_failure,
    an_uncordoned_node_is_used_by_the_next_rollout, proxies_and_operator_replicas_spread_across_the_nodes,
};
use runner::{eventually, scenarios};

const OPERATOR_NS: &str = "balancer-system";
/// The Balancers' namespace: Pod Security `restricted` enforced, so every pod balancer makes
/// and every backend fixture here must be admitted under it.
const NS: &str = "balancers";
/// The Go operator's Balancer and its pods: they run nginx as root, as the Go operator's do.
const GO_NS: &str = "go-operator";
const SAMPLE: &str = "example-balancer";
/// The locally built images (`images.sh`).
const BASE_IMAGE: &str = "localhost/balancer-test-base:1";
const STREAM_MODULE: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";
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
    /// The Kubernetes and containerd commands (`tests/kubernetes/build.sh --node`).
    assets: PathBuf,
    /// Helm, and cert-manager's chart (`tests/kubernetes/cert-manager.sh`).
    cert_manager: PathBuf,
    _host: Host,
}

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
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
    let images = script_output(
        "tests/node/images.sh",
        &[&assets.display().to_string(), &binary, &cert_manager.display().to_string()],
    );
    let state = std::env::var_os("BALANCER_NODE_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/balancer-node"));

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        // Dropping the suite's future tears the node down, as the end of a run does.
        tokio::select! {
            code = run_suite(&assets, &images, &cert_manager, &state) => code,
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

/// Brings the node up, runs the scenarios in order (up to the last one a name filter matches),
/// and tears everything down.
async fn run_suite(assets: &Path, images: &Path, cert_manager: &Path, state: &Path) -> ExitCode {
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
        plane,
        admin,
        assets: assets.to_path_buf(),
        cert_manager: cert_manager.to_path_buf(),
        _host: host,
    };
    let all = scenarios![World:
        the_operator_installs_from_deploy_as_a_user_would,
        the_walkthrough_splits_traffic_by_weight,
        the_metrics_sidecar_counts_the_last_session_after_nginx_exits,
        a_backend_without_pods_loses_its_share_without_a_failed_request,
        the_metrics_sidecar_costs_little,
        the_data_plane_keeps_up_with_haproxy,
        weights_change_under_load_without_a_failed_connection,
        scaling_the_balancer_brings_up_proxy_pods,
        udp_is_proxied_to_udp_echo_pods,
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
        a_replaced_certificate_is_served_without_a_restart,
        cert_manager_issues_the_webhook_certificate_and_injects_its_ca,
        proxies_and_operator_replicas_spread_across_the_nodes,
        a_drain_respects_the_budgets_and_fails_no_request,
        an_uncordoned_node_is_used_by_the_next_rollout,
        // Last but one: node B does not come back.
        a_lost_node_costs_a_bounded_failure,
        deleting_the_balancer_removes_every_child_and_pod,
    ];
    let (passed, failed) = runner::run_in_order(&mut world, all, diagnose).await;
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

/// What a failed scenario leaves to read: pods, events, and the logs of the operator and the node.
fn diagnose(world: &World) {
    for args in [
        &["get", "nodes", "-o", NODE_COLUMNS][..],
        &["get", "pods", "-A", "-o", "wide"][..],
        &["get", "events", "-A", "--field-selector=type=Warning", "--sort-by=.lastTimestamp"][..],
        &["-n", OPERATOR_NS, "logs", "-l", "app.kubernetes.io/name=balancer", "--tail=20", "--prefix"][..],
    ] {
        let (_, out, err) = world.plane.kubectl("admin", args, None);
        println!("--- kubectl {}:\n{out}{err}", args.join(" "));
    }
    for node in &world.nodes {
        println!("--- kubelet of {}:\n{}", node.spec.name, node.log_tail("kubelet", 20));
    }
}

fn kubectl(world: &World, args: &[&str], stdin: Option<&str>) -> String {
    let (ok, out, err) = world.plane.kubectl("admin", args, stdin);
    assert!(ok, "kubectl {} failed: {err}{out}", args.join(" "));
    out
}

// ---------------------------------------------------------------------------
// 1. Install as a user would
// ---------------------------------------------------------------------------

/// docs/install.md's overlay for a cluster without cert-manager, with the locally built images.
fn test_kustomization(dir: &Path) {
    write_kustomization(dir, true);
}

/// `deploy/` with the locally built images; `without_cert_manager`: with the component that
/// leaves out its cert-manager objects and CA-injection annotations.
fn write_kustomization(dir: &Path, without_cert_manager: bool) {
    // Kustomize takes only relative paths to other kustomizations: up to / and down again.
    let up = "../".repeat(dir.components().count() - 1);
    let deploy = format!("{up}{}", repo("deploy").display().to_string().trim_start_matches('/'));
    let component = format!("{deploy}/components/without-cert-manager");
    let components = if without_cert_manager { format!("components:\n  - {component}\n") } else { String::new() };
    let text = format!(
        r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {deploy}
{components}images:
  - name: balancer
    newName: localhost/balancer
    newTag: test
patches:
  # The local proxy image is Debian's nginx, whose stream module is dynamic.
  - target: {{kind: Deployment, name: balancer}}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/env/-
        value: {{name: BALANCER_PROXY_IMAGE, value: "{BASE_IMAGE}"}}
      - op: add
        path: /spec/template/spec/containers/0/env/-
        value: {{name: BALANCER_PROXY_LOAD_MODULES, value: "{STREAM_MODULE}"}}
"#,
    );
    std::fs::write(dir.join("kustomization.yaml"), text).expect("kustomization");
}

async fn the_operator_installs_from_deploy_as_a_user_would(world: &mut World) {
    // docs/install.md's manual-certificate path: everything but the cert-manager objects...
    let dir = tempfile::TempDir::new().expect("temp dir");
    test_kustomization(dir.path());
    kubectl(world, &["apply", "-k", &dir.path().display().to_string()], None);
    // ...then a certificate of our own, its Secret, and the CA in both webhook configurations
    // and in the CRD's conversion webhook.
    let certs = dir.path().join("certs");
    let bundle = new_certificates(&certs);
    kubectl(world, &["apply", "-f", "-"], Some(&webhook_secret(world, &certs)));
    patch_ca_bundle(world, &bundle);

    // Both replicas go Ready (readiness means "can answer the API server"; the leader's
    // controller then reconciles, as the walkthrough shows), in a namespace that admits only
    // `restricted` pods (deploy/namespace.yaml).
    wait_available(world, OPERATOR_NS, "balancer", 2).await;
    let (refused, answer) = refuses_root_pods(world, OPERATOR_NS);
    assert!(refused, "{OPERATOR_NS} does not enforce `restricted`: {answer}");
    let pods = operator_pods(world).await;
    let holder = eventually("a leader", Duration::from_secs(60), || lease_holder(world)).await;
    assert!(pods.contains(&holder), "the Lease is held by {holder}, not one of {pods:?}");

    // The API server reaches the webhooks through their Service: a bad Balancer gets our message.
    let config = kubectl(world, &["get", "validatingwebhookconfiguration", "balancer-validating", "-o", "json"], None);
    let config: Value = serde_json::from_str(&config).expect("json");
    assert_eq!(config["webhooks"][0]["clientConfig"]["service"]["name"], "balancer-webhook", "{config}");
    assert!(config["webhooks"][0]["clientConfig"].get("url").is_none());
    // Until kube-proxy has synced the Service's new endpoints (once a second at most), the API
    // server's call is refused: that answer is retried.
    let invalid = std::fs::read_to_string(repo("deploy/samples/invalid-balancer.yaml")).expect("sample");
    let (ok, out, err) =
        eventually("the webhooks reachable through their Service", Duration::from_secs(30), || async {
            let answer = world.plane.kubectl("admin", &["apply", "-f", "-"], Some(&invalid));
            (!answer.2.contains("connection refused")).then_some(answer)
        })
        .await;
    assert!(!ok, "the invalid sample was accepted: {out}");
    // Only the webhook knows this rule (the CRD schema has no notion of duplicate names).
    assert!(err.contains("duplicate port name \"http\""), "{err}");
}

fn patch_ca_bundle(world: &World, bundle: &str) {
    let patch = json!([{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}]).to_string();
    for config in
        ["mutatingwebhookconfiguration/balancer-mutating", "validatingwebhookconfiguration/balancer-validating"]
    {
        kubectl(world, &["patch", config, "--type=json", "-p", &patch], None);
    }
    let path = "/spec/conversion/webhook/clientConfig/caBundle";
    let patch = json!([{"op": "add", "path": path, "value": bundle}]).to_string();
    kubectl(world, &["patch", "crd", "balancers.exposer.hliangzhao.io", "--type=json", "-p", &patch], None);
}

async fn operator_pods(world: &World) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), OPERATOR_NS);
    let params = ListParams::default().labels("app.kubernetes.io/name=balancer");
    pods.list(&params).await.expect("pods").items.iter().map(ResourceExt::name_any).collect()
}

// ---------------------------------------------------------------------------
// 2. The original walkthrough
// ---------------------------------------------------------------------------

/// Makes `name` a namespace whose pods must meet the `restricted` Pod Security Standard, with
/// docs/install.md's command.
fn restricted_namespace(world: &World, name: &str) {
    kubectl(world, &["create", "namespace", name], None);
    kubectl(world, &["label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted"], None);
}

/// What `restricted` asks of a pod: not root, no privilege escalation, no capability, the
/// runtime's seccomp profile. The backends need nothing more.
fn restricted_pod() -> Value {
    json!({"runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534,
           "seccompProfile": {"type": "RuntimeDefault"}})
}

/// The container half of [`restricted_pod`].
fn restricted_container() -> Value {
    json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}})
}

/// A pod that `restricted` refuses: root, with a capability.
fn privileged_probe_pod(namespace: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-security-probe", "namespace": namespace},
           "spec": {"containers": [{"name": "root", "image": BASE_IMAGE, "imagePullPolicy": "Never",
                                    "securityContext": {"runAsUser": 0, "capabilities": {"add": ["NET_ADMIN"]}}}]}})
    .to_string()
}

/// Whether the API server refuses a root pod in `namespace` (a server-side dry run: nothing is
/// made), and its answer.
fn refuses_root_pods(world: &World, namespace: &str) -> (bool, String) {
    let args = ["apply", "--dry-run=server", "-f", "-"];
    let (ok, out, err) = world.plane.kubectl("admin", &args, Some(&privileged_probe_pod(namespace)));
    (!ok && err.contains("violates PodSecurity \"restricted:latest\""), format!("{out}{err}"))
}

/// An HTTP echo Deployment in [`NS`]: nginx on 5678 answering `hello world <version>`.
fn echo_backend(version: &str) -> String {
    echo_backend_in(NS, version)
}

/// An HTTP echo Deployment in `namespace`, `restricted` as any: nginx as nobody, its pid file
/// and temporary files in /tmp.
fn echo_backend_in(namespace: &str, version: &str) -> String {
    let conf = format!(
        "worker_processes 1;\npid /tmp/nginx.pid;\nevents {{}}\nhttp {{\n  access_log off;\n  \
         client_body_temp_path /tmp/client_body;\n  proxy_temp_path /tmp/proxy;\n  \
         fastcgi_temp_path /tmp/fastcgi;\n  uwsgi_temp_path /tmp/uwsgi;\n  scgi_temp_path /tmp/scgi;\n  \
         server {{\n    listen 5678;\n    \
         location / {{ default_type text/plain; return 200 \"hello world {version}\\n\"; }}\n  }}\n  \
         server {{\n    listen 5679;\n    \
         location /ready {{ if (-f /tmp/draining) {{ return 503; }} return 200; }}\n  }}\n}}\n"
    );
    let config_map = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("echo-{version}"), "namespace": namespace},
        "data": {"nginx.conf": conf},
    });
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": format!("echo-{version}"), "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "test", "version": version}},
            "template": {
                "metadata": {"labels": {"app": "test", "version": version}},
                "spec": {
                    "securityContext": restricted_pod(),
                    "containers": [{
                        "name": "echo",
                        "image": BASE_IMAGE,
                        "imagePullPolicy": "Never",
                        "securityContext": restricted_container(),
                        "command": ["nginx", "-c", "/etc/echo/nginx.conf", "-e", "stderr", "-g", "daemon off;"],
                        "ports": [{"containerPort": 5678}],
                        "readinessProbe": {"httpGet": {"port": 5679, "path": "/ready"},
                                           "periodSeconds": 1, "failureThreshold": 2},
                        // A backend that stops gracefully: it leaves its Service's endpoints,
                        // then quits and finishes what it is answering (nginx's SIGTERM is a
                        // fast stop). kube-proxy still sends to a terminating pod that is its
                        // Service's last one while the pod is ready (KEP-1669), so the pod first
                        // turns not ready: a quit would reset the connections still queued.
                        "lifecycle": {"preStop": {"exec": {"command": [
                            "sh", "-c", "touch /tmp/draining; sleep 4; nginx -c /etc/echo/nginx.conf -s quit; sleep 2"
                        ]}}},
                        "volumeMounts": [{"name": "conf", "mountPath": "/etc/echo"}],
                    }],
                    "volumes": [{"name": "conf", "configMap": {"name": format!("echo-{version}")}}],
                },
            },
        },
    });
    json!({"apiVersion": "v1", "kind": "List", "items": [config_map, deployment]}).to_string()
}

/// The README's walkthrough in a namespace that enforces `restricted`: the echo backends, the
/// sample, and the proxy pods balancer makes are all admitted.
async fn the_walkthrough_splits_traffic_by_weight(world: &mut World) {
    restricted_namespace(world, NS);
    let (refused, answer) = refuses_root_pods(world, NS);
    assert!(refused, "{NS} does not enforce `restricted`: {answer}");
    for version in ["v1", "v2", "v3"] {
        kubectl(world, &["apply", "-f", "-"], Some(&echo_backend(version)));
    }
    for version in ["v1", "v2", "v3"] {
        wait_available(world, NS, &format!("echo-{version}"), 1).await;
    }
    let sample = std::fs::read_to_string(repo("deploy/samples/balancer.yaml")).expect("sample");
    kubectl(world, &["-n", NS, "apply", "-f", "-"], Some(&sample));
    wait_ready_balancer(world, SAMPLE, Duration::from_secs(120)).await;

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

    let front = front_ip(world, SAMPLE).await;
    every_backend_answers(&front, &["v1", "v2", "v3"]).await;
    let metrics = format!("{}:9113", proxy.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("a pod IP"));
    // The count before, once the sessions of the requests above are all in.
    let before = eventually("the proxy's metrics sidecar to settle", Duration::from_secs(30), || async {
        let first = proxy_sessions(&metrics).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
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
    println!("node: kubectl get bal:\n{}", kubectl(world, &["-n", NS, "get", "bal"], None));
}

/// Waits until a Balancer's `status.backends` shows `ready` endpoints and `shares`, in spec
/// order, and `BackendsAvailable` is `available`; returns the status.
async fn wait_backends(
    world: &World,
    name: &str,
    ready: &[i64],
    shares: &[i64],
    available: &str,
    timeout: Duration,
) -> Value {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(world.admin.clone(), NS, &balancer_resource());
    let what = format!("Balancer {name}'s backends with {ready:?} ready endpoints, shares {shares:?}, {available}");
    eventually(&what, timeout, || async {
        let status = api.get(name).await.ok()?.data.get("status").cloned()?;
        let backends = status["backends"].as_array()?;
        let seen: Vec<(i64, i64)> = backends
            .iter()
            .map(|b| (b["readyEndpoints"].as_i64().unwrap_or(-1), b["share"].as_i64().unwrap_or(-1)))
            .collect();
        let want: Vec<(i64, i64)> = ready.iter().copied().zip(shares.iter().copied()).collect();
        let condition = status["conditions"].as_array()?.iter().find(|c| c["type"] == "BackendsAvailable")?.clone();
        (seen == want && condition["status"] == available).then_some(status)
    })
    .await
}

// ---------------------------------------------------------------------------
// 2b. A backend without pods
// ---------------------------------------------------------------------------

/// Backend v2 scaled to 0 under continuous TCP load: the status says so within 15 s, the
/// others take its share on the wire, and no request fails; scaled back, all returns.
async fn a_backend_without_pods_loses_its_share_without_a_failed_request(world: &mut World) {
    let front = front_ip(world, SAMPLE).await;
    let load = Load::start(format!("{front}:80"), 4);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let v2 = leaving(world, "app=test,version=v2", "v2's pod").await;
    kubectl(world, &["-n", NS, "scale", "deployment/echo-v2", "--replicas=0"], None);
    let scaled = Instant::now();
    let status = wait_backends(world, SAMPLE, &[1, 0, 1], &[50, 0, 50], "False", Duration::from_secs(15)).await;
    println!("node: v2 without endpoints in the status {:.1} s after scaling it to 0", scaled.elapsed().as_secs_f64());
    assert_eq!(status["backendsReady"], "2/3", "{status}");
    let condition = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "BackendsAvailable").unwrap();
    let message = condition["message"].as_str().unwrap_or_default();
    assert!(message.contains("v2") && !message.contains("v1"), "{message}");
    println!(
        "node: kubectl get bal -o wide:\n{}",
        kubectl(world, &["-n", NS, "get", "bal", SAMPLE, "-o", "wide"], None)
    );

    // The split on the wire, over 5 s of the clients' requests once kube-proxy no longer sends
    // to v2's pod: nginx's upstream is v2's cluster IP, so until then v2's terminating pod
    // still answers. Once it refuses, nginx skips v2 (issue 34 gives nginx the pods themselves).
    v2.gone();
    let before = load.answers();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = load.answers();
    let split: BTreeMap<String, usize> =
        after.iter().map(|(answer, n)| (answer.clone(), n - before.get(answer).copied().unwrap_or(0))).collect();
    println!("node: with v2 scaled to 0, 5 s of requests: {split:?}");
    assert_eq!(split.get("hello world v2").copied().unwrap_or(0), 0, "{split:?}");
    assert_shares(&split, &[("hello world v1", 50), ("hello world v3", 50)], 5.0);

    kubectl(world, &["-n", NS, "scale", "deployment/echo-v2", "--replicas=1"], None);
    wait_available(world, NS, "echo-v2", 1).await;
    wait_backends(world, SAMPLE, &[1, 1, 1], &[40, 20, 40], "True", Duration::from_secs(15)).await;
    let (sent, failures) = load.finish().await;
    println!("node: {sent} requests while v2 went to 0 pods and back, {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {sent} failed: {:?}", failures.len(), &failures[..failures.len().min(10)]);
}

/// The completed sessions per backend (`outcome="ok"`), from a proxy pod's metrics sidecar.
async fn proxy_sessions(address: &str) -> Option<BTreeMap<String, f64>> {
    sidecar_counts(address, "balancer_proxy_sessions_total", "outcome=\"ok\"").await
}

/// A counter of a proxy pod's metrics sidecar, summed per backend (`""` for series without
/// one) over its series that have `label` (`""`: all).
async fn sidecar_counts(address: &str, metric: &str, label: &str) -> Option<BTreeMap<String, f64>> {
    let mut stream =
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(address)).await.ok()?.ok()?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n").await.ok()?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut text)).await.ok()?.ok()?;
    let mut counts = BTreeMap::new();
    let series = format!("{metric}{{");
    for line in text.lines().filter(|l| l.starts_with(&series) && l.contains(label)) {
        let backend = line.split("backend=\"").nth(1).and_then(|rest| rest.split('"').next()).unwrap_or_default();
        let backend = backend.to_string();
        let value: f64 = line.rsplit(' ').next()?.parse().ok()?;
        *counts.entry(backend).or_insert(0.0) += value;
    }
    text.starts_with("HTTP/1.1 200").then_some(counts)
}

/// The runtime's ID of `pod`'s container `name`.
fn container_id(pod: &Pod, name: &str) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let id = statuses.iter().find(|c| c.name == name)?.container_id.as_deref()?;
    Some(id.rsplit("://").next()?.to_string())
}

/// Whether a process of container `id` runs, as the host sees it: runc names a container's
/// cgroup after its ID. (The kubelet reports a container of a terminating pod as exited only
/// once every container has, native sidecars included.)
fn container_runs(id: &str) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else { return false };
    entries.flatten().any(|entry| std::fs::read_to_string(entry.path().join("cgroup")).is_ok_and(|c| c.contains(id)))
}

/// The metrics sidecar is a native sidecar: it outlives nginx. A session open through a proxy
/// pod when the pod is deleted is served during nginx's stop, and its bytes can be scraped
/// from the sidecar once nginx has exited, before the pod is gone.
async fn the_metrics_sidecar_counts_the_last_session_after_nginx_exits(world: &mut World) {
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let params = ListParams::default().labels(&format!("balancer.exposer.hliangzhao.io/balancer-name={SAMPLE}"));
    let pod = pods.list(&params).await.expect("pods").items.into_iter().next().expect("a proxy pod");
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("a pod IP");
    let metrics = format!("{ip}:9113");
    let received = || sidecar_counts(&metrics, "balancer_proxy_received_bytes_total", "");
    // Once the lines of earlier sessions are all in.
    let before = eventually("the sidecar's counts to settle", Duration::from_secs(30), || async {
        let first = received().await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        (received().await? == first).then_some(first)
    })
    .await;
    let mut session = tokio::net::TcpStream::connect(format!("{ip}:80")).await.expect("a session to the proxy pod");
    pods.delete(&pod.name_any(), &kube::api::DeleteParams::default()).await.expect("delete the proxy pod");
    let deleted = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let request = b"GET / HTTP/1.1\r\nHost: echo\r\nConnection: close\r\n\r\n";
    session.write_all(request).await.expect("the request, on the session opened before the stop");
    let mut answer = String::new();
    session.read_to_string(&mut answer).await.expect("the answer");
    let backend = answer.lines().last().and_then(|l| l.strip_prefix("hello world ")).expect("an echo").to_string();
    let nginx = container_id(&pod, "nginx").expect("nginx's container ID");
    assert!(container_runs(&nginx), "nginx's processes are found on the host");
    let exited = eventually("nginx exited", Duration::from_secs(60), || async {
        (!container_runs(&nginx)).then_some(deleted.elapsed())
    })
    .await;
    let after = received().await.expect("the sidecar still serving after nginx exited");
    let counted = after.get(&backend).copied().unwrap_or(0.0) - before.get(&backend).copied().unwrap_or(0.0);
    println!(
        "node: nginx exited {:.1} s after its pod's delete; then the sidecar counted {counted} bytes from clients to \
         {backend} since before the delete",
        exited.as_secs_f64()
    );
    assert_eq!(counted, request.len() as f64, "the last session's request, and only it (probes send nothing)");
    eventually("the deleted proxy pod gone", Duration::from_secs(60), || async {
        pods.get_opt(&pod.name_any()).await.ok()?.is_none().then_some(())
    })
    .await;
    println!("node: the proxy pod gone {:.1} s after its delete", deleted.elapsed().as_secs_f64());
    wait_available(world, NS, &format!("{SAMPLE}-proxy"), 1).await;
    wait_ready_balancer(world, SAMPLE, Duration::from_secs(60)).await;
}

/// Waits for a Deployment to have `replicas` ready pods.
async fn wait_available(world: &World, namespace: &str, name: &str, replicas: i32) {
    let deployments: Api<Deployment> = Api::namespaced(world.admin.clone(), namespace);
    eventually(&format!("Deployment {name} with {replicas} ready"), Duration::from_secs(120), || async {
        (deployments.get(name).await.ok()?.status?.ready_replicas == Some(replicas)).then_some(())
    })
    .await;
}

/// Waits for `Ready=True` on a Balancer's current generation, and returns its status.
async fn wait_ready_balancer(world: &World, name: &str, timeout: Duration) -> Value {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(world.admin.clone(), NS, &balancer_resource());
    eventually(&format!("Balancer {name} Ready=True"), timeout, || async {
        let balancer = api.get(name).await.ok()?;
        let status = balancer.data.get("status").cloned()?;
        let current = status["observedGeneration"].as_i64() == balancer.metadata.generation;
        let ready = status["conditions"].as_array()?.iter().any(|c| c["type"] == "Ready" && c["status"] == "True");
        (current && ready).then_some(status)
    })
    .await
}

fn balancer_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::erase::<balancer::api::Balancer>(&())
}

/// The cluster IP of the Service `name` in [`NS`] (a Balancer's front Service has its name).
async fn front_ip(world: &World, name: &str) -> String {
    service_ip(world, NS, name).await
}

async fn service_ip(world: &World, namespace: &str, name: &str) -> String {
    let services: Api<Service> = Api::namespaced(world.admin.clone(), namespace);
    let service = services.get(name).await.expect("front Service");
    service.spec.and_then(|s| s.cluster_ip).expect("a cluster IP")
}

/// `requests` HTTP requests to `ip:port`, 16 at a time, each on its own connection:
/// how many got each answer ("failed" for a connection that got none).
async fn split(ip: &str, port: u16, requests: usize) -> BTreeMap<String, usize> {
    let address = format!("{ip}:{port}");
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..16 {
        let address = address.clone();
        let share = requests / 16 + usize::from(task < requests % 16);
        tasks.spawn(async move {
            let mut answers = Vec::with_capacity(share);
            for _ in 0..share {
                answers.push(one_request(&address).await.unwrap_or_else(|e| format!("failed: {e}")));
            }
            answers
        });
    }
    let mut counts = BTreeMap::new();
    let mut failures = Vec::new();
    for answer in tasks.join_all().await.into_iter().flatten() {
        let key = if answer.starts_with("failed") {
            failures.push(answer);
            "failed".to_string()
        } else {
            answer
        };
        *counts.entry(key).or_insert(0) += 1;
    }
    if !failures.is_empty() {
        println!("node: failures through {address}, first ones: {:?}", &failures[..failures.len().min(5)]);
    }
    counts
}

/// One `GET /` on a new connection: the body's first line.
async fn one_request(address: &str) -> Result<String, String> {
    one_request_from(None, address).await
}

/// [`one_request`] from a given local address (any, if `None`).
async fn one_request_from(source: Option<&str>, address: &str) -> Result<String, String> {
    let connect = async {
        let Some(source) = source else { return tokio::net::TcpStream::connect(address).await };
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(std::net::SocketAddr::new(source.parse().map_err(std::io::Error::other)?, 0))?;
        socket.connect(address.parse().map_err(std::io::Error::other)?).await
    };
    let exchange = async {
        let mut stream = connect.await.map_err(|e| e.to_string())?;
        stream.write_all(b"GET / HTTP/1.0\r\nHost: balancer\r\n\r\n").await.map_err(|e| e.to_string())?;
        let mut reply = Vec::with_capacity(256);
        stream.read_to_end(&mut reply).await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&reply);
        let body = text.split("\r\n\r\n").nth(1).ok_or_else(|| format!("no body in {text:?}"))?;
        Ok(body.lines().next().unwrap_or_default().to_string())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange).await.map_err(|_| "timed out".to_string())?
}

/// Waits until one batch of 30 requests through the front Service at `front`:80 reaches each
/// of `versions`.
///
/// Ready follows the proxy Deployment, and kube-proxy programs the backend Services' new
/// cluster IPs a moment later (at most one sync a second from v1.28 on). nginx's first connects
/// to an unprogrammed one fail, and its passive health check then skips that whole backend for
/// its `fail_timeout` (10 s). Issue 34 removes the cause (upstreams of pods); until then the
/// split is measured after it.
async fn every_backend_answers(front: &str, versions: &[&str]) {
    let started = Instant::now();
    loop {
        let counts = split(front, 80, 30).await;
        if versions.iter().all(|v| counts.contains_key(&format!("hello world {v}"))) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(40), "after 40 s only {counts:?} through {front}:80");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("node: every backend answered in one batch {:.1} s after Ready", started.elapsed().as_secs_f64());
}

/// The upstream lines of the sample's proxy configuration: in its ConfigMap, and as each proxy
/// pod mounted it (a failure's diagnosis).
fn print_proxy_configs(world: &World) {
    let upstreams = |conf: &str| conf.lines().filter(|l| l.contains("weight=")).collect::<Vec<_>>().join(" | ");
    let (_, conf, _) = world.plane.kubectl(
        "admin",
        &["-n", NS, "get", "configmap", "example-balancer-proxy-configmap", "-o", "jsonpath={.data.nginx\\.conf}"],
        None,
    );
    println!("node: the ConfigMap's upstreams: {}", upstreams(&conf));
    let selector = "balancer.exposer.hliangzhao.io/balancer-name=example-balancer,app.kubernetes.io/component=proxy";
    let (_, pods, _) = world.plane.kubectl("admin", &["-n", NS, "get", "pods", "-l", selector, "-o", "name"], None);
    for pod in pods.lines() {
        let (_, conf, _) =
            world.plane.kubectl("admin", &["-n", NS, "exec", pod, "--", "cat", "/etc/balancer/nginx.conf"], None);
        let (_, hash, _) = world.plane.kubectl(
            "admin",
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
        let (_, out, _) = world.plane.kubectl("admin", args, None);
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
struct Leaving {
    what: &'static str,
    dropped: std::thread::JoinHandle<Result<f64, String>>,
}

/// Takes the pods `selector` matches now, before the change that removes them.
async fn leaving(world: &World, selector: &str, what: &'static str) -> Leaving {
    Leaving { what, dropped: dropped_by_kube_proxy(pod_ips(world, NS, selector).await, Instant::now()) }
}

impl Leaving {
    /// Waits until kube-proxy no longer sends to the pods. A pod leaving serves through its stop
    /// hook (5 s for a proxy, 3 s for an echo backend), kube-proxy sends to such a terminating
    /// pod while its Service has no ready one (KEP-1669, on since v1.26), and it syncs at most
    /// once a second (from v1.28 on): a split measured before would still reach them.
    fn gone(self) {
        let dropped = self.dropped.join().expect("the kube-proxy watch");
        let dropped = dropped.unwrap_or_else(|e| panic!("kube-proxy and {}: {e}", self.what));
        println!("node: kube-proxy stopped sending to {} {dropped:.1} s after the change", self.what);
    }
}

/// The addresses of the pods in `NS` that `selector` matches.
async fn pod_ips(world: &World, namespace: &str, selector: &str) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), namespace);
    let listed = pods.list(&ListParams::default().labels(selector)).await.expect("pods");
    listed.items.into_iter().filter_map(|p| p.status?.pod_ip).collect()
}

/// Watches kube-proxy's NAT rules (every 200 ms, for up to 150 s: a proxy rollout may take
/// 120 s) until none sends to `ips`, which the first look must find: when that was, in seconds
/// from `since`, or why it is not known.
fn dropped_by_kube_proxy(ips: Vec<String>, since: Instant) -> std::thread::JoinHandle<Result<f64, String>> {
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

/// Whether each answer's share is its weight's, within `points` percentage points.
fn shares_match(counts: &BTreeMap<String, usize>, weights: &[(&str, u32)], points: f64) -> bool {
    let total: usize = counts.values().sum();
    let weight_sum: u32 = weights.iter().map(|(_, w)| w).sum();
    weights.iter().all(|(answer, weight)| {
        let share = 100.0 * *counts.get(*answer).unwrap_or(&0) as f64 / total as f64;
        (share - 100.0 * f64::from(*weight) / f64::from(weight_sum)).abs() <= points
    })
}

/// Each answer's share is its weight's, within `points` percentage points.
fn assert_shares(counts: &BTreeMap<String, usize>, weights: &[(&str, u32)], points: f64) {
    let total: usize = counts.values().sum();
    let weight_sum: u32 = weights.iter().map(|(_, w)| w).sum();
    for (answer, weight) in weights {
        let share = 100.0 * *counts.get(*answer).unwrap_or(&0) as f64 / total as f64;
        let expected = 100.0 * f64::from(*weight) / f64::from(weight_sum);
        assert!(
            (share - expected).abs() <= points,
            "{answer}: {share:.1}% against {expected:.1}% ±{points}: {counts:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// 3. Weights change under load
// ---------------------------------------------------------------------------

/// Clients sending requests back to back until stopped: every failure, with its error, and
/// how many requests got each answer so far.
struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: tokio::task::JoinSet<(usize, Vec<String>)>,
    answers: std::sync::Arc<std::sync::Mutex<BTreeMap<String, usize>>>,
    last_failure: std::sync::Arc<std::sync::Mutex<Option<Instant>>>,
}

impl Load {
    fn start(address: String, clients: usize) -> Load {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let answers = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let last_failure = std::sync::Arc::new(std::sync::Mutex::new(None));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..clients {
            let (address, stop, answers) = (address.clone(), stop.clone(), answers.clone());
            let last_failure = last_failure.clone();
            tasks.spawn(async move {
                let (mut sent, mut failures) = (0, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    sent += 1;
                    match one_request(&address).await {
                        Ok(answer) => *answers.lock().expect("answers").entry(answer).or_insert(0) += 1,
                        Err(e) => {
                            *last_failure.lock().expect("last failure") = Some(Instant::now());
                            failures.push(e);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                (sent, failures)
            });
        }
        Load { stop, tasks, answers, last_failure }
    }

    /// When the last request failed, if one did.
    fn last_failure(&self) -> Option<Instant> {
        *self.last_failure.lock().expect("last failure")
    }

    /// How many requests got each answer so far.
    fn answers(&self) -> BTreeMap<String, usize> {
        self.answers.lock().expect("answers").clone()
    }

    /// Stops the clients: how many requests they sent, and every failure.
    async fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.tasks.join_all().await.into_iter().fold((0, Vec::new()), |(sent, mut failed), (s, f)| {
            failed.extend(f);
            (sent + s, failed)
        })
    }
}

fn patch_balancer(world: &World, name: &str, patch: Value) {
    kubectl(world, &["-n", NS, "patch", "balancer", name, "--type=json", "-p", &patch.to_string()], None);
}

async fn weights_change_under_load_without_a_failed_connection(world: &mut World) {
    let front = front_ip(world, SAMPLE).await;
    let load = Load::start(format!("{front}:80"), 4);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let old_proxies = leaving(world, &nodes::proxy_pods(), "the old proxy pods").await;
    patch_balancer(
        world,
        SAMPLE,
        json!([
            {"op": "replace", "path": "/spec/backends/0/weight", "value": 80},
            {"op": "replace", "path": "/spec/backends/1/weight", "value": 10},
            {"op": "replace", "path": "/spec/backends/2/weight", "value": 10},
        ]),
    );
    wait_ready_balancer(world, SAMPLE, Duration::from_secs(120)).await;
    old_proxies.gone();
    let counts = split(&front, 80, 3000).await;
    println!("node: after the weight change, 3000 requests: {counts:?}");
    assert_shares(&counts, &[("hello world v1", 80), ("hello world v2", 10), ("hello world v3", 10)], 3.0);

    // Removing a backend: the rollout fails nothing, and its Service goes once it is over.
    let old_proxies = leaving(world, &nodes::proxy_pods(), "the old proxy pods").await;
    patch_balancer(world, SAMPLE, json!([{"op": "remove", "path": "/spec/backends/2"}]));
    let status = wait_ready_balancer(world, SAMPLE, Duration::from_secs(120)).await;
    old_proxies.gone();
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    eventually("the removed backend's Service deleted", Duration::from_secs(30), || async {
        services.get_opt("example-balancer-v3-backend").await.ok()?.is_none().then_some(())
    })
    .await;
    let (sent, failures) = load.finish().await;
    println!("node: {sent} requests during two proxy rollouts, {} failed", failures.len());
    assert!(
        failures.is_empty(),
        "{} of {sent} requests failed during the rollouts: {:?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
    assert_eq!(status["activeBackends"], 2, "{status}");
    let counts = split(&front, 80, 600).await;
    assert_shares(&counts, &[("hello world v1", 80), ("hello world v2", 10)], 4.0);
}

// ---------------------------------------------------------------------------
// 3b. Scale
// ---------------------------------------------------------------------------

async fn scaling_the_balancer_brings_up_proxy_pods(world: &mut World) {
    let front = front_ip(world, SAMPLE).await;
    let load = Load::start(format!("{front}:80"), 2);
    kubectl(world, &["-n", NS, "scale", &format!("balancer/{SAMPLE}"), "--replicas=2"], None);
    let proxy = format!("{SAMPLE}-proxy");
    wait_available(world, NS, &proxy, 2).await;
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(world.admin.clone(), NS, &balancer_resource());
    let status = eventually("status.readyReplicas 2", Duration::from_secs(60), || async {
        let status = api.get(SAMPLE).await.ok()?.data.get("status").cloned()?;
        (status["readyReplicas"] == 2 && status["replicas"] == 2).then_some(status)
    })
    .await;
    println!("node: scaled to 2 proxy pods: {}", status["selector"]);
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let selector = status["selector"].as_str().expect("status.selector");
    // Pods of the earlier rollouts may still be draining (terminating): they are not counted.
    let live = |pods: Vec<Pod>| pods.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).count();
    let running = live(pods.list(&ListParams::default().labels(selector)).await.expect("pods").items);
    assert_eq!(running, 2, "pods selected by status.selector");

    // Back to one, with the load still running: scaling drops no connection either.
    kubectl(world, &["-n", NS, "scale", &format!("balancer/{SAMPLE}"), "--replicas=1"], None);
    wait_available(world, NS, &proxy, 1).await;
    eventually("one proxy pod left", Duration::from_secs(60), || async {
        let left = live(pods.list(&ListParams::default().labels(selector)).await.ok()?.items);
        (left == 1).then_some(())
    })
    .await;
    let (sent, failures) = load.finish().await;
    println!("node: {sent} requests while scaling 1 → 2 → 1, {} failed", failures.len());
    assert!(
        failures.is_empty(),
        "{} of {sent} failed while scaling: {:?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
}

// ---------------------------------------------------------------------------
// 4. UDP
// ---------------------------------------------------------------------------

/// Answers every datagram with `<version> <datagram>`, from one socket (socat's `fork` shares
/// its socket with the child that answers, which can swallow the next datagram).
const UDP_ECHO: &str = "import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('', 5353))
while True:
    data, peer = s.recvfrom(512)
    s.sendto(sys.argv[1].encode() + b' ' + data, peer)
";

/// A UDP echo Deployment: each datagram answered as `<version> <datagram>`.
fn udp_echo_backend(version: &str) -> String {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": format!("udp-echo-{version}"), "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "udp-echo", "version": version}},
            "template": {
                "metadata": {"labels": {"app": "udp-echo", "version": version}},
                "spec": {"securityContext": restricted_pod(), "containers": [{
                    "name": "echo",
                    "image": BASE_IMAGE,
                    "imagePullPolicy": "Never",
                    "securityContext": restricted_container(),
                    "command": ["python3", "-c", UDP_ECHO, version],
                    "ports": [{"containerPort": 5353, "protocol": "UDP"}],
                }]},
            },
        },
    })
    .to_string()
}

const UDP_BALANCER: &str = "udp-echo";

async fn udp_is_proxied_to_udp_echo_pods(world: &mut World) {
    for version in ["u1", "u2"] {
        kubectl(world, &["apply", "-f", "-"], Some(&udp_echo_backend(version)));
    }
    for version in ["u1", "u2"] {
        wait_available(world, NS, &format!("udp-echo-{version}"), 1).await;
    }
    let balancer = format!(
        "apiVersion: exposer.hliangzhao.io/v1alpha1\nkind: Balancer\nmetadata:\n  name: {UDP_BALANCER}\n  namespace: {NS}\n\
         spec:\n  ports:\n    - {{name: echo, protocol: UDP, port: 53, targetPort: 5353}}\n  selector: {{app: udp-echo}}\n\
         \x20 backends:\n    - {{name: u1, weight: 50, selector: {{version: u1}}}}\n    - {{name: u2, weight: 50, selector: {{version: u2}}}}\n"
    );
    kubectl(world, &["apply", "-f", "-"], Some(&balancer));
    wait_ready_balancer(world, UDP_BALANCER, Duration::from_secs(120)).await;
    let front = front_ip(world, UDP_BALANCER).await;
    // Ready follows the Deployment; kube-proxy learns the new endpoints a moment later.
    let first = Instant::now();
    eventually("a first UDP reply", Duration::from_secs(60), || udp_exchange(&front, "hello")).await;
    println!("node: first UDP reply {:.1} s after Ready", first.elapsed().as_secs_f64());
    let mut replies = BTreeMap::new();
    for i in 0..40 {
        let line = format!("ping {i}");
        let what = format!("a reply to UDP exchange {i}");
        let reply = eventually(&what, Duration::from_secs(10), || udp_exchange(&front, &line)).await;
        let (version, echoed) = reply.trim().split_once(' ').unwrap_or_default();
        assert_eq!(echoed, format!("ping {i}"), "the reply echoes the request: {reply:?}");
        *replies.entry(version.to_string()).or_insert(0) += 1;
    }
    println!("node: 40 UDP exchanges through {front}:53: {replies:?}");
    assert_eq!(replies.keys().collect::<Vec<_>>(), ["u1", "u2"], "both backends answer: {replies:?}");

    // u2 scaled to 0 while clients exchange datagrams continuously, each once, without a retry.
    wait_backends(world, UDP_BALANCER, &[1, 1], &[50, 50], "True", Duration::from_secs(15)).await;
    let load = UdpLoad::start(front.clone(), 2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    kubectl(world, &["-n", NS, "scale", "deployment/udp-echo-u2", "--replicas=0"], None);
    let scaled = Instant::now();
    wait_backends(world, UDP_BALANCER, &[1, 0], &[100, 0], "False", Duration::from_secs(15)).await;
    println!("node: u2 without endpoints in the status {:.1} s after scaling it to 0", scaled.elapsed().as_secs_f64());
    tokio::time::sleep(Duration::from_secs(20)).await;
    let (sent, lost, answers) = load.finish().await;
    let without_endpoints = scaled.elapsed().as_secs_f64();
    println!(
        "node: {sent} UDP exchanges while u2 went to 0 pods ({without_endpoints:.0} s), {lost} lost; answers {answers:?}"
    );
    // nginx sends a UDP exchange to a backend that refused one again only after its failTimeout
    // (10 s), once per worker (2): each such exchange is lost. The docs state this bound.
    let bound = 2 * (without_endpoints / 10.0).ceil() as usize + 2;
    assert!(lost <= bound, "{lost} UDP exchanges lost, over the bound of {bound}");
    kubectl(world, &["-n", NS, "scale", "deployment/udp-echo-u2", "--replicas=1"], None);
    wait_available(world, NS, "udp-echo-u2", 1).await;
    wait_backends(world, UDP_BALANCER, &[1, 1], &[50, 50], "True", Duration::from_secs(15)).await;
    kubectl(world, &["-n", NS, "delete", "balancer", UDP_BALANCER], None);
}

/// UDP clients exchanging datagrams back to back until stopped, each exchange once, with no
/// retry: a datagram without a reply within a second is a lost exchange.
struct UdpLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: tokio::task::JoinSet<(usize, usize, BTreeMap<String, usize>)>,
}

impl UdpLoad {
    fn start(ip: String, clients: usize) -> UdpLoad {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for client in 0..clients {
            let (ip, stop) = (ip.clone(), stop.clone());
            tasks.spawn(async move {
                let (mut sent, mut lost, mut answers) = (0, 0, BTreeMap::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    sent += 1;
                    let line = format!("client {client} exchange {sent}");
                    match udp_exchange(&ip, &line).await {
                        // An answer echoes the line; nginx answers a refused exchange with an
                        // empty datagram.
                        Some(reply) if reply.trim_end().ends_with(&line) => {
                            let version = reply.split_whitespace().next().unwrap_or_default().to_string();
                            *answers.entry(version).or_insert(0) += 1;
                        }
                        _ => lost += 1,
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (sent, lost, answers)
            });
        }
        UdpLoad { stop, tasks }
    }

    /// Stops the clients: exchanges sent, lost, and the replies by backend.
    async fn finish(self) -> (usize, usize, BTreeMap<String, usize>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut all = (0, 0, BTreeMap::new());
        for (sent, lost, answers) in self.tasks.join_all().await {
            all.0 += sent;
            all.1 += lost;
            for (version, n) in answers {
                *all.2.entry(version).or_insert(0) += n;
            }
        }
        all
    }
}

/// One datagram from a fresh socket to `ip:53`, and the reply, if one came within a second.
async fn udp_exchange(ip: &str, line: &str) -> Option<String> {
    let socket = tokio::net::UdpSocket::bind("0.0.0.0:0").await.ok()?;
    socket.send_to(format!("{line}\n").as_bytes(), format!("{ip}:53")).await.ok()?;
    let mut buffer = [0u8; 512];
    let (n, _) = tokio::time::timeout(Duration::from_secs(1), socket.recv_from(&mut buffer)).await.ok()?.ok()?;
    Some(String::from_utf8_lossy(&buffer[..n]).into_owned())
}

// ---------------------------------------------------------------------------
// 4b. Node port and session affinity
// ---------------------------------------------------------------------------

/// A v1beta1 Balancer over the walkthrough's echo pods, 40/20/40, exposed at `node_port` on
/// the node. `Local` keeps the client's address: kube-proxy masquerades node-port traffic
/// under `Cluster`, and nginx would see the node's address for every client. `Local` also means
/// the node kube-proxy speaks for: the proxy pods stay on node A (`spec.proxy.nodeSelector`).
fn node_port_balancer(name: &str, node_port: u16, affinity: &str) -> String {
    let node = NODE_A.name;
    format!(
        "apiVersion: exposer.hliangzhao.io/v1beta1\nkind: Balancer\nmetadata:\n  name: {name}\n  namespace: {NS}\n\
         spec:\n  sessionAffinity: {affinity}\n  service: {{type: NodePort, externalTrafficPolicy: Local}}\n\
         \x20 proxy: {{nodeSelector: {{kubernetes.io/hostname: {node}}}}}\n\
         \x20 ports: [{{name: http, port: 80, targetPort: 5678, nodePort: {node_port}}}]\n  selector: {{app: test}}\n\
         \x20 backends:\n    - {{name: v1, weight: 40, selector: {{version: v1}}}}\n\
         \x20   - {{name: v2, weight: 20, selector: {{version: v2}}}}\n\
         \x20   - {{name: v3, weight: 40, selector: {{version: v3}}}}\n"
    )
}

/// Host addresses of the test's own on the pod bridge, so that clients can differ by source
/// address; removed when dropped (and with the bridge by `host.sh down` in any case).
struct BridgeAddresses(Vec<String>);

impl BridgeAddresses {
    fn add(addresses: impl IntoIterator<Item = String>) -> BridgeAddresses {
        let mut added = BridgeAddresses(Vec::new());
        for address in addresses {
            let ok = Command::new("ip")
                .args(["addr", "add", &format!("{address}/32"), "dev", POD_BRIDGE])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "ip addr add {address}/32 dev {POD_BRIDGE} failed");
            added.0.push(address);
        }
        added
    }
}

impl Drop for BridgeAddresses {
    fn drop(&mut self) {
        for address in &self.0 {
            let _ = Command::new("ip").args(["addr", "del", &format!("{address}/32"), "dev", POD_BRIDGE]).status();
        }
    }
}

/// `spec.service` and `spec.sessionAffinity` on a real kube-proxy and nginx: a NodePort
/// Balancer answers at the node's address, and its status says where. With `ClientIP`, every
/// request from one address lands on one backend (nginx's consistent hash of the client
/// address), where the same Balancer without affinity spreads that address 40/20/40; and
/// distinct client addresses do not all land on the same backend, so the hash does see them.
async fn a_node_port_balancer_with_client_ip_affinity_keeps_each_client_on_one_backend(world: &mut World) {
    // The walkthrough's echo Deployments are still up (scenario 3 only took v3 out of its Balancer).
    let balancers = [("sticky", 30080, "ClientIP"), ("spread", 30081, "None")];
    for (name, node_port, affinity) in balancers {
        kubectl(world, &["apply", "-f", "-"], Some(&node_port_balancer(name, node_port, affinity)));
    }
    for (name, node_port, _) in balancers {
        let status = wait_ready_balancer(world, name, Duration::from_secs(120)).await;
        let front = front_ip(world, name).await;
        assert_eq!(status["nodePorts"], json!([{"port": 80, "protocol": "TCP", "nodePort": node_port}]), "{status}");
        assert_eq!(status["addresses"], json!([{"type": "IPAddress", "value": front}]), "{status}");
        let address = format!("{NODE_IP}:{node_port}");
        eventually(&format!("{name} answering at {address}"), Duration::from_secs(30), || async {
            one_request(&address).await.ok()
        })
        .await;
    }
    let weights = [("hello world v1", 40), ("hello world v2", 20), ("hello world v3", 40)];

    // One client (the node's own address), no affinity: the weights.
    let spread = split(NODE_IP, 30081, 600).await;
    println!("node: 600 requests from {NODE_IP} to {NODE_IP}:30081 without affinity: {spread:?}");
    assert_eq!(spread.get("failed"), None, "every request answered: {spread:?}");
    assert_shares(&spread, &weights, 6.0);
    // The same client with ClientIP: one backend.
    let sticky = split(NODE_IP, 30080, 60).await;
    println!("node: 60 requests from {NODE_IP} to {NODE_IP}:30080 with ClientIP: {sticky:?}");
    assert_eq!(sticky.get("failed"), None, "every request answered: {sticky:?}");
    assert_eq!(sticky.len(), 1, "every request from one address on one backend: {sticky:?}");

    // Twelve more clients, from addresses at the top of the pod subnet that no pod holds.
    let sources: Vec<String> = (240..252).map(|i| format!("10.244.0.{i}")).collect();
    let pods: Api<Pod> = Api::all(world.admin.clone());
    let taken: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items
        .into_iter()
        .filter_map(|p| p.status?.pod_ip)
        .filter(|ip| sources.contains(ip))
        .collect();
    assert!(taken.is_empty(), "pods hold {taken:?}");
    let clients = BridgeAddresses::add(sources);
    let address = format!("{NODE_IP}:30080");
    let mut landed = BTreeMap::new();
    for source in &clients.0 {
        let mut answers = BTreeSet::new();
        for _ in 0..5 {
            answers.insert(one_request_from(Some(source), &address).await.unwrap_or_else(|e| format!("failed: {e}")));
        }
        assert_eq!(answers.len(), 1, "5 requests from {source} on one backend: {answers:?}");
        assert!(!answers.iter().any(|a| a.starts_with("failed")), "from {source}: {answers:?}");
        landed.insert(source.clone(), answers.pop_first().unwrap_or_default());
    }
    drop(clients);
    let mut per_backend: BTreeMap<&str, usize> = BTreeMap::new();
    for backend in landed.values() {
        *per_backend.entry(backend).or_default() += 1;
    }
    println!("node: 12 client addresses × 5 requests with ClientIP, clients per backend: {per_backend:?}");
    // Twelve addresses hashed onto one backend by chance: 2 × 0.4¹² + 0.2¹², about 3 in 100,000.
    assert!(per_backend.len() >= 2, "every client on one backend: does nginx see one address? {landed:?}");

    for (name, _, _) in balancers {
        kubectl(world, &["-n", NS, "delete", "balancer", name], None);
    }
}

// ---------------------------------------------------------------------------
// 4b. L4 settings: the PROXY protocol and a backup
// ---------------------------------------------------------------------------

/// Reads the PROXY protocol header a connection starts with, answers with the client address
/// in it (or `no-header`), and closes.
const PROXY_PROTOCOL_ECHO: &str = "import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('', 8080))
s.listen(64)
while True:
    c, _ = s.accept()
    c.settimeout(5)
    data = b''
    try:
        while b'\\r\\n' not in data and len(data) < 256:
            chunk = c.recv(256)
            if not chunk:
                break
            data += chunk
        words = data.split(b'\\r\\n')[0].split(b' ')
        c.sendall((words[2] if len(words) > 2 and words[0] == b'PROXY' else b'no-header') + b'\\n')
    except OSError:
        pass
    c.close()
";

/// Connects from inside a pod to `address:port`, prints the first line answered.
const ASK_ONCE: &str = "import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)
print(c.makefile().readline().strip())
";

/// `proxyProtocol: true`: a backend behind the proxy reads the client pod's own address from
/// the header nginx sends, not the proxy pod's.
async fn a_backend_behind_the_proxy_sees_the_client_pods_address(world: &mut World) {
    let backend = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "pp-echo", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "pp-echo"}},
            "template": {
                "metadata": {"labels": {"app": "pp-echo"}},
                "spec": {"securityContext": restricted_pod(), "containers": [{
                    "name": "echo", "image": BASE_IMAGE, "imagePullPolicy": "Never",
                    "securityContext": restricted_container(),
                    "command": ["python3", "-c", PROXY_PROTOCOL_ECHO],
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                }]},
            },
        },
    });
    kubectl(world, &["apply", "-f", "-"], Some(&backend.to_string()));
    let balancer = format!(
        "apiVersion: exposer.hliangzhao.io/v1beta1\nkind: Balancer\nmetadata:\n  name: pp\n  namespace: {NS}\n\
         spec:\n  ports:\n    - {{name: tcp, port: 80, targetPort: 8080, proxyProtocol: true}}\n\
         \x20 selector: {{app: pp-echo}}\n  backends:\n    - {{name: a, selector: {{app: pp-echo}}}}\n"
    );
    kubectl(world, &["apply", "-f", "-"], Some(&balancer));
    wait_available(world, NS, "pp-echo", 1).await;
    wait_ready_balancer(world, "pp", Duration::from_secs(120)).await;
    let front = front_ip(world, "pp").await;
    // The client: a pod that is neither the proxy nor the backend (the UDP scenario's echo).
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let client = pods.list(&ListParams::default().labels("app=udp-echo,version=u1")).await.expect("pods");
    let client = client.items.into_iter().next().expect("the u1 echo pod");
    let (name, ip) = (client.metadata.name.clone().unwrap_or_default(), client.status.and_then(|s| s.pod_ip));
    let ip = ip.expect("a pod IP");
    let args = ["-n", NS, "exec", &name, "--", "python3", "-c", ASK_ONCE, &front, "80"];
    let seen = eventually("an answer through the PROXY protocol Balancer", Duration::from_secs(30), || async {
        let (ok, out, _) = world.plane.kubectl("admin", &args, None);
        ok.then(|| out.trim().to_string()).filter(|out| !out.is_empty())
    })
    .await;
    println!("node: the backend read {seen:?} from the PROXY protocol header; the client pod is {ip}");
    assert_eq!(seen, ip, "the client pod's address, not the proxy's");
    kubectl(world, &["-n", NS, "delete", "balancer", "pp"], None);
    kubectl(world, &["-n", NS, "delete", "deployment", "pp-echo"], None);
}

/// The answers `load`'s clients got during the next `window`.
async fn answers_within(load: &Load, window: Duration) -> BTreeMap<String, usize> {
    let before = load.answers();
    tokio::time::sleep(window).await;
    let after = load.answers();
    after
        .iter()
        .map(|(answer, n)| (answer.clone(), n - before.get(answer).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// A Balancer whose only primary, v1, is scaled to 0 under load: every connection goes to the
/// backup, v3, with none failed, and back to v1 once it returns.
async fn with_every_primary_scaled_to_0_the_backup_serves_without_a_failed_request(world: &mut World) {
    let balancer = format!(
        "apiVersion: exposer.hliangzhao.io/v1beta1\nkind: Balancer\nmetadata:\n  name: spare\n  namespace: {NS}\n\
         spec:\n  ports:\n    - {{port: 80, targetPort: 5678}}\n  selector: {{app: test}}\n  backends:\n\
         \x20   - {{name: v1, selector: {{version: v1}}}}\n    - {{name: v3, selector: {{version: v3}}, backup: true}}\n"
    );
    kubectl(world, &["apply", "-f", "-"], Some(&balancer));
    wait_ready_balancer(world, "spare", Duration::from_secs(120)).await;
    wait_backends(world, "spare", &[1, 1], &[100, 0], "True", Duration::from_secs(30)).await;
    let front = front_ip(world, "spare").await;
    eventually("the spare Balancer answering", Duration::from_secs(30), || async {
        (one_request(&format!("{front}:80")).await.ok()? == "hello world v1").then_some(())
    })
    .await;
    let load = Load::start(format!("{front}:80"), 4);
    let primary = answers_within(&load, Duration::from_secs(3)).await;
    println!("node: 3 s with the primary up: {primary:?}");
    assert_eq!(primary.keys().collect::<Vec<_>>(), ["hello world v1"], "the backup waits");

    let v1 = leaving(world, "app=test,version=v1", "v1's pod").await;
    kubectl(world, &["-n", NS, "scale", "deployment/echo-v1", "--replicas=0"], None);
    wait_backends(world, "spare", &[0, 1], &[0, 100], "False", Duration::from_secs(30)).await;
    v1.gone();
    let backup = answers_within(&load, Duration::from_secs(3)).await;
    println!("node: 3 s with v1 scaled to 0: {backup:?}");
    assert_eq!(backup.keys().collect::<Vec<_>>(), ["hello world v3"], "the backup takes every connection");

    kubectl(world, &["-n", NS, "scale", "deployment/echo-v1", "--replicas=1"], None);
    wait_available(world, NS, "echo-v1", 1).await;
    wait_backends(world, "spare", &[1, 1], &[100, 0], "True", Duration::from_secs(30)).await;
    // nginx tries v1 again once its failTimeout (10 s) since the last refusal is over.
    let back = Instant::now();
    let mut recovered = BTreeMap::new();
    while back.elapsed() < Duration::from_secs(30) {
        recovered = answers_within(&load, Duration::from_secs(3)).await;
        if recovered.keys().collect::<Vec<_>>() == ["hello world v1"] {
            break;
        }
    }
    println!(
        "node: v1 back, all its connections again {:.1} s after it was ready: {recovered:?}",
        back.elapsed().as_secs_f64()
    );
    assert_eq!(recovered.keys().collect::<Vec<_>>(), ["hello world v1"], "back to the primary");
    let (sent, failures) = load.finish().await;
    println!("node: {sent} requests while the primary went to 0 pods and back, {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {sent} failed: {:?}", failures.len(), &failures[..failures.len().min(10)]);
    kubectl(world, &["-n", NS, "delete", "balancer", "spare"], None);
}

// ---------------------------------------------------------------------------
// 5. Leader failover in the cluster
// ---------------------------------------------------------------------------

/// The pod holding the leader Lease (identities are `<pod name>_<process>`).
async fn lease_holder(world: &World) -> Option<String> {
    let identity = lease_identity(world).await?;
    Some(identity.rsplit_once('_').map_or(identity.as_str(), |(pod, _)| pod).to_string())
}

/// The whole identity holding the leader Lease: `<pod name>_<random>`, new for every process.
async fn lease_identity(world: &World) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(world.admin.clone(), OPERATOR_NS);
    leases.get("balancer-leader").await.ok()?.spec?.holder_identity.filter(|h| !h.is_empty())
}

async fn the_other_replica_takes_over_when_the_leader_pod_is_deleted(world: &mut World) {
    let leader = eventually("a leader", Duration::from_secs(30), || lease_holder(world)).await;
    // Balancer writes go through the webhooks all along.
    let applies = Applies::start(world, "failover-probe");
    let deleted = Instant::now();
    kubectl(world, &["-n", OPERATOR_NS, "delete", "pod", &leader, "--wait=false"], None);
    let successor = eventually("a new leader", Duration::from_secs(40), || async {
        lease_holder(world).await.filter(|holder| *holder != leader)
    })
    .await;
    let took = deleted.elapsed();
    println!("node: {successor} took the Lease {:.1} s after {leader} was deleted", took.as_secs_f64());
    assert!(took <= Duration::from_secs(20), "the Lease lasts 15 s; the new leader took {took:?}");

    // The new leader reconciles a change.
    patch_balancer(world, SAMPLE, json!([{"op": "replace", "path": "/spec/backends/1/weight", "value": 30}]));
    eventually("the new leader applies the change", Duration::from_secs(60), || async {
        proxy_conf(world, SAMPLE).await?.contains("weight=30 ").then_some(())
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
fn probe_balancer(name: &str, weight: u32, write: usize) -> String {
    format!(
        "apiVersion: exposer.hliangzhao.io/v1alpha1\nkind: Balancer\nmetadata:\n  name: {name}\n  namespace: {NS}\n\
         \x20 labels: {{write: \"{write}\"}}\n\
         spec:\n  ports: [{{port: 8080}}]\n  selector: {{app: nothing}}\n  backends: [{{name: a, weight: {weight}, selector: {{v: a}}}}]\n"
    )
}

/// `kubectl apply` of a small v1alpha1 Balancer every 200 ms, from a thread, through the
/// webhooks (mutating, validating, conversion), until finished. Each apply changes a label,
/// not the spec, so that it does not roll the Balancer's proxy every 200 ms.
struct Applies {
    name: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    writer: Option<std::thread::JoinHandle<(usize, Vec<String>)>>,
}

impl Applies {
    fn start(world: &World, name: &str) -> Applies {
        let kubeconfig = world.plane.kubeconfig("admin");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, balancer) = (stop.clone(), name.to_string());
        let writer = std::thread::spawn(move || {
            let (mut writes, mut failures) = (0, Vec::new());
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let yaml = probe_balancer(&balancer, 1, writes);
                writes += 1;
                if let Err(e) = cluster_kubectl(&kubeconfig, &["apply", "-f", "-"], &yaml) {
                    failures.push(e);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            (writes, failures)
        });
        Applies { name: name.to_string(), stop, writer: Some(writer) }
    }

    /// Stops the writer and deletes its Balancer: how many applies there were, and every failure.
    fn finish(mut self, world: &World) -> (usize, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let result = self.writer.take().map(|w| w.join().expect("the writer thread")).unwrap_or_default();
        kubectl(world, &["-n", NS, "delete", "balancer", &self.name, "--ignore-not-found"], None);
        result
    }
}

/// A scenario that failed stops the writer too.
impl Drop for Applies {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------
// 5b. Faults: the API server restarted, the leader killed
// ---------------------------------------------------------------------------

/// Sets the weights of the sample's two backends, retrying while the API server cannot take it.
async fn set_weights(world: &World, v1: u32, v2: u32) {
    let patch = json!([
        {"op": "replace", "path": "/spec/backends/0/weight", "value": v1},
        {"op": "replace", "path": "/spec/backends/1/weight", "value": v2},
    ])
    .to_string();
    let args = ["-n", NS, "patch", "balancer", SAMPLE, "--type=json", "-p", &patch];
    eventually("the weight change accepted", Duration::from_secs(30), || async {
        world.plane.kubectl("admin", &args, None).0.then_some(())
    })
    .await;
}

/// Waits until the sample's proxy configuration has the weights `v1` and `v2`.
async fn configured_weights(world: &World, v1: u32, v2: u32, timeout: Duration) {
    eventually(&format!("the proxy configured with weights {v1}/{v2}"), timeout, || async {
        let conf = proxy_conf(world, SAMPLE).await?;
        (conf.contains(&format!("weight={v1} ")) && conf.contains(&format!("weight={v2} "))).then_some(())
    })
    .await;
}

/// The `nginx.conf` in Balancer `balancer`'s proxy ConfigMap, if it can be read.
async fn proxy_conf(world: &World, balancer: &str) -> Option<String> {
    let config_maps: Api<ConfigMap> = Api::namespaced(world.admin.clone(), NS);
    config_maps.get(&format!("{balancer}-proxy-configmap")).await.ok()?.data?.remove("nginx.conf")
}

/// Once the change is Ready, 1,200 requests split by the new weights. Right after an API server
/// restart kube-proxy may still route the front Service by its old endpoints until its own
/// watch is back (client-go's reflector waits up to 30 s between attempts): the split is
/// measured again, each second, for up to 60 s, the time it took is printed, and a failure
/// prints the proxy pods' configuration and the Services' endpoints.
async fn weights_on_the_wire(world: &World, v1: u32, v2: u32) {
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

/// The proxy serves on while the API server is away (SIGKILL, 15 s); once it is back, a weight
/// change reaches the wire, and no client request fails all along.
async fn a_change_after_an_api_server_restart_reaches_the_wire_without_a_failed_request(world: &mut World) {
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
    println!(
        "node: API server back: the change accepted after {:.1} s, reconciled after {:.1} s, on the wire after {:.1} s",
        accepted.as_secs_f64(),
        reconciled.as_secs_f64(),
        back.elapsed().as_secs_f64()
    );
    // Whether the kubelet's ConfigMap cache was behind (see proxy::nginx::entrypoint).
    let selector = format!("balancer.exposer.hliangzhao.io/balancer-name={SAMPLE}");
    let args = ["-n", NS, "logs", "-l", &selector, "-c", "nginx", "--tail=-1"];
    let (_, logs, _) = world.plane.kubectl("admin", &args, None);
    let waited = logs.lines().filter(|l| l.contains("waiting for the kubelet to mount")).count();
    println!("node: proxy pods that waited for the kubelet to mount their nginx.conf: {waited}");
    let (sent, failures) = load.finish().await;
    println!("node: {sent} requests through the restart ({during} while it was down), {} failed", failures.len());
    assert!(during > 0, "no request was answered while the API server was down");
    assert!(failures.is_empty(), "{} of {sent} failed: {:?}", failures.len(), &failures[..failures.len().min(10)]);
}

/// The host pid of the operator process in `pod` (its container's process, seen from the host).
fn operator_pid(pod: &str) -> Option<u32> {
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
async fn the_leader_killed_in_the_middle_of_a_change_is_finished_by_a_new_leader(world: &mut World) {
    use kube::api::{Patch, PatchParams};
    let killed_identity = eventually("a leader", Duration::from_secs(30), || lease_identity(world)).await;
    let leader = eventually("a leader", Duration::from_secs(30), || lease_holder(world)).await;
    let pid = operator_pid(&leader).unwrap_or_else(|| panic!("no balancer process for pod {leader} on the host"));
    let restarted_before = operator_pod_restarts(world).await.get(&leader).copied().unwrap_or(0);
    let load = Load::start(format!("{}:80", front_ip(world, SAMPLE).await), 2);
    let balancers: Api<kube::api::DynamicObject> = Api::namespaced_with(world.admin.clone(), NS, &balancer_resource());
    let change = json!([
        {"op": "replace", "path": "/spec/backends/0/weight", "value": 20},
        {"op": "replace", "path": "/spec/backends/1/weight", "value": 80},
    ]);
    let patch: json_patch::Patch = serde_json::from_value(change).expect("a JSON patch");
    balancers.patch(SAMPLE, &PatchParams::default(), &Patch::<()>::Json(patch)).await.expect("the weight change");
    let status = Command::new("kill").args(["-KILL", &pid.to_string()]).status().expect("kill runs");
    assert!(status.success(), "kill -KILL {pid}");
    let killed = Instant::now();
    let written_first = proxy_conf(world, SAMPLE).await.is_some_and(|c| c.contains("weight=20 "));
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
    let (sent, failures) = load.finish().await;
    println!("node: {sent} requests through the leader's kill, {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {sent} failed: {:?}", failures.len(), &failures[..failures.len().min(10)]);
    eventually("the killed container restarted", Duration::from_secs(60), || async {
        let restarts = operator_pod_restarts(world).await.get(&leader).copied().unwrap_or(0);
        (restarts == restarted_before + 1).then_some(())
    })
    .await;
    wait_available(world, OPERATOR_NS, "balancer", 2).await;
}

/// `kubectl apply` from a plain thread: Ok, or the error output.
fn cluster_kubectl(kubeconfig: &Path, args: &[&str], stdin: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    child.stdin.take().map(|mut s| s.write_all(stdin.as_bytes()));
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).into_owned()) }
}

// ---------------------------------------------------------------------------
// 6. Certificate rotation
// ---------------------------------------------------------------------------

/// The webhook's TLS Secret holding the pair in `dir`, as YAML to apply (create or replace).
fn webhook_secret(world: &World, dir: &Path) -> String {
    let cert = format!("--cert={}", dir.join("tls.crt").display());
    let key = format!("--key={}", dir.join("tls.key").display());
    let args = ["-n", OPERATOR_NS, "create", "secret", "tls", "balancer-webhook-tls", &cert, &key];
    kubectl(world, &[&args[..], &["--dry-run=client", "-o", "yaml"]].concat(), None)
}

/// `balancer certs` into `dir`: the CA bundle (base64 PEM) it prints.
fn new_certificates(dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_balancer"))
        .args(["certs", "--out", &dir.display().to_string()])
        .args(["--dns-name", "balancer-webhook.balancer-system.svc"])
        .args(["--dns-name", "balancer-webhook.balancer-system.svc.cluster.local"])
        .output()
        .expect("balancer certs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn a_replaced_certificate_is_served_without_a_restart(world: &mut World) {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let before = operator_pod_restarts(world).await;
    let old_bundle = kubectl(
        world,
        &[
            "get",
            "validatingwebhookconfiguration",
            "balancer-validating",
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ],
        None,
    );
    let dir = tempfile::TempDir::new().expect("temp dir");
    let new_bundle = new_certificates(dir.path());
    let new_ca = String::from_utf8(b64.decode(&new_bundle).expect("base64")).expect("PEM");
    // Trust both CAs while the pods switch, as a rotation should.
    let both = [b64.decode(old_bundle.trim()).expect("base64"), new_ca.clone().into_bytes()].concat();
    patch_ca_bundle(world, &b64.encode(both));
    let secret = webhook_secret(world, dir.path());
    let replaced = Instant::now();
    kubectl(world, &["apply", "-f", "-"], Some(&secret));

    // Every replica, each at its own address, serves a certificate the new CA alone verifies.
    eventually("the new certificate on every replica", Duration::from_secs(120), || async {
        cert_manager::every_replica_presents(world, &new_ca, None).await.then_some(())
    })
    .await;
    println!("node: new certificate served {:.1} s after the Secret was replaced", replaced.elapsed().as_secs_f64());
    assert_eq!(operator_pod_restarts(world).await, before, "no replica restarted");

    // The new CA alone, and writes go on.
    patch_ca_bundle(world, &new_bundle);
    let yaml =
        std::fs::read_to_string(repo("deploy/samples/balancer.yaml")).expect("sample").replace(SAMPLE, "rotated");
    eventually("a Balancer write after the rotation", Duration::from_secs(30), || async {
        world.plane.kubectl("admin", &["-n", NS, "apply", "-f", "-"], Some(&yaml)).0.then_some(())
    })
    .await;
    kubectl(world, &["-n", NS, "delete", "balancer", "rotated"], None);
}

/// Each running operator pod's name and container restarts (a pod still terminating, such as
/// the leader deleted in scenario 5, is left out).
async fn operator_pod_restarts(world: &World) -> BTreeMap<String, i32> {
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), OPERATOR_NS);
    let params = ListParams::default().labels("app.kubernetes.io/name=balancer");
    let list = pods.list(&params).await.expect("pods");
    list.items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |c| c.iter().map(|c| c.restart_count).sum());
            (p.name_any(), restarts)
        })
        .collect()
}

// ---------------------------------------------------------------------------
// 6b. Taking over from the Go operator
// ---------------------------------------------------------------------------

/// Someone else's hold on the leader Lease, renewed as a live leader renews it (a 3 s lease,
/// every second) until dropped; the replicas take it back once they have seen it unchanged for
/// 3 s. (A long lease taken once would keep them away for all of it.)
struct ForeignLease(tokio::task::JoinHandle<()>);

impl ForeignLease {
    async fn take(client: Client, holder: &'static str) -> ForeignLease {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        use kube::api::{Patch, PatchParams};
        let leases: Api<Lease> = Api::namespaced(client, OPERATOR_NS);
        let hold = move || {
            let spec = json!({"holderIdentity": holder, "leaseDurationSeconds": 3,
                              "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())});
            Patch::Merge(json!({ "spec": spec }))
        };
        leases.patch("balancer-leader", &PatchParams::default(), &hold()).await.expect("take the Lease");
        ForeignLease(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let _ = leases.patch("balancer-leader", &PatchParams::default(), &hold()).await;
            }
        }))
    }
}

impl Drop for ForeignLease {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The Go operator's children of a Balancer, as it leaves them (names, labels, controller
/// owner references to the Balancer's UID). Its proxy pods mount the ConfigMap at /etc/nginx,
/// as the Go operator's do; here that nginx.conf answers `go proxy` itself.
fn go_operator_children(name: &str, uid: &str, backends: &[&str]) -> String {
    let owner = json!([{"apiVersion": "exposer.hliangzhao.io/v1alpha1", "kind": "Balancer", "name": name,
                        "uid": uid, "controller": true, "blockOwnerDeletion": true}]);
    let labels = json!({"balancer.exposer.hliangzhao.io/balancer-name": name});
    let meta = |object: &str, labels: &Value| json!({"name": object, "namespace": GO_NS, "labels": labels, "ownerReferences": owner});
    let config_map = format!("{name}-proxy-configmap");
    let conf = "worker_processes 1;\nevents {}\nhttp {\n  access_log off;\n  server {\n    listen 80;\n    \
                location / { default_type text/plain; return 200 \"go proxy\\n\"; }\n  }\n}\n";
    let pod = json!({
        "containers": [{
            "name": "nginx",
            "image": BASE_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["nginx", "-e", "stderr", "-g", "daemon off;"],
            "ports": [{"containerPort": 80}],
            "readinessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 1},
            "volumeMounts": [{"name": "conf", "mountPath": "/etc/nginx"}],
        }],
        "volumes": [{"name": "conf", "configMap": {"name": config_map}}],
    });
    let deployment = json!({"replicas": 1, "selector": {"matchLabels": labels},
                            "template": {"metadata": {"labels": labels}, "spec": pod}});
    let front = json!({"selector": labels, "ports": [{"name": "http", "protocol": "TCP", "port": 80}]});
    let mut items = vec![
        json!({"apiVersion": "v1", "kind": "Service", "metadata": meta(name, &json!({})), "spec": front}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(&config_map, &json!({})),
               "data": {"nginx.conf": conf}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(&format!("{name}proxy"), &labels),
               "spec": deployment}),
    ];
    for backend in backends {
        let spec = json!({"selector": {"app": "test", "version": backend},
                          "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 5678}]});
        let metadata = meta(&format!("{name}-{backend}-backend"), &labels);
        items.push(json!({"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}));
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// docs/install.md's migration on a real kubelet and kube-proxy: a Balancer the Go operator ran
/// (rebuilt by hand while someone else holds the Lease, its proxy pods answering `go proxy`)
/// is taken over while clients send requests to its front Service without a pause, and not
/// one request fails: the answers move from the Go proxy to the backends through ours, and
/// the Go operator's Deployment and pods are gone by the end.
async fn a_go_operator_balancer_is_taken_over_without_a_failed_request(world: &mut World) {
    const NAME: &str = "legacy";
    let go_pods = format!("balancer.exposer.hliangzhao.io/balancer-name={NAME},!app.kubernetes.io/component");
    // The leader stops reconciling while someone else holds the Lease.
    let leader = eventually("a leader", Duration::from_secs(30), || lease_holder(world)).await;
    let step_downs = || {
        let logs = kubectl(world, &["-n", OPERATOR_NS, "logs", &leader], None);
        logs.matches("stopping reconciles").count()
    };
    let before = step_downs();
    let foreign = ForeignLease::take(world.admin.clone(), "go-operator").await;
    let taken = Instant::now();
    eventually(&format!("{leader} to step down"), Duration::from_secs(30), || async {
        (step_downs() > before).then_some(())
    })
    .await;
    println!("node: {leader} stopped reconciling {:.1} s after the Lease was taken", taken.elapsed().as_secs_f64());

    // The Go operator's Balancer: the walkthrough's, its children, and its status, in a
    // namespace of its own, with backends of its own: its proxy pods run as root.
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GO_NS}});
    kubectl(world, &["apply", "-f", "-"], Some(&namespace.to_string()));
    for version in ["v1", "v2", "v3"] {
        kubectl(world, &["apply", "-f", "-"], Some(&echo_backend_in(GO_NS, version)));
    }
    for version in ["v1", "v2", "v3"] {
        wait_available(world, GO_NS, &format!("echo-{version}"), 1).await;
    }
    // Through the conversion webhook: right after a CA rotation, the API server's handlers pick
    // up the CRD's new caBundle a moment apart, so writes are retried.
    let sample = std::fs::read_to_string(repo("deploy/samples/balancer.yaml")).expect("sample").replace(SAMPLE, NAME);
    eventually("the Go operator's Balancer created", Duration::from_secs(30), || async {
        world.plane.kubectl("admin", &["-n", GO_NS, "apply", "-f", "-"], Some(&sample)).0.then_some(())
    })
    .await;
    let alpha = kube::api::ApiResource::erase::<balancer::api::v1alpha1::Balancer>(&());
    let alpha: Api<kube::api::DynamicObject> = Api::namespaced_with(world.admin.clone(), GO_NS, &alpha);
    let uid = alpha.get(NAME).await.expect("the Balancer").metadata.uid.expect("a uid");
    kubectl(world, &["apply", "-f", "-"], Some(&go_operator_children(NAME, &uid, &["v1", "v2", "v3"])));
    let status = json!({"status": {"activeBackendsNum": 3, "obsoleteBackendsNum": 0}});
    let params = kube::api::PatchParams::default();
    eventually("the Go operator's status", Duration::from_secs(30), || async {
        alpha.patch_status(NAME, &params, &kube::api::Patch::Merge(&status)).await.ok()
    })
    .await;
    wait_available(world, GO_NS, &format!("{NAME}proxy"), 1).await;
    let front = service_ip(world, GO_NS, NAME).await;
    let address = format!("{front}:80");
    eventually("the Go proxy answering", Duration::from_secs(30), || async {
        (one_request(&address).await.ok()? == "go proxy").then_some(())
    })
    .await;
    let deployments: Api<Deployment> = Api::namespaced(world.admin.clone(), GO_NS);
    let ours = format!("{NAME}-proxy");
    assert!(deployments.get_opt(&ours).await.expect("get").is_none(), "reconciled while not leading");

    // Load from before the takeover until after the Go operator's pods are gone.
    let load = Load::start(address, 4);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_takeover = load.answers();
    let go_ips = pod_ips(world, GO_NS, &go_pods).await;
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), GO_NS);
    drop(foreign);
    let released = Instant::now();
    let kube_proxy_dropped = dropped_by_kube_proxy(go_ips, released);
    let replicas = operator_pods(world).await;
    eventually("an operator replica to lead", Duration::from_secs(45), || async {
        lease_holder(world).await.filter(|holder| replicas.contains(holder))
    })
    .await;
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(world.admin.clone(), GO_NS, &balancer_resource());
    // The condition's reasons, each with when it was first seen.
    let mut stages: Vec<(String, f64)> = Vec::new();
    while stages.last().map(|(r, _)| r.as_str()) != Some("Removed") {
        assert!(released.elapsed() < Duration::from_secs(120), "the takeover stalled at {stages:?}");
        let status = api.get(NAME).await.ok().and_then(|b| b.data.get("status").cloned()).unwrap_or_default();
        let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
        let reason = conditions.iter().find(|c| c["type"] == "GoOperatorProxy").and_then(|c| c["reason"].as_str());
        if let Some(reason) = reason.filter(|r| stages.last().map(|(s, _)| s.as_str()) != Some(r)) {
            stages.push((reason.to_string(), released.elapsed().as_secs_f64()));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let seen: Vec<String> = stages.iter().map(|(reason, at)| format!("{reason} at {at:.1} s")).collect();
    println!("node: GoOperatorProxy after the Lease was released: {}", seen.join(", "));
    // A request to a Go proxy pod after its deletion fails with "No route to host": kube-proxy
    // must drop the pods within the takeover's drain.
    let dropped = tokio::task::spawn_blocking(move || kube_proxy_dropped.join())
        .await
        .map_err(|e| e.to_string())
        .and_then(|joined| joined.map_err(|_| "the watch panicked".to_string()))
        .and_then(|dropped| dropped);
    match dropped {
        Ok(at) => println!("node: kube-proxy's rules dropped the Go proxy pods {at:.1} s after the Lease was released"),
        Err(why) => println!("node: when kube-proxy dropped the Go proxy pods is not known: {why}"),
    }
    assert_eq!(stages.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(), ["Serving", "Draining", "Removed"]);
    eventually("the Go operator's Deployment and pods gone", Duration::from_secs(60), || async {
        let deployment = deployments.get_opt(&format!("{NAME}proxy")).await.ok()?;
        let left = pods.list(&ListParams::default().labels(&go_pods)).await.ok()?.items;
        (deployment.is_none() && left.is_empty()).then_some(())
    })
    .await;
    let after_takeover = load.answers();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tally = load.answers.clone();
    let last_failure = load.last_failure.clone();
    let (sent, failures) = load.finish().await;
    let answers = tally.lock().expect("answers").clone();
    if let Some(at) = *last_failure.lock().expect("last failure") {
        let after = at.checked_duration_since(released).map(|d| d.as_secs_f64());
        println!("node: the last failed request {after:.1?} s after the Lease was released (None: before it)");
    }

    let backends = ["hello world v1", "hello world v2", "hello world v3"];
    let go = answers.get("go proxy").copied().unwrap_or(0);
    let through_ours: usize = backends.iter().filter_map(|b| answers.get(*b)).sum();
    let unexpected: BTreeMap<&String, &usize> =
        answers.iter().filter(|(a, _)| *a != "go proxy" && !backends.contains(&a.as_str())).collect();
    let failed = failures.len() + unexpected.values().copied().sum::<usize>();
    println!(
        "node: {sent} requests during the takeover, {failed} failed, {go} from the Go proxy, {through_ours} through ours"
    );
    assert!(failures.is_empty(), "{} of {sent} failed: {:?}", failures.len(), &failures[..failures.len().min(10)]);
    assert!(unexpected.is_empty(), "answers from neither proxy: {unexpected:?}");
    assert!(before_takeover.keys().eq(["go proxy"]), "before the takeover: {before_takeover:?}");
    // The last 3 s, after the Go operator's pods are gone: only backends, through our proxy.
    let last: BTreeMap<&String, usize> =
        answers.iter().map(|(a, n)| (a, n - after_takeover.get(a).unwrap_or(&0))).filter(|(_, n)| *n > 0).collect();
    assert!(!last.is_empty() && last.keys().all(|a| backends.contains(&a.as_str())), "at the end: {last:?}");
    let selector = kubectl(world, &["-n", GO_NS, "get", "service", NAME, "-o", "jsonpath={.spec.selector}"], None);
    assert!(selector.contains("\"app.kubernetes.io/component\":\"proxy\""), "the front Service selects {selector}");

    kubectl(world, &["-n", GO_NS, "delete", "balancer", NAME], None);
    kubectl(world, &["delete", "namespace", GO_NS, "--wait=false"], None);
}

// ---------------------------------------------------------------------------
// 7. Delete
// ---------------------------------------------------------------------------

async fn deleting_the_balancer_removes_every_child_and_pod(world: &mut World) {
    kubectl(world, &["-n", NS, "delete", "balancer", SAMPLE, "--wait=false"], None);
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

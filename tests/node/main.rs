//! The node suite: a real single-node cluster on this machine, and the operator
//! installed on it from `deploy/` as a user would.
//!
//! The control plane of the e2e suite (`tests/e2e/cluster.rs`), bound to the pod
//! bridge, plus containerd, the kubelet, kube-proxy and kube-scheduler, all built
//! from Debian (`tests/e2e/control-plane.sh --node`), with images built locally
//! and no registry (`tests/node/images.sh`). `tests/node/host.sh` fences the pod
//! network in: nothing leaves the machine, DNS queries included.
//!
//! Needs root. Runs when BALANCER_NODE_E2E=1 (as in CI), which makes it
//! mandatory; otherwise it prints one SKIPPED line.
//!
//! Version skew, bridged here and never in `deploy/`: Debian's Kubernetes is
//! v1.20, so the PodDisruptionBudget is applied as policy/v1beta1 (policy/v1 is
//! 1.21+) and the kubelet allows `net.ipv4.ip_unprivileged_port_start`, a safe
//! sysctl only from 1.22.

// Shared with the e2e suite, which uses all of it.
#[allow(dead_code)]
#[path = "../e2e/cluster.rs"]
mod cluster;
mod node;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use cluster::{ControlPlane, PlaneOptions};
use node::{Host, KUBERNETES_SERVICE_IP, NODE_IP, Node, SERVICE_CIDR};

const OPERATOR_NS: &str = "balancer-system";
const NS: &str = "default";
const SAMPLE: &str = "example-balancer";
/// The locally built images (`images.sh`).
const BASE_IMAGE: &str = "localhost/balancer-test-base:1";
const STREAM_MODULE: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// What the scenarios share, in drop order: the node, then the control plane, then the host.
struct World {
    node: Node,
    plane: ControlPlane,
    admin: Client,
    _host: Host,
}

type Scenario = for<'a> fn(&'a mut World) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => { vec![$((stringify!($name), (|w| Box::pin($name(w))) as Scenario)),*] };
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
    let tools = ["containerd", "ctr", "runc", "iptables", "conntrack", "kubectl", "ip"];
    let missing: Vec<&str> = tools
        .into_iter()
        .filter(|t| {
            Command::new("sh").args(["-c", &format!("command -v {t}")]).output().map_or(true, |o| !o.status.success())
        })
        .collect();
    (!missing.is_empty()).then(|| format!("missing tools: {} (apt-get install containerd runc iptables conntrack containernetworking-plugins mmdebstrap kubernetes-client)", missing.join(" ")))
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
    let assets = script_output("tests/e2e/control-plane.sh", &["--node"]);
    let images =
        script_output("tests/node/images.sh", &[&assets.display().to_string(), env!("CARGO_BIN_EXE_balancer")]);
    let state = std::env::var_os("BALANCER_NODE_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/balancer-node"));

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        let started = Instant::now();
        let host = Host::up(&state);
        let options = PlaneOptions {
            address: NODE_IP.into(),
            service_cidr: SERVICE_CIDR.into(),
            extra_sans: vec![KUBERNETES_SERVICE_IP.into(), "kubernetes.default.svc".into()],
            pods: true,
        };
        let plane = ControlPlane::start_with(&assets, &options).await;
        let node = Node::start(&host, &plane, &assets, &images).await;
        let admin = plane.client("admin").await;
        println!("node: Ready {:.1} s after start", started.elapsed().as_secs_f64());
        let mut world = World { node, plane, admin, _host: host };
        let all = scenarios![
            the_operator_installs_from_deploy_as_a_user_would,
            the_walkthrough_splits_traffic_by_weight,
            deleting_the_balancer_removes_every_child_and_pod,
        ];
        let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
        let last = match &filter {
            Some(f) => all.iter().rposition(|(name, _)| name.contains(f.as_str())).map_or(0, |i| i + 1),
            None => all.len(),
        };
        let (mut passed, mut failed) = (0, 0);
        for (name, scenario) in all.into_iter().take(last) {
            let began = Instant::now();
            match std::panic::AssertUnwindSafe(scenario(&mut world)).catch_unwind().await {
                Ok(()) => {
                    passed += 1;
                    println!("test {name} ... ok ({:.1} s)", began.elapsed().as_secs_f64());
                }
                Err(_) => {
                    failed += 1;
                    println!("test {name} ... FAILED");
                    diagnose(&world);
                    break;
                }
            }
        }
        println!("node: {passed} passed, {failed} failed, {:.0} s in all", started.elapsed().as_secs_f64());
        drop(world);
        if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
    })
}

/// What a failed scenario leaves to read: pods, events, and the logs of the operator and the node.
fn diagnose(world: &World) {
    for args in [
        &["get", "pods", "-A", "-o", "wide"][..],
        &["get", "events", "-A", "--sort-by=.lastTimestamp"][..],
        &["-n", OPERATOR_NS, "logs", "-l", "app.kubernetes.io/name=balancer", "--tail=20", "--prefix"][..],
    ] {
        let (_, out, err) = world.plane.kubectl("admin", args, None);
        println!("--- kubectl {}:\n{out}{err}", args.join(" "));
    }
    println!("--- kubelet:\n{}", world.node.log_tail("kubelet", 20));
}

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
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

/// A kustomization over `deploy/` with the locally built images, and the two v1.20 bridges.
fn test_kustomization(dir: &Path) {
    let deploy = repo("deploy");
    let text = format!(
        r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {deploy}
images:
  - name: balancer
    newName: localhost/balancer
    newTag: test
patches:
  # v1.20 serves PodDisruptionBudgets as policy/v1beta1 only.
  - target: {{kind: PodDisruptionBudget, name: balancer}}
    patch: |-
      - op: replace
        path: /apiVersion
        value: policy/v1beta1
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
        deploy = deploy.display()
    );
    std::fs::write(dir.join("kustomization.yaml"), text).expect("kustomization");
}

async fn the_operator_installs_from_deploy_as_a_user_would(world: &mut World) {
    // The README's manual-certificate path: everything but the cert-manager objects...
    let dir = tempfile::TempDir::new().expect("temp dir");
    test_kustomization(dir.path());
    let kustomization = dir.path().display().to_string();
    kubectl(
        world,
        &["apply", "-k", &kustomization, "-l", "balancer.exposer.hliangzhao.io/requires!=cert-manager"],
        None,
    );
    // ...then a certificate of our own, its Secret, and the CA in both webhook configurations.
    let certs = dir.path().join("certs");
    let out = Command::new(env!("CARGO_BIN_EXE_balancer"))
        .args(["certs", "--out", &certs.display().to_string()])
        .args(["--dns-name", "balancer-webhook.balancer-system.svc"])
        .args(["--dns-name", "balancer-webhook.balancer-system.svc.cluster.local"])
        .output()
        .expect("balancer certs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bundle = String::from_utf8_lossy(&out.stdout).trim().to_string();
    kubectl(
        world,
        &[
            "-n",
            OPERATOR_NS,
            "create",
            "secret",
            "tls",
            "balancer-webhook-tls",
            &format!("--cert={}", certs.join("tls.crt").display()),
            &format!("--key={}", certs.join("tls.key").display()),
        ],
        None,
    );
    patch_ca_bundle(world, &bundle);

    // Both replicas go Ready (their readiness waits for the caches, so the controller runs).
    let deployments: Api<Deployment> = Api::namespaced(world.admin.clone(), OPERATOR_NS);
    eventually("both operator replicas Ready", Duration::from_secs(120), || async {
        let d = deployments.get("balancer").await.ok()?;
        (d.status?.ready_replicas == Some(2)).then_some(())
    })
    .await;
    let pods = operator_pods(world).await;
    let leases: Api<Lease> = Api::namespaced(world.admin.clone(), OPERATOR_NS);
    let holder = eventually("a leader", Duration::from_secs(60), || async {
        leases.get("balancer-leader").await.ok()?.spec?.holder_identity
    })
    .await;
    assert!(pods.contains(&holder), "the Lease is held by {holder}, not one of {pods:?}");

    // The API server reaches the webhooks through their Service: a bad Balancer gets our message.
    let config = kubectl(world, &["get", "validatingwebhookconfiguration", "balancer-validating", "-o", "json"], None);
    let config: Value = serde_json::from_str(&config).expect("json");
    assert_eq!(config["webhooks"][0]["clientConfig"]["service"]["name"], "balancer-webhook", "{config}");
    assert!(config["webhooks"][0]["clientConfig"].get("url").is_none());
    let invalid = std::fs::read_to_string(repo("deploy/samples/invalid-balancer.yaml")).expect("sample");
    let (ok, out, err) = world.plane.kubectl("admin", &["apply", "-f", "-"], Some(&invalid));
    assert!(!ok, "the invalid sample was accepted: {out}");
    assert!(err.contains("admission webhook") && err.contains("duplicate port name"), "{err}");
}

fn patch_ca_bundle(world: &World, bundle: &str) {
    let patch = json!([{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}]).to_string();
    for config in
        ["mutatingwebhookconfiguration/balancer-mutating", "validatingwebhookconfiguration/balancer-validating"]
    {
        kubectl(world, &["patch", config, "--type=json", "-p", &patch], None);
    }
}

async fn operator_pods(world: &World) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), OPERATOR_NS);
    let params = ListParams::default().labels("app.kubernetes.io/name=balancer");
    pods.list(&params).await.expect("pods").items.iter().map(ResourceExt::name_any).collect()
}

// ---------------------------------------------------------------------------
// 2. The original walkthrough
// ---------------------------------------------------------------------------

/// An HTTP echo Deployment: nginx on 5678 answering `hello world <version>`.
fn echo_backend(version: &str) -> String {
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n  access_log off;\n  server {{\n    listen 5678;\n    \
         location / {{ default_type text/plain; return 200 \"hello world {version}\\n\"; }}\n  }}\n}}\n"
    );
    let config_map = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("echo-{version}"), "namespace": NS},
        "data": {"nginx.conf": conf},
    });
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": format!("echo-{version}"), "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "test", "version": version}},
            "template": {
                "metadata": {"labels": {"app": "test", "version": version}},
                "spec": {
                    "containers": [{
                        "name": "echo",
                        "image": BASE_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["nginx", "-c", "/etc/echo/nginx.conf", "-e", "stderr", "-g", "daemon off;"],
                        "ports": [{"containerPort": 5678}],
                        "readinessProbe": {"tcpSocket": {"port": 5678}, "periodSeconds": 1},
                        "volumeMounts": [{"name": "conf", "mountPath": "/etc/echo"}],
                    }],
                    "volumes": [{"name": "conf", "configMap": {"name": format!("echo-{version}")}}],
                },
            },
        },
    });
    json!({"apiVersion": "v1", "kind": "List", "items": [config_map, deployment]}).to_string()
}

async fn the_walkthrough_splits_traffic_by_weight(world: &mut World) {
    for version in ["v1", "v2", "v3"] {
        kubectl(world, &["apply", "-f", "-"], Some(&echo_backend(version)));
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

    let front = front_ip(world, SAMPLE).await;
    let counts = split(&front, 80, 3000).await;
    println!("node: 3000 requests through {front}:80: {counts:?}");
    assert_eq!(counts.get("failed"), None, "every request answered: {counts:?}");
    assert_shares(&counts, &[("hello world v1", 40), ("hello world v2", 20), ("hello world v3", 40)], 3.0);
}

/// Waits for `Ready=True` on a Balancer, and returns its status.
async fn wait_ready_balancer(world: &World, name: &str, timeout: Duration) -> Value {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(world.admin.clone(), NS, &balancer_resource());
    eventually(&format!("Balancer {name} Ready=True"), timeout, || async {
        let status = api.get(name).await.ok()?.data.get("status").cloned()?;
        let ready = status["conditions"].as_array()?.iter().any(|c| c["type"] == "Ready" && c["status"] == "True");
        ready.then_some(status)
    })
    .await
}

fn balancer_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::erase::<balancer::api::Balancer>(&())
}

async fn front_ip(world: &World, name: &str) -> String {
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    let service = services.get(name).await.expect("front Service");
    service.spec.and_then(|s| s.cluster_ip).expect("a cluster IP")
}

/// `requests` HTTP requests to `ip:port`, 16 at a time, each on its own connection:
/// how many got each answer ("failed" for a connection that got none).
async fn split(ip: &str, port: u16, requests: usize) -> BTreeMap<String, usize> {
    let address = format!("{ip}:{port}");
    let mut tasks = tokio::task::JoinSet::new();
    let per_task = requests / 16;
    for _ in 0..16 {
        let address = address.clone();
        tasks.spawn(async move {
            let mut answers = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                answers.push(one_request(&address).await.unwrap_or_else(|e| format!("failed: {e}")));
            }
            answers
        });
    }
    let mut counts = BTreeMap::new();
    for answer in tasks.join_all().await.into_iter().flatten() {
        let key = if answer.starts_with("failed") { "failed".to_string() } else { answer };
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

/// One `GET /` on a new connection: the body's first line.
async fn one_request(address: &str) -> Result<String, String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.map_err(|e| e.to_string())?;
        stream.write_all(b"GET / HTTP/1.0\r\nHost: balancer\r\n\r\n").await.map_err(|e| e.to_string())?;
        let mut reply = Vec::with_capacity(256);
        stream.read_to_end(&mut reply).await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&reply);
        let body = text.split("\r\n\r\n").nth(1).ok_or_else(|| format!("no body in {text:?}"))?;
        Ok(body.lines().next().unwrap_or_default().to_string())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange).await.map_err(|_| "timed out".to_string())?
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
    eventually("every child and proxy pod gone", Duration::from_secs(90), || async {
        let left = services.list(&params).await.ok()?.items.len()
            + config_maps.list(&params).await.ok()?.items.len()
            + deployments.list(&params).await.ok()?.items.len()
            + pods.list(&params).await.ok()?.items.len();
        (left == 0).then_some(())
    })
    .await;
}

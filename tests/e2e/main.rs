//! End-to-end against a real kube-apiserver, etcd and kube-controller-manager (envtest-style).
//!
//! One control plane serves the scenarios, in order, each reported as a test; the control-plane
//! outages (`faults.rs`) run beside them on control planes of their own, since they kill their
//! processes and spend their 3½ minutes mostly waiting.
//! Binaries come from KUBEBUILDER_ASSETS, or the Kubernetes release that
//! `tests/kubernetes/build.sh` builds from the Go module proxy and caches under
//! ~/.cache/balancer/kubernetes. Without them the suite is skipped with one
//! line, unless BALANCER_E2E=1 (as in CI), which makes it mandatory and builds them.

#[path = "../toolkit/mod.rs"]
mod toolkit;

mod audit;
mod crd;
mod faults;
mod garbage_collection;
mod gateway_api;
mod gateway_scale;
mod leader_election;
mod metrics;
mod operator;
mod rbac;
mod reconcile;
mod scale;
mod steady_state;
mod takeover;
mod unreadable;
mod versions;
mod webhook_down;
mod webhooks;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::toolkit::repo::repo_file;
use balancer::api::Balancer;
use base64::Engine;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use operator::Operator;
use serde_json::{Value, json};
use toolkit::cluster::{ControlPlane, OPERATOR, http_client};
use toolkit::runner::{self, Filter, eventually, scenarios};

use crate::audit::the_operator_calls_no_deprecated_api;
use crate::crd::crd_is_accepted_and_established;
use crate::garbage_collection::deleting_a_balancer_collects_its_children;
use crate::gateway_api::gateway_api_objects_read_through_the_generated_types;
use crate::leader_election::leader_election_hands_over;
use crate::metrics::metrics_need_a_token_allowed_to_get_them;
use crate::rbac::{
    operator_runs_with_only_the_shipped_rbac, the_admission_policy_holds_the_operator_to_the_proxy_identity,
    the_admission_policy_holds_the_operators_workloads,
};
use crate::reconcile::{
    a_balancer_is_exposed_by_node_ports_and_a_load_balancer, a_dropped_port_leaves_every_child,
    a_namesake_is_never_adopted, balancers_are_reconciled_into_children_and_status,
    each_backends_ready_endpoints_are_in_the_status,
};
use crate::steady_state::steady_state_makes_no_writes;
use crate::takeover::a_go_operator_balancer_is_taken_over_without_a_gap;
use crate::unreadable::an_unreadable_stored_balancer_is_reported_on_itself;
use crate::versions::versions_convert_and_the_proxy_scales;
use crate::webhook_down::webhook_down_blocks_writes_until_it_is_back;
use crate::webhooks::webhooks_are_called_by_the_api_server;

const NS: &str = "default";

const SAMPLE: &str = "example-balancer";

/// Shared state the scenarios build on, in order.
struct World {
    plane: ControlPlane,
    admin: Client,
    operators: Vec<Operator>,
}

/// The Kubernetes binaries: `KUBEBUILDER_ASSETS` when it holds them, else the release that
/// `tests/kubernetes/build.sh` caches, built here first when the suite is mandatory
/// (`BALANCER_E2E=1`).
fn assets() -> Option<PathBuf> {
    let holds = |dir: &PathBuf| dir.join("kube-apiserver").exists() && dir.join("etcd").exists();
    if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS").filter(|d| !d.is_empty()).map(PathBuf::from) {
        // Named on purpose (CI's floor run among them): never another release instead.
        assert!(holds(&dir), "KUBEBUILDER_ASSETS={} holds no kube-apiserver and etcd", dir.display());
        return Some(dir);
    }
    let mandatory = std::env::var("BALANCER_E2E").as_deref() == Ok("1");
    let script = crate::toolkit::repo::repo("tests/kubernetes/build.sh");
    let mut build = std::process::Command::new("bash");
    build.arg(&script);
    if !mandatory {
        build.arg("--cached");
    }
    let out = build.output().expect("bash runs");
    if !mandatory && !out.status.success() {
        return None;
    }
    assert!(out.status.success(), "build.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(assets) = assets() else {
        println!(
            "e2e: SKIPPED: no kube-apiserver/etcd found. Run `tests/kubernetes/build.sh` (or set KUBEBUILDER_ASSETS), \
             or set BALANCER_E2E=1 to build them and make the suite mandatory."
        );
        return ExitCode::SUCCESS;
    };
    toolkit::cluster::commands_first_on_path(&assets);
    if std::process::Command::new("kubectl").arg("version").arg("--client").output().is_err() {
        println!("e2e: FAILED: kubectl is required");
        return ExitCode::FAILURE;
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    if std::env::args().any(|a| a == "--ignored") {
        return runtime.block_on(benchmarks(&assets));
    }
    let outages = faults::Outages::start(&assets);
    runtime.block_on(async move {
        let mut world = World::start(&assets).await;
        match world.admin.apiserver_version().await {
            Ok(version) => println!("e2e: API server {} ({})", version.git_version, assets.display()),
            Err(e) => println!("e2e: API server version unknown: {e}"),
        }
        let all = scenarios![World:
            crd_is_accepted_and_established,
            operator_runs_with_only_the_shipped_rbac,
            the_admission_policy_holds_the_operator_to_the_proxy_identity,
            the_admission_policy_holds_the_operators_workloads,
            webhooks_are_called_by_the_api_server,
            balancers_are_reconciled_into_children_and_status,
            each_backends_ready_endpoints_are_in_the_status,
            a_namesake_is_never_adopted,
            a_dropped_port_leaves_every_child,
            a_balancer_is_exposed_by_node_ports_and_a_load_balancer,
            versions_convert_and_the_proxy_scales,
            steady_state_makes_no_writes,
            deleting_a_balancer_collects_its_children,
            leader_election_hands_over,
            a_go_operator_balancer_is_taken_over_without_a_gap,
            webhook_down_blocks_writes_until_it_is_back,
            metrics_need_a_token_allowed_to_get_them,
            an_unreadable_stored_balancer_is_reported_on_itself,
            gateway_api_objects_read_through_the_generated_types,
            the_operator_calls_no_deprecated_api,
        ];
        let (mut passed, mut failed) = runner::run(&mut world, all, Filter::RunsUpToTheNamed, diagnose).await;
        world.stop();
        let (outages_passed, outages_failed) = outages.finish();
        passed += outages_passed;
        failed += outages_failed;
        println!("e2e: {passed} passed, {failed} failed");
        if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
    })
}

/// The benchmarks: not tests, never run by default (`-- --ignored scale`). A filter that is a
/// benchmark's name selects that one alone (`scale` is not also `gateway_scale`); any other,
/// every benchmark whose name holds it; none, all of them, one after the other.
async fn benchmarks(assets: &Path) -> ExitCode {
    const BENCHMARKS: [&str; 2] = ["scale", "gateway_scale"];
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let selected: Vec<&str> = match filter.as_deref() {
        Some(name) if BENCHMARKS.contains(&name) => vec![name],
        Some(part) => BENCHMARKS.into_iter().filter(|b| b.contains(part)).collect(),
        None => BENCHMARKS.to_vec(),
    };
    if selected.is_empty() {
        println!("e2e: no benchmark matches {filter:?} (there are {BENCHMARKS:?})");
    }
    let mut result = ExitCode::SUCCESS;
    for benchmark in selected {
        let ran = match benchmark {
            "scale" => scale::run(assets).await,
            "gateway_scale" => gateway_scale::run(assets).await,
            other => unreachable!("no benchmark {other}"),
        };
        if ran != ExitCode::SUCCESS {
            result = ran;
        }
    }
    result
}

impl World {
    /// A control plane of its own, with no operator yet.
    async fn start(assets: &Path) -> World {
        let plane = ControlPlane::start(assets).await;
        let admin = plane.client("admin").await;
        World { plane, admin, operators: Vec::new() }
    }

    /// Operators first, then the control plane.
    fn stop(mut self) {
        self.operators.clear();
    }
}

/// After a failed scenario: the last lines of each operator's log and of the API server's.
fn diagnose(world: &World) {
    let tail =
        |log: String| log.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    for op in &world.operators {
        println!("--- last lines of {}:\n{}", op.name, tail(op.log(&world.plane)));
    }
    let apiserver = std::fs::read_to_string(world.plane.dir.path().join("kube-apiserver.log")).unwrap_or_default();
    println!("--- last lines of kube-apiserver:\n{}", tail(apiserver));
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text).expect("YAML").into_iter().filter(|d| !d.is_null()).collect()
}

fn as_list(items: Vec<Value>) -> String {
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

fn apply(world: &World, user: &str, json_or_yaml: &str) -> (bool, String) {
    let (ok, out, err) = world.plane.kubectl(user).run(&["apply", "-f", "-"], Some(json_or_yaml));
    (ok, format!("{out}{err}"))
}

/// A v1beta1 Balancer manifest: it needs no conversion, so it can be written while no operator runs.
fn balancer_yaml(name: &str, body: &str) -> String {
    balancer_yaml_at("v1beta1", name, body)
}

fn balancer_yaml_at(version: &str, name: &str, body: &str) -> String {
    format!(
        "apiVersion: exposer.hliangzhao.io/{version}\nkind: Balancer\nmetadata:\n  name: {name}\n  namespace: {NS}\n{body}"
    )
}

/// The sample's spec (deploy/samples/balancer.yaml, the Go project's v1alpha1 sample).
fn sample_spec_yaml() -> String {
    let sample = repo_file("deploy/samples/balancer.yaml");
    let at = sample.find("\nspec:").expect("the sample has a spec");
    sample[at + 1..].to_string()
}

/// Points the CRD's conversion webhook at `operator`, with the test CA as caBundle.
fn register_conversion(world: &World, operator: &Operator) {
    let bundle = base64::engine::general_purpose::STANDARD.encode(&world.plane.ca_pem);
    let client_config = json!({"url": operator.webhook_url("/convert"), "caBundle": bundle});
    let patch = json!([{"op": "replace", "path": "/spec/conversion/webhook/clientConfig", "value": client_config}]);
    let (ok, out, err) =
        world.plane.kubectl("admin").run(&["patch", "crd", CRD, "--type=json", "-p", &patch.to_string()], None);
    assert!(ok, "pointing the conversion webhook at {}: {out}{err}", operator.name);
}

/// Points the webhook configurations of deploy/ (and the CRD's conversion) at `operator`, with the
/// test CA as caBundle.
async fn register_webhooks(world: &World, operator: &Operator) {
    register_conversion(world, operator);
    let bundle = base64::engine::general_purpose::STANDARD.encode(&world.plane.ca_pem);
    let mut items = Vec::new();
    for mut doc in yaml_docs(&repo_file("deploy/webhook.yaml")) {
        doc["metadata"].as_object_mut().unwrap().remove("annotations");
        for hook in doc["webhooks"].as_array_mut().unwrap() {
            let path = hook["clientConfig"]["service"]["path"].as_str().unwrap().to_string();
            hook["clientConfig"] = json!({"url": operator.webhook_url(&path), "caBundle": bundle});
        }
        items.push(doc);
    }
    let (ok, out) = apply(world, "admin", &as_list(items));
    assert!(ok, "registering the webhooks failed: {out}");
}

/// Removes the admission webhook configurations of deploy/.
fn unregister_webhooks(world: &World) {
    for doc in yaml_docs(&repo_file("deploy/webhook.yaml")) {
        let target = format!("{}/{}", doc["kind"].as_str().unwrap(), doc["metadata"]["name"].as_str().unwrap());
        let (ok, out, err) = world.plane.kubectl("admin").run(&["delete", &target, "--ignore-not-found"], None);
        assert!(ok, "deleting {target}: {out}{err}");
    }
}

fn balancers(world: &World) -> Api<Balancer> {
    Api::namespaced(world.admin.clone(), NS)
}

/// The CRD as `balancer crd` prints it.
fn shipped_crd() -> String {
    let crd = std::process::Command::new(env!("CARGO_BIN_EXE_balancer")).arg("crd").output().unwrap();
    assert!(crd.status.success(), "balancer crd: {}", String::from_utf8_lossy(&crd.stderr));
    String::from_utf8(crd.stdout).unwrap()
}

fn wait_established(world: &World) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out, err) = world
            .plane
            .kubectl("admin")
            .run(&["wait", "--for=condition=Established", "--timeout=30s", &format!("crd/{CRD}")], None);
        // kubectl gives up at once on a CRD the API server has not given conditions yet.
        let too_early = err.contains(".status.conditions accessor error");
        if ok || !too_early || Instant::now() > deadline {
            assert!(ok, "CRD not Established: {out}{err}");
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `balancer crd` as shipped, Established.
fn install_shipped_crd(world: &World) {
    let (ok, out) = apply(world, "admin", &shipped_crd());
    assert!(ok, "the API server refused `balancer crd`: {out}");
    wait_established(world);
}

/// A Balancer stored by the release before v1beta1, read after the upgrade (scenario 2).
const LEGACY: &str = "legacy";

/// Binds the operator's token user to exactly deploy/rbac.yaml (in namespace balancer-system).
fn apply_shipped_rbac(world: &World) {
    let mut items = vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "balancer-system"}})];
    // Another build's RBAC goes with another build's binary (BALANCER_E2E_BINARY).
    let rbac = match std::env::var_os("BALANCER_E2E_RBAC") {
        Some(path) => std::fs::read_to_string(path).expect("BALANCER_E2E_RBAC is readable"),
        None => repo_file("deploy/rbac.yaml"),
    };
    for mut doc in yaml_docs(&rbac) {
        let kind = doc["kind"].as_str().unwrap().to_string();
        if ["ServiceAccount", "Role", "RoleBinding"].contains(&kind.as_str()) {
            doc["metadata"]["namespace"] = json!("balancer-system");
        }
        if kind.ends_with("Binding") {
            doc["subjects"] = json!([{"kind": "User", "name": OPERATOR.name, "apiGroup": "rbac.authorization.k8s.io"}]);
        }
        items.push(doc);
    }
    let (ok, out) = apply(world, "admin", &as_list(items));
    assert!(ok, "applying deploy/rbac.yaml failed: {out}");
}

/// Plays the kubelet for the proxy pods of `name`: binds them to a node and reports them Ready.
async fn run_proxy_pods(world: &World, name: &str) {
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let selector = format!("balancer.exposer.hliangzhao.io/balancer-name={name},app.kubernetes.io/component=proxy");
    for pod in pods.list(&ListParams::default().labels(&selector)).await.unwrap() {
        let pod_name = pod.name_any();
        if pod.spec.as_ref().and_then(|s| s.node_name.clone()).is_none() {
            let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod_name},
                                 "target": {"apiVersion": "v1", "kind": "Node", "name": "e2e-node"}});
            let _ =
                pods.create_subresource::<Value, Value>("binding", &pod_name, &PostParams::default(), &binding).await;
        }
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let ready = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
        let status = json!({"status": {"phase": "Running", "podIP": "10.244.0.10", "startTime": now,
            "conditions": [ready("Initialized"), ready("Ready"), ready("ContainersReady"), ready("PodScheduled")]}});
        let _ = pods.patch_status(&pod_name, &PatchParams::default(), &Patch::Merge(status)).await;
    }
}

fn ready_condition(balancer: &Balancer) -> Option<(String, String)> {
    let c = balancer.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone()))
}

async fn webhook_answers(world: &World, operator: &Operator) -> bool {
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "1", "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
                    "resource": {"group": "", "version": "v1", "resource": "configmaps"},
                    "operation": "CREATE", "userInfo": {}, "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}}});
    let client = http_client(&world.plane.ca_pem);
    match client.post(operator.webhook_url("/validate")).json(&review).send().await {
        Ok(r) => r.status().is_success(),
        Err(_) => false,
    }
}

async fn reconciled(world: &World, name: &str) {
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    eventually(&format!("Balancer {name} reconciled"), Duration::from_secs(30), || async {
        services.get_opt(name).await.ok().flatten()
    })
    .await;
}

const CRD: &str = "balancers.exposer.hliangzhao.io";

fn stored_crd(world: &World) -> Value {
    let (ok, out, err) = world.plane.kubectl("admin").run(&["get", "crd", CRD, "-o", "json"], None);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap()
}

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

mod faults;
mod operator;
mod scale;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use balancer::api::Balancer;
use base64::Engine;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use operator::Operator;
use toolkit::cluster::{ControlPlane, NOBODY, OPERATOR, SCRAPER, http_client};
use toolkit::runner::{self, Filter, eventually, scenarios};
use toolkit::wait::{self, balancer_until};

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
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kubernetes/build.sh");
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
        // The benchmarks: not tests, never run by default (`-- --ignored scale`).
        return runtime.block_on(scale::run(&assets));
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

/// Last, over every request of every scenario before it: the API server's audit log marks a
/// request to a deprecated API (core/v1 Endpoints, say, since v1.33), and the operator made none.
/// (The outages' operators run the same binary's calls, Leases and events among them.)
async fn the_operator_calls_no_deprecated_api(world: &mut World) {
    let events = world.plane.audit_events();
    let operators: Vec<&Value> = events.iter().filter(|e| e["user"]["username"] == OPERATOR.name).collect();
    assert!(operators.len() > 100, "the audit log holds {} events of the operator: is it written?", operators.len());
    // "VERB URI" of each request to an API the server marks deprecated.
    let deprecated: Vec<String> = operators
        .iter()
        .filter(|e| e["annotations"].get("k8s.io/deprecated").is_some())
        .map(|e| format!("{} {}", e["verb"].as_str().unwrap_or("?"), e["requestURI"].as_str().unwrap_or("?")))
        .collect();
    assert!(deprecated.is_empty(), "the operator called deprecated APIs:\n{}", deprecated.join("\n"));
}

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)).expect("repository file")
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

// ---------------------------------------------------------------------------
// 1. The CRD
// ---------------------------------------------------------------------------

/// The CRD as `balancer crd` prints it.
fn shipped_crd() -> String {
    let crd = std::process::Command::new(env!("CARGO_BIN_EXE_balancer")).arg("crd").output().unwrap();
    assert!(crd.status.success(), "balancer crd: {}", String::from_utf8_lossy(&crd.stderr));
    String::from_utf8(crd.stdout).unwrap()
}

/// The CRD of the release before v1beta1: v1alpha1 alone, stored as such, no conversion.
fn v1alpha1_only_crd() -> Value {
    let mut crd: Value = yaml_docs(&shipped_crd()).remove(0);
    let versions = crd["spec"]["versions"].as_array_mut().expect("versions");
    versions.retain(|v| v["name"] == "v1alpha1");
    versions[0]["storage"] = json!(true);
    let spec = crd["spec"].as_object_mut().expect("spec");
    spec.remove("conversion");
    crd["metadata"].as_object_mut().expect("metadata").remove("annotations");
    crd
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

async fn crd_is_accepted_and_established(world: &mut World) {
    // The release before: its CRD, and a Balancer stored as v1alpha1.
    let (ok, out) = apply(world, "admin", &v1alpha1_only_crd().to_string());
    assert!(ok, "the v1alpha1-only CRD: {out}");
    wait_established(world);
    let (ok, out) = apply(world, "admin", &balancer_yaml_at("v1alpha1", LEGACY, &sample_spec_yaml()));
    assert!(ok, "a Balancer under the v1alpha1-only CRD: {out}");

    // The upgrade: `balancer crd` as shipped (v1beta1 stored, conversion by webhook).
    install_shipped_crd(world);
    let stored = stored_crd(world);
    assert_eq!(stored["status"]["storedVersions"], json!(["v1alpha1", "v1beta1"]), "{stored:#}");

    // `kubectl explain` speaks to a user, in both versions, once the API server publishes the
    // new schema (its OpenAPI controller follows the CRD within seconds). kubectl wraps lines.
    let explain = |what: &str, version: &str| {
        let api_version = format!("--api-version=exposer.hliangzhao.io/{version}");
        let (_, out, err) = world.plane.kubectl("admin").run(&["explain", what, &api_version], None);
        format!("{out}{err}").split_whitespace().collect::<Vec<_>>().join(" ")
    };
    for version in ["v1beta1", "v1alpha1"] {
        let explained = eventually("kubectl explain to give the new schema", Duration::from_secs(30), || async {
            let out = explain("balancers", version);
            out.contains("A Balancer is a weighted TCP/UDP load balancer").then_some(out)
        })
        .await;
        assert!(explained.contains(&format!("{version} is")), "{explained}");
        let spec = explain("balancers.spec", version);
        assert!(spec.contains("A weighted TCP/UDP load balancer in front of a set of backends"), "{spec}");
    }
}

// ---------------------------------------------------------------------------
// 2. RBAC: the operator as a token user bound only to deploy/rbac.yaml
// ---------------------------------------------------------------------------

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

async fn operator_runs_with_only_the_shipped_rbac(world: &mut World) {
    apply_shipped_rbac(world);
    // The operator is Ready before its caches sync: listing Balancers as v1beta1 needs the
    // legacy one converted, by this very operator (in a cluster, through its Service, which
    // sends traffic to Ready pods only). Once the conversion points at it, the caches sync:
    // list and watch were allowed.
    let operator = Operator::start_ready(&world.plane, "operator-a", &[]).await;
    register_conversion(world, &operator);
    operator.wait_for_log(&world.plane, "controller caches synced").await;
    world.operators.push(operator);

    // The Balancer stored before the upgrade reads as v1beta1, and is reconciled.
    let legacy = eventually("the legacy Balancer reconciled", Duration::from_secs(30), || async {
        let b = balancers(world).get(LEGACY).await.ok()?;
        (b.status.as_ref()?.active_backends == 3).then_some(b)
    })
    .await;
    assert_eq!(legacy.spec.backends.len(), 3);
    balancers(world).delete(LEGACY, &DeleteParams::default()).await.expect("delete the legacy Balancer");
    let (ok, out, _) =
        world.plane.kubectl("admin").run(&["auth", "can-i", "get", "secrets", "--as", OPERATOR.name], None);
    assert!(!ok && out.trim() == "no", "the operator must not read Secrets");
}

// ---------------------------------------------------------------------------
// 3. Webhooks, called by the API server
// ---------------------------------------------------------------------------

async fn webhooks_are_called_by_the_api_server(world: &mut World) {
    register_webhooks(world, &world.operators[0]).await;
    let sample = repo_file("deploy/samples/balancer.yaml");
    // The API server caches webhook configurations briefly: retry the first apply.
    eventually("the sample to be accepted", Duration::from_secs(20), || async {
        let (ok, out) = apply(world, "admin", &sample);
        ok.then_some(()).or_else(|| {
            eprintln!("retrying: {out}");
            None
        })
    })
    .await;

    // Rules the schema cannot express reach our webhook, which reports them all with field paths.
    let bad = balancer_yaml(
        "bad",
        "spec:\n  ports:\n  - {name: http, port: 80}\n  - {name: http, port: 81}\n  selector: {app: test}\n  \
             backends:\n  - {name: v1, weight: 0, selector: {version: v1}}\n  - {name: V2, weight: 0, selector: {version: v2}}\n",
    );
    let (ok, out) = apply(world, "admin", &bad);
    assert!(!ok, "an invalid Balancer was accepted");
    // kubectl lists the causes of our denial one per line, as for the API server's own errors.
    for expected in [
        "The Balancer \"bad\" is invalid",
        "* spec.ports[1].name: duplicate port name \"http\" (also spec.ports[0].name)\n",
        "* spec.backends[1].name: must be a DNS-1123 label",
        "* spec.backends: the sum of weights must be greater than 0, got 0\n",
        "Warning: spec.backends[0].weight: weight 0 drains backend \"v1\"",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in: {out}");
    }
    // The invalid sample shows the webhook's messages through kubectl.
    let (ok, out) = apply(world, "admin", &repo_file("deploy/samples/invalid-balancer.yaml"));
    assert!(
        !ok && out.contains("The Balancer \"broken-balancer\" is invalid")
            && out.contains("* spec.ports[1].targetPort:"),
        "{out}"
    );
    // A bad weight is already refused by the CRD schema, before any webhook, also with its field path.
    let (ok, out) = apply(
        world,
        "admin",
        &balancer_yaml(
            "heavy",
            "spec:\n  ports: [{port: 80}]\n  backends: [{name: a, weight: 150, selector: {app: a}}]\n",
        ),
    );
    assert!(!ok && out.contains("spec.backends[0].weight"), "{out}");

    // Defaults are stored.
    let (ok, out) = apply(
        world,
        "admin",
        &balancer_yaml(
            "defaults",
            "spec:\n  ports: [{name: dns, port: 53}]\n  backends: [{name: a, selector: {app: dns}}]\n",
        ),
    );
    assert!(ok, "{out}");
    let stored = balancers(world).get("defaults").await.unwrap();
    let port = &stored.spec.ports[0];
    assert_eq!(port.protocol.as_deref(), Some("TCP"));
    assert_eq!(port.target_port, Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(53)));
    assert_eq!(stored.spec.backends[0].weight, Some(1));

    // An UPDATE that breaks a rule is refused too.
    let broken = balancer_yaml(
        "defaults",
        "spec:\n  ports: [{name: dns, port: 53}, {name: dns, port: 54}]\n  backends: [{name: a, selector: {app: dns}}]\n",
    );
    let (ok, out) = apply(world, "admin", &broken);
    assert!(!ok && out.contains("duplicate port name"), "{out}");
    balancers(world).delete("defaults", &DeleteParams::default()).await.unwrap();
}

// ---------------------------------------------------------------------------
// 4. Reconcile
// ---------------------------------------------------------------------------

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

async fn balancers_are_reconciled_into_children_and_status(world: &mut World) {
    let world: &World = world;
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(world.admin.clone(), NS);
    let deployments: Api<Deployment> = Api::namespaced(world.admin.clone(), NS);
    let uid = balancers(world).get(SAMPLE).await.unwrap().uid().unwrap();

    let names = ["example-balancer-v1-backend", "example-balancer-v2-backend", "example-balancer-v3-backend", SAMPLE];
    for name in names {
        let service = eventually(&format!("Service {name}"), Duration::from_secs(30), || async {
            services.get_opt(name).await.ok().flatten()
        })
        .await;
        let owner = &service.owner_references()[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller, owner.block_owner_deletion),
            (uid.as_str(), Some(true), Some(true))
        );
    }
    let config = eventually("the ConfigMap", Duration::from_secs(30), || async {
        config_maps.get_opt("example-balancer-proxy-configmap").await.ok().flatten()
    })
    .await;
    let conf = config.data.unwrap()["nginx.conf"].clone();
    let v2 = services.get("example-balancer-v2-backend").await.expect("v2 backend Service");
    let v2_ip = v2.spec.and_then(|s| s.cluster_ip).expect("a cluster IP");
    let v2_line = format!("server {v2_ip}:80 weight=20 max_fails=1 fail_timeout=10s;  # example-balancer-v2-backend");
    assert!(conf.contains(&v2_line), "{conf}");
    eventually("the Deployment", Duration::from_secs(30), || async {
        deployments.get_opt("example-balancer-proxy").await.ok().flatten()
    })
    .await;

    let status_reached = |want_ready: &'static str| {
        let api = balancers(world);
        move || {
            let api = api.clone();
            async move {
                let b = api.get(SAMPLE).await.ok()?;
                let s = b.status.as_ref()?;
                let (status, _) = ready_condition(&b)?;
                (s.active_backends == 3 && s.observed_generation == b.metadata.generation && status == want_ready)
                    .then_some(b)
            }
        }
    };
    let waiting = eventually("status active=3, Ready=False", Duration::from_secs(30), status_reached("False")).await;
    assert_eq!(ready_condition(&waiting).unwrap().1, "ProxyNotAvailable");
    if world.plane.has_controller_manager() {
        // With pods "running", the Deployment becomes available and the Balancer Ready.
        let api = balancers(world);
        eventually("Ready=True", Duration::from_secs(60), || {
            let api = api.clone();
            async move {
                run_proxy_pods(world, SAMPLE).await;
                let b = api.get(SAMPLE).await.ok()?;
                (ready_condition(&b)?.0 == "True").then_some(())
            }
        })
        .await;
    }
    // Every line of a reconcile names its Balancer (the guide's "Reading a reconcile's log").
    let span =
        format!("reconcile{{namespace=\"{NS}\" name=\"{SAMPLE}\"}}: balancer::controller::reconcile: reconciled");
    let log = world.operators.iter().map(|op| op.log(&world.plane)).collect::<String>();
    assert!(log.contains(&span), "no {span:?} in the operators' log:\n{log}");
    let (ok, out, err) = world.plane.kubectl("admin").run(&["get", "bal", SAMPLE], None);
    // Printer columns: a `[*]` path shows only its first value (v1, not v1,v2,v3).
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    // v1beta1's columns: Active, Ready-Replicas and Obsolete only with `-o wide` (priority 1).
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "PORTS", "BACKENDS", "ADDRESS", "READY", "BACKENDS-READY", "REPLICAS", "AGE"], "{out}");
    let ready = if world.plane.has_controller_manager() { "True" } else { "False" };
    let front = Api::<Service>::namespaced(world.admin.clone(), NS).get(SAMPLE).await.expect("the front Service");
    let cluster_ip = front.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
    assert!(
        ok && row.len() == 8 && row[..7] == [SAMPLE, "80", "v1", cluster_ip.as_str(), ready, "0/3", "1"],
        "printer columns: {out}{err}"
    );

    // Events were recorded on the Balancer: one for the six children, one for Ready.
    let events: Api<Event> = Api::namespaced(world.admin.clone(), NS);
    let recorded = eventually("the Created event", Duration::from_secs(10), || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let mine: Vec<Event> = list
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str()))
            .collect();
        mine.iter().any(|e| e.reason.as_deref() == Some("Created")).then_some(mine)
    })
    .await;
    assert!(recorded.iter().all(|e| e.reporting_controller.as_deref() == Some("balancer")));
    let created: Vec<&Event> = recorded.iter().filter(|e| e.reason.as_deref() == Some("Created")).collect();
    assert_eq!(created.len(), 1, "one Created event for all children: {created:#?}");
    let warned = recorded.iter().any(|e| e.reason.as_deref() == Some("ProxyNotAvailable"));
    assert!(!warned, "a new Balancer's first rollout is no warning: {recorded:#?}");
    let note = created[0].note.as_deref().unwrap_or_default();
    for child in [
        "Service example-balancer-v1-backend",
        "ConfigMap example-balancer-proxy-configmap",
        "Deployment example-balancer-proxy",
    ] {
        assert!(note.contains(child), "{child} missing from {note}");
    }

    // Removing a backend deletes its Service and updates nginx.conf and the status.
    let patch = json!({"spec": {"backends": [
            {"name": "v1", "weight": 40, "selector": {"version": "v1"}},
            {"name": "v3", "weight": 40, "selector": {"version": "v3"}}]}});
    balancers(world).patch(SAMPLE, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    // Only once the proxy has rolled out (the test plays the kubelet for the new pod).
    eventually("v2's Service to go", Duration::from_secs(30), || async {
        if world.plane.has_controller_manager() {
            run_proxy_pods(world, SAMPLE).await;
        }
        services.get_opt("example-balancer-v2-backend").await.ok()?.is_none().then_some(())
    })
    .await;
    eventually("nginx.conf without v2", Duration::from_secs(30), || async {
        let cm = config_maps.get("example-balancer-proxy-configmap").await.ok()?;
        (!cm.data?["nginx.conf"].contains("v2-backend")).then_some(())
    })
    .await;
    let api = balancers(world);
    eventually("status active=2", Duration::from_secs(30), || {
        let api = api.clone();
        async move {
            let b = api.get(SAMPLE).await.ok()?;
            let s = b.status?;
            (s.active_backends == 2 && s.obsolete_backends == 0 && s.observed_generation == b.metadata.generation)
                .then_some(())
        }
    })
    .await;

    // A deleted child comes back; so does a hand-edited ConfigMap.
    services.delete(SAMPLE, &DeleteParams::default()).await.unwrap();
    eventually("the front Service restored", Duration::from_secs(30), || async {
        services.get_opt(SAMPLE).await.ok().flatten().filter(|s| s.metadata.deletion_timestamp.is_none())
    })
    .await;
    let edit = json!({"data": {"nginx.conf": "events {}\n"}});
    config_maps.patch("example-balancer-proxy-configmap", &PatchParams::default(), &Patch::Merge(edit)).await.unwrap();
    eventually("the ConfigMap restored", Duration::from_secs(30), || async {
        let cm = config_maps.get("example-balancer-proxy-configmap").await.ok()?;
        cm.data?["nginx.conf"].contains("upstream port_80_tcp").then_some(())
    })
    .await;
}

/// A backend pod, bound and "running" as a kubelet would report it (the test plays the kubelet).
async fn run_backend_pod(world: &World, name: &str, labels: Value, ip: &str) {
    register_the_e2e_node(world).await;
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": "e2e-node", "automountServiceAccountToken": false,
                 "containers": [{"name": "app", "image": "app:e2e"}]}});
    pods.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.expect("a backend pod");
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let ready = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    let status = json!({"status": {"phase": "Running", "podIP": ip, "startTime": now,
        "conditions": [ready("Initialized"), ready("Ready"), ready("ContainersReady"), ready("PodScheduled")]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await.expect("the pod's status");
}

/// The Node object the test's pods are bound to. The EndpointSlice controller leaves out the
/// pods of a node it does not know (the old endpoints controller did not look).
async fn register_the_e2e_node(world: &World) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(world.admin.clone());
    if nodes.get_opt("e2e-node").await.expect("read the e2e node").is_none() {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "e2e-node"}});
        nodes.create(&PostParams::default(), &serde_json::from_value(node).unwrap()).await.expect("the e2e node");
    }
}

/// `status.backends` follows the backend Services' EndpointSlices, which the real
/// EndpointSlice controller writes: one pod per backend, then one backend's pod gone.
async fn each_backends_ready_endpoints_are_in_the_status(world: &mut World) {
    let world: &World = world;
    if !world.plane.has_controller_manager() {
        println!("e2e: no kube-controller-manager: no EndpointSlices to follow");
        return;
    }
    let name = "seen";
    let spec = "spec:\n  ports: [{port: 80}]\n  selector: {app: seen}\n  backends:\n\
                \x20   - {name: v1, weight: 40, selector: {version: v1}}\n\
                \x20   - {name: v2, weight: 20, selector: {version: v2}}\n\
                \x20   - {name: v3, weight: 40, selector: {version: v3}}\n";
    let (ok, out) = apply(world, "admin", &balancer_yaml(name, spec));
    assert!(ok, "{out}");
    for (i, version) in ["v1", "v2", "v3"].iter().enumerate() {
        let pod = format!("seen-{version}");
        run_backend_pod(world, &pod, json!({"app": "seen", "version": version}), &format!("10.244.9.{}", i + 1)).await;
    }
    let api = balancers(world);
    let seen = |what: &'static str, timeout: u64, ready: [i32; 3], shares: [i32; 3], available: &'static str| {
        let condition = wait::backends_show(&ready, &shares, available);
        let api = api.clone();
        async move {
            let balancer = balancer_until(&api, name, what, Duration::from_secs(timeout), condition).await;
            balancer.status.expect("a status")
        }
    };
    let status = seen("3 backends, 1 ready endpoint each", 30, [1, 1, 1], [40, 20, 40], "True").await;
    assert_eq!(status.backends_ready.as_deref(), Some("3/3"));
    let (ok, out, err) = world.plane.kubectl("admin").run(&["get", "bal", name, "-o", "wide"], None);
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert!(ok && header.contains(&"BACKENDS-READY") && header.contains(&"BACKENDS-AVAILABLE"), "{out}{err}");
    assert!(row.contains(&"3/3") && row.contains(&"True"), "{out}");

    // v2's pod goes: its endpoint leaves, and its share goes to the others.
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    pods.delete("seen-v2", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() }).await.unwrap();
    let started = Instant::now();
    let status = seen("v2 without endpoints", 15, [1, 0, 1], [50, 0, 50], "False").await;
    println!("e2e: v2's lost endpoint in the status after {:?}", started.elapsed());
    assert_eq!(status.backends_ready.as_deref(), Some("2/3"));
    let condition = status.conditions.iter().find(|c| c.type_ == "BackendsAvailable").unwrap();
    assert_eq!(condition.reason, "NoReadyEndpoints");
    assert!(condition.message.contains("v2") && !condition.message.contains("v1"), "{}", condition.message);

    run_backend_pod(world, "seen-v2", json!({"app": "seen", "version": "v2"}), "10.244.9.2").await;
    seen("v2 back", 15, [1, 1, 1], [40, 20, 40], "True").await;
    balancers(world).delete(name, &DeleteParams::default()).await.unwrap();
    for version in ["v1", "v2", "v3"] {
        let _ = pods.delete(&format!("seen-{version}"), &DeleteParams::default()).await;
    }
}

/// A name taken by a hand-made object: the create-only apply is refused by the real API server,
/// and the Balancer reports the conflict instead of adopting the object.
async fn a_namesake_is_never_adopted(world: &mut World) {
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    let mine = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "taken-a-backend", "namespace": NS},
        "spec": {"selector": {"app": "mine"}, "ports": [{"port": 8080}]}});
    services.create(&PostParams::default(), &serde_json::from_value(mine).unwrap()).await.unwrap();
    let (ok, out) = apply(
        world,
        "admin",
        &balancer_yaml("taken", "spec:\n  ports: [{port: 80}]\n  backends: [{name: a, selector: {app: a}}]\n"),
    );
    assert!(ok, "{out}");
    let api = balancers(world);
    let message = eventually("Ready=False Conflict", Duration::from_secs(30), || {
        let api = api.clone();
        async move {
            let b = api.get("taken").await.ok()?;
            let c = b.status?.conditions.into_iter().find(|c| c.type_ == "Ready")?;
            (c.reason == "Conflict").then_some(c.message)
        }
    })
    .await;
    assert!(message.contains("Service taken-a-backend already exists"), "{message}");
    let untouched = services.get("taken-a-backend").await.unwrap();
    assert!(untouched.owner_references().is_empty(), "adopted: {:?}", untouched.metadata);
    assert_eq!(untouched.spec.unwrap().selector, Some([("app".to_string(), "mine".to_string())].into()));
    api.delete("taken", &DeleteParams::default()).await.unwrap();
    services.delete("taken-a-backend", &DeleteParams::default()).await.unwrap();
}

/// Children are created with a POST, whose fields the API server records under an `Update`
/// entry; a field the Balancer later drops must still leave every child (the operator folds
/// that entry into its apply's before the first apply).
async fn a_dropped_port_leaves_every_child(world: &mut World) {
    let two_ports = "spec:\n  ports: [{name: http, port: 80}, {name: alt, port: 8080}]\n  \
                     backends: [{name: a, selector: {app: a}}]\n";
    let (ok, out) = apply(world, "admin", &balancer_yaml("dropped", two_ports));
    assert!(ok, "{out}");
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    let ports = |name: &'static str| {
        let services = services.clone();
        async move {
            let service = services.get_opt(name).await.ok()??;
            Some(service.spec?.ports?.iter().map(|p| p.port).collect::<Vec<_>>())
        }
    };
    for name in ["dropped", "dropped-a-backend"] {
        eventually(&format!("{name} with two ports"), Duration::from_secs(30), || async {
            (ports(name).await? == [80, 8080]).then_some(())
        })
        .await;
    }
    let one_port = "spec:\n  ports: [{name: http, port: 80}]\n  backends: [{name: a, selector: {app: a}}]\n";
    let (ok, out) = apply(world, "admin", &balancer_yaml("dropped", one_port));
    assert!(ok, "{out}");
    for name in ["dropped", "dropped-a-backend"] {
        eventually(&format!("{name} down to one port"), Duration::from_secs(30), || async {
            (ports(name).await? == [80]).then_some(())
        })
        .await;
    }
    let config_maps: Api<ConfigMap> = Api::namespaced(world.admin.clone(), NS);
    let conf = config_maps.get("dropped-proxy-configmap").await.unwrap().data.unwrap()["nginx.conf"].clone();
    assert!(!conf.contains("8080"), "{conf}");
    balancers(world).delete("dropped", &DeleteParams::default()).await.unwrap();
}

/// `spec.service`: node ports allocated (or chosen) by the API server and reported in the
/// status; a LoadBalancer's settings on the Service and its ingress as the Balancer's
/// address; back to ClusterIP without a trace.
async fn a_balancer_is_exposed_by_node_ports_and_a_load_balancer(world: &mut World) {
    const NAME: &str = "exposed";
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    let front = || async { services.get_opt(NAME).await.ok().flatten().and_then(|s| s.spec) };
    let status = || async { balancers(world).get_opt(NAME).await.ok().flatten().and_then(|b| b.status) };
    let ports = "  ports: [{name: http, port: 80, nodePort: 30080}, {name: dns, port: 53, protocol: UDP}]\n  \
                 backends: [{name: a, selector: {app: a}}]\n";

    // ClusterIP with a node port: the webhook names the field.
    let (ok, out) = apply(world, "admin", &balancer_yaml(NAME, &format!("spec:\n{ports}")));
    assert!(!ok && out.contains("spec.ports[0].nodePort: applies to type NodePort or LoadBalancer only"), "{out}");

    let node_port = format!("spec:\n  service: {{type: NodePort}}\n{ports}");
    let (ok, out) = apply(world, "admin", &balancer_yaml(NAME, &node_port));
    assert!(ok, "{out}");
    let (cluster_ip, allocated) =
        eventually("NodePort Service, ports in the status", Duration::from_secs(30), || async {
            let spec = front().await?;
            let node_ports: Vec<i32> = spec.ports?.iter().map(|p| p.node_port.unwrap_or(0)).collect();
            let status = status().await?;
            let reported: Vec<i32> = status.node_ports.iter().map(|p| p.node_port).collect();
            let ip = spec.cluster_ip?;
            let addresses: Vec<&str> = status.addresses.iter().map(|a| a.value.as_str()).collect();
            (spec.type_.as_deref() == Some("NodePort")
                && node_ports[0] == 30080
                && node_ports[1] > 0
                && reported == node_ports
                && addresses == [ip.as_str()])
            .then_some((ip, node_ports[1]))
        })
        .await;
    println!("e2e: NodePort {NAME}: cluster IP {cluster_ip}, node ports 30080 (chosen) and {allocated} (allocated)");

    let load_balancer = format!(
        "spec:\n  service:\n    type: LoadBalancer\n    externalTrafficPolicy: Local\n    \
         loadBalancerSourceRanges: [10.0.0.0/8]\n    annotations: {{example.com/lb-scheme: internal}}\n{ports}"
    );
    let (ok, out) = apply(world, "admin", &balancer_yaml(NAME, &load_balancer));
    assert!(ok, "{out}");
    eventually("LoadBalancer Service, no address while pending", Duration::from_secs(30), || async {
        let service = services.get_opt(NAME).await.ok().flatten()?;
        let annotation = service.annotations().get("example.com/lb-scheme").cloned();
        let spec = service.spec?;
        let status = status().await?;
        (spec.type_.as_deref() == Some("LoadBalancer")
            && spec.external_traffic_policy.as_deref() == Some("Local")
            && spec.load_balancer_source_ranges == Some(vec!["10.0.0.0/8".into()])
            && annotation.as_deref() == Some("internal")
            && status.addresses.is_empty()
            && status.node_ports.len() == 2)
            .then_some(())
    })
    .await;
    // What a cloud controller would do (a documentation address: nothing is sent to it).
    let ingress = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}});
    services.patch_status(NAME, &PatchParams::default(), &Patch::Merge(&ingress)).await.expect("ingress set");
    eventually("the ingress as the Balancer's address", Duration::from_secs(30), || async {
        let status = status().await?;
        (status.addresses.len() == 1 && status.addresses[0].value == "192.0.2.10").then_some(())
    })
    .await;
    let out = world.plane.kubectl("admin").ok(&["get", "bal", NAME]);
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    let address = header.iter().position(|h| *h == "ADDRESS").expect("an ADDRESS column");
    assert_eq!(row.get(address), Some(&"192.0.2.10"), "{out}");

    // Settings dropped from the spec leave the Service too (every one it asked for is still
    // there, so only the hash of the wanted Service tells the controller to apply it again).
    let (ok, out) =
        apply(world, "admin", &balancer_yaml(NAME, &format!("spec:\n  service: {{type: LoadBalancer}}\n{ports}")));
    assert!(ok, "{out}");
    eventually("the dropped LoadBalancer settings to go", Duration::from_secs(30), || async {
        let service = services.get_opt(NAME).await.ok().flatten()?;
        let annotated = service.annotations().contains_key("example.com/lb-scheme");
        let spec = service.spec?;
        let dropped =
            spec.load_balancer_source_ranges.is_none() && spec.external_traffic_policy.as_deref() == Some("Cluster");
        (spec.type_.as_deref() == Some("LoadBalancer") && !annotated && dropped).then_some(())
    })
    .await;

    // Back to ClusterIP: no node port, policy, range or annotation is left behind.
    let ports_only = "  ports: [{name: http, port: 80}, {name: dns, port: 53, protocol: UDP}]\n  \
                      backends: [{name: a, selector: {app: a}}]\n";
    let (ok, out) = apply(world, "admin", &balancer_yaml(NAME, &format!("spec:\n{ports_only}")));
    assert!(ok, "{out}");
    eventually("ClusterIP again, node ports gone", Duration::from_secs(30), || async {
        let service = services.get_opt(NAME).await.ok().flatten()?;
        let annotated = service.annotations().contains_key("example.com/lb-scheme");
        let spec = service.spec?;
        let status = status().await?;
        let node_ports = spec.ports?.iter().any(|p| p.node_port.is_some());
        (spec.type_.as_deref() == Some("ClusterIP")
            && !node_ports
            && !annotated
            && spec.load_balancer_source_ranges.is_none()
            && status.node_ports.is_empty()
            && status.addresses.first().map(|a| a.value.as_str()) == spec.cluster_ip.as_deref())
        .then_some(())
    })
    .await;
    balancers(world).delete(NAME, &DeleteParams::default()).await.unwrap();
}

// ---------------------------------------------------------------------------
// 4b. Two versions, conversion, and the scale subresource
// ---------------------------------------------------------------------------

const SCALED: &str = "scaled";

async fn versions_convert_and_the_proxy_scales(world: &mut World) {
    // Written as v1alpha1 (the Go project's manifest), read as v1beta1 with replicas defaulted.
    let manifest = balancer_yaml_at("v1alpha1", SCALED, &sample_spec_yaml());
    let (ok, out) = apply(world, "admin", &manifest);
    assert!(ok, "{out}");
    let stored = balancers(world).get(SCALED).await.expect("readable as v1beta1");
    assert_eq!(stored.spec.replicas, Some(1), "defaulted from --proxy-replicas");
    let alpha: Value = serde_json::from_str(&world.plane.kubectl("admin").ok(&[
        "get",
        "balancers.v1alpha1.exposer.hliangzhao.io",
        SCALED,
        "-n",
        NS,
        "-o",
        "json",
    ]))
    .unwrap();
    assert_eq!(alpha["apiVersion"], "exposer.hliangzhao.io/v1alpha1");
    assert_eq!(alpha["spec"].get("replicas"), None, "v1alpha1 has no replicas: {alpha:#}");

    // A v1beta1-only field survives the original v1alpha1 manifest applied again.
    let patch = Patch::Merge(json!({"spec": {"replicas": 2}}));
    balancers(world).patch(SCALED, &PatchParams::default(), &patch).await.expect("set replicas");
    let (ok, out) = apply(world, "admin", &manifest);
    assert!(ok, "{out}");
    assert_eq!(balancers(world).get(SCALED).await.unwrap().spec.replicas, Some(2), "replicas lost through v1alpha1");

    // `kubectl scale` reaches the proxy Deployment; the scale subresource tells the selector.
    world.plane.kubectl("admin").ok(&["scale", &format!("balancer/{SCALED}"), "-n", NS, "--replicas=3"]);
    let deployments: Api<Deployment> = Api::namespaced(world.admin.clone(), NS);
    let proxy = format!("{SCALED}-proxy");
    eventually("the proxy Deployment at 3 replicas", Duration::from_secs(30), || async {
        let d = deployments.get_opt(&proxy).await.ok().flatten()?;
        (d.spec?.replicas == Some(3)).then_some(())
    })
    .await;
    let scale_path = format!("/apis/exposer.hliangzhao.io/v1beta1/namespaces/{NS}/balancers/{SCALED}/scale");
    let selector = format!("app.kubernetes.io/component=proxy,balancer.exposer.hliangzhao.io/balancer-name={SCALED}");
    let scale = eventually("the scale subresource with the selector", Duration::from_secs(30), || async {
        let scale: Value =
            serde_json::from_str(&world.plane.kubectl("admin").ok(&["get", "--raw", &scale_path])).ok()?;
        (scale["status"]["selector"] == selector.as_str()).then_some(scale)
    })
    .await;
    assert_eq!(scale["spec"]["replicas"], 3, "{scale:#}");
    // More than one proxy pod: a PodDisruptionBudget (policy/v1).
    let budget = eventually("the proxy's PodDisruptionBudget", Duration::from_secs(30), || async {
        let (ok, out, _) = world.plane.kubectl("admin").run(&["get", "pdb", &proxy, "-n", NS, "-o", "json"], None);
        ok.then(|| serde_json::from_str::<Value>(&out).ok()).flatten()
    })
    .await;
    assert_eq!(budget["spec"]["maxUnavailable"], 1, "{budget:#}");
    assert_eq!(budget["metadata"]["ownerReferences"][0]["name"], SCALED);

    // A HorizontalPodAutoscaler may target a Balancer, and the HPA controller can read its scale.
    let hpa = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": SCALED, "namespace": NS},
        "spec": {"scaleTargetRef": {"apiVersion": "exposer.hliangzhao.io/v1beta1", "kind": "Balancer", "name": SCALED},
                 "minReplicas": 1, "maxReplicas": 5,
                 "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]}});
    let (ok, out) = apply(world, "admin", &hpa.to_string());
    assert!(ok, "an HPA targeting a Balancer: {out}");
    if world.plane.has_controller_manager() {
        eventually("the HPA to get the Balancer's scale", Duration::from_secs(60), || async {
            let hpa: Value = serde_json::from_str(&world.plane.kubectl("admin").ok(&[
                "get",
                "horizontalpodautoscalers.v2.autoscaling",
                SCALED,
                "-n",
                NS,
                "-o",
                "json",
            ]))
            .ok()?;
            let conditions = hpa["status"]["conditions"].as_array()?;
            conditions
                .iter()
                .any(|c| c["type"] == "AbleToScale" && c["status"] == "True" && c["reason"] == "SucceededGetScale")
                .then_some(())
        })
        .await;
    }
    world.plane.kubectl("admin").ok(&["delete", "horizontalpodautoscalers.v2.autoscaling", SCALED, "-n", NS]);
    // Back to one pod: the budget goes.
    world.plane.kubectl("admin").ok(&["scale", &format!("balancer/{SCALED}"), "-n", NS, "--replicas=1"]);
    eventually("the PodDisruptionBudget to go", Duration::from_secs(30), || async {
        let (ok, _, err) = world.plane.kubectl("admin").run(&["get", "pdb", &proxy, "-n", NS], None);
        (!ok && err.contains("NotFound")).then_some(())
    })
    .await;
    balancers(world).delete(SCALED, &DeleteParams::default()).await.expect("delete");
}

// ---------------------------------------------------------------------------
// 5. Steady state
// ---------------------------------------------------------------------------

async fn steady_state_makes_no_writes(world: &mut World) {
    // Let the previous scenario's changes settle, then watch a quiet window.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = world.plane.audit_events().len();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let events = world.plane.audit_events();
    let window = &events[before..];
    let operator: Vec<&Value> = window.iter().filter(|e| e["user"]["username"] == OPERATOR.name).collect();
    let writes: Vec<String> = operator
        .iter()
        .filter(|e| ["create", "update", "patch", "delete"].contains(&e["verb"].as_str().unwrap_or("")))
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect();
    assert!(writes.is_empty(), "the operator wrote during a quiet 30 s window: {writes:#?}");
    // The filter does see the operator: it wrote plenty before the window.
    let earlier_writes =
        events[..before].iter().filter(|e| e["user"]["username"] == OPERATOR.name && e["verb"] == "patch").count();
    assert!(earlier_writes > 0, "no operator requests in the audit log at all: is the user name right?");
    let forbidden: Vec<String> = events
        .iter()
        .filter(|e| e["user"]["username"] == OPERATOR.name && e["responseStatus"]["code"] == 403)
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect();
    assert!(forbidden.is_empty(), "the shipped RBAC forbade: {forbidden:#?}");
    println!("e2e: quiet window: {} requests from the operator, 0 writes", operator.len());
}

// ---------------------------------------------------------------------------
// 6. Garbage collection
// ---------------------------------------------------------------------------

async fn deleting_a_balancer_collects_its_children(world: &mut World) {
    if !world.plane.has_controller_manager() {
        println!("e2e: no kube-controller-manager: garbage collection not checked");
        return;
    }
    balancers(world).delete(SAMPLE, &DeleteParams::default()).await.unwrap();
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(world.admin.clone(), NS);
    let deployments: Api<Deployment> = Api::namespaced(world.admin.clone(), NS);
    let selector = format!("balancer.exposer.hliangzhao.io/balancer-name={SAMPLE}");
    eventually("every child garbage-collected", Duration::from_secs(60), || async {
        let lp = ListParams::default().labels(&selector);
        let left = services.list(&lp).await.ok()?.items.len()
            + config_maps.list(&lp).await.ok()?.items.len()
            + deployments.list(&lp).await.ok()?.items.len();
        (left == 0).then_some(())
    })
    .await;
}

// ---------------------------------------------------------------------------
// 7. Leader election
// ---------------------------------------------------------------------------

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

async fn leader_election_hands_over(world: &mut World) {
    for mut op in world.operators.drain(..) {
        op.stop();
    }
    let lease_flags = ["--leader-elect", "--lease-duration=6"];
    let b = Operator::start(&world.plane, "operator-b", &lease_flags).await;
    let c = Operator::start(&world.plane, "operator-c", &lease_flags).await;
    register_webhooks(world, &b).await;
    world.operators = vec![b, c];

    let leases: Api<Lease> = Api::namespaced(world.admin.clone(), "balancer-system");
    let holder = eventually("a Lease holder", Duration::from_secs(30), || async {
        leases.get_opt("balancer-leader").await.ok().flatten()?.spec?.holder_identity.filter(|h| !h.is_empty())
    })
    .await;
    let mut leading = Vec::new();
    for op in &world.operators {
        leading.push(op.metric(&world.plane, "balancer_controller_leader").await == Some(1.0));
    }
    assert_eq!(leading.iter().filter(|l| **l).count(), 1, "exactly one leader: {leading:?}");
    let leader = leading.iter().position(|l| *l).unwrap();
    assert!(
        holder.starts_with(&world.operators[leader].name),
        "Lease holder {holder} vs leader {}",
        world.operators[leader].name
    );
    for op in &world.operators {
        assert!(webhook_answers(world, op).await, "{} does not serve webhooks", op.name);
    }
    let (ok, out) = apply(
        world,
        "admin",
        &balancer_yaml("first", "spec:\n  ports: [{port: 80}]\n  backends: [{name: a, selector: {app: a}}]\n"),
    );
    assert!(ok, "{out}");
    reconciled(world, "first").await;
    let follower = 1 - leader;
    let reconciles = "balancer_reconciles_total{result=\"success\"}";
    let leader_op = &world.operators[leader];
    // The count moves when a reconcile ends, a moment after its children appear.
    eventually("the leader to count its reconciles", Duration::from_secs(10), || async {
        leader_op.metric(&world.plane, reconciles).await.filter(|n| *n > 0.0)
    })
    .await;
    let follower_count = world.operators[follower].metric(&world.plane, reconciles).await;
    assert_eq!(follower_count, Some(0.0), "the follower reconciled");

    // The leader stops (and releases the Lease): the other takes over within the lease duration.
    world.operators[leader].stop();
    if follower != 0 {
        // The webhooks pointed at the stopped leader.
        register_webhooks(world, &world.operators[follower]).await;
    }
    let api_started = Instant::now();
    let follower_op = &world.operators[follower];
    eventually("the follower to lead", Duration::from_secs(12), || async {
        (follower_op.metric(&world.plane, "balancer_controller_leader").await == Some(1.0)).then_some(())
    })
    .await;
    println!("e2e: leadership handed over in {:.1} s", api_started.elapsed().as_secs_f64());
    assert!(webhook_answers(world, follower_op).await);
    let (ok, out) = eventually("the second Balancer accepted", Duration::from_secs(20), || async {
        let (ok, out) = apply(
            world,
            "admin",
            &balancer_yaml("second", "spec:\n  ports: [{port: 80}]\n  backends: [{name: a, selector: {app: a}}]\n"),
        );
        ok.then_some((ok, out))
    })
    .await;
    assert!(ok, "{out}");
    reconciled(world, "second").await;

    // Someone else takes the Lease: the leader stops reconciling promptly, and takes
    // over again once that holder's lease has expired.
    let stolen = json!({"spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 6,
                                 "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())}});
    let follower_op = &world.operators[follower];
    leases.patch("balancer-leader", &PatchParams::default(), &Patch::Merge(stolen)).await.unwrap();
    let started = Instant::now();
    eventually("the leader to step down", Duration::from_secs(6), || async {
        (follower_op.metric(&world.plane, "balancer_controller_leader").await == Some(0.0)).then_some(())
    })
    .await;
    println!("e2e: stepped down {:.1} s after losing the Lease", started.elapsed().as_secs_f64());
    eventually("leadership to come back", Duration::from_secs(30), || async {
        (follower_op.metric(&world.plane, "balancer_controller_leader").await == Some(1.0)).then_some(())
    })
    .await;
    let stopped = world.operators.remove(leader);
    drop(stopped);
}

// ---------------------------------------------------------------------------
// 8. Webhook down
// ---------------------------------------------------------------------------

/// A Balancer the Go operator ran, rebuilt by hand as that operator leaves it (its children,
/// each with a controller owner reference to the Balancer's UID, and its status): the
/// children of the same names are taken over in place (same UIDs, so the Services keep their
/// cluster IPs), the front Service selects both proxies until this operator's is available,
/// then only it, and the Go operator's Deployment `<name>proxy` goes 10 s later.
async fn a_go_operator_balancer_is_taken_over_without_a_gap(world: &mut World) {
    const NAME: &str = "legacy";
    // The operator left from the leader election serves webhooks but stops reconciling while
    // someone else holds the Lease: the stage on which the Go operator's objects are set.
    let leases: Api<Lease> = Api::namespaced(world.admin.clone(), "balancer-system");
    let hold = |seconds: i32| {
        json!({"spec": {"holderIdentity": "go-operator", "leaseDurationSeconds": seconds,
                                              "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())}})
    };
    leases.patch("balancer-leader", &PatchParams::default(), &Patch::Merge(hold(3600))).await.unwrap();
    let operator = &world.operators[0];
    eventually("the operator to stop leading", Duration::from_secs(10), || async {
        (operator.metric(&world.plane, "balancer_controller_leader").await == Some(0.0)).then_some(())
    })
    .await;

    let spec = "spec:\n  ports: [{name: http, protocol: TCP, port: 80, targetPort: 5678}]\n  \
                backends: [{name: a, weight: 1, selector: {app: a}}]\n";
    let (ok, out) = apply(world, "admin", &balancer_yaml_at("v1alpha1", NAME, spec));
    assert!(ok, "{out}");
    let uid = balancers(world).get(NAME).await.unwrap().metadata.uid.expect("a uid");
    let owner = json!([{"apiVersion": "exposer.hliangzhao.io/v1alpha1", "kind": "Balancer", "name": NAME,
                        "uid": uid, "controller": true, "blockOwnerDeletion": true}]);
    let go_labels = json!({"balancer.exposer.hliangzhao.io/balancer-name": NAME});
    let meta =
        |name: &str, labels: Value| json!({"name": name, "namespace": NS, "labels": labels, "ownerReferences": owner});
    let go_children = [
        json!({"apiVersion": "v1", "kind": "Service", "metadata": meta(NAME, json!({})),
               "spec": {"selector": go_labels, "ports": [{"name": "http", "protocol": "TCP", "port": 80}]}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": meta("legacy-a-backend", go_labels.clone()),
               "spec": {"selector": {"app": "a"}, "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 5678}]}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("legacy-proxy-configmap", json!({})),
               "data": {"nginx.conf": "events {}"}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("legacyproxy", go_labels.clone()),
               "spec": {"replicas": 1, "selector": {"matchLabels": go_labels},
                        "template": {"metadata": {"labels": go_labels},
                                     "spec": {"containers": [{"name": "nginx", "image": "nginx:1.15.9"}]}}}}),
    ];
    let (ok, out) = apply(world, "admin", &as_list(go_children.to_vec()));
    assert!(ok, "{out}");
    let status = json!({"status": {"activeBackends": 1, "obsoleteBackends": 0}});
    balancers(world).patch_status(NAME, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    let deployments: Api<Deployment> = Api::namespaced(world.admin.clone(), NS);
    let before = |name: &'static str| {
        let services = services.clone();
        async move { services.get(name).await.unwrap().metadata.uid }
    };
    let (front_uid, backend_uid) = (before(NAME).await, before("legacy-a-backend").await);

    // The Lease runs out: the operator leads again and finds the Go operator's Balancer.
    leases.patch("balancer-leader", &PatchParams::default(), &Patch::Merge(hold(1))).await.unwrap();
    let takeover = |reason: &'static str| {
        let api = balancers(world);
        async move {
            let status = api.get(NAME).await.ok()?.status?;
            status.conditions.into_iter().find(|c| c.type_ == "GoOperatorProxy" && c.reason == reason)
        }
    };
    let serving = eventually("the Go proxy serving beside ours", Duration::from_secs(40), || takeover("Serving")).await;
    println!("e2e: takeover: {}", serving.message);
    let front = services.get(NAME).await.unwrap();
    assert_eq!(front.metadata.uid, front_uid, "the front Service is taken over in place");
    assert_eq!(front.spec.and_then(|s| s.selector), serde_json::from_value(go_labels.clone()).ok(), "both proxies");
    assert_eq!(services.get("legacy-a-backend").await.unwrap().metadata.uid, backend_uid);
    assert!(deployments.get_opt("legacyproxy").await.unwrap().is_some(), "the Go proxy still serves");
    assert!(deployments.get_opt("legacy-proxy").await.unwrap().is_some(), "ours rolls out");
    if !world.plane.has_controller_manager() {
        balancers(world).delete(NAME, &DeleteParams::default()).await.unwrap();
        return;
    }
    // Our proxy's pods "run" (the test plays the kubelet): the front Service selects only them,
    // and the Go operator's Deployment goes once they have drained.
    let api = balancers(world);
    eventually("our proxy to serve alone", Duration::from_secs(60), || async {
        run_proxy_pods(world, NAME).await;
        let ready = api.get(NAME).await.ok().and_then(|b| ready_condition(&b))?;
        let draining = takeover("Draining").await.is_some() || takeover("Removed").await.is_some();
        (ready.0 == "True" && draining).then_some(())
    })
    .await;
    let selector = services.get(NAME).await.unwrap().spec.and_then(|s| s.selector).unwrap_or_default();
    assert_eq!(selector.get("app.kubernetes.io/component").map(String::as_str), Some("proxy"), "{selector:?}");
    let removed = eventually("the Go proxy to be deleted", Duration::from_secs(40), || takeover("Removed")).await;
    println!("e2e: takeover: {}", removed.message);
    assert!(deployments.get_opt("legacyproxy").await.unwrap().is_none());
    balancers(world).delete(NAME, &DeleteParams::default()).await.unwrap();
}

async fn webhook_down_blocks_writes_until_it_is_back(world: &mut World) {
    let stored = balancer_yaml("stored", "spec:\n  ports: [{port: 80}]\n  backends: [{name: a, selector: {app: a}}]\n");
    let (ok, out) = apply(world, "admin", &stored);
    assert!(ok, "{out}");
    for mut op in world.operators.drain(..) {
        op.stop();
    }
    let (ok, out) = apply(
        world,
        "admin",
        &balancer_yaml("blocked", "spec:\n  ports: [{port: 80}]\n  backends: [{name: a, selector: {app: a}}]\n"),
    );
    assert!(!ok, "a Balancer write succeeded with the webhook down");
    assert!(out.contains("failed calling webhook"), "unclear error: {out}");
    // Reads that need conversion fail, naming the conversion webhook; those that do not, work.
    let (ok, out, err) = world
        .plane
        .kubectl("admin")
        .run(&["get", "balancers.v1alpha1.exposer.hliangzhao.io", "stored", "-n", NS, "-o", "name"], None);
    assert!(!ok && err.contains("conversion webhook"), "unclear error for a v1alpha1 read: {out}{err}");
    println!("e2e: a v1alpha1 read with the webhook down: {}", err.trim());
    let (ok, out, err) =
        world.plane.kubectl("admin").run(&["get", "balancers", "stored", "-n", NS, "-o", "name"], None);
    assert!(ok, "a v1beta1 read needs no conversion: {out}{err}");
    // Other resources are never blocked.
    let (ok, out) =
        apply(world, "admin", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: unaffected, namespace: default}\n");
    assert!(ok, "{out}");

    let back = Operator::start(&world.plane, "operator-d", &[]).await;
    register_webhooks(world, &back).await;
    world.operators.push(back);
    eventually("writes to succeed again", Duration::from_secs(20), || async {
        let (ok, _) = apply(
            world,
            "admin",
            &balancer_yaml("blocked", "spec:\n  ports: [{port: 80}]\n  backends: [{name: a, selector: {app: a}}]\n"),
        );
        ok.then_some(())
    })
    .await;
    balancers(world).delete("stored", &DeleteParams::default()).await.expect("delete");
}

// ---------------------------------------------------------------------------
// 9. Protected metrics
// ---------------------------------------------------------------------------

async fn metrics_need_a_token_allowed_to_get_them(world: &mut World) {
    let operator = &world.operators[0];
    assert_eq!(operator.scrape(&world.plane, None).await.0, 401, "no token");
    assert_eq!(operator.scrape(&world.plane, Some("not-a-token")).await.0, 401, "an invalid token");
    assert_eq!(operator.scrape(&world.plane, Some(NOBODY.token)).await.0, 403, "a token without the RBAC");
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "e2e-metrics-scraper"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "balancer-metrics-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": SCRAPER.name}]});
    let (ok, out) = apply(world, "admin", &binding.to_string());
    assert!(ok, "{out}");
    let (status, body) = operator.scrape(&world.plane, Some(SCRAPER.token)).await;
    assert_eq!(status, 200, "a token bound to balancer-metrics-reader: {body}");
    assert!(body.contains("balancer_admission_requests_total"), "{body}");
}

// ---------------------------------------------------------------------------
// 10. A stored Balancer the controller cannot read
// ---------------------------------------------------------------------------

const CRD: &str = "balancers.exposer.hliangzhao.io";

/// Where the schema of `spec.ports[].targetPort` sits in a CRD served at `version`.
fn target_port_pointer(crd: &Value, version: &str) -> String {
    let versions = crd["spec"]["versions"].as_array().expect("spec.versions");
    let index = versions.iter().position(|v| v["name"] == version).expect("the served version");
    format!(
        "/spec/versions/{index}/schema/openAPIV3Schema/properties/spec/properties/ports/items/properties/targetPort"
    )
}

fn stored_crd(world: &World) -> Value {
    let (ok, out, err) = world.plane.kubectl("admin").run(&["get", "crd", CRD, "-o", "json"], None);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap()
}

/// Replaces the stored CRD's schema of `spec.ports[].targetPort` with `schema`, and checks it is stored.
fn set_target_port_schema(world: &World, schema: &Value) {
    let pointer = target_port_pointer(&stored_crd(world), balancer::api::STORAGE_VERSION);
    let patch = json!([{"op": "replace", "path": pointer, "value": schema}]).to_string();
    let (ok, out, err) = world.plane.kubectl("admin").run(&["patch", "crd", CRD, "--type=json", "-p", &patch], None);
    assert!(ok, "patching the CRD schema failed: {out}{err}");
    // Compared as schemas: the API server writes `1.0` back as `1`.
    let as_schema = |v: &Value| serde_json::from_value::<JSONSchemaProps>(v.clone()).expect("a schema");
    let stored = stored_crd(world).pointer(&pointer).map(as_schema);
    assert_eq!(stored, Some(as_schema(schema)), "the stored targetPort schema");
}

/// Balancers as schemaless objects: readable whatever their spec holds.
fn dynamic_balancers(world: &World) -> Api<DynamicObject> {
    Api::namespaced_with(world.admin.clone(), NS, &ApiResource::erase::<Balancer>(&()))
}

/// Sends SIGTERM to `operator` and checks that it exits, cleanly, within `limit`.
fn assert_exits_on_sigterm(plane: &ControlPlane, operator: &mut Operator, limit: Duration) {
    let Some((took, status)) = operator.process.terminate(limit) else {
        panic!("{} still running {limit:?} after SIGTERM", operator.name);
    };
    assert!(status.success(), "{} exited with {status} on SIGTERM; log:\n{}", operator.name, operator.log(plane));
    println!("e2e: {} exited {:.1} s after SIGTERM", operator.name, took.as_secs_f64());
}

async fn an_unreadable_stored_balancer_is_reported_on_itself(world: &mut World) {
    // Without webhooks, and with the schema of before targetPort was bounded, a Balancer the
    // operator's types cannot hold gets stored: targetPort 3000000000 is no 32-bit integer.
    for mut op in world.operators.drain(..) {
        op.stop();
    }
    unregister_webhooks(world);
    let shipped: Value = yaml_docs(&shipped_crd()).remove(0);
    let shipped_target_port =
        shipped.pointer(&target_port_pointer(&shipped, balancer::api::STORAGE_VERSION)).unwrap().clone();
    set_target_port_schema(world, &json!({"x-kubernetes-int-or-string": true}));
    let unreadable = balancer_yaml(
        "unreadable",
        "spec:\n  ports: [{name: http, port: 80, targetPort: 3000000000}]\n  \
             backends: [{name: a, weight: 1, selector: {app: a}}]\n",
    );
    let healthy = balancer_yaml(
        "healthy",
        "spec:\n  ports: [{port: 80}]\n  backends: [{name: a, weight: 1, selector: {app: a}}]\n",
    );
    for (name, yaml) in [("unreadable", &unreadable), ("healthy", &healthy)] {
        // The API server picks up the schema and the webhook removal a moment later.
        eventually(&format!("Balancer {name} stored"), Duration::from_secs(20), || async {
            let (ok, out) = apply(world, "admin", yaml);
            ok.then_some(()).or_else(|| {
                eprintln!("retrying: {out}");
                None
            })
        })
        .await;
    }
    let dynamic = dynamic_balancers(world);
    let stored = dynamic.get("unreadable").await.unwrap();
    assert_eq!(stored.data["spec"]["ports"][0]["targetPort"], json!(3_000_000_000_u64));

    // The operator still becomes ready, reconciles the others and reports the problem on the object itself.
    let delay = Duration::from_secs(1);
    let shutdown_delay = format!("--shutdown-delay={}s", delay.as_secs());
    let operator = Operator::start(&world.plane, "operator-e", &[&shutdown_delay]).await;
    world.operators.push(operator);
    reconciled(world, "healthy").await;
    let api = balancers(world);
    eventually("healthy's status: 1 active backend", Duration::from_secs(30), || {
        let api = api.clone();
        async move {
            let b = api.get("healthy").await.ok()?;
            (b.status?.active_backends == 1).then_some(())
        }
    })
    .await;
    let ready = eventually("a Ready condition on unreadable", Duration::from_secs(30), || async {
        let object = dynamic.get("unreadable").await.ok()?;
        let conditions = object.data["status"]["conditions"].as_array()?.clone();
        conditions.into_iter().find(|c| c["type"] == "Ready")
    })
    .await;
    assert_eq!((&ready["status"], &ready["reason"]), (&json!("False"), &json!("InvalidSpec")), "{ready:#}");
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(message.contains("spec.ports[0].targetPort"), "the message names the field: {ready:#}");

    // The shipped schema refuses such a Balancer even with no webhook.
    set_target_port_schema(world, &shipped_target_port);
    let again = balancer_yaml(
        "unreadable-again",
        "spec:\n  ports: [{port: 80, targetPort: 3000000000}]\n  backends: [{name: a, selector: {app: a}}]\n",
    );
    let refused = eventually("the schema to refuse targetPort 3000000000", Duration::from_secs(20), || async {
        let (ok, out) = apply(world, "admin", &again);
        (!ok).then_some(out)
    })
    .await;
    assert!(refused.contains("targetPort"), "{refused}");

    // SIGTERM ends the process within the shutdown delay, whatever state the controller is in:
    // with every Balancer handled...
    let limit = delay + Duration::from_secs(10);
    assert_exits_on_sigterm(&world.plane, &mut world.operators[0], limit);

    // ... and with a controller that cannot even list Balancers (a user without RBAC).
    let blind = Operator::start_alive(&world.plane, "operator-f", NOBODY.name, &[&shutdown_delay]).await;
    world.operators.push(blind);
    eventually("the list as nobody to be forbidden", Duration::from_secs(20), || async {
        let forbidden = world.plane.audit_events().iter().any(|e| {
            e["user"]["username"] == NOBODY.name
                && e["objectRef"]["resource"] == "balancers"
                && e["responseStatus"]["code"] == 403
        });
        forbidden.then_some(())
    })
    .await;
    let blind = &world.operators[1];
    // Ready all the same: readiness means "can answer the API server", never the caches.
    assert_eq!(blind.probe("/readyz").await, Some(200), "{} serves the webhooks", blind.name);
    assert!(!blind.log(&world.plane).contains("controller caches synced"), "{} synced as nobody", blind.name);
    assert_exits_on_sigterm(&world.plane, &mut world.operators[1], limit);
    world.operators.clear();

    // The unreadable Balancer can be deleted like any other.
    dynamic.delete("unreadable", &DeleteParams::default()).await.unwrap();
    balancers(world).delete("healthy", &DeleteParams::default()).await.unwrap();
    eventually("both Balancers gone", Duration::from_secs(30), || async {
        let left = dynamic.list(&ListParams::default()).await.ok()?.items;
        (!left.iter().any(|b| ["unreadable", "healthy"].contains(&b.name_any().as_str()))).then_some(())
    })
    .await;
}

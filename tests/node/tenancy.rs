//! Tenants are untrusted: someone who may write ConfigMaps in the Balancers' namespace, and
//! nothing else, cannot change what the proxy does (see docs/security.md).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::fixtures::{Sample, front_ip, pod_ips, wait_ready_balancer};
use crate::nodes::proxy_pods;
use crate::sidecar::{served_config, sidecar_counts};
use crate::toolkit::load::Load;
use crate::toolkit::runner::eventually;
use crate::{NS, SAMPLE, World};

/// The user bound only to a Role that may read, update and patch ConfigMaps in [`NS`].
const WRITER: &str = "configmap-writer";

/// The address on node A's bridge where a decoy answers, as the cloud metadata address or
/// another tenant's pod would: an address that is not one of the Balancer's backends.
const DECOY_HOST: &str = "10.244.0.1";
const DECOY_ANSWER: &str = "decoy: not a backend of the spec";

/// The ConfigMap writer replaces the proxy's ConfigMap with a file that forwards to another
/// address, one that loads a module, and a well-formed model whose upstream is that address:
/// with the ownerReference kept, and then without it. Under continuous load through the
/// Balancer no request fails and every one reaches a backend of the spec; each proxy's sidecar
/// counts the refusals; the Balancer shows them (a `ForeignConfiguration` event); the operator's
/// file is back within 5 s while it owns the ConfigMap, and nginx serves the operator's
/// configuration throughout.
pub async fn a_configmap_writer_cannot_steer_the_proxy(world: &mut World) {
    world.ensure_sample(Sample::AS_SHIPPED).await;
    grant_configmap_writes(world);
    let decoy = Decoy::start().await;
    let configmaps: Api<ConfigMap> = Api::namespaced(world.admin.clone(), NS);
    let name = balancer::api::proxy_configmap_name(SAMPLE);
    let original = configmaps.get(&name).await.expect("the proxy's ConfigMap");
    let files = original.data.clone().expect("the ConfigMap's files");
    let sidecars: Vec<String> =
        pod_ips(world, NS, &proxy_pods()).await.into_iter().map(|ip| format!("{ip}:9113")).collect();
    let served = served_by(&sidecars).await;
    let load = Load::start(format!("{}:80", front_ip(world, SAMPLE).await), 4);
    let forgeries = forgeries(&files, &decoy.address);
    for (what, forged) in &forgeries {
        let refused = unsigned_refusals(&sidecars).await;
        let replaced = Instant::now();
        replace_as_writer(world, &original, forged, true);
        let back = eventually(&format!("the operator's file back after {what}"), Duration::from_secs(5), || {
            let configmaps = configmaps.clone();
            let (name, files) = (name.clone(), files.clone());
            async move { (configmaps.get(&name).await.ok()?.data? == files).then(Instant::now) }
        })
        .await;
        println!("node: {what}: the operator's file back {:.2} s after the write", (back - replaced).as_secs_f64());
        every_sidecar_refused_one_more(&sidecars, &refused, what).await;
    }
    // The Balancer's event budget (a burst, then one a minute) may be spent by the scenarios
    // before: the controller tells again at each forgery, so forge until it is told.
    let told = || {
        let selector = format!("reason=ForeignConfiguration,involvedObject.name={SAMPLE}");
        let events = world.kubectl.ok(&["-n", NS, "get", "events", "--field-selector", &selector, "-o", "name"]);
        !events.trim().is_empty()
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while !told() {
        assert!(Instant::now() < deadline, "no ForeignConfiguration event on the Balancer within 90 s");
        tokio::time::sleep(Duration::from_secs(10)).await;
        replace_as_writer(world, &original, &forgeries[0].1, true);
    }
    eventually("the operator's file back", Duration::from_secs(5), || {
        let configmaps = configmaps.clone();
        let (name, files) = (name.clone(), files.clone());
        async move { (configmaps.get(&name).await.ok()?.data? == files).then_some(()) }
    })
    .await;

    // Without the ownerReference the operator never adopts the ConfigMap back, and the proxies
    // go on refusing what it holds. The change still reaches the Balancer's reconcile (children
    // are watched by label), which reports the conflict.
    let refused = unsigned_refusals(&sidecars).await;
    let (what, forged) = &forgeries[0];
    let disowned = Instant::now();
    replace_as_writer(world, &original, forged, false);
    let conflict = eventually("the Balancer's Ready=False/Conflict", Duration::from_secs(5), || async {
        let sample = crate::fixtures::balancers(world).get(SAMPLE).await.ok()?;
        let ready = sample.status?.conditions.into_iter().find(|c| c.type_ == "Ready")?;
        (ready.reason == "Conflict").then(Instant::now)
    })
    .await;
    println!(
        "node: without the ownerReference, the Balancer reported the conflict {:.2} s after the write",
        (conflict - disowned).as_secs_f64()
    );
    every_sidecar_refused_one_more(&sidecars, &refused, &format!("{what}, without the ownerReference")).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(served_by(&sidecars).await, served, "nginx serves the operator's configuration throughout");

    let stopped = load.stop().await;
    crate::toolkit::load::assert_no_failures("while the ConfigMap was forged", stopped.sent, &stopped.failures);
    let backends = ["hello world v1", "hello world v2", "hello world v3"];
    let strangers: BTreeMap<&String, &usize> =
        stopped.answers.iter().filter(|(answer, _)| !backends.contains(&answer.as_str())).collect();
    assert!(strangers.is_empty(), "answers from outside the spec's backends: {strangers:?}");
    assert_eq!(decoy.connections(), 0, "the decoy was never reached");

    // Put things back: the administrator writes the operator's ConfigMap back, ownerReference
    // included.
    let mut object: Value = serde_json::to_value(&original).expect("serializes");
    object["metadata"].as_object_mut().expect("metadata").remove("resourceVersion");
    world.kubectl.ok_with(&["-n", NS, "replace", "-f", "-"], &object.to_string());
    eventually("the ConfigMap restored", Duration::from_secs(30), || {
        let configmaps = configmaps.clone();
        let (name, files) = (name.clone(), files.clone());
        async move { (configmaps.get(&name).await.ok()?.data? == files).then_some(()) }
    })
    .await;
    wait_ready_balancer(world, SAMPLE, Duration::from_secs(60)).await;
}

/// The three forgeries: each a ConfigMap's files.
fn forgeries(files: &BTreeMap<String, String>, decoy: &str) -> Vec<(&'static str, BTreeMap<String, String>)> {
    let conf = &files["nginx.conf"];
    let model = &files["proxy.json"];
    // Every upstream server's IPv4 address and port, after `before`: `server <ip>:<port>` in
    // the file (not `server {`), `"address": "<ip>:<port>"` in the model.
    let elsewhere = |text: &str, before: &str| {
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find(before) {
            let start = at + before.len();
            out.push_str(&rest[..start]);
            rest = &rest[start..];
            if rest.starts_with(|c: char| c.is_ascii_digit()) {
                let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':')).unwrap_or(rest.len());
                out.push_str(decoy);
                rest = &rest[end..];
            }
        }
        out.push_str(rest);
        out
    };
    let with = |changes: &[(&str, String)]| {
        let mut forged = files.clone();
        for (key, value) in changes {
            forged.insert(key.to_string(), value.clone());
        }
        forged
    };
    let (header, body) = conf.split_once('\n').expect("a header line");
    let module = format!("{header}\nload_module /usr/lib/nginx/modules/ngx_stream_js_module.so;\n{body}");
    let forwarding = elsewhere(conf, "server ");
    assert_ne!(&forwarding, conf, "the file names upstream servers");
    let forged_model = elsewhere(model, "\"address\": \"");
    assert_ne!(&forged_model, model, "the model names upstream servers");
    vec![
        ("a file forwarding to another address", with(&[("nginx.conf", forwarding.clone())])),
        ("a file loading a module", with(&[("nginx.conf", module)])),
        (
            "a model and file forwarding to another address",
            with(&[("nginx.conf", forwarding), ("proxy.json", forged_model)]),
        ),
    ]
}

/// Binds [`WRITER`] to a Role that may get, update and patch ConfigMaps in [`NS`].
fn grant_configmap_writes(world: &World) {
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": WRITER, "namespace": NS},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "update", "patch"]}],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": WRITER, "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": WRITER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": WRITER}],
    });
    world.kubectl.apply(&json!({"apiVersion": "v1", "kind": "List", "items": [role, binding]}).to_string());
}

/// Replaces the ConfigMap's files with `files` as [`WRITER`], keeping or removing its
/// ownerReference.
fn replace_as_writer(world: &World, original: &ConfigMap, files: &BTreeMap<String, String>, keep_owner: bool) {
    let mut object: Value = serde_json::to_value(original).expect("serializes");
    object["data"] = json!(files);
    let metadata = object["metadata"].as_object_mut().expect("metadata");
    for server_set in ["resourceVersion", "managedFields", "uid", "creationTimestamp"] {
        metadata.remove(server_set);
    }
    if !keep_owner {
        metadata.remove("ownerReferences");
    }
    let as_writer = format!("--as={WRITER}");
    let (ok, _, err) = world.kubectl.run(&["-n", NS, "replace", &as_writer, "-f", "-"], Some(&object.to_string()));
    assert!(ok, "the ConfigMap writer could not replace the ConfigMap: {err}");
}

/// The configuration each sidecar says nginx serves.
async fn served_by(sidecars: &[String]) -> Vec<Option<String>> {
    let mut served = Vec::new();
    for sidecar in sidecars {
        served.push(served_config(sidecar).await);
    }
    served
}

/// Each sidecar's count of configurations refused as unsigned.
async fn unsigned_refusals(sidecars: &[String]) -> Vec<f64> {
    let mut counts = Vec::new();
    for sidecar in sidecars {
        let count = sidecar_counts(sidecar, "balancer_proxy_config_refused_total", "reason=\"unsigned\"").await;
        counts.push(count.and_then(|c| c.values().next().copied()).unwrap_or_default());
    }
    counts
}

async fn every_sidecar_refused_one_more(sidecars: &[String], before: &[f64], what: &str) {
    eventually(&format!("every sidecar counting {what} as unsigned"), Duration::from_secs(5), || async {
        let now = unsigned_refusals(sidecars).await;
        now.iter().zip(before).all(|(now, before)| now > before).then_some(())
    })
    .await;
}

/// A TCP server answering every connection with [`DECOY_ANSWER`], counting them.
struct Decoy {
    address: String,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Decoy {
    async fn start() -> Decoy {
        let listener = tokio::net::TcpListener::bind((DECOY_HOST, 0)).await.expect("the decoy listens");
        let address = listener.local_addr().expect("the decoy's address").to_string();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let answer = format!("HTTP/1.0 200 OK\r\n\r\n{DECOY_ANSWER}\n");
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        Decoy { address, connections, task }
    }

    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Decoy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

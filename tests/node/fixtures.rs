//! What scenarios stand on, set up by idempotent `ensure_*` steps: the operator installed, the
//! restricted namespace, the echo backends, and the sample Balancer in the shape a scenario
//! needs. Each step checks first and costs next to nothing when the scenario before left the
//! cluster as needed, so that the full run keeps its order and pace, and any scenario can also
//! run alone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use balancer::api::Balancer;
use balancer::proxy::model::{MODEL_FILE, ProxyConfig};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node as NodeObject, Pod, Service};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::toolkit::load::split;
use crate::toolkit::runner::eventually;
use crate::toolkit::wait::{self, balancer_until};
use crate::{BASE_IMAGE, NODE_B, NODE_MONITOR_GRACE, NS, OPERATOR_NS, SAMPLE, World, install, nodes, repo};

/// Which of the fixtures that several scenarios share the cluster already has. None of them
/// is taken down by a scenario once made.
#[derive(Default)]
pub struct Present {
    operator: bool,
    namespace: bool,
    echo_backends: bool,
    udp_backends: bool,
    node_lifecycle: bool,
    gateway_api: bool,
}

/// The sample's backends as shipped (`deploy/samples/balancer.yaml`), with their weights.
const SHIPPED_BACKENDS: [(&str, i32); 3] = [("v1", 40), ("v2", 20), ("v3", 40)];

/// What a scenario needs of the sample Balancer.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Exactly these backends, in this order (any weights); `None`: any.
    backends: Option<&'static [&'static str]>,
    /// The shipped backends and weights, as [`SHIPPED_BACKENDS`].
    as_shipped: bool,
    /// This many proxy pods; `None`: any.
    replicas: Option<i32>,
}

impl Sample {
    /// Backends v1, v2 and v3 at 40/20/40, as shipped, and one proxy pod.
    pub const AS_SHIPPED: Sample = Sample { backends: Some(&["v1", "v2", "v3"]), as_shipped: true, replicas: Some(1) };
    /// Whatever backends, weights and replicas earlier scenarios left.
    pub const ANY: Sample = Sample { backends: None, as_shipped: false, replicas: None };

    /// Exactly `names` as backends, with any weights: backends missing are restored as shipped,
    /// others removed by name.
    pub const fn backends(self, names: &'static [&'static str]) -> Sample {
        Sample { backends: Some(names), ..self }
    }

    /// `replicas` proxy pods.
    pub const fn replicas(self, replicas: i32) -> Sample {
        Sample { replicas: Some(replicas), ..self }
    }
}

impl World {
    /// The operator installed from `deploy/` (as the install scenario does), its webhooks
    /// answering through their Service.
    pub async fn ensure_operator(&mut self) {
        if !self.fixtures.operator {
            install::install_operator(self).await;
            install::webhooks_reachable(self).await;
            self.fixtures.operator = true;
        }
    }

    /// Gateway API's standard CRDs, served by the operator (restarted once they are installed),
    /// and balancer's GatewayClass.
    pub async fn ensure_gateway_api(&mut self) {
        self.ensure_operator().await;
        if !self.fixtures.gateway_api {
            crate::gateway::install_gateway_api(self).await;
            self.fixtures.gateway_api = true;
        }
    }

    /// Records that the install scenario installed the operator.
    pub fn operator_installed(&mut self) {
        self.fixtures.operator = true;
    }

    /// [`NS`], enforcing `restricted`, as the walkthrough makes it.
    pub async fn ensure_namespace(&mut self) {
        self.ensure_operator().await;
        if !self.fixtures.namespace {
            restricted_namespace(self, NS);
            self.fixtures.namespace = true;
        }
    }

    /// The walkthrough's echo backends v1, v2 and v3 in [`NS`] (however many pods each has).
    pub async fn ensure_echo_backends(&mut self) {
        self.ensure_namespace().await;
        if !self.fixtures.echo_backends {
            make_echo_backends(self).await;
        }
    }

    /// The UDP echo backends u1 and u2 in [`NS`], as the UDP scenario makes them.
    pub async fn ensure_udp_backends(&mut self) {
        self.ensure_namespace().await;
        if !self.fixtures.udp_backends {
            crate::protocols::make_udp_backends(self).await;
        }
    }

    /// Node lifecycle running (see [`NODE_MONITOR_GRACE`]): from the first two-node scenario on.
    pub fn ensure_node_lifecycle(&mut self) {
        if !self.fixtures.node_lifecycle {
            let assets = self.assets.clone();
            self.plane.start_node_lifecycle(&assets, NODE_MONITOR_GRACE);
            self.fixtures.node_lifecycle = true;
        }
    }

    /// The sample Balancer as `needs` says, Ready, its proxy rolled out and every backend
    /// answering through it. Changes nothing, and waits for nothing, when it already is so.
    pub async fn ensure_sample(&mut self, needs: Sample) {
        self.ensure_echo_backends().await;
        let balancers = balancers(self);
        let mut changed = false;
        let current = balancers.get_opt(SAMPLE).await.expect("read the sample");
        let names = |b: &Balancer| b.spec.backends.iter().map(|b| b.name.clone()).collect::<Vec<_>>();
        let restore = match &current {
            None => true,
            Some(sample) if needs.as_shipped => {
                let seen = sample.spec.backends.iter().map(|b| (b.name.as_str(), b.weight));
                !seen.eq(SHIPPED_BACKENDS.map(|(name, weight)| (name, Some(weight))))
            }
            Some(sample) => {
                needs.backends.is_some_and(|want| want.iter().any(|w| !names(sample).contains(&w.to_string())))
            }
        };
        if restore {
            apply_shipped_sample(self);
            changed = true;
        }
        if let Some(want) = needs.backends {
            let sample = balancers.get(SAMPLE).await.expect("read the sample");
            let extra: Vec<String> = names(&sample).into_iter().filter(|n| !want.contains(&n.as_str())).collect();
            if !extra.is_empty() {
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                change_backends(self, SAMPLE, &[], &extra).await;
                changed = true;
            }
        }
        if let Some(replicas) = needs.replicas {
            let sample = balancers.get(SAMPLE).await.expect("read the sample");
            if sample.spec.replicas.unwrap_or(1) != replicas {
                let replicas = format!("--replicas={replicas}");
                self.kubectl.ok(&["-n", NS, "scale", &format!("balancer/{SAMPLE}"), &replicas]);
                changed = true;
            }
        }
        if changed {
            let sample = wait_ready_balancer(self, SAMPLE, Duration::from_secs(120)).await;
            let replicas = sample.spec.replicas.unwrap_or(1);
            wait_available(self, NS, &format!("{SAMPLE}-proxy"), replicas).await;
            rolled_out(self, replicas).await;
            let versions = names(&sample);
            let versions: Vec<&str> = versions.iter().map(String::as_str).collect();
            let front = front_ip(self, SAMPLE).await;
            every_backend_answers(&front, &versions).await;
            eventually("a batch through the sample without a failed request", Duration::from_secs(60), || async {
                (!split(&front, 80, 30).await.contains_key("failed")).then_some(())
            })
            .await;
        }
    }

    /// One node cordoned, as a drain leaves the node it drained: node B, if none is.
    pub async fn ensure_a_cordoned_node(&mut self) {
        if cordoned_nodes(self).await.is_empty() {
            self.kubectl.ok(&["cordon", NODE_B.name]);
        }
    }

    /// Echo backends v1 and v2 with two pods each and a disruption budget, as the drain
    /// scenario leaves them.
    pub async fn ensure_two_pods_per_backend(&mut self) {
        self.ensure_echo_backends().await;
        nodes::drain_ready_backends(self).await;
    }
}

/// Waits until the sample's proxy has `replicas` ready pods on its current configuration and
/// no other pod, not even a terminating one: a scenario that starts while pods of a rollout
/// still drain would measure them, and one that stops the API server would leave kube-proxy
/// sending to them once they are gone.
async fn rolled_out(world: &World, replicas: i32) {
    let selector = nodes::proxy_pods();
    let count = usize::try_from(replicas).expect("a replica count");
    nodes::settled(world, NS, &selector, count).await;
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    eventually("the sample's old proxy pods gone", Duration::from_secs(120), || async {
        let listed = pods.list(&ListParams::default().labels(&selector)).await.ok()?;
        (listed.items.len() == count).then_some(())
    })
    .await;
}

/// `deploy/samples/balancer.yaml` applied in [`NS`], as the walkthrough applies it.
pub fn apply_shipped_sample(world: &World) {
    let sample = std::fs::read_to_string(repo("deploy/samples/balancer.yaml")).expect("sample");
    world.kubectl.ok_with(&["-n", NS, "apply", "-f", "-"], &sample);
}

/// The shipped sample renamed `name`, applied in `namespace` through the webhooks (the
/// conversion webhook among them: it is v1alpha1), retried for up to 30 s: right after a CA
/// rotation, the API server's handlers pick up the CRD's new caBundle a moment apart.
pub async fn apply_sample_as(world: &World, namespace: &str, name: &str, what: &str) {
    let yaml = std::fs::read_to_string(repo("deploy/samples/balancer.yaml")).expect("sample").replace(SAMPLE, name);
    eventually(what, Duration::from_secs(30), || async {
        world.kubectl.run(&["-n", namespace, "apply", "-f", "-"], Some(&yaml)).0.then_some(())
    })
    .await;
}

/// The walkthrough's echo backends v1, v2 and v3, each with one ready pod.
pub async fn make_echo_backends(world: &mut World) {
    for version in ["v1", "v2", "v3"] {
        world.kubectl.apply(&echo_backend(version));
    }
    for version in ["v1", "v2", "v3"] {
        wait_available(world, NS, &format!("echo-{version}"), 1).await;
    }
    world.fixtures.echo_backends = true;
}

/// Records that the walkthrough made [`NS`].
pub fn namespace_made(world: &mut World) {
    world.fixtures.namespace = true;
}

/// Records that the UDP scenario made its backends.
pub fn udp_backends_made(world: &mut World) {
    world.fixtures.udp_backends = true;
}

/// The Balancers in [`NS`].
pub fn balancers(world: &World) -> Api<Balancer> {
    Api::namespaced(world.admin.clone(), NS)
}

/// A JSON patch of Balancer `balancer`'s backends that sets the weights in `weights` and removes
/// the backends in `remove`, each found by its name. The patch first tests every index it uses
/// against the name there, so the API server refuses it if the list changed in between.
pub fn backends_patch(balancer: &Balancer, weights: &[(&str, u32)], remove: &[&str]) -> Value {
    let index = |name: &str| {
        let backends = &balancer.spec.backends;
        backends.iter().position(|b| b.name == name).unwrap_or_else(|| panic!("no backend {name} in {backends:?}"))
    };
    let mut tests = Vec::new();
    let mut changes = Vec::new();
    for (name, weight) in weights {
        let i = index(name);
        tests.push(json!({"op": "test", "path": format!("/spec/backends/{i}/name"), "value": name}));
        changes.push(json!({"op": "replace", "path": format!("/spec/backends/{i}/weight"), "value": weight}));
    }
    let mut removed: Vec<usize> = remove.iter().map(|name| index(name)).collect();
    // From the last: each removal shifts the indexes after it.
    removed.sort_unstable_by(|a, b| b.cmp(a));
    for i in removed {
        let name = &balancer.spec.backends[i].name;
        tests.push(json!({"op": "test", "path": format!("/spec/backends/{i}/name"), "value": name}));
        changes.push(json!({"op": "remove", "path": format!("/spec/backends/{i}")}));
    }
    Value::Array([tests, changes].concat())
}

/// Sets the weights of the named backends of Balancer `name` in [`NS`] and removes the backends
/// named in `remove` (`kubectl patch`).
pub async fn change_backends(world: &World, name: &str, weights: &[(&str, u32)], remove: &[&str]) {
    let balancer = balancers(world).get(name).await.expect("read the Balancer");
    let patch = backends_patch(&balancer, weights, remove).to_string();
    world.kubectl.ok(&["-n", NS, "patch", "balancer", name, "--type=json", "-p", &patch]);
}

/// Sets the weights of the sample's backends v1 and v2, retrying while the API server cannot
/// take it.
pub async fn set_weights(world: &World, v1: u32, v2: u32) {
    let balancers = balancers(world);
    eventually("the weight change accepted", Duration::from_secs(30), || async {
        let sample = balancers.get(SAMPLE).await.ok()?;
        let patch = backends_patch(&sample, &[("v1", v1), ("v2", v2)], &[]).to_string();
        let args = ["-n", NS, "patch", "balancer", SAMPLE, "--type=json", "-p", &patch];
        world.kubectl.run(&args, None).0.then_some(())
    })
    .await;
}

/// Waits until Balancer `name`'s `status.backends` shows `ready` endpoints and `shares`, in spec
/// order, and `BackendsAvailable` is `available`; returns the Balancer.
pub async fn wait_backends(
    world: &World,
    name: &str,
    ready: &[i32],
    shares: &[i32],
    available: &'static str,
    timeout: Duration,
) -> Balancer {
    let what = format!("Balancer {name}'s backends with {ready:?} ready endpoints, shares {shares:?}, {available}");
    balancer_until(&balancers(world), name, &what, timeout, wait::backends_show(ready, shares, available)).await
}

/// Waits for `Ready=True` on Balancer `name`'s current generation, and returns the Balancer.
pub async fn wait_ready_balancer(world: &World, name: &str, timeout: Duration) -> Balancer {
    balancer_until(&balancers(world), name, &format!("Balancer {name} Ready=True"), timeout, wait::is_ready()).await
}

/// Makes `name` a namespace whose pods must meet the `restricted` Pod Security Standard, with
/// docs/install.md's command.
pub fn restricted_namespace(world: &World, name: &str) {
    world.kubectl.ok(&["create", "namespace", name]);
    world.kubectl.ok(&["label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted"]);
}

/// What `restricted` asks of a pod: not root, no privilege escalation, no capability, the
/// runtime's seccomp profile. The backends need nothing more.
pub fn restricted_pod() -> Value {
    json!({"runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534,
           "seccompProfile": {"type": "RuntimeDefault"}})
}

/// The container half of [`restricted_pod`].
pub fn restricted_container() -> Value {
    json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}})
}

/// A pod that `restricted` refuses: root, with a capability.
pub fn privileged_probe_pod(namespace: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-security-probe", "namespace": namespace},
           "spec": {"containers": [{"name": "root", "image": BASE_IMAGE, "imagePullPolicy": "Never",
                                    "securityContext": {"runAsUser": 0, "capabilities": {"add": ["NET_ADMIN"]}}}]}})
    .to_string()
}

/// Whether the API server refuses a root pod in `namespace` (a server-side dry run: nothing is
/// made), and its answer.
pub fn refuses_root_pods(world: &World, namespace: &str) -> (bool, String) {
    let args = ["apply", "--dry-run=server", "-f", "-"];
    let (ok, out, err) = world.kubectl.run(&args, Some(&privileged_probe_pod(namespace)));
    (!ok && err.contains("violates PodSecurity \"restricted:latest\""), format!("{out}{err}"))
}

/// An HTTP echo Deployment in [`NS`]: nginx on 5678 answering `hello world <version>`.
pub fn echo_backend(version: &str) -> String {
    echo_backend_in(NS, version)
}

/// An HTTP echo Deployment in `namespace`, `restricted` as any: nginx as nobody, its pid file
/// and temporary files in /tmp.
pub fn echo_backend_in(namespace: &str, version: &str) -> String {
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
    let echo = json!({
        "name": "echo",
        "command": ["nginx", "-c", "/etc/echo/nginx.conf", "-e", "stderr", "-g", "daemon off;"],
        "ports": [{"containerPort": 5678}],
        "readinessProbe": {"httpGet": {"port": 5679, "path": "/ready"}, "periodSeconds": 1, "failureThreshold": 2},
        // A backend that stops gracefully: it leaves its Service's endpoints, then quits and
        // finishes what it is answering (nginx's SIGTERM is a fast stop). kube-proxy still
        // sends to a terminating pod that is its Service's last one while the pod is ready
        // (KEP-1669), so the pod first turns not ready: a quit would reset the connections
        // still queued.
        "lifecycle": {"preStop": {"exec": {"command": [
            "sh", "-c", "touch /tmp/draining; sleep 4; nginx -c /etc/echo/nginx.conf -s quit; sleep 2"
        ]}}},
        "volumeMounts": [{"name": "conf", "mountPath": "/etc/echo"}],
    });
    let labels = json!({"app": "test", "version": version});
    let mut deployment = backend_deployment(namespace, &format!("echo-{version}"), labels, echo);
    deployment["spec"]["template"]["spec"]["volumes"] =
        json!([{"name": "conf", "configMap": {"name": format!("echo-{version}")}}]);
    json!({"apiVersion": "v1", "kind": "List", "items": [config_map, deployment]}).to_string()
}

/// A Deployment `name` of one pod labelled `labels` that meets `restricted`, running
/// `container` (its name, command, ports and probes) from [`BASE_IMAGE`].
pub fn backend_deployment(namespace: &str, name: &str, labels: Value, mut container: Value) -> Value {
    container["image"] = json!(BASE_IMAGE);
    container["imagePullPolicy"] = json!("Never");
    container["securityContext"] = restricted_container();
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"securityContext": restricted_pod(), "containers": [container]},
            },
        },
    })
}

/// The nodes cordoned now, by name.
pub async fn cordoned_nodes(world: &World) -> Vec<String> {
    let nodes: Api<NodeObject> = Api::all(world.admin.clone());
    let list = nodes.list(&ListParams::default()).await.expect("nodes").items;
    let cordoned = list.into_iter().filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true));
    cordoned.map(|n| n.name_any()).collect()
}

/// Waits for a Deployment to have `replicas` ready pods.
pub async fn wait_available(world: &World, namespace: &str, name: &str, replicas: i32) {
    let deployments: Api<Deployment> = Api::namespaced(world.admin.clone(), namespace);
    eventually(&format!("Deployment {name} with {replicas} ready"), Duration::from_secs(120), || async {
        (deployments.get(name).await.ok()?.status?.ready_replicas == Some(replicas)).then_some(())
    })
    .await;
}

/// The cluster IP of the Service `name` in [`NS`] (a Balancer's front Service has its name).
pub async fn front_ip(world: &World, name: &str) -> String {
    service_ip(world, NS, name).await
}

pub async fn service_ip(world: &World, namespace: &str, name: &str) -> String {
    let services: Api<Service> = Api::namespaced(world.admin.clone(), namespace);
    let service = services.get(name).await.expect("front Service");
    service.spec.and_then(|s| s.cluster_ip).expect("a cluster IP")
}

/// The addresses of the pods in `NS` that `selector` matches.
pub async fn pod_ips(world: &World, namespace: &str, selector: &str) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), namespace);
    let listed = pods.list(&ListParams::default().labels(selector)).await.expect("pods");
    listed.items.into_iter().filter_map(|p| p.status?.pod_ip).collect()
}

/// The pod holding the leader Lease (identities are `<pod name>_<process>`).
pub async fn lease_holder(world: &World) -> Option<String> {
    let identity = lease_identity(world).await?;
    Some(identity.rsplit_once('_').map_or(identity.as_str(), |(pod, _)| pod).to_string())
}

/// The whole identity holding the leader Lease: `<pod name>_<random>`, new for every process.
pub async fn lease_identity(world: &World) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(world.admin.clone(), OPERATOR_NS);
    leases.get("balancer-leader").await.ok()?.spec?.holder_identity.filter(|h| !h.is_empty())
}

pub async fn operator_pods(world: &World) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), OPERATOR_NS);
    let params = ListParams::default().labels("app.kubernetes.io/name=balancer");
    pods.list(&params).await.expect("pods").items.iter().map(ResourceExt::name_any).collect()
}

/// Each running operator pod's name and container restarts (a pod still terminating, such as
/// the leader the failover scenario deletes, is left out).
pub async fn operator_pod_restarts(world: &World) -> BTreeMap<String, i32> {
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

/// Waits until the sample's proxy configuration has the weights `v1` and `v2`.
pub async fn configured_weights(world: &World, v1: u32, v2: u32, timeout: Duration) {
    eventually(&format!("the proxy configured with weights {v1}/{v2}"), timeout, || async {
        configured_as(world, SAMPLE, &[("v1", v1), ("v2", v2)]).await.then_some(())
    })
    .await;
}

/// Whether Balancer `balancer`'s proxy model weighs the named backends in proportion to
/// `weights`: each backend's weight is the sum of its servers' (its pods share its weight).
pub async fn configured_as(world: &World, balancer: &str, weights: &[(&str, u32)]) -> bool {
    let Some(model) = proxy_model(world, balancer).await else { return false };
    let Some(listener) = model.listeners.first() else { return false };
    let sum = |backend: &str| -> u64 {
        listener.servers.iter().filter(|s| s.backend == backend && !s.backup).map(|s| u64::from(s.weight)).sum()
    };
    weights.iter().all(|&(a, wa)| weights.iter().all(|&(b, wb)| sum(a) * u64::from(wb) == sum(b) * u64::from(wa)))
        && weights.iter().any(|&(a, _)| sum(a) > 0)
}

/// The proxy model (`proxy.json`) in Balancer `balancer`'s proxy ConfigMap, if it can be read.
pub async fn proxy_model(world: &World, balancer: &str) -> Option<ProxyConfig> {
    let config_maps: Api<ConfigMap> = Api::namespaced(world.admin.clone(), NS);
    let data = config_maps.get(&format!("{balancer}-proxy-configmap")).await.ok()?.data?;
    ProxyConfig::from_json(data.get(MODEL_FILE)?)
}

/// Waits until the controller has reconciled Balancer `name`'s current generation.
pub async fn reconciled(world: &World, name: &str, timeout: Duration) -> Balancer {
    let what = format!("Balancer {name}'s generation reconciled");
    balancer_until(&balancers(world), name, &what, timeout, wait::generation_observed()).await
}

/// The `nginx.conf` in Balancer `balancer`'s proxy ConfigMap, if it can be read.
pub async fn proxy_conf(world: &World, balancer: &str) -> Option<String> {
    let config_maps: Api<ConfigMap> = Api::namespaced(world.admin.clone(), NS);
    config_maps.get(&format!("{balancer}-proxy-configmap")).await.ok()?.data?.remove("nginx.conf")
}

/// Waits until one batch of 30 requests through the front Service at `front`:80 reaches each
/// of `versions`: a sample just changed may have a backend whose pods are not ready yet.
pub async fn every_backend_answers(front: &str, versions: &[&str]) {
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

/// The first `sh` block of the doc page `page` (a path in the repository) that holds `marker`,
/// for a scenario to run as the docs give it.
pub fn sh_block(page: &str, marker: &str) -> String {
    let text = std::fs::read_to_string(repo(page)).expect("a doc page");
    let blocks = text.split("```sh\n").skip(1).filter_map(|block| block.split("```").next());
    let block = blocks.into_iter().find(|b| b.contains(marker));
    block.unwrap_or_else(|| panic!("{page}: no sh block with {marker:?}")).to_string()
}

//! docs/install.md's migration from the Go operator, on a real kubelet and kube-proxy.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use balancer::api::Balancer;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::fixtures::{
    apply_sample_as, echo_backend_in, lease_holder, operator_pods, pod_ips, service_ip, wait_available,
};
use crate::toolkit::load::{Load, Stopped, assert_no_failures, one_request};
use crate::toolkit::runner::eventually;
use crate::toolkit::wait;
use crate::weights::dropped_by_kube_proxy;
use crate::{BASE_IMAGE, OPERATOR_NS, World};

/// The Go operator's Balancer and its pods: they run nginx as root, as the Go operator's do.
const GO_NS: &str = "go-operator";

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
pub async fn a_go_operator_balancer_is_taken_over_without_a_failed_request(world: &mut World) {
    const NAME: &str = "legacy";
    world.ensure_operator().await;
    let go_pods = format!("balancer.exposer.hliangzhao.io/balancer-name={NAME},!app.kubernetes.io/component");
    // The leader stops reconciling while someone else holds the Lease.
    let leader = eventually("a leader", Duration::from_secs(30), || lease_holder(world)).await;
    let step_downs = || {
        let logs = world.kubectl.ok(&["-n", OPERATOR_NS, "logs", &leader]);
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
    world.kubectl.apply(&namespace.to_string());
    for version in ["v1", "v2", "v3"] {
        world.kubectl.apply(&echo_backend_in(GO_NS, version));
    }
    for version in ["v1", "v2", "v3"] {
        wait_available(world, GO_NS, &format!("echo-{version}"), 1).await;
    }
    apply_sample_as(world, GO_NS, NAME, "the Go operator's Balancer created").await;
    let alpha: Api<balancer::api::v1alpha1::Balancer> = Api::namespaced(world.admin.clone(), GO_NS);
    let uid = alpha.get(NAME).await.expect("the Balancer").metadata.uid.expect("a uid");
    world.kubectl.apply(&go_operator_children(NAME, &uid, &["v1", "v2", "v3"]));
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
    let api: Api<Balancer> = Api::namespaced(world.admin.clone(), GO_NS);
    // The condition's reasons, each with when it was first seen.
    let mut stages: Vec<(String, f64)> = Vec::new();
    while stages.last().map(|(r, _)| r.as_str()) != Some("Removed") {
        assert!(released.elapsed() < Duration::from_secs(120), "the takeover stalled at {stages:?}");
        let balancer = api.get(NAME).await.ok();
        let reason = balancer.as_ref().and_then(|b| wait::condition(b, "GoOperatorProxy")).map(|c| c.reason.as_str());
        if let Some(reason) = reason.filter(|r| stages.last().map(|(s, _)| s.as_str()) != Some(*r)) {
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
    let Stopped { sent, failures, answers, last_failure } = load.stop().await;
    if let Some(at) = last_failure {
        let after = at.checked_duration_since(released).map(|d| d.as_secs_f64());
        println!("node: the last failed request {after:.1?} s after the Lease was released (None: before it)");
    }

    let backends = ["hello world v1", "hello world v2", "hello world v3"];
    let go = answers.get("go proxy").copied().unwrap_or(0);
    let through_ours: usize = backends.iter().filter_map(|b| answers.get(*b)).sum();
    let unexpected: BTreeMap<&String, &usize> =
        answers.iter().filter(|(a, _)| *a != "go proxy" && !backends.contains(&a.as_str())).collect();
    let neither = unexpected.values().copied().sum::<usize>();
    println!(
        "node: during the takeover, {go} answers from the Go proxy, {through_ours} through ours, {neither} from neither"
    );
    assert_no_failures("during the takeover", sent, &failures);
    assert!(unexpected.is_empty(), "answers from neither proxy: {unexpected:?}");
    assert!(before_takeover.keys().eq(["go proxy"]), "before the takeover: {before_takeover:?}");
    // The last 3 s, after the Go operator's pods are gone: only backends, through our proxy.
    let last: BTreeMap<&String, usize> =
        answers.iter().map(|(a, n)| (a, n - after_takeover.get(a).unwrap_or(&0))).filter(|(_, n)| *n > 0).collect();
    assert!(!last.is_empty() && last.keys().all(|a| backends.contains(&a.as_str())), "at the end: {last:?}");
    let selector = world.kubectl.ok(&["-n", GO_NS, "get", "service", NAME, "-o", "jsonpath={.spec.selector}"]);
    assert!(selector.contains("\"app.kubernetes.io/component\":\"proxy\""), "the front Service selects {selector}");

    world.kubectl.ok(&["-n", GO_NS, "delete", "balancer", NAME]);
    world.kubectl.ok(&["delete", "namespace", GO_NS, "--wait=false"]);
}

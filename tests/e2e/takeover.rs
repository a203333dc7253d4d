//! A Balancer of the Go operator taken over without a gap in service.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::toolkit::runner::eventually;
use crate::{NS, World, apply, as_list, balancer_yaml_at, balancers, ready_condition, run_proxy_pods};

/// A Balancer the Go operator ran, rebuilt by hand as that operator leaves it (its children,
/// each with a controller owner reference to the Balancer's UID, and its status): the
/// children of the same names are taken over in place (same UIDs, so the Services keep their
/// cluster IPs), the front Service selects both proxies until this operator's is available,
/// then only it, and the Go operator's Deployment `<name>proxy` goes 10 s later.
pub(crate) async fn a_go_operator_balancer_is_taken_over_without_a_gap(world: &mut World) {
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

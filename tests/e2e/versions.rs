//! Two versions, conversion, and the scale subresource.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::toolkit::runner::eventually;
use crate::{NS, World, apply, balancer_yaml_at, balancers, sample_spec_yaml};

const SCALED: &str = "scaled";

pub(crate) async fn versions_convert_and_the_proxy_scales(world: &mut World) {
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

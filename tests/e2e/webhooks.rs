//! The webhooks, called by the API server.

use std::time::Duration;

use kube::api::DeleteParams;

use crate::toolkit::runner::eventually;
use crate::{World, apply, balancer_yaml, balancers, register_webhooks, repo_file};

pub(crate) async fn webhooks_are_called_by_the_api_server(world: &mut World) {
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

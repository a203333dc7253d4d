//! With the webhook down, writes are refused until it is back.

use std::time::Duration;

use kube::api::DeleteParams;

use crate::operator::Operator;
use crate::toolkit::runner::eventually;
use crate::{NS, World, apply, balancer_yaml, balancers, register_webhooks};

pub(crate) async fn webhook_down_blocks_writes_until_it_is_back(world: &mut World) {
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

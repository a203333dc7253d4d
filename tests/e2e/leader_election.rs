//! Leader election: the Lease changes hands, and only its holder reconciles.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::operator::Operator;
use crate::toolkit::runner::eventually;
use crate::{World, apply, balancer_yaml, reconciled, register_webhooks, webhook_answers};

pub(crate) async fn leader_election_hands_over(world: &mut World) {
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

//! RBAC: the operator as a token user bound only to deploy/rbac.yaml.

use std::time::Duration;

use kube::api::DeleteParams;

use crate::operator::Operator;
use crate::toolkit::cluster::OPERATOR;
use crate::toolkit::runner::eventually;
use crate::{LEGACY, World, apply_shipped_rbac, balancers, register_conversion};

pub(crate) async fn operator_runs_with_only_the_shipped_rbac(world: &mut World) {
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

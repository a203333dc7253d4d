//! RBAC: the operator as a token user bound only to deploy/rbac.yaml.

use std::time::Duration;

use balancer::proxy::{self, Owner};
use kube::api::DeleteParams;
use serde_json::{Value, json};

use crate::operator::Operator;
use crate::toolkit::cluster::OPERATOR;
use crate::toolkit::repo::repo_file;
use crate::toolkit::runner::eventually;
use crate::{
    LEGACY, NS, World, apply, apply_shipped_rbac, balancer_yaml, balancers, register_conversion, sample_spec_yaml,
};

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

/// deploy/'s ValidatingAdmissionPolicy, for the operator's token user (in a cluster, its
/// ServiceAccount): the proxy identity the operator builds passes, and a broader Role, one not
/// of the `<name>-proxy` shape, a binding to another subject and a ServiceAccount it does not
/// own are refused, each one the operator's RBAC alone would allow. Server-side dry runs, so
/// the policy is judged and nothing is stored (but the Role a binding names); all is removed
/// at the end.
pub(crate) async fn the_admission_policy_holds_the_operator_to_the_proxy_identity(world: &mut World) {
    apply_shipped_rbac(world);
    let policy = repo_file("deploy/admission-policy.yaml")
        .replace("system:serviceaccount:balancer-system:balancer", OPERATOR.name);
    let (ok, out) = apply(world, "admin", &policy);
    assert!(ok, "applying deploy/admission-policy.yaml failed: {out}");
    let (ok, out) = apply(world, "admin", &balancer_yaml("identity", &sample_spec_yaml()));
    assert!(ok, "{out}");
    let stored = balancers(world).get("identity").await.expect("the Balancer");
    let owner = Owner::of(&stored).expect("an owner");
    let as_operator = |object: Value| {
        let (ok, out, err) = world
            .plane
            .kubectl("operator")
            .run(&["create", "--dry-run=server", "-o", "name", "-f", "-"], Some(&object.to_string()));
        (ok, format!("{out}{err}"))
    };
    let identity = [
        serde_json::to_value(proxy::proxy_service_account(&owner)),
        serde_json::to_value(proxy::proxy_config_reader(&owner)),
        serde_json::to_value(proxy::proxy_config_reader_binding(&owner)),
    ];
    // The API server takes a while to start enforcing a new policy: until the first refusal.
    let broader = {
        let mut role = identity[1].as_ref().expect("a Role").clone();
        role["rules"][0]["verbs"] = json!(["get", "list", "watch", "patch"]);
        role
    };
    let refusal = eventually("the policy refusing a broader Role", Duration::from_secs(30), || async {
        let (ok, out) = as_operator(broader.clone());
        (!ok).then_some(out)
    })
    .await;
    assert!(refusal.contains("may only read the ConfigMap"), "{refusal}");
    // For real: the API server checks a binding against the Role it binds.
    for object in identity {
        let object = object.expect("serializes");
        let (ok, out) = as_operator(object.clone());
        assert!(ok, "the operator's own {} was refused: {out}", object["kind"]);
        if object["kind"] != "RoleBinding" {
            let (ok, out, err) =
                world.plane.kubectl("operator").run(&["create", "-o", "name", "-f", "-"], Some(&object.to_string()));
            assert!(ok, "the operator could not create its own {}: {out}{err}", object["kind"]);
        }
    }
    let mut other_name = broader.clone();
    other_name["rules"][0]["verbs"] = json!(["get"]);
    other_name["metadata"]["name"] = json!("reader");
    let mut any_configmap = other_name.clone();
    any_configmap["metadata"]["name"] = json!("identity-proxy");
    any_configmap["rules"][0].as_object_mut().expect("a rule").remove("resourceNames");
    let mut to_another_subject = serde_json::to_value(proxy::proxy_config_reader_binding(&owner)).expect("serializes");
    to_another_subject["subjects"][0]["name"] = json!("default");
    let unowned =
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "loose-proxy", "namespace": NS}});
    for (what, object) in [
        ("a Role not named <name>-proxy", other_name),
        ("a Role reading every ConfigMap", any_configmap),
        ("a binding of the Role to another ServiceAccount", to_another_subject),
        ("a ServiceAccount no Balancer owns", unowned),
    ] {
        let (ok, out) = as_operator(object);
        assert!(!ok && out.contains("balancer-proxy-identity"), "{what} was not refused by the policy: {out}");
    }
    let kubectl = world.plane.kubectl("admin");
    kubectl.ok(&["delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", "balancer-proxy-identity"]);
    kubectl.ok(&["-n", NS, "delete", "serviceaccount,role", "identity-proxy"]);
    balancers(world).delete("identity", &DeleteParams::default()).await.expect("delete the Balancer");
}

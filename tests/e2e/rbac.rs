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
    install_admission_policies(world);
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
    remove_admission_policies(world);
    world.plane.kubectl("admin").ok(&["-n", NS, "delete", "serviceaccount,role", "identity-proxy"]);
    balancers(world).delete("identity", &DeleteParams::default()).await.expect("delete the Balancer");
}

/// Both policies of `deploy/admission-policy.yaml`, and their bindings.
const POLICIES: &str = "balancer-proxy-identity,balancer-proxy-workloads";

/// Applies `deploy/admission-policy.yaml`, naming the e2e operator's user in place of the
/// installed operator's ServiceAccount.
/// Whom the shipped policies hold: every ServiceAccount named `balancer`, in any namespace.
const OPERATOR_CONDITION: &str =
    "request.userInfo.username.startsWith('system:serviceaccount:') && request.userInfo.username.endsWith(':balancer')";

fn install_admission_policies(world: &World) {
    // The e2e operator is a token user, not a ServiceAccount: the policy is held to its name.
    let operator = format!("request.userInfo.username == '{}'", OPERATOR.name);
    let policy = repo_file("deploy/admission-policy.yaml").replace(OPERATOR_CONDITION, &operator);
    assert_eq!(policy.matches(&operator).count(), 2, "both policies name the operator as {OPERATOR_CONDITION}");
    let (ok, out) = apply(world, "admin", &policy);
    assert!(ok, "applying deploy/admission-policy.yaml failed: {out}");
}

fn remove_admission_policies(world: &World) {
    let kubectl = world.plane.kubectl("admin");
    for kind in ["validatingadmissionpolicybinding", "validatingadmissionpolicy"] {
        for name in POLICIES.split(',') {
            kubectl.ok(&["delete", kind, name]);
        }
    }
}

/// The admission policy holds the operator's token to the workloads it builds: the Deployment,
/// ConfigMap, Services and PodDisruptionBudget the operator makes for a Balancer, with and
/// without the metrics sidecar, pass (and the running operator makes the Balancer's own under
/// it); each write of a stolen token that its RBAC alone allows
/// is refused: a Deployment in `kube-system` no Balancer owns, the proxy Deployment made
/// privileged, given the host's network or a hostPath, or run as another ServiceAccount, a
/// Service with `externalIPs` (CVE-2020-8554), `kube-system/coredns`' ConfigMap rewritten,
/// and a ConfigMap not named after its Balancer. Server-side dry runs, as above.
pub(crate) async fn the_admission_policy_holds_the_operators_workloads(world: &mut World) {
    use balancer::proxy::signature::ConfigSigner;
    use balancer::proxy::{BackendTarget, ProxySettings};
    use balancer::spec::{ObjectName, SpecPolicy, admit};

    apply_shipped_rbac(world);
    install_admission_policies(world);
    let (ok, out) = apply(world, "admin", &balancer_yaml("workloads", &sample_spec_yaml()));
    assert!(ok, "{out}");
    let stored = balancers(world).get("workloads").await.expect("the Balancer");
    // Children of the Balancer under names the running operator does not make itself.
    let owner = Owner { name: "dry-run".into(), ..Owner::of(&stored).expect("an owner") };
    let spec = admit(ObjectName::Name("workloads"), stored.spec.clone(), &SpecPolicy::default()).expect("valid");
    let targets: Vec<BackendTarget<'_>> =
        spec.backends.iter().map(|spec| BackendTarget { spec, cluster_ip: None, ready_pods: None }).collect();
    let key = ConfigSigner::generate().expect("a key");
    let settings = |metrics_image: Option<&str>| ProxySettings {
        image: "nginxinc/nginx-unprivileged:1.28.0-alpine".into(),
        load_modules: Vec::new(),
        metrics_image: metrics_image.map(str::to_string),
        policy: SpecPolicy::default(),
        signer: Some(ConfigSigner::from_pkcs8(&key).expect("the key reads")),
    };
    let live = proxy::proxy(&owner, &spec, &settings(Some("balancer:dev")), &targets);
    let mounted = proxy::proxy(&owner, &spec, &settings(None), &targets);
    let value = |object: Result<Value, serde_json::Error>| object.expect("serializes");
    let mut own = vec![
        value(serde_json::to_value(&live.deployment)),
        value(serde_json::to_value(&mounted.deployment)),
        value(serde_json::to_value(&live.config_map)),
        value(serde_json::to_value(&live.front_service)),
        value(serde_json::to_value(proxy::proxy_disruption_budget(&owner))),
    ];
    own.extend(proxy::backend_services(&owner, &spec).iter().map(|s| value(serde_json::to_value(s))));
    let as_operator = |object: &Value| {
        let (ok, out, err) = world
            .plane
            .kubectl("operator")
            .run(&["create", "--dry-run=server", "-o", "name", "-f", "-"], Some(&object.to_string()));
        (ok, format!("{out}{err}"))
    };
    let deployment = value(serde_json::to_value(&live.deployment));
    let changed = |change: &dyn Fn(&mut Value)| {
        let mut object = deployment.clone();
        change(&mut object);
        object
    };
    // Privileged needs privilege escalation allowed, or the API server refuses the object itself.
    let privileged = changed(&|d| {
        let context = &mut d["spec"]["template"]["spec"]["containers"][0]["securityContext"];
        context["privileged"] = json!(true);
        context["allowPrivilegeEscalation"] = json!(true);
    });
    // The API server takes a while to start enforcing a new policy: until the first refusal.
    let refusal = eventually("the policy refusing a privileged proxy", Duration::from_secs(30), || async {
        let (ok, out) = as_operator(&privileged);
        (!ok).then_some(out)
    })
    .await;
    assert!(refusal.contains("balancer-proxy-workloads"), "{refusal}");
    for object in &own {
        let (ok, out) = as_operator(object);
        assert!(ok, "the operator's own {} {} was refused: {out}", object["kind"], object["metadata"]["name"]);
    }
    let mut elsewhere = changed(&|d| {
        d["metadata"]["namespace"] = json!("kube-system");
        d["metadata"]["name"] = json!("kube-proxy-helper");
    });
    elsewhere["metadata"].as_object_mut().expect("metadata").remove("ownerReferences");
    // A host-network pod may not set the port sysctl: the API server refuses the object itself.
    let host_network = changed(&|d| {
        d["spec"]["template"]["spec"]["hostNetwork"] = json!(true);
        d["spec"]["template"]["spec"]["securityContext"].as_object_mut().map(|c| c.remove("sysctls"));
    });
    let host_path = changed(&|d| {
        let volumes = d["spec"]["template"]["spec"]["volumes"].as_array_mut().expect("volumes");
        volumes.push(json!({"name": "root", "hostPath": {"path": "/"}}));
    });
    let another_account = changed(&|d| d["spec"]["template"]["spec"]["serviceAccountName"] = json!("default"));
    let mut external = value(serde_json::to_value(&live.front_service));
    external["spec"]["externalIPs"] = json!(["192.0.2.10"]);
    let coredns = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "coredns", "namespace": "kube-system"}, "data": {"Corefile": ". { forward . 192.0.2.53 }"}});
    let mut misnamed = value(serde_json::to_value(&live.config_map));
    misnamed["metadata"]["name"] = json!("other-config");
    for (what, object) in [
        ("a Deployment in kube-system no Balancer owns", &elsewhere),
        ("a proxy Deployment with the host's network", &host_network),
        ("a proxy Deployment mounting the host's root", &host_path),
        ("a proxy Deployment running as another ServiceAccount", &another_account),
        ("a Service with externalIPs", &external),
        ("kube-system/coredns rewritten", &coredns),
        ("a ConfigMap not named after its Balancer", &misnamed),
    ] {
        let (ok, out) = as_operator(object);
        assert!(!ok && out.contains("balancer-proxy-workloads"), "{what} was not refused by the policy: {out}");
    }
    // A child whose ownerReference was removed, still carrying balancer's labels, may be adopted
    // back (the operator does, see docs/security.md); a ConfigMap without them may not be taken.
    let config_map = value(serde_json::to_value(&live.config_map));
    let mut orphan = config_map.clone();
    orphan["metadata"].as_object_mut().expect("metadata").remove("ownerReferences");
    let mut users = orphan.clone();
    users["metadata"]["name"] = json!("dry-run-users-own");
    users["metadata"].as_object_mut().expect("metadata").remove("labels");
    let admin = world.plane.kubectl("admin");
    for object in [&orphan, &users] {
        admin.ok_with(&["create", "-f", "-"], &object.to_string());
    }
    let adopted = |orphan: &Value| {
        let mut object = config_map.clone();
        object["metadata"]["name"] = orphan["metadata"]["name"].clone();
        let args =
            ["apply", "--server-side", "--force-conflicts", "--field-manager=balancer", "--dry-run=server", "-f", "-"];
        let (ok, out, err) = world.plane.kubectl("operator").run(&args, Some(&object.to_string()));
        (ok, format!("{out}{err}"))
    };
    let (ok, out) = adopted(&orphan);
    assert!(ok, "the operator could not adopt its own orphaned ConfigMap back: {out}");
    let (ok, out) = adopted(&users);
    assert!(!ok && out.contains("balancer-proxy-workloads"), "a user's ConfigMap was taken: {out}");
    // Adopting is an update: an orphan may not be deleted by the operator's token.
    let mut orphaned_service = value(serde_json::to_value(&live.front_service));
    orphaned_service["metadata"].as_object_mut().expect("metadata").remove("ownerReferences");
    admin.ok_with(&["create", "-f", "-"], &orphaned_service.to_string());
    let service = orphaned_service["metadata"]["name"].as_str().expect("a name");
    let args = ["-n", NS, "delete", "service", service, "--dry-run=server"];
    let (ok, out, err) = world.plane.kubectl("operator").run(&args, None);
    assert!(!ok && err.contains("balancer-proxy-workloads"), "an orphan was deletable: {out}{err}");
    admin.ok(&["-n", NS, "delete", "service", service]);
    for object in [&orphan, &users] {
        let name = object["metadata"]["name"].as_str().expect("a name");
        admin.ok(&["-n", NS, "delete", "configmap", name]);
    }
    remove_admission_policies(world);
    balancers(world).delete("workloads", &DeleteParams::default()).await.expect("delete the Balancer");
}

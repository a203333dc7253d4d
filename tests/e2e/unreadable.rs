//! A stored Balancer the controller cannot read is reported on itself, and the operator still
//! stops promptly.

use std::time::Duration;

use balancer::api::Balancer;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::operator::Operator;
use crate::toolkit::cluster::{ControlPlane, NOBODY};
use crate::toolkit::runner::eventually;
use crate::{
    CRD, NS, World, apply, balancer_yaml, balancers, reconciled, shipped_crd, stored_crd, unregister_webhooks,
    yaml_docs,
};

/// Where the schema of `spec.ports[].targetPort` sits in a CRD served at `version`.
fn target_port_pointer(crd: &Value, version: &str) -> String {
    let versions = crd["spec"]["versions"].as_array().expect("spec.versions");
    let index = versions.iter().position(|v| v["name"] == version).expect("the served version");
    format!(
        "/spec/versions/{index}/schema/openAPIV3Schema/properties/spec/properties/ports/items/properties/targetPort"
    )
}

/// Replaces the stored CRD's schema of `spec.ports[].targetPort` with `schema`, and checks it is stored.
fn set_target_port_schema(world: &World, schema: &Value) {
    let pointer = target_port_pointer(&stored_crd(world), balancer::api::STORAGE_VERSION);
    let patch = json!([{"op": "replace", "path": pointer, "value": schema}]).to_string();
    let (ok, out, err) = world.plane.kubectl("admin").run(&["patch", "crd", CRD, "--type=json", "-p", &patch], None);
    assert!(ok, "patching the CRD schema failed: {out}{err}");
    // Compared as schemas: the API server writes `1.0` back as `1`.
    let as_schema = |v: &Value| serde_json::from_value::<JSONSchemaProps>(v.clone()).expect("a schema");
    let stored = stored_crd(world).pointer(&pointer).map(as_schema);
    assert_eq!(stored, Some(as_schema(schema)), "the stored targetPort schema");
}

/// Balancers as schemaless objects: readable whatever their spec holds.
fn dynamic_balancers(world: &World) -> Api<DynamicObject> {
    Api::namespaced_with(world.admin.clone(), NS, &ApiResource::erase::<Balancer>(&()))
}

/// Sends SIGTERM to `operator` and checks that it exits, cleanly, within `limit`.
fn assert_exits_on_sigterm(plane: &ControlPlane, operator: &mut Operator, limit: Duration) {
    let Some((took, status)) = operator.process.terminate(limit) else {
        panic!("{} still running {limit:?} after SIGTERM", operator.name);
    };
    assert!(status.success(), "{} exited with {status} on SIGTERM; log:\n{}", operator.name, operator.log(plane));
    println!("e2e: {} exited {:.1} s after SIGTERM", operator.name, took.as_secs_f64());
}

pub(crate) async fn an_unreadable_stored_balancer_is_reported_on_itself(world: &mut World) {
    // Without webhooks, and with the schema of before targetPort was bounded, a Balancer the
    // operator's types cannot hold gets stored: targetPort 3000000000 is no 32-bit integer.
    for mut op in world.operators.drain(..) {
        op.stop();
    }
    unregister_webhooks(world);
    let shipped: Value = yaml_docs(&shipped_crd()).remove(0);
    let shipped_target_port =
        shipped.pointer(&target_port_pointer(&shipped, balancer::api::STORAGE_VERSION)).unwrap().clone();
    set_target_port_schema(world, &json!({"x-kubernetes-int-or-string": true}));
    let unreadable = balancer_yaml(
        "unreadable",
        "spec:\n  ports: [{name: http, port: 80, targetPort: 3000000000}]\n  \
             backends: [{name: a, weight: 1, selector: {app: a}}]\n",
    );
    let healthy = balancer_yaml(
        "healthy",
        "spec:\n  ports: [{port: 80}]\n  backends: [{name: a, weight: 1, selector: {app: a}}]\n",
    );
    for (name, yaml) in [("unreadable", &unreadable), ("healthy", &healthy)] {
        // The API server picks up the schema and the webhook removal a moment later.
        eventually(&format!("Balancer {name} stored"), Duration::from_secs(20), || async {
            let (ok, out) = apply(world, "admin", yaml);
            ok.then_some(()).or_else(|| {
                eprintln!("retrying: {out}");
                None
            })
        })
        .await;
    }
    let dynamic = dynamic_balancers(world);
    let stored = dynamic.get("unreadable").await.unwrap();
    assert_eq!(stored.data["spec"]["ports"][0]["targetPort"], json!(3_000_000_000_u64));

    // The operator still becomes ready, reconciles the others and reports the problem on the object itself.
    let delay = Duration::from_secs(1);
    let shutdown_delay = format!("--shutdown-delay={}s", delay.as_secs());
    let operator = Operator::start(&world.plane, "operator-e", &[&shutdown_delay]).await;
    world.operators.push(operator);
    reconciled(world, "healthy").await;
    let api = balancers(world);
    eventually("healthy's status: 1 active backend", Duration::from_secs(30), || {
        let api = api.clone();
        async move {
            let b = api.get("healthy").await.ok()?;
            (b.status?.active_backends == 1).then_some(())
        }
    })
    .await;
    let ready = eventually("a Ready condition on unreadable", Duration::from_secs(30), || async {
        let object = dynamic.get("unreadable").await.ok()?;
        let conditions = object.data["status"]["conditions"].as_array()?.clone();
        conditions.into_iter().find(|c| c["type"] == "Ready")
    })
    .await;
    assert_eq!((&ready["status"], &ready["reason"]), (&json!("False"), &json!("InvalidSpec")), "{ready:#}");
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(message.contains("spec.ports[0].targetPort"), "the message names the field: {ready:#}");

    // The shipped schema refuses such a Balancer even with no webhook.
    set_target_port_schema(world, &shipped_target_port);
    let again = balancer_yaml(
        "unreadable-again",
        "spec:\n  ports: [{port: 80, targetPort: 3000000000}]\n  backends: [{name: a, selector: {app: a}}]\n",
    );
    let refused = eventually("the schema to refuse targetPort 3000000000", Duration::from_secs(20), || async {
        let (ok, out) = apply(world, "admin", &again);
        (!ok).then_some(out)
    })
    .await;
    assert!(refused.contains("targetPort"), "{refused}");

    // SIGTERM ends the process within the shutdown delay, whatever state the controller is in:
    // with every Balancer handled...
    let limit = delay + Duration::from_secs(10);
    assert_exits_on_sigterm(&world.plane, &mut world.operators[0], limit);

    // ... and with a controller that cannot even read its signing key, its first request, let
    // alone list Balancers (a user without RBAC).
    let blind = Operator::start_alive(&world.plane, "operator-f", NOBODY.name, &[&shutdown_delay]).await;
    world.operators.push(blind);
    eventually("the signing key's read as nobody to be forbidden", Duration::from_secs(20), || async {
        let forbidden = world.plane.audit_events().iter().any(|e| {
            e["user"]["username"] == NOBODY.name
                && e["objectRef"]["resource"] == "secrets"
                && e["responseStatus"]["code"] == 403
        });
        forbidden.then_some(())
    })
    .await;
    let blind = &world.operators[1];
    // Ready all the same: readiness means "can answer the API server", never the caches.
    assert_eq!(blind.probe("/readyz").await, Some(200), "{} serves the webhooks", blind.name);
    assert!(!blind.log(&world.plane).contains("controller caches synced"), "{} synced as nobody", blind.name);
    assert_exits_on_sigterm(&world.plane, &mut world.operators[1], limit);
    world.operators.clear();

    // The unreadable Balancer can be deleted like any other.
    dynamic.delete("unreadable", &DeleteParams::default()).await.unwrap();
    balancers(world).delete("healthy", &DeleteParams::default()).await.unwrap();
    eventually("both Balancers gone", Duration::from_secs(30), || async {
        let left = dynamic.list(&ListParams::default()).await.ok()?.items;
        (!left.iter().any(|b| ["unreadable", "healthy"].contains(&b.name_any().as_str()))).then_some(())
    })
    .await;
}

//! The CRD: the release before's v1alpha1-only CRD and a Balancer stored under it, then the
//! upgrade to `balancer crd` as shipped, which `kubectl explain` describes in both versions.

use std::time::Duration;

use serde_json::{Value, json};

use crate::toolkit::runner::eventually;
use crate::{
    LEGACY, World, apply, balancer_yaml_at, install_shipped_crd, sample_spec_yaml, shipped_crd, stored_crd,
    wait_established, yaml_docs,
};

/// The CRD of the release before v1beta1: v1alpha1 alone, stored as such, no conversion.
fn v1alpha1_only_crd() -> Value {
    let mut crd: Value = yaml_docs(&shipped_crd()).remove(0);
    let versions = crd["spec"]["versions"].as_array_mut().expect("versions");
    versions.retain(|v| v["name"] == "v1alpha1");
    versions[0]["storage"] = json!(true);
    let spec = crd["spec"].as_object_mut().expect("spec");
    spec.remove("conversion");
    crd["metadata"].as_object_mut().expect("metadata").remove("annotations");
    crd
}

pub(crate) async fn crd_is_accepted_and_established(world: &mut World) {
    // The release before: its CRD, and a Balancer stored as v1alpha1.
    let (ok, out) = apply(world, "admin", &v1alpha1_only_crd().to_string());
    assert!(ok, "the v1alpha1-only CRD: {out}");
    wait_established(world);
    let (ok, out) = apply(world, "admin", &balancer_yaml_at("v1alpha1", LEGACY, &sample_spec_yaml()));
    assert!(ok, "a Balancer under the v1alpha1-only CRD: {out}");

    // The upgrade: `balancer crd` as shipped (v1beta1 stored, conversion by webhook).
    install_shipped_crd(world);
    let stored = stored_crd(world);
    assert_eq!(stored["status"]["storedVersions"], json!(["v1alpha1", "v1beta1"]), "{stored:#}");

    // `kubectl explain` speaks to a user, in both versions, once the API server publishes the
    // new schema (its OpenAPI controller follows the CRD within seconds). kubectl wraps lines.
    let explain = |what: &str, version: &str| {
        let api_version = format!("--api-version=exposer.hliangzhao.io/{version}");
        let (_, out, err) = world.plane.kubectl("admin").run(&["explain", what, &api_version], None);
        format!("{out}{err}").split_whitespace().collect::<Vec<_>>().join(" ")
    };
    for version in ["v1beta1", "v1alpha1"] {
        let explained = eventually("kubectl explain to give the new schema", Duration::from_secs(30), || async {
            let out = explain("balancers", version);
            out.contains("A Balancer is a weighted TCP/UDP load balancer").then_some(out)
        })
        .await;
        assert!(explained.contains(&format!("{version} is")), "{explained}");
        let spec = explain("balancers.spec", version);
        assert!(spec.contains("A weighted TCP/UDP load balancer in front of a set of backends"), "{spec}");
    }
}

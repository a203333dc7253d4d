//! Every child's owner reference (the Balancer as its controller), name and labels.

use balancer::proxy::{BACKEND_LABEL, BALANCER_NAME_LABEL, COMPONENT_LABEL, MANAGED_BY_LABEL, Owner, OwnerError};

use super::fixtures::{UID, desired_for, labels, owner, pod_labels, sample};

#[test]
fn owner_reference_is_the_controller_reference_of_the_balancer() {
    let owner = owner(&sample());
    assert_eq!(owner.name, "example-balancer");
    assert_eq!(owner.namespace, "default");
    let reference = &owner.reference;
    assert_eq!(reference.api_version, "exposer.hliangzhao.io/v1beta1", "the storage version");
    assert_eq!(reference.kind, "Balancer");
    assert_eq!(reference.name, "example-balancer");
    assert_eq!(reference.uid, UID);
    assert_eq!(reference.controller, Some(true));
}

/// `Owner::of` promises `blockOwnerDeletion` (so do the README and `balancer render`,
/// which writes `blockOwnerDeletion: true`), but it takes kube's `controller_owner_ref`,
/// which sets only `controller: true` and leaves `blockOwnerDeletion` unset.
#[test]
fn owner_reference_blocks_owner_deletion() {
    let balancer = sample();
    assert_eq!(owner(&balancer).reference.block_owner_deletion, Some(true));
    let desired = desired_for(&balancer);
    for meta in desired.backend_services.iter().map(|s| &s.metadata).chain([&desired.deployment.metadata]) {
        let reference = &meta.owner_references.as_ref().expect("ownerReferences")[0];
        assert_eq!(reference.block_owner_deletion, Some(true), "{:?}", meta.name);
    }
}

#[test]
fn owner_requires_name_namespace_and_uid() {
    let mut no_name = sample();
    no_name.metadata.name = None;
    assert_eq!(Owner::of(&no_name).unwrap_err(), OwnerError::MissingName);

    let mut no_namespace = sample();
    no_namespace.metadata.namespace = None;
    assert_eq!(Owner::of(&no_namespace).unwrap_err(), OwnerError::MissingNamespace);

    let mut no_uid = sample();
    no_uid.metadata.uid = None;
    assert_eq!(Owner::of(&no_uid).unwrap_err(), OwnerError::MissingUid);
}

#[test]
fn every_child_points_back_to_the_balancer() {
    let balancer = sample();
    let desired = desired_for(&balancer);
    let expected = vec![owner(&balancer).reference];
    let metas = desired.backend_services.iter().map(|s| &s.metadata).chain([
        &desired.config_map.metadata,
        &desired.deployment.metadata,
        &desired.front_service.metadata,
    ]);
    for meta in metas {
        assert_eq!(meta.owner_references.as_ref(), Some(&expected), "{:?}", meta.name);
        assert_eq!(meta.namespace.as_deref(), Some("default"), "{:?}", meta.name);
    }
}

#[test]
fn children_are_named_after_the_balancer() {
    let desired = desired_for(&sample());
    let backend_names: Vec<_> =
        desired.backend_services.iter().map(|s| s.metadata.name.clone().expect("name")).collect();
    assert_eq!(
        backend_names,
        ["example-balancer-v1-backend", "example-balancer-v2-backend", "example-balancer-v3-backend"]
    );
    assert_eq!(desired.deployment.metadata.name.as_deref(), Some("example-balancer-proxy"));
    assert_eq!(desired.config_map.metadata.name.as_deref(), Some("example-balancer-proxy-configmap"));
    assert_eq!(desired.front_service.metadata.name.as_deref(), Some("example-balancer"));
}

#[test]
fn children_carry_managed_by_balancer_name_and_component_labels() {
    let desired = desired_for(&sample());
    let common = |component: &str| {
        labels(&[
            (MANAGED_BY_LABEL, "balancer"),
            (BALANCER_NAME_LABEL, "example-balancer"),
            (COMPONENT_LABEL, component),
        ])
    };
    assert_eq!(MANAGED_BY_LABEL, "app.kubernetes.io/managed-by");
    assert_eq!(COMPONENT_LABEL, "app.kubernetes.io/component");
    assert_eq!(BALANCER_NAME_LABEL, "balancer.exposer.hliangzhao.io/balancer-name");
    for (service, backend) in desired.backend_services.iter().zip(["v1", "v2", "v3"]) {
        let mut expected = common("backend");
        expected.insert(BACKEND_LABEL.into(), backend.into());
        assert_eq!(service.metadata.labels.as_ref(), Some(&expected));
    }
    assert_eq!(desired.config_map.metadata.labels.as_ref(), Some(&common("proxy")));
    assert_eq!(desired.deployment.metadata.labels.as_ref(), Some(&common("proxy")));
    assert_eq!(pod_labels(&desired.deployment), &common("proxy"));
    assert_eq!(desired.front_service.metadata.labels.as_ref(), Some(&common("frontend")));
}

/// A child that lost its ownerReference and still carries balancer's labels naming its owner is
/// the owner's to take back; a namesake under another controller, one labelled for another
/// owner, and one without balancer's labels are not.
#[test]
fn an_orphan_with_balancers_labels_is_adopted_and_nothing_else() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let balancer = sample();
    let owner = owner(&balancer);
    let child = desired_for(&balancer).config_map;
    assert!(!owner.adopts(&child), "still controlled: its own, not an orphan");
    let mut orphan = child.clone();
    orphan.metadata.owner_references = None;
    assert!(owner.adopts(&orphan), "its ownerReference removed");
    let mut held = orphan.clone();
    let another = OwnerReference { controller: Some(true), uid: "another".into(), ..OwnerReference::default() };
    held.metadata.owner_references = Some(vec![another.clone()]);
    assert!(!owner.adopts(&held), "held by another controller");
    let mut referenced = orphan.clone();
    referenced.metadata.owner_references = Some(vec![OwnerReference { controller: None, ..another }]);
    assert!(owner.adopts(&referenced), "referenced, but not controlled, by another object");
    let mut elsewhere = orphan.clone();
    elsewhere.metadata.labels.get_or_insert_default().insert(BALANCER_NAME_LABEL.into(), "another".into());
    assert!(!owner.adopts(&elsewhere), "labelled for another owner");
    for label in [MANAGED_BY_LABEL, BALANCER_NAME_LABEL] {
        let mut unlabelled = orphan.clone();
        unlabelled.metadata.labels.get_or_insert_default().remove(label);
        assert!(!owner.adopts(&unlabelled), "without {label}");
    }
}

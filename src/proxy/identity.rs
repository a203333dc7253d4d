//! The proxy pods' own identity, for live configuration: a ServiceAccount that may read its
//! Balancer's ConfigMap and nothing else (a Role naming that one ConfigMap, and its binding).
//!
//! The metrics sidecar watches that ConfigMap with the pod's token, so a new `nginx.conf`
//! reaches running proxies in well under a second, with no pod rolled. The token is mounted in
//! the sidecar only; nginx never sees it.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};

use super::meta::{COMPONENT_PROXY, Owner, labels, metadata};
use crate::api;

/// What the proxy pods' token may do: read their own ConfigMap, as a watch needs (a list and a
/// watch with a `metadata.name` field selector are authorized by `resourceNames`).
pub const CONFIG_READER_VERBS: [&str; 3] = ["get", "list", "watch"];

/// `<balancer>-proxy` ServiceAccount. Its token is not mounted by default: the pod projects one
/// into the sidecar only.
pub fn proxy_service_account(owner: &Owner) -> ServiceAccount {
    ServiceAccount {
        metadata: metadata(owner, api::proxy_account_name(&owner.name), labels(&owner.name, COMPONENT_PROXY)),
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    }
}

/// `<balancer>-proxy` Role: read `<balancer>-proxy-configmap`, only.
pub fn proxy_config_reader(owner: &Owner) -> Role {
    Role {
        metadata: metadata(owner, api::proxy_account_name(&owner.name), labels(&owner.name, COMPONENT_PROXY)),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(vec![api::proxy_configmap_name(&owner.name)]),
            verbs: CONFIG_READER_VERBS.map(String::from).to_vec(),
            non_resource_urls: None,
        }]),
    }
}

/// `<balancer>-proxy` RoleBinding: the Role, for the ServiceAccount.
pub fn proxy_config_reader_binding(owner: &Owner) -> RoleBinding {
    let name = api::proxy_account_name(&owner.name);
    RoleBinding {
        metadata: metadata(owner, name.clone(), labels(&owner.name, COMPONENT_PROXY)),
        role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "Role".into(), name: name.clone() },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: Some(owner.namespace.clone()),
            api_group: None,
        }]),
    }
}

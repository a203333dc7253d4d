//! Who a child belongs to and how it says so: the owner reference, the labels every child
//! carries, and the hash that marks what the controller last wanted.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use serde::Serialize;

use super::signature::Subject;
use crate::util::hash::sha256_hex;

/// Label every child carries: who manages it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The `app.kubernetes.io/managed-by` value of everything balancer makes.
pub const MANAGED_BY: &str = "balancer";
/// Label every child carries: which Balancer owns it.
pub const BALANCER_NAME_LABEL: &str = "balancer.exposer.hliangzhao.io/balancer-name";
/// Label telling children apart: `backend`, `proxy` or `frontend`.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// Label on backend Services: the backend's name.
pub const BACKEND_LABEL: &str = "balancer.exposer.hliangzhao.io/backend";
/// Pod template annotation: hash of `nginx.conf` (which holds the backends' cluster IPs),
/// so a config change rolls the proxy pods.
pub const CONFIG_HASH_ANNOTATION: &str = "balancer.exposer.hliangzhao.io/config-hash";

/// Annotation on every child: a hash of the child as the controller last wanted it. A field
/// dropped from the spec (a node selector, an annotation, a source range) changes it, so the
/// child is applied again and server-side apply removes the field; the comparison with the
/// child as it is would otherwise find every field still asked for present, and do nothing.
pub const DESIRED_HASH_ANNOTATION: &str = "balancer.exposer.hliangzhao.io/desired-hash";

/// The `component` label of a backend Service.
pub const COMPONENT_BACKEND: &str = "backend";
/// The `component` label of the proxy pods and their Deployment, ConfigMap and identity.
pub const COMPONENT_PROXY: &str = "proxy";
/// The `component` label of the front Service.
pub const COMPONENT_FRONTEND: &str = "frontend";

/// The Balancer (or Gateway) a child belongs to: the name its children are named after, its
/// namespace, the ownerReference children carry, and the identity its configuration is signed
/// for.
#[derive(Debug, Clone)]
pub struct Owner {
    /// The name children are named and labelled after: a Balancer's own name, or a Gateway's
    /// proxy name (see [`gateway_proxy_name`](crate::api::gateway_proxy_name)).
    pub name: String,
    /// The Balancer's namespace, every child's.
    pub namespace: String,
    /// The controller reference to the Balancer.
    pub reference: OwnerReference,
    /// Who the proxy serves, as its configuration's signature and the sidecar's `--owner` name
    /// it ([`ProxyConfig::identity`](super::model::ProxyConfig::identity)): a Balancer's name,
    /// or `Gateway/<name>`.
    pub identity: String,
}

#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OwnerError {
    #[error("the Balancer has no metadata.name")]
    MissingName,
    #[error("the Balancer has no metadata.namespace")]
    MissingNamespace,
    #[error("the Balancer has no metadata.uid (it has not been stored by the API server)")]
    MissingUid,
}

impl Owner {
    /// The controller owner reference of a stored Balancer (`controller` and `blockOwnerDeletion` set).
    pub fn of<K: Resource<DynamicType = ()>>(balancer: &K) -> Result<Owner, OwnerError> {
        let name = balancer.meta().name.clone().ok_or(OwnerError::MissingName)?;
        let namespace = balancer.meta().namespace.clone().ok_or(OwnerError::MissingNamespace)?;
        let mut reference = balancer.controller_owner_ref(&()).ok_or(OwnerError::MissingUid)?;
        // kube sets only `controller`; blocking owner deletion lets foreground deletion of a
        // Balancer wait for its children.
        reference.block_owner_deletion = Some(true);
        Ok(Owner { identity: name.clone(), name, namespace, reference })
    }

    /// Whom its proxy's configurations are signed for.
    pub fn subject(&self) -> Subject<'_> {
        Subject { namespace: &self.namespace, owner: &self.identity, uid: &self.reference.uid }
    }

    /// Whether `object` is this owner's child that lost its controller reference (removed by
    /// hand, or by an orphaning delete of a namesake): no controller at all, and balancer's labels
    /// naming this owner. Such a child is taken back, as the ReplicaSet controller adopts the
    /// orphans its selector matches; an object holding the name under another controller, or
    /// without balancer's labels, never is.
    pub fn adopts(&self, object: &impl Resource) -> bool {
        let labels = object.meta().labels.as_ref();
        let label = |name: &str| labels.and_then(|l| l.get(name)).map(String::as_str);
        let references = object.meta().owner_references.iter().flatten();
        !references.into_iter().any(|r| r.controller == Some(true))
            && label(MANAGED_BY_LABEL) == Some(MANAGED_BY)
            && label(BALANCER_NAME_LABEL) == Some(self.name.as_str())
    }
}

/// `desired` with [`DESIRED_HASH_ANNOTATION`] set to the hash of everything else in it.
pub fn stamped<K: Resource + Serialize + Clone>(desired: &K) -> Result<K, serde_json::Error> {
    let hash = sha256_hex(&serde_json::to_string(desired)?);
    let mut stamped = desired.clone();
    let annotations = stamped.meta_mut().annotations.get_or_insert_default();
    annotations.insert(DESIRED_HASH_ANNOTATION.to_string(), hash[..16].to_string());
    Ok(stamped)
}

/// The labels every child of `balancer` carries, plus its component.
pub fn labels(balancer: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (BALANCER_NAME_LABEL.to_string(), balancer.to_string()),
        (COMPONENT_LABEL.to_string(), component.to_string()),
    ])
}

/// Selects the proxy pods of one Balancer; also the Deployment's (immutable) selector.
pub fn proxy_selector(balancer: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (BALANCER_NAME_LABEL.to_string(), balancer.to_string()),
        (COMPONENT_LABEL.to_string(), COMPONENT_PROXY.to_string()),
    ])
}

/// [`proxy_selector`] as the string a scale subresource reports (`status.selector`), which a
/// HorizontalPodAutoscaler uses to find the pods whose metrics it averages.
pub fn proxy_selector_string(balancer: &str) -> String {
    proxy_selector(balancer).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

pub(super) fn metadata(owner: &Owner, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(owner.namespace.clone()),
        labels: Some(labels),
        owner_references: Some(vec![owner.reference.clone()]),
        ..ObjectMeta::default()
    }
}

//! What to keep and what to delete, decided from the caches alone: whose a child is, and which
//! backend Services a Balancer no longer names.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};

use super::cache::Cached;
use crate::proxy::{BALANCER_NAME_LABEL, COMPONENT_BACKEND, COMPONENT_LABEL, MANAGED_BY, MANAGED_BY_LABEL, Owner};

/// Whether `object`'s controller ownerReference is `owner`.
pub(super) fn controlled_by(object: &impl Resource, owner: &Owner) -> bool {
    object.owner_references().iter().any(|r| r.controller == Some(true) && r.uid == owner.reference.uid)
}

/// The cluster IP the API server gave a backend Service: where nginx sends its traffic.
pub(super) fn cluster_ip(service: &Service) -> Option<IpAddr> {
    service.spec.as_ref()?.cluster_ip.as_deref()?.parse().ok()
}

/// Backend Services this Balancer controls but no longer names.
pub(super) fn obsolete_backends(
    cache: &Store<Cached<Service>>,
    owner: &Owner,
    wanted: &[Service],
) -> Vec<Arc<Cached<Service>>> {
    let wanted: Vec<String> = wanted.iter().map(ResourceExt::name_any).collect();
    owned_backend_services(cache, owner).into_iter().filter(|s| !wanted.contains(&s.name_any())).collect()
}

/// Backend Services in the cache that `owner` controls.
pub(super) fn owned_backend_services(cache: &Store<Cached<Service>>, owner: &Owner) -> Vec<Arc<Cached<Service>>> {
    cache
        .state()
        .into_iter()
        .filter(|s| s.namespace().as_deref() == Some(owner.namespace.as_str()))
        .filter(|s| {
            let labels = s.labels();
            labels.get(COMPONENT_LABEL).map(String::as_str) == Some(COMPONENT_BACKEND)
                && labels.get(BALANCER_NAME_LABEL) == Some(&owner.name)
                && labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
        })
        .filter(|s| controlled_by(s.as_ref(), owner))
        .collect()
}

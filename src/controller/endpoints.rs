//! A backend Service's `v1` Endpoints, as the controller keeps it: how many ready addresses it
//! lists, and which Balancer it belongs to.
//!
//! Endpoints rather than EndpointSlices: one object per Service, served by every Kubernetes
//! version balancer supports under one version (`discovery.k8s.io/v1` slices exist from 1.21,
//! and a Service may have several), with the Service's labels copied onto it, so the watch
//! selects balancer's own by label. The endpoints controller lists at most 1,000 addresses per
//! Endpoints, which bounds the count.
//!
//! The addresses themselves are counted while the object is read and then dropped: the cache
//! grows with backends, not with their pods.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;
use serde::{Deserialize, Deserializer};

use super::stored::StoredBalancer;
use crate::proxy::BALANCER_NAME_LABEL;

/// A backend Service's Endpoints: its name, namespace and Balancer, and its ready addresses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadyEndpoints {
    pub metadata: ObjectMeta,
    /// Distinct ready addresses (`subsets[].addresses[].ip`).
    pub ready: u32,
}

impl ReadyEndpoints {
    /// The Balancer whose backend Service these endpoints are for (from the copied label).
    pub(super) fn balancer(&self) -> Option<ObjectRef<StoredBalancer>> {
        let name = self.metadata.labels.as_ref()?.get(BALANCER_NAME_LABEL)?;
        let reference = ObjectRef::new(name);
        Some(match &self.metadata.namespace {
            Some(namespace) => reference.within(namespace),
            None => reference,
        })
    }
}

/// The Endpoints fields read; serde skips the rest (ports, targets, not-ready addresses).
#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    subsets: Option<Vec<Subset>>,
}

#[derive(Deserialize)]
struct Subset {
    #[serde(default)]
    addresses: Option<Vec<Address>>,
}

#[derive(Deserialize)]
struct Address {
    ip: String,
}

impl<'de> Deserialize<'de> for ReadyEndpoints {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(deserializer)?;
        // An address is listed once per subset it serves ports in; it is one endpoint.
        let ready: HashSet<&str> = wire
            .subsets
            .iter()
            .flatten()
            .flat_map(|subset| subset.addresses.iter().flatten())
            .map(|address| address.ip.as_str())
            .collect();
        Ok(ReadyEndpoints { metadata: slim(wire.metadata), ready: u32::try_from(ready.len()).unwrap_or(u32::MAX) })
    }
}

/// The metadata kept: name, namespace, where the watch resumes, and the Balancer's label.
fn slim(metadata: ObjectMeta) -> ObjectMeta {
    let balancer = metadata.labels.and_then(|mut labels| labels.remove_entry(BALANCER_NAME_LABEL));
    ObjectMeta {
        name: metadata.name,
        namespace: metadata.namespace,
        resource_version: metadata.resource_version,
        labels: balancer.map(|(key, value)| BTreeMap::from([(key, value)])),
        ..ObjectMeta::default()
    }
}

impl k8s_openapi::Resource for ReadyEndpoints {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Endpoints";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "endpoints";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for ReadyEndpoints {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use kube::Resource;
    use serde_json::json;

    use super::*;

    #[test]
    fn counts_distinct_ready_addresses_and_keeps_only_the_balancers_label() {
        let endpoints: ReadyEndpoints = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "lb-v1", "namespace": "ns", "resourceVersion": "7",
                         "labels": {BALANCER_NAME_LABEL: "lb", "app.kubernetes.io/component": "backend"},
                         "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "x"}},
            "subsets": [
                {"addresses": [{"ip": "10.244.0.5"}, {"ip": "10.244.0.6"}],
                 "notReadyAddresses": [{"ip": "10.244.0.7"}], "ports": [{"port": 80}]},
                {"addresses": [{"ip": "10.244.0.5"}], "ports": [{"port": 53, "protocol": "UDP"}]},
                {"notReadyAddresses": [{"ip": "10.244.0.8"}]}
            ]
        }))
        .unwrap();
        assert_eq!(endpoints.ready, 2, "one address in two subsets is one endpoint; not-ready ones are not");
        assert_eq!(endpoints.balancer(), Some(ObjectRef::new("lb").within("ns")));
        assert_eq!(endpoints.metadata.labels.as_ref().map(BTreeMap::len), Some(1));
        assert_eq!(endpoints.metadata.annotations, None);
        assert_eq!(endpoints.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(ReadyEndpoints::url_path(&(), Some("ns")), "/api/v1/namespaces/ns/endpoints");
    }

    #[test]
    fn endpoints_without_subsets_or_label_count_nothing_and_name_no_balancer() {
        let empty: ReadyEndpoints = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert_eq!((empty.ready, empty.balancer()), (0, None));
        let null_subsets: ReadyEndpoints = serde_json::from_value(json!({"metadata": {}, "subsets": null})).unwrap();
        assert_eq!(null_subsets.ready, 0);
    }
}

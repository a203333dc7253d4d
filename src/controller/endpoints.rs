//! A backend Service's `v1` Endpoints, as the controller keeps it: how many ready addresses it
//! lists, and which Balancer it belongs to.
//!
//! Endpoints rather than EndpointSlices: one object per Service, served by every Kubernetes
//! version balancer supports under one version (`discovery.k8s.io/v1` slices exist from 1.21,
//! and a Service may have several), with the Service's labels copied onto it, so the watch
//! selects balancer's own by label. The endpoints controller lists at most 1,000 addresses per
//! Endpoints, which bounds the count.
//!
//! The addresses themselves are counted while the object is read and then dropped, and the
//! cache ([`ReadyCounts`]) keeps one number per backend Service: it grows with backends, not
//! with their pods, and costs a tenth of a reflector's store of the objects.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde::{Deserialize, Deserializer};

use super::stored::StoredBalancer;
use crate::proxy::BALANCER_NAME_LABEL;

/// A backend Service's Endpoints: its name, namespace and Balancer, and its ready addresses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadyEndpoints {
    /// Name, namespace and resource version only.
    pub metadata: ObjectMeta,
    /// Distinct ready addresses (`subsets[].addresses[].ip`).
    pub ready: u32,
    /// The Balancer, from the label copied from the Service.
    balancer: Option<Box<str>>,
}

impl ReadyEndpoints {
    /// The Balancer whose backend Service these endpoints are for (from the copied label).
    pub(super) fn balancer(&self) -> Option<ObjectRef<StoredBalancer>> {
        let reference = ObjectRef::new(self.balancer.as_deref()?);
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
        let metadata = wire.metadata;
        let balancer = metadata.labels.and_then(|mut labels| labels.remove(BALANCER_NAME_LABEL));
        Ok(ReadyEndpoints {
            // Where the watch resumes from, and what names the Service.
            metadata: ObjectMeta {
                name: metadata.name,
                namespace: metadata.namespace,
                resource_version: metadata.resource_version,
                ..ObjectMeta::default()
            },
            ready: u32::try_from(ready.len()).unwrap_or(u32::MAX),
            balancer: balancer.map(String::into_boxed_str),
        })
    }
}

/// The ready endpoint count of every backend Service, by namespace and name, from the watch.
#[derive(Clone, Default)]
pub struct ReadyCounts(Arc<RwLock<Table>>);

#[derive(Default)]
struct Table {
    counts: HashMap<Box<str>, u32>,
    /// A (re)list in progress: it replaces `counts` when done.
    listing: Option<HashMap<Box<str>, u32>>,
    listed: bool,
}

fn key(namespace: &str, name: &str) -> Box<str> {
    format!("{namespace}/{name}").into_boxed_str()
}

impl ReadyCounts {
    /// The ready endpoints of Service `name` in `namespace` (0 when its Endpoints are unknown).
    pub fn get(&self, namespace: &str, name: &str) -> u32 {
        self.read().counts.get(&key(namespace, name)).copied().unwrap_or(0)
    }

    /// Takes in one watch event, as a reflector's store does.
    pub fn apply(&self, event: &watcher::Event<ReadyEndpoints>) {
        let entry = |e: &ReadyEndpoints| {
            key(e.metadata.namespace.as_deref().unwrap_or_default(), e.metadata.name.as_deref().unwrap_or_default())
        };
        let mut table = self.0.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(e) => {
                table.counts.insert(entry(e), e.ready);
            }
            watcher::Event::Delete(e) => {
                table.counts.remove(&entry(e));
            }
            watcher::Event::Init => table.listing = Some(HashMap::new()),
            watcher::Event::InitApply(e) => {
                table.listing.get_or_insert_default().insert(entry(e), e.ready);
            }
            watcher::Event::InitDone => {
                table.counts = table.listing.take().unwrap_or_default();
                table.counts.shrink_to_fit();
                table.listed = true;
            }
        }
    }

    /// Whether the first list is in.
    pub(super) fn listed(&self) -> bool {
        self.read().listed
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
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
        assert_eq!((endpoints.metadata.labels, endpoints.metadata.annotations), (None, None));
        assert_eq!(endpoints.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(ReadyEndpoints::url_path(&(), Some("ns")), "/api/v1/namespaces/ns/endpoints");
    }

    fn endpoints(name: &str, ready: u32) -> ReadyEndpoints {
        let metadata = ObjectMeta { name: Some(name.into()), namespace: Some("ns".into()), ..ObjectMeta::default() };
        ReadyEndpoints { metadata, ready, balancer: None }
    }

    #[test]
    fn the_counts_follow_the_watch_and_a_relist_replaces_them_whole() {
        let counts = ReadyCounts::default();
        counts.apply(&watcher::Event::Init);
        counts.apply(&watcher::Event::InitApply(endpoints("a", 2)));
        assert!(!counts.listed());
        assert_eq!(counts.get("ns", "a"), 0, "not before the list is done");
        counts.apply(&watcher::Event::InitDone);
        assert!(counts.listed());
        assert_eq!(counts.get("ns", "a"), 2);
        counts.apply(&watcher::Event::Apply(endpoints("b", 1)));
        counts.apply(&watcher::Event::Apply(endpoints("a", 0)));
        assert_eq!((counts.get("ns", "a"), counts.get("ns", "b")), (0, 1));
        counts.apply(&watcher::Event::Delete(endpoints("b", 1)));
        assert_eq!(counts.get("ns", "b"), 0);
        counts.apply(&watcher::Event::Init);
        counts.apply(&watcher::Event::InitApply(endpoints("c", 3)));
        counts.apply(&watcher::Event::InitDone);
        assert_eq!((counts.get("ns", "a"), counts.get("ns", "c"), counts.get("other", "c")), (0, 3, 0));
    }

    #[test]
    fn endpoints_without_subsets_or_label_count_nothing_and_name_no_balancer() {
        let empty: ReadyEndpoints = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert_eq!((empty.ready, empty.balancer()), (0, None));
        let null_subsets: ReadyEndpoints = serde_json::from_value(json!({"metadata": {}, "subsets": null})).unwrap();
        assert_eq!(null_subsets.ready, 0);
    }
}

//! The children as the controller caches them: compact, because 1,000 Balancers have 6,000.
//!
//! A typed `Deployment` takes several kilobytes in memory even when most of its fields are
//! empty, and the watch delivers much the controller never reads (`managedFields`, often larger
//! than the rest, timestamps). A [`Cached`] child keeps the metadata the reconciles
//! read (name, namespace, uid, generation, labels, annotations, owners) and the rest of the object (spec, data,
//! status) as compact JSON text, read back into the typed object only when a reconcile looks at
//! it. Everything the subset comparison reads is still there, so a hand edit is still seen and
//! repaired.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use kube::Resource;
use kube::runtime::reflector::Store;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::endpoint_slices::ReadyEndpointSlices;
use super::stored::StoredBalancer;
use crate::deploy::FIELD_MANAGER;
use crate::runtime::cached_kind::resource_as_kind;

/// One child of kind `K`, cached compactly.
pub struct Cached<K> {
    metadata: ObjectMeta,
    /// The object without its metadata, `apiVersion` and `kind`, as JSON text.
    body: Box<str>,
    /// Whether balancer's field manager owns fields through an `Update` (the POST that created
    /// the child) rather than an `Apply`: an apply cannot remove those fields until they are
    /// made its own (see `apply::own_created_fields`).
    created_by_post: bool,
    kind: PhantomData<fn() -> K>,
}

impl<K> Cached<K> {
    /// Whether balancer's field manager owns fields through an `Update` (a POST).
    pub fn created_by_post(&self) -> bool {
        self.created_by_post
    }
}

impl<K: Serialize + DeserializeOwned> Cached<K> {
    /// The compact form of an object (as a watch would deliver it).
    pub fn of(object: &K) -> Result<Self, serde_json::Error> {
        Self::from_value(serde_json::to_value(object)?)
    }

    /// The typed object again, with the cached metadata.
    pub fn object(&self) -> Result<K, serde_json::Error> {
        let mut object: Map<String, Value> = serde_json::from_str(&self.body)?;
        object.insert("metadata".into(), serde_json::to_value(&self.metadata)?);
        serde_json::from_value(Value::Object(object))
    }

    fn from_value(value: Value) -> Result<Self, serde_json::Error> {
        let Value::Object(mut object) = value else { return Err(serde_json::Error::custom("not an object")) };
        let metadata = match object.remove("metadata") {
            Some(metadata) => ObjectMeta::deserialize(metadata)?,
            None => ObjectMeta::default(),
        };
        object.remove("apiVersion");
        object.remove("kind");
        // A Deployment's conditions have long messages that nothing reads (its rollout is judged
        // by the replica counts), so they are dropped.
        if let Some(Value::Object(status)) = object.get_mut("status") {
            status.remove("conditions");
        }
        let created_by_post = metadata.managed_fields.as_deref().is_some_and(|entries| entries.iter().any(is_created));
        let body = serde_json::to_string(&object)?.into_boxed_str();
        Ok(Cached { metadata: read_metadata(metadata), body, created_by_post, kind: PhantomData })
    }
}

/// Whether a managedFields entry is balancer's, from a write that was not an apply.
pub(super) fn is_created(entry: &ManagedFieldsEntry) -> bool {
    entry.manager.as_deref() == Some(FIELD_MANAGER)
        && entry.operation.as_deref() == Some("Update")
        && entry.subresource.as_deref().unwrap_or_default().is_empty()
}

/// Where `kubectl apply` keeps its copy of the whole object it applied: often the largest
/// annotation, and read by no reconcile.
pub(super) const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Only what the reconciles read: name, namespace, uid, generation (a Deployment's rollout is
/// judged against it), labels (which Balancer and component), annotations (a front Service's
/// come from the Balancer) and owners (who controls it); and the resource version, where the
/// watch resumes from. `kubectl apply`'s copy of an object is left out: nothing reads it.
fn read_metadata(metadata: ObjectMeta) -> ObjectMeta {
    let annotations = metadata.annotations.map(|mut a| {
        a.remove(LAST_APPLIED);
        a
    });
    ObjectMeta {
        name: metadata.name,
        namespace: metadata.namespace,
        uid: metadata.uid,
        resource_version: metadata.resource_version,
        generation: metadata.generation,
        labels: metadata.labels,
        annotations: annotations.filter(|a| !a.is_empty()),
        owner_references: metadata.owner_references,
        ..ObjectMeta::default()
    }
}

impl<'de, K: Serialize + DeserializeOwned> Deserialize<'de> for Cached<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::from_value(Value::deserialize(deserializer)?).map_err(D::Error::custom)
    }
}

impl<K> Clone for Cached<K> {
    fn clone(&self) -> Self {
        Cached {
            metadata: self.metadata.clone(),
            body: self.body.clone(),
            created_by_post: self.created_by_post,
            kind: PhantomData,
        }
    }
}

impl<K: Resource<DynamicType = ()>> fmt::Debug for Cached<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cached")
            .field("kind", &K::kind(&()))
            .field("name", &self.metadata.name)
            .field("namespace", &self.metadata.namespace)
            .finish_non_exhaustive()
    }
}

resource_as_kind!(impl[K: Resource<DynamicType = ()>] Cached<K> => K);

/// The caches of the children balancer writes: only its own, selected by label. Objects it does
/// not manage are not watched: creating a child is a POST, which a taken name refuses.
#[derive(Clone)]
pub struct ChildCaches {
    /// The backend and front Services.
    pub services: Store<Cached<Service>>,
    /// The proxies' ConfigMaps.
    pub config_maps: Store<Cached<ConfigMap>>,
    /// The proxy Deployments.
    pub deployments: Store<Cached<Deployment>>,
    /// The proxies' PodDisruptionBudgets.
    pub budgets: Store<Cached<PodDisruptionBudget>>,
    /// The proxy pods' ServiceAccounts, Roles and RoleBindings (with the metrics sidecar only).
    pub identity: IdentityCaches,
    /// The backend Services' ready endpoints (not children: the EndpointSlice controller writes
    /// their slices).
    pub endpoint_slices: ReadyEndpointSlices,
}

impl ChildCaches {
    /// Waits until every child cache has listed; false when the controller stopped first.
    ///
    /// It looks every [`LISTED_POLL`] rather than awaiting kube's `wait_until_ready`, which
    /// wakes only the last task to wait (one waker per store). Of several reconciles and the
    /// readiness check waiting for a slow list, all but one then slept on after it arrived.
    /// This was seen after an etcd restart: a new leader's reconcile never woke, and the change
    /// it was for waited for the 5-minute resync.
    pub async fn synced(&self) -> bool {
        loop {
            match self.listed() {
                Some(listed) => return listed,
                None => tokio::time::sleep(LISTED_POLL).await,
            }
        }
    }

    /// `Some(true)` once every child cache has listed, `Some(false)` when one never will (the
    /// controller stopped), `None` meanwhile.
    fn listed(&self) -> Option<bool> {
        let all = [
            listed_now(&self.services),
            listed_now(&self.config_maps),
            listed_now(&self.deployments),
            listed_now(&self.budgets),
            listed_now(&self.identity.accounts),
            listed_now(&self.identity.roles),
            listed_now(&self.identity.bindings),
            self.endpoint_slices.listed().then_some(true),
        ];
        if all.contains(&Some(false)) {
            return Some(false);
        }
        all.iter().all(Option::is_some).then_some(true)
    }
}

/// The caches of the proxy pods' identity: the ServiceAccount, and the Role and RoleBinding that
/// let it read the proxy's ConfigMap.
#[derive(Clone)]
pub struct IdentityCaches {
    /// The proxies' ServiceAccounts.
    pub accounts: Store<Cached<ServiceAccount>>,
    /// The Roles that let a proxy's token read its ConfigMap.
    pub roles: Store<Cached<Role>>,
    /// Their RoleBindings.
    pub bindings: Store<Cached<RoleBinding>>,
}

/// How often a reconcile waiting for the child caches looks again (only until they have listed).
pub(super) const LISTED_POLL: Duration = Duration::from_millis(50);

/// Whether `store` has listed, without waiting: `None` not yet, `Some(false)` never (its writer
/// is gone).
pub(super) fn listed_now<K: Resource<DynamicType = ()> + Clone>(store: &Store<K>) -> Option<bool> {
    store.wait_until_ready().now_or_never().map(|ready| ready.is_ok())
}

/// Every cache of the controller, for telling whether they have all listed.
#[derive(Clone)]
pub(super) struct Caches {
    pub balancers: Store<StoredBalancer>,
    pub children: ChildCaches,
}

impl Caches {
    /// Waits until every cache has listed; false when the controller stopped first.
    pub(super) async fn synced(&self) -> bool {
        self.balancers.wait_until_ready().await.is_ok() && self.children.synced().await
    }

    /// Whether every cache has listed, without waiting.
    pub(super) fn synced_now(&self) -> bool {
        self.synced().now_or_never() == Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::{self, store::Writer};
    use kube::runtime::watcher;

    /// A cache that has listed (nothing).
    fn synced_store<K>() -> (Store<K>, Writer<K>)
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let (store, mut writer) = reflector::store::<K>();
        writer.apply_watcher_event(&watcher::Event::InitDone);
        (store, writer)
    }

    type IdentityWriters = (Writer<Cached<ServiceAccount>>, Writer<Cached<Role>>, Writer<Cached<RoleBinding>>);

    fn synced_identity() -> (IdentityCaches, IdentityWriters) {
        let ((accounts, a), (roles, r), (bindings, b)) = (synced_store(), synced_store(), synced_store());
        (IdentityCaches { accounts, roles, bindings }, (a, r, b))
    }

    fn listed_slices() -> ReadyEndpointSlices {
        let slices = ReadyEndpointSlices::default();
        slices.apply(&watcher::Event::Init);
        slices.apply(&watcher::Event::InitDone);
        slices
    }

    /// Several tasks waiting at once for caches still listing (a new leader's reconciles and its
    /// readiness check, while the API server is slow after an etcd restart) all go on once the
    /// caches have listed. kube's own wait wakes only the last task to wait for a store: with it,
    /// the first of these waiters slept on for good.
    #[tokio::test]
    async fn every_task_waiting_for_the_child_caches_goes_on_once_they_have_listed() {
        let (services, mut services_writer) = reflector::store::<Cached<Service>>();
        let (config_maps, config_maps_writer) = synced_store();
        let (deployments, deployments_writer) = synced_store();
        let (budgets, budgets_writer) = synced_store();
        let (identity, _identity_writers) = synced_identity();
        let endpoint_slices = listed_slices();
        let children = ChildCaches { services, config_maps, deployments, budgets, identity, endpoint_slices };
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let children = children.clone();
                tokio::spawn(async move { children.synced().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        services_writer.apply_watcher_event(&watcher::Event::InitDone);
        for waiter in waiting {
            let synced = tokio::time::timeout(Duration::from_secs(2), waiter).await;
            assert!(matches!(synced, Ok(Ok(true))), "a waiter did not go on: {synced:?}");
        }
        drop((services_writer, config_maps_writer, deployments_writer, budgets_writer));
    }

    /// Once a cache's writer is gone without its list (the controller stopped), waiting ends: false.
    #[tokio::test]
    async fn waiting_for_the_child_caches_ends_when_the_controller_stops() {
        let (services, services_writer) = reflector::store::<Cached<Service>>();
        let (config_maps, _config_maps_writer) = synced_store();
        let (deployments, _deployments_writer) = synced_store();
        let (budgets, _budgets_writer) = synced_store();
        let (identity, _identity_writers) = synced_identity();
        let endpoint_slices = listed_slices();
        let children = ChildCaches { services, config_maps, deployments, budgets, identity, endpoint_slices };
        drop(services_writer);
        let synced = tokio::time::timeout(Duration::from_secs(2), children.synced()).await;
        assert_eq!(synced, Ok(false));
    }

    use k8s_openapi::api::apps::v1::Deployment;
    use serde_json::json;

    fn stored() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": "d", "namespace": "ns", "uid": "u", "generation": 3, "resourceVersion": "9",
                "labels": {"app.kubernetes.io/managed-by": "balancer"},
                "annotations": {"deployment.kubernetes.io/revision": "1",
                                "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "ownerReferences": [{"apiVersion": "exposer.hliangzhao.io/v1alpha1", "kind": "Balancer",
                                     "name": "b", "uid": "owner", "controller": true}],
                "managedFields": [{"manager": "balancer", "operation": "Update", "apiVersion": "apps/v1",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]
            },
            "spec": {"replicas": 2, "selector": {"matchLabels": {"a": "b"}},
                     "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx"}]}}},
            "status": {"observedGeneration": 3, "availableReplicas": 2}
        })
    }

    #[test]
    fn a_deployments_conditions_are_dropped() {
        let mut value = stored();
        value["status"]["conditions"] = json!([{"type": "Available", "status": "True", "message": "long"}]);
        let cached: Cached<Deployment> = serde_json::from_value(value).unwrap();
        let status = cached.object().unwrap().status.unwrap();
        assert_eq!((status.conditions, status.available_replicas), (None, Some(2)));
    }

    #[test]
    fn keeps_what_the_reconciles_read_and_drops_the_rest_of_the_metadata() {
        let cached: Cached<Deployment> = serde_json::from_value(stored()).unwrap();
        assert!(cached.created_by_post());
        let object = cached.object().unwrap();
        let meta = &object.metadata;
        assert_eq!((meta.name.as_deref(), meta.uid.as_deref(), meta.generation), (Some("d"), Some("u"), Some(3)));
        assert_eq!(meta.owner_references.as_ref().map(Vec::len), Some(1));
        assert_eq!(meta.labels.as_ref().map(|l| l.len()), Some(1));
        assert!(meta.managed_fields.is_none());
        assert_eq!(meta.annotations.as_ref().map(|a| a.len()), Some(1), "kubectl's copy is dropped");
        assert_eq!(meta.resource_version.as_deref(), Some("9"), "where a watch resumes");
        let mut expected: Deployment = serde_json::from_value(stored()).unwrap();
        expected.metadata = object.metadata.clone();
        assert_eq!(object, expected, "spec and status are kept whole, but for the status's conditions");
    }

    #[test]
    fn an_applied_child_is_not_taken_for_a_created_one() {
        let mut value = stored();
        value["metadata"]["managedFields"][0]["operation"] = json!("Apply");
        let cached: Cached<Deployment> = serde_json::from_value(value).unwrap();
        assert!(!cached.created_by_post());
        let round_trip = Cached::of(&cached.object().unwrap()).unwrap();
        assert_eq!(round_trip.object().unwrap(), cached.object().unwrap());
    }
}

//! The children as the controller caches them: compact, because 1,000 Balancers have 6,000.
//!
//! A typed `Deployment` takes several kilobytes in memory even when most of its fields are
//! empty, and the watch delivers much the controller never reads (`managedFields`, often larger
//! than the rest, timestamps). A [`Cached`] child keeps the metadata the reconciles
//! read (name, namespace, uid, generation, labels, annotations, owners) and the rest of the object (spec, data,
//! status) as compact JSON text, read back into the typed object only when a reconcile looks at
//! it. Everything the subset comparison reads is still there, so a hand edit is still seen and
//! repaired.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use kube::Resource;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::FIELD_MANAGER;

/// One child of kind `K`, cached compactly.
pub struct Cached<K> {
    metadata: ObjectMeta,
    /// The object without its metadata, `apiVersion` and `kind`, as JSON text.
    body: Box<str>,
    /// Whether balancer's field manager owns fields through an `Update` (the POST that created
    /// the child) rather than an `Apply`: an apply cannot remove those fields until they are
    /// made its own (see `controller::own_created_fields`).
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
        // A Deployment's conditions: long messages nothing reads (its rollout is judged by counts).
        if let Some(Value::Object(status)) = object.get_mut("status") {
            status.remove("conditions");
        }
        let created_by_post = metadata.managed_fields.as_deref().is_some_and(|entries| entries.iter().any(is_created));
        let body = serde_json::to_string(&object)?.into_boxed_str();
        Ok(Cached { metadata: read_metadata(metadata), body, created_by_post, kind: PhantomData })
    }
}

/// Whether a managedFields entry is balancer's, from a write that was not an apply.
pub fn is_created(entry: &ManagedFieldsEntry) -> bool {
    entry.manager.as_deref() == Some(FIELD_MANAGER)
        && entry.operation.as_deref() == Some("Update")
        && entry.subresource.as_deref().unwrap_or_default().is_empty()
}

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

/// Where `kubectl apply` keeps the last configuration it applied, often the largest annotation.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

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

impl<K: Resource<DynamicType = ()>> Resource for Cached<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

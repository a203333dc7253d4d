//! A Balancer as the controller reads it from the API server: leniently.
//!
//! A watch lists every Balancer in one response, so one object that fails to
//! deserialize would fail the whole list and stop every Balancer from being
//! reconciled. An object can be unreadable even though the API server stored it:
//! written while the webhooks were absent, under an older and looser CRD schema,
//! or through the status subresource. So the controller reads the metadata as
//! usual, the spec through the same reader the webhooks use (keeping the error,
//! which is then reported on that Balancer's status), and the status leniently
//! (an unreadable one counts as absent; the next status write replaces it).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::api::{Balancer, BalancerSpec, BalancerStatus};
use crate::runtime::cached_kind::resource_as_kind;
use crate::spec::FieldError;
use crate::spec::parse_spec;

/// A stored Balancer whose spec may be unreadable.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredBalancer {
    /// The Balancer's metadata.
    pub metadata: ObjectMeta,
    /// The spec, or why it cannot be read (with the field at fault).
    pub spec: Result<BalancerSpec, FieldError>,
    /// Its status, as the controller last wrote it.
    pub status: Option<BalancerStatus>,
}

impl<'de> Deserialize<'de> for StoredBalancer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut object = Value::deserialize(deserializer)?;
        let metadata = match object.get_mut("metadata").map(Value::take) {
            Some(metadata) => ObjectMeta::deserialize(metadata).map_err(serde::de::Error::custom)?,
            None => ObjectMeta::default(),
        };
        let spec = parse_spec(&object);
        let status = object.get_mut("status").map(Value::take).and_then(|s| BalancerStatus::deserialize(s).ok());
        Ok(StoredBalancer { metadata, spec, status })
    }
}

impl From<Balancer> for StoredBalancer {
    fn from(balancer: Balancer) -> Self {
        StoredBalancer { metadata: balancer.metadata, spec: Ok(balancer.spec), status: balancer.status }
    }
}

resource_as_kind!(impl[] StoredBalancer => Balancer);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(spec: Value, status: Value) -> StoredBalancer {
        let object = json!({
            "apiVersion": "exposer.hliangzhao.io/v1beta1",
            "kind": "Balancer",
            "metadata": {"name": "b", "namespace": "ns", "uid": "u"},
            "spec": spec,
            "status": status,
        });
        serde_json::from_value(object).expect("a stored Balancer is always readable")
    }

    #[test]
    fn an_unreadable_spec_is_kept_as_its_error() {
        let spec = json!({"ports": [{"port": 80, "targetPort": 3_000_000_000u64}], "backends": [{"name": "a"}]});
        let balancer = stored(spec, Value::Null);
        let error = balancer.spec.expect_err("targetPort does not fit");
        assert_eq!(error.field, "spec.ports[0].targetPort");
        assert_eq!(balancer.metadata.name.as_deref(), Some("b"));
    }

    #[test]
    fn an_unreadable_status_counts_as_absent() {
        let spec = json!({"ports": [{"port": 80}], "backends": [{"name": "a"}]});
        let balancer = stored(spec, json!({"activeBackends": 5_000_000_000u64}));
        assert!(balancer.spec.is_ok());
        assert_eq!(balancer.status, None);
    }

    #[test]
    fn a_list_with_one_unreadable_balancer_is_still_read() {
        let good =
            json!({"metadata": {"name": "good"}, "spec": {"ports": [{"port": 80}], "backends": [{"name": "a"}]}});
        let bad = json!({"metadata": {"name": "bad"}, "spec": {"ports": "eighty"}});
        let list: Vec<StoredBalancer> = serde_json::from_value(json!([good, bad])).expect("the list reads");
        assert!(list[0].spec.is_ok());
        assert_eq!(list[1].spec.as_ref().expect_err("bad spec").field, "spec.ports");
    }
}

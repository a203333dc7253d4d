//! Server-side apply bookkeeping, pure: what counts as "nothing to change", how a POST's
//! fields become balancer's applied fields, and what the caches need not keep.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::Resource;
use serde::Serialize;
use serde_json::{Value, json};

use super::cache;
use crate::deploy::FIELD_MANAGER;

/// The managedFields with balancer's `Update` entries folded into its `Apply` entry (which the
/// first of them becomes when there is none); `None` when there is no `Update` entry. Entries
/// of another API version are left alone: their field sets do not compare.
pub(super) fn fold_created_into_applied(entries: Vec<ManagedFieldsEntry>) -> Option<Vec<ManagedFieldsEntry>> {
    if !entries.iter().any(cache::is_created) {
        return None;
    }
    let is_applied =
        |e: &ManagedFieldsEntry| e.manager.as_deref() == Some(FIELD_MANAGER) && e.operation.as_deref() == Some("Apply");
    let mut applied: Option<ManagedFieldsEntry> = entries.iter().find(|e| is_applied(e)).cloned();
    let mut kept = Vec::with_capacity(entries.len());
    for entry in entries {
        if is_applied(&entry) {
            continue;
        }
        if !cache::is_created(&entry) {
            kept.push(entry);
            continue;
        }
        match applied.as_mut() {
            None => applied = Some(ManagedFieldsEntry { operation: Some("Apply".into()), ..entry }),
            Some(into) if into.api_version == entry.api_version => {
                let fields = entry.fields_v1.map(|f| f.0).unwrap_or(Value::Null);
                let target = &mut into.fields_v1.get_or_insert_with(|| FieldsV1(json!({}))).0;
                union_fields(target, &fields);
            }
            Some(_) => kept.push(entry),
        }
    }
    kept.extend(applied);
    Some(kept)
}

/// Adds to a `FieldsV1` set (a tree of JSON objects) every path of another.
fn union_fields(into: &mut Value, from: &Value) {
    let (Value::Object(into), Value::Object(from)) = (into, from) else { return };
    for (key, value) in from {
        match into.get_mut(key) {
            Some(existing) => union_fields(existing, value),
            None => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

/// Whether every field set in `desired` has the same value in `actual`: the
/// server-side-apply view of "nothing to change". Lists must match in length
/// and element by element, so a removed port or backend is noticed.
pub(super) fn is_subset(desired: &impl Serialize, actual: &impl Serialize) -> bool {
    match (serde_json::to_value(desired), serde_json::to_value(actual)) {
        (Ok(d), Ok(a)) => value_subset(&d, &a),
        _ => false,
    }
}

fn value_subset(desired: &Value, actual: &Value) -> bool {
    match (desired, actual) {
        (Value::Object(d), Value::Object(a)) => {
            d.iter().all(|(k, dv)| dv.is_null() || a.get(k).is_some_and(|av| value_subset(dv, av)))
        }
        (Value::Array(d), Value::Array(a)) => d.len() == a.len() && d.iter().zip(a).all(|(x, y)| value_subset(x, y)),
        _ => desired == actual,
    }
}

/// Drops what no reconcile reads before an object is cached: `managedFields` (often larger than
/// the rest of the object) and kubectl's last-applied annotation (a copy of it). The subset
/// comparison reads only the fields balancer sets, and it sets neither.
pub(super) fn slim<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(cache::LAST_APPLIED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subset_comparison_ignores_server_fields_but_not_ours() {
        let desired = json!({"spec": {"ports": [{"port": 80, "protocol": "TCP"}], "type": "ClusterIP"}});
        let mut actual = json!({"spec": {"ports": [{"port": 80, "protocol": "TCP", "nodePort": null}], "type": "ClusterIP", "clusterIP": "10.0.0.1"}});
        assert!(is_subset(&desired, &actual));
        actual["spec"]["ports"][0]["port"] = json!(81);
        assert!(!is_subset(&desired, &actual));
        actual["spec"]["ports"] = json!([{"port": 80, "protocol": "TCP"}, {"port": 81, "protocol": "TCP"}]);
        assert!(!is_subset(&desired, &actual), "a port we no longer declare must be removed");
        assert!(!is_subset(&desired, &json!({"spec": {}})));
    }

    #[test]
    fn created_fields_are_folded_into_the_apply_entry() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let entry = |manager: &str, operation: &str, fields: Value| -> ManagedFieldsEntry {
            serde_json::from_value(json!({"manager": manager, "operation": operation, "apiVersion": "v1",
                                          "fieldsType": "FieldsV1", "fieldsV1": fields}))
            .unwrap()
        };
        let applied = entry("balancer", "Apply", json!({"f:spec": {"f:ports": {"k:{\"port\":80}": {}}}}));
        let created =
            entry("balancer", "Update", json!({"f:spec": {"f:ports": {"k:{\"port\":81}": {}}, "f:type": {}}}));
        let other = entry("kubectl", "Update", json!({"f:spec": {"f:selector": {}}}));
        assert_eq!(fold_created_into_applied(vec![applied.clone(), other.clone()]), None, "nothing to fold");
        let folded = fold_created_into_applied(vec![created, other.clone(), applied]).unwrap();
        let both = json!({"f:spec": {"f:ports": {"k:{\"port\":80}": {}, "k:{\"port\":81}": {}}, "f:type": {}}});
        assert_eq!(folded, vec![other, entry("balancer", "Apply", both)]);
    }
}

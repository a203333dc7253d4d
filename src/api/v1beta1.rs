//! `exposer.hliangzhao.io/v1beta1`: the storage version, and the hub the operator works on.
//!
//! Differences from v1alpha1, following the Kubernetes API conventions:
//! - `spec.replicas` and the scale subresource, so `kubectl scale` and a
//!   HorizontalPodAutoscaler size the proxy;
//! - `status.replicas`, `status.readyReplicas` and `status.selector` for that subresource;
//! - status counts named `activeBackends` and `obsoleteBackends` (not `…Num`);
//! - lists that are maps: ports keyed by `port` and `protocol` (as a Service's), backends
//!   by `name`, conditions by `type`, so server-side apply merges them item by item.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{
    BackendSpec, BalancerPort, DEFAULT_PROTOCOL, MAX_BACKENDS, MAX_PORTS, MAX_REPLICAS, read_backends, read_ports,
    read_selector, selector_schema,
};

/// This version's name.
pub const VERSION: &str = "v1beta1";

/// A weighted TCP/UDP load balancer in front of a set of backends.
// Several printcolumns share a `type_`, which clippy mistakes for a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "exposer.hliangzhao.io",
    version = "v1beta1",
    kind = "Balancer",
    plural = "balancers",
    shortname = "bal",
    namespaced,
    status = "BalancerStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Ports", type_ = "string", json_path = ".spec.ports[*].port", description = "Front-end ports"),
    printcolumn(
        name = "Backends",
        type_ = "string",
        json_path = ".spec.backends[*].name",
        description = "Backend names"
    ),
    printcolumn(
        name = "Active",
        type_ = "integer",
        json_path = ".status.activeBackends",
        description = "Backend Services present and matching the spec"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "Proxy pods asked for"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Proxy pods ready"
    ),
    printcolumn(
        name = "Obsolete",
        type_ = "integer",
        json_path = ".status.obsoleteBackends",
        description = "Owned backend Services no longer in the spec",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct BalancerSpec {
    /// Proxy pods (0..=100); defaulted by the mutating webhook to the operator's
    /// `--proxy-replicas`. The scale subresource sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub replicas: Option<i32>,
    /// `None` (the default) or `ClientIP`: every connection from one client address goes to
    /// the same backend while the backends stay the same (nginx's consistent hash of the
    /// client address), and the split across many clients still follows the weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["None", "ClientIP"]))]
    pub session_affinity: Option<String>,
    /// Front-end ports; each is proxied to the same port of every backend.
    #[serde(deserialize_with = "read_ports")]
    #[schemars(schema_with = "ports_schema")]
    pub ports: Vec<BalancerPort>,
    /// Labels common to the pods of every backend.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "read_selector")]
    #[schemars(schema_with = "selector_schema")]
    pub selector: Option<BTreeMap<String, String>>,
    /// The backends traffic is split across, by weight.
    #[serde(deserialize_with = "read_backends")]
    #[schemars(schema_with = "backends_schema")]
    pub backends: Vec<BackendSpec>,
}

/// Observed state of a Balancer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BalancerStatus {
    /// Proxy pods that exist (the scale subresource's `status.replicas`).
    #[serde(default)]
    pub replicas: i32,
    /// Proxy pods that are ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// The proxy pods' label selector, as a string (what a HorizontalPodAutoscaler reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Backend Services present and matching the spec.
    #[serde(default)]
    pub active_backends: i32,
    /// Owned backend Services no longer named by the spec, still present.
    #[serde(default)]
    pub obsolete_backends: i32,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Standard conditions; `Ready` summarises whether traffic flows as specified.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// Ports as a map keyed by `port` and `protocol`, like a Service's. A map key must be
/// required or defaulted, so the schema defaults `protocol` (and does not let it be null).
fn ports_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<BalancerPort>>();
    if let Some(Value::Object(protocol)) = schema.pointer_mut("/items/properties/protocol") {
        protocol.remove("nullable");
        protocol.insert("type".into(), json!("string"));
        protocol.insert("default".into(), json!(DEFAULT_PROTOCOL));
    }
    list_map(schema, &["port", "protocol"], MAX_PORTS)
}

/// Backends as a map keyed by `name`.
fn backends_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    list_map(generator.subschema_for::<Vec<BackendSpec>>(), &["name"], MAX_BACKENDS)
}

/// Conditions as a map keyed by `type`, as in every built-in status.
fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    schema.insert("x-kubernetes-list-type".into(), json!("map"));
    schema.insert("x-kubernetes-list-map-keys".into(), json!(["type"]));
    schema
}

fn list_map(mut schema: schemars::Schema, keys: &[&str], max: usize) -> schemars::Schema {
    schema.insert("minItems".into(), json!(1));
    schema.insert("maxItems".into(), json!(max));
    schema.insert("x-kubernetes-list-type".into(), json!("map"));
    schema.insert("x-kubernetes-list-map-keys".into(), json!(keys));
    schema
}

/// Keeps [`MAX_REPLICAS`] and the schema's bound in step.
const _: () = assert!(MAX_REPLICAS == 100);

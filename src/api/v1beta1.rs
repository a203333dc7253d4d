//! `exposer.hliangzhao.io/v1beta1`: the storage version, and the hub the operator works on.
//!
//! Differences from v1alpha1, following the Kubernetes API conventions:
//! - `spec.replicas` and the scale subresource, so `kubectl scale` and a
//!   HorizontalPodAutoscaler size the proxy;
//! - `status.replicas`, `status.readyReplicas` and `status.selector` for that subresource;
//! - status counts named `activeBackends` and `obsoleteBackends` (not `…Num`);
//! - `spec.service`: the front Service's type (NodePort, LoadBalancer) and settings, and the
//!   addresses it is reached at in the status;
//! - lists that are maps: ports keyed by `port` and `protocol` (as a Service's), backends
//!   by `name`, conditions by `type`, so server-side apply merges them item by item.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::canary::{CanarySpec, CanaryStatus};
use super::{
    BackendSpec, BalancerPort, MAX_ANNOTATION_VALUE_LEN, MAX_BACKENDS, MAX_NESTED_ITEMS, MAX_NESTED_STRING_LEN,
    MAX_PORTS, MAX_PROXY_VALUES, MAX_REPLICAS, MAX_SERVICE_ANNOTATIONS, MAX_SOURCE_RANGES, MAX_SPREAD_CONSTRAINTS,
    MAX_TOLERATIONS, Protocol, ServiceType, read_annotations, read_backends, read_ports, read_selector,
    read_source_ranges, selector_schema,
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
    doc = "A Balancer is a weighted TCP/UDP load balancer. Clients connect to its front Service, and the nginx proxy pods that the balancer operator runs split their connections across the backends (sets of pods) by weight. v1beta1 is the stored version.",
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
        name = "Address",
        type_ = "string",
        json_path = ".status.addresses[*].value",
        description = "Where clients reach the Balancer: load-balancer ingress, else the cluster IP"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether traffic flows as specified"
    ),
    printcolumn(
        name = "Backends-Ready",
        type_ = "string",
        json_path = ".status.backendsReady",
        description = "Backends with a ready endpoint, of those in the spec"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "Proxy pods asked for"
    ),
    printcolumn(
        name = "Active",
        type_ = "integer",
        json_path = ".status.activeBackends",
        description = "Backend Services present and matching the spec",
        priority = 1
    ),
    printcolumn(
        name = "Ready-Replicas",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Proxy pods ready",
        priority = 1
    ),
    printcolumn(
        name = "Obsolete",
        type_ = "integer",
        json_path = ".status.obsoleteBackends",
        description = "Owned backend Services no longer in the spec",
        priority = 1
    ),
    printcolumn(
        name = "Algorithm",
        type_ = "string",
        json_path = ".spec.algorithm",
        description = "How the proxy picks a backend for a new connection",
        priority = 1
    ),
    printcolumn(
        name = "Backends-Available",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"BackendsAvailable\")].status",
        description = "Whether every backend with a weight has a ready endpoint",
        priority = 1
    ),
    printcolumn(
        name = "Canary",
        type_ = "string",
        json_path = ".status.canary.phase",
        description = "Where the canary is: Progressing, Paused, RollingBack, Aborted or Completed"
    ),
    printcolumn(
        name = "Step",
        type_ = "integer",
        json_path = ".status.canary.step",
        description = "The canary's step (0-based; the number of steps once completed)"
    ),
    printcolumn(
        name = "Canary-Weight",
        type_ = "integer",
        json_path = ".status.canary.weight",
        description = "The canary backend's percentage of the new connections its pair takes"
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
    /// How the proxy picks a backend for a new connection, by weight: `RoundRobin` (the
    /// default; nginx's smooth weighted round robin), `LeastConnections` (the fewest active
    /// connections relative to weight; nginx's `least_conn`) or `PowerOfTwoChoices` (two
    /// backends drawn at random by weight, the one with fewer connections; nginx's
    /// `random two least_conn`). With `sessionAffinity: ClientIP` it must be `RoundRobin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["RoundRobin", "LeastConnections", "PowerOfTwoChoices"]))]
    pub algorithm: Option<String>,
    /// How the front Service exposes the Balancer; a ClusterIP Service by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<FrontService>,
    /// The proxy pods: image (when the operator allows it), resources and placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxySpec>,
    /// A canary: traffic moved from one backend to another a step at a time, each step judged
    /// on what the proxy measured, and moved back when a gate fails (see `docs/canary.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanarySpec>,
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

/// The front Service's exposure: `spec.service`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FrontService {
    /// `ClusterIP` (the default), `NodePort` or `LoadBalancer`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["ClusterIP", "NodePort", "LoadBalancer"]))]
    pub type_: Option<String>,
    /// The load-balancer implementation to use (`LoadBalancer` only; Kubernetes 1.24 and
    /// later, older API servers drop it), a label-style key such as `example.com/internal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 317))]
    pub load_balancer_class: Option<String>,
    /// `Cluster` or `Local` (`NodePort` and `LoadBalancer` only): `Local` keeps the client's
    /// source address and sends traffic only to proxy pods on the node it arrived at.
    /// Unset is Kubernetes's default, `Cluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["Cluster", "Local"]))]
    pub external_traffic_policy: Option<String>,
    /// Client CIDRs the cloud load balancer admits (`LoadBalancer` only), e.g. `10.0.0.0/8`.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "read_source_ranges")]
    #[schemars(schema_with = "source_ranges_schema")]
    pub load_balancer_source_ranges: Option<Vec<String>>,
    /// Annotations on the front Service, for the cloud provider's load-balancer settings.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "read_annotations")]
    #[schemars(schema_with = "annotations_schema")]
    pub annotations: Option<BTreeMap<String, String>>,
}

impl FrontService {
    /// The Service type after defaulting.
    pub fn effective_type(&self) -> &str {
        self.type_.as_deref().unwrap_or(ServiceType::ClusterIp.as_str())
    }
}

impl BalancerSpec {
    /// The labels selecting one backend's pods: `spec.selector` overlaid by the backend's own.
    pub fn merged_selector(&self, backend: &BackendSpec) -> BTreeMap<String, String> {
        self.merged_selector_refs(backend).into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// [`Self::merged_selector`], borrowed: for comparing selectors without copying them.
    pub fn merged_selector_refs<'a>(&'a self, backend: &'a BackendSpec) -> BTreeMap<&'a str, &'a str> {
        let labels =
            |s: &'a Option<BTreeMap<String, String>>| s.iter().flatten().map(|(k, v)| (k.as_str(), v.as_str()));
        labels(&self.selector).chain(labels(&backend.selector)).collect()
    }

    /// The front Service's type as written, `ClusterIP` when unset: what validation reads and
    /// names in its messages (builders read [`ServiceType`] from an admitted spec).
    pub fn written_service_type(&self) -> &str {
        self.service.as_ref().map_or(ServiceType::ClusterIp.as_str(), FrontService::effective_type)
    }
}

/// At most [`MAX_SOURCE_RANGES`] CIDRs (an IPv6 CIDR is at most 43 characters).
fn source_ranges_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "nullable": true,
        "maxItems": MAX_SOURCE_RANGES,
        "items": {"type": "string", "maxLength": 43},
    })
}

/// At most [`MAX_SERVICE_ANNOTATIONS`] annotations of at most [`MAX_ANNOTATION_VALUE_LEN`]
/// characters (keys are checked by the webhook, as a selector's are).
fn annotations_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "maxProperties": MAX_SERVICE_ANNOTATIONS,
        "additionalProperties": {"type": "string", "maxLength": MAX_ANNOTATION_VALUE_LEN},
    })
}

/// The proxy pods: `spec.proxy`. Each field goes into the proxy Deployment's pod template as
/// it is; the API server validates them there.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxySpec {
    /// This Balancer's nginx image (stream module, non-root uid 101, `/bin/sh` and coreutils), instead of the
    /// operator's `--proxy-image`. Refused unless it starts with one of the operator's
    /// `--allowed-proxy-images` prefixes: the image runs with the operator's authority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub image: Option<String>,
    /// The nginx container's requests and limits; unset: 50m CPU and 32Mi requested, 128Mi limit.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "read_capped")]
    #[schemars(schema_with = "kubernetes_schema::<Option<ResourceRequirements>>")]
    pub resources: Option<ResourceRequirements>,
    /// Labels a node must have to run a proxy pod.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "read_selector")]
    #[schemars(schema_with = "selector_schema")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Taints the proxy pods tolerate.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "read_capped")]
    #[schemars(schema_with = "tolerations_schema")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Node and pod (anti-)affinity of the proxy pods.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "read_capped")]
    #[schemars(schema_with = "kubernetes_schema::<Option<Affinity>>")]
    pub affinity: Option<Affinity>,
    /// How the proxy pods spread; replaces the default spread across nodes (max skew 1 by
    /// `kubernetes.io/hostname`, `ScheduleAnyway`).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "read_capped")]
    #[schemars(schema_with = "spread_schema")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    /// The proxy pods' PriorityClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub priority_class_name: Option<String>,
    /// How long a connection opened before a configuration change may go on, served by the
    /// configuration it started with (nginx's `worker_shutdown_timeout`): a number and a unit
    /// (`ms`, `s`, `m`, `h`), between `1s` and `24h`; unset: `1h`. Until then the old nginx
    /// workers, and the memory they hold, stay. A stopping proxy pod still closes its
    /// connections 20 s after it is told to stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub drain_timeout: Option<String>,
    /// What the proxy sends connections to: `Pods` (the default), each backend's ready pods from
    /// its EndpointSlices, each weighing the backend's weight over its pod count, so a pod that
    /// dies costs one retry on another; or `Services`, each backend's cluster IP, leaving the
    /// choice of pod to kube-proxy. `Pods` needs the operator's metrics sidecar
    /// (`--proxy-metrics-image`), which delivers endpoint changes without a rollout; without
    /// it the proxy uses Services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["Pods", "Services"]))]
    pub upstreams: Option<String>,
    /// Annotations on the proxy pods (a service mesh's or a monitoring agent's, say).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "read_annotations")]
    #[schemars(schema_with = "annotations_schema")]
    pub pod_annotations: Option<BTreeMap<String, String>>,
}

fn read_capped<'de, D: serde::Deserializer<'de>, T: serde::de::DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    crate::util::bounded::optional_capped(d, MAX_PROXY_VALUES, "values")
}

fn tolerations_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = kubernetes_schema::<Option<Vec<Toleration>>>(generator);
    schema.insert("maxItems".into(), json!(MAX_TOLERATIONS));
    schema
}

fn spread_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = kubernetes_schema::<Option<Vec<TopologySpreadConstraint>>>(generator);
    schema.insert("maxItems".into(), json!(MAX_SPREAD_CONSTRAINTS));
    schema
}

/// A Kubernetes type's own schema, with every string, list and map inside it bounded, so the
/// API server holds a stored Balancer to a size even when the webhook is not called.
fn kubernetes_schema<T: JsonSchema>(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<T>();
    if let Some(object) = schema.as_object_mut() {
        object.values_mut().for_each(bound_nested);
        bound_object(object);
    }
    schema
}

fn bound_nested(value: &mut Value) {
    match value {
        Value::Object(map) => {
            bound_object(map);
            map.values_mut().for_each(bound_nested);
        }
        Value::Array(items) => items.iter_mut().for_each(bound_nested),
        _ => {}
    }
}

/// A string, list or map schema gets a bound unless it has one.
fn bound_object(map: &mut serde_json::Map<String, Value>) {
    let bound = match map.get("type").and_then(Value::as_str) {
        Some("string") => ("maxLength", MAX_NESTED_STRING_LEN),
        Some("array") => ("maxItems", MAX_NESTED_ITEMS),
        Some("object") if map.contains_key("additionalProperties") => ("maxProperties", MAX_NESTED_ITEMS),
        _ => return,
    };
    map.entry(bound.0).or_insert(json!(bound.1));
}

/// One address the Balancer is reached at, as Gateway API's `status.addresses` has it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct BalancerAddress {
    /// `IPAddress` or `Hostname`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The IP address or the host name.
    pub value: String,
}

/// A front port's node port (`NodePort` and `LoadBalancer` Services).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePortStatus {
    /// The front port (`spec.ports[].port`).
    pub port: i32,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// The port every node forwards to it.
    pub node_port: i32,
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
    /// Where clients reach the Balancer: the front Service's load-balancer ingress (type
    /// LoadBalancer; empty while it is pending), else its cluster IPs. Always written, so an
    /// address that goes away is removed by the status's merge patch.
    #[serde(default)]
    pub addresses: Vec<BalancerAddress>,
    /// The front Service's node ports (types NodePort and LoadBalancer); always written.
    #[serde(default)]
    pub node_ports: Vec<NodePortStatus>,
    /// Backend Services present and matching the spec.
    #[serde(default)]
    pub active_backends: i32,
    /// Owned backend Services no longer named by the spec, still present.
    #[serde(default)]
    pub obsolete_backends: i32,
    /// Each backend of the spec, in spec order: its ready endpoints and its share of new
    /// connections. Always written, so a backend removed from the spec leaves the list.
    #[serde(default)]
    #[schemars(schema_with = "backend_statuses_schema")]
    pub backends: Vec<BackendStatus>,
    /// Backends with at least one ready endpoint, of those in the spec: `2/3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backends_ready: Option<String>,
    /// Proxy pods that serve the current configuration, as their metrics sidecars say (with the
    /// sidecar, which applies a change to the running pods); the `Programmed` condition is
    /// `True` once all of them do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configured_replicas: Option<i32>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Where the canary is, what it measured and decided; the live split between its two
    /// backends is kept here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryStatus>,
    /// Standard conditions: `Ready` (the proxy serves the spec), `BackendsAvailable` (every
    /// backend with a weight has a ready endpoint) and, with the metrics sidecar, `Programmed`
    /// (every proxy pod serves the current configuration).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// One backend as the traffic sees it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackendStatus {
    /// The backend's name in the spec.
    pub name: String,
    /// Its weight in the spec.
    pub weight: i32,
    /// Ready endpoints behind its Service, counted across all the Service's EndpointSlices: a
    /// pod listed in several (an IPv4 and an IPv6 slice) counts once, and a terminating one not.
    pub ready_endpoints: i32,
    /// The percentage of new connections the proxy aims to give it: its weight on the wire (a
    /// running canary's split, else the spec's) over those of the backends with a ready endpoint,
    /// rounded down, with the points left over given to the largest remainders (so the shares
    /// add up to 100 while any backend is ready).
    pub share: i32,
}

/// Backend statuses as a map keyed by `name`, as the spec's backends.
fn backend_statuses_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<BackendStatus>>();
    schema.insert("x-kubernetes-list-type".into(), json!("map"));
    schema.insert("x-kubernetes-list-map-keys".into(), json!(["name"]));
    schema.insert("maxItems".into(), json!(MAX_BACKENDS));
    schema
}

/// Ports as a map keyed by `port` and `protocol`, like a Service's. A map key must be
/// required or defaulted, so the schema defaults `protocol` (and does not let it be null).
fn ports_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<BalancerPort>>();
    if let Some(Value::Object(protocol)) = schema.pointer_mut("/items/properties/protocol") {
        protocol.remove("nullable");
        protocol.insert("type".into(), json!("string"));
        protocol.insert("default".into(), json!(Protocol::Tcp.as_str()));
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

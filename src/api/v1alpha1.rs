//! `exposer.hliangzhao.io/v1alpha1`: the Go project's API, served unchanged.
//!
//! Field names and shapes match the Go project's manifests, so its YAML applies as
//! it is. Nothing in the operator reads these types: objects of this version reach it
//! converted to v1beta1 (see [`super::conversion`]). They exist for their schema, which
//! must not change.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{read_selector, selector_schema, target_port_schema};

/// This version's name.
pub const VERSION: &str = "v1alpha1";

/// A weighted TCP/UDP load balancer in front of a set of backends.
// Several printcolumns share a `type_`, which clippy mistakes for a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "exposer.hliangzhao.io",
    version = "v1alpha1",
    kind = "Balancer",
    doc = "A Balancer is a weighted TCP/UDP load balancer. Clients connect to its front Service, and the nginx proxy pods that the balancer operator runs split their connections across the backends (sets of pods) by weight. v1alpha1 is the original Go project's API, served unchanged for its manifests and converted to the stored v1beta1, which new manifests should use.",
    plural = "balancers",
    shortname = "bal",
    namespaced,
    status = "BalancerStatus",
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
        json_path = ".status.activeBackendsNum",
        description = "Backend Services present and matching the spec"
    ),
    printcolumn(
        name = "Obsolete",
        type_ = "integer",
        json_path = ".status.obsoleteBackendsNum",
        description = "Owned backend Services no longer in the spec"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct BalancerSpec {
    /// Front-end ports; each is proxied to the same port of every backend.
    #[schemars(length(min = 1, max = 32))]
    pub ports: Vec<BalancerPort>,
    /// Labels common to the pods of every backend.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "read_selector")]
    #[schemars(schema_with = "selector_schema")]
    pub selector: Option<BTreeMap<String, String>>,
    /// The backends traffic is split across, by weight.
    #[schemars(length(min = 1, max = 64))]
    pub backends: Vec<BackendSpec>,
}

/// One front-end port of a Balancer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BalancerPort {
    /// DNS-1123 label; required when the Balancer has more than one port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub name: Option<String>,
    /// `TCP` or `UDP`; defaulted to `TCP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["TCP", "UDP"]))]
    pub protocol: Option<String>,
    /// The port the front-end Service and the proxy listen on.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// The backend pods' port: a number or an IANA service name; defaulted to `port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "target_port_schema")]
    pub target_port: Option<IntOrString>,
}

/// One backend: a set of pods and its share of the traffic.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackendSpec {
    /// DNS-1123 label, unique within the Balancer.
    #[schemars(length(max = 63))]
    pub name: String,
    /// Relative share of the traffic, 0..=100; 0 drains the backend. Defaulted to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub weight: Option<i32>,
    /// Labels selecting this backend's pods, merged over `spec.selector`.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "read_selector")]
    #[schemars(schema_with = "selector_schema")]
    pub selector: Option<BTreeMap<String, String>>,
}

/// Observed state of a Balancer, as the Go project names it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BalancerStatus {
    /// Backend Services present and matching the spec.
    #[serde(default)]
    pub active_backends_num: i32,
    /// Owned backend Services no longer named by the spec, still present.
    #[serde(default)]
    pub obsolete_backends_num: i32,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Standard conditions; `Ready` summarises whether traffic flows as specified.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

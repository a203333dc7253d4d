//! The `Balancer` custom resource (`exposer.hliangzhao.io/v1alpha1`).
//!
//! Field names and shapes match the original Go project's manifests, so its
//! YAML applies unchanged. The CRD schema carries the simple bounds (ranges,
//! enums, list sizes) so the API server enforces them even when the webhook is
//! unreachable; the webhook ([`crate::validation`]) is the complete rule set.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::bounded;
use crate::validation::{MAX_IANA_SVC_NAME_LEN, MAX_LABEL_LEN};

/// API group of the Balancer resource.
pub const GROUP: &str = "exposer.hliangzhao.io";
/// API version of the Balancer resource.
pub const VERSION: &str = "v1alpha1";
/// Kind of the Balancer resource.
pub const KIND: &str = "Balancer";

/// Most ports one Balancer may expose.
pub const MAX_PORTS: usize = 32;
/// Most backends one Balancer may balance over.
pub const MAX_BACKENDS: usize = 64;
/// Most labels in one selector (`spec.selector` or a backend's).
pub const MAX_SELECTOR_LABELS: usize = 32;
/// Largest backend weight.
pub const MAX_WEIGHT: i32 = 100;
/// Weight given to a backend that does not set one.
pub const DEFAULT_WEIGHT: i32 = 1;
/// Protocol given to a port that does not set one.
pub const DEFAULT_PROTOCOL: &str = "TCP";
/// Protocols nginx's stream module can proxy.
pub const PROTOCOLS: [&str; 2] = ["TCP", "UDP"];

/// Suffix of every backend Service's name: `<balancer>-<backend>-backend`.
pub const BACKEND_SERVICE_SUFFIX: &str = "-backend";
/// Suffix of the proxy Deployment's name.
pub const PROXY_DEPLOYMENT_SUFFIX: &str = "-proxy";
/// Suffix of the ConfigMap holding `nginx.conf`.
pub const PROXY_CONFIGMAP_SUFFIX: &str = "-proxy-configmap";

/// A weighted TCP/UDP load balancer in front of a set of backends.
// Several printcolumns share a `type_`, which clippy mistakes for a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "exposer.hliangzhao.io",
    version = "v1alpha1",
    kind = "Balancer",
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
    #[serde(deserialize_with = "read_ports")]
    #[schemars(length(min = 1, max = 32))]
    pub ports: Vec<BalancerPort>,
    /// Labels common to the pods of every backend.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "read_selector")]
    #[schemars(schema_with = "selector_schema")]
    pub selector: Option<BTreeMap<String, String>>,
    /// The backends traffic is split across, by weight.
    #[serde(deserialize_with = "read_backends")]
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

/// Observed state of a Balancer.
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

// Lists and selectors are read within their bounds (see `crate::bounded`): a stored
// object or a review with a huge list costs no more memory than the limit.

fn read_ports<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<BalancerPort>, D::Error> {
    bounded::list(d, MAX_PORTS, "ports")
}

fn read_backends<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<BackendSpec>, D::Error> {
    bounded::list(d, MAX_BACKENDS, "backends")
}

fn read_selector<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    bounded::optional_string_map(d, MAX_SELECTOR_LABELS, "labels")
}

/// At most 32 labels, each value a label value (at most 63 characters). Label keys (at most
/// 317 characters) cannot be bounded in a structural schema without CEL; the webhook checks them.
fn selector_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "maxProperties": MAX_SELECTOR_LABELS,
        "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_LEN},
    })
}

/// A port number (1..65535) or an IANA service name (at most 15 characters). A structural
/// schema allows no types inside an int-or-string's `anyOf`, but `minimum`/`maximum` only
/// apply to numbers and `maxLength` only to strings, so both bounds sit side by side.
fn target_port_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "nullable": true,
        "minimum": 1,
        "maximum": 65535,
        "maxLength": MAX_IANA_SVC_NAME_LEN,
    })
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
}

impl BackendSpec {
    /// The weight after defaulting.
    pub fn effective_weight(&self) -> i32 {
        self.weight.unwrap_or(DEFAULT_WEIGHT)
    }
}

impl BalancerPort {
    /// The protocol after defaulting.
    pub fn effective_protocol(&self) -> &str {
        self.protocol.as_deref().unwrap_or(DEFAULT_PROTOCOL)
    }

    /// The target port after defaulting (`port` itself).
    pub fn effective_target_port(&self) -> IntOrString {
        self.target_port.clone().unwrap_or(IntOrString::Int(self.port))
    }
}

/// Name of the Service in front of one backend's pods.
pub fn backend_service_name(balancer: &str, backend: &str) -> String {
    format!("{balancer}-{backend}{BACKEND_SERVICE_SUFFIX}")
}

/// Name of the nginx proxy Deployment.
pub fn proxy_deployment_name(balancer: &str) -> String {
    format!("{balancer}{PROXY_DEPLOYMENT_SUFFIX}")
}

/// Name of the ConfigMap holding `nginx.conf`.
pub fn proxy_configmap_name(balancer: &str) -> String {
    format!("{balancer}{PROXY_CONFIGMAP_SUFFIX}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crd_identity_matches_the_go_project() {
        let crd = Balancer::crd();
        assert_eq!(crd.metadata.name.as_deref(), Some("balancers.exposer.hliangzhao.io"));
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.kind, KIND);
        assert_eq!(crd.spec.names.short_names, Some(vec!["bal".to_string()]));
        assert_eq!(crd.spec.versions[0].name, VERSION);
        assert!(crd.spec.versions[0].subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
    }

    #[test]
    fn merged_selector_lets_the_backend_win() {
        let spec = BalancerSpec {
            ports: vec![],
            selector: Some(BTreeMap::from([("app".into(), "a".into()), ("tier".into(), "x".into())])),
            backends: vec![],
        };
        let backend = BackendSpec {
            name: "v1".into(),
            weight: None,
            selector: Some(BTreeMap::from([("tier".into(), "y".into())])),
        };
        let merged = spec.merged_selector(&backend);
        assert_eq!(merged.get("app").map(String::as_str), Some("a"));
        assert_eq!(merged.get("tier").map(String::as_str), Some("y"));
    }
}

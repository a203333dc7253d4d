//! The fields both versions share: a port and a backend, with their schemas, and the bounded
//! readers every list and map of the spec is deserialized with.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::formats::{MAX_IANA_SVC_NAME_LEN, MAX_LABEL_LEN};
use super::{
    DEFAULT_WEIGHT, MAX_BACKENDS, MAX_PORTS, MAX_SELECTOR_LABELS, MAX_SERVICE_ANNOTATIONS, MAX_SOURCE_RANGES, Protocol,
};
use crate::util::bounded;

/// One front-end port of a Balancer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
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
    /// How long the proxy waits to connect to a backend before it tries another (nginx's
    /// `proxy_connect_timeout`), e.g. `5s`; 100ms to 5m, defaulted to 5s. v1beta1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub connect_timeout: Option<String>,
    /// How long a connection (a UDP session) may stay silent before the proxy closes it
    /// (nginx's `proxy_timeout`); 1s to 24h, defaulted to 10m for TCP and 10s for UDP. v1beta1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub idle_timeout: Option<String>,
    /// The node port of this port when `spec.service.type` is NodePort or LoadBalancer; the API
    /// server allocates one when unset, and refuses one outside its node-port range
    /// (30000-32767 by default). v1beta1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub node_port: Option<i32>,
    /// Send the PROXY protocol (version 1) header to the backends, so that they see the
    /// client's address (nginx's `proxy_protocol on`). TCP only; the backends must expect it.
    /// v1beta1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<bool>,
    /// Require the PROXY protocol header (version 1 or 2) on every connection to this port, as
    /// a cloud load balancer in front sends it (nginx's `listen … proxy_protocol`): the
    /// client's address in it is the one `sessionAffinity: ClientIP` hashes and `proxyProtocol`
    /// passes on. TCP only. v1beta1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept_proxy_protocol: Option<bool>,
}

/// One backend: a set of pods and its share of the traffic.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
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
    /// Failed connections within `failTimeout` after which the proxy stops sending this
    /// backend traffic for `failTimeout` (nginx's `max_fails`); 0 to 100, 0 never marks it
    /// failed; defaulted to 1. v1beta1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_fails: Option<i32>,
    /// See `maxFails` (nginx's `fail_timeout`); 1s to 1h, defaulted to 10s. v1beta1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub fail_timeout: Option<String>,
    /// Most connections each proxy pod keeps open to this backend at once, 1 to 1,000,000;
    /// past it, new connections go to the other backends, and are refused when every backend
    /// is full (nginx's `max_conns`). Unset: no limit. v1beta1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_connections: Option<i32>,
    /// A backup takes connections only while no other backend can (each is marked failed,
    /// full, or has weight 0) (nginx's `backup`). Not with `sessionAffinity: ClientIP` or
    /// `algorithm: PowerOfTwoChoices`, and at least one backend must not be a backup. v1beta1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<bool>,
}

/// A duration as nginx writes it: digits and one unit, `ms`, `s`, `m` or `h` (`5s`, `500ms`).
pub(crate) fn duration_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "nullable": true,
        "maxLength": 12,
        "pattern": "^[0-9]{1,9}(ms|s|m|h)$",
    })
}

/// Milliseconds in a duration written as nginx writes it (see `duration_schema`).
pub fn duration_millis(text: &str) -> Option<u64> {
    let digits = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(digits);
    if number.is_empty() || number.len() > 9 {
        return None;
    }
    let number: u64 = number.parse().ok()?;
    let scale = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    Some(number * scale)
}

// Lists and selectors are read within their bounds (see `crate::util::bounded`): a stored
// object or a review with a huge list costs no more memory than the limit.

pub(crate) fn read_ports<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<BalancerPort>, D::Error> {
    bounded::list(d, MAX_PORTS, "ports")
}

pub(crate) fn read_backends<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<BackendSpec>, D::Error> {
    bounded::list(d, MAX_BACKENDS, "backends")
}

pub(crate) fn read_annotations<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    bounded::optional_string_map(d, MAX_SERVICE_ANNOTATIONS, "annotations")
}

pub(crate) fn read_source_ranges<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    bounded::optional_strings(d, MAX_SOURCE_RANGES, "CIDRs")
}

pub(crate) fn read_selector<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    bounded::optional_string_map(d, MAX_SELECTOR_LABELS, "labels")
}

/// At most 32 labels, each value a label value (at most 63 characters). Label keys (at most
/// 317 characters) cannot be bounded in a structural schema without CEL; the webhook checks them.
pub(crate) fn selector_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
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
pub(crate) fn target_port_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "nullable": true,
        "minimum": 1,
        "maximum": 65535,
        "maxLength": MAX_IANA_SVC_NAME_LEN,
    })
}

impl BackendSpec {
    /// The weight after defaulting.
    pub fn effective_weight(&self) -> i32 {
        self.weight.unwrap_or(DEFAULT_WEIGHT)
    }

    /// Whether it takes connections only when the others cannot.
    pub fn is_backup(&self) -> bool {
        self.backup == Some(true)
    }
}

impl BalancerPort {
    /// The protocol as written, `TCP` when unset: what validation reads and names in its
    /// messages (builders read [`Protocol`] from an admitted spec).
    pub fn written_protocol(&self) -> &str {
        self.protocol.as_deref().unwrap_or(Protocol::Tcp.as_str())
    }

    /// Whether the proxy sends the PROXY protocol header to the backends.
    pub fn sends_proxy_protocol(&self) -> bool {
        self.proxy_protocol == Some(true)
    }

    /// Whether the proxy requires the PROXY protocol header from clients.
    pub fn accepts_proxy_protocol(&self) -> bool {
        self.accept_proxy_protocol == Some(true)
    }

    /// The target port after defaulting (`port` itself).
    pub fn effective_target_port(&self) -> IntOrString {
        self.target_port.clone().unwrap_or(IntOrString::Int(self.port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::BalancerSpec;

    #[test]
    fn merged_selector_lets_the_backend_win() {
        let spec = BalancerSpec {
            replicas: None,
            session_affinity: None,
            algorithm: None,
            service: None,
            proxy: None,
            canary: None,
            ports: vec![],
            selector: Some(BTreeMap::from([("app".into(), "a".into()), ("tier".into(), "x".into())])),
            backends: vec![],
        };
        let backend = BackendSpec {
            name: "v1".into(),
            weight: None,
            selector: Some(BTreeMap::from([("tier".into(), "y".into())])),
            ..Default::default()
        };
        let merged = spec.merged_selector(&backend);
        assert_eq!(merged.get("app").map(String::as_str), Some("a"));
        assert_eq!(merged.get("tier").map(String::as_str), Some("y"));
    }
}

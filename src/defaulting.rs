//! Defaults the mutating webhook fills in, as an RFC 6902 JSON Patch.
//!
//! Only fields that are missing get a value, so the patch for an object that
//! is already defaulted is empty: mutation is idempotent.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use crate::api::{BalancerSpec, DEFAULT_PROTOCOL, DEFAULT_WEIGHT, MAX_BACKENDS, MAX_PORTS};

/// The patch that sets protocol `TCP`, `targetPort` = `port` and weight 1 wherever they are missing.
pub fn defaults_patch(spec: &BalancerSpec) -> Patch {
    let mut ops = Vec::new();
    if !within_bounds(spec) {
        return Patch(ops);
    }
    for (i, port) in spec.ports.iter().enumerate() {
        if protocol_missing(&port.protocol) {
            ops.push(add(["spec", "ports", &i.to_string(), "protocol"], json!(DEFAULT_PROTOCOL)));
        }
        if target_port_missing(&port.target_port) {
            ops.push(add(["spec", "ports", &i.to_string(), "targetPort"], json!(port.port)));
        }
    }
    for (i, backend) in spec.backends.iter().enumerate() {
        if backend.weight.is_none() {
            ops.push(add(["spec", "backends", &i.to_string(), "weight"], json!(DEFAULT_WEIGHT)));
        }
    }
    Patch(ops)
}

/// Validation refuses longer lists; defaulting them would only cost memory.
fn within_bounds(spec: &BalancerSpec) -> bool {
    spec.ports.len() <= MAX_PORTS && spec.backends.len() <= MAX_BACKENDS
}

/// An empty protocol is as good as none: nginx and Services need one.
fn protocol_missing(protocol: &Option<String>) -> bool {
    protocol.as_deref().is_none_or(str::is_empty)
}

/// An empty named port is as good as none.
fn target_port_missing(target: &Option<IntOrString>) -> bool {
    match target {
        None => true,
        Some(IntOrString::String(s)) => s.is_empty(),
        Some(IntOrString::Int(_)) => false,
    }
}

/// `add` replaces a member that exists (e.g. an explicit `null`) and creates one that does not.
fn add<const N: usize>(tokens: [&str; N], value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path: PointerBuf::from_tokens(tokens), value })
}

/// The spec with its defaults filled in, the way the API server stores it after mutation.
pub fn with_defaults(spec: &BalancerSpec) -> BalancerSpec {
    let mut spec = spec.clone();
    if !within_bounds(&spec) {
        return spec;
    }
    for port in &mut spec.ports {
        if protocol_missing(&port.protocol) {
            port.protocol = Some(DEFAULT_PROTOCOL.to_string());
        }
        if target_port_missing(&port.target_port) {
            port.target_port = Some(IntOrString::Int(port.port));
        }
    }
    for backend in &mut spec.backends {
        backend.weight.get_or_insert(DEFAULT_WEIGHT);
    }
    spec
}

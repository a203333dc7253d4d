//! Defaults, written once: [`with_defaults`] fills them in, and the mutating webhook's
//! JSON Patch is derived from the spec before and after (as controller-runtime's
//! `CustomDefaulter` does), so the two can never disagree.
//!
//! Only fields that are missing get a value, so the patch for an object that is already
//! defaulted is empty: mutation is idempotent.

use json_patch::Patch;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Map, Value};

use super::policy::SpecPolicy;
use crate::api::{
    Algorithm, BalancerSpec, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FAIL_TIMEOUT, DEFAULT_MAX_FAILS,
    DEFAULT_TCP_IDLE_TIMEOUT, DEFAULT_UDP_IDLE_TIMEOUT, DEFAULT_WEIGHT, MAX_BACKENDS, MAX_PORTS, Protocol, ServiceType,
    SessionAffinity,
};

/// The spec with its defaults filled in, the way the API server stores it after mutation:
/// protocol `TCP`, `targetPort` = `port`, weight 1, `sessionAffinity: None`, `algorithm: RoundRobin`,
/// `service.type: ClusterIP`, the timeouts and
/// passive health settings (see [`crate::api`]'s `DEFAULT_*`), and `replicas` from `defaults`.
pub fn with_defaults(spec: &BalancerSpec, defaults: &SpecPolicy) -> BalancerSpec {
    let mut spec = spec.clone();
    fill_defaults(&mut spec, defaults);
    spec
}

/// [`with_defaults`] in place: the one place defaults are written.
pub fn fill_defaults(spec: &mut BalancerSpec, defaults: &SpecPolicy) {
    // Validation refuses longer lists; defaulting them would only cost memory.
    if spec.ports.len() > MAX_PORTS || spec.backends.len() > MAX_BACKENDS {
        return;
    }
    spec.replicas.get_or_insert(defaults.replicas);
    fill(&mut spec.session_affinity, SessionAffinity::default().as_str());
    fill(&mut spec.algorithm, Algorithm::default().as_str());
    // Only the type: `externalTrafficPolicy` is left to Kubernetes, since a default written
    // into a NodePort Balancer would make the same spec invalid once switched to ClusterIP.
    fill(&mut spec.service.get_or_insert_default().type_, ServiceType::default().as_str());
    for port in &mut spec.ports {
        fill(&mut port.protocol, Protocol::default().as_str());
        // An empty port name counts as unset.
        let missing = match &port.target_port {
            None => true,
            Some(IntOrString::String(name)) => name.is_empty(),
            Some(IntOrString::Int(_)) => false,
        };
        if missing {
            port.target_port = Some(IntOrString::Int(port.port));
        }
        fill(&mut port.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        let udp = port.protocol.as_deref() == Some(Protocol::Udp.as_str());
        let idle = if udp { DEFAULT_UDP_IDLE_TIMEOUT } else { DEFAULT_TCP_IDLE_TIMEOUT };
        fill(&mut port.idle_timeout, idle);
    }
    for backend in &mut spec.backends {
        backend.weight.get_or_insert(DEFAULT_WEIGHT);
        backend.max_fails.get_or_insert(DEFAULT_MAX_FAILS);
        fill(&mut backend.fail_timeout, DEFAULT_FAIL_TIMEOUT);
    }
}

/// Sets a missing or empty text field to `default`.
fn fill(field: &mut Option<String>, default: &str) {
    if field.as_deref().is_none_or(str::is_empty) {
        *field = Some(default.to_string());
    }
}

/// The RFC 6902 patch that turns `spec` (at `/spec` of the reviewed object) into
/// [`with_defaults`]'s result. Lists keep their indices, so every path names a member
/// that the reviewed object has or can take.
pub fn defaults_patch(spec: &BalancerSpec, defaults: &SpecPolicy) -> Result<Patch, serde_json::Error> {
    let at_spec = |spec: &BalancerSpec| -> Result<Value, serde_json::Error> {
        Ok(Value::Object(Map::from_iter([("spec".to_string(), serde_json::to_value(spec)?)])))
    };
    Ok(json_patch::diff(&at_spec(spec)?, &at_spec(&with_defaults(spec, defaults))?))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A spec of `ports` ports and `backends` backends, none defaulted. Reading refuses longer
    /// lists than validation allows, so they are pushed after.
    fn spec(ports: usize, backends: usize) -> BalancerSpec {
        let port = |i: usize| json!({"name": format!("p{i}"), "port": 1000 + i});
        let backend = |i: usize| json!({"name": format!("b{i}"), "selector": {"app": format!("b{i}")}});
        let mut spec: BalancerSpec =
            serde_json::from_value(json!({"ports": [port(0)], "backends": [backend(0)]})).expect("a spec");
        for i in 1..ports {
            spec.ports.push(serde_json::from_value(port(i)).expect("a port"));
        }
        for i in 1..backends {
            spec.backends.push(serde_json::from_value(backend(i)).expect("a backend"));
        }
        spec
    }

    /// Any spec that reads is within the limits; one built in memory beyond them costs no
    /// defaulting.
    #[test]
    fn a_list_longer_than_validation_allows_is_not_defaulted() {
        let defaults = SpecPolicy::default();
        for (ports, backends) in [(MAX_PORTS + 1, 1), (1, MAX_BACKENDS + 1)] {
            let too_long = spec(ports, backends);
            assert_eq!(with_defaults(&too_long, &defaults), too_long, "{ports} ports, {backends} backends");
        }
        let within = spec(MAX_PORTS, MAX_BACKENDS);
        assert_ne!(with_defaults(&within, &defaults), within, "defaulted up to the limits");
    }
}

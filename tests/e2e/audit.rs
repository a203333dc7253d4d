//! Over every request of every scenario before it: the operator called no deprecated API.

use serde_json::Value;

use crate::World;
use crate::toolkit::cluster::OPERATOR;

/// Last, over every request of every scenario before it: the API server's audit log marks a
/// request to a deprecated API (core/v1 Endpoints, say, since v1.33), and the operator made none.
/// (The outages' operators run the same binary's calls, Leases and events among them.)
pub(crate) async fn the_operator_calls_no_deprecated_api(world: &mut World) {
    let events = world.plane.audit_events();
    let operators: Vec<&Value> = events.iter().filter(|e| e["user"]["username"] == OPERATOR.name).collect();
    assert!(operators.len() > 100, "the audit log holds {} events of the operator: is it written?", operators.len());
    // "VERB URI" of each request to an API the server marks deprecated.
    let deprecated: Vec<String> = operators
        .iter()
        .filter(|e| e["annotations"].get("k8s.io/deprecated").is_some())
        .map(|e| format!("{} {}", e["verb"].as_str().unwrap_or("?"), e["requestURI"].as_str().unwrap_or("?")))
        .collect();
    assert!(deprecated.is_empty(), "the operator called deprecated APIs:\n{}", deprecated.join("\n"));
}

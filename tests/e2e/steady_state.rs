//! Steady state: a converged operator writes nothing.

use std::time::Duration;

use serde_json::Value;

use crate::World;
use crate::toolkit::cluster::OPERATOR;

pub(crate) async fn steady_state_makes_no_writes(world: &mut World) {
    // Let the previous scenario's changes settle, then watch a quiet window.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = world.plane.audit_events().len();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let events = world.plane.audit_events();
    let window = &events[before..];
    let operator: Vec<&Value> = window.iter().filter(|e| e["user"]["username"] == OPERATOR.name).collect();
    let writes: Vec<String> = operator
        .iter()
        .filter(|e| ["create", "update", "patch", "delete"].contains(&e["verb"].as_str().unwrap_or("")))
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect();
    assert!(writes.is_empty(), "the operator wrote during a quiet 30 s window: {writes:#?}");
    // The filter does see the operator: it wrote plenty before the window.
    let earlier_writes =
        events[..before].iter().filter(|e| e["user"]["username"] == OPERATOR.name && e["verb"] == "patch").count();
    assert!(earlier_writes > 0, "no operator requests in the audit log at all: is the user name right?");
    let forbidden: Vec<String> = events
        .iter()
        .filter(|e| e["user"]["username"] == OPERATOR.name && e["responseStatus"]["code"] == 403)
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect();
    assert!(forbidden.is_empty(), "the shipped RBAC forbade: {forbidden:#?}");
    println!("e2e: quiet window: {} requests from the operator, 0 writes", operator.len());
}

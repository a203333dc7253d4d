//! What a Gateway's reconcile writes besides its proxy: the Gateway's status (conditions,
//! listeners, addresses), each route's entries for this Gateway in `status.parents` (other
//! controllers' and other Gateways' entries kept), and a GatewayClass's acceptance. Each is
//! written only when it changes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use super::watches::GatewayCaches;
use crate::api::v1beta1::BalancerAddress;
use crate::controller::Error;
use crate::controller::context::Context;
use crate::gateway::api::gatewayclasses::GatewayClass;
use crate::gateway::api::gateways::Gateway;
use crate::gateway::api::tcproutes::TcpRoute;
use crate::gateway::api::tlsroutes::TlsRoute;
use crate::gateway::api::udproutes::UdpRoute;
use crate::gateway::assembly::Assembly;
use crate::gateway::attachment::RouteKind;
use crate::gateway::routes::{RouteView, parent_ref_value};
use crate::gateway::status::{CONTROLLER_NAME, Writing, listener_status, route_parent_status};

/// The features a GatewayClass of balancer's lists in `status.supportedFeatures`, sorted as
/// Gateway API asks: the core features of the GATEWAY-TCP, GATEWAY-UDP and GATEWAY-TLS
/// profiles.
pub(crate) const SUPPORTED_FEATURES: [&str; 5] = ["Gateway", "ReferenceGrant", "TCPRoute", "TLSRoute", "UDPRoute"];

/// What a Gateway's reconcile found beside its assembly; by default, nothing served.
#[derive(Default)]
pub(crate) struct GatewayOutcome {
    /// Why the Gateway is refused (its `spec.infrastructure` against the operator's policy).
    pub refused: Option<String>,
    /// Why the parameters read are refused while the last accepted stay in force.
    pub stale_parameters: Option<String>,
    /// Whether every proxy pod serves its current configuration.
    pub served: bool,
    /// Where it is reached.
    pub addresses: Vec<BalancerAddress>,
    /// A child of its proxy whose name another object holds, as `<kind> <name>`.
    pub conflict: Option<String>,
}

/// Writes `gateway`'s status when it differs from what is stored.
pub(crate) async fn write_gateway_status(
    ctx: &Context,
    gateway: &Gateway,
    assembly: &Assembly,
    outcome: &GatewayOutcome,
    now: Timestamp,
) -> Result<(), Error> {
    let desired = gateway_status(gateway, assembly, outcome, now);
    let current = serde_json::to_value(&gateway.status).unwrap_or_default();
    if ["conditions", "listeners", "addresses"].iter().all(|k| current.get(k) == desired.get(k)) {
        return Ok(());
    }
    let api: Api<Gateway> = Api::namespaced(ctx.client.clone(), &gateway.namespace().unwrap_or_default());
    let patch = json!({"status": desired});
    api.patch_status(&gateway.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::api("write the status of", "Gateway", gateway.name_any(), e))?;
    Ok(())
}

/// The status of `gateway`: `Accepted` (whether balancer serves some listener, or why not),
/// `Programmed` (only once every proxy pod serves the listeners it serves, at an address),
/// each listener's, and the front Service's addresses.
fn gateway_status(gateway: &Gateway, assembly: &Assembly, outcome: &GatewayOutcome, now: Timestamp) -> Value {
    let status = gateway.status.as_ref();
    let previous = status.and_then(|s| s.conditions.clone()).unwrap_or_default();
    let at = Writing { generation: gateway.metadata.generation, now, previous: &previous };
    let served_listeners = assembly.verdicts.iter().filter(|v| v.served()).count();
    let all = assembly.verdicts.len();
    // balancer gives a Gateway its front Service's cluster IP, never an address asked for: an
    // address of a type it has none of is not accepted, an IP address is not assigned.
    let asked = gateway.spec.addresses.as_deref().unwrap_or_default();
    let unsupported_type = asked.iter().find_map(|a| a.r#type.as_deref().filter(|t| *t != "IPAddress"));
    let accepted = match (&outcome.refused, served_listeners) {
        (Some(refusal), _) => condition(&at, "Accepted", false, "InvalidParameters", refusal),
        _ if outcome.stale_parameters.is_some() => {
            let why = outcome.stale_parameters.as_deref().unwrap_or_default();
            let message = format!("{why}; the parameters last accepted stay in force, and routes are still applied");
            condition(&at, "Accepted", false, "InvalidParameters", &message)
        }
        _ if unsupported_type.is_some() => condition(
            &at,
            "Accepted",
            false,
            "UnsupportedAddress",
            &format!(
                "balancer assigns no address of type {}: a Gateway's address is its Service's cluster IP",
                unsupported_type.unwrap_or_default()
            ),
        ),
        (None, 0) => condition(&at, "Accepted", false, "ListenersNotValid", "balancer serves none of its listeners"),
        (None, n) if n < all => {
            condition(&at, "Accepted", true, "ListenersNotValid", "balancer serves some of its listeners, not all")
        }
        (None, _) => condition(&at, "Accepted", true, "Accepted", "balancer serves every listener"),
    };
    let programmed = match (&outcome.refused, served_listeners, outcome.served, outcome.addresses.is_empty()) {
        (Some(_), ..) | (None, 0, ..) => {
            condition(&at, "Programmed", false, "Invalid", "balancer serves none of its listeners")
        }
        _ if outcome.conflict.is_some() => condition(
            &at,
            "Programmed",
            false,
            "Pending",
            &format!(
                "{} already exists and balancer does not control it (a Balancer of the proxy's name?): rename or remove it",
                outcome.conflict.as_deref().unwrap_or_default()
            ),
        ),
        _ if !asked.is_empty() => condition(
            &at,
            "Programmed",
            false,
            "AddressNotAssigned",
            "balancer does not assign the addresses spec.addresses asks for: a Gateway's address is its Service's cluster IP",
        ),
        (None, _, _, true) => {
            condition(&at, "Programmed", false, "AddressNotAssigned", "its Service has no address yet")
        }
        (None, _, false, false) => {
            condition(&at, "Programmed", false, "Pending", "not every proxy pod serves the current configuration yet")
        }
        (None, _, true, false) => condition(&at, "Programmed", true, "Programmed", "every proxy pod serves it"),
    };
    let listeners: Vec<Value> = gateway
        .spec
        .listeners
        .iter()
        .enumerate()
        .map(|(i, listener)| {
            let previous: Vec<Condition> = status
                .and_then(|s| s.listeners.as_ref())
                .and_then(|all| all.iter().find(|l| l.name == listener.name))
                .map(|l| l.conditions.clone())
                .unwrap_or_default();
            let at = Writing { previous: &previous, ..at };
            let served = outcome.refused.is_none() && outcome.served;
            let written = listener_status(&listener.name, &assembly.verdicts[i], assembly.attached[i], served, at);
            serde_json::to_value(written).unwrap_or_default()
        })
        .collect();
    json!({
        "conditions": [accepted, programmed],
        "listeners": listeners,
        "addresses": outcome.addresses,
    })
}

/// [`Writing::condition`], as the status's JSON holds it.
fn condition(at: &Writing<'_>, type_: &str, status: bool, reason: &str, message: &str) -> Value {
    serde_json::to_value(at.condition(type_, status, reason, message)).unwrap_or_default()
}

/// Writes each route's `status.parents` entries for `gateway` when they differ: one per
/// `parentRef` naming it, none once the route names it no more. The write is conditional on
/// the route's resource version, so another Gateway's concurrent write is not lost (the loser
/// is retried).
pub(crate) async fn write_route_statuses(
    ctx: &Context,
    gateway: &Gateway,
    routes: &[RouteView],
    assembly: &Assembly,
    now: Timestamp,
) -> Result<(), Error> {
    let namespace = gateway.namespace().unwrap_or_default();
    let name = gateway.name_any();
    for (route, findings) in routes.iter().zip(&assembly.findings) {
        let names_this = |entry: &Value| {
            let parent = &entry["parentRef"];
            entry["controllerName"] == CONTROLLER_NAME
                && parent["name"] == name.as_str()
                && parent["namespace"].as_str().unwrap_or(&route.namespace) == namespace
        };
        let current: Vec<Value> =
            route.status_parents.iter().map(|p| serde_json::to_value(p).unwrap_or_default()).collect();
        let mut desired: Vec<Value> = current.iter().filter(|e| !names_this(e)).cloned().collect();
        for (parent, found) in findings {
            let parent_ref = parent_ref_value(parent);
            let previous: Vec<Condition> = current
                .iter()
                .find(|e| names_this(e) && e["parentRef"] == parent_ref)
                .and_then(|e| serde_json::from_value(e["conditions"].clone()).ok())
                .unwrap_or_default();
            let at = Writing { generation: route.generation, now, previous: &previous };
            let entry = route_parent_status(parent_ref, found, at);
            desired.push(serde_json::to_value(entry).unwrap_or_default());
        }
        if same_entries(&current, &desired) {
            continue;
        }
        let patch = json!({
            "metadata": {"resourceVersion": route.resource_version},
            "status": {"parents": desired},
        });
        patch_route_status(ctx, route, &patch).await?;
    }
    Ok(())
}

/// Takes balancer's entries out of every route's `status.parents` for the Gateways it no longer
/// serves: deleted (no finalizer holds a Gateway back, so this runs when one is deleted, and
/// once at the start for those deleted meanwhile) or moved to another class. Each write is
/// conditional on the route's resource version.
/// Every route is tried; the first failure (a conflicting write: the route changed) is returned
/// once the others are done, for the caller to try again.
pub(crate) async fn withdraw_stale_entries(ctx: &Context, caches: &GatewayCaches) -> Result<(), Error> {
    // Still served unless gone, being deleted, or another controller's (a class that is missing
    // may come back, and its Gateway's proxy still serves).
    let served = |namespace: &str, name: &str| {
        let gateway = caches.gateways.get(&ObjectRef::new(name).within(namespace));
        gateway.is_some_and(|g| g.metadata.deletion_timestamp.is_none() && !caches.is_others(&g))
    };
    let mut failed = Ok(());
    for route in caches.routes() {
        let Some(kept) = route.without_stale_entries(served) else { continue };
        let patch = json!({
            "metadata": {"resourceVersion": route.resource_version},
            "status": {"parents": kept},
        });
        match patch_route_status(ctx, &route, &patch).await {
            Ok(()) => tracing::info!(kind = route.kind.kind(), namespace = %route.namespace, name = %route.name,
                "took balancer's entries for Gateways it no longer serves out of the route's status"),
            Err(e) => {
                if failed.is_ok() {
                    failed = Err(e);
                }
            }
        }
    }
    failed
}

/// Whether two lists of entries hold the same entries, in any order.
fn same_entries(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len() && a.iter().all(|e| b.contains(e))
}

async fn patch_route_status(ctx: &Context, route: &RouteView, patch: &Value) -> Result<(), Error> {
    let params = PatchParams::default();
    let patch = Patch::Merge(patch);
    let (client, namespace, name) = (ctx.client.clone(), route.namespace.as_str(), route.name.as_str());
    let result = match route.kind {
        RouteKind::Tcp => {
            Api::<TcpRoute>::namespaced(client, namespace).patch_status(name, &params, &patch).await.map(drop)
        }
        RouteKind::Udp => {
            Api::<UdpRoute>::namespaced(client, namespace).patch_status(name, &params, &patch).await.map(drop)
        }
        RouteKind::Tls => {
            Api::<TlsRoute>::namespaced(client, namespace).patch_status(name, &params, &patch).await.map(drop)
        }
    };
    result.map_err(|e| Error::api("write the status of", route.kind.kind(), name, e))
}

/// Accepts `class`, a GatewayClass balancer serves, with its supported features; writes only
/// what changed.
pub(crate) async fn accept_class(ctx: &Context, class: &GatewayClass, now: Timestamp) -> Result<(), Error> {
    if class.spec.controller_name != CONTROLLER_NAME || class.meta().deletion_timestamp.is_some() {
        return Ok(());
    }
    let status = class.status.as_ref();
    let previous = status.and_then(|s| s.conditions.clone()).unwrap_or_default();
    let at = Writing { generation: class.metadata.generation, now, previous: &previous };
    let accepted = match crate::gateway::parameters::class_refusal(class) {
        None => condition(&at, "Accepted", true, "Accepted", "balancer serves Gateways of this class"),
        Some(why) => condition(&at, "Accepted", false, "InvalidParameters", &why),
    };
    let features: Vec<Value> = SUPPORTED_FEATURES.iter().map(|f| json!({"name": f})).collect();
    let desired = json!({"conditions": [accepted], "supportedFeatures": features});
    let current = serde_json::to_value(status).unwrap_or_default();
    if current.get("conditions") == desired.get("conditions")
        && current.get("supportedFeatures") == desired.get("supportedFeatures")
    {
        return Ok(());
    }
    let api: Api<GatewayClass> = Api::all(ctx.client.clone());
    api.patch_status(&class.name_any(), &PatchParams::default(), &Patch::Merge(&json!({"status": desired})))
        .await
        .map_err(|e| Error::api("write the status of", "GatewayClass", class.name_any(), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Service;
    use serde_json::json;

    use super::*;
    use crate::gateway::assembly::{Lookups, assemble};

    /// A Gateway of one TCP listener asking for `addresses`.
    fn gateway(addresses: serde_json::Value) -> Gateway {
        serde_json::from_value(json!({
            "metadata": {"namespace": "apps", "name": "gw", "generation": 1},
            "spec": {"gatewayClassName": "balancer", "addresses": addresses,
                     "listeners": [{"name": "pg", "port": 5432, "protocol": "TCP"}]}
        }))
        .expect("a Gateway")
    }

    /// The status `gateway` gets with `outcome`, assembled without routes.
    fn status(gateway: &Gateway, outcome: &GatewayOutcome) -> Value {
        let lookups = Lookups {
            namespace_labels: |_: &str| BTreeMap::new(),
            service: |_: &str, _: &str| None::<&Service>,
            grants: |_: &str| Vec::new(),
            ready_pods: |_: &str, _: &str| None,
        };
        gateway_status(gateway, &assemble(gateway, &[], &lookups), outcome, Timestamp::UNIX_EPOCH)
    }

    /// The status and reason of condition `index` (0: Accepted, 1: Programmed) of a Gateway
    /// asking for `addresses`, served or not, at a cluster IP.
    fn condition_of(addresses_asked: serde_json::Value, served: bool, index: usize) -> (String, String) {
        let addresses = vec![BalancerAddress { type_: "IPAddress".into(), value: "10.96.0.20".into() }];
        let status =
            status(&gateway(addresses_asked), &GatewayOutcome { served, addresses, ..GatewayOutcome::default() });
        let condition = &status["conditions"][index];
        let text = |key: &str| condition[key].as_str().unwrap_or_default().to_string();
        (text("status"), text("reason"))
    }

    #[test]
    fn a_gateway_asking_for_an_address_is_never_programmed_and_one_of_another_type_not_accepted() {
        let programmed = |addresses, served| condition_of(addresses, served, 1);
        let accepted = |addresses| condition_of(addresses, true, 0);
        assert_eq!(programmed(json!([]), true), ("True".into(), "Programmed".into()));
        assert_eq!(programmed(json!([]), false), ("False".into(), "Pending".into()));
        let asked = json!([{"type": "IPAddress", "value": "192.0.2.7"}]);
        assert_eq!(programmed(asked, true), ("False".into(), "AddressNotAssigned".into()));
        let named = json!([{"type": "Hostname", "value": "edge.example.com"}]);
        assert_eq!(accepted(named), ("False".into(), "UnsupportedAddress".into()));
        assert_eq!(accepted(json!([{"value": "192.0.2.7"}])), ("True".into(), "Accepted".into()));
    }

    #[test]
    fn a_held_child_name_is_named_in_the_status() {
        let conflict = Some("Deployment gw-balancer-proxy".to_string());
        let status = status(&gateway(json!([])), &GatewayOutcome { conflict, ..GatewayOutcome::default() });
        let programmed = &status["conditions"][1];
        assert_eq!(programmed["reason"], "Pending");
        let message = programmed["message"].as_str().unwrap_or_default();
        assert!(message.starts_with("Deployment gw-balancer-proxy already exists"), "{message}");
    }
}

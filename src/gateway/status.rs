//! The status balancer writes on routes and on a Gateway's listeners, as pure functions of the
//! verdicts: each condition Gateway API defines for them, with its reason, keeping its
//! transition time while its status holds.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use super::attachment::{GROUP, NotAccepted};
use super::verdicts::Verdict;
use crate::runtime::conditions::keep_transition;

/// The `controllerName` of the GatewayClasses balancer serves, and the name it writes in the
/// routes' status.
pub const CONTROLLER_NAME: &str = "exposer.hliangzhao.io/balancer";

/// What balancer found of a route through one parent reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteFindings {
    /// `Accepted`: attached to some listener, or why not.
    pub attached: Result<(), NotAccepted>,
    /// `ResolvedRefs`: every backend reference resolved, or the first one's reason and message.
    pub resolved: Result<(), (&'static str, String)>,
    /// The route's hostnames a more specific listener of the Gateway takes, so that the
    /// listeners it attached to do not serve them (sorted): `Accepted` says which.
    pub shadowed: Vec<String>,
}

/// A route's status for one parent, as every route kind's `status.parents[]` holds it.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    /// The parent reference as the route spells it.
    pub parent_ref: serde_json::Value,
    /// [`CONTROLLER_NAME`].
    pub controller_name: String,
    /// `Accepted` and `ResolvedRefs`.
    pub conditions: Vec<Condition>,
}

/// A listener's status, as a Gateway's `status.listeners[]` holds it.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    /// The listener's name.
    pub name: String,
    /// The route kinds it admits.
    pub supported_kinds: Vec<SupportedKind>,
    /// The routes accepted to it.
    pub attached_routes: i32,
    /// `Accepted`, `Programmed`, `ResolvedRefs` and `Conflicted`.
    pub conditions: Vec<Condition>,
}

/// A route kind, with its group.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct SupportedKind {
    /// Gateway API's group.
    pub group: String,
    /// The kind.
    pub kind: String,
}

/// When and for which generation the conditions are written, and the ones they replace.
#[derive(Debug, Clone, Copy)]
pub struct Writing<'a> {
    /// The object's `metadata.generation`.
    pub generation: Option<i64>,
    /// Now.
    pub now: Timestamp,
    /// The conditions the status holds (for their transition times).
    pub previous: &'a [Condition],
}

impl Writing<'_> {
    /// A condition as written now, keeping the previous one's transition time while its status
    /// holds.
    pub fn condition(&self, type_: &str, status: bool, reason: &str, message: impl Into<String>) -> Condition {
        let condition = Condition {
            type_: type_.to_string(),
            status: if status { "True" } else { "False" }.to_string(),
            reason: reason.to_string(),
            message: message.into(),
            observed_generation: self.generation,
            last_transition_time: Time(self.now),
        };
        keep_transition(condition, self.previous.iter().find(|c| c.type_ == type_))
    }
}

/// A route's status for `parent_ref`.
pub fn route_parent_status(
    parent_ref: serde_json::Value,
    findings: &RouteFindings,
    at: Writing<'_>,
) -> RouteParentStatus {
    let accepted = match findings.attached {
        Ok(()) if findings.shadowed.is_empty() => at.condition("Accepted", true, "Accepted", "attached to the Gateway"),
        Ok(()) => at.condition("Accepted", true, "Accepted", shadowed_message(&findings.shadowed)),
        Err(why) => at.condition("Accepted", false, why.reason(), not_accepted_message(why)),
    };
    let resolved = match &findings.resolved {
        Ok(()) => at.condition("ResolvedRefs", true, "ResolvedRefs", "every backend reference resolves"),
        Err((reason, message)) => at.condition("ResolvedRefs", false, reason, message.clone()),
    };
    RouteParentStatus { parent_ref, controller_name: CONTROLLER_NAME.to_string(), conditions: vec![accepted, resolved] }
}

/// What `Accepted` says of a route that lost names to a more specific listener: at most
/// [`SHADOWED_NAMES_SHOWN`] of them, so that the message stays short whatever the route lists.
fn shadowed_message(shadowed: &[String]) -> String {
    let shown: Vec<&str> = shadowed.iter().take(SHADOWED_NAMES_SHOWN).map(String::as_str).collect();
    let more = shadowed.len().saturating_sub(SHADOWED_NAMES_SHOWN);
    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
    format!(
        "attached to the Gateway; not served through the listeners it attached to, because a more specific \
         listener takes them: {}{more}",
        shown.join(", ")
    )
}

/// How many lost names [`shadowed_message`] lists.
const SHADOWED_NAMES_SHOWN: usize = 8;

fn not_accepted_message(why: NotAccepted) -> &'static str {
    match why {
        NotAccepted::NoMatchingParent => {
            "no listener of the Gateway has the sectionName or port the reference asks for"
        }
        NotAccepted::NotAllowedByListeners => "no listener the reference names admits this route's kind and namespace",
        NotAccepted::NoMatchingListenerHostname => "no hostname of the route is one the listeners it names cover",
        NotAccepted::GatewayFull => {
            "the Gateway's proxy configuration would exceed its 1 MiB with this route: older routes are served, this \
             one once room is made"
        }
    }
}

/// A listener's status: `served` says whether every proxy pod serves the Gateway's current
/// configuration (`Programmed`, as a Balancer's); a listener balancer does not serve is never
/// `Programmed`.
pub fn listener_status(
    name: &str,
    verdict: &Verdict,
    attached_routes: i32,
    served: bool,
    at: Writing<'_>,
) -> ListenerStatus {
    let accepted = match verdict.accepted {
        Ok(()) => at.condition("Accepted", true, "Accepted", "balancer serves this protocol"),
        Err(reason) => at.condition(
            "Accepted",
            false,
            reason,
            "balancer serves TCP, UDP and TLS passthrough listeners only: not HTTP, HTTPS or TLS that terminates",
        ),
    };
    let programmed = match (verdict.served(), served) {
        (true, true) => at.condition("Programmed", true, "Programmed", "every proxy pod serves it"),
        (true, false) => at.condition("Programmed", false, "Pending", "not every proxy pod serves it yet"),
        (false, _) => at.condition("Programmed", false, "Invalid", "balancer does not serve this listener"),
    };
    let resolved = match verdict.resolved_refs {
        Ok(()) => at.condition("ResolvedRefs", true, "ResolvedRefs", "every reference resolves"),
        Err(reason) => at.condition("ResolvedRefs", false, reason, "allowedRoutes.kinds lists a kind it cannot take"),
    };
    let conflicted = match verdict.conflicted {
        None => at.condition("Conflicted", false, "NoConflicts", "no other listener takes its connections"),
        Some(reason) => at.condition("Conflicted", true, reason, "another listener on its port cannot be told apart"),
    };
    let supported_kinds = verdict
        .supported_kinds
        .iter()
        .map(|kind| SupportedKind { group: GROUP.to_string(), kind: kind.kind().to_string() })
        .collect();
    ListenerStatus {
        name: name.to_string(),
        supported_kinds,
        attached_routes,
        conditions: vec![accepted, programmed, resolved, conflicted],
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::gateway::api::gateways::GatewayListeners;
    use crate::gateway::verdicts::verdicts;

    fn at(seconds: i64, previous: &[Condition]) -> Writing<'_> {
        Writing { generation: Some(2), now: Timestamp::from_second(seconds).expect("a time"), previous }
    }

    fn summary(conditions: &[Condition]) -> Vec<(String, String, String)> {
        conditions.iter().map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone())).collect()
    }

    fn owned(rows: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
        rows.iter().map(|&(t, s, r)| (t.to_string(), s.to_string(), r.to_string())).collect()
    }

    #[test]
    fn a_routes_parent_status_says_why_and_keeps_its_transition_times() {
        let parent = json!({"name": "gw", "sectionName": "pg"});
        let attached = RouteFindings {
            attached: Ok(()),
            resolved: Err(("BackendNotFound", "no Service apps/pg".into())),
            shadowed: Vec::new(),
        };
        let first = route_parent_status(parent.clone(), &attached, at(100, &[]));
        assert_eq!(first.controller_name, CONTROLLER_NAME);
        assert_eq!(
            summary(&first.conditions),
            owned(&[("Accepted", "True", "Accepted"), ("ResolvedRefs", "False", "BackendNotFound")])
        );
        let fixed = RouteFindings { attached: Ok(()), resolved: Ok(()), shadowed: Vec::new() };
        let second = route_parent_status(parent.clone(), &fixed, at(200, &first.conditions));
        let times: Vec<i64> = second.conditions.iter().map(|c| c.last_transition_time.0.as_second()).collect();
        assert_eq!(times, [100, 200], "Accepted held, ResolvedRefs changed");
        let refused =
            RouteFindings { attached: Err(NotAccepted::NotAllowedByListeners), resolved: Ok(()), shadowed: Vec::new() };
        let third = route_parent_status(parent, &refused, at(300, &second.conditions));
        assert_eq!(summary(&third.conditions)[0], owned(&[("Accepted", "False", "NotAllowedByListeners")])[0]);
        assert_eq!(serde_json::to_value(&third).expect("JSON")["parentRef"]["sectionName"], "pg");
    }

    /// A route that lost names to a more specific listener stays `Accepted` and says which
    /// names, at most eight of them.
    #[test]
    fn a_route_says_which_names_a_more_specific_listener_takes() {
        let parent = json!({"name": "gw"});
        let shadowed: Vec<String> = (0..10).map(|i| format!("h{i}.pay.example.com")).collect();
        let findings = RouteFindings { attached: Ok(()), resolved: Ok(()), shadowed };
        let status = route_parent_status(parent, &findings, at(1, &[]));
        let accepted = &status.conditions[0];
        assert_eq!((accepted.status.as_str(), accepted.reason.as_str()), ("True", "Accepted"));
        assert!(accepted.message.contains("h0.pay.example.com, h1.pay.example.com"), "{}", accepted.message);
        assert!(accepted.message.ends_with("h7.pay.example.com and 2 more"), "{}", accepted.message);
    }

    #[test]
    fn a_listener_is_programmed_only_when_served() {
        let listeners: Vec<GatewayListeners> = serde_json::from_value(json!([
            {"name": "pg", "port": 5432, "protocol": "TCP"},
            {"name": "http", "port": 80, "protocol": "HTTP"},
            {"name": "a", "port": 53, "protocol": "UDP"},
            {"name": "b", "port": 53, "protocol": "UDP"},
        ]))
        .expect("listeners");
        let verdicts = verdicts(&listeners);
        let status = |i: usize, served: bool| listener_status(&listeners[i].name, &verdicts[i], 1, served, at(1, &[]));
        let (pg, pending) = (status(0, true), status(0, false));
        assert_eq!(
            summary(&pg.conditions),
            owned(&[
                ("Accepted", "True", "Accepted"),
                ("Programmed", "True", "Programmed"),
                ("ResolvedRefs", "True", "ResolvedRefs"),
                ("Conflicted", "False", "NoConflicts"),
            ])
        );
        assert_eq!(summary(&pending.conditions)[1], owned(&[("Programmed", "False", "Pending")])[0]);
        assert_eq!(pg.supported_kinds, [SupportedKind { group: GROUP.into(), kind: "TCPRoute".into() }]);
        let http = status(1, true);
        assert_eq!(
            summary(&http.conditions)[..2],
            owned(&[("Accepted", "False", "UnsupportedProtocol"), ("Programmed", "False", "Invalid")])
        );
        assert!(http.supported_kinds.is_empty());
        let conflicted = status(2, true);
        assert_eq!(summary(&conflicted.conditions)[1], owned(&[("Programmed", "False", "Invalid")])[0]);
        assert_eq!(summary(&conflicted.conditions)[3], owned(&[("Conflicted", "True", "HostnameConflict")])[0]);
    }
}

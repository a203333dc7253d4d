//! What balancer makes of each listener of a Gateway, before any route: whether it serves the
//! protocol, whether it conflicts with another listener on its port, and the kinds it admits.
//! The listener's status conditions say the same, and the proxy serves exactly the listeners
//! that are accepted and conflict with none ([`Verdict::served`]).

use super::api::gateways::GatewayListeners;
use super::attachment::{ListenerProtocol, RouteKind, allowed_kinds};

/// One listener's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `Accepted`: `Err(UnsupportedProtocol)` for HTTP, HTTPS or a protocol balancer does not
    /// know; `Err(UnsupportedValue)` for TLS in mode Terminate (the protocol is served, that
    /// mode is not). (Gateway API's reason for a protocol not served.)
    pub accepted: Result<(), &'static str>,
    /// `Conflicted`: the reason when another listener shares its port and balancer cannot tell
    /// their connections apart (`ProtocolConflict`, `HostnameConflict`).
    pub conflicted: Option<&'static str>,
    /// `ResolvedRefs`: `Err(InvalidRouteKinds)` when `allowedRoutes.kinds` lists a kind it
    /// cannot take.
    pub resolved_refs: Result<(), &'static str>,
    /// `supportedKinds`: the route kinds it admits.
    pub supported_kinds: Vec<RouteKind>,
}

impl Verdict {
    /// Whether the proxy serves the listener (its routes attach either way).
    pub fn served(&self) -> bool {
        self.accepted.is_ok() && self.conflicted.is_none()
    }
}

/// Each listener's verdict, in order.
///
/// On one port, UDP listeners are told apart from the rest by protocol, and TLS passthrough
/// listeners from each other by hostname (SNI); a TCP listener takes every connection of its
/// port, so it conflicts with any other TCP or TLS listener there (`ProtocolConflict` when the
/// protocols differ, `HostnameConflict` between two TCP listeners, which have no hostname to
/// tell them apart, and between TLS listeners of the same hostname). A listener balancer does
/// not serve conflicts with none.
pub fn verdicts(listeners: &[GatewayListeners]) -> Vec<Verdict> {
    let protocols: Vec<ListenerProtocol> = listeners.iter().map(ListenerProtocol::of).collect();
    (0..listeners.len())
        .map(|i| {
            let (supported_kinds, invalid_kinds) = allowed_kinds(&listeners[i]);
            let served = protocols[i] != ListenerProtocol::Unsupported;
            Verdict {
                accepted: match (served, listeners[i].protocol.as_str()) {
                    (true, _) => Ok(()),
                    (false, "TLS") => Err("UnsupportedValue"),
                    (false, _) => Err("UnsupportedProtocol"),
                },
                conflicted: served.then(|| conflict(listeners, &protocols, i)).flatten(),
                resolved_refs: if invalid_kinds { Err("InvalidRouteKinds") } else { Ok(()) },
                supported_kinds,
            }
        })
        .collect()
}

/// Why listener `i` cannot share its port with the others there, if it cannot.
fn conflict(listeners: &[GatewayListeners], protocols: &[ListenerProtocol], i: usize) -> Option<&'static str> {
    use ListenerProtocol::{Tcp, TlsPassthrough, Udp, Unsupported};
    let others = (0..listeners.len()).filter(|&j| j != i && listeners[j].port == listeners[i].port);
    let mut reason = None;
    for j in others {
        let found = match (protocols[i], protocols[j]) {
            (_, Unsupported) | (Unsupported, _) | (Udp, Tcp | TlsPassthrough) | (Tcp | TlsPassthrough, Udp) => None,
            (Tcp, TlsPassthrough) | (TlsPassthrough, Tcp) => Some("ProtocolConflict"),
            (Udp, Udp) | (Tcp, Tcp) => Some("HostnameConflict"),
            (TlsPassthrough, TlsPassthrough) => {
                let same = |a: &Option<String>, b: &Option<String>| match (a, b) {
                    (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
                    (None, None) => true,
                    _ => false,
                };
                same(&listeners[i].hostname, &listeners[j].hostname).then_some("HostnameConflict")
            }
        };
        // A protocol conflict says more than a hostname one.
        reason = match (reason, found) {
            (Some("ProtocolConflict"), _) | (_, None) => reason,
            (_, found) => found,
        };
    }
    reason
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn summary(value: serde_json::Value) -> Vec<(bool, Option<&'static str>)> {
        let listeners: Vec<GatewayListeners> = serde_json::from_value(value).expect("listeners");
        verdicts(&listeners).into_iter().map(|v| (v.accepted.is_ok(), v.conflicted)).collect()
    }

    #[test]
    fn listeners_that_can_be_told_apart_share_a_port() {
        let shared = summary(json!([
            {"name": "tcp", "port": 53, "protocol": "TCP"},
            {"name": "udp", "port": 53, "protocol": "UDP"},
            {"name": "a", "port": 443, "protocol": "TLS", "hostname": "a.example.com"},
            {"name": "any", "port": 443, "protocol": "TLS", "hostname": "*.example.com"},
            {"name": "rest", "port": 443, "protocol": "TLS"},
            {"name": "http", "port": 53, "protocol": "HTTP"},
        ]));
        let (ok, unsupported) = ((true, None), (false, None));
        assert_eq!(shared, [ok, ok, ok, ok, ok, unsupported]);
    }

    #[test]
    fn a_tcp_listener_takes_its_whole_port_and_names_must_differ() {
        let conflicts = summary(json!([
            {"name": "tcp", "port": 443, "protocol": "TCP"},
            {"name": "tls", "port": 443, "protocol": "TLS", "hostname": "a.example.com"},
            {"name": "tls-again", "port": 443, "protocol": "TLS", "hostname": "A.example.com"},
            {"name": "one", "port": 5432, "protocol": "TCP"},
            {"name": "two", "port": 5432, "protocol": "TCP"},
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-again", "port": 53, "protocol": "UDP"},
            {"name": "terminate", "port": 443, "protocol": "TLS", "tls": {"mode": "Terminate"}},
        ]));
        let (protocol, hostname) = ((true, Some("ProtocolConflict")), (true, Some("HostnameConflict")));
        assert_eq!(conflicts, [protocol, protocol, protocol, hostname, hostname, hostname, hostname, (false, None)]);
    }

    #[test]
    fn tls_that_terminates_is_an_unsupported_value_and_http_an_unsupported_protocol() {
        let listeners: Vec<GatewayListeners> = serde_json::from_value(json!([
            {"name": "terminate", "port": 443, "protocol": "TLS", "tls": {"mode": "Terminate"}},
            {"name": "web", "port": 80, "protocol": "HTTP"},
            {"name": "passthrough", "port": 8443, "protocol": "TLS"},
        ]))
        .expect("listeners");
        let accepted: Vec<Result<(), &str>> = verdicts(&listeners).into_iter().map(|v| v.accepted).collect();
        assert_eq!(accepted, [Err("UnsupportedValue"), Err("UnsupportedProtocol"), Ok(())]);
    }

    #[test]
    fn kinds_a_listener_cannot_take_are_flagged_and_only_the_served_kind_is_supported() {
        let listeners: Vec<GatewayListeners> = serde_json::from_value(json!([
            {"name": "tcp", "port": 1, "protocol": "TCP", "allowedRoutes": {"kinds": [{"kind": "TCPRoute"}, {"kind": "HTTPRoute"}]}},
            {"name": "udp", "port": 2, "protocol": "UDP"},
        ]))
        .expect("listeners");
        let all = verdicts(&listeners);
        assert_eq!(
            (all[0].resolved_refs, all[0].supported_kinds.clone()),
            (Err("InvalidRouteKinds"), vec![RouteKind::Tcp])
        );
        assert_eq!((all[1].resolved_refs, all[1].supported_kinds.clone()), (Ok(()), vec![RouteKind::Udp]));
        assert!(all.iter().all(Verdict::served));
    }
}

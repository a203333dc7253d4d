//! Every reason balancer writes, on a condition or an event, in one enum.
//!
//! A reason's wire name is a contract: users' alerts, scripts and `kubectl wait` match it, so
//! the test below pins each one. Kubernetes' own reasons (a refusal's `AlreadyExists`, a status
//! cause's `FieldValueInvalid`) are the API server's, and stay its strings.

use crate::runtime::events::EventReason;

/// A reason of balancer's own, by its wire name (the variant's name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString, strum::VariantArray)]
pub enum Reason {
    // `Ready`, once a reconcile got as far as the proxy.
    /// The proxy is rolled out and available.
    ProxyAvailable,
    /// The proxy is rolling out, or has too few available pods.
    ProxyNotAvailable,
    /// `spec.replicas` is 0.
    ScaledToZero,
    /// The proxy pods do not serve the current configuration yet.
    ConfigurationNotServed,
    // `Ready`, when a reconcile stopped short of the proxy (and an event for each).
    /// The spec breaks a rule.
    InvalidSpec,
    /// A child's name is taken by an object balancer does not control.
    Conflict,
    /// Any other failure of a reconcile.
    ReconcileError,
    // `BackendsAvailable`.
    /// Every backend with a weight has a ready endpoint.
    EndpointsReady,
    /// Some backend with a weight has none.
    NoReadyEndpoints,
    // `Programmed`.
    /// Every proxy pod serves the current configuration.
    Applied,
    /// Some proxy pods do not serve it yet.
    Applying,
    /// No proxy pod is running.
    NoProxyPods,
    // `GoOperatorProxy`: the takeover from the Go operator.
    /// The Go operator's proxy still serves, beside balancer's.
    Serving,
    /// The Go operator's proxy is draining.
    Draining,
    /// The Go operator's proxy is gone.
    Removed,
    /// A namesake of the Go operator's proxy that balancer does not control.
    NotControlled,
    // Events only.
    /// Children were created.
    Created,
    /// Children were updated (and none created).
    Updated,
    /// Children were deleted.
    Deleted,
    /// The Go operator's children were taken over.
    Migrated,
    /// The proxy's PodDisruptionBudget could not be written.
    DisruptionBudget,
    /// The proxy's ConfigMap held a configuration balancer did not sign for the Balancer; the
    /// proxies refused it, and balancer wrote its own back.
    ForeignConfiguration,
}

impl Reason {
    /// Every reason, in declaration order.
    pub const ALL: &'static [Reason] = <Reason as strum::VariantArray>::VARIANTS;

    /// The `Ready` reasons of a reconcile that got as far as the proxy.
    pub const PROXY_READY: [Reason; 4] =
        [Reason::ProxyAvailable, Reason::ProxyNotAvailable, Reason::ScaledToZero, Reason::ConfigurationNotServed];

    /// The reason as the status and events write it.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The reason a stored condition gives, when it is one of balancer's.
    pub fn of(written: &str) -> Option<Reason> {
        written.parse().ok()
    }
}

impl EventReason for Reason {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire names, as users' alerts and scripts match them: changing one is a breaking
    /// change, so this list changes only with a note in the changelog.
    #[test]
    fn every_reason_keeps_its_wire_name() {
        let names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            names,
            [
                "ProxyAvailable",
                "ProxyNotAvailable",
                "ScaledToZero",
                "ConfigurationNotServed",
                "InvalidSpec",
                "Conflict",
                "ReconcileError",
                "EndpointsReady",
                "NoReadyEndpoints",
                "Applied",
                "Applying",
                "NoProxyPods",
                "Serving",
                "Draining",
                "Removed",
                "NotControlled",
                "Created",
                "Updated",
                "Deleted",
                "Migrated",
                "DisruptionBudget",
                "ForeignConfiguration",
            ]
        );
        for &reason in Reason::ALL {
            assert_eq!(Reason::of(reason.as_str()), Some(reason), "{reason:?} reads back");
        }
        assert_eq!(Reason::of("FieldValueInvalid"), None, "Kubernetes' reasons are not balancer's");
    }
}

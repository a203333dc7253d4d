//! The closed sets of values that a Balancer's text fields take, as enums.
//!
//! The wire format keeps these fields as strings, so that a wrong value reaches the webhook and
//! gets the validation rule's message rather than a parse error. Validation checks each field by
//! parsing it into its enum here, and [`Admitted`](crate::spec::Admitted) hands the parsed values
//! to every builder. Each enum's wire names come from its derive, and `VARIANTS` lists them with
//! the default first.

use strum::{Display, EnumString, IntoStaticStr, VariantNames};

/// The wire name of a value, as `&'static str`.
macro_rules! wire_name {
    ($($kind:ty),*) => {$(
        impl $kind {
            /// The value as the API writes it.
            pub fn as_str(self) -> &'static str {
                self.into()
            }
        }
    )*};
}
pub(super) use wire_name;

/// `spec.ports[].protocol`: what nginx's stream module can proxy. Serde writes the same names,
/// for the proxy's model.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Display,
    EnumString,
    IntoStaticStr,
    VariantNames,
    serde::Serialize,
    serde::Deserialize,
)]
#[strum(serialize_all = "UPPERCASE")]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    /// `TCP`.
    #[default]
    Tcp,
    /// `UDP`.
    Udp,
}

/// `spec.algorithm`: how the proxy picks a backend for a new connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Display, EnumString, IntoStaticStr, VariantNames)]
pub enum Algorithm {
    /// nginx's weighted round robin.
    #[default]
    RoundRobin,
    /// nginx's `least_conn`: the backend with the fewest active connections, by weight.
    LeastConnections,
    /// nginx's `random two least_conn`: two backends at random, by weight, then the less loaded.
    PowerOfTwoChoices,
}

/// `spec.proxy.upstreams`: what the proxy sends connections to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Display, EnumString, IntoStaticStr, VariantNames)]
pub enum UpstreamKind {
    /// Each backend's ready pods, from its Service's EndpointSlices.
    #[default]
    Pods,
    /// Each backend's Service (its cluster IP), which kube-proxy spreads over its pods.
    Services,
}

/// `spec.sessionAffinity`, as a Service's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Display, EnumString, IntoStaticStr, VariantNames)]
pub enum SessionAffinity {
    /// No affinity: each connection is balanced on its own.
    #[default]
    None,
    /// Every connection from one client address goes to the same backend.
    #[strum(serialize = "ClientIP")]
    ClientIp,
}

/// `spec.service.type`: how the front Service is exposed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Display, EnumString, IntoStaticStr, VariantNames)]
pub enum ServiceType {
    /// A cluster-internal virtual IP.
    #[default]
    #[strum(serialize = "ClusterIP")]
    ClusterIp,
    /// The cluster IP, and a port on every node.
    NodePort,
    /// A node port, and a load balancer the cloud provider makes.
    LoadBalancer,
}

/// `spec.service.externalTrafficPolicy`; unset is Kubernetes' default, `Cluster`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Display, EnumString, IntoStaticStr, VariantNames)]
pub enum ExternalTrafficPolicy {
    /// Any node forwards to any proxy pod (the client's address is lost).
    #[default]
    Cluster,
    /// Only nodes with a proxy pod take traffic, and the client's address is kept.
    Local,
}

/// A condition's `status`, as Kubernetes writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, EnumString, IntoStaticStr, VariantNames)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Whether it holds is not known.
    Unknown,
}

wire_name!(Protocol, Algorithm, UpstreamKind, SessionAffinity, ServiceType, ExternalTrafficPolicy, ConditionStatus);

impl ServiceType {
    /// Whether the front Service gets node ports (NodePort and LoadBalancer do).
    pub fn has_node_ports(self) -> bool {
        self != ServiceType::ClusterIp
    }
}

impl From<bool> for ConditionStatus {
    fn from(holds: bool) -> Self {
        if holds { ConditionStatus::True } else { ConditionStatus::False }
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use strum::VariantNames;

    use super::*;

    #[test]
    fn wire_names_read_back_and_the_default_comes_first() {
        fn round_trip<T: FromStr + VariantNames + Default + Into<&'static str> + PartialEq + std::fmt::Debug>() {
            for name in T::VARIANTS {
                let value = T::from_str(name).ok();
                assert_eq!(value.map(Into::into), Some(*name));
            }
            assert_eq!(T::default().into(), T::VARIANTS[0]);
        }
        round_trip::<Protocol>();
        round_trip::<Algorithm>();
        round_trip::<SessionAffinity>();
        round_trip::<ServiceType>();
        round_trip::<ExternalTrafficPolicy>();
        assert_eq!(Protocol::VARIANTS, ["TCP", "UDP"]);
        assert_eq!(SessionAffinity::VARIANTS, ["None", "ClientIP"]);
        assert_eq!(ServiceType::VARIANTS, ["ClusterIP", "NodePort", "LoadBalancer"]);
        assert_eq!(ConditionStatus::from(true).as_str(), "True");
        assert!("tcp".parse::<Protocol>().is_err(), "wire names are case-sensitive, as the API server's enums are");
    }
}

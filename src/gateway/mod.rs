//! Gateway API (`gateway.networking.k8s.io/v1`, standard channel): the types balancer reads,
//! generated from the v1.7.0 CRDs ([`api`]); whether the cluster serves them; and the pure
//! rules of Gateway API that decide what a Gateway serves: which listeners a route attaches to
//! ([`attachment`]), which Services its backends are ([`backend_refs`]), which server names
//! meet ([`hostnames`]), which listeners are served ([`verdicts`]), the proxy's listeners they
//! make ([`listeners`]), and the status written on routes and listeners ([`status`]).

pub mod api;
pub mod assembly;
pub mod attachment;
mod availability;
pub mod backend_refs;
pub mod hostnames;
pub mod listeners;
pub mod parameters;
pub mod proxy;
pub mod routes;
pub mod status;
pub mod verdicts;

pub use availability::{GROUP_VERSION, GatewayApi, RESOURCES, availability, discover};

#[cfg(test)]
mod tests {
    use kube::Resource;

    use super::api::gateways::Gateway;
    use super::api::tcproutes::TcpRoute;

    /// The generated types read what users write: Gateway API's own TCPRoute example, weights
    /// and all, at `v1`.
    #[test]
    fn a_tcproute_and_its_gateway_read_at_v1() {
        let gateway: Gateway = serde_saphyr::from_str(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: db, namespace: apps}\n\
             spec:\n  gatewayClassName: balancer\n  listeners:\n  - {name: pg, protocol: TCP, port: 5432}\n",
        )
        .expect("a Gateway");
        assert_eq!((gateway.spec.listeners[0].protocol.as_str(), gateway.spec.listeners[0].port), ("TCP", 5432));
        let route: TcpRoute = serde_saphyr::from_str(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata: {name: pg, namespace: apps}\n\
             spec:\n  parentRefs: [{name: db, sectionName: pg}]\n  rules:\n  - backendRefs:\n    \
             - {name: pg-v1, port: 5432, weight: 90}\n    - {name: pg-v2, port: 5432, weight: 10}\n",
        )
        .expect("a TCPRoute");
        let weights: Vec<Option<i32>> = route.spec.rules[0].backend_refs.iter().map(|b| b.weight).collect();
        assert_eq!(weights, [Some(90), Some(10)]);
        assert_eq!(
            (TcpRoute::api_version(&()).as_ref(), TcpRoute::kind(&()).as_ref()),
            ("gateway.networking.k8s.io/v1", "TCPRoute")
        );
    }
}

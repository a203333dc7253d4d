//! Whether the cluster serves the Gateway API resources balancer reads. They are optional: the
//! operator runs as before without them, and says so once when its controller starts; with
//! them, the Gateway controller runs beside the Balancers'.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;
use kube::Client;

/// The group and version balancer reads, that of the standard channel since v1.6.0 (TCPRoute,
/// UDPRoute and TLSRoute included).
pub const GROUP_VERSION: &str = "gateway.networking.k8s.io/v1";

/// The resources balancer needs of [`GROUP_VERSION`], by their plural names.
pub const RESOURCES: [&str; 6] =
    ["gatewayclasses", "gateways", "tcproutes", "udproutes", "tlsroutes", "referencegrants"];

/// How long discovery may take before the operator goes on without Gateway API.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// What the cluster serves of Gateway API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayApi {
    /// Every resource of [`RESOURCES`] at [`GROUP_VERSION`].
    Served,
    /// These are not served: the CRDs are not installed, or are of a release before v1.6.0.
    Missing(Vec<&'static str>),
    /// Discovery did not answer; the error.
    Unknown(String),
}

/// Which of [`RESOURCES`] `served` (discovery's answer for [`GROUP_VERSION`]) lacks.
pub fn availability(served: &[APIResource]) -> GatewayApi {
    let missing: Vec<&'static str> =
        RESOURCES.into_iter().filter(|&wanted| !served.iter().any(|r| r.name == wanted)).collect();
    if missing.is_empty() { GatewayApi::Served } else { GatewayApi::Missing(missing) }
}

/// Asks the API server's discovery, which every authenticated client may read.
pub async fn discover(client: &Client) -> GatewayApi {
    match tokio::time::timeout(DISCOVERY_TIMEOUT, client.list_api_group_resources(GROUP_VERSION)).await {
        Ok(Ok(list)) => availability(&list.resources),
        Ok(Err(kube::Error::Api(status))) if status.code == 404 => GatewayApi::Missing(RESOURCES.to_vec()),
        Ok(Err(error)) => GatewayApi::Unknown(error.to_string()),
        Err(_) => GatewayApi::Unknown(format!("no answer within {DISCOVERY_TIMEOUT:?}")),
    }
}

impl GatewayApi {
    /// Says in the log what the operator does about it.
    pub fn log(&self) {
        match self {
            GatewayApi::Missing(missing) => tracing::info!(
                group = GROUP_VERSION,
                ?missing,
                "Gateway API is off: the cluster does not serve these resources; serving Balancers only \
                 (install the standard-channel CRDs, then restart the operator)"
            ),
            GatewayApi::Unknown(error) => tracing::warn!(
                group = GROUP_VERSION,
                %error,
                "Gateway API is off: discovery failed; serving Balancers only (restart the operator to ask again)"
            ),
            GatewayApi::Served => tracing::info!(
                group = GROUP_VERSION,
                controller = crate::gateway::status::CONTROLLER_NAME,
                "Gateway API is on: serving the Gateways of GatewayClasses whose controllerName is balancer's, \
                 and their TCPRoutes, UDPRoutes and TLSRoutes, beside Balancers"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(name: &str) -> APIResource {
        APIResource { name: name.to_string(), ..APIResource::default() }
    }

    #[test]
    fn every_resource_is_needed() {
        let all: Vec<APIResource> = RESOURCES.iter().map(|r| resource(r)).collect();
        assert_eq!(availability(&all), GatewayApi::Served);
        let before_v1_6: Vec<APIResource> =
            ["gatewayclasses", "gateways", "gateways/status", "httproutes", "referencegrants"].map(resource).into();
        assert_eq!(availability(&before_v1_6), GatewayApi::Missing(vec!["tcproutes", "udproutes", "tlsroutes"]));
        assert_eq!(availability(&[]), GatewayApi::Missing(RESOURCES.to_vec()));
    }
}

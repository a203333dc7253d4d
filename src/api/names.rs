//! The Balancer's API identity, and the names of the children it owns.

/// API group of the Balancer resource.
pub const GROUP: &str = "exposer.hliangzhao.io";
/// Kind of the Balancer resource.
pub const KIND: &str = "Balancer";

/// Suffix of every backend Service's name: `<balancer>-<backend>-backend`.
pub const BACKEND_SERVICE_SUFFIX: &str = "-backend";
/// Suffix of the proxy Deployment's name.
pub const PROXY_DEPLOYMENT_SUFFIX: &str = "-proxy";
/// Suffix of the ConfigMap holding `nginx.conf`.
pub const PROXY_CONFIGMAP_SUFFIX: &str = "-proxy-configmap";

/// Name of the Service in front of one backend's pods.
pub fn backend_service_name(balancer: &str, backend: &str) -> String {
    format!("{balancer}-{backend}{BACKEND_SERVICE_SUFFIX}")
}

/// Name of the nginx proxy Deployment.
pub fn proxy_deployment_name(balancer: &str) -> String {
    format!("{balancer}{PROXY_DEPLOYMENT_SUFFIX}")
}

/// Name of the proxy pods' ServiceAccount, and of the Role and RoleBinding that let it read
/// the proxy's ConfigMap and nothing else.
pub fn proxy_account_name(balancer: &str) -> String {
    format!("{balancer}{PROXY_DEPLOYMENT_SUFFIX}")
}

/// Name of the ConfigMap holding `nginx.conf`.
pub fn proxy_configmap_name(balancer: &str) -> String {
    format!("{balancer}{PROXY_CONFIGMAP_SUFFIX}")
}

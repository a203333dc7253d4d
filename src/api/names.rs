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

/// The longest name a Gateway's proxy is given: a Service name and a label value both hold 63
/// characters at most.
pub const MAX_GATEWAY_PROXY_NAME: usize = 63;

/// The name a Gateway's proxy (its front Service) is given, and its other children are named
/// after: `<gateway>-<gatewayclass>`, as GEP-1762 asks, when that is a DNS label of
/// [`MAX_GATEWAY_PROXY_NAME`] characters at most. Otherwise (a Gateway name of up to 253
/// characters, or with dots) its start, dots made dashes, then `-` and 8 hex digits of the hash
/// of the full name, so that long names stay distinct.
pub fn gateway_proxy_name(gateway: &str, class: &str) -> String {
    let wanted = format!("{gateway}-{class}");
    let is_label = |name: &str| {
        name.len() <= MAX_GATEWAY_PROXY_NAME
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !name.ends_with('-')
    };
    if is_label(&wanted) {
        return wanted;
    }
    let hash = crate::util::hash::sha256_hex(&wanted);
    let lowered = wanted.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' });
    let head: String = lowered.skip_while(|c| !c.is_ascii_lowercase()).take(MAX_GATEWAY_PROXY_NAME - 9).collect();
    let head = head.trim_end_matches('-');
    let head = if head.is_empty() { "gateway" } else { head };
    format!("{head}-{}", &hash[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateways_proxy_name_is_gep_1762s_or_a_dns_label_for_any_gateway_name() {
        assert_eq!(gateway_proxy_name("db", "balancer"), "db-balancer");
        let long = "a".repeat(253);
        let names = [gateway_proxy_name(&long, "balancer"), gateway_proxy_name(&format!("{long}b"), "balancer")];
        for name in &names {
            assert!(name.len() <= MAX_GATEWAY_PROXY_NAME, "{name}");
            assert!(name.starts_with("aaaa") && name.as_bytes()[name.len() - 9] == b'-', "{name}");
        }
        assert_ne!(names[0], names[1], "distinct long names stay distinct");
        let dotted = gateway_proxy_name("db.prod", "balancer");
        assert!(dotted.starts_with("db-prod-balancer-") && dotted.len() == "db-prod-balancer-".len() + 8, "{dotted}");
        let digits = gateway_proxy_name("1st", "balancer");
        assert!(digits.starts_with("st-balancer-"), "a DNS label starts with a letter: {digits}");
    }
}

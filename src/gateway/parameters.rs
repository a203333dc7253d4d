//! Where a Gateway's proxy settings come from, since a Gateway has no `spec.proxy`: the
//! `parametersRef` of the Gateway (`spec.infrastructure.parametersRef`, in its namespace) or
//! else of its GatewayClass, naming a ConfigMap whose `replicas` key holds the proxy pods'
//! count and whose `proxy` key holds, in YAML, what a Balancer's `spec.proxy` holds (image,
//! resources, placement, annotations, drain timeout), checked by the Balancer's rules under
//! the operator's policy. Pure: the caller reads the ConfigMap.

use k8s_openapi::api::core::v1::ConfigMap;

use super::api::gatewayclasses::GatewayClass;
use super::api::gateways::Gateway;
use crate::api::UpstreamKind;
use crate::api::v1beta1::ProxySpec;
use crate::spec::{SpecPolicy, validate_proxy_settings};

/// The keys of a parameters ConfigMap.
pub const REPLICAS_KEY: &str = "replicas";
/// See [`REPLICAS_KEY`].
pub const PROXY_KEY: &str = "proxy";

/// The largest `proxy` value read: more than any valid settings need.
const MAX_PROXY_BYTES: usize = 64 << 10;

/// The annotation of a Gateway's proxy Deployment that records, in JSON, the parameters it was
/// made with: what stays in force while the parameters read are refused ([`in_force`]).
pub const PARAMETERS_ANNOTATION: &str = "balancer.exposer.hliangzhao.io/parameters";

/// The proxy settings a Gateway's parameters give; none set takes the operator's defaults.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProxyParameters {
    /// The proxy pods' count.
    pub replicas: Option<i32>,
    /// The pods' settings, as a Balancer's `spec.proxy`.
    pub proxy: ProxySpec,
}

impl ProxyParameters {
    /// Where the proxy sends: the backends' pods unless the settings say their Services (read
    /// by the Balancer's rules, which refuse any other value).
    pub fn upstreams(&self) -> UpstreamKind {
        self.proxy.upstreams.as_deref().and_then(|u| u.parse().ok()).unwrap_or_default()
    }
}

/// What a Gateway's settings are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParametersSource {
    /// Nothing: the operator's defaults.
    Defaults,
    /// This ConfigMap, by namespace and name.
    ConfigMap {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A reference balancer cannot follow: the status says why.
    Unsupported(String),
}

impl ParametersSource {
    /// The ConfigMap read, as `(namespace, name)`, if it is one.
    pub fn config_map(&self) -> Option<(String, String)> {
        match self {
            ParametersSource::ConfigMap { namespace, name } => Some((namespace.clone(), name.clone())),
            _ => None,
        }
    }
}

/// Where `gateway`'s settings come from: its own `parametersRef`, else its class's.
pub fn source(gateway: &Gateway, class: Option<&GatewayClass>) -> ParametersSource {
    let namespace = gateway.metadata.namespace.clone().unwrap_or_default();
    let own = gateway.spec.infrastructure.as_ref().and_then(|i| i.parameters_ref.as_ref());
    if let Some(reference) = own {
        return config_map(&reference.group, &reference.kind, Some(namespace), &reference.name, "the Gateway's");
    }
    match class.and_then(|c| c.spec.parameters_ref.as_ref()) {
        Some(r) => config_map(&r.group, &r.kind, r.namespace.clone(), &r.name, "its GatewayClass's"),
        None => ParametersSource::Defaults,
    }
}

/// Why `class`'s own `parametersRef` cannot be followed, if it cannot (the class is then not
/// accepted, with reason `InvalidParameters`). Whether the ConfigMap exists and reads is each
/// Gateway's to say.
pub fn class_refusal(class: &GatewayClass) -> Option<String> {
    let r = class.spec.parameters_ref.as_ref()?;
    match config_map(&r.group, &r.kind, r.namespace.clone(), &r.name, "its") {
        ParametersSource::Unsupported(why) => Some(why),
        _ => None,
    }
}

fn config_map(group: &str, kind: &str, namespace: Option<String>, name: &str, whose: &str) -> ParametersSource {
    match (group, kind, namespace) {
        ("", "ConfigMap", Some(namespace)) => ParametersSource::ConfigMap { namespace, name: name.to_string() },
        ("", "ConfigMap", None) => {
            ParametersSource::Unsupported(format!("{whose} parametersRef names ConfigMap {name:?} without a namespace"))
        }
        _ => ParametersSource::Unsupported(format!(
            "{whose} parametersRef is a {kind} of group {group:?}; balancer reads a ConfigMap (group \"\")"
        )),
    }
}

/// The settings `config_map` gives, checked under `policy`; or why they are refused.
pub fn read(config_map: &ConfigMap, policy: &SpecPolicy) -> Result<ProxyParameters, String> {
    let name = config_map.metadata.name.as_deref().unwrap_or_default();
    let data = config_map.data.clone().unwrap_or_default();
    let replicas = match data.get(REPLICAS_KEY).map(|r| r.trim()) {
        None => None,
        Some(text) => Some(text.parse::<i32>().map_err(|_| {
            format!("ConfigMap {name}: {REPLICAS_KEY} must be a whole number, got {}", crate::util::echo::quoted(text))
        })?),
    };
    let proxy = match data.get(PROXY_KEY) {
        None => ProxySpec::default(),
        Some(text) if text.len() > MAX_PROXY_BYTES => {
            return Err(format!("ConfigMap {name}: {PROXY_KEY} is over {MAX_PROXY_BYTES} bytes"));
        }
        Some(text) => serde_saphyr::from_str::<Option<ProxySpec>>(text)
            .map_err(|e| {
                format!("ConfigMap {name}: {PROXY_KEY} is not a Balancer's spec.proxy: {}", first_line(&e.to_string()))
            })?
            .unwrap_or_default(),
    };
    let parameters = ProxyParameters { replicas, proxy };
    checked(parameters, policy).map_err(|errors| format!("ConfigMap {name}: {errors}"))
}

/// `parameters`, when they pass the Balancer's rules under `policy`; else the first errors.
fn checked(parameters: ProxyParameters, policy: &SpecPolicy) -> Result<ProxyParameters, String> {
    let report = validate_proxy_settings(parameters.replicas, &parameters.proxy, policy);
    if report.errors.is_empty() {
        return Ok(parameters);
    }
    let errors: Vec<String> = report.errors.iter().take(5).map(ToString::to_string).collect();
    Err(errors.join("; "))
}

/// The parameters in force, and why the ones read are refused if they are. Parameters that
/// read and pass are in force. Refused ones (invalid, missing, a reference balancer cannot
/// follow) leave the last accepted in force, as the proxy's Deployment records them (`last`,
/// its [`PARAMETERS_ANNOTATION`]), when they still pass `policy`: so that a mistake in a shared
/// parameters ConfigMap keeps every tenant's route changes applying, as Envoy Gateway and NGINX
/// Gateway Fabric keep serving on invalid proxy settings. With nothing accepted before, the
/// refusal stands.
pub fn in_force(
    read: Result<ProxyParameters, String>,
    last: Option<&str>,
    policy: &SpecPolicy,
) -> Result<(ProxyParameters, Option<String>), String> {
    let refusal = match read {
        Ok(parameters) => return Ok((parameters, None)),
        Err(refusal) => refusal,
    };
    let last = last.and_then(|text| serde_json::from_str::<ProxyParameters>(text).ok());
    match last.map(|last| checked(last, policy)) {
        Some(Ok(last)) => Ok((last, Some(refusal))),
        _ => Err(refusal),
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::spec::SchedulingPolicy;

    fn gateway(parameters: Option<serde_json::Value>) -> Gateway {
        let mut spec = json!({"gatewayClassName": "balancer", "listeners": []});
        if let Some(reference) = parameters {
            spec["infrastructure"] = json!({"parametersRef": reference});
        }
        serde_json::from_value(json!({"metadata": {"namespace": "apps", "name": "gw"}, "spec": spec}))
            .expect("a Gateway")
    }

    fn class(parameters: serde_json::Value) -> GatewayClass {
        serde_json::from_value(json!({"metadata": {"name": "balancer"},
            "spec": {"controllerName": "exposer.hliangzhao.io/balancer", "parametersRef": parameters}}))
        .expect("a GatewayClass")
    }

    fn config_map(data: serde_json::Value) -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"namespace": "apps", "name": "proxy"}, "data": data}))
            .expect("a ConfigMap")
    }

    #[test]
    fn refused_parameters_leave_the_last_accepted_in_force_while_they_still_pass() {
        let policy = SpecPolicy::default();
        let accepted = ProxyParameters { replicas: Some(3), ..ProxyParameters::default() };
        let last = serde_json::to_string(&accepted).expect("serializes");
        let refused = || Err::<ProxyParameters, String>("ConfigMap proxy: replicas must be a whole number".into());
        assert_eq!(in_force(Ok(accepted.clone()), None, &policy), Ok((accepted.clone(), None)), "read and valid");
        let kept = in_force(refused(), Some(&last), &policy).expect("the last accepted");
        assert_eq!(kept, (accepted, Some("ConfigMap proxy: replicas must be a whole number".into())));
        assert!(in_force(refused(), None, &policy).is_err(), "nothing accepted before: refused");
        assert!(in_force(refused(), Some("{not json"), &policy).is_err(), "a record that does not read");
        let image = ProxyParameters {
            proxy: ProxySpec { image: Some("evil.example.com/nginx".into()), ..ProxySpec::default() },
            ..ProxyParameters::default()
        };
        let no_longer = serde_json::to_string(&image).expect("serializes");
        assert!(in_force(refused(), Some(&no_longer), &policy).is_err(), "no longer allowed by the policy");
    }

    #[test]
    fn the_gateways_own_reference_wins_over_its_classs() {
        let own = gateway(Some(json!({"group": "", "kind": "ConfigMap", "name": "mine"})));
        let shared = class(json!({"group": "", "kind": "ConfigMap", "name": "shared", "namespace": "infra"}));
        let at = |namespace: &str, name: &str| ParametersSource::ConfigMap {
            namespace: namespace.into(),
            name: name.into(),
        };
        assert_eq!(source(&own, Some(&shared)), at("apps", "mine"));
        assert_eq!(source(&gateway(None), Some(&shared)), at("infra", "shared"));
        assert_eq!(source(&gateway(None), None), ParametersSource::Defaults);
        let other = gateway(Some(json!({"group": "example.com", "kind": "ProxyConfig", "name": "x"})));
        assert!(matches!(source(&other, None), ParametersSource::Unsupported(why) if why.contains("ProxyConfig")));
        let no_namespace = class(json!({"group": "", "kind": "ConfigMap", "name": "shared"}));
        assert!(matches!(source(&gateway(None), Some(&no_namespace)), ParametersSource::Unsupported(_)));
        assert!(class_refusal(&no_namespace).is_some());
        assert_eq!(class_refusal(&shared), None);
    }

    #[test]
    fn a_configmap_gives_replicas_and_a_balancers_proxy_settings_under_the_policy() {
        let policy = SpecPolicy::default();
        let settings = config_map(json!({"replicas": "3", "proxy": "drainTimeout: 5m\nnodeSelector: {pool: edge}\n"}));
        let given = read(&settings, &policy).expect("valid");
        assert_eq!(given.replicas, Some(3));
        assert_eq!(given.proxy.drain_timeout.as_deref(), Some("5m"));
        assert_eq!(read(&config_map(json!({})), &policy), Ok(ProxyParameters::default()));
        let image = config_map(json!({"proxy": "image: evil.example.com/nginx"}));
        assert!(read(&image, &policy).is_err_and(|e| e.contains("spec.proxy.image")), "no image unless allowed");
        let strict = SpecPolicy {
            scheduling: SchedulingPolicy { node_label_keys: Some(vec!["pool".into()]), ..SchedulingPolicy::ANY },
            ..SpecPolicy::default()
        };
        assert!(read(&settings, &strict).is_ok());
        let elsewhere = config_map(json!({"proxy": "nodeSelector: {node-role.kubernetes.io/control-plane: ''}"}));
        assert!(read(&elsewhere, &strict).is_err_and(|e| e.contains("spec.proxy.nodeSelector")));
        for bad in [json!({"replicas": "many"}), json!({"replicas": "-1"}), json!({"proxy": "[1, 2]"})] {
            assert!(read(&config_map(bad.clone()), &policy).is_err(), "{bad}");
        }
    }
}

//! The Balancer admission rules, as pure functions.
//!
//! Every violation is collected (never just the first), each as
//! `<field path>: <problem>`, the way the API server reports field errors.
//! Rules see the object *after* defaulting, as the validating webhook does.

mod backends;
mod canary;
mod exposure;
mod fields;
mod ports;
mod scheduling;

pub use exposure::unchangeable;
pub use scheduling::ANY_TAINT;

use backends::validate_backends;
pub use canary::read_canary;
use exposure::{validate_proxy, validate_service};
use fields::{one_of, validate_selector};
use ports::validate_ports;

use super::policy::SpecPolicy;
use super::report::{ObjectName, Report};
use crate::api::formats::{MAX_BALANCER_NAME_LEN, MAX_LABEL_LEN, is_dns1035_label};
use crate::api::v1beta1::ProxySpec;
use crate::api::{Algorithm, BalancerSpec, MAX_REPLICAS, SessionAffinity};
use crate::util::echo::quoted;

/// Checks proxy settings given apart from a Balancer (a Gateway's parameters: the proxy pods'
/// count and a Balancer's `spec.proxy`) by the rules a Balancer's own would meet, under
/// `policy`; the errors name the Balancer's fields.
pub fn validate_proxy_settings(replicas: Option<i32>, proxy: &ProxySpec, policy: &SpecPolicy) -> Report {
    let mut report = Report::default();
    validate_proxy(Some(proxy), policy, &mut report);
    validate_replicas(replicas, &mut report);
    report
}

/// Checks a Balancer (already defaulted) against every rule; `policy` says which proxy
/// images it may choose.
pub fn validate(name: ObjectName<'_>, spec: &BalancerSpec, policy: &SpecPolicy) -> Report {
    let mut report = Report::default();
    validate_proxy(spec.proxy.as_ref(), policy, &mut report);
    validate_name(name, &mut report);
    validate_replicas(spec.replicas, &mut report);
    validate_session_affinity(spec.session_affinity.as_deref(), &mut report);
    validate_algorithm(spec, &mut report);
    validate_ports(spec, &mut report);
    validate_service(spec, &mut report);
    validate_selector(&"spec.selector", spec.selector.as_ref(), &mut report);
    validate_backends(name, spec, &mut report);
    if let Some(canary) = &spec.canary {
        read_canary(canary, spec, &mut report);
    }
    report
}

fn validate_replicas(replicas: Option<i32>, report: &mut Report) {
    if let Some(n) = replicas.filter(|n| !(0..=MAX_REPLICAS).contains(n)) {
        report.error("spec.replicas", format!("must be between 0 and {MAX_REPLICAS}, got {n}"));
    }
}

fn validate_session_affinity(affinity: Option<&str>, report: &mut Report) {
    if let Some(affinity) = affinity {
        one_of::<SessionAffinity>("spec.sessionAffinity", affinity, report);
    }
}

/// nginx takes one balancing method per upstream: ClientIP affinity is itself one (a hash), and
/// nginx would keep the last one written, with only a warning.
fn validate_algorithm(spec: &BalancerSpec, report: &mut Report) {
    let Some(algorithm) = spec.algorithm.as_deref() else { return };
    let Some(read) = one_of::<Algorithm>("spec.algorithm", algorithm, report) else { return };
    let client_ip = spec.session_affinity.as_deref() == Some(SessionAffinity::ClientIp.as_str());
    if read != Algorithm::RoundRobin && client_ip {
        report.error(
            "spec.algorithm",
            format!(
                "must be RoundRobin with sessionAffinity ClientIP, which picks the backend by a hash of \
                 the client's address, got {}",
                quoted(algorithm)
            ),
        );
    }
}

fn validate_name(name: ObjectName<'_>, report: &mut Report) {
    let (field, shown) = match name {
        ObjectName::Name(n) => ("metadata.name", n),
        ObjectName::GenerateName(p) => ("metadata.generateName", p),
        ObjectName::Unknown => return,
    };
    // The name is the front-end Service's name, which must be a DNS-1035 label;
    // a generateName prefix may end in '-' because a suffix follows it.
    let candidate = match name {
        ObjectName::GenerateName(p) => format!("{p}x"),
        _ => shown.to_string(),
    };
    if !is_dns1035_label(&candidate) {
        report.error(
            field,
            format!(
                "must be a DNS-1035 label because it names the front-end Service \
                 (lowercase letters, digits and '-', starting with a letter and ending with a letter or digit), got {}",
                quoted(shown)
            ),
        );
    }
    if let Some(len) = name.len().filter(|&l| l > MAX_BALANCER_NAME_LEN) {
        report.error(
            field,
            format!(
                "must be at most {MAX_BALANCER_NAME_LEN} characters so that child names \
                 (\"<name>-<backend>-backend\") fit in {MAX_LABEL_LEN}, got {len}"
            ),
        );
    }
}

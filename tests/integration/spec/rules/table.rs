//! The table runner: the sample Balancer each row mutates, the expected messages spelled out,
//! and the run that states each row's complete report.

use std::collections::BTreeMap;

use balancer::api::{BackendSpec, BalancerPort, BalancerSpec};
use balancer::spec::{ObjectName, Report, validate};
use balancer::spec::{SchedulingPolicy, SpecPolicy};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::support::fixtures;

/// What the validating webhook sees: the name fields and the (defaulted) spec.
#[derive(Clone, Debug)]
pub(super) struct Subject {
    pub(super) name: Option<String>,
    pub(super) generate_name: Option<String>,
    pub(super) spec: BalancerSpec,
    /// The operator's `--allowed-proxy-images`.
    pub(super) allowed_images: Vec<String>,
    /// The operator's scheduling policy (`--allowed-priority-classes` and the like).
    pub(super) scheduling: SchedulingPolicy,
}

impl Subject {
    pub(super) fn report(&self) -> Report {
        let policy = SpecPolicy {
            replicas: 1,
            allowed_images: self.allowed_images.clone(),
            scheduling: self.scheduling.clone(),
        };
        validate(ObjectName::from_meta(self.name.as_deref(), self.generate_name.as_deref()), &self.spec, &policy)
    }
}

pub(super) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

pub(super) fn port(name: Option<&str>, protocol: Option<&str>, port: i32, target: Option<IntOrString>) -> BalancerPort {
    BalancerPort {
        name: name.map(str::to_string),
        protocol: protocol.map(str::to_string),
        port,
        target_port: target,
        ..Default::default()
    }
}

/// A named port with an explicit protocol and no targetPort.
pub(super) fn named(name: &str, protocol: &str, number: i32) -> BalancerPort {
    port(Some(name), Some(protocol), number, None)
}

pub(super) fn backend(name: &str, weight: Option<i32>, selector: Option<&[(&str, &str)]>) -> BackendSpec {
    BackendSpec { name: name.to_string(), weight, selector: selector.map(labels), ..Default::default() }
}

/// deploy/samples/balancer.yaml, as the mutating webhook leaves `replicas`: valid, without warnings.
pub(super) fn sample() -> Subject {
    Subject {
        name: Some(fixtures::SAMPLE.into()),
        generate_name: None,
        allowed_images: Vec::new(),
        scheduling: SchedulingPolicy::ANY,
        spec: BalancerSpec { replicas: Some(1), ..fixtures::sample_spec() },
    }
}

pub(super) fn not_dns1035(field: &str, got: &str) -> String {
    format!(
        "{field}: must be a DNS-1035 label because it names the front-end Service (lowercase letters, digits \
         and '-', starting with a letter and ending with a letter or digit), got \"{got}\""
    )
}

pub(super) fn name_too_long(field: &str, len: usize) -> String {
    format!(
        "{field}: must be at most 53 characters so that child names (\"<name>-<backend>-backend\") fit in 63, \
         got {len}"
    )
}

pub(super) fn not_dns1123(field: &str, got: &str) -> String {
    format!(
        "{field}: must be a DNS-1123 label (at most 63 lowercase letters, digits and '-', starting and ending \
         with a letter or digit), got \"{got}\""
    )
}

pub(super) fn not_iana(field: &str, got: &str) -> String {
    format!(
        "{field}: must be a port number or an IANA service name (at most 15 lowercase letters, digits and '-', \
         with at least one letter), got \"{got}\""
    )
}

pub(super) fn derived_too_long(index: usize, balancer: &str, backend: &str) -> String {
    let service = format!("{balancer}-{backend}-backend");
    format!(
        "spec.backends[{index}].name: the derived Service name \"{service}\" must be at most 63 characters, got {}",
        service.len()
    )
}

pub(super) fn empty_merged_selector(index: usize) -> String {
    format!(
        "spec.backends[{index}].selector: the merged selector (spec.selector and this backend's selector) must \
         not be empty, or the backend would select every pod in the namespace"
    )
}

pub(super) fn drains(index: usize, name: &str) -> String {
    format!("spec.backends[{index}].weight: weight 0 drains backend \"{name}\": it receives no traffic")
}

pub(super) fn same_pods(index: usize, first: usize) -> String {
    format!(
        "spec.backends[{index}].selector: selects the same pods as spec.backends[{first}], so both backends share them"
    )
}

pub(super) const NAME_PART_RULE: &str =
    "at most 63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character";

pub(super) const PREFIX_PROBLEM: &str = "the prefix must be a DNS-1123 subdomain of at most 253 characters";

pub(super) fn bad_key_name(at: &str, key: &str) -> String {
    format!("{at}: invalid label key \"{key}\": the name must be {NAME_PART_RULE}")
}

pub(super) fn bad_key_prefix(at: &str, key: &str) -> String {
    format!("{at}: invalid label key \"{key}\": {PREFIX_PROBLEM}")
}

pub(super) fn bad_value(at: &str, key: &str, value: &str) -> String {
    format!("{at}[{key}]: invalid label value \"{value}\": must be empty or {NAME_PART_RULE}")
}

/// A DNS-1123 subdomain of exactly `len` characters (labels of at most 63).
pub(super) fn subdomain(len: usize) -> String {
    let mut out = String::new();
    while out.len() < len {
        if !out.is_empty() {
            out.push('.');
        }
        let take = (len - out.len()).min(63);
        out.push_str(&"a".repeat(take));
    }
    // Never end on the dot: the loop only pushes a dot when more characters follow.
    assert_eq!(out.len(), len);
    out
}

pub(super) struct Case {
    pub(super) what: &'static str,
    pub(super) mutate: fn(&mut Subject),
    pub(super) errors: Vec<String>,
    pub(super) warnings: Vec<String>,
}

pub(super) fn case(what: &'static str, mutate: fn(&mut Subject), errors: Vec<String>, warnings: Vec<String>) -> Case {
    Case { what, mutate, errors, warnings }
}

macro_rules! strings {
    ($($e:expr),* $(,)?) => { vec![$(String::from($e)),*] };
}
pub(super) use strings;

pub(super) fn run(cases: Vec<Case>) {
    assert!(!cases.is_empty(), "an empty table tests nothing");
    let total = cases.len();
    let mut failures = Vec::new();
    for c in cases {
        let mut subject = sample();
        (c.mutate)(&mut subject);
        let report = subject.report();
        let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
        assert_eq!(report.is_valid(), errors.is_empty(), "{}: is_valid disagrees with errors", c.what);
        if errors != c.errors || report.warnings != c.warnings {
            failures.push(format!(
                "case {:?}\n  expected errors:   {:#?}\n  actual errors:     {:#?}\n  expected warnings: {:#?}\n  actual warnings:   {:#?}",
                c.what, c.errors, errors, c.warnings, report.warnings
            ));
        }
    }
    assert!(failures.is_empty(), "{} of {total} cases failed:\n{}", failures.len(), failures.join("\n"));
}

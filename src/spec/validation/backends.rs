//! `spec.backends`: names, weights, selectors and passive health.

use std::collections::BTreeMap;

use super::fields::*;
use crate::api::formats::{MAX_LABEL_LEN, is_dns1123_label};
use crate::api::{
    self, Algorithm, BackendSpec, BalancerSpec, MAX_BACKENDS, MAX_MAX_CONNECTIONS, MAX_MAX_FAILS, MAX_SELECTOR_LABELS,
    MAX_WEIGHT, SessionAffinity,
};
use crate::spec::report::{ObjectName, Report};
use crate::util::echo::{MAX_QUOTED_BYTES, cut, quoted};

pub(super) fn validate_backends(name: ObjectName<'_>, spec: &BalancerSpec, report: &mut Report) {
    let backends = &spec.backends;
    if backends.is_empty() {
        report.error("spec.backends", "must have at least one backend");
    }
    if backends.len() > MAX_BACKENDS {
        report.error("spec.backends", format!("must have at most {MAX_BACKENDS} backends, got {}", backends.len()));
        return;
    }
    // Merged selectors are only compared when every selector is within bounds.
    let selectors_bounded = selector_len(spec.selector.as_ref()) <= MAX_SELECTOR_LABELS
        && backends.iter().all(|b| selector_len(b.selector.as_ref()) <= MAX_SELECTOR_LABELS);
    let mut names: Vec<(&str, usize)> = Vec::with_capacity(backends.len());
    // Merged selectors seen so far, with a fingerprint so that most comparisons are one integer.
    let mut selectors: Vec<(usize, u64, BTreeMap<&str, &str>)> = Vec::with_capacity(backends.len());
    for (i, backend) in backends.iter().enumerate() {
        let at = Item("backends", i);
        if !is_dns1123_label(&backend.name) {
            report.error(format!("{at}.name"), dns1123_label_problem(&backend.name));
        }
        if let Some(first) = first_seen(&mut names, backend.name.as_str(), i) {
            report.error(
                format!("{at}.name"),
                format!("duplicate backend name {} (also spec.backends[{first}].name)", quoted(&backend.name)),
            );
        }
        if let Some(len) = name.len() {
            let service_len = len + 1 + backend.name.len() + api::BACKEND_SERVICE_SUFFIX.len();
            if service_len > MAX_LABEL_LEN {
                // Only its start is shown: the name can be as long as a client makes it.
                let service = api::backend_service_name(&cut(&name.display(), MAX_QUOTED_BYTES), &backend.name);
                report.error(
                    format!("{at}.name"),
                    format!(
                        "the derived Service name {} must be at most {MAX_LABEL_LEN} characters, got {service_len}",
                        quoted(&service)
                    ),
                );
            }
        }
        let weight = backend.effective_weight();
        if !(0..=MAX_WEIGHT).contains(&weight) {
            report.error(format!("{at}.weight"), format!("must be between 0 and {MAX_WEIGHT}, got {weight}"));
        } else if weight == 0 {
            report.warnings.push(format!(
                "{at}.weight: weight 0 drains backend {}: it receives no traffic",
                quoted(&backend.name)
            ));
        }
        if let Some(n) = backend.max_fails.filter(|n| !(0..=MAX_MAX_FAILS).contains(n)) {
            report.error(format!("{at}.maxFails"), format!("must be between 0 and {MAX_MAX_FAILS}, got {n}"));
        }
        validate_duration(&format_args!("{at}.failTimeout"), backend.fail_timeout.as_deref(), FAIL_TIMEOUT, report);
        if let Some(n) = backend.max_connections.filter(|n| !(1..=MAX_MAX_CONNECTIONS).contains(n)) {
            report
                .error(format!("{at}.maxConnections"), format!("must be between 1 and {MAX_MAX_CONNECTIONS}, got {n}"));
        }
        validate_backup(at, backend, spec, report);
        validate_selector(&format_args!("{at}.selector"), backend.selector.as_ref(), report);
        if !selectors_bounded {
            continue;
        }
        let merged = spec.merged_selector_refs(backend);
        if merged.is_empty() {
            report.error(
                format!("{at}.selector"),
                "the merged selector (spec.selector and this backend's selector) must not be empty, \
                 or the backend would select every pod in the namespace",
            );
            continue;
        }
        let fingerprint = fingerprint(&merged);
        if let Some((first, _, _)) = selectors.iter().find(|(_, f, s)| *f == fingerprint && *s == merged) {
            report.warnings.push(format!(
                "{at}.selector: selects the same pods as spec.backends[{first}], so both backends share them"
            ));
        }
        selectors.push((i, fingerprint, merged));
    }
    if !backends.is_empty() && backends.iter().all(BackendSpec::is_backup) {
        report.error(
            "spec.backends",
            "at least one backend must not be a backup: backups take connections only when another backend cannot",
        );
    }
    let weights_valid = backends.iter().all(|b| (0..=MAX_WEIGHT).contains(&b.effective_weight()));
    if !backends.is_empty() && weights_valid && backends.iter().all(|b| b.effective_weight() == 0) {
        report.error("spec.backends", "the sum of weights must be greater than 0, got 0");
    }
}

/// nginx's hash (ClientIP affinity) and random methods cannot fall back to a backup server.
fn validate_backup(at: Item, backend: &BackendSpec, spec: &BalancerSpec, report: &mut Report) {
    if !backend.is_backup() {
        return;
    }
    let affinity = spec.session_affinity.as_deref().and_then(|a| a.parse().ok());
    let algorithm = spec.algorithm.as_deref().and_then(|a| a.parse().ok());
    let refused_by = match (affinity, algorithm) {
        (Some(SessionAffinity::ClientIp), _) => "sessionAffinity ClientIP",
        (_, Some(Algorithm::PowerOfTwoChoices)) => "algorithm PowerOfTwoChoices",
        _ => return,
    };
    report
        .error(format!("{at}.backup"), format!("cannot be used with {refused_by}, which has no fallback to a backup"));
}

//! Rules shared by several fields: selectors, annotations, durations, target ports, and how a
//! list item is named in a message.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::api::formats::{MAX_IANA_SVC_NAME_LEN, MAX_LABEL_LEN, check_label_key, check_label_value, is_iana_svc_name};
use crate::api::{self, MAX_ANNOTATION_VALUE_LEN, MAX_ANNOTATIONS_BYTES, MAX_SELECTOR_LABELS, MAX_SERVICE_ANNOTATIONS};
use crate::spec::report::Report;
use crate::util::echo::{MAX_QUOTED_BYTES, cut, quoted};

/// `spec.<list>[<index>]`, formatted only when a message needs it.
#[derive(Clone, Copy)]
pub(super) struct Item(pub(super) &'static str, pub(super) usize);

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spec.{}[{}]", self.0, self.1)
    }
}

/// Reads `value` as one of `T`'s wire names, or refuses it at `field` with the list of them.
pub(super) fn one_of<T: FromStr + strum::VariantNames>(
    field: impl fmt::Display,
    value: &str,
    report: &mut Report,
) -> Option<T> {
    let read = value.parse().ok();
    if read.is_none() {
        report.error(field.to_string(), format!("must be {}, got {}", listed(T::VARIANTS), quoted(value)));
    }
    read
}

/// `A, B or C`.
fn listed(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [only] => (*only).to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// Records `key` at `index`; returns where it was first seen if this is a repeat.
/// (A scan: the lists are at most 64 long, where hashing costs more than it saves.)
pub(super) fn first_seen<K: PartialEq>(seen: &mut Vec<(K, usize)>, key: K, index: usize) -> Option<usize> {
    if let Some((_, first)) = seen.iter().find(|(k, _)| *k == key) {
        return Some(*first);
    }
    seen.push((key, index));
    None
}

pub(super) fn fingerprint(selector: &BTreeMap<&str, &str>) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    selector.hash(&mut hasher);
    hasher.finish()
}

pub(super) fn selector_len(selector: Option<&BTreeMap<String, String>>) -> usize {
    selector.map_or(0, BTreeMap::len)
}

pub(super) fn validate_selector(
    at: &dyn fmt::Display,
    selector: Option<&BTreeMap<String, String>>,
    report: &mut Report,
) {
    let len = selector_len(selector);
    if len > MAX_SELECTOR_LABELS {
        report.error(at.to_string(), format!("must have at most {MAX_SELECTOR_LABELS} labels, got {len}"));
        return;
    }
    for (key, value) in selector.into_iter().flatten() {
        if let Err(problem) = check_label_key(key) {
            report.error(at.to_string(), format!("invalid label key {}: {problem}", quoted(key)));
        }
        if let Err(problem) = check_label_value(value) {
            report.error(
                format!("{at}[{}]", cut(key, MAX_QUOTED_BYTES)),
                format!("invalid label value {}: {problem}", quoted(value)),
            );
        }
    }
}

pub(super) fn validate_annotations(at: &str, annotations: Option<&BTreeMap<String, String>>, report: &mut Report) {
    let len = annotations.map_or(0, BTreeMap::len);
    if len > MAX_SERVICE_ANNOTATIONS {
        report.error(at, format!("must have at most {MAX_SERVICE_ANNOTATIONS} annotations, got {len}"));
        return;
    }
    let total: usize = annotations.into_iter().flatten().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_ANNOTATIONS_BYTES {
        report
            .error(at, format!("must be at most {MAX_ANNOTATIONS_BYTES} bytes in all (keys and values), got {total}"));
    }
    for (key, value) in annotations.into_iter().flatten() {
        if let Err(problem) = check_label_key(key) {
            report.error(at, format!("invalid annotation key {}: {problem}", quoted(key)));
        }
        if value.len() > MAX_ANNOTATION_VALUE_LEN {
            report.error(
                format!("{at}[{}]", cut(key, MAX_QUOTED_BYTES)),
                format!("must be at most {MAX_ANNOTATION_VALUE_LEN} bytes, got {}", value.len()),
            );
        }
    }
}

/// Bounds of a duration field, in milliseconds, with how they are written in messages.
pub(super) struct DurationBounds {
    pub(super) min: (u64, &'static str),
    pub(super) max: (u64, &'static str),
}

pub(super) const CONNECT_TIMEOUT: DurationBounds = DurationBounds { min: (100, "100ms"), max: (300_000, "5m") };

pub(super) const IDLE_TIMEOUT: DurationBounds = DurationBounds { min: (1_000, "1s"), max: (86_400_000, "24h") };

pub(super) const DRAIN_TIMEOUT: DurationBounds = DurationBounds { min: (1_000, "1s"), max: (86_400_000, "24h") };
pub(super) const FAIL_TIMEOUT: DurationBounds = DurationBounds { min: (1_000, "1s"), max: (3_600_000, "1h") };

pub(super) fn validate_duration(
    field: &dyn fmt::Display,
    value: Option<&str>,
    bounds: DurationBounds,
    report: &mut Report,
) {
    let Some(text) = value else { return };
    let (min, max) = (bounds.min, bounds.max);
    match api::duration_millis(text) {
        None => report.error(
            field.to_string(),
            format!("must be a number and a unit (ms, s, m or h), such as 5s, got {}", quoted(text)),
        ),
        Some(ms) if ms < min.0 || ms > max.0 => {
            report.error(field.to_string(), format!("must be between {} and {}, got {}", min.1, max.1, quoted(text)))
        }
        Some(_) => {}
    }
}

pub(super) fn validate_target_port(at: Item, target: Option<&IntOrString>, report: &mut Report) {
    match target {
        Some(IntOrString::Int(n)) if !(1..=65535).contains(n) => {
            report.error(format!("{at}.targetPort"), format!("must be between 1 and 65535, got {n}"));
        }
        Some(IntOrString::String(s)) if !is_iana_svc_name(s) => {
            report.error(
                format!("{at}.targetPort"),
                format!(
                    "must be a port number or an IANA service name (at most {MAX_IANA_SVC_NAME_LEN} \
                     lowercase letters, digits and '-', with at least one letter), got {}",
                    quoted(s)
                ),
            );
        }
        _ => {}
    }
}

pub(super) fn dns1123_label_problem(name: &str) -> String {
    format!(
        "must be a DNS-1123 label (at most {MAX_LABEL_LEN} lowercase letters, digits and '-', \
         starting and ending with a letter or digit), got {}",
        quoted(name)
    )
}

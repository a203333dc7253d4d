//! Kubernetes' own formats and limits for names, labels and ports, as the API server checks them.

use super::BACKEND_SERVICE_SUFFIX;

/// Longest DNS-1123 / DNS-1035 label, and so longest Service name.
pub const MAX_LABEL_LEN: usize = 63;

/// Longest DNS-1123 subdomain.
pub const MAX_SUBDOMAIN_LEN: usize = 253;

/// Longest IANA service name (a named `targetPort`).
pub const MAX_IANA_SVC_NAME_LEN: usize = 15;

/// Longest Balancer name: the shortest backend Service name `<name>-x-backend` must fit 63 characters.
pub const MAX_BALANCER_NAME_LEN: usize = MAX_LABEL_LEN - 2 - BACKEND_SERVICE_SUFFIX.len();

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL_LEN
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
}

/// `[a-z]([-a-z0-9]*[a-z0-9])?`, at most 63 characters: what Service names must be.
pub fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// Dot-separated DNS-1123 labels, at most 253 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SUBDOMAIN_LEN && s.split('.').all(is_dns1123_label)
}

/// Gateway API's `Hostname`: a DNS-1123 subdomain, or one whose first label is `*` (a wildcard
/// for one or more labels), at most 253 characters. What a TLS listener routes by.
pub fn is_hostname(s: &str) -> bool {
    s.len() <= MAX_SUBDOMAIN_LEN && is_dns1123_subdomain(s.strip_prefix("*.").unwrap_or(s))
}

/// An IANA service name as Kubernetes accepts it for a named port.
pub fn is_iana_svc_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_IANA_SVC_NAME_LEN
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        && b.iter().any(|c| c.is_ascii_lowercase())
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !s.contains("--")
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, at most 63 characters: a label name or value.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_alphanumeric();
    !b.is_empty()
        && b.len() <= MAX_LABEL_LEN
        && alnum(b[0])
        && alnum(b[b.len() - 1])
        && b.iter().all(|&c| alnum(c) || matches!(c, b'-' | b'_' | b'.'))
}

const NAME_PART_RULE: &str = "at most 63 alphanumeric characters, '-', '_' or '.', \
                              starting and ending with an alphanumeric character";

/// A label key: an optional DNS-1123 subdomain prefix and '/', then a name.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns1123_subdomain(prefix)
    {
        return Err(format!("the prefix must be a DNS-1123 subdomain of at most {MAX_SUBDOMAIN_LEN} characters"));
    }
    if !is_qualified_name_part(name) {
        return Err(format!("the name must be {NAME_PART_RULE}"));
    }
    Ok(())
}

/// A label value: empty, or a name part.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_qualified_name_part(value) {
        Ok(())
    } else {
        Err(format!("must be empty or {NAME_PART_RULE}"))
    }
}

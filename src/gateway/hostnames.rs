//! Gateway API's hostname matching, for TLS listeners and TLSRoutes: an exact name, or a
//! wildcard `*.example.com` that covers one label or more before `example.com` (not
//! `example.com` itself). Names are compared without regard to case.

/// Whether some name is covered by both `a` and `b`: a route's hostname and a listener's.
pub fn intersect(a: &str, b: &str) -> bool {
    narrower(a, b).is_some()
}

/// The names covered by both `a` and `b`, as one of them: the narrower; `None` when no name is
/// covered by both. This is what a TLS listener routes by for the route.
pub fn narrower<'a>(a: &'a str, b: &'a str) -> Option<&'a str> {
    match (wildcard_suffix(a), wildcard_suffix(b)) {
        (None, None) => a.eq_ignore_ascii_case(b).then_some(a),
        (Some(suffix), None) => covers(suffix, b).then_some(b),
        (None, Some(suffix)) => covers(suffix, a).then_some(a),
        // `*.x.example.com` within `*.example.com`: the longer suffix is the narrower.
        (Some(sa), Some(sb)) if sa.len() >= sb.len() => (sa.eq_ignore_ascii_case(sb) || covers(sb, sa)).then_some(a),
        (Some(sa), Some(_)) => covers(sa, wildcard_suffix(b).unwrap_or_default()).then_some(b),
    }
}

/// `example.com` of `*.example.com`; `None` for an exact name.
fn wildcard_suffix(hostname: &str) -> Option<&str> {
    hostname.strip_prefix("*.")
}

/// Whether wildcard `*.{suffix}` covers exact `name`: one label or more before the suffix.
fn covers(suffix: &str, name: &str) -> bool {
    let (name, suffix) = (name.as_bytes(), suffix.as_bytes());
    name.len() > suffix.len() + 1
        && name[name.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
        && name[name.len() - suffix.len() - 1] == b'.'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_names_and_wildcards_meet_as_gateway_api_says() {
        for (a, b, both) in [
            ("db.example.com", "db.example.com", Some("db.example.com")),
            ("DB.example.com", "db.example.com", Some("DB.example.com")),
            ("db.example.com", "web.example.com", None),
            ("*.example.com", "db.example.com", Some("db.example.com")),
            ("*.example.com", "a.b.example.com", Some("a.b.example.com")),
            ("*.example.com", "example.com", None),
            ("*.example.com", "badexample.com", None),
            ("example.com", "*.example.com", None),
            ("db.example.com", "*.example.com", Some("db.example.com")),
            ("*.example.com", "*.example.com", Some("*.example.com")),
            ("*.a.example.com", "*.example.com", Some("*.a.example.com")),
            ("*.example.com", "*.a.example.com", Some("*.a.example.com")),
            ("*.a.example.com", "*.b.example.com", None),
            ("*.example.com", "*.example.org", None),
        ] {
            assert_eq!(narrower(a, b), both, "{a} and {b}");
            assert_eq!(intersect(b, a), both.is_some(), "{b} and {a}");
        }
    }
}

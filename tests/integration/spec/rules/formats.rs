//! Kubernetes' name and label formats, and the object name read from metadata.

use balancer::api::formats::{
    check_label_key, check_label_value, is_dns1035_label, is_dns1123_label, is_dns1123_subdomain, is_iana_svc_name,
};
use balancer::spec::ObjectName;

use super::table::{NAME_PART_RULE, PREFIX_PROBLEM, subdomain};

fn check_predicate(what: &str, predicate: fn(&str) -> bool, accepted: &[&str], rejected: &[&str]) {
    for s in accepted {
        assert!(predicate(s), "{what} should accept {s:?}");
    }
    for s in rejected {
        assert!(!predicate(s), "{what} should reject {s:?}");
    }
}

#[test]
fn dns1123_labels() {
    let max = "a".repeat(63);
    let too_long = "a".repeat(64);
    check_predicate(
        "is_dns1123_label",
        is_dns1123_label,
        &["a", "0", "a0", "0a", "a-b", "a--b", "abc-123", &max],
        &["", "-", "-a", "a-", "A", "aB", "a_b", "a.b", "a b", "a\n", "é", "aé", &too_long],
    );
}

#[test]
fn dns1035_labels() {
    let max = "a".repeat(63);
    check_predicate(
        "is_dns1035_label",
        is_dns1035_label,
        &["a", "a0", "a-b", &max],
        &["", "0", "0a", "-a", "a-", "A", &"a".repeat(64)],
    );
}

#[test]
fn dns1123_subdomains() {
    let max = subdomain(253);
    let too_long = subdomain(254);
    check_predicate(
        "is_dns1123_subdomain",
        is_dns1123_subdomain,
        &["a", "example.com", "a.b.c", "0.1", &max],
        &["", ".", "a.", ".a", "a..b", "Example.com", "a_b.com", "-a.com", &too_long],
    );
}

#[test]
fn iana_service_names() {
    let max = "a".repeat(15);
    let too_long = "a".repeat(16);
    check_predicate(
        "is_iana_svc_name",
        is_iana_svc_name,
        &["a", "http", "h2c", "1a", "a1", "a-b", "1-a", "web-8080", &max],
        &[
            "",
            "-",
            "1",
            "8080",
            "1-2",
            "-http",
            "http-",
            "http--alt",
            "HTTP",
            "Http",
            "a_b",
            "a.b",
            "a b",
            "é",
            &too_long,
        ],
    );
}

#[test]
fn label_keys() {
    let max_name = format!("A{}Z", "b".repeat(61));
    let max_prefix_key = format!("{}/app", subdomain(253));
    for key in [
        "app",
        "App",
        "a",
        "0",
        "a.b_c-d",
        "example.com/app",
        "a/b",
        "k8s.io/Name",
        max_name.as_str(),
        max_prefix_key.as_str(),
    ] {
        assert_eq!(check_label_key(key), Ok(()), "{key:?}");
    }
    let name_problem = format!("the name must be {NAME_PART_RULE}");
    let long_name = "a".repeat(64);
    let prefixed_long_name = format!("example.com/{long_name}");
    for key in [
        "",
        "-app",
        "app-",
        "_app",
        ".app",
        "a b",
        "é",
        "example.com/",
        "a/b/c",
        long_name.as_str(),
        prefixed_long_name.as_str(),
    ] {
        assert_eq!(check_label_key(key), Err(name_problem.clone()), "{key:?}");
    }
    let long_prefix_key = format!("{}/app", subdomain(254));
    for key in [
        "/app",
        "Example.com/app",
        "ex_ample.com/app",
        "example..com/app",
        ".example.com/app",
        "-example.com/app",
        long_prefix_key.as_str(),
    ] {
        assert_eq!(check_label_key(key), Err(PREFIX_PROBLEM.to_string()), "{key:?}");
    }
}

#[test]
fn label_values() {
    let max = "a".repeat(63);
    for value in ["", "a", "0", "A-b_c.d", "v1.2.3", max.as_str()] {
        assert_eq!(check_label_value(value), Ok(()), "{value:?}");
    }
    let problem = format!("must be empty or {NAME_PART_RULE}");
    let too_long = "a".repeat(64);
    for value in ["-a", "a-", ".a", "a_", "a b", "a/b", "é", " ", too_long.as_str()] {
        assert_eq!(check_label_value(value), Err(problem.clone()), "{value:?}");
    }
}

#[test]
fn object_name_from_meta() {
    assert!(matches!(ObjectName::from_meta(Some("a"), Some("b-")), ObjectName::Name("a")));
    assert!(matches!(ObjectName::from_meta(Some("a"), None), ObjectName::Name("a")));
    assert!(matches!(ObjectName::from_meta(Some(""), Some("b-")), ObjectName::GenerateName("b-")));
    assert!(matches!(ObjectName::from_meta(None, Some("b-")), ObjectName::GenerateName("b-")));
    assert!(matches!(ObjectName::from_meta(Some(""), Some("")), ObjectName::Unknown));
    assert!(matches!(ObjectName::from_meta(None, None), ObjectName::Unknown));
}

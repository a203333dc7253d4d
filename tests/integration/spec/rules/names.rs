//! The Balancer's name and `generateName`, and the Service names derived from them.

use balancer::spec::Report;

use super::table::{case, derived_too_long, name_too_long, not_dns1035, run, sample, strings};

#[test]
fn the_sample_is_valid_without_warnings() {
    let report = sample().report();
    assert_eq!(report, Report::default());
    assert!(report.is_valid());
}

#[test]
fn metadata_name_rules() {
    run(vec![
        case(
            "name starting with a digit",
            |s| s.name = Some("1balancer".into()),
            strings![not_dns1035("metadata.name", "1balancer")],
            vec![],
        ),
        case(
            "uppercase name",
            |s| s.name = Some("Example-Balancer".into()),
            strings![not_dns1035("metadata.name", "Example-Balancer")],
            vec![],
        ),
        case(
            "name ending with a dash",
            |s| s.name = Some("example-".into()),
            strings![not_dns1035("metadata.name", "example-")],
            vec![],
        ),
        case(
            "name with a dot (a DNS subdomain, not a label)",
            |s| s.name = Some("example.balancer".into()),
            strings![not_dns1035("metadata.name", "example.balancer")],
            vec![],
        ),
        case(
            "53-character name with one-character backends is the longest allowed",
            |s| {
                s.name = Some("a".repeat(53));
                for (b, n) in s.spec.backends.iter_mut().zip(["x", "y", "z"]) {
                    b.name = n.into();
                }
            },
            vec![],
            vec![],
        ),
        case(
            "53-character name with two-character backends: derived names are 64",
            |s| s.name = Some("a".repeat(53)),
            strings![
                derived_too_long(0, &"a".repeat(53), "v1"),
                derived_too_long(1, &"a".repeat(53), "v2"),
                derived_too_long(2, &"a".repeat(53), "v3"),
            ],
            vec![],
        ),
        case(
            "54-character name",
            |s| s.name = Some("a".repeat(54)),
            strings![
                name_too_long("metadata.name", 54),
                derived_too_long(0, &"a".repeat(54), "v1"),
                derived_too_long(1, &"a".repeat(54), "v2"),
                derived_too_long(2, &"a".repeat(54), "v3"),
            ],
            vec![],
        ),
        case(
            "64-character name is neither a label nor short enough",
            |s| s.name = Some("a".repeat(64)),
            strings![
                not_dns1035("metadata.name", &"a".repeat(64)),
                name_too_long("metadata.name", 64),
                derived_too_long(0, &"a".repeat(64), "v1"),
                derived_too_long(1, &"a".repeat(64), "v2"),
                derived_too_long(2, &"a".repeat(64), "v3"),
            ],
            vec![],
        ),
        case(
            "generateName prefix may end with a dash",
            |s| {
                s.name = None;
                s.generate_name = Some("example-".into());
            },
            vec![],
            vec![],
        ),
        case(
            "generateName prefix starting with a digit",
            |s| {
                s.name = None;
                s.generate_name = Some("1example-".into());
            },
            strings![not_dns1035("metadata.generateName", "1example-")],
            vec![],
        ),
        case(
            "generateName prefix with uppercase letters",
            |s| {
                s.name = None;
                s.generate_name = Some("Example-".into());
            },
            strings![not_dns1035("metadata.generateName", "Example-")],
            vec![],
        ),
        case(
            "48-character generateName prefix (+5 generated = 53) is the longest allowed",
            |s| {
                s.name = None;
                s.generate_name = Some(format!("{}-", "a".repeat(47)));
                for (b, n) in s.spec.backends.iter_mut().zip(["x", "y", "z"]) {
                    b.name = n.into();
                }
            },
            vec![],
            vec![],
        ),
        case(
            "49-character generateName prefix counts the 5 generated characters",
            |s| {
                s.name = None;
                s.generate_name = Some(format!("{}-", "a".repeat(48)));
                for (b, n) in s.spec.backends.iter_mut().zip(["x", "y", "z"]) {
                    b.name = n.into();
                }
            },
            {
                // The final name shows its 5 generated characters as `?`.
                let name = format!("{}-?????", "a".repeat(48));
                strings![
                    name_too_long("metadata.generateName", 54),
                    derived_too_long(0, &name, "x"),
                    derived_too_long(1, &name, "y"),
                    derived_too_long(2, &name, "z"),
                ]
            },
            vec![],
        ),
        case("metadata.name wins over generateName", |s| s.generate_name = Some("Not A Prefix".into()), vec![], vec![]),
        case(
            "an empty metadata.name falls back to generateName",
            |s| {
                s.name = Some(String::new());
                s.generate_name = Some("Bad-".into());
            },
            strings![not_dns1035("metadata.generateName", "Bad-")],
            vec![],
        ),
        case(
            "no name at all: name and derived-name rules are skipped",
            |s| {
                s.name = None;
                s.generate_name = Some(String::new());
                s.spec.backends[0].name = "a".repeat(63);
            },
            vec![],
            vec![],
        ),
    ]);
}

/// With `generateName` the final name's length is known (prefix + 5 characters),
/// so `<name>-<backend>-backend` can be checked just as for `metadata.name`:
/// a 48-character prefix makes a 53-character name, and `v1` then derives a
/// 64-character Service name that the API server will refuse at reconcile time.
#[test]
fn generate_name_derived_service_names_are_length_checked() {
    let mut subject = sample();
    subject.name = None;
    subject.generate_name = Some(format!("{}-", "a".repeat(47)));
    let report = subject.report();
    let fields: Vec<&str> = report.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        ["spec.backends[0].name", "spec.backends[1].name", "spec.backends[2].name"],
        "got {:#?}",
        report.errors
    );
}

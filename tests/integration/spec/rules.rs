//! Table-driven tests of every admission rule in `balancer::spec::validation`.
//!
//! Each row starts from the project's sample Balancer (valid, no warnings),
//! applies one mutation and states the complete report: every error as it is
//! rendered (`<field path>: <problem>`), in order, and every warning.
//! The expected texts are written out here on purpose rather than built from
//! the crate's constants, so that a changed message is a failing test.

use std::collections::BTreeMap;

use balancer::api::formats::{
    check_label_key, check_label_value, is_dns1035_label, is_dns1123_label, is_dns1123_subdomain, is_iana_svc_name,
};
use balancer::api::v1beta1::{FrontService, ProxySpec};
use balancer::api::{BackendSpec, BalancerPort, BalancerSpec};
use balancer::cli::check::check_yaml;
use balancer::spec::SpecPolicy;
use balancer::spec::denial_message;
use balancer::spec::{FieldError, ObjectName, Report, validate};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::support::fixtures;

// ---------------------------------------------------------------------------
// Building blocks
// ---------------------------------------------------------------------------

/// What the validating webhook sees: the name fields and the (defaulted) spec.
#[derive(Clone, Debug)]
struct Subject {
    name: Option<String>,
    generate_name: Option<String>,
    spec: BalancerSpec,
    /// The operator's `--allowed-proxy-images`.
    allowed_images: Vec<String>,
}

impl Subject {
    fn report(&self) -> Report {
        let policy = SpecPolicy { replicas: 1, allowed_images: self.allowed_images.clone() };
        validate(ObjectName::from_meta(self.name.as_deref(), self.generate_name.as_deref()), &self.spec, &policy)
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn port(name: Option<&str>, protocol: Option<&str>, port: i32, target: Option<IntOrString>) -> BalancerPort {
    BalancerPort {
        name: name.map(str::to_string),
        protocol: protocol.map(str::to_string),
        port,
        target_port: target,
        ..Default::default()
    }
}

/// A named port with an explicit protocol and no targetPort.
fn named(name: &str, protocol: &str, number: i32) -> BalancerPort {
    port(Some(name), Some(protocol), number, None)
}

fn backend(name: &str, weight: Option<i32>, selector: Option<&[(&str, &str)]>) -> BackendSpec {
    BackendSpec { name: name.to_string(), weight, selector: selector.map(labels), ..Default::default() }
}

/// deploy/samples/balancer.yaml, as the mutating webhook leaves `replicas`: valid, without warnings.
fn sample() -> Subject {
    Subject {
        name: Some(fixtures::SAMPLE.into()),
        generate_name: None,
        allowed_images: Vec::new(),
        spec: BalancerSpec { replicas: Some(1), ..fixtures::sample_spec() },
    }
}

// ---------------------------------------------------------------------------
// Expected messages, spelled out
// ---------------------------------------------------------------------------

fn not_dns1035(field: &str, got: &str) -> String {
    format!(
        "{field}: must be a DNS-1035 label because it names the front-end Service (lowercase letters, digits \
         and '-', starting with a letter and ending with a letter or digit), got \"{got}\""
    )
}

fn name_too_long(field: &str, len: usize) -> String {
    format!(
        "{field}: must be at most 53 characters so that child names (\"<name>-<backend>-backend\") fit in 63, \
         got {len}"
    )
}

fn not_dns1123(field: &str, got: &str) -> String {
    format!(
        "{field}: must be a DNS-1123 label (at most 63 lowercase letters, digits and '-', starting and ending \
         with a letter or digit), got \"{got}\""
    )
}

fn not_iana(field: &str, got: &str) -> String {
    format!(
        "{field}: must be a port number or an IANA service name (at most 15 lowercase letters, digits and '-', \
         with at least one letter), got \"{got}\""
    )
}

fn derived_too_long(index: usize, balancer: &str, backend: &str) -> String {
    let service = format!("{balancer}-{backend}-backend");
    format!(
        "spec.backends[{index}].name: the derived Service name \"{service}\" must be at most 63 characters, got {}",
        service.len()
    )
}

fn empty_merged_selector(index: usize) -> String {
    format!(
        "spec.backends[{index}].selector: the merged selector (spec.selector and this backend's selector) must \
         not be empty, or the backend would select every pod in the namespace"
    )
}

fn drains(index: usize, name: &str) -> String {
    format!("spec.backends[{index}].weight: weight 0 drains backend \"{name}\": it receives no traffic")
}

fn same_pods(index: usize, first: usize) -> String {
    format!(
        "spec.backends[{index}].selector: selects the same pods as spec.backends[{first}], so both backends share them"
    )
}

const NAME_PART_RULE: &str =
    "at most 63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character";
const PREFIX_PROBLEM: &str = "the prefix must be a DNS-1123 subdomain of at most 253 characters";

fn bad_key_name(at: &str, key: &str) -> String {
    format!("{at}: invalid label key \"{key}\": the name must be {NAME_PART_RULE}")
}

fn bad_key_prefix(at: &str, key: &str) -> String {
    format!("{at}: invalid label key \"{key}\": {PREFIX_PROBLEM}")
}

fn bad_value(at: &str, key: &str, value: &str) -> String {
    format!("{at}[{key}]: invalid label value \"{value}\": must be empty or {NAME_PART_RULE}")
}

/// A DNS-1123 subdomain of exactly `len` characters (labels of at most 63).
fn subdomain(len: usize) -> String {
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

// ---------------------------------------------------------------------------
// Table runner
// ---------------------------------------------------------------------------

struct Case {
    what: &'static str,
    mutate: fn(&mut Subject),
    errors: Vec<String>,
    warnings: Vec<String>,
}

fn case(what: &'static str, mutate: fn(&mut Subject), errors: Vec<String>, warnings: Vec<String>) -> Case {
    Case { what, mutate, errors, warnings }
}

macro_rules! strings {
    ($($e:expr),* $(,)?) => { vec![$(String::from($e)),*] };
}

fn run(cases: Vec<Case>) {
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

// ---------------------------------------------------------------------------
// The tables
// ---------------------------------------------------------------------------

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

#[test]
fn port_rules() {
    run(vec![
        case("no ports", |s| s.spec.ports.clear(), strings!["spec.ports: must have at least one port"], vec![]),
        case(
            "32 ports is the maximum",
            |s| s.spec.ports = (0..32).map(|i| named(&format!("p{i}"), "TCP", 1000 + i)).collect(),
            vec![],
            vec![],
        ),
        case(
            "33 ports",
            |s| s.spec.ports = (0..33).map(|i| named(&format!("p{i}"), "TCP", 1000 + i)).collect(),
            strings!["spec.ports: must have at most 32 ports, got 33"],
            vec![],
        ),
        case(
            "port 0",
            |s| s.spec.ports[0].port = 0,
            strings!["spec.ports[0].port: must be between 1 and 65535, got 0"],
            vec![],
        ),
        case(
            "port 65536",
            |s| s.spec.ports[0].port = 65536,
            strings!["spec.ports[0].port: must be between 1 and 65535, got 65536"],
            vec![],
        ),
        case(
            "negative port",
            |s| s.spec.ports[0].port = -80,
            strings!["spec.ports[0].port: must be between 1 and 65535, got -80"],
            vec![],
        ),
        case(
            "ports 1 and 65535 are in range",
            |s| s.spec.ports = vec![named("low", "TCP", 1), named("high", "TCP", 65535)],
            vec![],
            vec![],
        ),
        case(
            "protocol SCTP",
            |s| s.spec.ports[0].protocol = Some("SCTP".into()),
            strings!["spec.ports[0].protocol: must be TCP or UDP, got \"SCTP\""],
            vec![],
        ),
        case(
            "protocol in lowercase",
            |s| s.spec.ports[0].protocol = Some("tcp".into()),
            strings!["spec.ports[0].protocol: must be TCP or UDP, got \"tcp\""],
            vec![],
        ),
        case("protocol UDP", |s| s.spec.ports[0].protocol = Some("UDP".into()), vec![], vec![]),
        case("unset protocol is TCP", |s| s.spec.ports[0].protocol = None, vec![], vec![]),
        case("a single port needs no name", |s| s.spec.ports[0].name = None, vec![], vec![]),
        case(
            "second of two ports has no name",
            |s| s.spec.ports.push(port(None, Some("TCP"), 8080, None)),
            strings!["spec.ports[1].name: is required when there is more than one port"],
            vec![],
        ),
        case(
            "an empty name is a missing name",
            |s| {
                s.spec.ports[0].name = Some(String::new());
                s.spec.ports.push(named("admin", "TCP", 8080));
            },
            strings!["spec.ports[0].name: is required when there is more than one port"],
            vec![],
        ),
        case(
            "three ports, none named",
            |s| {
                s.spec.ports = vec![
                    port(None, Some("TCP"), 80, None),
                    port(None, Some("TCP"), 81, None),
                    port(None, Some("UDP"), 82, None),
                ]
            },
            strings![
                "spec.ports[0].name: is required when there is more than one port",
                "spec.ports[1].name: is required when there is more than one port",
                "spec.ports[2].name: is required when there is more than one port",
            ],
            vec![],
        ),
        case(
            "uppercase port name",
            |s| s.spec.ports[0].name = Some("HTTP".into()),
            strings![not_dns1123("spec.ports[0].name", "HTTP")],
            vec![],
        ),
        case(
            "port name with an underscore",
            |s| s.spec.ports[0].name = Some("web_ui".into()),
            strings![not_dns1123("spec.ports[0].name", "web_ui")],
            vec![],
        ),
        case(
            "port name starting with a dash",
            |s| s.spec.ports[0].name = Some("-http".into()),
            strings![not_dns1123("spec.ports[0].name", "-http")],
            vec![],
        ),
        case(
            "64-character port name",
            |s| s.spec.ports[0].name = Some("p".repeat(64)),
            strings![not_dns1123("spec.ports[0].name", &"p".repeat(64))],
            vec![],
        ),
        case(
            "63-character port name starting with a digit is a DNS-1123 label",
            |s| s.spec.ports[0].name = Some(format!("8{}", "p".repeat(62))),
            vec![],
            vec![],
        ),
        case(
            "duplicate port names",
            |s| s.spec.ports.push(named("http", "TCP", 8080)),
            strings!["spec.ports[1].name: duplicate port name \"http\" (also spec.ports[0].name)"],
            vec![],
        ),
        case(
            "invalid and duplicate port name reports both",
            |s| s.spec.ports = vec![named("Web", "TCP", 80), named("Web", "TCP", 81)],
            strings![
                not_dns1123("spec.ports[0].name", "Web"),
                not_dns1123("spec.ports[1].name", "Web"),
                "spec.ports[1].name: duplicate port name \"Web\" (also spec.ports[0].name)",
            ],
            vec![],
        ),
        case(
            "duplicate port and protocol",
            |s| s.spec.ports.push(named("alt", "TCP", 80)),
            strings!["spec.ports[1]: duplicate port 80/TCP (also spec.ports[0])"],
            vec![],
        ),
        case(
            "53/TCP and 53/UDP may coexist",
            |s| s.spec.ports = vec![named("dns-tcp", "TCP", 53), named("dns-udp", "UDP", 53)],
            vec![],
            vec![],
        ),
        case(
            "an unset protocol collides with an explicit TCP",
            |s| s.spec.ports = vec![port(Some("dns"), None, 53, None), named("dns-tcp", "TCP", 53)],
            strings!["spec.ports[1]: duplicate port 53/TCP (also spec.ports[0])"],
            vec![],
        ),
        case(
            "same name and same port/protocol report both duplicates",
            |s| s.spec.ports = vec![named("dns", "UDP", 53), named("dns", "UDP", 53)],
            strings![
                "spec.ports[1].name: duplicate port name \"dns\" (also spec.ports[0].name)",
                "spec.ports[1]: duplicate port 53/UDP (also spec.ports[0])",
            ],
            vec![],
        ),
    ]);
}

#[test]
fn target_port_rules() {
    run(vec![
        case(
            "numeric targetPort 0",
            |s| s.spec.ports[0].target_port = Some(IntOrString::Int(0)),
            strings!["spec.ports[0].targetPort: must be between 1 and 65535, got 0"],
            vec![],
        ),
        case(
            "numeric targetPort 65536",
            |s| s.spec.ports[0].target_port = Some(IntOrString::Int(65536)),
            strings!["spec.ports[0].targetPort: must be between 1 and 65535, got 65536"],
            vec![],
        ),
        case(
            "numeric targetPort -1",
            |s| s.spec.ports[0].target_port = Some(IntOrString::Int(-1)),
            strings!["spec.ports[0].targetPort: must be between 1 and 65535, got -1"],
            vec![],
        ),
        case(
            "numeric targetPorts 1 and 65535",
            |s| {
                s.spec.ports = vec![
                    port(Some("low"), Some("TCP"), 80, Some(IntOrString::Int(1))),
                    port(Some("high"), Some("TCP"), 81, Some(IntOrString::Int(65535))),
                ]
            },
            vec![],
            vec![],
        ),
        case("no targetPort", |s| s.spec.ports[0].target_port = None, vec![], vec![]),
        case(
            "valid named targetPort",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("http-alt".into())),
            vec![],
            vec![],
        ),
        case(
            "15-character named targetPort starting with a digit",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String(format!("8{}", "a".repeat(14)))),
            vec![],
            vec![],
        ),
        case(
            "16-character named targetPort",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("a".repeat(16))),
            strings![not_iana("spec.ports[0].targetPort", &"a".repeat(16))],
            vec![],
        ),
        case(
            "uppercase named targetPort",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("HTTP".into())),
            strings![not_iana("spec.ports[0].targetPort", "HTTP")],
            vec![],
        ),
        case(
            "digits-only named targetPort",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("8080".into())),
            strings![not_iana("spec.ports[0].targetPort", "8080")],
            vec![],
        ),
        case(
            "named targetPort with a double dash",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("http--alt".into())),
            strings![not_iana("spec.ports[0].targetPort", "http--alt")],
            vec![],
        ),
        case(
            "named targetPort starting with a dash",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("-http".into())),
            strings![not_iana("spec.ports[0].targetPort", "-http")],
            vec![],
        ),
        case(
            "named targetPort ending with a dash",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("http-".into())),
            strings![not_iana("spec.ports[0].targetPort", "http-")],
            vec![],
        ),
        case(
            "empty named targetPort (before defaulting)",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String(String::new())),
            strings![not_iana("spec.ports[0].targetPort", "")],
            vec![],
        ),
        case(
            "targetPort is checked on every port",
            |s| s.spec.ports.push(port(Some("admin"), Some("TCP"), 8080, Some(IntOrString::String("Admin".into())))),
            strings![not_iana("spec.ports[1].targetPort", "Admin")],
            vec![],
        ),
    ]);
}

#[test]
fn backend_rules() {
    run(vec![
        case(
            "no backends",
            |s| s.spec.backends.clear(),
            strings!["spec.backends: must have at least one backend"],
            vec![],
        ),
        case(
            "64 backends is the maximum",
            |s| {
                s.spec.backends = (0..64)
                    .map(|i| backend(&format!("b{i}"), Some(1), Some(&[("version", &format!("b{i}"))])))
                    .collect()
            },
            vec![],
            vec![],
        ),
        case(
            "65 backends",
            |s| {
                s.spec.backends = (0..65)
                    .map(|i| backend(&format!("b{i}"), Some(1), Some(&[("version", &format!("b{i}"))])))
                    .collect()
            },
            strings!["spec.backends: must have at most 64 backends, got 65"],
            vec![],
        ),
        case(
            "uppercase backend name",
            |s| s.spec.backends[1].name = "V2".into(),
            strings![not_dns1123("spec.backends[1].name", "V2")],
            vec![],
        ),
        case(
            "empty backend name",
            |s| s.spec.backends[0].name = String::new(),
            strings![not_dns1123("spec.backends[0].name", "")],
            vec![],
        ),
        case(
            "backend name with a dot",
            |s| s.spec.backends[2].name = "v3.0".into(),
            strings![not_dns1123("spec.backends[2].name", "v3.0")],
            vec![],
        ),
        case(
            "backend name ending with a dash",
            |s| s.spec.backends[2].name = "v3-".into(),
            strings![not_dns1123("spec.backends[2].name", "v3-")],
            vec![],
        ),
        case(
            "duplicate backend names",
            |s| s.spec.backends[1].name = "v1".into(),
            strings!["spec.backends[1].name: duplicate backend name \"v1\" (also spec.backends[0].name)"],
            vec![],
        ),
        case(
            "38-character backend name: derived Service name is exactly 63",
            |s| s.spec.backends[0].name = "a".repeat(38),
            vec![],
            vec![],
        ),
        case(
            "39-character backend name: derived Service name is 64",
            |s| s.spec.backends[0].name = "a".repeat(39),
            strings![derived_too_long(0, "example-balancer", &"a".repeat(39))],
            vec![],
        ),
        case(
            "64-character backend name is neither a label nor short enough",
            |s| s.spec.backends[0].name = "a".repeat(64),
            strings![
                not_dns1123("spec.backends[0].name", &"a".repeat(64)),
                derived_too_long(0, "example-balancer", &"a".repeat(64)),
            ],
            vec![],
        ),
        case(
            "weight -1",
            |s| s.spec.backends[0].weight = Some(-1),
            strings!["spec.backends[0].weight: must be between 0 and 100, got -1"],
            vec![],
        ),
        case(
            "weight 101",
            |s| s.spec.backends[2].weight = Some(101),
            strings!["spec.backends[2].weight: must be between 0 and 100, got 101"],
            vec![],
        ),
        case(
            "weight 150",
            |s| s.spec.backends[1].weight = Some(150),
            strings!["spec.backends[1].weight: must be between 0 and 100, got 150"],
            vec![],
        ),
        case("weight 100", |s| s.spec.backends[1].weight = Some(100), vec![], vec![]),
        case(
            "unset weight counts as 1",
            |s| {
                for b in &mut s.spec.backends {
                    b.weight = None;
                }
            },
            vec![],
            vec![],
        ),
        case("weight 0 drains a backend", |s| s.spec.backends[1].weight = Some(0), vec![], strings![drains(1, "v2")]),
        case(
            "all weights 0",
            |s| {
                for b in &mut s.spec.backends {
                    b.weight = Some(0);
                }
            },
            strings!["spec.backends: the sum of weights must be greater than 0, got 0"],
            strings![drains(0, "v1"), drains(1, "v2"), drains(2, "v3")],
        ),
        case(
            "a single backend with weight 0",
            |s| {
                s.spec.backends.truncate(1);
                s.spec.backends[0].weight = Some(0);
            },
            strings!["spec.backends: the sum of weights must be greater than 0, got 0"],
            strings![drains(0, "v1")],
        ),
        case(
            "no sum error while a weight is out of range",
            |s| {
                s.spec.backends[0].weight = Some(0);
                s.spec.backends[1].weight = Some(101);
                s.spec.backends[2].weight = Some(0);
            },
            strings!["spec.backends[1].weight: must be between 0 and 100, got 101"],
            strings![drains(0, "v1"), drains(2, "v3")],
        ),
        case("backend selectors alone suffice", |s| s.spec.selector = None, vec![], vec![]),
        case(
            "empty merged selector",
            |s| {
                s.spec.selector = None;
                s.spec.backends[1].selector = None;
            },
            strings![empty_merged_selector(1)],
            vec![],
        ),
        case(
            "empty maps on both levels",
            |s| {
                s.spec.selector = Some(BTreeMap::new());
                for b in &mut s.spec.backends {
                    b.selector = Some(BTreeMap::new());
                }
            },
            strings![empty_merged_selector(0), empty_merged_selector(1), empty_merged_selector(2)],
            vec![],
        ),
        case(
            "backends without selectors share spec.selector",
            |s| {
                for b in &mut s.spec.backends {
                    b.selector = None;
                }
            },
            vec![],
            strings![same_pods(1, 0), same_pods(2, 0)],
        ),
        case(
            "identical merged selectors",
            |s| s.spec.backends[2].selector = Some(labels(&[("version", "v1")])),
            vec![],
            strings![same_pods(2, 0)],
        ),
        case(
            "a backend restating spec.selector selects the same pods as one without a selector",
            |s| {
                s.spec.selector = Some(labels(&[("app", "test"), ("version", "v1")]));
                s.spec.backends[0].selector = None;
                s.spec.backends[1].selector = Some(labels(&[("app", "test")]));
            },
            vec![],
            strings![same_pods(1, 0)],
        ),
    ]);
}

#[test]
fn selector_rules() {
    run(vec![
        case(
            "label key with an uppercase prefix",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("Example.com/app".into(), "x".into());
            },
            strings![bad_key_prefix("spec.selector", "Example.com/app")],
            vec![],
        ),
        case(
            "label key with an empty prefix",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("/app".into(), "x".into());
            },
            strings![bad_key_prefix("spec.selector", "/app")],
            vec![],
        ),
        case(
            "label key with a 254-character prefix",
            |s| {
                s.spec.selector.as_mut().unwrap().insert(format!("{}/app", subdomain(254)), "x".into());
            },
            strings![bad_key_prefix("spec.selector", &format!("{}/app", subdomain(254)))],
            vec![],
        ),
        case(
            "label key with a 253-character prefix",
            |s| {
                s.spec.selector.as_mut().unwrap().insert(format!("{}/app", subdomain(253)), "x".into());
            },
            vec![],
            vec![],
        ),
        case(
            "label key whose name starts with a dash",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("-app".into(), "x".into());
            },
            strings![bad_key_name("spec.selector", "-app")],
            vec![],
        ),
        case(
            "label key with a space",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("my app".into(), "x".into());
            },
            strings![bad_key_name("spec.selector", "my app")],
            vec![],
        ),
        case(
            "label key with two slashes",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("example.com/a/b".into(), "x".into());
            },
            strings![bad_key_name("spec.selector", "example.com/a/b")],
            vec![],
        ),
        case(
            "label key with an empty name after the prefix",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("example.com/".into(), "x".into());
            },
            strings![bad_key_name("spec.selector", "example.com/")],
            vec![],
        ),
        case(
            "label key with a 64-character name",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("k".repeat(64), "x".into());
            },
            strings![bad_key_name("spec.selector", &"k".repeat(64))],
            vec![],
        ),
        case(
            "prefixed label key with a 63-character mixed-case name",
            |s| {
                s.spec
                    .selector
                    .as_mut()
                    .unwrap()
                    .insert(format!("example.com/A{}", "_.-b".repeat(15) + "cZ"), "x".into());
            },
            vec![],
            vec![],
        ),
        case(
            "label value starting with a dash",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("app".into(), "-test".into());
            },
            strings![bad_value("spec.selector", "app", "-test")],
            vec![],
        ),
        case(
            "64-character label value",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("app".into(), "v".repeat(64));
            },
            strings![bad_value("spec.selector", "app", &"v".repeat(64))],
            vec![],
        ),
        case(
            "label value with a slash",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("app".into(), "a/b".into());
            },
            strings![bad_value("spec.selector", "app", "a/b")],
            vec![],
        ),
        case(
            "empty label value",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("app".into(), String::new());
            },
            vec![],
            vec![],
        ),
        case(
            "bad key and bad value on the same label",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("bad key".into(), "bad value".into());
            },
            strings![bad_key_name("spec.selector", "bad key"), bad_value("spec.selector", "bad key", "bad value"),],
            vec![],
        ),
        case(
            "invalid label key in a backend selector",
            |s| {
                s.spec.backends[1].selector.as_mut().unwrap().insert("_tier".into(), "web".into());
            },
            strings![bad_key_name("spec.backends[1].selector", "_tier")],
            vec![],
        ),
        case(
            "invalid label value in a backend selector",
            |s| {
                s.spec.backends[2].selector.as_mut().unwrap().insert("version".into(), "v 3".into());
            },
            strings![bad_value("spec.backends[2].selector", "version", "v 3")],
            vec![],
        ),
    ]);
}

#[test]
fn every_violation_is_reported_at_once() {
    run(vec![case(
        "one broken Balancer",
        |s| {
            s.name = Some("Broken".into());
            s.spec.replicas = Some(101);
            s.spec.ports.push(port(Some("http"), Some("SCTP"), 0, Some(IntOrString::String("HTTP".into()))));
            s.spec.selector.as_mut().unwrap().insert("bad/key/x".into(), "v".into());
            s.spec.backends[1].name = "V2".into();
            s.spec.backends[1].weight = Some(150);
            s.spec.backends[2] = backend("v1", Some(0), Some(&[("version", "v1")]));
        },
        strings![
            not_dns1035("metadata.name", "Broken"),
            "spec.replicas: must be between 0 and 100, got 101",
            "spec.ports[1].port: must be between 1 and 65535, got 0",
            "spec.ports[1].protocol: must be TCP or UDP, got \"SCTP\"",
            "spec.ports[1].name: duplicate port name \"http\" (also spec.ports[0].name)",
            not_iana("spec.ports[1].targetPort", "HTTP"),
            bad_key_name("spec.selector", "bad/key/x"),
            not_dns1123("spec.backends[1].name", "V2"),
            "spec.backends[1].weight: must be between 0 and 100, got 150",
            "spec.backends[2].name: duplicate backend name \"v1\" (also spec.backends[0].name)",
        ],
        strings![drains(2, "v1"), same_pods(2, 0)],
    )]);
}

/// The sample meant to show off the webhook's errors, checked as `balancer check` does, in
/// the Go project's version and in v1beta1 (the same object, converted): the same report.
#[test]
fn the_invalid_sample_reports_every_problem() {
    let text = include_str!("../../../deploy/samples/invalid-balancer.yaml");
    assert!(text.contains("apiVersion: exposer.hliangzhao.io/v1alpha1\n"));
    let beta = text.replace("exposer.hliangzhao.io/v1alpha1", "exposer.hliangzhao.io/v1beta1");
    for text in [text, beta.as_str()] {
        let findings = check_yaml("invalid-balancer.yaml", text, &SpecPolicy::default()).expect("the sample is YAML");
        assert_eq!(findings.len(), 1);
        let errors: Vec<String> = findings[0].report.errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            strings![
                "spec.ports[1].name: duplicate port name \"http\" (also spec.ports[0].name)",
                "spec.ports[1].targetPort: must be a port number or an IANA service name (at most 15 lowercase \
                 letters, digits and '-', with at least one letter), got \"Web_Port\"",
                not_dns1123("spec.backends[1].name", "V2"),
                "spec.backends[1].selector: the merged selector (spec.selector and this backend's selector) must \
                 not be empty, or the backend would select every pod in the namespace",
            ]
        );
        assert!(findings[0].report.warnings.is_empty());
    }
}

#[test]
fn replicas_rules() {
    run(vec![
        case("no replicas (the controller uses its default)", |s| s.spec.replicas = None, vec![], vec![]),
        case("zero replicas (scaled to zero)", |s| s.spec.replicas = Some(0), vec![], vec![]),
        case("the most replicas", |s| s.spec.replicas = Some(100), vec![], vec![]),
        case(
            "negative replicas",
            |s| s.spec.replicas = Some(-1),
            strings!["spec.replicas: must be between 0 and 100, got -1"],
            vec![],
        ),
        case(
            "too many replicas",
            |s| s.spec.replicas = Some(101),
            strings!["spec.replicas: must be between 0 and 100, got 101"],
            vec![],
        ),
        case(
            "the lowest i32",
            |s| s.spec.replicas = Some(i32::MIN),
            strings!["spec.replicas: must be between 0 and 100, got -2147483648"],
            vec![],
        ),
    ]);
}

#[test]
fn session_affinity_rules() {
    run(vec![
        case("no affinity (defaulted to None)", |s| s.spec.session_affinity = None, vec![], vec![]),
        case("None", |s| s.spec.session_affinity = Some("None".into()), vec![], vec![]),
        case("ClientIP", |s| s.spec.session_affinity = Some("ClientIP".into()), vec![], vec![]),
        case(
            "another value",
            |s| s.spec.session_affinity = Some("Cookie".into()),
            strings!["spec.sessionAffinity: must be None or ClientIP, got \"Cookie\""],
            vec![],
        ),
    ]);
}

#[test]
fn passive_health_and_timeout_rules() {
    run(vec![
        case(
            "every field set within bounds",
            |s| {
                s.spec.ports[0].connect_timeout = Some("100ms".into());
                s.spec.ports[0].idle_timeout = Some("24h".into());
                s.spec.backends[0].max_fails = Some(0);
                s.spec.backends[0].fail_timeout = Some("1h".into());
            },
            vec![],
            vec![],
        ),
        case(
            "out of bounds",
            |s| {
                s.spec.ports[0].connect_timeout = Some("6m".into());
                s.spec.ports[0].idle_timeout = Some("999ms".into());
                s.spec.backends[0].max_fails = Some(101);
                s.spec.backends[0].fail_timeout = Some("2h".into());
            },
            strings![
                "spec.ports[0].connectTimeout: must be between 100ms and 5m, got \"6m\"",
                "spec.ports[0].idleTimeout: must be between 1s and 24h, got \"999ms\"",
                "spec.backends[0].maxFails: must be between 0 and 100, got 101",
                "spec.backends[0].failTimeout: must be between 1s and 1h, got \"2h\""
            ],
            vec![],
        ),
        case(
            "not durations nginx reads",
            |s| {
                s.spec.ports[0].connect_timeout = Some("5 s".into());
                s.spec.backends[0].fail_timeout = Some("10s; evil".into());
            },
            strings![
                "spec.ports[0].connectTimeout: must be a number and a unit (ms, s, m or h), such as 5s, got \"5 s\"",
                "spec.backends[0].failTimeout: must be a number and a unit (ms, s, m or h), such as 5s, got \"10s; evil\""
            ],
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

// ---------------------------------------------------------------------------
// The predicates
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------

fn field_error(field: &str, detail: &str) -> FieldError {
    FieldError { field: field.into(), detail: detail.into() }
}

#[test]
fn field_errors_render_as_path_colon_problem() {
    assert_eq!(
        field_error("spec.backends[1].weight", "must be between 0 and 100, got 150").to_string(),
        "spec.backends[1].weight: must be between 0 and 100, got 150"
    );
}

#[test]
fn denial_message_with_one_error_has_no_brackets() {
    assert_eq!(
        denial_message("example-balancer", &[field_error("spec.ports", "must have at least one port")]),
        "Balancer \"example-balancer\" is invalid: spec.ports: must have at least one port"
    );
}

#[test]
fn denial_message_with_several_errors_lists_them_in_brackets() {
    assert_eq!(
        denial_message(
            "example-balancer",
            &[
                field_error("spec.ports[1].name", "duplicate port name \"http\" (also spec.ports[0].name)"),
                field_error("spec.backends[1].weight", "must be between 0 and 100, got 150"),
                field_error("spec.backends", "must have at least one backend"),
            ]
        ),
        "Balancer \"example-balancer\" is invalid: [spec.ports[1].name: duplicate port name \"http\" \
         (also spec.ports[0].name), spec.backends[1].weight: must be between 0 and 100, got 150, \
         spec.backends: must have at least one backend]"
    );
}

#[test]
fn denial_message_without_a_name_omits_it() {
    assert_eq!(denial_message("", &[field_error("spec", "is required")]), "Balancer is invalid: spec: is required");
    assert_eq!(
        denial_message("", &[field_error("a", "b"), field_error("c", "d")]),
        "Balancer is invalid: [a: b, c: d]"
    );
}

#[test]
fn denial_message_from_a_real_report() {
    let mut subject = sample();
    subject.spec.backends[1].weight = Some(150);
    subject.spec.ports[0].port = 0;
    let report = subject.report();
    assert_eq!(
        denial_message("example-balancer", &report.errors),
        "Balancer \"example-balancer\" is invalid: [spec.ports[0].port: must be between 1 and 65535, got 0, \
         spec.backends[1].weight: must be between 0 and 100, got 150]"
    );
}

/// A `spec.service` of `type_` with everything else unset.
fn service(type_: &str) -> Option<FrontService> {
    Some(FrontService { type_: Some(type_.into()), ..FrontService::default() })
}

#[test]
fn service_rules() {
    run(vec![
        case("no service (defaulted to ClusterIP)", |s| s.spec.service = None, vec![], vec![]),
        case(
            "a LoadBalancer with every setting",
            |s| {
                s.spec.service = Some(FrontService {
                    type_: Some("LoadBalancer".into()),
                    load_balancer_class: Some("example.com/internal".into()),
                    external_traffic_policy: Some("Local".into()),
                    load_balancer_source_ranges: Some(vec!["10.0.0.0/8".into(), "2001:db8::/32".into()]),
                    annotations: Some(labels(&[("service.beta.kubernetes.io/aws-load-balancer-internal", "true")])),
                });
                s.spec.ports[0].node_port = Some(30080);
            },
            vec![],
            vec![],
        ),
        case(
            "a NodePort with a chosen port",
            |s| {
                s.spec.service = service("NodePort");
                s.spec.ports[0].node_port = Some(30080);
            },
            vec![],
            vec![],
        ),
        case(
            "an unknown type",
            |s| s.spec.service = service("ExternalName"),
            strings!["spec.service.type: must be ClusterIP, NodePort or LoadBalancer, got \"ExternalName\""],
            vec![],
        ),
        case(
            "LoadBalancer settings on a ClusterIP Service",
            |s| {
                s.spec.service = Some(FrontService {
                    type_: Some("ClusterIP".into()),
                    load_balancer_class: Some("example.com/internal".into()),
                    external_traffic_policy: Some("Local".into()),
                    load_balancer_source_ranges: Some(vec!["10.0.0.0/8".into()]),
                    annotations: None,
                });
                s.spec.ports[0].node_port = Some(30080);
            },
            strings![
                "spec.ports[0].nodePort: applies to type NodePort or LoadBalancer only, and the type is \"ClusterIP\"",
                "spec.service.loadBalancerClass: applies to type LoadBalancer only, and the type is \"ClusterIP\"",
                "spec.service.externalTrafficPolicy: applies to type NodePort or LoadBalancer only, and the type is \"ClusterIP\"",
                "spec.service.loadBalancerSourceRanges: applies to type LoadBalancer only, and the type is \"ClusterIP\"",
            ],
            vec![],
        ),
        case(
            "bad values",
            |s| {
                s.spec.service = Some(FrontService {
                    type_: Some("LoadBalancer".into()),
                    load_balancer_class: Some("Internal LB".into()),
                    external_traffic_policy: Some("Nearest".into()),
                    load_balancer_source_ranges: Some(vec!["10.0.0.0".into(), "10.0.0.0/33".into(), "::/+1".into()]),
                    annotations: Some(labels(&[("-bad", "x")])),
                });
                s.spec.ports[0].node_port = Some(70000);
            },
            strings![
                "spec.ports[0].nodePort: must be between 1 and 65535, got 70000",
                "spec.service.loadBalancerClass: must be a label-style key such as example.com/lb (the name must be \
                 at most 63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric \
                 character), got \"Internal LB\"",
                "spec.service.externalTrafficPolicy: must be Cluster or Local, got \"Nearest\"",
                "spec.service.loadBalancerSourceRanges[0]: must be a CIDR such as 10.0.0.0/8 or fd00::/8, got \"10.0.0.0\"",
                "spec.service.loadBalancerSourceRanges[1]: must be a CIDR such as 10.0.0.0/8 or fd00::/8, got \"10.0.0.0/33\"",
                "spec.service.loadBalancerSourceRanges[2]: must be a CIDR such as 10.0.0.0/8 or fd00::/8, got \"::/+1\"",
                "spec.service.annotations: invalid annotation key \"-bad\": the name must be at most 63 \
                 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character",
            ],
            vec![],
        ),
        case(
            "the same node port twice",
            |s| {
                s.spec.service = service("NodePort");
                s.spec.ports = vec![named("a", "TCP", 80), named("b", "TCP", 81), named("c", "UDP", 80)];
                for port in &mut s.spec.ports {
                    port.node_port = Some(30080);
                }
            },
            strings!["spec.ports[1].nodePort: duplicate node port 30080 (also spec.ports[0].nodePort)"],
            vec![],
        ),
        case(
            "too many annotations",
            |s| {
                let annotations = (0..65).map(|i| (format!("example.com/a{i}"), String::new())).collect();
                s.spec.service = Some(FrontService { annotations: Some(annotations), ..FrontService::default() });
            },
            strings!["spec.service.annotations: must have at most 64 annotations, got 65"],
            vec![],
        ),
        case(
            "an annotation too long",
            |s| {
                let long = labels(&[("example.com/cert", &"x".repeat(4097))]);
                s.spec.service = Some(FrontService { annotations: Some(long), ..FrontService::default() });
            },
            strings!["spec.service.annotations[example.com/cert]: must be at most 4096 bytes, got 4097"],
            vec![],
        ),
    ]);
}

#[test]
fn proxy_rules() {
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    fn image(s: &mut Subject, image: &str) {
        s.spec.proxy = Some(ProxySpec { image: Some(image.into()), ..ProxySpec::default() });
    }
    run(vec![
        case(
            "placement and resources",
            |s| {
                let requests = BTreeMap::from([("cpu".to_string(), Quantity("250m".into()))]);
                s.spec.proxy = Some(ProxySpec {
                    resources: Some(ResourceRequirements { requests: Some(requests), ..Default::default() }),
                    node_selector: Some(labels(&[("kubernetes.io/os", "linux")])),
                    priority_class_name: Some("system-cluster-critical".into()),
                    pod_annotations: Some(labels(&[("example.com/scrape", "true")])),
                    ..ProxySpec::default()
                });
            },
            vec![],
            vec![],
        ),
        case(
            "an image while the operator allows none",
            |s| image(s, "nginx:1.27"),
            strings![
                "spec.proxy.image: is not allowed: this operator runs every proxy with its own --proxy-image, since \
                 the image would run with the operator's authority; the installer can allow image prefixes with \
                 --allowed-proxy-images"
            ],
            vec![],
        ),
        case(
            "an image under an allowed prefix",
            |s| {
                s.allowed_images = vec!["registry.example.com/nginx/".into()];
                image(s, "registry.example.com/nginx/stream:1.27");
            },
            vec![],
            vec![],
        ),
        case(
            "an image under no allowed prefix",
            |s| {
                s.allowed_images = vec!["registry.example.com/nginx/".into()];
                image(s, "evil.example.com/nginx/stream:1.27");
            },
            strings![
                "spec.proxy.image: must start with one of the prefixes the operator allows (--allowed-proxy-images): \
                 \"registry.example.com/nginx/\"; got \"evil.example.com/nginx/stream:1.27\""
            ],
            vec![],
        ),
        case(
            "bad values",
            |s| {
                let limits = BTreeMap::from([("memory".to_string(), Quantity("lots".into()))]);
                s.spec.proxy = Some(ProxySpec {
                    resources: Some(ResourceRequirements { limits: Some(limits), ..Default::default() }),
                    node_selector: Some(labels(&[("kubernetes.io/os", "not valid")])),
                    priority_class_name: Some("High_Priority".into()),
                    ..ProxySpec::default()
                });
            },
            strings![
                "spec.proxy.nodeSelector[kubernetes.io/os]: invalid label value \"not valid\": must be empty or \
                 at most 63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric \
                 character",
                "spec.proxy.priorityClassName: must be a DNS-1123 subdomain (a PriorityClass name), got \"High_Priority\"",
                "spec.proxy.resources.limits[memory]: must be a quantity such as 100m, 1, 64Mi or 1G, got \"lots\"",
            ],
            vec![],
        ),
    ]);
}

#[test]
fn image_prefixes_match_at_a_boundary_and_annotations_have_a_total() {
    run(vec![
        case(
            "a prefix without a slash still ends at a boundary",
            |s| {
                s.allowed_images = vec!["registry.example.com/nginx".into()];
                s.spec.proxy =
                    Some(ProxySpec { image: Some("registry.example.com/nginx-evil:1".into()), ..ProxySpec::default() });
            },
            strings![
                "spec.proxy.image: must start with one of the prefixes the operator allows (--allowed-proxy-images): \
                 \"registry.example.com/nginx\"; got \"registry.example.com/nginx-evil:1\""
            ],
            vec![],
        ),
        case(
            "the image itself, tagged, under that prefix",
            |s| {
                s.allowed_images = vec!["registry.example.com/nginx".into()];
                s.spec.proxy =
                    Some(ProxySpec { image: Some("registry.example.com/nginx:1.27".into()), ..ProxySpec::default() });
            },
            vec![],
            vec![],
        ),
        case(
            "annotations over 64 KiB in all",
            |s| {
                let big: BTreeMap<String, String> =
                    (0..20).map(|i| (format!("example.com/a{i}"), "x".repeat(4000))).collect();
                s.spec.service = Some(FrontService { annotations: Some(big), ..FrontService::default() });
            },
            strings!["spec.service.annotations: must be at most 65536 bytes in all (keys and values), got 80290"],
            vec![],
        ),
    ]);
}

#[test]
fn a_load_balancers_class_cannot_change() {
    let with_class = |type_: &str, class: Option<&str>| {
        let mut spec = sample().spec;
        spec.service = Some(FrontService {
            type_: Some(type_.into()),
            load_balancer_class: class.map(String::from),
            ..FrontService::default()
        });
        spec
    };
    let lb = |class| with_class("LoadBalancer", class);
    let changed = balancer::spec::unchangeable(&lb(Some("example.com/a")), &lb(Some("example.com/b")));
    assert_eq!(
        changed.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["spec.service.loadBalancerClass: may not change while the type is LoadBalancer (Kubernetes refuses it on \
          the Service): set the type to ClusterIP first, then to LoadBalancer with the new class"]
    );
    assert_eq!(balancer::spec::unchangeable(&lb(None), &lb(Some("example.com/a"))).len(), 1, "set once");
    assert!(balancer::spec::unchangeable(&lb(Some("example.com/a")), &lb(Some("example.com/a"))).is_empty());
    let cluster_ip = with_class("ClusterIP", None);
    assert!(balancer::spec::unchangeable(&cluster_ip, &lb(Some("example.com/a"))).is_empty(), "a new LoadBalancer");
}

/// nginx takes one balancing method per upstream, and ClientIP affinity is one (a hash).
#[test]
fn algorithm_rules() {
    run(vec![
        case("no algorithm (defaulted to RoundRobin)", |s| s.spec.algorithm = None, vec![], vec![]),
        case("LeastConnections", |s| s.spec.algorithm = Some("LeastConnections".into()), vec![], vec![]),
        case("PowerOfTwoChoices", |s| s.spec.algorithm = Some("PowerOfTwoChoices".into()), vec![], vec![]),
        case(
            "RoundRobin with ClientIP",
            |s| {
                s.spec.algorithm = Some("RoundRobin".into());
                s.spec.session_affinity = Some("ClientIP".into());
            },
            vec![],
            vec![],
        ),
        case(
            "another value",
            |s| s.spec.algorithm = Some("Fastest".into()),
            strings!["spec.algorithm: must be RoundRobin, LeastConnections or PowerOfTwoChoices, got \"Fastest\""],
            vec![],
        ),
        case(
            "LeastConnections with ClientIP",
            |s| {
                s.spec.algorithm = Some("LeastConnections".into());
                s.spec.session_affinity = Some("ClientIP".into());
            },
            strings![
                "spec.algorithm: must be RoundRobin with sessionAffinity ClientIP, which picks the backend by a hash \
                 of the client's address, got \"LeastConnections\""
            ],
            vec![],
        ),
    ]);
}

/// What nginx refuses about backups ("balancing method does not support parameter backup",
/// "no servers in upstream"), refused with the field that causes it.
#[test]
fn backup_and_connection_limit_rules() {
    run(vec![
        case(
            "a backup with round robin, a limit in range",
            |s| {
                s.spec.backends[2].backup = Some(true);
                s.spec.backends[0].max_connections = Some(1);
                s.spec.backends[1].max_connections = Some(1_000_000);
            },
            vec![],
            vec![],
        ),
        case(
            "a backup with LeastConnections",
            |s| {
                s.spec.backends[2].backup = Some(true);
                s.spec.algorithm = Some("LeastConnections".into());
            },
            vec![],
            vec![],
        ),
        case(
            "backup: false everywhere",
            |s| s.spec.backends.iter_mut().for_each(|b| b.backup = Some(false)),
            vec![],
            vec![],
        ),
        case(
            "a backup with ClientIP",
            |s| {
                s.spec.backends[1].backup = Some(true);
                s.spec.session_affinity = Some("ClientIP".into());
            },
            strings![
                "spec.backends[1].backup: cannot be used with sessionAffinity ClientIP, which has no fallback to a backup"
            ],
            vec![],
        ),
        case(
            "a backup with PowerOfTwoChoices",
            |s| {
                s.spec.backends[1].backup = Some(true);
                s.spec.algorithm = Some("PowerOfTwoChoices".into());
            },
            strings![
                "spec.backends[1].backup: cannot be used with algorithm PowerOfTwoChoices, which has no fallback to a \
                 backup"
            ],
            vec![],
        ),
        case(
            "every backend a backup",
            |s| s.spec.backends.iter_mut().for_each(|b| b.backup = Some(true)),
            strings![
                "spec.backends: at least one backend must not be a backup: backups take connections only when another \
                 backend cannot"
            ],
            vec![],
        ),
        case(
            "limits out of range",
            |s| {
                s.spec.backends[0].max_connections = Some(0);
                s.spec.backends[1].max_connections = Some(1_000_001);
            },
            strings![
                "spec.backends[0].maxConnections: must be between 1 and 1000000, got 0",
                "spec.backends[1].maxConnections: must be between 1 and 1000000, got 1000001"
            ],
            vec![],
        ),
    ]);
}

/// The PROXY protocol is a header at the start of a TCP stream.
#[test]
fn proxy_protocol_rules() {
    run(vec![
        case(
            "both ways on TCP",
            |s| {
                s.spec.ports[0].proxy_protocol = Some(true);
                s.spec.ports[0].accept_proxy_protocol = Some(true);
            },
            vec![],
            vec![],
        ),
        case(
            "false on UDP",
            |s| {
                s.spec.ports = vec![port(None, Some("UDP"), 53, None)];
                s.spec.ports[0].proxy_protocol = Some(false);
                s.spec.ports[0].accept_proxy_protocol = Some(false);
            },
            vec![],
            vec![],
        ),
        case(
            "both ways on UDP",
            |s| {
                s.spec.ports = vec![port(None, Some("UDP"), 53, None)];
                s.spec.ports[0].proxy_protocol = Some(true);
                s.spec.ports[0].accept_proxy_protocol = Some(true);
            },
            strings![
                "spec.ports[0].acceptProxyProtocol: is TCP only: nginx cannot accept PROXY protocol over UDP",
                "spec.ports[0].proxyProtocol: is TCP only: the header would arrive inside the backend's first UDP datagram"
            ],
            vec![],
        ),
    ]);
}

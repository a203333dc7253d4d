//! Rules over the whole spec: every violation reported at once, replicas, session affinity and
//! the algorithm.

use balancer::cli::check::check_yaml;
use balancer::spec::SpecPolicy;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::table::{
    backend, bad_key_name, case, drains, not_dns1035, not_dns1123, not_iana, port, run, same_pods, strings,
};

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
    let text = include_str!("../../../../deploy/samples/invalid-balancer.yaml");
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

//! `spec.proxy`: the proxy pods' settings, image prefixes and annotations.

use std::collections::BTreeMap;

use balancer::api::v1beta1::{FrontService, ProxySpec};
use balancer::api::{MAX_SPREAD_CONSTRAINTS, MAX_TOLERATIONS};

use super::table::{Subject, case, labels, run, strings};

/// A `spec.proxy` with `tolerations` distinct tolerations and `spread` distinct topology spread
/// constraints.
fn scheduling(s: &mut Subject, tolerations: usize, spread: usize) {
    use k8s_openapi::api::core::v1::{Toleration, TopologySpreadConstraint};
    let toleration = |i| Toleration {
        key: Some(format!("example.com/taint-{i}")),
        operator: Some("Exists".into()),
        ..Toleration::default()
    };
    let constraint = |i| TopologySpreadConstraint {
        max_skew: 1,
        topology_key: format!("example.com/zone-{i}"),
        when_unsatisfiable: "ScheduleAnyway".into(),
        ..TopologySpreadConstraint::default()
    };
    s.spec.proxy = Some(ProxySpec {
        tolerations: Some((0..tolerations).map(toleration).collect()),
        topology_spread_constraints: Some((0..spread).map(constraint).collect()),
        ..ProxySpec::default()
    });
}

/// Texts that are not quantities, one for each part of the form: no digit, two dots, two signs,
/// an exponent without digits or with others, an unknown suffix, and 65 bytes.
fn not_quantities() -> Vec<String> {
    let short = ["", ".", "1.2.3", "+-1", "1e", "1e+", "1ex", "1Q"].map(String::from);
    short.into_iter().chain([format!("{}m", "1".repeat(64))]).collect()
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
            "an image with a space under an allowed prefix",
            |s| {
                s.allowed_images = vec!["registry.example.com/nginx/".into()];
                image(s, "registry.example.com/nginx/stream 1.27");
            },
            strings![
                "spec.proxy.image: must be an image reference without spaces, got \"registry.example.com/nginx/stream 1.27\""
            ],
            vec![],
        ),
        case(
            "as many tolerations and spread constraints as allowed",
            |s| scheduling(s, MAX_TOLERATIONS, MAX_SPREAD_CONSTRAINTS),
            vec![],
            vec![],
        ),
        case(
            "one toleration and one spread constraint too many (past the CRD's bounds)",
            |s| scheduling(s, MAX_TOLERATIONS + 1, MAX_SPREAD_CONSTRAINTS + 1),
            strings![
                "spec.proxy.tolerations: must have at most 32 tolerations, got 33",
                "spec.proxy.topologySpreadConstraints: must have at most 8 constraints, got 9",
            ],
            vec![],
        ),
        case(
            "quantities: a decimal number, an optional sign, an SI, binary or exponent suffix, 64 bytes at most",
            |s| {
                let valid = ["1", "+1", "-1", "1.5", ".5", "5.", "100m", "64Mi", "1G", "12Ei", "1e3", "1E-3", "1e+3"];
                let valid = valid.into_iter().map(String::from).chain([format!("{}m", "1".repeat(63))]);
                let requests = valid.enumerate().map(|(i, q)| (format!("q{i:02}"), Quantity(q))).collect();
                let invalid = not_quantities().into_iter().enumerate();
                let limits = invalid.map(|(i, q)| (format!("q{i:02}"), Quantity(q))).collect();
                let resources = ResourceRequirements { requests: Some(requests), limits: Some(limits), ..Default::default() };
                s.spec.proxy = Some(ProxySpec { resources: Some(resources), ..ProxySpec::default() });
            },
            not_quantities()
                .iter()
                .enumerate()
                .map(|(i, q)| {
                    format!("spec.proxy.resources.limits[q{i:02}]: must be a quantity such as 100m, 1, 64Mi or 1G, got {q:?}")
                })
                .collect(),
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

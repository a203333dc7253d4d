//! `spec.proxy`: the proxy pods' settings, image prefixes and annotations.

use std::collections::BTreeMap;

use balancer::api::v1beta1::{FrontService, ProxySpec};

use super::table::{Subject, case, labels, run, strings};

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

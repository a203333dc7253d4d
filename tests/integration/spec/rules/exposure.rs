//! The front Service's exposure, its load balancer class, and the PROXY protocol.

use balancer::api::MAX_SOURCE_RANGES;
use balancer::api::v1beta1::FrontService;

use super::table::{case, labels, named, port, run, sample, strings};

/// A LoadBalancer `spec.service` allowing `count` distinct CIDRs.
fn load_balancer_with_ranges(count: usize) -> Option<FrontService> {
    let ranges = (0..count).map(|i| format!("10.{i}.0.0/16")).collect();
    Some(FrontService { load_balancer_source_ranges: Some(ranges), ..service("LoadBalancer")? })
}

/// A `spec.service` of `type_` with everything else unset.
pub(super) fn service(type_: &str) -> Option<FrontService> {
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
            "as many source ranges as allowed",
            |s| s.spec.service = load_balancer_with_ranges(MAX_SOURCE_RANGES),
            vec![],
            vec![],
        ),
        case(
            "one source range too many (past the CRD's bound)",
            |s| s.spec.service = load_balancer_with_ranges(MAX_SOURCE_RANGES + 1),
            strings!["spec.service.loadBalancerSourceRanges: must have at most 64 CIDRs, got 65"],
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
            "64 annotations, each of 4096 bytes at most, 64 KiB in all",
            |s| {
                // 64 keys of 15 bytes, and values of 15 × 4096 + 3136 bytes: 65,536 bytes in all.
                let value = |i: usize| match i {
                    0..15 => 4096,
                    15 => 3136,
                    _ => 0,
                };
                let annotations: std::collections::BTreeMap<String, String> =
                    (0..64).map(|i| (format!("example.com/a{i:02}"), "x".repeat(value(i)))).collect();
                s.spec.service = Some(FrontService { annotations: Some(annotations), ..FrontService::default() });
            },
            vec![],
            vec![],
        ),
        case(
            "one byte over 64 KiB of annotations in all",
            |s| {
                let annotations = (0..16)
                    .map(|i| (format!("example.com/a{i:02}"), "x".repeat(if i == 0 { 3857 } else { 4096 })))
                    .collect();
                s.spec.service = Some(FrontService { annotations: Some(annotations), ..FrontService::default() });
            },
            strings!["spec.service.annotations: must be at most 65536 bytes in all (keys and values), got 65537"],
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

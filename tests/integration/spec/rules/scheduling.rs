//! `spec.proxy`'s scheduling fields under the operator's policy: any by default (the guide's
//! examples keep working), and refused field by field outside a policy the administrator set.

use balancer::api::v1beta1::ProxySpec;
use balancer::spec::SchedulingPolicy;
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm,
    Toleration,
};

use super::table::{Subject, case, labels, run, strings};

/// A strict policy, as docs/security.md recommends: the proxy's own priority class, nodes by
/// zone and by a pool label, the pool's taint, and Prometheus's annotations.
fn strict() -> SchedulingPolicy {
    SchedulingPolicy {
        priority_classes: Some(vec!["balancer-proxy".into()]),
        node_label_keys: Some(vec!["topology.kubernetes.io/zone".into(), "example.com/pool".into()]),
        toleration_keys: Some(vec!["example.com/pool".into()]),
        pod_annotation_prefixes: Some(vec!["prometheus.io/".into()]),
    }
}

fn toleration(key: Option<&str>) -> Toleration {
    Toleration { key: key.map(str::to_string), operator: Some("Exists".into()), ..Toleration::default() }
}

fn requirement(key: &str) -> NodeSelectorRequirement {
    NodeSelectorRequirement { key: key.into(), operator: "Exists".into(), values: None }
}

/// Every scheduling field, each naming what `names` says.
fn everything(s: &mut Subject, names: [&str; 4]) {
    let [class, node_key, taint, annotation] = names;
    let term = NodeSelectorTerm { match_expressions: Some(vec![requirement(node_key)]), match_fields: None };
    let affinity = Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![term.clone()],
            }),
            preferred_during_scheduling_ignored_during_execution: Some(vec![PreferredSchedulingTerm {
                weight: 1,
                preference: term,
            }]),
        }),
        ..Affinity::default()
    };
    s.spec.proxy = Some(ProxySpec {
        priority_class_name: Some(class.into()),
        node_selector: Some(labels(&[(node_key, "a")])),
        tolerations: Some(vec![toleration(Some(taint))]),
        affinity: Some(affinity),
        pod_annotations: Some(labels(&[(annotation, "x")])),
        ..ProxySpec::default()
    });
}

#[test]
fn scheduling_rules() {
    run(vec![
        case(
            "anything, with no policy",
            |s| {
                everything(
                    s,
                    [
                        "system-node-critical",
                        "node-role.kubernetes.io/control-plane",
                        "node-role.kubernetes.io/control-plane",
                        "container.apparmor.security.beta.kubernetes.io/nginx",
                    ],
                )
            },
            vec![],
            vec![],
        ),
        case(
            "within a strict policy",
            |s| {
                s.scheduling = strict();
                everything(s, ["balancer-proxy", "example.com/pool", "example.com/pool", "prometheus.io/scrape"]);
            },
            vec![],
            vec![],
        ),
        case(
            "outside a strict policy, field by field",
            |s| {
                s.scheduling = strict();
                everything(
                    s,
                    [
                        "system-node-critical",
                        "node-role.kubernetes.io/control-plane",
                        "node.kubernetes.io/unschedulable",
                        "container.apparmor.security.beta.kubernetes.io/nginx",
                    ],
                );
            },
            strings![
                "spec.proxy.priorityClassName: is not one of the priority classes the operator allows \
                 (--allowed-priority-classes): \"balancer-proxy\"; got \"system-node-critical\"",
                "spec.proxy.nodeSelector[node-role.kubernetes.io/control-plane]: is not one of the node label keys \
                 the operator allows (--allowed-node-label-keys): \"topology.kubernetes.io/zone\", \
                 \"example.com/pool\"; got \"node-role.kubernetes.io/control-plane\"",
                "spec.proxy.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key: \
                 is not one of the node label keys the operator allows (--allowed-node-label-keys): \
                 \"topology.kubernetes.io/zone\", \"example.com/pool\"; got \"node-role.kubernetes.io/control-plane\"",
                "spec.proxy.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference.matchExpressions[0].key: \
                 is not one of the node label keys the operator allows (--allowed-node-label-keys): \
                 \"topology.kubernetes.io/zone\", \"example.com/pool\"; got \"node-role.kubernetes.io/control-plane\"",
                "spec.proxy.tolerations[0].key: tolerates a taint key that is not one of those the operator allows \
                 (--allowed-toleration-keys): \"example.com/pool\"; got \"node.kubernetes.io/unschedulable\"",
                "spec.proxy.podAnnotations[container.apparmor.security.beta.kubernetes.io/nginx]: does not start \
                 with one of the pod annotation prefixes the operator allows (--allowed-pod-annotation-prefixes): \
                 \"prometheus.io/\"; got \"container.apparmor.security.beta.kubernetes.io/nginx\"",
            ],
            vec![],
        ),
        case(
            "a toleration of every taint needs *",
            |s| {
                s.scheduling = SchedulingPolicy {
                    toleration_keys: Some(vec!["example.com/pool".into()]),
                    ..SchedulingPolicy::ANY
                };
                s.spec.proxy = Some(ProxySpec {
                    tolerations: Some(vec![toleration(None), toleration(Some(""))]),
                    ..ProxySpec::default()
                });
            },
            strings![
                "spec.proxy.tolerations[0].key: tolerates a taint key that is not one of those the operator allows \
                 (--allowed-toleration-keys): \"example.com/pool\"; got \"*\"",
                "spec.proxy.tolerations[1].key: tolerates a taint key that is not one of those the operator allows \
                 (--allowed-toleration-keys): \"example.com/pool\"; got \"*\"",
            ],
            vec![],
        ),
        case(
            "an empty list allows none",
            |s| {
                s.scheduling = SchedulingPolicy { priority_classes: Some(vec![]), ..SchedulingPolicy::ANY };
                s.spec.proxy = Some(ProxySpec {
                    priority_class_name: Some("system-cluster-critical".into()),
                    ..ProxySpec::default()
                });
            },
            strings![
                "spec.proxy.priorityClassName: is not one of the priority classes the operator allows \
                 (--allowed-priority-classes): none; got \"system-cluster-critical\""
            ],
            vec![],
        ),
        case(
            "a matchFields term names a field, allowed like a label key",
            |s| {
                s.scheduling = SchedulingPolicy {
                    node_label_keys: Some(vec!["topology.kubernetes.io/zone".into()]),
                    ..SchedulingPolicy::ANY
                };
                let term = NodeSelectorTerm {
                    match_expressions: None,
                    match_fields: Some(vec![requirement("metadata.name")]),
                };
                s.spec.proxy = Some(ProxySpec {
                    affinity: Some(Affinity {
                        node_affinity: Some(NodeAffinity {
                            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                                node_selector_terms: vec![term],
                            }),
                            ..NodeAffinity::default()
                        }),
                        ..Affinity::default()
                    }),
                    ..ProxySpec::default()
                });
            },
            strings![
                "spec.proxy.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].key: \
                 is not one of the node label keys the operator allows (--allowed-node-label-keys): \
                 \"topology.kubernetes.io/zone\"; got \"metadata.name\""
            ],
            vec![],
        ),
    ]);
}

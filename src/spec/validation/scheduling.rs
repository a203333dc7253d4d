//! `spec.proxy`'s scheduling fields under the administrator's policy ([`SchedulingPolicy`]):
//! the priority class, the node labels a selector or node affinity uses, the taints tolerated,
//! and the pod annotations. Each refusal names the field and what the operator allows.

use k8s_openapi::api::core::v1::{NodeSelectorTerm, Toleration};

use crate::api::v1beta1::ProxySpec;
use crate::spec::policy::SchedulingPolicy;
use crate::spec::report::Report;
use crate::util::echo::{MAX_QUOTED_BYTES, cut, quoted};

/// The toleration key that allows a toleration without a key (one that tolerates every taint).
pub const ANY_TAINT: &str = "*";

/// Checks `proxy`'s scheduling fields against `policy`.
pub(super) fn validate_scheduling(proxy: &ProxySpec, policy: &SchedulingPolicy, report: &mut Report) {
    if let (Some(class), Some(allowed)) = (&proxy.priority_class_name, &policy.priority_classes)
        && !allowed.contains(class)
    {
        report.error(
            "spec.proxy.priorityClassName",
            refusal(class, "is not one of the priority classes", "--allowed-priority-classes", allowed),
        );
    }
    if let Some(allowed) = &policy.node_label_keys {
        for key in proxy.node_selector.iter().flatten().map(|(key, _)| key).filter(|k| !allowed.contains(k)) {
            let at = format!("spec.proxy.nodeSelector[{}]", cut(key, MAX_QUOTED_BYTES));
            report.error(at, refusal(key, NODE_LABEL_KEYS, "--allowed-node-label-keys", allowed));
        }
        for (at, key) in node_affinity_keys(proxy).into_iter().filter(|(_, k)| !allowed.contains(k)) {
            report.error(at, refusal(&key, NODE_LABEL_KEYS, "--allowed-node-label-keys", allowed));
        }
    }
    if let Some(allowed) = &policy.toleration_keys {
        for (i, toleration) in proxy.tolerations.iter().flatten().enumerate() {
            let key = tolerated(toleration);
            if !allowed.iter().any(|a| a == key) {
                let at = format!("spec.proxy.tolerations[{i}].key");
                report.error(
                    at,
                    refusal(
                        key,
                        "tolerates a taint key that is not one of those",
                        "--allowed-toleration-keys",
                        allowed,
                    ),
                );
            }
        }
    }
    if let Some(allowed) = &policy.pod_annotation_prefixes {
        for key in proxy.pod_annotations.iter().flatten().map(|(key, _)| key) {
            if !allowed.iter().any(|prefix| key.starts_with(prefix.as_str())) {
                let at = format!("spec.proxy.podAnnotations[{}]", cut(key, MAX_QUOTED_BYTES));
                let what = "does not start with one of the pod annotation prefixes";
                report.error(at, refusal(key, what, "--allowed-pod-annotation-prefixes", allowed));
            }
        }
    }
}

/// The taint key a toleration tolerates: [`ANY_TAINT`] for one without a key.
fn tolerated(toleration: &Toleration) -> &str {
    toleration.key.as_deref().filter(|k| !k.is_empty()).unwrap_or(ANY_TAINT)
}

/// Every node label key (and `matchFields` field) the node affinity's terms use, with its path.
fn node_affinity_keys(proxy: &ProxySpec) -> Vec<(String, String)> {
    let Some(node) = proxy.affinity.as_ref().and_then(|a| a.node_affinity.as_ref()) else { return Vec::new() };
    let base = "spec.proxy.affinity.nodeAffinity";
    let required = node.required_during_scheduling_ignored_during_execution.iter().flat_map(|r| {
        let at = format!("{base}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms");
        r.node_selector_terms.iter().enumerate().map(move |(i, term)| (format!("{at}[{i}]"), term))
    });
    let preferred =
        node.preferred_during_scheduling_ignored_during_execution.iter().flatten().enumerate().map(|(i, p)| {
            (format!("{base}.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference"), &p.preference)
        });
    required.chain(preferred).flat_map(|(at, term)| term_keys(&at, term)).collect()
}

fn term_keys(at: &str, term: &NodeSelectorTerm) -> Vec<(String, String)> {
    let expressions = term.match_expressions.iter().flatten().enumerate();
    let fields = term.match_fields.iter().flatten().enumerate();
    expressions
        .map(|(i, e)| (format!("{at}.matchExpressions[{i}].key"), e.key.clone()))
        .chain(fields.map(|(i, f)| (format!("{at}.matchFields[{i}].key"), f.key.clone())))
        .collect()
}

const NODE_LABEL_KEYS: &str = "is not one of the node label keys";

/// "<what> the operator allows (--flag): "a", "b"; got "x"" (or "none" allowed).
fn refusal(value: &str, what: &str, flag: &str, allowed: &[String]) -> String {
    let allowed = if allowed.is_empty() {
        "none".to_string()
    } else {
        allowed.iter().map(|a| quoted(a)).collect::<Vec<_>>().join(", ")
    };
    format!("{what} the operator allows ({flag}): {allowed}; got {}", quoted(value))
}

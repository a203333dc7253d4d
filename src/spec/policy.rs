//! What the operator's configuration, rather than the API, decides about every spec.

/// What the operator's configuration, rather than the API, decides about every spec: the
/// default `spec.replicas`, which `spec.proxy.image`s a Balancer may choose, and where and how
/// its proxy pods may be scheduled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecPolicy {
    /// `spec.replicas` when a Balancer does not say (`--proxy-replicas`).
    pub replicas: i32,
    /// Prefixes a per-Balancer proxy image must start with (`--allowed-proxy-images`); none
    /// allows no per-Balancer image: anyone who may edit a Balancer could otherwise run any
    /// image in the proxy pods.
    pub allowed_images: Vec<String>,
    /// What `spec.proxy`'s scheduling fields may say.
    pub scheduling: SchedulingPolicy,
}

impl SpecPolicy {
    /// One proxy pod, no per-Balancer image, and any scheduling.
    pub const DEFAULT: SpecPolicy =
        SpecPolicy { replicas: 1, allowed_images: Vec::new(), scheduling: SchedulingPolicy::ANY };
}

impl Default for SpecPolicy {
    fn default() -> Self {
        SpecPolicy::DEFAULT
    }
}

/// What `spec.proxy`'s scheduling fields may say, as the administrator decides: where tenants
/// may create Balancers but not pods, these fields are how they would place pods on the
/// control plane, tolerate any taint or run unconfined. Each list is `None` when anything goes
/// (the default, which keeps every documented example working), and may be empty to allow none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchedulingPolicy {
    /// The PriorityClasses `spec.proxy.priorityClassName` may name (`--allowed-priority-classes`).
    pub priority_classes: Option<Vec<String>>,
    /// The node label keys `spec.proxy.nodeSelector` and the node affinity's terms may use
    /// (`--allowed-node-label-keys`; `metadata.name` for a term's `matchFields`).
    pub node_label_keys: Option<Vec<String>>,
    /// The taint keys `spec.proxy.tolerations` may tolerate (`--allowed-toleration-keys`); a
    /// toleration without a key, which tolerates every taint, needs `*`.
    pub toleration_keys: Option<Vec<String>>,
    /// The prefixes `spec.proxy.podAnnotations`' keys must start with
    /// (`--allowed-pod-annotation-prefixes`).
    pub pod_annotation_prefixes: Option<Vec<String>>,
}

impl SchedulingPolicy {
    /// Anything goes.
    pub const ANY: SchedulingPolicy = SchedulingPolicy {
        priority_classes: None,
        node_label_keys: None,
        toleration_keys: None,
        pod_annotation_prefixes: None,
    };
}

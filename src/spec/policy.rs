//! What the operator's configuration, rather than the API, decides about every spec.

/// What the operator's configuration, rather than the API, decides about every spec: the
/// default `spec.replicas`, and which `spec.proxy.image`s a Balancer may choose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecPolicy {
    /// `spec.replicas` when a Balancer does not say (`--proxy-replicas`).
    pub replicas: i32,
    /// Prefixes a per-Balancer proxy image must start with (`--allowed-proxy-images`); none
    /// allows no per-Balancer image: anyone who may edit a Balancer could otherwise run any
    /// image in the proxy pods.
    pub allowed_images: Vec<String>,
}

impl SpecPolicy {
    /// One proxy pod, and no per-Balancer image.
    pub const DEFAULT: SpecPolicy = SpecPolicy { replicas: 1, allowed_images: Vec::new() };
}

impl Default for SpecPolicy {
    fn default() -> Self {
        SpecPolicy::DEFAULT
    }
}

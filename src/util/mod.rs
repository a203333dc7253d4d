//! Small helpers every layer may use; they know nothing of Balancers or Kubernetes.

pub mod bounded;
pub mod echo;
pub mod hash;
pub mod token_bucket;

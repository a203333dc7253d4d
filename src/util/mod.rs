//! Small helpers every layer may use; they know nothing of Balancers or Kubernetes.

pub(crate) mod arith;
pub(crate) mod bounded;
pub(crate) mod echo;
pub(crate) mod hash;
pub(crate) mod token_bucket;

//! The runtime layer: certificate rotation and the protected metrics endpoint's token reviews.

mod cert_rotation;
mod metrics_auth;

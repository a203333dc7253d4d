//! One hash for everything balancer fingerprints: rendered configs and desired children.

use std::fmt::Write as _;

/// SHA-256 of `text`, in lowercase hex.
pub(crate) fn sha256_hex(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().fold(String::with_capacity(64), |mut hex, byte| {
        let _ = write!(hex, "{byte:02x}");
        hex
    })
}

//! The operator's signature on each proxy configuration, so that a proxy applies only what the
//! operator made for its Balancer.
//!
//! Whoever may write ConfigMaps in a Balancer's namespace (a CI bot, a GitOps tool) can write
//! the proxy's ConfigMap. Its `nginx.conf` and model are therefore signed (Ed25519) by the
//! operator, whose private key stays in its own namespace, and the metrics sidecar applies a
//! configuration only when the signature holds for its own namespace and Balancer. The public
//! key reaches the sidecar in the pod template ([`CONFIG_KEY_ENV`]), which only those who may
//! write workloads change.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};

/// The ConfigMap key holding the signature (base64) beside `nginx.conf` and its model.
pub const SIGNATURE_FILE: &str = "signature";

/// The environment variable that gives the metrics sidecar the operator's public key (base64).
pub const CONFIG_KEY_ENV: &str = "BALANCER_CONFIG_KEY";

/// What is signed: a version and purpose, then the Balancer and the SHA-256 of each file, each
/// field ended by a NUL (no name holds one), so no two configurations share a message.
fn message(namespace: &str, balancer: &str, nginx_conf: &str, model: &str) -> Vec<u8> {
    let digest = |text: &str| ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut message = b"balancer proxy configuration v1\0".to_vec();
    for field in [namespace.as_bytes(), balancer.as_bytes(), digest(nginx_conf).as_ref(), digest(model).as_ref()] {
        message.extend_from_slice(field);
        message.push(0);
    }
    message
}

/// Why a signing key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The bytes are not an Ed25519 private key in PKCS#8.
    #[error("not an Ed25519 private key in PKCS#8: {0}")]
    Private(String),
    /// The text is not a base64 Ed25519 public key.
    #[error("not an Ed25519 public key in base64 (32 bytes)")]
    Public,
    /// No key could be generated.
    #[error("cannot generate an Ed25519 key")]
    Generate,
}

/// The operator's signing key.
#[derive(Clone)]
pub struct ConfigSigner {
    key_pair: Arc<Ed25519KeyPair>,
}

impl ConfigSigner {
    /// A signer from a PKCS#8 document, as [`ConfigSigner::generate`] gives.
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<ConfigSigner, KeyError> {
        let key_pair = Ed25519KeyPair::from_pkcs8(pkcs8).map_err(|e| KeyError::Private(e.to_string()))?;
        Ok(ConfigSigner { key_pair: Arc::new(key_pair) })
    }

    /// A new key, as a PKCS#8 document to keep.
    pub fn generate() -> Result<Vec<u8>, KeyError> {
        let random = ring::rand::SystemRandom::new();
        Ed25519KeyPair::generate_pkcs8(&random).map(|doc| doc.as_ref().to_vec()).map_err(|_| KeyError::Generate)
    }

    /// The public key the proxies check signatures with.
    pub fn public_key(&self) -> ConfigKey {
        let mut bytes = [0; 32];
        bytes.copy_from_slice(self.key_pair.public_key().as_ref());
        ConfigKey(bytes)
    }

    /// The signature (base64) of a configuration of `balancer` in `namespace`.
    pub fn sign(&self, namespace: &str, balancer: &str, nginx_conf: &str, model: &str) -> String {
        STANDARD.encode(self.key_pair.sign(&message(namespace, balancer, nginx_conf, model)))
    }
}

impl fmt::Debug for ConfigSigner {
    /// The public key only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigSigner").field("public_key", &self.public_key()).finish()
    }
}

/// The operator's public key, as the proxies hold it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ConfigKey([u8; 32]);

impl ConfigKey {
    /// Whether `signature` (base64) is the operator's for this configuration of `balancer` in
    /// `namespace`.
    pub fn verifies(&self, namespace: &str, balancer: &str, nginx_conf: &str, model: &str, signature: &str) -> bool {
        let Ok(signature) = STANDARD.decode(signature.trim()) else { return false };
        let message = message(namespace, balancer, nginx_conf, model);
        UnparsedPublicKey::new(&ED25519, &self.0).verify(&message, &signature).is_ok()
    }
}

impl fmt::Display for ConfigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&STANDARD.encode(self.0))
    }
}

impl fmt::Debug for ConfigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConfigKey({self})")
    }
}

impl FromStr for ConfigKey {
    type Err = KeyError;

    fn from_str(text: &str) -> Result<ConfigKey, KeyError> {
        let bytes = STANDARD.decode(text.trim()).map_err(|_| KeyError::Public)?;
        bytes.try_into().map(ConfigKey).map_err(|_| KeyError::Public)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_signer() -> ConfigSigner {
        ConfigSigner::from_pkcs8(&ConfigSigner::generate().expect("a key")).expect("reads back")
    }

    #[test]
    fn a_signature_holds_only_for_its_balancer_and_files() {
        let signer = new_signer();
        let key = signer.public_key();
        let signature = signer.sign("ns", "lb", "conf", "model");
        assert!(key.verifies("ns", "lb", "conf", "model", &signature));
        for (namespace, balancer, conf, model) in [
            ("other", "lb", "conf", "model"),
            ("ns", "other", "conf", "model"),
            ("ns", "lb", "conf ", "model"),
            ("ns", "lb", "conf", "model "),
            // The fields cannot be shifted into each other.
            ("n", "slb", "conf", "model"),
        ] {
            assert!(!key.verifies(namespace, balancer, conf, model, &signature), "{namespace}/{balancer}");
        }
        assert!(!new_signer().public_key().verifies("ns", "lb", "conf", "model", &signature), "another key");
        for forged in ["", "not base64!", &STANDARD.encode([0u8; 64])] {
            assert!(!key.verifies("ns", "lb", "conf", "model", forged), "{forged:?}");
        }
    }

    #[test]
    fn the_public_key_reads_back_from_its_text() {
        let key = new_signer().public_key();
        assert_eq!(key.to_string().parse::<ConfigKey>().expect("reads"), key);
        assert!("c2hvcnQ=".parse::<ConfigKey>().is_err(), "too short");
        assert!("%%%".parse::<ConfigKey>().is_err());
        assert!(ConfigSigner::from_pkcs8(b"not a key").is_err());
        assert!(!format!("{:?}", new_signer()).contains("key_pair"), "the private key is never printed");
    }
}

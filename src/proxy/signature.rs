//! The operator's signature on each proxy configuration, so that a proxy applies only what the
//! operator made for its owner, and never an older one.
//!
//! Whoever may write ConfigMaps in a Balancer's namespace (a CI bot, a GitOps tool) can write
//! the proxy's ConfigMap. Its `nginx.conf` and model are therefore signed (Ed25519) by the
//! operator, whose private key stays in its own namespace, and the metrics sidecar applies a
//! configuration only when the signature holds for its own namespace and owner. The public
//! key reaches the sidecar in the pod template ([`CONFIG_KEY_ENV`]), which only those who may
//! write workloads change.
//!
//! A signature is bound, as TUF and Kubernetes' bound tokens bind theirs, to its subject's
//! identity and to a version: the owner's UID (so a deleted namesake's configuration does not
//! pass for a new one's) and a [`sequence`](SEQUENCE_FILE) that the sidecar never lets go
//! backwards (so an earlier configuration of the same owner, written back, is refused).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};

use super::model::MODEL_FILE;
use super::nginx::CONFIG_FILE;

/// The ConfigMap key holding the signature (base64) beside `nginx.conf` and its model.
pub const SIGNATURE_FILE: &str = "signature";

/// The ConfigMap key holding the configuration's sequence (decimal): the millisecond, by the
/// operator's clock, at which it was first signed; kept while the configuration does not change.
pub const SEQUENCE_FILE: &str = "sequence";

/// The environment variable that gives the metrics sidecar the operator's public key (base64).
pub const CONFIG_KEY_ENV: &str = "BALANCER_CONFIG_KEY";

/// Whose configuration it is: the proxy's namespace, and its owner's identity
/// ([`ProxyConfig::identity`](super::model::ProxyConfig::identity)) and UID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subject<'a> {
    /// The proxy's namespace.
    pub namespace: &'a str,
    /// A Balancer's name, or `Gateway/<name>`.
    pub owner: &'a str,
    /// The owner's `metadata.uid`.
    pub uid: &'a str,
}

/// What is signed: a version and purpose, the subject, the sequence and the SHA-256 of each file,
/// each field ended by a NUL (no name holds one), so no two configurations share a message.
fn message(subject: &Subject<'_>, sequence: u64, nginx_conf: &str, model: &str) -> Vec<u8> {
    let digest = |text: &str| ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut message = b"balancer proxy configuration v2\0".to_vec();
    let sequence = sequence.to_string();
    for field in [
        subject.namespace.as_bytes(),
        subject.owner.as_bytes(),
        subject.uid.as_bytes(),
        sequence.as_bytes(),
        digest(nginx_conf).as_ref(),
        digest(model).as_ref(),
    ] {
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

    /// The signature (base64) of a configuration of `subject` at `sequence`.
    pub fn sign(&self, subject: &Subject<'_>, sequence: u64, nginx_conf: &str, model: &str) -> String {
        STANDARD.encode(self.key_pair.sign(&message(subject, sequence, nginx_conf, model)))
    }

    /// Signs the configuration in a proxy ConfigMap's `data` for `subject`: adds its
    /// [`SEQUENCE_FILE`] and [`SIGNATURE_FILE`]; returns the sequence. `current` is the
    /// ConfigMap's data as it is, and `signed` the newest sequence this operator signed for the
    /// subject (0 when it knows none). When `current` holds the same files under a signature
    /// that holds, at `signed` or later, its sequence is kept, so that an unchanged
    /// configuration is not written again; otherwise the sequence is `now_ms`, or one past the
    /// current one's and `signed` should the clock be behind them (a cache that has not seen the
    /// last write, an earlier configuration written back).
    pub fn seal(
        &self,
        data: &mut BTreeMap<String, String>,
        subject: &Subject<'_>,
        current: Option<&BTreeMap<String, String>>,
        signed: u64,
        now_ms: u64,
    ) -> u64 {
        let key = self.public_key();
        let sealed = current.and_then(|current| Some((current, key.sealed_sequence(current, subject)?)));
        let next = |after: u64| now_ms.max(after.max(signed).saturating_add(1));
        let sequence = match sealed {
            Some((current, sequence)) if same_files(current, data) && sequence >= signed => sequence,
            Some((_, sequence)) => next(sequence),
            None if signed > 0 => next(signed),
            None => now_ms,
        };
        let file = |name: &str| data.get(name).map(String::as_str).unwrap_or_default();
        let signature = self.sign(subject, sequence, file(CONFIG_FILE), file(MODEL_FILE));
        data.insert(SEQUENCE_FILE.to_string(), sequence.to_string());
        data.insert(SIGNATURE_FILE.to_string(), signature);
        sequence
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
    /// Whether `signature` (base64) is the operator's for this configuration of `subject` at
    /// `sequence`.
    pub fn verifies(
        &self,
        subject: &Subject<'_>,
        sequence: u64,
        nginx_conf: &str,
        model: &str,
        signature: &str,
    ) -> bool {
        let Ok(signature) = STANDARD.decode(signature.trim()) else { return false };
        let message = message(subject, sequence, nginx_conf, model);
        UnparsedPublicKey::new(&ED25519, &self.0).verify(&message, &signature).is_ok()
    }

    /// The sequence of the configuration in a proxy ConfigMap's `data`, when the operator
    /// signed it for `subject`; `None` when a file is missing or the signature does not hold.
    pub fn sealed_sequence(&self, data: &BTreeMap<String, String>, subject: &Subject<'_>) -> Option<u64> {
        let (conf, model) = (data.get(CONFIG_FILE)?, data.get(MODEL_FILE)?);
        let sequence = data.get(SEQUENCE_FILE)?.trim().parse().ok()?;
        self.verifies(subject, sequence, conf, model, data.get(SIGNATURE_FILE)?).then_some(sequence)
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

/// Whether two ConfigMaps' data hold the same `nginx.conf` and model.
pub fn same_files(one: &BTreeMap<String, String>, other: &BTreeMap<String, String>) -> bool {
    [CONFIG_FILE, MODEL_FILE].iter().all(|name| one.get(*name) == other.get(*name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_signer() -> ConfigSigner {
        ConfigSigner::from_pkcs8(&ConfigSigner::generate().expect("a key")).expect("reads back")
    }

    const SUBJECT: Subject<'static> = Subject { namespace: "ns", owner: "lb", uid: "uid-1" };

    #[test]
    fn a_signature_holds_only_for_its_subject_sequence_and_files() {
        let signer = new_signer();
        let key = signer.public_key();
        let signature = signer.sign(&SUBJECT, 7, "conf", "model");
        assert!(key.verifies(&SUBJECT, 7, "conf", "model", &signature));
        let subject = |namespace, owner, uid| Subject { namespace, owner, uid };
        for (subject, sequence, conf, model) in [
            (subject("other", "lb", "uid-1"), 7, "conf", "model"),
            (subject("ns", "other", "uid-1"), 7, "conf", "model"),
            (subject("ns", "lb", "uid-2"), 7, "conf", "model"),
            (SUBJECT, 6, "conf", "model"),
            (SUBJECT, 8, "conf", "model"),
            (SUBJECT, 7, "conf ", "model"),
            (SUBJECT, 7, "conf", "model "),
            // The fields cannot be shifted into each other.
            (subject("n", "slb", "uid-1"), 7, "conf", "model"),
            (subject("ns", "lbu", "id-1"), 7, "conf", "model"),
        ] {
            assert!(!key.verifies(&subject, sequence, conf, model, &signature), "{subject:?} {sequence}");
        }
        assert!(!new_signer().public_key().verifies(&SUBJECT, 7, "conf", "model", &signature), "another key");
        for forged in ["", "not base64!", &STANDARD.encode([0u8; 64])] {
            assert!(!key.verifies(&SUBJECT, 7, "conf", "model", forged), "{forged:?}");
        }
    }

    fn files(conf: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(CONFIG_FILE.to_string(), conf.to_string()), (MODEL_FILE.to_string(), "{}".to_string())])
    }

    #[test]
    fn a_sealed_configuration_keeps_its_sequence_until_it_changes_and_never_goes_back() {
        let signer = new_signer();
        let key = signer.public_key();
        let mut first = files("one");
        signer.seal(&mut first, &SUBJECT, None, 0, 1_000);
        assert_eq!(key.sealed_sequence(&first, &SUBJECT), Some(1_000));
        let mut again = files("one");
        signer.seal(&mut again, &SUBJECT, Some(&first), 1_000, 5_000);
        assert_eq!(again, first, "unchanged: the same sequence and signature, nothing to write");
        let mut changed = files("two");
        signer.seal(&mut changed, &SUBJECT, Some(&first), 1_000, 5_000);
        assert_eq!(key.sealed_sequence(&changed, &SUBJECT), Some(5_000), "the clock's");
        let mut behind = files("three");
        signer.seal(&mut behind, &SUBJECT, Some(&changed), 5_000, 10);
        assert_eq!(key.sealed_sequence(&behind, &SUBJECT), Some(5_001), "a clock behind: one past the current");
        // A sequence nobody signed (or signed for another owner) is no floor.
        let mut forged = changed.clone();
        forged.insert(SEQUENCE_FILE.into(), u64::MAX.to_string());
        assert_eq!(key.sealed_sequence(&forged, &SUBJECT), None);
        let mut after_forged = files("four");
        signer.seal(&mut after_forged, &SUBJECT, Some(&forged), 5_001, 6_000);
        assert_eq!(key.sealed_sequence(&after_forged, &SUBJECT), Some(6_000));
        // What this operator signed last is a floor too: a cache that has not seen that write,
        // or an earlier configuration with the wanted files written back, is signed past it.
        let mut stale = files("one");
        assert_eq!(signer.seal(&mut stale, &SUBJECT, Some(&first), 6_000, 10), 6_001, "the same files, re-signed");
        let mut unknown = files("five");
        assert_eq!(signer.seal(&mut unknown, &SUBJECT, None, 6_001, 10), 6_002, "no ConfigMap cached");
        let namesake = Subject { uid: "uid-2", ..SUBJECT };
        assert_eq!(key.sealed_sequence(&after_forged, &namesake), None, "a namesake's");
        for missing in [CONFIG_FILE, MODEL_FILE, SEQUENCE_FILE, SIGNATURE_FILE] {
            let mut data = after_forged.clone();
            data.remove(missing);
            assert_eq!(key.sealed_sequence(&data, &SUBJECT), None, "without {missing}");
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

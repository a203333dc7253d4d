//! Serving certificates: loading, hot reload, and generation for dev and for
//! clusters without cert-manager.
//!
//! cert-manager rotates the Secret behind `--tls-cert`/`--tls-key` in place; a
//! [`CertWatcher`] polls the files and swaps the certificate used for new
//! handshakes, keeping the old one whenever the new files do not load.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

/// File names, matching the keys of a cert-manager / `kubernetes.io/tls` Secret.
pub const CA_FILE: &str = "ca.crt";
/// The certificate's file name in a certificate directory (a Secret's key).
pub const CERT_FILE: &str = "tls.crt";
/// The private key's file name there.
pub const KEY_FILE: &str = "tls.key";

#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} is not a PEM certificate chain: {reason}")]
    BadCertificate { path: PathBuf, reason: String },
    #[error("{path} is not a PEM private key: {reason}")]
    BadKey { path: PathBuf, reason: String },
    #[error("{key} does not belong to the certificate in {cert}: {reason}")]
    Mismatch { cert: PathBuf, key: PathBuf, reason: String },
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot configure TLS: {0}")]
    Config(#[from] rustls::Error),
    #[error("{path}: cannot read the certificate's validity: {reason}")]
    Validity { path: PathBuf, reason: String },
}

/// Where the serving certificate and key live.
#[derive(Debug, Clone)]
pub struct CertPaths {
    /// The PEM certificate chain.
    pub cert: PathBuf,
    /// The PEM private key.
    pub key: PathBuf,
}

/// The crypto provider used everywhere: ring, as the project standardises.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Loads a certificate chain and its private key, naming the file at fault on failure.
pub fn load_certified_key(paths: &CertPaths) -> Result<CertifiedKey, TlsError> {
    let cert_pem = read(&paths.cert)?;
    let key_pem = read(&paths.key)?;
    certified_key_from_pem(paths, &cert_pem, &key_pem)
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_path_buf(), source })
}

fn certified_key_from_pem(paths: &CertPaths, cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadCertificate { path: paths.cert.clone(), reason: e.to_string() })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: paths.cert.clone() });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| TlsError::BadKey { path: paths.key.clone(), reason: e.to_string() })?;
    let signing_key = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::BadKey { path: paths.key.clone(), reason: e.to_string() })?;
    let certified = CertifiedKey::new(chain, signing_key);
    certified.keys_match().map_err(|e| TlsError::Mismatch {
        cert: paths.cert.clone(),
        key: paths.key.clone(),
        reason: e.to_string(),
    })?;
    Ok(certified)
}

/// The leaf certificate's notAfter, as Unix seconds: what an expiry alert watches.
pub fn not_after(key: &CertifiedKey, path: &Path) -> Result<i64, TlsError> {
    let invalid = |reason: String| TlsError::Validity { path: path.to_path_buf(), reason };
    let leaf = key.cert.first().ok_or_else(|| invalid("no certificate".into()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).map_err(|e| invalid(e.to_string()))?;
    Ok(cert.validity().not_after.timestamp())
}

/// Hands every new handshake the certificate loaded most recently.
#[derive(Debug)]
pub struct CertResolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertResolver {
    /// A resolver that serves `initial` until it is replaced.
    pub fn new(initial: CertifiedKey) -> Self {
        CertResolver { current: RwLock::new(Arc::new(initial)) }
    }

    fn replace(&self, key: CertifiedKey) {
        // A poisoned lock only means a writer panicked mid-assignment of an Arc: the value is whole.
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        *current = Arc::new(key);
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// A rustls server config: TLS 1.2 and 1.3 only, HTTP/1.1 only, certificates from `resolver`.
///
/// HTTP/2 is not offered, as in controller-runtime's default webhook server:
/// it shields the webhook from HTTP/2 rapid-reset floods, and the API server
/// speaks HTTP/1.1 just as well.
pub fn server_config(resolver: Arc<CertResolver>) -> Result<ServerConfig, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Result of an attempt to load a changed certificate.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ReloadResult {
    /// The changed files were read, and their certificate is served now.
    Success,
    /// They could not be read or did not match; the previous certificate is still served.
    Failure,
}

impl EncodeLabelValue for ReloadResult {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        match self {
            ReloadResult::Success => "success",
            ReloadResult::Failure => "failure",
        }
        .encode(encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: ReloadResult,
}

/// The serving certificate: reloads and expiry.
pub struct TlsMetrics {
    reloads: Family<ReloadLabels, Counter>,
    certificate_expiry: Gauge,
}

impl TlsMetrics {
    /// Registers the certificate's series in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "tls_certificate_reloads",
            "Attempts to load a changed serving certificate, by result",
            reloads.clone(),
        );
        let certificate_expiry = Gauge::default();
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "When the serving certificate expires (notAfter), as a Unix time",
            certificate_expiry.clone(),
        );
        for result in [ReloadResult::Success, ReloadResult::Failure] {
            let _ = reloads.get_or_create(&ReloadLabels { result });
        }
        TlsMetrics { reloads, certificate_expiry }
    }

    /// Counts a reload of the certificate files.
    pub fn reloaded(&self, result: ReloadResult) {
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    /// Records when the served certificate expires, in seconds since the Unix epoch.
    pub fn set_certificate_expiry(&self, unix_seconds: i64) {
        self.certificate_expiry.set(unix_seconds);
    }
}

/// Polls the certificate files and swaps in changed ones that load.
pub struct CertWatcher {
    paths: CertPaths,
    resolver: Arc<CertResolver>,
    metrics: Arc<TlsMetrics>,
    /// Contents last seen, loaded or not, so a broken file is reported once, not every poll.
    last_seen: (Vec<u8>, Vec<u8>),
}

impl CertWatcher {
    /// Loads the files once; the server must not start without a certificate.
    pub fn start(paths: CertPaths, metrics: Arc<TlsMetrics>) -> Result<(Self, Arc<CertResolver>), TlsError> {
        let cert_pem = read(&paths.cert)?;
        let key_pem = read(&paths.key)?;
        let key = certified_key_from_pem(&paths, &cert_pem, &key_pem)?;
        metrics.set_certificate_expiry(not_after(&key, &paths.cert)?);
        let resolver = Arc::new(CertResolver::new(key));
        let watcher = CertWatcher { paths, resolver: resolver.clone(), metrics, last_seen: (cert_pem, key_pem) };
        Ok((watcher, resolver))
    }

    /// Checks the files once: reloads if they changed, keeps the old certificate if they are broken.
    pub fn poll(&mut self) {
        let (cert_pem, key_pem) = match (read(&self.paths.cert), read(&self.paths.key)) {
            (Ok(c), Ok(k)) => (c, k),
            // Mid-rotation a file may be briefly missing; the next poll sees the settled state.
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "certificate files not readable, keeping the current certificate");
                return;
            }
        };
        if (&cert_pem, &key_pem) == (&self.last_seen.0, &self.last_seen.1) {
            return;
        }
        let loaded = certified_key_from_pem(&self.paths, &cert_pem, &key_pem)
            .and_then(|key| not_after(&key, &self.paths.cert).map(|expiry| (key, expiry)));
        match loaded {
            Ok((key, expiry)) => {
                self.metrics.set_certificate_expiry(expiry);
                self.resolver.replace(key);
                self.metrics.reloaded(ReloadResult::Success);
                tracing::info!(cert = %self.paths.cert.display(), "serving certificate reloaded");
            }
            Err(e) => {
                self.metrics.reloaded(ReloadResult::Failure);
                tracing::error!(error = %e, "new certificate files do not load; still serving the previous certificate");
            }
        }
        self.last_seen = (cert_pem, key_pem);
    }

    /// Polls every `interval` until `shutdown`.
    pub async fn run(mut self, interval: Duration, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => self.poll(),
            }
        }
    }
}

/// A CA and a serving certificate it signed, PEM-encoded.
pub struct GeneratedCerts {
    /// The CA's certificate, PEM.
    pub ca_pem: String,
    /// The serving certificate, PEM, signed by the CA.
    pub cert_pem: String,
    /// The serving certificate's private key, PEM.
    pub key_pem: String,
}

/// Creates a CA and a serving certificate for `names` (DNS names or IP addresses).
pub fn generate(names: &[String], validity: Duration) -> Result<GeneratedCerts, TlsError> {
    let now = time::OffsetDateTime::now_utc();
    // Backdate a little so a slightly slow clock elsewhere still accepts the certificate.
    let not_before = now - time::Duration::minutes(5);
    let not_after = now + validity;

    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name = distinguished_name("balancer webhook CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    // rcgen turns names that parse as IP addresses into IP SANs.
    let mut params = CertificateParams::new(names.to_vec())?;
    params.distinguished_name = distinguished_name(names.first().map(String::as_str).unwrap_or("balancer"));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = not_before;
    params.not_after = not_after;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;
    Ok(GeneratedCerts { ca_pem: ca.pem(), cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "balancer");
    dn
}

impl GeneratedCerts {
    /// Writes `ca.crt`, `tls.crt` and `tls.key` (owner-only) into `dir`.
    pub fn write_to(&self, dir: &Path) -> Result<(), TlsError> {
        std::fs::create_dir_all(dir).map_err(|source| TlsError::Write { path: dir.to_path_buf(), source })?;
        write_file(&dir.join(CA_FILE), &self.ca_pem, 0o644)?;
        write_file(&dir.join(CERT_FILE), &self.cert_pem, 0o644)?;
        write_file(&dir.join(KEY_FILE), &self.key_pem, 0o600)
    }
}

fn write_file(path: &Path, contents: &str, mode: u32) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let err = |source| TlsError::Write { path: path.to_path_buf(), source };
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(path).map_err(err)?;
    // `mode` applies only when the file is created: tighten an existing one too.
    file.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(err)?;
    file.write_all(contents.as_bytes()).map_err(err)
}

/// Names the dev certificate is valid for.
pub fn dev_names() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]
}

/// Dev certificates in `dir`: reused when present, created (valid for
/// localhost, 127.0.0.1 and ::1, one year) when `tls.crt` or `tls.key` is missing.
pub fn ensure_dev_certs(dir: &Path) -> Result<(CertPaths, bool), TlsError> {
    let paths = CertPaths { cert: dir.join(CERT_FILE), key: dir.join(KEY_FILE) };
    if paths.cert.exists() && paths.key.exists() {
        return Ok((paths, false));
    }
    generate(&dev_names(), Duration::from_secs(365 * 24 * 3600))?.write_to(dir)?;
    Ok((paths, true))
}

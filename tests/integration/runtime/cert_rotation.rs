//! Hot reload of the serving certificate, with files laid out the way the
//! kubelet mounts a cert-manager Secret: `tls.crt -> ..data/tls.crt`, where
//! `..data` is a symlink swapped atomically to a new timestamped directory.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use balancer::manager;
use balancer::runtime::tls;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tempfile::TempDir;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::support;

/// Writes a new version directory and atomically repoints `..data` at it.
fn publish(mount: &Path, version: &str, cert_pem: &str, key_pem: &str) {
    let dir = mount.join(version);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join(tls::CERT_FILE), cert_pem).unwrap();
    std::fs::write(dir.join(tls::KEY_FILE), key_pem).unwrap();
    let tmp = mount.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, mount.join("..data")).unwrap();
}

fn mount_secret(mount: &Path, certs: &tls::GeneratedCerts) {
    publish(mount, "..v1", &certs.cert_pem, &certs.key_pem);
    for file in [tls::CERT_FILE, tls::KEY_FILE] {
        std::os::unix::fs::symlink(format!("..data/{file}"), mount.join(file)).unwrap();
    }
}

fn names() -> Vec<String> {
    vec!["127.0.0.1".to_string()]
}

/// The leaf certificate the server presents to a client trusting `ca_pem`, or the handshake error.
async fn presented_cert(addr: std::net::SocketAddr, ca_pem: &str) -> Result<Vec<u8>, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (_, conn) = tls.get_ref();
    Ok(conn.peer_certificates().unwrap()[0].to_vec())
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().to_vec()
}

async fn scrape(probe: std::net::SocketAddr) -> String {
    reqwest::get(format!("http://{probe}/metrics")).await.unwrap().text().await.unwrap()
}

#[tokio::test]
async fn rotated_certificates_are_served_without_restart_and_broken_ones_are_ignored() {
    support::install_crypto_provider();
    let mount = TempDir::new().unwrap();
    let first = tls::generate(&names(), Duration::from_secs(3600)).unwrap();
    mount_secret(mount.path(), &first);
    let args = support::run_args(&mount.path().join(tls::CERT_FILE), &mount.path().join(tls::KEY_FILE), 1 << 20);
    let shutdown = CancellationToken::new();
    let (bound, _, task) = manager::start(&args.config(), support::test_limits(), shutdown.clone()).await.unwrap();
    assert_eq!(presented_cert(bound.webhook, &first.ca_pem).await.unwrap(), der(&first.cert_pem));

    // Rotation to a certificate from a new CA: new handshakes get it, no restart.
    let second = tls::generate(&names(), Duration::from_secs(3600)).unwrap();
    publish(mount.path(), "..v2", &second.cert_pem, &second.key_pem);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(cert) = presented_cert(bound.webhook, &second.ca_pem).await {
            assert_eq!(cert, der(&second.cert_pem));
            break;
        }
        assert!(Instant::now() < deadline, "the rotated certificate was not served within 5 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(presented_cert(bound.webhook, &first.ca_pem).await.is_err(), "still serving the old certificate");

    // A broken rotation (garbage certificate) and a mismatched one (key of another pair)
    // both leave the working certificate in place.
    publish(
        mount.path(),
        "..v3",
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
        &second.key_pem,
    );
    tokio::time::sleep(support::RELOAD_INTERVAL * 5).await;
    let third = tls::generate(&names(), Duration::from_secs(3600)).unwrap();
    publish(mount.path(), "..v4", &third.cert_pem, &first.key_pem);
    tokio::time::sleep(support::RELOAD_INTERVAL * 5).await;
    assert_eq!(presented_cert(bound.webhook, &second.ca_pem).await.unwrap(), der(&second.cert_pem));

    let metrics = scrape(bound.probe).await;
    // The expiry gauge follows the certificate being served: the second one.
    let second_der = der(&second.cert_pem);
    let (_, served) = x509_parser::parse_x509_certificate(&second_der).unwrap();
    let expiry =
        format!("balancer_tls_certificate_expiry_timestamp_seconds {}", served.validity().not_after.timestamp());
    for line in [
        "balancer_tls_certificate_reloads_total{result=\"success\"} 1",
        "balancer_tls_certificate_reloads_total{result=\"failure\"} 2",
        expiry.as_str(),
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing {line:?} in\n{metrics}");
    }
    shutdown.cancel();
    task.await.unwrap();
}

#[test]
fn bad_certificate_files_are_reported_by_name() {
    let dir = TempDir::new().unwrap();
    let paths = tls::CertPaths { cert: dir.path().join("tls.crt"), key: dir.path().join("tls.key") };
    let err = tls::load_certified_key(&paths).unwrap_err().to_string();
    assert!(err.starts_with(&format!("cannot read {}", paths.cert.display())), "{err}");

    std::fs::write(&paths.cert, "hello").unwrap();
    std::fs::write(&paths.key, "hello").unwrap();
    let err = tls::load_certified_key(&paths).unwrap_err().to_string();
    assert_eq!(err, format!("{} holds no PEM certificate", paths.cert.display()));

    let a = tls::generate(&names(), Duration::from_secs(60)).unwrap();
    let b = tls::generate(&names(), Duration::from_secs(60)).unwrap();
    std::fs::write(&paths.cert, &a.cert_pem).unwrap();
    let err = tls::load_certified_key(&paths).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{} is not a PEM private key", paths.key.display())), "{err}");

    std::fs::write(&paths.key, &b.key_pem).unwrap();
    let err = tls::load_certified_key(&paths).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "{} does not belong to the certificate in {}",
            paths.key.display(),
            paths.cert.display()
        )),
        "{err}"
    );

    std::fs::write(&paths.key, &a.key_pem).unwrap();
    assert!(tls::load_certified_key(&paths).is_ok());
}

//! Shared test support: a real balancer server on ephemeral loopback ports, with
//! certificates made by `balancer::runtime::tls::generate`, and clients that trust them.
#![allow(dead_code)]

pub mod fixtures;
pub mod mock_api;
#[path = "../toolkit/ports.rs"]
pub mod ports;
#[path = "../toolkit/repo.rs"]
pub mod repo;
pub mod shell;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use balancer::cli::{Cli, Command, RunArgs};
use balancer::manager;
use balancer::runtime::listener::ConnectionLimits;
use balancer::runtime::tls;
use balancer::webhook::Limits;
use clap::Parser;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// `command` with nothing to find a cluster by: no `KUBECONFIG`, no in-cluster variables, and a
/// `HOME` of its own (where `~/.kube/config` would be), so that a test's `balancer` never reaches
/// the developer's own cluster, whatever their shell holds. Every suite that spawns `balancer`
/// outside a cluster it started goes through here.
pub fn without_a_cluster(command: &mut std::process::Command) -> &mut std::process::Command {
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("home-without-a-cluster");
    let _ = std::fs::create_dir_all(&home);
    command
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("HOME", home)
}

/// Certificate reload interval used by test servers, so rotation tests stay fast.
pub const RELOAD_INTERVAL: Duration = Duration::from_millis(100);

pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A running server and the files it serves from.
pub struct TestServer {
    pub webhook: SocketAddr,
    pub probe: SocketAddr,
    pub dir: TempDir,
    shutdown: CancellationToken,
    /// Cancelled by SIGTERM in `balancer run`, before the shutdown delay.
    draining: CancellationToken,
    task: JoinHandle<()>,
}

/// Limits with short timeouts so timeout behaviour can be observed quickly.
pub fn test_limits() -> Limits {
    let quick = |limits: ConnectionLimits| ConnectionLimits {
        header_timeout: Duration::from_secs(1),
        handshake_timeout: Duration::from_secs(1),
        first_byte_timeout: Duration::from_secs(1),
        ..limits
    };
    let defaults = Limits::default();
    Limits {
        connections: quick(defaults.connections.clone()),
        probe_connections: quick(defaults.probe_connections.clone()),
        body_timeout: Duration::from_secs(1),
        max_body_bytes: 64 * 1024,
        ..defaults
    }
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(test_limits()).await
    }

    pub async fn start_with(limits: Limits) -> Self {
        Self::start_with_args(limits, |_| {}).await
    }

    /// A server whose `balancer run` arguments `adjust` changes first (`--proxy-replicas`, say).
    pub async fn start_with_args(limits: Limits, adjust: impl FnOnce(&mut RunArgs)) -> Self {
        install_crypto_provider();
        let dir = TempDir::new().expect("temp dir");
        write_certs(&dir, &["localhost", "127.0.0.1"]);
        let cert = dir.path().join(tls::CERT_FILE);
        let key = dir.path().join(tls::KEY_FILE);
        let mut args = run_args(&cert, &key, limits.max_body_bytes);
        adjust(&mut args);
        let shutdown = CancellationToken::new();
        let (bound, readiness, task) =
            manager::start(&args.config(), limits, shutdown.clone()).await.expect("server starts");
        let draining = readiness.draining.clone();
        TestServer { webhook: bound.webhook, probe: bound.probe, dir, shutdown, draining, task }
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join(tls::CA_FILE)
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.webhook.port())
    }

    pub fn probe_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.probe.port())
    }

    /// A reqwest client trusting this server's CA only.
    pub fn client(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .tls_backend_preconfigured(client_config(&self.ca_path()))
            .timeout(Duration::from_secs(10))
            .build()
            .expect("client")
    }

    /// Signals shutdown and waits for the servers to drain.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("server stops in time")
            .expect("server task");
    }

    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// What SIGTERM starts before the shutdown delay: not ready, closing connections as they answer.
    pub fn begin_draining(&self) {
        self.draining.cancel();
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(self.probe_url("/metrics")).await.expect("scrape").text().await.expect("body")
    }
}

/// `balancer run` arguments for a test server on ephemeral loopback ports, webhooks only,
/// parsed exactly as the command line would be.
pub fn run_args(cert: &std::path::Path, key: &std::path::Path, max_body_bytes: usize) -> RunArgs {
    let reload = format!("{}ms", RELOAD_INTERVAL.as_millis());
    let max_body = max_body_bytes.to_string();
    let argv = [
        "balancer",
        "run",
        "--webhook-addr",
        "127.0.0.1:0",
        "--probe-addr",
        "127.0.0.1:0",
        "--tls-cert",
        cert.to_str().expect("utf-8 path"),
        "--tls-key",
        key.to_str().expect("utf-8 path"),
        "--tls-reload-interval",
        &reload,
        "--max-body-bytes",
        &max_body,
        "--disable-controller",
        "--insecure-metrics",
        "--log-level",
        "warn",
    ];
    match Cli::try_parse_from(argv).expect("valid arguments").command {
        Command::Run(args) => *args,
        other => panic!("parsed as {other:?}"),
    }
}

/// Writes a fresh CA, certificate and key for `names` into `dir`, returning the CA PEM.
pub fn write_certs(dir: &TempDir, names: &[&str]) -> String {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let certs = tls::generate(&names, Duration::from_secs(3600)).expect("generate");
    certs.write_to(dir.path()).expect("write");
    certs.ca_pem
}

/// A rustls client config trusting the CA in `ca_file`.
pub fn client_config(ca_file: &std::path::Path) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file).expect("read CA") {
        roots.add(cert.expect("CA cert")).expect("add CA");
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

pub const UID: &str = "705ab4f5-6393-11e8-b7cc-42010a800002";

/// An `admission.k8s.io/v1` AdmissionReview around `object`, as the API server sends it:
/// the request's kind and resource are in the object's own version (v1beta1 when it has none).
pub fn review(operation: &str, object: Value) -> Value {
    let name = object.pointer("/metadata/name").cloned().unwrap_or(json!(""));
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("Balancer").to_string();
    let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let version = match api_version.strip_prefix("exposer.hliangzhao.io/") {
        Some("v1alpha1") => "v1alpha1",
        _ => "v1beta1",
    };
    let (group, version, resource) =
        if kind == "Balancer" { ("exposer.hliangzhao.io", version, "balancers") } else { ("", "v1", "configmaps") };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": UID,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": name,
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// An `apiextensions.k8s.io/v1` ConversionReview, as the API server sends it to `/convert`.
pub fn conversion_review(desired_api_version: &str, objects: Vec<Value>) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": UID, "desiredAPIVersion": desired_api_version, "objects": objects}
    })
}

/// The variable that turns a missing tool into a failure of the tests that need it (`.ci/run`
/// sets it): balancer's own, so that `cargo test` in someone else's pipeline, where `CI` is
/// set, skips them as it does on a laptop.
pub const REQUIRE_TOOLS: &str = "BALANCER_REQUIRE_TOOLS";

/// Says that the calling test skips, and `why`, where the person running `cargo test` sees it:
/// libtest keeps a passing test's output to itself, so the line is written to standard error
/// past it, with the test's name. Fails the test instead when [`REQUIRE_TOOLS`] is set.
pub fn skip(why: &str) {
    use std::io::Write as _;
    assert!(std::env::var_os(REQUIRE_TOOLS).is_none(), "{why} ({REQUIRE_TOOLS} is set)");
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// Whether `tool` is on PATH; a test that needs it [skips](skip) when it is not.
pub fn have_tool(tool: &str) -> bool {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        skip(&format!("{tool} is not installed; install it to run this test"));
    }
    found
}

/// `kubectl kustomize DIR`, every document parsed; panics naming kustomize's error.
pub fn kustomize(dir: &std::path::Path) -> Vec<Value> {
    let output = std::process::Command::new("kubectl").arg("kustomize").arg(dir).output().expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("every rendered document parses");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// The rendered object of `kind` named `name`.
pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// The webhook's Service and its serving Certificate, as `deploy/` renders them.
pub fn webhook_service_and_certificate(docs: &[Value]) -> (&Value, &Value) {
    let service = find(docs, "Service", balancer::deploy::WEBHOOK_SERVICE);
    (service, find(docs, "Certificate", balancer::deploy::SERVING_CERTIFICATE))
}

/// A CRD's versions: `(name, served, storage)` each, in order.
pub fn crd_versions(crd: &Value) -> Vec<(&str, bool, bool)> {
    let versions = crd["spec"]["versions"].as_array().expect("a CRD has versions");
    let flag = |version: &Value, name: &str| version[name].as_bool().unwrap_or_else(|| panic!("{name}: {version}"));
    versions
        .iter()
        .map(|v| (v["name"].as_str().expect("a version name"), flag(v, "served"), flag(v, "storage")))
        .collect()
}

/// `kubectl kustomize` of an overlay of `deploy/` that adds `components` (folders under
/// `deploy/components`), written as a user writes one, in the folder `name` of the target's
/// temporary directory: kustomize refuses absolute paths, so the overlay names them relatively.
pub fn kustomize_deploy_with(name: &str, components: &[&str]) -> Vec<Value> {
    let base = PathBuf::from("@deploy@");
    let components: Vec<String> =
        components.iter().map(|c| base.join("components").join(c).display().to_string()).collect();
    kustomize_overlay(name, &format!("resources: [@deploy@]\ncomponents: [{}]\n", components.join(", ")))
}

/// Renders an overlay whose `kustomization.yaml` is `text`, with `@deploy@` standing for the
/// relative path to `deploy/` (kustomize wants relative paths), written under the test's
/// temporary folder as `name`.
pub fn kustomize_overlay(name: &str, text: &str) -> Vec<Value> {
    use std::path::{Component, Path};
    let overlay = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&overlay).expect("overlay folder");
    let overlay = overlay.canonicalize().expect("overlay path");
    let deploy = repo::repo("deploy").canonicalize().expect("deploy/");
    let (from, to): (Vec<Component>, Vec<Component>) = (overlay.components().collect(), deploy.components().collect());
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut base: PathBuf = std::iter::repeat_n(Component::ParentDir, from.len() - common).collect();
    base.extend(&to[common..]);
    let text = text.replace("@deploy@", &base.display().to_string());
    std::fs::write(overlay.join("kustomization.yaml"), text).expect("overlay written");
    kustomize(&overlay)
}

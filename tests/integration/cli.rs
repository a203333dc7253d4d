//! The `balancer` binary itself: `crd`, `check`, `convert`, `render`, `certs` and `run`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use crate::support;
use crate::support::repo::repo;

fn balancer() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_balancer"));
    crate::support::without_a_cluster(&mut command);
    command
}

/// Like `verify-codegen`: the committed CRD must be exactly what the binary prints.
#[test]
fn deploy_crd_yaml_is_the_output_of_balancer_crd() {
    let output = balancer().arg("crd").output().unwrap();
    assert!(output.status.success());
    let committed = std::fs::read_to_string(repo("deploy/crd.yaml")).unwrap();
    assert!(
        committed == String::from_utf8(output.stdout).unwrap(),
        "deploy/crd.yaml is stale: run `cargo run -- crd | tee deploy/crd.yaml > charts/balancer/files/crd.yaml`"
    );
}

/// `kubectl explain` reads these: every field of both versions says what it is, in words for a
/// user (no rustdoc links), and the kind itself is described, not kube's placeholder.
#[test]
fn every_field_of_the_crd_is_described_for_kubectl_explain() {
    let output = balancer().arg("crd").output().unwrap();
    let crd: Value = serde_saphyr::from_str(&String::from_utf8(output.stdout).unwrap()).expect("YAML");
    for version in crd["spec"]["versions"].as_array().unwrap() {
        let schema = &version["schema"]["openAPIV3Schema"];
        let top = schema["description"].as_str().unwrap_or_default();
        assert!(top.starts_with("A Balancer is a weighted TCP/UDP load balancer"), "{}: {top}", version["name"]);
        let mut undescribed = Vec::new();
        undescribed_fields(schema, &format!("{}", version["name"]), &mut undescribed);
        assert!(undescribed.is_empty(), "fields without a description, or with rustdoc syntax: {undescribed:?}");
    }
}

/// The fields under `schema` without a description, or whose description holds rustdoc syntax.
fn undescribed_fields(schema: &Value, path: &str, found: &mut Vec<String>) {
    if let Some(items) = schema.get("items") {
        undescribed_fields(items, &format!("{path}[]"), found);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        undescribed_fields(values, &format!("{path}{{}}"), found);
    }
    for (name, field) in schema["properties"].as_object().into_iter().flatten() {
        let path = format!("{path}.{name}");
        match field["description"].as_str() {
            Some(text) if !text.contains("[`") && !text.contains("crate::") => {}
            _ => found.push(path.clone()),
        }
        undescribed_fields(field, &path, found);
    }
}

/// What `balancer crd` prints: both versions, v1beta1 stored and scalable, converted by the
/// webhook Service, with the CA injected by cert-manager.
#[test]
fn balancer_crd_serves_both_versions_and_converts_through_the_webhook() {
    let output = balancer().arg("crd").output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let crd: Value = serde_saphyr::from_str(&String::from_utf8(output.stdout).unwrap()).expect("YAML");
    assert_eq!(crd["metadata"]["name"], "balancers.exposer.hliangzhao.io");
    assert_eq!(
        crd["metadata"]["annotations"],
        json!({"cert-manager.io/inject-ca-from": "balancer-system/balancer-serving-cert"})
    );
    let versions = crate::support::crd_versions(&crd);
    assert_eq!(versions, [("v1beta1", true, true), ("v1alpha1", true, false)]);
    let beta = &crd["spec"]["versions"][0];
    let alpha = &crd["spec"]["versions"][1];
    assert_eq!(
        beta["subresources"],
        json!({"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                                     "labelSelectorPath": ".status.selector"}})
    );
    assert_eq!(alpha["subresources"], json!({"status": {}}), "v1alpha1 is served unchanged");
    assert_eq!(
        crd["spec"]["conversion"],
        json!({"strategy": "Webhook", "webhook": {
            "clientConfig": {"service": {"name": "balancer-webhook", "namespace": "balancer-system",
                                         "path": "/convert", "port": 443}},
            "conversionReviewVersions": ["v1"]}})
    );

    // v1beta1's schema: spec.replicas 0..=100, the scale status, lists that are maps.
    let schema = |version: &Value, pointer: &str| version["schema"]["openAPIV3Schema"].pointer(pointer).cloned();
    let replicas = schema(beta, "/properties/spec/properties/replicas").expect("spec.replicas");
    assert_eq!((replicas["minimum"].as_f64(), replicas["maximum"].as_f64()), (Some(0.0), Some(100.0)));
    for field in ["replicas", "readyReplicas", "selector", "activeBackends", "obsoleteBackends"] {
        assert!(schema(beta, &format!("/properties/status/properties/{field}")).is_some(), "status.{field}");
    }
    assert_eq!(schema(beta, "/properties/spec/properties/backends/x-kubernetes-list-map-keys"), Some(json!(["name"])));
    assert_eq!(
        schema(beta, "/properties/spec/properties/ports/x-kubernetes-list-map-keys"),
        Some(json!(["port", "protocol"]))
    );
    // v1alpha1's: the Go project's names, no replicas.
    assert!(schema(alpha, "/properties/spec/properties/replicas").is_none());
    assert!(schema(alpha, "/properties/status/properties/activeBackendsNum").is_some());
    assert!(schema(alpha, "/properties/status/properties/activeBackends").is_none());
}

#[test]
fn the_original_sample_passes_check() {
    let output = balancer().arg("check").arg(repo("deploy/samples/balancer.yaml")).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("(Balancer \"example-balancer\"): valid"), "{stdout}");
}

#[test]
fn the_invalid_sample_fails_check_with_field_errors() {
    let output = balancer().arg("check").arg(repo("deploy/samples/invalid-balancer.yaml")).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    for expected in [
        "error: spec.ports[1].name: duplicate port name \"http\" (also spec.ports[0].name)",
        "error: spec.backends[1].name: must be a DNS-1123 label",
        "error: spec.ports[1].targetPort: must be a port number or an IANA service name",
        "error: spec.backends[1].selector: the merged selector",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in\n{stdout}");
    }
}

#[test]
fn check_reads_multi_document_stdin_and_applies_defaults_first() {
    let yaml = "\
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
---
apiVersion: exposer.hliangzhao.io/v1alpha1
kind: Balancer
metadata: {name: defaults}
spec:
  ports: [{port: 53, protocol: UDP}]
  backends: [{name: a, selector: {app: dns}}]
---
apiVersion: exposer.hliangzhao.io/v1alpha1
kind: Balancer
metadata: {name: wrong-shape}
spec:
  ports: [{port: \"eighty\"}]
  backends: []
";
    let (code, stdout) = check_stdin(yaml);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("<stdin>: document 2 (Balancer \"defaults\"): valid"), "{stdout}");
    assert!(stdout.contains("<stdin>: document 3 (Balancer \"wrong-shape\"): invalid"), "{stdout}");
    assert!(stdout.contains("error: spec.ports[0].port: invalid type: string \"eighty\""), "{stdout}");
    assert!(!stdout.contains("ignored"), "{stdout}");
}

#[test]
fn check_names_unreadable_and_unparseable_files() {
    let output = balancer().args(["check", "/nonexistent/balancer.yaml"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read /nonexistent/balancer.yaml"));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, "kind: Balancer\nspec: [unclosed\n").unwrap();
    let output = balancer().arg("check").arg(&file).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("{}: not valid YAML", file.display())), "{stderr}");
}

#[test]
fn certs_writes_a_ca_signed_pair_and_prints_the_ca_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let output = balancer()
        .args(["certs", "--out"])
        .arg(dir.path())
        .args(["--dns-name", "balancer-webhook.balancer-system.svc", "--dns-name", "10.0.0.1"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let bundle = String::from_utf8(output.stdout).unwrap();
    let ca = base64::engine::general_purpose::STANDARD.decode(bundle.trim()).unwrap();
    assert_eq!(ca, std::fs::read(dir.path().join("ca.crt")).unwrap());
    let paths = balancer::runtime::tls::CertPaths { cert: dir.path().join("tls.crt"), key: dir.path().join("tls.key") };
    assert!(balancer::runtime::tls::load_certified_key(&paths).is_ok());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&paths.key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the private key must be owner-only");
}

/// Starts `balancer run` in `dir` on ephemeral ports; returns the child and the webhook and probe ports.
fn start_run(dir: &Path) -> (std::process::Child, u16, u16) {
    start_run_with(dir, balancer())
}

/// [`start_run`] of `command`.
fn start_run_with(dir: &Path, mut command: Command) -> (std::process::Child, u16, u16) {
    let mut child = command
        .args(["run", "--webhook-addr", "127.0.0.1:0", "--probe-addr", "127.0.0.1:0", "--log-format", "json"])
        .args(["--shutdown-delay", "1s", "--metrics-addr", "127.0.0.1:0"])
        .current_dir(dir)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let port = |log: &serde_json::Value, field: &str| -> Option<u16> {
        log["fields"][field].as_str()?.rsplit(':').next()?.parse().ok()
    };
    let ports = stderr.lines().map_while(Result::ok).find_map(|line| {
        let log: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        Some((port(&log, "webhook")?, port(&log, "probe")?))
    });
    match ports {
        Some((webhook, probe)) => (child, webhook, probe),
        None => {
            let _ = child.kill();
            let status = child.wait();
            panic!("balancer run exited before serving: {status:?}");
        }
    }
}

fn terminate(mut child: std::process::Child) {
    signal_term(&child);
    let status = child.wait().unwrap();
    assert!(status.success(), "balancer run did not exit cleanly on SIGTERM: {status}");
}

fn signal_term(child: &std::process::Child) {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
}

/// The README's run command: dev certificates in certs/, created once and reused.
#[tokio::test]
async fn run_creates_dev_certificates_once_and_serves_them() {
    support::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let (child, port, probe) = start_run(dir.path());
    let ca = dir.path().join("certs/ca.crt");
    let first_ca = std::fs::read(&ca).unwrap();
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(support::client_config(&ca))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for host in ["localhost", "127.0.0.1"] {
        let body = client.get(format!("https://{host}:{port}/healthz")).send().await.unwrap().text().await.unwrap();
        assert_eq!(body, "ok");
    }
    // On SIGTERM it reports not-ready first, still serving, so endpoints drop it before it stops.
    signal_term(&child);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let readyz = reqwest::get(format!("http://127.0.0.1:{probe}/readyz")).await.unwrap();
    assert_eq!(readyz.status().as_u16(), 503);
    assert_eq!(readyz.text().await.unwrap(), "shutting down");
    let body = client.get(format!("https://127.0.0.1:{port}/healthz")).send().await.unwrap().text().await.unwrap();
    assert_eq!(body, "ok", "still serving during the shutdown delay");
    terminate(child);

    let (child, _, _) = start_run(dir.path());
    assert_eq!(std::fs::read(&ca).unwrap(), first_ca, "dev CA was regenerated instead of reused");
    terminate(child);
}

#[test]
fn run_reports_a_missing_certificate_file_by_name() {
    let output = balancer()
        .args(["run", "--tls-cert", "/nonexistent/tls.crt", "--tls-key", "/nonexistent/tls.key"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read /nonexistent/tls.crt"));
}

/// `--kubeconfig` and `--context` pick the cluster (client-go's and kubectl's flags); a file or
/// context that is not there is named, and `--require-controller` makes it fatal.
#[test]
fn run_names_a_kubeconfig_or_context_it_cannot_use() {
    let dir = tempfile::TempDir::new().unwrap();
    let certs = dir.path().join("certs");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--require-controller", "--dev-cert-dir", certs.to_str().unwrap()];
        args.extend_from_slice(extra);
        let output = balancer().args(&args).env_remove("KUBECONFIG").output().unwrap();
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let (code, stderr) = run(&["--kubeconfig", "/nonexistent/kubeconfig"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("cannot read /nonexistent/kubeconfig"), "{stderr}");

    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: here, context: {cluster: c, user: u}}]\n\
         current-context: here\n",
    )
    .unwrap();
    let (code, stderr) = run(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--context", "elsewhere"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("elsewhere"), "the missing context is named: {stderr}");
    // The context that exists is used: its server (nothing listens on port 1) is the one refused.
    let (code, stderr) = run(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--context", "here"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("https://127.0.0.1:1/"), "{stderr}");
}

#[test]
fn run_refuses_a_body_limit_no_review_fits() {
    let output = balancer().args(["run", "--max-body-bytes", "0"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("must be between 4096 and 67108864 bytes, got 0"), "{stderr}");
}

/// `kubectl get bal -A -o yaml | balancer check -`: the items of a List are checked, so stored
/// Balancers can be vetted before an upgrade whose schema is stricter.
#[test]
fn check_reads_the_items_of_a_list() {
    let yaml = "\
apiVersion: v1
kind: List
items:
- apiVersion: exposer.hliangzhao.io/v1alpha1
  kind: Balancer
  metadata: {name: fine, namespace: default}
  spec:
    ports: [{port: 80, protocol: TCP, targetPort: 8080}]
    backends: [{name: a, weight: 1, selector: {app: a}}]
- apiVersion: exposer.hliangzhao.io/v1alpha1
  kind: Balancer
  metadata: {name: stored-before, namespace: default}
  spec:
    ports: [{port: 80, targetPort: 3000000000}]
    backends: [{name: a, selector: {app: a}}]
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: ignored}
";
    let (code, stdout) = check_stdin(yaml);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("<stdin>: document 1 (Balancer \"fine\"): valid"), "{stdout}");
    assert!(stdout.contains("<stdin>: document 1 (Balancer \"stored-before\"): invalid"), "{stdout}");
    assert!(stdout.contains("error: spec.ports[0].targetPort: invalid value: integer `3000000000`"), "{stdout}");
    assert!(!stdout.contains("ignored"), "{stdout}");
}

/// `balancer convert --to <version> -` on `yaml`: the exit code, standard output and standard error.
fn convert_stdin(to: &str, yaml: &str) -> (Option<i32>, String, String) {
    let mut child = balancer()
        .args(["convert", "--to", to, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A refused command line exits before reading: the write then meets a closed pipe.
    let _ = child.stdin.take().unwrap().write_all(yaml.as_bytes());
    let output = child.wait_with_output().unwrap();
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
    (output.status.code(), text(output.stdout), text(output.stderr))
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml).expect("YAML").into_iter().filter(|d| !d.is_null()).collect()
}

/// `balancer convert --to v1beta1` rewrites the Go project's sample as the API server would
/// store it; `--to v1alpha1` of that gives the original back.
#[test]
fn convert_rewrites_the_sample_to_v1beta1_and_back() {
    let sample_file = repo("deploy/samples/balancer.yaml");
    let sample = documents(&std::fs::read_to_string(&sample_file).unwrap()).remove(0);
    assert_eq!(sample["apiVersion"], "exposer.hliangzhao.io/v1alpha1");

    let output = balancer().args(["convert", "--to", "v1beta1"]).arg(&sample_file).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let beta_yaml = String::from_utf8(output.stdout).unwrap();
    let beta = documents(&beta_yaml);
    assert_eq!(beta.len(), 1, "{beta_yaml}");
    assert_eq!(beta[0]["apiVersion"], "exposer.hliangzhao.io/v1beta1");
    assert_eq!(beta[0]["kind"], "Balancer");
    assert_eq!(beta[0]["metadata"], sample["metadata"]);
    assert_eq!(beta[0]["spec"], sample["spec"], "the same spec: conversion does not default");

    let (code, alpha_yaml, stderr) = convert_stdin("v1alpha1", &beta_yaml);
    assert_eq!(code, Some(0), "{stderr}");
    let alpha = documents(&alpha_yaml);
    assert_eq!(alpha, [sample], "the original, exactly");

    // Already at the version asked for: unchanged.
    let (code, again, _) = convert_stdin("v1beta1", &beta_yaml);
    assert_eq!((code, documents(&again)), (Some(0), beta));
}

/// What only v1beta1 says survives `--to v1alpha1` in the annotation, and comes back; other
/// documents are copied through; a List's Balancers are converted.
#[test]
fn convert_keeps_v1beta1_fields_and_other_documents() {
    let yaml = "\
apiVersion: v1
kind: ConfigMap
metadata: {name: untouched}
data: {a: b}
---
apiVersion: exposer.hliangzhao.io/v1beta1
kind: Balancer
metadata: {name: scaled}
spec:
  replicas: 3
  ports: [{port: 80}]
  backends: [{name: a, selector: {app: a}}]
---
apiVersion: v1
kind: List
items:
- apiVersion: exposer.hliangzhao.io/v1beta1
  kind: Balancer
  metadata: {name: listed}
  spec:
    replicas: 0
    ports: [{port: 53, protocol: UDP}]
    backends: [{name: b, selector: {app: b}}]
";
    let (code, alpha_yaml, stderr) = convert_stdin("v1alpha1", yaml);
    assert_eq!(code, Some(0), "{stderr}");
    let alpha = documents(&alpha_yaml);
    let original = documents(yaml);
    assert_eq!(alpha.len(), 3);
    assert_eq!(alpha[0], original[0], "not a Balancer: copied as it is");
    for (balancer, replicas) in [(&alpha[1], 3), (&alpha[2]["items"][0], 0)] {
        assert_eq!(balancer["apiVersion"], "exposer.hliangzhao.io/v1alpha1");
        assert!(balancer["spec"].get("replicas").is_none(), "{balancer}");
        let preserved = balancer["metadata"]["annotations"][balancer::api::conversion::PRESERVED_ANNOTATION]
            .as_str()
            .expect("the annotation");
        assert_eq!(serde_json::from_str::<Value>(preserved).unwrap(), json!({"spec": {"replicas": replicas}}));
    }
    let (code, beta_yaml, stderr) = convert_stdin("v1beta1", &alpha_yaml);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(documents(&beta_yaml), original, "v1beta1 -> v1alpha1 -> v1beta1 is the identity");
}

#[test]
fn convert_refuses_unknown_versions() {
    let (code, _, stderr) = convert_stdin("v2", "apiVersion: v1\nkind: ConfigMap\n");
    assert_eq!(code, Some(2), "clap refuses --to v2: {stderr}");
    let yaml = "apiVersion: exposer.hliangzhao.io/v2\nkind: Balancer\nmetadata: {name: x}\nspec: {}\n";
    let (code, stdout, stderr) = convert_stdin("v1beta1", yaml);
    assert_eq!(code, Some(2));
    assert!(stdout.is_empty(), "nothing half-written: {stdout}");
    assert!(stderr.contains("<stdin>: document 1: cannot convert"), "{stderr}");
    assert!(stderr.contains("exposer.hliangzhao.io/v2"), "{stderr}");
}

/// `balancer check` takes both versions (v1alpha1 is converted first, as the API server would
/// before calling the webhooks), and no other.
#[test]
fn check_accepts_both_versions() {
    let sample_file = repo("deploy/samples/balancer.yaml");
    let beta = balancer().args(["convert", "--to", "v1beta1"]).arg(&sample_file).output().unwrap();
    assert!(beta.status.success());
    let beta = String::from_utf8(beta.stdout).unwrap();
    let v1alpha1 = std::fs::read_to_string(&sample_file).unwrap();
    for yaml in [v1alpha1.as_str(), beta.as_str()] {
        let (code, stdout) = check_stdin(yaml);
        assert_eq!(code, Some(0), "{stdout}");
        assert!(stdout.contains("<stdin>: document 1 (Balancer \"example-balancer\"): valid"), "{stdout}");
    }
    let yaml = "\
apiVersion: exposer.hliangzhao.io/v1beta1
kind: Balancer
metadata: {name: scaled}
spec:
  replicas: 100
  ports: [{port: 80}]
  backends: [{name: a, selector: {app: a}}]
---
apiVersion: exposer.hliangzhao.io/v1beta1
kind: Balancer
metadata: {name: too-many}
spec:
  replicas: 101
  ports: [{port: 80}]
  backends: [{name: a, selector: {app: a}}]
---
apiVersion: exposer.hliangzhao.io/v1alpha1
kind: Balancer
metadata:
  name: carried
  annotations:
    exposer.hliangzhao.io/v1beta1-fields: '{\"spec\":{\"replicas\":-1}}'
spec:
  ports: [{port: 80}]
  backends: [{name: a, selector: {app: a}}]
---
apiVersion: exposer.hliangzhao.io/v2
kind: Balancer
metadata: {name: future}
spec:
  ports: [{port: 80}]
  backends: [{name: a, selector: {app: a}}]
";
    let (code, stdout) = check_stdin(yaml);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("<stdin>: document 1 (Balancer \"scaled\"): valid"), "{stdout}");
    assert!(stdout.contains("<stdin>: document 2 (Balancer \"too-many\"): invalid"), "{stdout}");
    assert!(stdout.contains("error: spec.replicas: must be between 0 and 100, got 101"), "{stdout}");
    // The annotation's v1beta1 fields are checked too, as the API server would store them.
    assert!(stdout.contains("<stdin>: document 3 (Balancer \"carried\"): invalid"), "{stdout}");
    assert!(stdout.contains("error: spec.replicas: must be between 0 and 100, got -1"), "{stdout}");
    assert!(stdout.contains("<stdin>: document 4 (Balancer \"future\"): invalid"), "{stdout}");
    assert!(
        stdout.contains(
            "error: apiVersion: must be exposer.hliangzhao.io/v1beta1 or exposer.hliangzhao.io/v1alpha1, \
             got \"exposer.hliangzhao.io/v2\""
        ),
        "{stdout}"
    );
}

/// `balancer render` takes both versions too; the proxy's replicas come from `spec.replicas`,
/// else from `--proxy-replicas`; children point at the Balancer in the storage version.
#[test]
fn render_accepts_both_versions_and_sizes_the_proxy() {
    let sample_file = repo("deploy/samples/balancer.yaml");
    let deployment =
        |docs: &[Value]| -> Value { docs.iter().find(|d| d["kind"] == "Deployment").cloned().expect("a Deployment") };
    let out = balancer().args(["render", "--proxy-replicas", "3"]).arg(&sample_file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let from_alpha = documents(&String::from_utf8(out.stdout).unwrap());
    let proxy = deployment(&from_alpha);
    assert_eq!(proxy["spec"]["replicas"], 3, "the v1alpha1 sample has no replicas: the default");
    assert_eq!(proxy["metadata"]["ownerReferences"][0]["apiVersion"], "exposer.hliangzhao.io/v1beta1");

    let beta = balancer().args(["convert", "--to", "v1beta1"]).arg(&sample_file).output().unwrap();
    let mut beta = documents(&String::from_utf8(beta.stdout).unwrap()).remove(0);
    beta["spec"]["replicas"] = json!(5);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("beta.yaml");
    std::fs::write(&file, serde_saphyr::to_string(&beta).unwrap()).unwrap();
    let out = balancer().args(["render", "--proxy-replicas", "3"]).arg(&file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let from_beta = documents(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(deployment(&from_beta)["spec"]["replicas"], 5, "the Balancer's own count wins");
    // Otherwise the same children.
    let mut expected = from_alpha;
    for doc in &mut expected {
        if doc["kind"] == "Deployment" {
            doc["spec"]["replicas"] = json!(5);
        }
    }
    assert_eq!(from_beta, expected);
}

/// `balancer check -` on `yaml`: the exit code and standard output.
fn check_stdin(yaml: &str) -> (Option<i32>, String) {
    let mut child = balancer().args(["check", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    (output.status.code(), String::from_utf8_lossy(&output.stdout).into_owned())
}

#[test]
fn render_loads_the_given_modules_first_and_refuses_a_path_nginx_could_misread() {
    let sample = repo("deploy/samples/balancer.yaml");
    let module = "/usr/lib/nginx/modules/ngx_stream_module.so";
    let out = balancer().args(["render", "--proxy-load-module", module]).arg(&sample).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8_lossy(&out.stdout);
    assert!(yaml.contains(&format!("load_module {module};")), "{yaml}");

    for bad in ["ngx_stream_module.so", "/m.so; user root", "/m.so\nstream {}"] {
        let out = balancer().args(["render", "--proxy-load-module", bad]).arg(&sample).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {stderr}");
        assert!(stderr.contains("must be an absolute path"), "{bad:?}: {stderr}");
    }
}

/// `balancer <args> -` with `env` on `yaml`: the whole output.
fn with_stdin(args: &[&str], env: &[(&str, &str)], yaml: &str) -> std::process::Output {
    let mut child = balancer()
        .args(args)
        .arg("-")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(yaml.as_bytes());
    child.wait_with_output().unwrap()
}

/// The policy flags are declared once: `run` and `render` read them from the environment too,
/// `check` only from its command line, as before.
#[test]
fn the_policy_flags_read_the_environment_in_render_but_not_in_check() {
    let sample = std::fs::read_to_string(repo("deploy/samples/balancer.yaml")).unwrap();
    let rendered = with_stdin(&["render"], &[("BALANCER_PROXY_REPLICAS", "3")], &sample);
    assert!(rendered.status.success(), "{}", String::from_utf8_lossy(&rendered.stderr));
    let docs = documents(&String::from_utf8(rendered.stdout).unwrap());
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").expect("a Deployment");
    assert_eq!(deployment["spec"]["replicas"], 3);

    let own_image = format!("{sample}  proxy:\n    image: registry.example.com/nginx/nginx:1.28\n");
    let allow = [("BALANCER_ALLOWED_PROXY_IMAGES", "registry.example.com/nginx/,other.example.com/")];
    assert_eq!(with_stdin(&["render"], &[], &own_image).status.code(), Some(2), "no image is allowed by default");
    let allowed = with_stdin(&["render"], &allow, &own_image);
    assert!(allowed.status.success(), "{}", String::from_utf8_lossy(&allowed.stderr));
    assert!(String::from_utf8_lossy(&allowed.stdout).contains("image: registry.example.com/nginx/nginx:1.28"));

    let checked = with_stdin(&["check"], &allow, &own_image);
    assert_eq!(checked.status.code(), Some(1), "check ignores the operator's environment");
    let flagged = with_stdin(&["check", "--allowed-proxy-images", "registry.example.com/nginx/"], &[], &own_image);
    assert_eq!(flagged.status.code(), Some(0), "{}", String::from_utf8_lossy(&flagged.stdout));
}

/// A `balancer run` a test starts (its controller on) finds no cluster to reach, even with a
/// `KUBECONFIG` naming one: here a listener that records every connection, which gets none
/// while the run serves its webhooks.
#[test]
fn a_test_run_never_reaches_a_cluster_it_did_not_start() {
    let recorder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    recorder.set_nonblocking(true).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let server = format!("https://{}", recorder.local_addr().unwrap());
    let config = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: dev\nclusters: [{{name: dev, cluster: {{server: \"{server}\"}}}}]\n\
         users: [{{name: dev, user: {{token: dev}}}}]\ncontexts: [{{name: dev, context: {{cluster: dev, user: dev}}}}]\n"
    );
    std::fs::write(&kubeconfig, config).unwrap();
    // The developer's shell, as the test inherits it, then what every spawned `balancer` gets.
    let mut command = Command::new(env!("CARGO_BIN_EXE_balancer"));
    command.env("KUBECONFIG", &kubeconfig);
    crate::support::without_a_cluster(&mut command);
    let (mut child, webhook, _) = start_run_with(dir.path(), command);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let reached = recorder.accept().is_ok();
    let _ = child.kill();
    let _ = child.wait();
    assert!(webhook > 0);
    assert!(!reached, "balancer run connected to the KUBECONFIG's cluster");
}

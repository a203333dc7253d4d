//! Installing the operator from `deploy/` as docs/install.md tells a user to, with a
//! certificate of our own; the certificate helpers the rotation scenarios use too.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::fixtures::{lease_holder, operator_pods, refuses_root_pods, wait_available};
use crate::toolkit::runner::eventually;
use crate::{BASE_IMAGE, OPERATOR_NS, World, repo};

/// The local proxy image is Debian's nginx, whose stream module is dynamic.
pub const STREAM_MODULE: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// `deploy/` with the locally built images; `without_cert_manager`: with the component that
/// leaves out its cert-manager objects and CA-injection annotations.
pub fn write_kustomization(dir: &Path, without_cert_manager: bool) {
    // Kustomize takes only relative paths to other kustomizations: up to / and down again.
    let up = "../".repeat(dir.components().count() - 1);
    let deploy = format!("{up}{}", repo("deploy").display().to_string().trim_start_matches('/'));
    let component = format!("{deploy}/components/without-cert-manager");
    let components = if without_cert_manager { format!("components:\n  - {component}\n") } else { String::new() };
    let text = format!(
        r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {deploy}
{components}images:
  - name: balancer
    newName: localhost/balancer
    newTag: test
patches:
  # The local proxy image is Debian's nginx, whose stream module is dynamic.
  - target: {{kind: Deployment, name: balancer}}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/env/-
        value: {{name: BALANCER_PROXY_IMAGE, value: "{BASE_IMAGE}"}}
      - op: add
        path: /spec/template/spec/containers/0/env/-
        value: {{name: BALANCER_PROXY_LOAD_MODULES, value: "{STREAM_MODULE}"}}
"#,
    );
    std::fs::write(dir.join("kustomization.yaml"), text).expect("kustomization");
}

/// docs/install.md's manual-certificate path: everything in `deploy/` but the cert-manager
/// objects, then a certificate of our own, its Secret, and the CA in both webhook
/// configurations and in the CRD's conversion webhook. Waits for both replicas to be Ready.
pub async fn install_operator(world: &World) {
    let dir = tempfile::TempDir::new().expect("temp dir");
    write_kustomization(dir.path(), true);
    world.kubectl.ok(&["apply", "-k", &dir.path().display().to_string()]);
    let certs = dir.path().join("certs");
    let bundle = new_certificates(&certs);
    world.kubectl.apply(&webhook_secret(world, &certs));
    patch_ca_bundle(world, &bundle);
    // Readiness means "can answer the API server"; the leader's controller then reconciles.
    wait_available(world, OPERATOR_NS, "balancer", 2).await;
}

/// Waits until the API server reaches the webhooks through their Service, and returns what
/// `kubectl apply` of the invalid sample answered then (success, output, error output). Until
/// kube-proxy has synced the Service's new endpoints (once a second at most), the API server's
/// call is refused: that answer is retried.
pub async fn webhooks_reachable(world: &World) -> (bool, String, String) {
    let invalid = std::fs::read_to_string(repo("deploy/samples/invalid-balancer.yaml")).expect("sample");
    // Reachable once the webhook's own message comes back: until kube-proxy has programmed the
    // Service, the API server's calls are refused, or find no route to the Service's address.
    eventually("the webhooks reachable through their Service", Duration::from_secs(60), || async {
        let answer = world.kubectl.run(&["apply", "-f", "-"], Some(&invalid));
        answer.2.contains(INVALID_SAMPLE_MESSAGE).then_some(answer)
    })
    .await
}

/// What the validating webhook says about `deploy/samples/invalid-balancer.yaml`: only the
/// webhook knows this rule (the CRD schema has no notion of duplicate names).
const INVALID_SAMPLE_MESSAGE: &str = "duplicate port name \"http\"";

pub async fn the_operator_installs_from_deploy_as_a_user_would(world: &mut World) {
    install_operator(world).await;
    world.operator_installed();

    // Both replicas are in a namespace that admits only `restricted` pods (deploy/namespace.yaml).
    let (refused, answer) = refuses_root_pods(world, OPERATOR_NS);
    assert!(refused, "{OPERATOR_NS} does not enforce `restricted`: {answer}");
    let pods = operator_pods(world).await;
    let holder = eventually("a leader", Duration::from_secs(60), || lease_holder(world)).await;
    assert!(pods.contains(&holder), "the Lease is held by {holder}, not one of {pods:?}");

    // The API server reaches the webhooks through their Service: a bad Balancer gets our message.
    let config = world.kubectl.ok(&["get", "validatingwebhookconfiguration", "balancer-validating", "-o", "json"]);
    let config: Value = serde_json::from_str(&config).expect("json");
    assert_eq!(config["webhooks"][0]["clientConfig"]["service"]["name"], "balancer-webhook", "{config}");
    assert!(config["webhooks"][0]["clientConfig"].get("url").is_none());
    let (ok, out, err) = webhooks_reachable(world).await;
    assert!(!ok, "the invalid sample was accepted: {out}");
    assert!(err.contains(INVALID_SAMPLE_MESSAGE), "{err}");
}

/// Puts `bundle` (base64 PEM) into both webhook configurations and the CRD's conversion
/// webhook as the CA they trust.
pub fn patch_ca_bundle(world: &World, bundle: &str) {
    let patch = json!([{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}]).to_string();
    for config in
        ["mutatingwebhookconfiguration/balancer-mutating", "validatingwebhookconfiguration/balancer-validating"]
    {
        world.kubectl.ok(&["patch", config, "--type=json", "-p", &patch]);
    }
    let path = "/spec/conversion/webhook/clientConfig/caBundle";
    let patch = json!([{"op": "add", "path": path, "value": bundle}]).to_string();
    world.kubectl.ok(&["patch", "crd", "balancers.exposer.hliangzhao.io", "--type=json", "-p", &patch]);
}

/// The webhook's TLS Secret holding the pair in `dir`, as YAML to apply (create or replace).
pub fn webhook_secret(world: &World, dir: &Path) -> String {
    let cert = format!("--cert={}", dir.join("tls.crt").display());
    let key = format!("--key={}", dir.join("tls.key").display());
    let args = ["-n", OPERATOR_NS, "create", "secret", "tls", "balancer-webhook-tls", &cert, &key];
    world.kubectl.ok(&[&args[..], &["--dry-run=client", "-o", "yaml"]].concat())
}

/// `balancer certs` into `dir`: the CA bundle (base64 PEM) it prints.
pub fn new_certificates(dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_balancer"))
        .args(["certs", "--out", &dir.display().to_string()])
        .args(["--dns-name", "balancer-webhook.balancer-system.svc"])
        .args(["--dns-name", "balancer-webhook.balancer-system.svc.cluster.local"])
        .output()
        .expect("balancer certs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

//! The webhook's certificate replaced: by hand, and by cert-manager.
//!
//! The README's default install, for real: cert-manager v1.11.5 installed from its own chart
//! with Helm (the images built from the module proxy, `tests/kubernetes/cert-manager.sh`), then
//! the installation moved from kustomize to balancer's chart as docs/install.md says, with its
//! Issuers, Certificates and CA-injection annotations; uninstalled and installed again by the
//! README's Helm block, and upgraded with a new value.
//!
//! cert-manager v1.11 declares support up to Kubernetes 1.26: here it probes balancer's
//! manifests on v1.37, as a user's newer cert-manager would read them.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::ListParams;
use rustls::pki_types::{CertificateDer, pem::PemObject as _};
use serde_json::{Value, json};

use crate::fixtures::{Sample, apply_sample_as, front_ip, operator_pod_restarts, sh_block};
use crate::install::{STREAM_MODULE, new_certificates, patch_ca_bundle, webhook_secret, webhooks_reachable};
use crate::toolkit::cluster;
use crate::toolkit::load::Load;
use crate::toolkit::runner::eventually;
use crate::{BASE_IMAGE, NS, OPERATOR_NS, SAMPLE, World, repo};

const NAMESPACE: &str = "cert-manager";
const WEBHOOK_HOST: &str = "balancer-webhook.balancer-system.svc";

/// `helm` with the suite's kubeconfig; its output, or its error.
fn helm(world: &World, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(world.cert_manager.join("helm"))
        .arg(format!("--kubeconfig={}", world.plane.kubeconfig("admin").display()))
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() { Ok(text) } else { Err(text) }
}

/// cert-manager's chart, its images replaced by the local ones, its CRDs included, and without
/// the post-install API check (a Job of `cmctl`, which is not built).
fn install_cert_manager(world: &World) {
    let chart = world.cert_manager.join("chart");
    let version = std::fs::read_to_string(chart.join("Chart.yaml"))
        .expect("Chart.yaml")
        .lines()
        .find_map(|l| l.strip_prefix("appVersion: ").map(str::to_string))
        .expect("appVersion");
    let mut args: Vec<String> =
        ["install", "cert-manager", &chart.display().to_string(), "--namespace", NAMESPACE].map(String::from).to_vec();
    args.extend(["--create-namespace", "--wait", "--timeout=5m"].map(String::from));
    let mut set = vec!["installCRDs=true".to_string(), "startupapicheck.enabled=false".to_string()];
    for (prefix, image) in [("", "controller"), ("webhook.", "webhook"), ("cainjector.", "cainjector")] {
        set.push(format!("{prefix}image.repository=localhost/cert-manager-{image}"));
        set.push(format!("{prefix}image.tag={version}"));
        set.push(format!("{prefix}image.pullPolicy=Never"));
    }
    for value in set {
        args.extend(["--set".to_string(), value]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let installed = Instant::now();
    let out = helm(world, &args).unwrap_or_else(|e| panic!("helm install cert-manager failed: {e}"));
    assert!(out.contains("STATUS: deployed"), "{out}");
    println!(
        "node: cert-manager {version} installed from its chart by Helm in {:.1} s",
        installed.elapsed().as_secs_f64()
    );
}

/// The base64 `caBundle` of both webhook configurations and of the CRD's conversion webhook.
fn ca_bundles(world: &World) -> [String; 3] {
    let path = "jsonpath={.webhooks[0].clientConfig.caBundle}";
    let conversion = "jsonpath={.spec.conversion.webhook.clientConfig.caBundle}";
    [
        world.kubectl.ok(&["get", "validatingwebhookconfiguration", "balancer-validating", "-o", path]),
        world.kubectl.ok(&["get", "mutatingwebhookconfiguration", "balancer-mutating", "-o", path]),
        world.kubectl.ok(&["get", "crd", "balancers.exposer.hliangzhao.io", "-o", conversion]),
    ]
}

/// The webhook's TLS Secret: (`ca.crt`, `tls.crt`) as PEM.
async fn serving_secret(world: &World) -> Option<(String, String)> {
    let secrets: Api<Secret> = Api::namespaced(world.admin.clone(), OPERATOR_NS);
    let data = secrets.get("balancer-webhook-tls").await.ok()?.data?;
    let text = |key: &str| String::from_utf8(data.get(key)?.0.clone()).ok();
    Some((text("ca.crt")?, text("tls.crt")?))
}

/// The leaf certificate (DER) `address` presents, as the webhook's name, to a client trusting
/// `ca_pem` alone.
async fn presented_certificate(address: &str, ca_pem: &str) -> Option<Vec<u8>> {
    let config = cluster::tls_config(ca_pem);
    let connect = tokio::net::TcpStream::connect(address);
    let tcp = tokio::time::timeout(Duration::from_secs(3), connect).await.ok()?.ok()?;
    let name = rustls::pki_types::ServerName::try_from(WEBHOOK_HOST).ok()?;
    let handshake = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp);
    let tls = tokio::time::timeout(Duration::from_secs(3), handshake).await.ok()?.ok()?;
    Some(tls.get_ref().1.peer_certificates()?.first()?.to_vec())
}

/// Whether each running operator pod, reached at its own address (the Service may pick the
/// same one every time), presents a certificate that `ca_pem` verifies: `leaf_pem` itself
/// when given.
pub async fn every_replica_presents(world: &World, ca_pem: &str, leaf_pem: Option<&str>) -> bool {
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), OPERATOR_NS);
    let params = ListParams::default().labels("app.kubernetes.io/name=balancer");
    let Ok(list) = pods.list(&params).await else { return false };
    let running = list.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none());
    let addresses: Vec<String> =
        running.filter_map(|p| p.status.as_ref()?.pod_ip.as_ref().map(|ip| format!("{ip}:9443"))).collect();
    let wanted = match leaf_pem.map(|pem| CertificateDer::from_pem_slice(pem.as_bytes())) {
        Some(Ok(der)) => Some(der.to_vec()),
        Some(Err(_)) => return false,
        None => None,
    };
    if addresses.is_empty() {
        return false;
    }
    for address in &addresses {
        let Some(presented) = presented_certificate(address, ca_pem).await else { return false };
        if wanted.as_ref().is_some_and(|wanted| *wanted != presented) {
            return false;
        }
    }
    true
}

/// Requests a renewal as `cmctl renew` does: the Certificate's `Issuing` condition set.
fn request_renewal(world: &World) {
    let certificate =
        world.kubectl.ok(&["-n", OPERATOR_NS, "get", "certificate", "balancer-serving-cert", "-o", "json"]);
    let certificate: Value = serde_json::from_str(&certificate).expect("json");
    let mut conditions = certificate["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions.retain(|c| c["type"] != "Issuing");
    conditions.push(json!({"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
                           "message": "renewal requested by the node suite",
                           "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string()}));
    let patch = json!({"status": {"conditions": conditions}}).to_string();
    let args =
        ["-n", OPERATOR_NS, "patch", "certificate", "balancer-serving-cert", "--subresource=status", "--type=merge"];
    world.kubectl.ok(&[&args[..], &["-p", &patch]].concat());
}

/// cert-manager issues the webhook's certificate, its CA injector puts the CA into both
/// webhook configurations and the CRD's conversion webhook, the API server validates and
/// converts through them, and a renewed certificate is served without a restart.
pub async fn cert_manager_issues_the_webhook_certificate_and_injects_its_ca(world: &mut World) {
    // The sample is read as v1alpha1 through the conversion webhook.
    world.ensure_sample(Sample::ANY).await;
    install_cert_manager(world);

    // The installation of scenario 1 (deploy/ without cert-manager, certificate by hand)
    // moved to Helm with cert-manager as docs/install.md says, under load through the sample.
    // The manual certificate's Secret is deleted first (cert-manager would otherwise take a
    // valid certificate it finds for its own; the replicas go on serving the files they
    // have). cert-manager's own webhook validates the Certificates: awaited until kube-proxy
    // routes to it, as `helm install` is not retried.
    let load = Load::start(format!("{}:80", front_ip(world, SAMPLE).await), 2);
    world.kubectl.ok(&["-n", OPERATOR_NS, "delete", "secret", "balancer-webhook-tls"]);
    cert_manager_answers(world).await;
    let applied = Instant::now();
    run_block(world, "docs/install.md", "--take-ownership");
    println!("node: moved from kustomize to Helm in {:.1} s", applied.elapsed().as_secs_f64());
    let issued = eventually("the serving certificate issued", Duration::from_secs(60), || async {
        let args = ["-n", OPERATOR_NS, "get", "certificate", "balancer-serving-cert", "-o", "json"];
        let certificate: Value = serde_json::from_str(&world.kubectl.run(&args, None).1).ok()?;
        let conditions = certificate["status"]["conditions"].as_array()?.clone();
        let ready = conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "True");
        ready.then(|| applied.elapsed())
    })
    .await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let (ca, leaf) = eventually("the Secret written by cert-manager", Duration::from_secs(30), || async {
        let secrets: Api<Secret> = Api::namespaced(world.admin.clone(), OPERATOR_NS);
        let secret = secrets.get("balancer-webhook-tls").await.ok()?;
        let annotations = secret.metadata.annotations.unwrap_or_default();
        (annotations.get("cert-manager.io/certificate-name").map(String::as_str) == Some("balancer-serving-cert"))
            .then_some(())?;
        serving_secret(world).await
    })
    .await;
    let injected = eventually("the CA injected in both webhooks and the CRD", Duration::from_secs(60), || async {
        ca_bundles(world)
            .iter()
            .all(|bundle| b64.decode(bundle.trim()).ok().as_deref() == Some(ca.as_bytes()))
            .then(|| applied.elapsed())
    })
    .await;
    println!(
        "node: the chart with cert-manager: certificate issued {:.1} s and its CA injected {:.1} s after the apply",
        issued.as_secs_f64(),
        injected.as_secs_f64()
    );

    // Every replica serves it (the kubelet updates the mounted Secret), and the API server
    // validates and converts through the webhooks.
    eventually("the issued certificate on every replica", Duration::from_secs(120), || async {
        every_replica_presents(world, &ca, Some(&leaf)).await.then_some(())
    })
    .await;
    println!("node: the issued certificate served {:.1} s after the apply", applied.elapsed().as_secs_f64());
    let invalid = std::fs::read_to_string(repo("deploy/samples/invalid-balancer.yaml")).expect("sample");
    eventually("the invalid sample refused by the webhook", Duration::from_secs(30), || async {
        let (ok, _, err) = world.kubectl.run(&["apply", "-f", "-"], Some(&invalid));
        (!ok && err.contains("duplicate port name \"http\"")).then_some(())
    })
    .await;
    let alpha = ["-n", NS, "get", "balancers.v1alpha1.exposer.hliangzhao.io", SAMPLE, "-o", "jsonpath={.apiVersion}"];
    assert_eq!(world.kubectl.ok(&alpha), "exposer.hliangzhao.io/v1alpha1", "converted by the webhook");

    // A renewal: a new key and certificate from the same CA, served without a restart (of
    // the pods the move rolled out: their arguments changed from deploy/'s environment).
    world.kubectl.ok(&["-n", OPERATOR_NS, "rollout", "status", "deployment/balancer", "--timeout=120s"]);
    let restarts = operator_pod_restarts(world).await;
    request_renewal(world);
    let renewed = Instant::now();
    let new_leaf = eventually("the renewed certificate in the Secret", Duration::from_secs(60), || async {
        let (_, now) = serving_secret(world).await?;
        (now != leaf).then_some(now)
    })
    .await;
    eventually("the renewed certificate on every replica", Duration::from_secs(120), || async {
        every_replica_presents(world, &ca, Some(&new_leaf)).await.then_some(())
    })
    .await;
    println!(
        "node: a renewed certificate served {:.1} s after the renewal was requested",
        renewed.elapsed().as_secs_f64()
    );
    assert_eq!(operator_pod_restarts(world).await, restarts, "no replica restarted");
    apply_sample_as(world, NS, "renewed", "a Balancer write after the renewal").await;
    world.kubectl.ok(&["-n", NS, "delete", "balancer", "renewed"]);

    // Uninstalled and installed again with the README's block as written (but the suite's
    // images): the CRD, and with it every Balancer, stays, and the proxies serve throughout.
    helm(world, &["uninstall", "balancer", "--namespace", OPERATOR_NS, "--wait"])
        .unwrap_or_else(|e| panic!("helm uninstall failed: {e}"));
    cert_manager_answers(world).await;
    let installed = Instant::now();
    run_block(world, "README.md", "helm install balancer");
    webhooks_reachable(world).await;
    println!(
        "node: uninstalled, then installed by the README's Helm block in {:.1} s",
        installed.elapsed().as_secs_f64()
    );

    // A value changed with `helm upgrade`, as docs/install.md says: the proxies' default
    // replicas. The operator's pods roll; the sample's proxies serve on.
    let upgraded = Instant::now();
    let chart = repo("charts/balancer").display().to_string();
    let args = ["upgrade", "balancer", &chart, "--namespace", OPERATOR_NS, "--reset-then-reuse-values"];
    helm(world, &[&args[..], &["--set", "proxy.replicas=2", "--wait", "--timeout=3m"]].concat())
        .unwrap_or_else(|e| panic!("helm upgrade failed: {e}"));
    // The replaced replicas answer webhook calls (with the old default) until they are gone.
    eventually("only the upgraded operator pods", Duration::from_secs(60), || async {
        let pods: Api<Pod> = Api::namespaced(world.admin.clone(), OPERATOR_NS);
        let all = pods.list(&ListParams::default().labels("app.kubernetes.io/name=balancer")).await.ok()?.items;
        (all.len() == 2 && all.iter().all(|p| p.metadata.deletion_timestamp.is_none())).then_some(())
    })
    .await;
    println!("node: helm upgrade replaced the operator's pods in {:.1} s", upgraded.elapsed().as_secs_f64());
    apply_sample_as(world, NS, "upgraded", "a Balancer write after the upgrade").await;
    let replicas =
        ["-n", NS, "get", "balancers.v1beta1.exposer.hliangzhao.io", "upgraded", "-o", "jsonpath={.spec.replicas}"];
    assert_eq!(world.kubectl.ok(&replicas), "2", "the new default of proxy.replicas");
    world.kubectl.ok(&["-n", NS, "delete", "balancer", "upgraded"]);
    load.assert_no_failures("while the installation moved to Helm, was installed again and upgraded").await;
}

/// Waits until cert-manager's webhook answers (a server-side dry run of an Issuer).
async fn cert_manager_answers(world: &World) {
    eventually("cert-manager's webhook answering", Duration::from_secs(60), || async {
        let issuer = "{apiVersion: cert-manager.io/v1, kind: Issuer, metadata: {name: probe}, spec: {selfSigned: {}}}";
        world.kubectl.run(&["-n", OPERATOR_NS, "apply", "--dry-run=server", "-f", "-"], Some(issuer)).0.then_some(())
    })
    .await;
}

/// Runs, with `bash -e` in the repository, the first `sh` block of `page` that holds
/// `marker`, with `kubectl` and `helm` pointed at the suite's cluster. `helm install` gets the
/// suite's images: the operator's (the README's documented override) and the proxy's
/// (Debian's nginx, whose stream module is dynamic).
fn run_block(world: &World, page: &str, marker: &str) {
    let block = sh_block(page, marker);
    let kubeconfig = world.plane.kubeconfig("admin").display().to_string();
    let helm = world.cert_manager.join("helm").display().to_string();
    let images = format!(
        "--set image.repository=localhost/balancer --set image.tag=test --set proxy.image={BASE_IMAGE} \
         --set proxy.loadModules={{{STREAM_MODULE}}}"
    );
    let prelude = format!(
        "kubectl() {{ command kubectl --kubeconfig={kubeconfig} \"$@\"; }}\n\
         helm() {{ if [ \"$1\" = install ]; then {helm} --kubeconfig={kubeconfig} \"$@\" {images}; \
         else {helm} --kubeconfig={kubeconfig} \"$@\"; fi; }}\n"
    );
    let out = Command::new("timeout")
        .args(["300", "bash", "-ec", &format!("{prelude}{block}")])
        .current_dir(repo(""))
        .output()
        .expect("bash runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{page}'s block failed:\n{block}\n{text}");
}

/// The webhook's certificate replaced by hand (its Secret applied again, the new CA trusted
/// alongside the old one until every replica serves the new pair): served without a restart.
pub async fn a_replaced_certificate_is_served_without_a_restart(world: &mut World) {
    world.ensure_namespace().await;
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let before = operator_pod_restarts(world).await;
    let old_bundle = world.kubectl.ok(&[
        "get",
        "validatingwebhookconfiguration",
        "balancer-validating",
        "-o",
        "jsonpath={.webhooks[0].clientConfig.caBundle}",
    ]);
    let dir = tempfile::TempDir::new().expect("temp dir");
    let new_bundle = new_certificates(dir.path());
    let new_ca = String::from_utf8(b64.decode(&new_bundle).expect("base64")).expect("PEM");
    // Trust both CAs while the pods switch, as a rotation should.
    let both = [b64.decode(old_bundle.trim()).expect("base64"), new_ca.clone().into_bytes()].concat();
    patch_ca_bundle(world, &b64.encode(both));
    let secret = webhook_secret(world, dir.path());
    let replaced = Instant::now();
    world.kubectl.apply(&secret);

    // Every replica, each at its own address, serves a certificate the new CA alone verifies.
    eventually("the new certificate on every replica", Duration::from_secs(120), || async {
        every_replica_presents(world, &new_ca, None).await.then_some(())
    })
    .await;
    println!("node: new certificate served {:.1} s after the Secret was replaced", replaced.elapsed().as_secs_f64());
    assert_eq!(operator_pod_restarts(world).await, before, "no replica restarted");

    // The new CA alone, and writes go on.
    patch_ca_bundle(world, &new_bundle);
    apply_sample_as(world, NS, "rotated", "a Balancer write after the rotation").await;
    world.kubectl.ok(&["-n", NS, "delete", "balancer", "rotated"]);
}

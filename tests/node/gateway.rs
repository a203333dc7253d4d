//! Gateway API on real nodes: the v1.7.0 standard CRDs installed, the operator restarted to
//! serve them (as docs/gateway-api.md says), and a Gateway with a TCPRoute served by the same
//! live engine as a Balancer: weight flips on the wire within 2 s under load, with no failed
//! request, no new proxy pod and no cut connection.

use std::time::{Duration, Instant};

use balancer::gateway::api::gateways::Gateway;
use kube::Api;
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::fixtures::{Sample, backend_deployment, pod_ips, proxy_model};
use crate::toolkit::load::{Held, Load, one_request};
use crate::toolkit::repo::repo;
use crate::toolkit::runner::eventually;
use crate::weights::{Flips, live_pod_uids, only_answer, quantile};
use crate::{NS, World};

/// The Gateway's name, and its proxy's (GEP-1762's `<gateway>-<class>`).
const GATEWAY: &str = "edge";
const PROXY: &str = "edge-balancer";
/// The TCP listener's port.
const PORT: u16 = 8080;

/// The GatewayClass, the Services in front of the walkthrough's echo pods v1 and v2, the
/// Gateway and its TCPRoute (all to v1).
fn objects() -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: gw-v1, namespace: {NS}}}\n\
         spec: {{selector: {{app: test, version: v1}}, ports: [{{port: 80, targetPort: 5678}}]}}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: gw-v2, namespace: {NS}}}\n\
         spec: {{selector: {{app: test, version: v2}}, ports: [{{port: 80, targetPort: 5678}}]}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {GATEWAY}, namespace: {NS}}}\n\
         spec:\n  gatewayClassName: balancer\n  listeners:\n  - {{name: echo, port: {PORT}, protocol: TCP}}\n  \
         - {{name: web, port: 80, protocol: HTTP}}\n---\n\
         {}",
        route(100, 0)
    )
}

/// The TCPRoute, `v1` and `v2` its backends' weights.
fn route(v1: u32, v2: u32) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata: {{name: echo, namespace: {NS}}}\n\
         spec:\n  parentRefs: [{{name: {GATEWAY}, sectionName: echo}}]\n  \
         rules: [{{backendRefs: [{{name: gw-v1, port: 80, weight: {v1}}}, {{name: gw-v2, port: 80, weight: {v2}}}]}}]\n"
    )
}

/// Sets the TCPRoute's weights as a canary tool would, with one patch (`kubectl patch`, as the
/// Balancer's flips are written).
fn set_weights(world: &World, v1: u32, v2: u32) {
    let backends = format!(
        "{{\"spec\": {{\"rules\": [{{\"backendRefs\": [{{\"name\": \"gw-v1\", \"port\": 80, \"weight\": {v1}}}, \
         {{\"name\": \"gw-v2\", \"port\": 80, \"weight\": {v2}}}]}}]}}}}"
    );
    world.kubectl.ok(&["-n", NS, "patch", "tcproute", "echo", "--type=merge", "-p", &backends]);
}

/// Installs the standard-channel CRDs and restarts the operator, which then serves Gateways;
/// and makes balancer's GatewayClass.
pub async fn install_gateway_api(world: &World) {
    let out = std::process::Command::new("bash").arg(repo("tests/kubernetes/gateway-api.sh")).output().expect("bash");
    assert!(out.status.success(), "gateway-api.sh: {}", String::from_utf8_lossy(&out.stderr));
    let crds = String::from_utf8_lossy(&out.stdout).trim().to_string();
    world.kubectl.ok(&["apply", "--server-side", "-f", &crds]);
    let names: Vec<String> =
        balancer::gateway::RESOURCES.iter().map(|r| format!("crd/{r}.gateway.networking.k8s.io")).collect();
    let mut wait = vec!["wait", "--for=condition=Established", "--timeout=60s"];
    wait.extend(names.iter().map(String::as_str));
    world.kubectl.ok(&wait);
    world.kubectl.ok(&["-n", "balancer-system", "rollout", "restart", "deployment/balancer"]);
    world.kubectl.ok(&["-n", "balancer-system", "rollout", "status", "deployment/balancer", "--timeout=120s"]);
    world.kubectl.apply(CLASS);
    let classes: Api<balancer::gateway::api::gatewayclasses::GatewayClass> = Api::all(world.admin.clone());
    eventually("balancer's GatewayClass accepted, with its features", Duration::from_secs(60), || async {
        let status = classes.get("balancer").await.ok()?.status?;
        let accepted = status.conditions?.iter().any(|c| c.type_ == "Accepted" && c.status == "True");
        (accepted && !status.supported_features?.is_empty()).then_some(())
    })
    .await;
}

/// balancer's GatewayClass, as docs/gateway-api.md makes it.
const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: balancer}\n\
                     spec: {controllerName: exposer.hliangzhao.io/balancer}\n";

/// Gateway `name` in [`NS`] once it is `Programmed`, and its first address.
async fn programmed_address(world: &World, name: &str) -> String {
    let gateways: Api<Gateway> = Api::namespaced(world.admin.clone(), NS);
    eventually(&format!("Gateway {name} Programmed, at an address"), Duration::from_secs(120), || async {
        let gateway = gateways.get(name).await.ok()?;
        let status = gateway.status?;
        let programmed = status.conditions?.iter().any(|c| c.type_ == "Programmed" && c.status == "True");
        let address = status.addresses?.first()?.value.clone();
        programmed.then_some(address)
    })
    .await
}

/// The UIDs of the live pods of proxy `proxy` (a Gateway's, by its GEP-1762 name).
async fn proxy_pod_uids(world: &World, proxy: &str) -> Vec<String> {
    live_pod_uids(world, &balancer::proxy::proxy_selector_string(proxy)).await
}

/// A TCPRoute's weights flipped between two backends under load (20 times 5 s apart with
/// `BALANCER_NODE_FLIPS=full`, as for a Balancer; 6 in CI): every flip is on the wire within
/// 2 s of the write, no request fails, the proxy pods are the same, and connections opened
/// before the flips keep their backend. The HTTP listener beside it is refused, honestly.
pub async fn a_tcproute_flips_live_like_a_balancer(world: &mut World) {
    world.ensure_sample(Sample::AS_SHIPPED).await;
    world.ensure_gateway_api().await;
    world.kubectl.apply(&objects());
    let address = format!("{}:{PORT}", programmed_address(world, GATEWAY).await);
    let first = eventually("v1 through the Gateway", Duration::from_secs(60), || async {
        one_request(&address).await.ok().filter(|a| a == "hello world v1")
    })
    .await;
    println!("node: the Gateway's TCP listener answers {first:?} at {address}");
    // The route's backend is its Service's ready pods, at the Service's target port, as a
    // Balancer's backend is (not the Service's cluster IP).
    let mut v1_pods: Vec<String> =
        pod_ips(world, NS, "app=test,version=v1").await.into_iter().map(|ip| format!("{ip}:5678")).collect();
    v1_pods.sort();
    assert!(!v1_pods.is_empty(), "v1 has pods");
    eventually("the Gateway's upstreams are gw-v1's ready pods", Duration::from_secs(30), || async {
        let model = proxy_model(world, PROXY).await?;
        let mut serving: Vec<String> =
            model.listeners.first()?.servers.iter().filter(|s| s.weight > 0).map(|s| s.address.clone()).collect();
        serving.sort();
        (serving == v1_pods).then_some(())
    })
    .await;
    let gateway: Gateway = Api::namespaced(world.admin.clone(), NS).get(GATEWAY).await.expect("the Gateway");
    let listeners = gateway.status.and_then(|s| s.listeners).expect("listener status");
    let web = listeners.iter().find(|l| l.name == "web").expect("the HTTP listener's status");
    let accepted = web.conditions.iter().find(|c| c.type_ == "Accepted").expect("Accepted");
    assert_eq!((accepted.status.as_str(), accepted.reason.as_str()), ("False", "UnsupportedProtocol"));
    let echo = listeners.iter().find(|l| l.name == "echo").expect("the TCP listener's status");
    assert_eq!(echo.attached_routes, 1);

    let pods = proxy_pod_uids(world, PROXY).await;
    assert!(!pods.is_empty(), "the Gateway has proxy pods");
    let size = Flips::from_env();
    let held = Held::open(&address, size.held).await;
    let load = Load::start(address.clone(), 4);
    let mut seconds = Vec::with_capacity(size.count);
    for flip in 0..size.count {
        let (to, v1, v2) = if flip % 2 == 0 { ("hello world v2", 0, 100) } else { ("hello world v1", 100, 0) };
        let written = Instant::now();
        set_weights(world, v1, v2);
        let (on_wire, _) = only_answer(address.clone(), to, written).await;
        seconds.push(on_wire);
        tokio::time::sleep(Duration::from_secs(2).max(size.apart.saturating_sub(written.elapsed()))).await;
    }
    seconds.sort_by(f64::total_cmp);
    let flips = seconds.len();
    println!(
        "node: {flips} TCPRoute flips on the wire after (s, from the write): p50 {:.2}, p90 {:.2}, max {:.2}, all {seconds:.2?}",
        quantile(&seconds, 0.5),
        quantile(&seconds, 0.9),
        seconds[flips - 1]
    );
    assert!(seconds[flips - 1] <= 2.0, "a flip took longer than 2 s: {seconds:?}");
    load.assert_no_failures("during the TCPRoute's flips").await;
    held.assert_kept(&format!("through {flips} TCPRoute flips")).await;
    assert_eq!(proxy_pod_uids(world, PROXY).await, pods, "the same proxy pods serve every flip");
}

/// The TLS Gateway's name, its proxy's and its listener's port.
const TLS_GATEWAY: &str = "tls-edge";
const TLS_PROXY: &str = "tls-edge-balancer";
const TLS_PORT: u16 = 8443;

/// A TLS backend `name`: nginx serving HTTPS on 8443 with a self-signed certificate for
/// `hostname` (in a Secret), answering `tls <name>`; its Service `tls-<name>`, port 8443. Returns
/// the objects and the certificate, which the clients trust for that name only.
fn tls_backend(name: &str, hostname: &str) -> (String, CertificateDer<'static>) {
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec![hostname.to_string()]).expect("a certificate");
    let conf = format!(
        "worker_processes 1;\npid /tmp/nginx.pid;\nevents {{}}\nhttp {{\n  access_log off;\n  \
         client_body_temp_path /tmp/client_body;\n  proxy_temp_path /tmp/proxy;\n  \
         fastcgi_temp_path /tmp/fastcgi;\n  uwsgi_temp_path /tmp/uwsgi;\n  scgi_temp_path /tmp/scgi;\n  \
         server {{\n    listen 8443 ssl;\n    ssl_certificate /etc/tls/tls.crt;\n    \
         ssl_certificate_key /etc/tls/tls.key;\n    \
         location / {{ default_type text/plain; return 200 \"tls {name}\\n\"; }}\n  }}\n}}\n"
    );
    let app = format!("tls-{name}");
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": app, "namespace": NS},
        "stringData": {"tls.crt": cert.pem(), "tls.key": signing_key.serialize_pem(), "nginx.conf": conf},
    });
    let container = json!({
        "name": "tls",
        "command": ["nginx", "-c", "/etc/tls/nginx.conf", "-e", "stderr", "-g", "daemon off;"],
        "ports": [{"containerPort": 8443}],
        "readinessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 1},
        "volumeMounts": [{"name": "tls", "mountPath": "/etc/tls"}],
    });
    let mut deployment = backend_deployment(NS, &app, json!({"app": app}), container);
    deployment["spec"]["template"]["spec"]["volumes"] = json!([{"name": "tls", "secret": {"secretName": app}}]);
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": app, "namespace": NS},
        "spec": {"selector": {"app": app}, "ports": [{"port": 8443}]},
    });
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [secret, deployment, service]});
    (objects.to_string(), cert.der().clone())
}

/// A Gateway with one TLS passthrough listener, its proxy settings from a ConfigMap (two pods,
/// a 10-minute drain), and a TLSRoute per `(name, hostname)` to Service `tls-<name>`.
fn tls_gateway(routes: &[(&str, &str)]) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: tls-edge-proxy, namespace: {NS}}}\n\
         data: {{replicas: \"2\", proxy: \"drainTimeout: 10m\"}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {TLS_GATEWAY}, namespace: {NS}}}\n\
         spec:\n  gatewayClassName: balancer\n  \
         infrastructure: {{parametersRef: {{group: \"\", kind: ConfigMap, name: tls-edge-proxy}}}}\n  listeners:\n  \
         - {{name: tls, port: {TLS_PORT}, protocol: TLS, tls: {{mode: Passthrough}}}}\n"
    );
    for (name, hostname) in routes {
        out.push_str(&format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: TLSRoute\nmetadata: {{name: {name}, namespace: {NS}}}\n\
             spec:\n  parentRefs: [{{name: {TLS_GATEWAY}}}]\n  hostnames: [{hostname}]\n  \
             rules: [{{backendRefs: [{{name: tls-{name}, port: 8443}}]}}]\n"
        ));
    }
    out
}

/// One HTTPS request to `address` with `name` as the server name, verifying the backend's
/// certificate against `trusted` only: the answer's first line, or the error (refused, or a
/// certificate that is not the trusted one).
async fn tls_ask(address: &str, name: &str, trusted: &CertificateDer<'static>) -> Result<String, String> {
    let mut roots = RootCertStore::empty();
    roots.add(trusted.clone()).map_err(|e| e.to_string())?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server_name = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(address).await?;
        let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(server_name, tcp).await?;
        tls.write_all(format!("GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
        let mut reply = String::new();
        tls.read_to_string(&mut reply).await?;
        Ok::<_, std::io::Error>(reply)
    };
    match tokio::time::timeout(Duration::from_secs(5), exchange).await {
        Ok(Ok(reply)) => reply.split("\r\n\r\n").nth(1).map(|b| b.trim().to_string()).ok_or(reply),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err("timed out".into()),
    }
}

/// TLS passthrough on real nodes: two server names on one TLS listener each reach their own
/// backend, whose certificate (trusted for that name alone) the client verifies through the
/// proxy; a name no route covers, and no name at all, are refused. The Gateway's proxy has the
/// two pods its `parametersRef` ConfigMap asks for.
pub async fn a_tlsroute_sends_each_server_name_to_its_own_backend(world: &mut World) {
    world.ensure_namespace().await;
    world.ensure_gateway_api().await;
    let (db, db_cert) = tls_backend("db", "db.example.com");
    let (web, web_cert) = tls_backend("web", "web.example.com");
    world.kubectl.apply(&db);
    world.kubectl.apply(&web);
    for name in ["tls-db", "tls-web"] {
        crate::fixtures::wait_available(world, NS, name, 1).await;
    }
    world.kubectl.apply(&tls_gateway(&[("db", "db.example.com"), ("web", "web.example.com")]));
    let address = format!("{}:{TLS_PORT}", programmed_address(world, TLS_GATEWAY).await);
    for (name, cert, answer) in [("db.example.com", &db_cert, "tls db"), ("web.example.com", &web_cert, "tls web")] {
        let got = eventually(&format!("{name} through the TLS listener"), Duration::from_secs(60), || async {
            tls_ask(&address, name, cert).await.ok().filter(|a| a == answer)
        })
        .await;
        println!("node: TLS passthrough: {name} answered {got:?}, its own certificate verified through the proxy");
    }
    for _ in 0..20 {
        assert_eq!(tls_ask(&address, "db.example.com", &db_cert).await.as_deref(), Ok("tls db"));
        assert_eq!(tls_ask(&address, "web.example.com", &web_cert).await.as_deref(), Ok("tls web"));
    }
    // Were either name's connection passed to a backend, the handshake would end in a
    // certificate error (each is trusted for its own name only); refused, it ends before one.
    let address_only = address.split(':').next().unwrap_or_default().to_string();
    for name in ["other.example.com", "example.com", address_only.as_str()] {
        let refused = tls_ask(&address, name, &db_cert).await;
        match &refused {
            Err(error) if !error.contains("certificate") => {}
            other => panic!("{name} should be refused by the proxy, before any certificate: {other:?}"),
        }
        println!("node: TLS passthrough: {name} refused ({})", refused.err().unwrap_or_default());
    }
    eventually("the two proxy pods the Gateway's parameters ask for", Duration::from_secs(60), || async {
        (proxy_pod_uids(world, TLS_PROXY).await.len() == 2).then_some(())
    })
    .await;
    keywords_in_a_route_freeze_nothing(world, &address, &db_cert).await;
    invalid_parameters_keep_route_changes_applying(world, &address, &db_cert, &web_cert).await;
}

/// A tenant's TLSRoute whose hostnames are the words nginx gives meaning to inside a `map`
/// (`default`, `include`, `hostnames`, `volatile`) is served like any name: the other routes
/// keep answering, and a proxy pod deleted meanwhile is replaced by one that becomes Ready
/// (before, `nginx -t` refused every configuration of the Gateway, and a new pod never was).
/// The next step's route change, with this route in place, reaches the wire within 10 s.
async fn keywords_in_a_route_freeze_nothing(world: &World, address: &str, db_cert: &CertificateDer<'static>) {
    let route = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: TLSRoute\nmetadata: {{name: keywords, namespace: {NS}}}\n\
         spec:\n  parentRefs: [{{name: {TLS_GATEWAY}}}]\n  hostnames: [default, include, hostnames, volatile]\n  \
         rules: [{{backendRefs: [{{name: tls-db, port: 8443}}]}}]\n"
    );
    world.kubectl.apply(&route);
    eventually("the keyword route served: default reaches tls-db", Duration::from_secs(30), || async {
        // tls-db's certificate is for db.example.com: reaching it fails on the certificate.
        tls_ask(address, "default", db_cert).await.err().filter(|e| e.contains("certificate")).map(drop)
    })
    .await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(world.admin.clone(), NS);
    let selector = balancer::proxy::proxy_selector_string(TLS_PROXY);
    let listed = pods.list(&kube::api::ListParams::default().labels(&selector)).await.expect("the proxy pods");
    let victim = listed.items.first().expect("a proxy pod").clone();
    let (name, victim) = (victim.metadata.name.unwrap_or_default(), victim.metadata.uid.unwrap_or_default());
    world.kubectl.ok(&["-n", NS, "delete", "pod", &name, "--wait=false"]);
    eventually("a replacement proxy pod Ready beside the keyword route", Duration::from_secs(90), || async {
        let now = proxy_pod_uids(world, TLS_PROXY).await;
        (now.len() == 2 && !now.contains(&victim)).then_some(())
    })
    .await;
    let deployment = balancer::api::proxy_deployment_name(TLS_PROXY);
    crate::fixtures::wait_available(world, NS, &deployment, 2).await;
    assert_eq!(tls_ask(address, "db.example.com", db_cert).await.as_deref(), Ok("tls db"), "the other route");
    println!(
        "node: a TLSRoute for default, include, hostnames and volatile is served; a replaced proxy pod became Ready"
    );
}

/// Invalid parameters (`replicas: many`) leave the last accepted in force: the Gateway says
/// `Accepted=False InvalidParameters`, a route removed meanwhile is off the wire within 10 s,
/// the proxy keeps its two pods; valid parameters and the route again put it all back.
async fn invalid_parameters_keep_route_changes_applying(
    world: &World,
    address: &str,
    db_cert: &CertificateDer<'static>,
    web_cert: &CertificateDer<'static>,
) {
    let pods = || async {
        let mut uids = proxy_pod_uids(world, TLS_PROXY).await;
        uids.sort_unstable();
        uids
    };
    let before = pods().await;
    let invalid = r#"{"data": {"replicas": "many"}}"#;
    world.kubectl.ok(&["-n", NS, "patch", "configmap", "tls-edge-proxy", "--type=merge", "-p", invalid]);
    let gateways: Api<Gateway> = Api::namespaced(world.admin.clone(), NS);
    let message = eventually("the Gateway's Accepted=False InvalidParameters", Duration::from_secs(30), || async {
        let conditions = gateways.get(TLS_GATEWAY).await.ok()?.status?.conditions?;
        let accepted = conditions.into_iter().find(|c| c.type_ == "Accepted")?;
        (accepted.reason == "InvalidParameters").then_some(accepted.message)
    })
    .await;
    assert!(message.contains("stay in force"), "{message}");
    let removed = Instant::now();
    world.kubectl.ok(&["-n", NS, "delete", "tlsroute", "web"]);
    eventually("web.example.com off the wire", Duration::from_secs(10), || async {
        tls_ask(address, "web.example.com", web_cert).await.is_err().then_some(())
    })
    .await;
    println!(
        "node: with invalid parameters, a removed TLSRoute was off the wire {:.2} s after the delete",
        removed.elapsed().as_secs_f64()
    );
    assert_eq!(tls_ask(address, "db.example.com", db_cert).await.as_deref(), Ok("tls db"), "the other route");
    assert_eq!(pods().await, before, "the same two pods: the last parameters in force");
    world.kubectl.apply(&tls_gateway(&[("db", "db.example.com"), ("web", "web.example.com")]));
    world.kubectl.ok(&["-n", NS, "delete", "tlsroute", "keywords"]);
    eventually("web.example.com back, with valid parameters", Duration::from_secs(30), || async {
        tls_ask(address, "web.example.com", web_cert).await.ok().filter(|a| a == "tls web")
    })
    .await;
}

/// A Balancer beside the Gateway, in the same namespace: port 80 to the v2 echo pods.
const SIDE: &str = "side";

fn side_balancer() -> String {
    format!(
        "apiVersion: exposer.hliangzhao.io/v1beta1\nkind: Balancer\nmetadata: {{name: {SIDE}, namespace: {NS}}}\n\
         spec:\n  ports: [{{name: http, protocol: TCP, port: 80, targetPort: 5678}}]\n  \
         selector: {{app: test}}\n  backends: [{{name: v2, weight: 1, selector: {{version: v2}}}}]\n"
    )
}

/// Waits until no pod of proxy `proxy` is left.
async fn proxy_gone(world: &World, proxy: &str) {
    eventually(&format!("every pod of {proxy} gone"), Duration::from_secs(90), || async {
        proxy_pod_uids(world, proxy).await.is_empty().then_some(())
    })
    .await;
}

/// A Gateway's routes and a Balancer in one namespace, each with its own proxy: deleting the
/// Gateway leaves the Balancer serving without a failed request, and deleting the Balancer
/// leaves the Gateway serving without one.
pub async fn a_gateway_and_a_balancer_in_one_namespace_coexist(world: &mut World) {
    world.ensure_echo_backends().await;
    world.ensure_gateway_api().await;
    world.kubectl.apply(&objects());
    world.kubectl.apply(&side_balancer());
    let gateway = format!("{}:{PORT}", programmed_address(world, GATEWAY).await);
    crate::fixtures::wait_ready_balancer(world, SIDE, Duration::from_secs(120)).await;
    let side = format!("{}:80", crate::fixtures::front_ip(world, SIDE).await);
    for (address, answer) in [(&gateway, "hello world v1"), (&side, "hello world v2")] {
        eventually(&format!("{answer} at {address}"), Duration::from_secs(60), || async {
            one_request(address).await.ok().filter(|a| a == answer)
        })
        .await;
    }
    let on_side = Load::start(side.clone(), 2);
    world.kubectl.ok(&["-n", NS, "delete", "gateway", GATEWAY, "--wait=true"]);
    proxy_gone(world, PROXY).await;
    on_side.assert_no_failures("through the Balancer while the Gateway beside it was deleted").await;

    world.kubectl.apply(&objects());
    let gateway = format!("{}:{PORT}", programmed_address(world, GATEWAY).await);
    eventually("the Gateway serving again", Duration::from_secs(60), || async {
        one_request(&gateway).await.ok().filter(|a| a.starts_with("hello world"))
    })
    .await;
    let on_gateway = Load::start(gateway.clone(), 2);
    world.kubectl.ok(&["-n", NS, "delete", "balancer", SIDE, "--wait=true"]);
    proxy_gone(world, "side").await;
    on_gateway.assert_no_failures("through the Gateway while the Balancer beside it was deleted").await;
}

/// The Gateway that moves between classes, its port and its route.
const LEAVING: &str = "leaving";
const LEAVING_PORT: u16 = 8090;

/// A second class of balancer's, another controller's, and the Gateway `leaving` of class
/// `class` with a TCPRoute to gw-v1.
fn leaving(class: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: balancer-b}}\n\
         spec: {{controllerName: exposer.hliangzhao.io/balancer}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: elsewhere}}\n\
         spec: {{controllerName: example.com/elsewhere}}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: gw-v1, namespace: {NS}}}\n\
         spec: {{selector: {{app: test, version: v1}}, ports: [{{port: 80, targetPort: 5678}}]}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {LEAVING}, namespace: {NS}}}\n\
         spec:\n  gatewayClassName: {class}\n  listeners: [{{name: echo, port: {LEAVING_PORT}, protocol: TCP}}]\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata: {{name: {LEAVING}, namespace: {NS}}}\n\
         spec:\n  parentRefs: [{{name: {LEAVING}}}]\n  rules: [{{backendRefs: [{{name: gw-v1, port: 80}}]}}]\n"
    )
}

/// Which of proxy `proxy`'s serving children exist: its Deployment and front Service (its
/// ConfigMap and identity stay, inert, until the Gateway goes: the operator may not delete them).
async fn proxy_children(world: &World, proxy: &str) -> [bool; 2] {
    let exists = |kind: &str, name: &str| world.kubectl.run(&["-n", NS, "get", kind, name, "-o", "name"], None).0;
    [exists("deployment", &balancer::api::proxy_deployment_name(proxy)), exists("service", proxy)]
}

/// Whether route `leaving`'s status has balancer's entry for its Gateway.
async fn route_entry(world: &World) -> bool {
    let routes: Api<balancer::gateway::api::tcproutes::TcpRoute> = Api::namespaced(world.admin.clone(), NS);
    let route = routes.get(LEAVING).await.expect("the TCPRoute");
    let parents = route.status.map(|s| s.parents).unwrap_or_default();
    parents
        .iter()
        .any(|p| p.controller_name == balancer::gateway::status::CONTROLLER_NAME && p.parent_ref.name == LEAVING)
}

/// Waits until `what` holds: the children of `proxy` are `children`, and balancer's entry is
/// in the route's status or not (`entry`).
async fn leaving_state(world: &World, what: &str, proxy: &str, children: [bool; 2], entry: bool) {
    eventually(what, Duration::from_secs(60), || async {
        (proxy_children(world, proxy).await == children && route_entry(world).await == entry).then_some(())
    })
    .await;
}

/// A Gateway that moves to another of balancer's classes gets its proxy under the new name and
/// loses the old one; moved to another controller's class, it loses its proxy and balancer's
/// entries in its routes' status; back, and then deleted, its routes' entries go with it.
pub async fn a_gateway_that_leaves_balancer_leaves_nothing_behind(world: &mut World) {
    world.ensure_namespace().await;
    world.ensure_gateway_api().await;
    let (first, second) = ("leaving-balancer", "leaving-balancer-b");
    let set_class = |class: &str| {
        let patch = format!("{{\"spec\": {{\"gatewayClassName\": \"{class}\"}}}}");
        world.kubectl.ok(&["-n", NS, "patch", "gateway", LEAVING, "--type=merge", "-p", &patch]);
    };
    world.kubectl.apply(&leaving("balancer"));
    leaving_state(world, "the Gateway's proxy and its route's entry", first, [true; 2], true).await;
    set_class("balancer-b");
    leaving_state(world, "the proxy renamed for balancer-b, the old one gone", first, [false; 2], true).await;
    leaving_state(world, "the proxy under its new name", second, [true; 2], true).await;
    set_class("elsewhere");
    leaving_state(world, "another controller's Gateway: no proxy, no entry", second, [false; 2], false).await;
    set_class("balancer");
    leaving_state(world, "balancer's again", first, [true; 2], true).await;
    world.kubectl.ok(&["-n", NS, "delete", "gateway", LEAVING, "--wait=true"]);
    eventually("the deleted Gateway's entry withdrawn from its route", Duration::from_secs(60), || async {
        (!route_entry(world).await).then_some(())
    })
    .await;
    proxy_gone(world, first).await;
    println!("node: a Gateway moved between classes and deleted left no proxy and no route entry behind");
    world.kubectl.ok(&["-n", NS, "delete", "tcproute", LEAVING]);
    world.kubectl.ok(&["delete", "gatewayclass", "balancer-b", "elsewhere"]);
}

/// Where the conformance run writes its report (the committed one, `conformance/`, is copied
/// from it by hand: see conformance/README.md).
fn report_path() -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(std::path::PathBuf::from);
    target.unwrap_or_else(|| repo("target")).join("gateway-api-conformance-report.yaml")
}

/// Gateway API's conformance suite at v1.7.0 (`tests/kubernetes/conformance.sh`, balancer's
/// harness) for the GATEWAY-TCP, GATEWAY-UDP and GATEWAY-TLS profiles, run from the host
/// (which reaches the Gateways' cluster IPs) against the operator installed the README's way.
/// The test binary's exit status decides; its report is printed and written beside the build.
pub async fn gateway_api_conformance_for_tcp_udp_and_tls(world: &mut World) {
    world.ensure_gateway_api().await;
    let report = report_path();
    let _ = std::fs::remove_file(&report);
    let kubeconfig = world.plane.kubeconfig("admin");
    let suite = world.conformance.join("conformance.test");
    let skipped: Vec<&str> = CONFORMANCE_SKIPS.iter().map(|(test, _)| *test).collect();
    let args = [
        "-test.run=TestBalancer".to_string(),
        "-test.v".into(),
        "-test.timeout=20m".into(),
        "-gateway-class=balancer".into(),
        "-conformance-profiles=GATEWAY-TCP,GATEWAY-UDP,GATEWAY-TLS".into(),
        format!("-skip-tests={}", skipped.join(",")),
        format!("-report-output={}", report.display()),
        "-organization=balancer".into(),
        "-project=balancer".into(),
        "-url=https://github.com/hliangzhao/balancer".into(),
        format!("-version=v{}", env!("CARGO_PKG_VERSION")),
        "-contact=@balancer-maintainers".into(),
        "-mode=default".into(),
    ];
    println!("node: conformance: KUBECONFIG={} {} {}", kubeconfig.display(), suite.display(), args.join(" "));
    let started = Instant::now();
    // Its log goes to a file as it runs (tail it to follow a run), read back at the end.
    let log_path = report.with_extension("log");
    let log_file = std::fs::File::create(&log_path).expect("the suite's log file");
    let status = tokio::process::Command::new(&suite)
        .args(&args)
        .env("KUBECONFIG", &kubeconfig)
        // An interrupted scenario does not leave it running against the next cluster.
        .kill_on_drop(true)
        .stdout(log_file.try_clone().expect("the log file"))
        .stderr(log_file)
        .status()
        .await
        .expect("the conformance suite runs");
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let results: Vec<&str> = log.lines().filter(|l| l.trim_start().starts_with("--- ")).collect();
    println!(
        "node: conformance: {} results in {:.0} s (log: {}):\n{}",
        results.len(),
        started.elapsed().as_secs_f64(),
        log_path.display(),
        results.join("\n")
    );
    if let Ok(written) = std::fs::read_to_string(&report) {
        println!("node: conformance report ({}):\n{written}", report.display());
    }
    assert!(status.success(), "the conformance suite failed ({status}); its log is in {}", log_path.display());
}

/// The suite's tests balancer skips, each with its reason (also in conformance/README.md):
/// every one needs a Gateway whose listeners are HTTP or HTTPS, which balancer reports
/// `UnsupportedProtocol` and never `Programmed`, so the suite's wait for its Gateways to be
/// ready would never end (gateway-api issue #2403).
const CONFORMANCE_SKIPS: &[(&str, &str)] = &[
    ("GatewayListenerUnsupportedProtocol", "its Gateways have HTTP listeners, which balancer does not serve"),
    ("GatewayInvalidRouteKind", "its Gateway has an HTTP listener and an HTTPRoute"),
    ("GatewayInvalidTLSConfiguration", "its Gateways have HTTPS listeners (TLS that terminates)"),
    ("GatewayModifyListeners", "its Gateways have HTTP listeners and HTTPRoutes"),
    ("GatewayNameMaximumLength", "its Gateway has an HTTP listener only"),
    ("GatewayObservedGenerationBump", "its Gateway has an HTTP listener only"),
    ("GatewayPreserveForeignConditions", "its Gateway has an HTTP listener only"),
    ("GatewaySecretInvalidReferenceGrant", "an HTTPS listener's certificate Secret"),
    ("GatewaySecretMissingReferenceGrant", "an HTTPS listener's certificate Secret"),
    ("GatewaySecretReferenceGrantAllInNamespace", "an HTTPS listener's certificate Secret"),
    ("GatewaySecretReferenceGrantSpecific", "an HTTPS listener's certificate Secret"),
    ("TCPRouteInvalidNonTCPListener", "its only Gateway has an HTTP listener only"),
    ("TLSRouteInvalidNoMatchingListener", "its only Gateway has an HTTP listener only"),
];

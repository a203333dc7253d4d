//! The opt-in monitoring component: it renders, its ServiceMonitor matches the
//! protected metrics endpoint, and every metric its dashboard and alerts query is
//! one the operator exports.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use balancer::api::{BackendSpec, BalancerPort};
use balancer::controller::ControllerMetrics;
use balancer::exporter;
use balancer::proxy::model::{Destination, MODEL_FILE, ProxyConfig, ServiceUpstreams};
use balancer::proxy::nginx;
use tokio_util::sync::CancellationToken;

use serde_json::Value;

use crate::support;
use crate::support::find;

/// deploy/ plus the component, rendered through an overlay as a user would write it.
fn rendered() -> Option<Vec<Value>> {
    support::have_tool("kubectl").then(|| support::kustomize_deploy_with("monitoring-overlay", &["monitoring"]))
}

/// Metric families the operator and the proxies' metrics sidecar register, from real scrapes.
async fn exported_families() -> BTreeSet<String> {
    let server = support::TestServer::start().await;
    let mut text = server.metrics().await;
    server.stop().await;
    text.push_str(&sidecar_exposition().await);
    text.push_str(&only_while_set());
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(String::from)
        .collect()
}

/// What `balancer proxy-metrics` serves for the sample's rendered `nginx.conf`.
async fn sidecar_exposition() -> String {
    let policy = balancer::spec::SpecPolicy::default();
    let spec = crate::support::fixtures::admitted("example-balancer", crate::support::fixtures::sample_spec(), &policy);
    let address = |b: &BackendSpec, p: &BalancerPort| Destination::Name {
        host: format!("{}.test", b.name),
        port: u16::try_from(p.port).expect("a port"),
    };
    let dir = tempfile::TempDir::new().unwrap();
    let log_file = dir.path().join("access.log");
    let model = ProxyConfig::of("example-balancer", &spec, &[], log_file.to_str(), &ServiceUpstreams(&address));
    let conf = nginx::write(&model);
    std::fs::write(dir.path().join("nginx.conf"), &conf).unwrap();
    std::fs::write(dir.path().join(MODEL_FILE), model.to_json()).unwrap();
    let port = crate::support::ports::listen_port();
    let options = exporter::Options {
        source: exporter::Source::File { path: dir.path().join("nginx.conf"), hash: Some(nginx::config_hash(&conf)) },
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        log_file: log_file.clone(),
        drain: Duration::ZERO,
    };
    let stop = CancellationToken::new();
    // A failed assertion still stops the sidecar: the runtime waits for its blocking log reader.
    let _stop_on_failure = stop.clone().drop_guard();
    let sidecar = tokio::spawn(exporter::run(options, stop.clone()));
    let url = format!("http://127.0.0.1:{port}/metrics");
    let mut text = String::new();
    for _ in 0..200 {
        if let Ok(answer) = http_get(&url).await {
            text = answer;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A session that failed to connect to v1 and was served by v2: every family gets a sample
    // (a family shows in the exposition once it has one).
    let line = "80 TCP 200 10 20 0.005 \"v1.test:80, v2.test:80\" \"-, 0.001\"\n";
    let mut log = std::fs::OpenOptions::new().append(true).create(true).open(&log_file).unwrap();
    std::io::Write::write_all(&mut log, line.as_bytes()).unwrap();
    // Counted once the session's `ok` is 1: the series of a new backend are made one family
    // after another, so a scrape in between sees some families and not yet the others.
    for _ in 0..200 {
        text = http_get(&url).await.unwrap_or_default();
        if text.contains("backend=\"v2\",outcome=\"ok\"} 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    let _ = sidecar.await;
    assert!(text.contains("balancer_proxy_backend_weight"), "the sidecar served: {text}");
    text
}

/// The operator's series that exist only while they have something to say, set once.
fn only_while_set() -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = ControllerMetrics::register(registry.sub_registry_with_prefix("balancer"));
    metrics.set_backends_unavailable([("ns".to_string(), "lb".to_string(), 1)]);
    metrics.set_canaries([balancer::controller::CanaryCount {
        namespace: "ns".into(),
        balancer: "lb".into(),
        phase: "Aborted",
        step: 0,
        weight: 0,
    }]);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("balancer_backends_unavailable{namespace=\"ns\",balancer=\"lb\"} 1"), "{text}");
    text
}

/// A plain-HTTP GET over a TCP stream.
async fn http_get(url: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = tokio::net::TcpStream::connect(host).await?;
    stream.write_all(format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    Ok(answer)
}

/// The metric families a PromQL expression reads.
fn families_in(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("balancer_") {
        let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        rest = &rest[at + name.len()..];
        let family = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .fold(name.clone(), |n, suffix| n.strip_suffix(suffix).map(String::from).unwrap_or(n));
        names.push(family);
    }
    names
}

#[tokio::test]
async fn dashboard_and_alerts_query_only_exported_metrics() {
    let Some(docs) = rendered() else { return };
    let exported = exported_families().await;
    assert!(exported.contains("balancer_admission_requests"), "{exported:?}");

    let dashboard_map = find(&docs, "ConfigMap", "balancer-grafana-dashboard");
    assert_eq!(dashboard_map["metadata"]["labels"]["grafana_dashboard"], "1");
    let dashboard: Value = serde_json::from_str(dashboard_map["data"]["balancer-dashboard.json"].as_str().unwrap())
        .expect("the dashboard is JSON");
    let mut queried = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            queried.extend(families_in(target["expr"].as_str().unwrap()));
        }
    }
    let rules = find(&docs, "PrometheusRule", "balancer");
    let alerts = rules["spec"]["groups"][0]["rules"].as_array().unwrap();
    let alert_names: Vec<&str> = alerts.iter().map(|r| r["alert"].as_str().unwrap()).collect();
    assert_eq!(
        alert_names,
        [
            "BalancerWebhookErrors",
            "BalancerWebhookSlow",
            "BalancerCertificateExpiresSoon",
            "BalancerReconcileErrors",
            "BalancerNoLeader",
            "BalancerAPIServerUnreachable",
            "BalancersNotReady",
            "BalancerBackendConnectFailures",
            "BalancerCanaryRolledBack",
            "BalancerBackendsUnavailable"
        ]
    );
    for rule in alerts {
        let names = families_in(rule["expr"].as_str().unwrap());
        assert!(!names.is_empty(), "{} queries no balancer metric", rule["alert"]);
        queried.extend(names);
    }
    for family in &queried {
        assert!(exported.contains(family), "{family} is queried but not exported; exported: {exported:?}");
    }
    // The dashboard covers the promised signals.
    for family in [
        "balancer_admission_requests",
        "balancer_admission_duration_seconds",
        "balancer_reconciles",
        "balancer_reconcile_errors",
        "balancer_balancers",
        "balancer_tls_certificate_expiry_timestamp_seconds",
        "balancer_api_unreachable_since_timestamp_seconds",
        "balancer_backends_unavailable",
        "balancer_proxy_sessions",
        "balancer_proxy_backend_weight",
        "balancer_proxy_upstream_connect_failures",
        "balancer_proxy_received_bytes",
        "balancer_proxy_sent_bytes",
        "balancer_proxy_log_unread_bytes",
    ] {
        assert!(queried.iter().any(|q| q == family), "nothing shows {family}");
    }
}

#[test]
fn the_service_monitor_scrapes_the_protected_endpoint() {
    let Some(docs) = rendered() else { return };
    let monitor = find(&docs, "ServiceMonitor", "balancer");
    let (service, certificate) = support::webhook_service_and_certificate(&docs);
    let endpoint = &monitor["spec"]["endpoints"][0];
    for (key, value) in monitor["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&service["metadata"]["labels"][key], value, "the ServiceMonitor selects the webhook Service");
    }
    let port = service["spec"]["ports"].as_array().unwrap().iter().find(|p| p["name"] == endpoint["port"]).unwrap();
    assert_eq!(port["port"], 8443);
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(endpoint["path"], "/metrics");
    assert!(endpoint["bearerTokenFile"].is_string(), "scrapes with a service-account token");
    assert_eq!(endpoint["tlsConfig"]["ca"]["secret"]["name"], certificate["spec"]["secretName"]);
    let server_name = endpoint["tlsConfig"]["serverName"].as_str().unwrap();
    assert!(certificate["spec"]["dnsNames"].as_array().unwrap().iter().any(|n| n == server_name));
    let binding = find(&docs, "ClusterRoleBinding", "balancer-metrics-reader-prometheus");
    assert_eq!(binding["roleRef"]["name"], "balancer-metrics-reader");
    // Prometheus must also be able to discover the endpoints in the operator's namespace.
    let discovery = find(&docs, "RoleBinding", "balancer-prometheus-discovery");
    assert_eq!(discovery["metadata"]["namespace"], "balancer-system");
    assert_eq!(discovery["subjects"], binding["subjects"]);
    let role = find(&docs, "Role", "balancer-prometheus-discovery");
    assert!(role["rules"][0]["resources"].as_array().unwrap().iter().any(|r| r == "endpoints"));
}

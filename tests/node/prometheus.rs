//! A real Prometheus (3.16.0, built by `tests/kubernetes/prometheus.sh`, run on the host, which
//! routes to the pod network) scrapes what the shipped monitors say and evaluates the shipped
//! rules.
//!
//! There is no Prometheus Operator here: the test translates the ServiceMonitor and the
//! PodMonitor into Prometheus's own scrape configuration much as the operator does
//! (`kubernetes_sd_configs` with `role: endpointslice`, which the operator uses with
//! `serviceDiscoveryRole: EndpointSlice`, its default being the deprecated Endpoints API, and
//! `role: pod`; the selectors and ports as `keep` relabelings; its target labels `namespace`,
//! `service`, `pod`, `container`, `endpoint` and `job`). The ServiceMonitor's job discovers with the shipped
//! scraper Role and scrapes with the ServiceAccount's token, as the monitor says; the
//! PodMonitor's (every namespace) discovers as the administrator, as kube-prometheus grants
//! its Prometheus per namespace by its own configuration.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fixtures::{Sample, front_ip, wait_available, wait_backends};
use crate::toolkit::load::Load;
use crate::toolkit::runner::eventually;
use crate::{NS, OPERATOR_NS, SAMPLE, World, repo};

/// The alert the scenario brings about, and its `for:` shortened from 5 minutes.
const BACKENDS_ALERT: (&str, &str) = ("BalancerBackendsUnavailable", "5s");

/// The ServiceAccount the shipped scraper RBAC binds (kube-prometheus's).
const SCRAPER: (&str, &str) = ("monitoring", "prometheus-k8s");

/// Dashboard queries whose series exist only during an incident this scenario does not
/// bring about, each with the reason.
const INCIDENT_ONLY: &[(&str, &str)] = &[
    ("balancer_reconcile_errors_total", "a counter per error kind, first written by a failed reconcile"),
    ("balancer_api_unreachable_since_timestamp_seconds > 0", "non-zero only while the API server is unreachable"),
    ("balancer_proxy_upstream_connect_failures_total", "a counter per backend, first written by a failed connect"),
    ("balancer_children_deleted_total", "a counter per kind, first written when a child is deleted"),
];

/// A Prometheus process on the host, stopped (and its files removed) when dropped.
struct Prometheus {
    child: Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus on `config` (written into a folder of its own with `files`), on a
    /// free loopback port, and waits until it is ready.
    async fn start(built: &Path, config: &Value, files: &[(&str, String)]) -> Prometheus {
        let dir = tempfile::TempDir::new().expect("temp dir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("a Prometheus file");
        }
        // JSON is YAML: Prometheus reads it as its configuration.
        std::fs::write(dir.path().join("prometheus.yml"), config.to_string()).expect("prometheus.yml");
        let check = Command::new(built.join("promtool"))
            .args(["check", "config", "prometheus.yml"])
            .current_dir(dir.path())
            .output();
        let check = check.expect("promtool runs");
        let said = format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
        assert!(check.status.success(), "promtool check config:\n{said}\n{config:#}");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address");
        let address = port.to_string();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("a log file");
        let child = Command::new(built.join("prometheus"))
            .current_dir(dir.path())
            .args(["--config.file=prometheus.yml", "--storage.tsdb.path=data"])
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        let mut prometheus = Prometheus { child, address, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while prometheus.get("/-/ready").is_none() {
            let exited = prometheus.child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() > deadline {
                let log = std::fs::read_to_string(prometheus._dir.path().join("prometheus.log")).unwrap_or_default();
                panic!("Prometheus not ready ({exited:?}):\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        prometheus
    }

    /// `GET path` on Prometheus's HTTP API (query parameters URL-encoded), its body parsed as
    /// JSON; `None` while it does not answer 200.
    fn get(&self, path: &str) -> Option<Value> {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "5"])
            .arg(format!("http://{}{path}", self.address))
            .output()
            .ok()?;
        out.status.success().then(|| serde_json::from_slice(&out.stdout).unwrap_or(Value::Null))
    }

    /// An instant query's result vector.
    fn query(&self, expr: &str) -> Vec<Value> {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "5", "--get", "--data-urlencode", &format!("query={expr}")])
            .arg(format!("http://{}/api/v1/query", self.address))
            .output()
            .expect("curl runs");
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        assert_eq!(answer["status"], "success", "the query {expr}: {answer}");
        answer["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The active targets of a scrape pool: (health, labels, last error).
    fn targets(&self, pool: &str) -> Vec<(String, Value, String)> {
        let targets = self.get("/api/v1/targets?state=active").unwrap_or(Value::Null);
        let active = targets["data"]["activeTargets"].as_array().cloned().unwrap_or_default();
        active
            .into_iter()
            .filter(|t| t["scrapePool"] == pool)
            .map(|t| (t["health"].as_str().unwrap_or("").to_string(), t["labels"].clone(), t["lastError"].to_string()))
            .collect()
    }

    /// The alerts firing now, by their labels.
    fn firing(&self, alert: &str) -> Vec<Value> {
        let alerts = self.get("/api/v1/alerts").unwrap_or(Value::Null);
        let all = alerts["data"]["alerts"].as_array().cloned().unwrap_or_default();
        all.into_iter().filter(|a| a["labels"]["alertname"] == alert && a["state"] == "firing").collect()
    }
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(repo(path)).expect("a repository file");
    serde_saphyr::from_str(&text).expect("YAML")
}

/// A label name as Prometheus's service discovery writes it in its meta labels.
fn sanitized(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

/// `keep` relabelings for a monitor's `selector.matchLabels` over `prefix` meta labels.
fn keep_labels(match_labels: &Value, prefix: &str) -> Vec<Value> {
    let labels = match_labels.as_object().expect("matchLabels");
    labels
        .iter()
        .map(|(name, value)| {
            json!({"action": "keep", "source_labels": [format!("{prefix}{}", sanitized(name))], "regex": value})
        })
        .collect()
}

/// The target labels the Prometheus Operator writes, after `extra` relabelings.
fn target_labels(extra: Vec<Value>, job: Value) -> Vec<Value> {
    let set = |source: &str, target: &str| json!({"source_labels": [source], "target_label": target});
    let mut relabel = extra;
    relabel.extend([
        set("__meta_kubernetes_namespace", "namespace"),
        set("__meta_kubernetes_pod_name", "pod"),
        set("__meta_kubernetes_pod_container_name", "container"),
        job,
    ]);
    relabel
}

/// The ServiceMonitor's first endpoint as a scrape configuration, discovering with
/// `kubeconfig` and authenticating with the token in `token_file`, trusting `ca_file`.
fn service_monitor_job(monitor: &Value, kubeconfig: &str) -> Value {
    let namespace = monitor["metadata"]["namespace"].as_str().expect("a namespace");
    let endpoint = &monitor["spec"]["endpoints"][0];
    let tls = &endpoint["tlsConfig"];
    assert!(endpoint["bearerTokenFile"].is_string(), "the ServiceMonitor authenticates with a token file");
    let mut relabel = keep_labels(&monitor["spec"]["selector"]["matchLabels"], "__meta_kubernetes_service_label_");
    let port = endpoint["port"].as_str().expect("a port name");
    relabel
        .push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_endpointslice_port_name"], "regex": port}));
    relabel.push(json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"}));
    relabel.push(json!({"target_label": "endpoint", "replacement": port}));
    let job = json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"});
    json!({
        "job_name": format!("serviceMonitor/{namespace}/{}/0", monitor["metadata"]["name"].as_str().unwrap_or("")),
        "kubernetes_sd_configs": [{"role": "endpointslice", "kubeconfig_file": kubeconfig,
                                   "namespaces": {"names": [namespace]}}],
        "scheme": endpoint["scheme"], "metrics_path": endpoint["path"],
        "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
        "authorization": {"credentials_file": "token"},
        "tls_config": {"ca_file": "ca.crt", "server_name": tls["serverName"]},
        "relabel_configs": target_labels(relabel, job),
    })
}

/// The PodMonitor's first endpoint as a scrape configuration, discovering with `kubeconfig`.
fn pod_monitor_job(monitor: &Value, kubeconfig: &str) -> Value {
    let name = format!(
        "{}/{}",
        monitor["metadata"]["namespace"].as_str().unwrap_or(""),
        monitor["metadata"]["name"].as_str().unwrap_or("")
    );
    assert_eq!(monitor["spec"]["namespaceSelector"]["any"], true, "the PodMonitor watches every namespace");
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    let mut relabel = vec![json!({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
                                  "regex": "(Failed|Succeeded)"})];
    relabel.extend(keep_labels(&monitor["spec"]["selector"]["matchLabels"], "__meta_kubernetes_pod_label_"));
    let port = endpoint["port"].as_str().expect("a port name");
    relabel
        .push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port}));
    relabel.push(json!({"target_label": "endpoint", "replacement": port}));
    let job = json!({"target_label": "job", "replacement": name});
    json!({
        "job_name": format!("podMonitor/{name}/0"),
        "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": kubeconfig}],
        "metrics_path": endpoint["path"],
        "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
        "relabel_configs": target_labels(relabel, job),
    })
}

/// The shipped PrometheusRule's groups, the one alert's `for:` shortened.
fn rule_groups() -> Value {
    let mut groups = yaml("deploy/components/monitoring/prometheusrule.yaml")["spec"]["groups"].clone();
    let (alert, duration) = BACKENDS_ALERT;
    let rules = groups.as_array_mut().expect("groups").iter_mut().flat_map(|g| g["rules"].as_array_mut()).flatten();
    let rule = rules.into_iter().find(|r| r["alert"] == alert).unwrap_or_else(|| panic!("the rules hold {alert}"));
    rule["for"] = json!(duration);
    json!({"groups": groups})
}

/// The administrator's kubeconfig, authenticating with `token` instead.
fn token_kubeconfig(world: &World, token: &str) -> String {
    let text = std::fs::read_to_string(world.plane.kubeconfig("admin")).expect("the admin kubeconfig");
    let mut kubeconfig: Value = serde_saphyr::from_str(&text).expect("YAML");
    kubeconfig["users"] = json!([{"name": "scraper", "user": {"token": token}}]);
    for context in kubeconfig["contexts"].as_array_mut().into_iter().flatten() {
        context["context"]["user"] = json!("scraper");
    }
    kubeconfig.to_string()
}

/// The shipped scraper RBAC, its ServiceAccount, and a token of it.
fn scraper_token(world: &World) -> String {
    let (namespace, account) = SCRAPER;
    world.kubectl.apply(&format!("{{apiVersion: v1, kind: Namespace, metadata: {{name: {namespace}}}}}"));
    world.kubectl.apply(&format!(
        "{{apiVersion: v1, kind: ServiceAccount, metadata: {{name: {account}, namespace: {namespace}}}}}"
    ));
    world.kubectl.ok(&["apply", "-f", &repo("deploy/components/monitoring/scraper-rbac.yaml").display().to_string()]);
    world.kubectl.ok(&["-n", namespace, "create", "token", account, "--duration=1h"]).trim().to_string()
}

/// The webhook certificate's CA, as the monitor names it: `ca.crt` of the Secret, which
/// cert-manager writes. A Secret made by hand (`kubectl create secret tls`, the suite's
/// first installation, when this scenario runs alone) has none: then the CA the webhook
/// configurations trust.
fn serving_ca(world: &World, monitor: &Value) -> String {
    use base64::Engine as _;
    let secret = &monitor["spec"]["endpoints"][0]["tlsConfig"]["ca"]["secret"];
    let key = secret["key"].as_str().expect("a key").replace('.', "\\.");
    let name = secret["name"].as_str().expect("a Secret");
    let mut b64 =
        world.kubectl.ok(&["-n", OPERATOR_NS, "get", "secret", name, "-o", &format!("jsonpath={{.data.{key}}}")]);
    if b64.trim().is_empty() {
        println!("node: the Secret {name} has no {key} (not cert-manager's): the webhook configuration's CA instead");
        let path = "jsonpath={.webhooks[0].clientConfig.caBundle}";
        b64 = world.kubectl.ok(&["get", "validatingwebhookconfiguration", "balancer-validating", "-o", path]);
    }
    let pem = base64::engine::general_purpose::STANDARD.decode(b64.trim()).expect("base64");
    String::from_utf8(pem).expect("PEM")
}

/// Every dashboard query, `$balancer` set to the sample (after checking the variable's own
/// query offers it).
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo("deploy/components/monitoring/dashboard.json")).expect("dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("JSON");
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for panel in list.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap_or_default().replace("$balancer", SAMPLE);
                out.push((panel["title"].as_str().unwrap_or_default().to_string(), expr));
            }
            panels(&panel["panels"], out);
        }
    }
    let mut queries = Vec::new();
    panels(&dashboard["panels"], &mut queries);
    queries
}

/// The Prometheus of the monitors and rules, running.
async fn start_prometheus(world: &World) -> Prometheus {
    let monitor = yaml("deploy/components/monitoring/servicemonitor.yaml");
    let pods = yaml("deploy/components/monitoring/podmonitor.yaml");
    let token = scraper_token(world);
    let admin = world.plane.kubeconfig("admin").display().to_string();
    // Relative paths are Prometheus's configuration folder's files.
    let config = json!({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [service_monitor_job(&monitor, "scraper.kubeconfig"), pod_monitor_job(&pods, &admin)],
    });
    let files = [
        ("rules.yaml", rule_groups().to_string()),
        ("scraper.kubeconfig", token_kubeconfig(world, &token)),
        ("token", token),
        ("ca.crt", serving_ca(world, &monitor)),
    ];
    Prometheus::start(&world.prometheus, &config, &files).await
}

/// Puts back what the scenario changes, also when it fails: backend v2's one pod (later
/// scenarios expect the sample as shipped) and the scraper's namespace, ServiceAccount and RBAC.
struct Restore {
    kubeconfig: PathBuf,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let kubeconfig = format!("--kubeconfig={}", self.kubeconfig.display());
        let rbac = repo("deploy/components/monitoring/scraper-rbac.yaml").display().to_string();
        for args in [
            &["-n", NS, "scale", "deployment/echo-v2", "--replicas=1"][..],
            &["delete", "--ignore-not-found", "-f", &rbac][..],
            &["delete", "namespace", SCRAPER.0, "--ignore-not-found", "--wait=false"][..],
        ] {
            let _ = Command::new("kubectl").arg(&kubeconfig).args(args).output();
        }
    }
}

/// A real Prometheus scrapes the operator (with a token, over TLS) and every proxy sidecar
/// as the shipped monitors say, every dashboard query gives data (or its series exist only
/// in an incident, listed with the reason), and the shipped rules evaluate: with backend v2
/// scaled to 0, `BalancerBackendsUnavailable` fires, with its duration shortened.
pub async fn a_real_prometheus_scrapes_the_monitors_and_fires_the_shipped_alerts(world: &mut World) {
    world.ensure_sample(Sample::AS_SHIPPED).await;
    let _restore = Restore { kubeconfig: world.plane.kubeconfig("admin") };
    let load = Load::start(format!("{}:80", front_ip(world, SAMPLE).await), 2);
    let started = Instant::now();
    let prometheus = start_prometheus(world).await;
    every_target_up(&prometheus).await;
    println!("node: Prometheus up and scraping {:.1} s after its start", started.elapsed().as_secs_f64());
    let queries = dashboard_queries();
    every_dashboard_query_gives_data(&prometheus, &queries).await;
    the_backends_alert_fires(world, &prometheus, &queries).await;
    for (series, reason) in INCIDENT_ONLY {
        println!("node: not asserted, series of an incident: {series}: {reason}");
    }
    load.assert_no_failures("while Prometheus scraped").await;
}

/// Every target up: both operator replicas (token and CA accepted), and the proxy pods.
async fn every_target_up(prometheus: &Prometheus) {
    for (pool, least) in
        [("serviceMonitor/balancer-system/balancer/0", 2), ("podMonitor/balancer-system/balancer-proxies/0", 1)]
    {
        let deadline = Instant::now() + Duration::from_secs(60);
        let up = loop {
            let targets = prometheus.targets(pool);
            if targets.len() >= least && targets.iter().all(|(health, ..)| health == "up") {
                break targets;
            }
            assert!(Instant::now() < deadline, "{pool}: not {least} targets up after 60 s: {targets:#?}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        println!("node: Prometheus scrapes {} target(s) of {pool}", up.len());
    }
}

/// Whether a dashboard query's series exist only during an incident this scenario does not
/// bring about, or during the one it brings about later (a backend without endpoints).
fn asserted_later_or_never(expr: &str) -> bool {
    INCIDENT_ONLY.iter().any(|(series, _)| expr.contains(series)) || expr.contains("balancer_backends_unavailable")
}

/// The dashboard's variable offers the sample; then every query has data, once rates have
/// two samples.
async fn every_dashboard_query_gives_data(prometheus: &Prometheus, queries: &[(String, String)]) {
    let variable = prometheus.get("/api/v1/label/balancer/values?match[]=balancer_proxy_backend_weight");
    assert!(variable.is_some_and(|v| v["data"].as_array().is_some_and(|a| a.contains(&json!(SAMPLE)))));
    let asserted: Vec<&(String, String)> = queries.iter().filter(|(_, expr)| !asserted_later_or_never(expr)).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let empty: Vec<_> = asserted.iter().filter(|(_, expr)| prometheus.query(expr).is_empty()).collect();
        if empty.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "dashboard queries without data after 30 s: {empty:#?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("node: {} dashboard queries give data", asserted.len());
}

/// The shipped rules, evaluated: v2 without pods makes its alert fire, with the labels the
/// controller's series carry (the ServiceMonitor keeps them over the target's `namespace`),
/// and the dashboard's panel of it gives data; then v2 is back.
async fn the_backends_alert_fires(world: &World, prometheus: &Prometheus, queries: &[(String, String)]) {
    world.kubectl.ok(&["-n", NS, "scale", "deployment/echo-v2", "--replicas=0"]);
    let scaled = Instant::now();
    let (alert, duration) = BACKENDS_ALERT;
    let fired = eventually(&format!("{alert} firing"), Duration::from_secs(60), || async {
        prometheus.firing(alert).into_iter().next()
    })
    .await;
    println!(
        "node: {alert} (for: {duration}) fired {:.1} s after v2 was scaled to 0: {fired}",
        scaled.elapsed().as_secs_f64()
    );
    assert_eq!((fired["labels"]["namespace"].as_str(), fired["labels"]["balancer"].as_str()), (Some(NS), Some(SAMPLE)));
    let unavailable =
        queries.iter().find(|(_, expr)| expr.contains("balancer_backends_unavailable")).expect("its panel");
    assert!(!prometheus.query(&unavailable.1).is_empty(), "{unavailable:?} gives data during the incident");
    world.kubectl.ok(&["-n", NS, "scale", "deployment/echo-v2", "--replicas=1"]);
    wait_available(world, NS, "echo-v2", 1).await;
    wait_backends(world, SAMPLE, &[1, 1, 1], &[40, 20, 40], "True", Duration::from_secs(15)).await;
}

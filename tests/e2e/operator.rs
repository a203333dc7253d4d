//! The real `balancer` binary, run out of cluster against the test control plane
//! as the token user bound only to deploy/'s RBAC.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::toolkit::cluster::{ControlPlane, Proc};
use crate::toolkit::ports::listen_ports;

/// The binary under test: this build's, or `BALANCER_E2E_BINARY` (to compare two builds on one harness).
fn binary() -> std::path::PathBuf {
    std::env::var_os("BALANCER_E2E_BINARY").map_or_else(|| env!("CARGO_BIN_EXE_balancer").into(), Into::into)
}

pub struct Operator {
    pub name: String,
    pub process: Proc,
    pub webhook_port: u16,
    pub probe_port: u16,
    pub metrics_port: u16,
    /// Started with `--insecure-metrics`: `/metrics` is on the probe port, with no token.
    insecure_metrics: bool,
}

impl Operator {
    /// Starts `balancer run` with the control plane's certificate (valid for 127.0.0.1) and `extra` flags,
    /// and waits until it is ready and, unless it is electing a leader, its controller's caches have
    /// synced. (Readiness alone never waits for them: see `Readiness` in src/runtime/probes.rs.)
    pub async fn start(plane: &ControlPlane, name: &str, extra: &[&str]) -> Operator {
        let operator = Operator::spawn(plane, name, "operator", extra);
        operator.wait_for(plane, "/readyz").await;
        if !extra.contains(&"--leader-elect") {
            operator.wait_for_log(plane, "controller caches synced").await;
        }
        operator
    }

    /// Starts `balancer run` and waits until it is ready, and no longer.
    pub async fn start_ready(plane: &ControlPlane, name: &str, extra: &[&str]) -> Operator {
        let operator = Operator::spawn(plane, name, "operator", extra);
        operator.wait_for(plane, "/readyz").await;
        operator
    }

    /// Waits until the operator's log has a line containing `text`.
    pub async fn wait_for_log(&self, plane: &ControlPlane, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.log(plane).contains(text) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("{}: no {text:?} in the log within 60 s; log:\n{}", self.name, self.log(plane));
    }

    /// Starts `balancer run` as kubeconfig user `user` and waits only until it is alive (`/healthz`):
    /// for an operator whose controller may never become ready.
    pub async fn start_alive(plane: &ControlPlane, name: &str, user: &str, extra: &[&str]) -> Operator {
        let operator = Operator::spawn(plane, name, user, extra);
        operator.wait_for(plane, "/healthz").await;
        operator
    }

    fn spawn(plane: &ControlPlane, name: &str, user: &str, extra: &[&str]) -> Operator {
        let [webhook_port, probe_port, metrics_port] = listen_ports();
        let pki = plane.dir.path().join("pki");
        let process = Proc::spawn(
            name,
            Command::new(binary())
                .arg("run")
                .arg(format!("--webhook-addr=127.0.0.1:{webhook_port}"))
                .arg(format!("--probe-addr=127.0.0.1:{probe_port}"))
                .arg(format!("--metrics-addr=127.0.0.1:{metrics_port}"))
                .arg(format!("--tls-cert={}", pki.join("tls.crt").display()))
                .arg(format!("--tls-key={}", pki.join("tls.key").display()))
                .arg("--require-controller")
                .arg("--log-level=info,balancer=debug")
                .args(extra)
                .env("KUBECONFIG", plane.kubeconfig(user))
                .env("POD_NAME", name)
                .env("POD_NAMESPACE", "balancer-system")
                .env_remove("RUST_LOG"),
            &plane.dir.path().join(format!("{name}.log")),
        );
        let insecure_metrics = extra.contains(&"--insecure-metrics");
        Operator { name: name.into(), process, webhook_port, probe_port, metrics_port, insecure_metrics }
    }

    /// Waits until the probe `path` answers 200.
    async fn wait_for(&self, plane: &ControlPlane, path: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.probe(path).await == Some(200) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("{}: {path} not OK within 60 s; log:\n{}", self.name, self.log(plane));
    }

    /// The HTTP status of a probe (`/healthz`, `/readyz`), or `None` when nothing answers.
    pub async fn probe(&self, path: &str) -> Option<u16> {
        let url = format!("http://127.0.0.1:{}{path}", self.probe_port);
        reqwest::get(&url).await.ok().map(|r| r.status().as_u16())
    }

    pub fn log(&self, plane: &ControlPlane) -> String {
        std::fs::read_to_string(plane.dir.path().join(format!("{}.log", self.name))).unwrap_or_default()
    }

    pub fn webhook_url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.webhook_port)
    }

    /// Scrapes the protected `/metrics` with `token`; (HTTP status, body).
    pub async fn scrape(&self, plane: &ControlPlane, token: Option<&str>) -> (u16, String) {
        let client = crate::toolkit::cluster::http_client(&plane.ca_pem);
        let mut request = client.get(format!("https://127.0.0.1:{}/metrics", self.metrics_port));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        match request.send().await {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    /// The metrics text, scraped as the cluster admin (or from the probe port, with
    /// `--insecure-metrics`: then it needs no API server to review a token).
    pub async fn metrics(&self, plane: &ControlPlane) -> String {
        if self.insecure_metrics {
            let url = format!("http://127.0.0.1:{}/metrics", self.probe_port);
            return match reqwest::get(&url).await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
        }
        self.scrape(plane, Some(crate::toolkit::cluster::ADMIN.token)).await.1
    }

    /// The value of one sample, e.g. `balancer_controller_leader` or `x_total{result="success"}`.
    pub async fn metric(&self, plane: &ControlPlane, name: &str) -> Option<f64> {
        let text = self.metrics(plane).await;
        text.lines().find_map(|l| l.strip_prefix(&format!("{name} ")).and_then(|v| v.trim().parse().ok()))
    }

    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(20));
    }
}

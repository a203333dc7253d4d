//! A throwaway control plane: etcd, kube-apiserver (token auth, RBAC, audit
//! log) and kube-controller-manager (garbage collection, Deployments, HPAs), with
//! generated certificates and kubeconfigs. On loopback for the e2e suite; on the
//! node's bridge, with service accounts for pods, for the node suite. Every
//! process is killed when the `ControlPlane` is dropped, also when a scenario panics.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tempfile::TempDir;

use super::kubectl::Kubectl;
use super::ports::listen_ports;

/// A user the API server knows by a bearer token (`--token-auth-file`).
pub struct TokenUser {
    pub token: &'static str,
    pub name: &'static str,
}

/// In `system:masters`: may do anything.
pub const ADMIN: TokenUser = TokenUser { token: "e2e-admin-token", name: "e2e-admin" };
/// The operator, as deploy/rbac.yaml binds it.
pub const OPERATOR: TokenUser = TokenUser { token: "e2e-operator-token", name: "balancer-operator" };
/// No RBAC grants at all.
pub const NOBODY: TokenUser = TokenUser { token: "e2e-nobody-token", name: "nobody" };
/// Bound by the metrics scenario to `balancer-metrics-reader`.
pub const SCRAPER: TokenUser = TokenUser { token: "e2e-scraper-token", name: "metrics-scraper" };

/// A child process killed (and reaped) on drop.
pub struct Proc {
    pub name: String,
    pub child: Child,
    /// How it was started, to start it again the same way (see [`Proc::restart`]).
    program: std::ffi::OsString,
    args: Vec<std::ffi::OsString>,
    log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, command: &mut Command, log: &Path) -> Proc {
        let out = std::fs::File::create(log).expect("log file");
        let child = Proc::start(name, command, out);
        let program = command.get_program().to_owned();
        let args = command.get_args().map(ToOwned::to_owned).collect();
        Proc { name: name.into(), child, program, args, log: log.to_owned() }
    }

    fn start(name: &str, command: &mut Command, out: std::fs::File) -> Child {
        let err = out.try_clone().expect("log file");
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
    }

    /// SIGKILL, as a crash or an OOM kill would end it, and reaped.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the (stopped) process again with the same program and arguments, its output
    /// appended to the same log.
    pub fn restart(&mut self) {
        let out = std::fs::OpenOptions::new().append(true).open(&self.log).expect("log file");
        self.child = Proc::start(&self.name, Command::new(&self.program).args(&self.args), out);
    }

    /// Whether the process is still running (not exited, not killed).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, then waits up to `limit` for the process to exit: how long it took and how it
    /// ended, or `None` if it is still running. An already reaped process is not signalled again.
    pub fn terminate(&mut self, limit: Duration) -> Option<(Duration, ExitStatus)> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some((Duration::ZERO, status));
        }
        self.signal("-TERM");
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some((started.elapsed(), status));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Sends `signal` (`kill`'s `-TERM`, `-STOP`, `-CONT`) to the process.
    pub fn signal(&self, signal: &str) {
        let _ = Command::new("kill").args([signal, &self.child.id().to_string()]).stderr(Stdio::null()).status();
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if self.terminate(grace).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Processes stopped in the reverse of the order they were started in, when dropped: what
/// started later may depend on what started earlier (the API server on etcd, say).
#[derive(Default)]
pub struct Processes(Vec<Proc>);

impl Processes {
    pub fn push(&mut self, process: Proc) {
        self.0.push(process);
    }

    /// The process `name`, if one was started under that name.
    pub fn named(&mut self, name: &str) -> Option<&mut Proc> {
        self.0.iter_mut().find(|p| p.name == name)
    }

    pub fn has(&self, name: &str) -> bool {
        self.0.iter().any(|p| p.name == name)
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        while let Some(mut process) = self.0.pop() {
            process.stop(Duration::from_secs(5));
        }
    }
}

/// Puts the built release's commands first on this process's PATH, and so on its children's:
/// kubectl then matches the API server (the machine's own may be versions away), and on a node
/// containerd finds its own runc shim and `ctr`.
///
/// Returns at once when they are first already; else runs this binary again in its place, with
/// the same arguments and that PATH. Setting a variable of a running process is `unsafe`, which
/// the crate forbids.
pub fn commands_first_on_path(assets: &Path) {
    use std::os::unix::process::CommandExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).next().as_deref() == Some(assets) {
        return;
    }
    let dirs = std::iter::once(assets.to_path_buf()).chain(std::env::split_paths(&path));
    let joined = std::env::join_paths(dirs).expect("the assets directory fits in PATH");
    let this = std::env::current_exe().expect("the test binary's path");
    let error = Command::new(&this).args(std::env::args_os().skip(1)).env("PATH", joined).exec();
    panic!("could not run {} again with the commands first on PATH: {error}", this.display());
}

/// A rustls client configuration trusting `ca_pem` alone.
pub fn tls_config(ca_pem: &str) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    roots.add(rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap()).unwrap();
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// A reqwest client trusting `ca_pem`.
pub fn http_client(ca_pem: &str) -> reqwest::Client {
    let config = tls_config(ca_pem);
    reqwest::Client::builder().tls_backend_preconfigured(config).timeout(Duration::from_secs(10)).build().unwrap()
}

/// Where the control plane listens and what it serves.
pub struct PlaneOptions {
    /// The address the API server binds to and advertises (the `kubernetes` Service's endpoint).
    pub address: String,
    /// Service IPs; the first is the `kubernetes` Service's.
    pub service_cidr: String,
    /// Names and IPs the serving certificate also covers.
    pub extra_sans: Vec<String>,
    /// Real pods run: they get service account tokens (the ServiceAccount admission plugin and
    /// the token controllers), and the kubelet is dialled by InternalIP.
    pub pods: bool,
    /// kube-controller-manager's client rate (`--kube-api-qps`, burst twice that); its default
    /// of 20 a second takes minutes to give a thousand Deployments their pods.
    pub controller_manager_qps: Option<u32>,
    /// Nodes are drained (the node suite): the disruption controller, without which every
    /// eviction is refused.
    pub evictions: bool,
    /// Where the control plane's directory goes (the system's temporary directory if unset):
    /// the node suite's state, so that its teardown finds the processes of a run killed outright
    /// by their arguments.
    pub parent: Option<PathBuf>,
}

impl Default for PlaneOptions {
    fn default() -> Self {
        PlaneOptions {
            address: "127.0.0.1".into(),
            service_cidr: "10.0.0.0/24".into(),
            extra_sans: Vec::new(),
            pods: false,
            controller_manager_qps: None,
            evictions: false,
            parent: None,
        }
    }
}

pub struct ControlPlane {
    pub dir: TempDir,
    pub url: String,
    pub ca_pem: String,
    pub audit_log: PathBuf,
    /// Stopped when dropped: controller managers, then the API server, then etcd. Declared
    /// after `dir`, and `Drop for ControlPlane` empties it first, so the processes stop
    /// before their directory goes.
    processes: Processes,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        drop(std::mem::take(&mut self.processes));
    }
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and (when present) kube-controller-manager from `assets`, on loopback.
    pub async fn start(assets: &Path) -> ControlPlane {
        ControlPlane::start_with(assets, &PlaneOptions::default()).await
    }

    pub async fn start_with(assets: &Path, options: &PlaneOptions) -> ControlPlane {
        let dir = match &options.parent {
            Some(parent) => TempDir::new_in(parent),
            None => TempDir::new(),
        }
        .expect("temp dir");
        let d = dir.path();
        let mut sans = vec!["127.0.0.1".to_string(), "localhost".into(), options.address.clone()];
        sans.extend(options.extra_sans.iter().cloned());
        let certs = balancer::runtime::tls::generate(&sans, Duration::from_secs(86400)).expect("certificates");
        certs.write_to(&d.join("pki")).expect("write certificates");
        let sa_key = rcgen::KeyPair::generate().expect("service account key");
        std::fs::write(d.join("pki/sa.key"), sa_key.serialize_pem()).unwrap();
        std::fs::write(d.join("pki/sa.pub"), sa_key.public_key_pem()).unwrap();
        // token,user,uid[,"groups"]
        let users = [(&ADMIN, "1,\"system:masters\""), (&OPERATOR, "2"), (&NOBODY, "3"), (&SCRAPER, "4")];
        let tokens: String =
            users.iter().map(|(user, rest)| format!("{},{},{rest}\n", user.token, user.name)).collect();
        std::fs::write(d.join("tokens.csv"), tokens).unwrap();
        std::fs::write(
            d.join("audit-policy.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: Metadata\n",
        )
        .unwrap();

        let mut processes = Processes::default();
        let [etcd_port, peer_port, port] = listen_ports();
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        processes.push(Proc::spawn(
            "etcd",
            Command::new(assets.join("etcd"))
                .arg(format!("--data-dir={}", d.join("etcd").display()))
                .arg(format!("--listen-client-urls={etcd_url}"))
                .arg(format!("--advertise-client-urls={etcd_url}"))
                .arg(format!("--listen-peer-urls={peer_url}"))
                .arg(format!("--initial-advertise-peer-urls={peer_url}"))
                .arg(format!("--initial-cluster=default={peer_url}"))
                .arg("--name=default"),
            &d.join("etcd.log"),
        ));

        let pki = d.join("pki");
        let audit_log = d.join("audit.log");
        let mut apiserver = Command::new(assets.join("kube-apiserver"));
        if options.address.starts_with("127.") {
            // The API server refuses to advertise a loopback address for the `kubernetes`
            // Service's endpoints; with no pods, nothing needs them (envtest does the same).
            apiserver.arg("--endpoint-reconciler-type=none");
        }
        if options.pods {
            apiserver.arg("--kubelet-preferred-address-types=InternalIP");
        } else {
            // No token controller runs to give pods their tokens.
            apiserver.arg("--disable-admission-plugins=ServiceAccount");
        }
        processes.push(Proc::spawn(
            "kube-apiserver",
            apiserver
                .arg(format!("--etcd-servers={etcd_url}"))
                .arg(format!("--bind-address={}", options.address))
                .arg(format!("--advertise-address={}", options.address))
                .arg(format!("--secure-port={port}"))
                .arg(format!("--cert-dir={}", pki.display()))
                .arg(format!("--tls-cert-file={}", pki.join("tls.crt").display()))
                .arg(format!("--tls-private-key-file={}", pki.join("tls.key").display()))
                .arg(format!("--token-auth-file={}", d.join("tokens.csv").display()))
                .arg("--authorization-mode=RBAC")
                .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
                .arg(format!("--service-account-key-file={}", pki.join("sa.pub").display()))
                .arg(format!("--service-account-signing-key-file={}", pki.join("sa.key").display()))
                .arg(format!("--service-cluster-ip-range={}", options.service_cidr))
                .arg(format!("--audit-policy-file={}", d.join("audit-policy.yaml").display()))
                .arg(format!("--audit-log-path={}", audit_log.display()))
                .arg("--enable-priority-and-fairness=false")
                .arg("--allow-privileged=true"),
            &d.join("kube-apiserver.log"),
        ));
        let url = format!("https://{}:{port}", options.address);
        let plane = ControlPlane { dir, url, ca_pem: certs.ca_pem, audit_log, processes };
        plane.write_kubeconfig("admin", ADMIN.token);
        plane.write_kubeconfig("operator", OPERATOR.token);
        plane.write_kubeconfig(NOBODY.name, NOBODY.token);
        plane.wait_ready().await;

        let kcm = assets.join("kube-controller-manager");
        let mut plane = plane;
        if kcm.exists() {
            let log = plane.dir.path().join("kube-controller-manager.log");
            let mut command = Command::new(kcm);
            // The endpoint controllers too, as every cluster runs them: the controller watches
            // the backend Services' EndpointSlices, and the figures include that watch.
            let mut controllers = "garbage-collector-controller,deployment-controller,replicaset-controller,\
                 namespace-controller,horizontal-pod-autoscaler-controller,endpoints-controller,\
                 endpointslice-controller"
                .to_string();
            if options.pods {
                controllers.push_str(
                    ",serviceaccount-controller,serviceaccount-token-controller,root-ca-certificate-publisher-controller",
                );
                let pki = plane.dir.path().join("pki");
                command
                    .arg(format!("--service-account-private-key-file={}", pki.join("sa.key").display()))
                    .arg(format!("--root-ca-file={}", pki.join("ca.crt").display()));
            }
            if options.evictions {
                controllers.push_str(",disruption-controller");
            }
            if let Some(qps) = options.controller_manager_qps {
                command.arg(format!("--kube-api-qps={qps}")).arg(format!("--kube-api-burst={}", 2 * qps));
            }
            plane.processes.push(Proc::spawn(
                "kube-controller-manager",
                command
                    .arg(format!("--kubeconfig={}", plane.kubeconfig("admin").display()))
                    .arg("--leader-elect=false")
                    .arg("--secure-port=0")
                    .arg(format!("--controllers={controllers}"))
                    .arg("--use-service-account-credentials=false"),
                &log,
            ));
        } else {
            eprintln!("e2e: no kube-controller-manager in {}: garbage collection is not exercised", assets.display());
        }
        plane
    }

    /// Starts node lifecycle (in a controller manager of its own): a node silent for `grace`
    /// is marked not ready, with its pods, and they are evicted once their tolerations of an
    /// unreachable node run out. (The node suite's: the e2e suite has no nodes.)
    pub fn start_node_lifecycle(&mut self, assets: &Path, grace: Duration) {
        let log = self.dir.path().join("node-lifecycle.log");
        let process = Proc::spawn(
            "node-lifecycle",
            Command::new(assets.join("kube-controller-manager"))
                .arg(format!("--kubeconfig={}", self.kubeconfig("admin").display()))
                .arg("--leader-elect=false")
                .arg("--secure-port=0")
                // Since Kubernetes 1.29, evicting the pods of a tainted node is a controller
                // of its own.
                .arg("--controllers=node-lifecycle-controller,taint-eviction-controller")
                .arg(format!("--node-monitor-grace-period={}s", grace.as_secs()))
                .arg("--node-monitor-period=1s")
                .arg("--use-service-account-credentials=false"),
            &log,
        );
        self.processes.push(process);
    }

    pub fn kubeconfig(&self, user: &str) -> PathBuf {
        self.dir.path().join(format!("{user}.kubeconfig"))
    }

    fn write_kubeconfig(&self, user: &str, token: &str) {
        let ca = self.dir.path().join("pki/ca.crt");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
             users:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: {user}\n  context:\n    cluster: e2e\n    user: {user}\n    namespace: default\n\
             current-context: {user}\n",
            self.url,
            ca.display()
        );
        std::fs::write(self.kubeconfig(user), text).unwrap();
    }

    pub async fn client(&self, user: &str) -> Client {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig(user)).expect("kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("config");
        Client::try_from(config).expect("client")
    }

    /// Waits until the API server is ready, at most 90 s.
    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if self.is_ready().await {
                return;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.path().join("kube-apiserver.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                panic!(
                    "kube-apiserver not ready after 90 s; log tail:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// `kubectl` as `user`.
    pub fn kubectl(&self, user: &str) -> Kubectl {
        Kubectl::new(self.kubeconfig(user))
    }

    /// Audit events (JSON lines) so far.
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.audit_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The control-plane process `name` (`etcd`, `kube-apiserver`, `kube-controller-manager`).
    pub fn process(&mut self, name: &str) -> &mut Proc {
        self.processes.named(name).unwrap_or_else(|| panic!("no {name} in the control plane"))
    }

    /// Whether the API server answers `/readyz` (with etcd behind it) within a second.
    pub async fn is_ready(&self) -> bool {
        let client = http_client(&self.ca_pem);
        let request = client.get(format!("{}/readyz", self.url)).bearer_auth(ADMIN.token);
        let answer = tokio::time::timeout(Duration::from_secs(1), request.send()).await;
        matches!(answer, Ok(Ok(r)) if r.status().is_success())
    }

    pub fn has_controller_manager(&self) -> bool {
        self.processes.has("kube-controller-manager")
    }
}

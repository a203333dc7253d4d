//! One real node next to the control plane: containerd, the kubelet, kube-proxy and
//! kube-scheduler, on a pod bridge that `host.sh` fences in.
//!
//! [`Host`] owns what lives outside the processes (bridges, routes, iptables,
//! sysctls, mounts) and puts it back when dropped; [`Node`] owns the processes.
//! Drop the node before the host.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::cluster::{ControlPlane, Proc, free_port};

pub const NODE_NAME: &str = "balancer-node";
/// The host's address on the pod bridge: the node's InternalIP and the API server's address.
pub const NODE_IP: &str = "10.244.0.1";
pub const POD_CIDR: &str = "10.244.0.0/24";
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// The `kubernetes` Service: the first Service IP, on the API server's certificate for pods.
pub const KUBERNETES_SERVICE_IP: &str = "10.0.0.1";
pub const POD_BRIDGE: &str = "balancer0";
/// The local pause image the sandboxes use.
pub const PAUSE_IMAGE: &str = "localhost/pause:3.4.1";

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/node").join(name)
}

/// Runs `host.sh ACTION STATE`; `up` must succeed, the rest is best effort.
fn host_script(action: &str, state: &Path) -> bool {
    Command::new("bash").arg(script("host.sh")).arg(action).arg(state).status().is_ok_and(|s| s.success())
}

/// The host settings of a node, put back when dropped (also after a panic).
pub struct Host {
    pub state: PathBuf,
}

impl Host {
    /// Clears whatever a crashed run left in `state`, then sets the host up.
    pub fn up(state: &Path) -> Host {
        host_script("down", state);
        let host = Host { state: state.to_path_buf() };
        assert!(host_script("up", state), "host.sh up failed");
        host
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        host_script("down", &self.state);
    }
}

pub struct Node {
    pub containerd_socket: PathBuf,
    state: PathBuf,
    /// containerd first; the kubelet, kube-proxy and kube-scheduler after it.
    processes: Vec<Proc>,
}

impl Drop for Node {
    fn drop(&mut self) {
        // Nothing may restart containers while they are stopped; containerd goes last.
        while self.processes.len() > 1 {
            if let Some(mut process) = self.processes.pop() {
                process.stop(Duration::from_secs(5));
            }
        }
        host_script("stop-containers", &self.state);
        self.processes.clear();
    }
}

impl Node {
    /// Starts containerd, imports every archive in `images`, then the kubelet, kube-proxy and
    /// the scheduler; returns once the node is Ready and schedulable.
    pub async fn start(host: &Host, plane: &ControlPlane, assets: &Path, images: &Path) -> Node {
        let state = host.state.clone();
        let containerd_dir = state.join("containerd");
        std::fs::create_dir_all(&containerd_dir).expect("containerd dir");
        let socket = containerd_dir.join("containerd.sock");
        write_containerd_config(&state);
        write_cni_config(&state);
        let mut node = Node { containerd_socket: socket.clone(), state: state.clone(), processes: Vec::new() };
        node.processes.push(Proc::spawn(
            "containerd",
            Command::new("containerd").arg("--config").arg(containerd_dir.join("config.toml")),
            &state.join("containerd.log"),
        ));
        wait_for("containerd's socket", Duration::from_secs(30), || socket.exists()).await;
        node.import_images(images);

        // A copy under the state directory: every node process names it, so `host.sh down`
        // can find them after a run that was killed outright.
        let kubeconfig = state.join("node.kubeconfig");
        std::fs::copy(plane.kubeconfig("admin"), &kubeconfig).expect("node kubeconfig");
        let endpoint = format!("unix://{}", socket.display());
        node.processes.push(Proc::spawn(
            "kubelet",
            Command::new(assets.join("kubelet"))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!("--root-dir={}", state.join("kubelet").display()))
                .arg(format!("--cert-dir={}", state.join("kubelet-pki").display()))
                .arg(format!("--volume-plugin-dir={}", state.join("volume-plugins").display()))
                .arg(format!("--hostname-override={NODE_NAME}"))
                .arg(format!("--node-ip={NODE_IP}"))
                .arg(format!("--address={NODE_IP}"))
                .arg("--healthz-bind-address=127.0.0.1")
                .arg(format!("--healthz-port={}", free_port()))
                .arg("--read-only-port=0")
                .arg("--container-runtime=remote")
                .arg(format!("--container-runtime-endpoint={endpoint}"))
                .arg(format!("--image-service-endpoint={endpoint}"))
                .arg(format!("--pod-infra-container-image={PAUSE_IMAGE}"))
                .arg("--cgroup-driver=cgroupfs")
                .arg("--cgroups-per-qos=false")
                .arg("--enforce-node-allocatable=")
                .arg("--fail-swap-on=false")
                .arg("--eviction-hard=")
                .arg("--image-gc-high-threshold=100")
                .arg("--image-gc-low-threshold=99")
                // Pods get no nameserver: nothing may query a resolver outside the machine.
                .arg(format!("--resolv-conf={}", state.join("resolv.conf").display()))
                // v1.20 does not yet count this sysctl as safe (1.22 does): bridged here, never in deploy/.
                .arg("--allowed-unsafe-sysctls=net.ipv4.ip_unprivileged_port_start")
                .arg("--node-status-update-frequency=2s")
                .arg("--sync-frequency=5s"),
            &state.join("kubelet.log"),
        ));
        node.processes.push(Proc::spawn(
            "kube-proxy",
            Command::new(assets.join("kube-proxy"))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!("--hostname-override={NODE_NAME}"))
                .arg(format!("--bind-address={NODE_IP}"))
                .arg("--proxy-mode=iptables")
                .arg(format!("--cluster-cidr={POD_CIDR}"))
                .arg(format!("--healthz-bind-address=127.0.0.1:{}", free_port()))
                .arg(format!("--metrics-bind-address=127.0.0.1:{}", free_port()))
                // Leave the host's conntrack settings alone.
                .arg("--conntrack-max-per-core=0")
                .arg("--conntrack-tcp-timeout-established=0")
                .arg("--conntrack-tcp-timeout-close-wait=0"),
            &state.join("kube-proxy.log"),
        ));
        node.processes.push(Proc::spawn(
            "kube-scheduler",
            Command::new(assets.join("kube-scheduler"))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg("--leader-elect=false")
                .arg("--port=0")
                .arg("--secure-port=0"),
            &state.join("kube-scheduler.log"),
        ));
        node.wait_ready(plane).await;
        node
    }

    fn import_images(&self, images: &Path) {
        let mut archives: Vec<PathBuf> = std::fs::read_dir(images)
            .expect("images dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "tar"))
            .collect();
        archives.sort();
        for archive in archives {
            let out = self.ctr(&["images", "import", &archive.display().to_string()]);
            assert!(out.status.success(), "importing {}: {}", archive.display(), String::from_utf8_lossy(&out.stderr));
        }
    }

    /// `ctr -n k8s.io ARGS` against this node's containerd.
    pub fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new("ctr")
            .arg("-a")
            .arg(&self.containerd_socket)
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .expect("ctr runs")
    }

    /// Waits for the node to be Ready, then lifts the not-ready taint (no node lifecycle controller runs).
    async fn wait_ready(&self, plane: &ControlPlane) {
        let nodes: Api<NodeObject> = Api::all(plane.client("admin").await);
        let started = Instant::now();
        loop {
            let node = nodes.get_opt(NODE_NAME).await.ok().flatten();
            let ready = node
                .as_ref()
                .and_then(|n| n.status.as_ref()?.conditions.as_ref())
                .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                break;
            }
            if started.elapsed() > Duration::from_secs(90) {
                panic!("node not Ready after 90 s; kubelet log tail:\n{}", self.log_tail("kubelet", 30));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let untaint = serde_json::json!({"spec": {"taints": null}});
        nodes.patch(NODE_NAME, &PatchParams::default(), &Patch::Merge(&untaint)).await.expect("untaint the node");
    }

    /// The last `lines` lines of a node component's log.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        let log = std::fs::read_to_string(self.state.join(format!("{component}.log"))).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

async fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn write_containerd_config(state: &Path) {
    let dir = state.join("containerd");
    let config = format!(
        r#"version = 2
root = "{root}"
state = "{run}"

[grpc]
  address = "{dir}/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  # root here lacks CAP_SYS_RESOURCE: never lower a process's OOM score below its parent's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
        root = dir.join("root").display(),
        run = dir.join("run").display(),
        dir = dir.display(),
        cni = state.join("cni").display(),
    );
    std::fs::write(dir.join("config.toml"), config).expect("containerd config");
}

/// The pod network: a bridge the host is the gateway of, no masquerading (nothing leaves).
fn write_cni_config(state: &Path) {
    let dir = state.join("cni");
    std::fs::create_dir_all(&dir).expect("cni dir");
    let config = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "balancer-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": POD_BRIDGE,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": state.join("cni-ipam").display().to_string(),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    });
    std::fs::write(dir.join("10-balancer.conflist"), config.to_string()).expect("cni config");
}

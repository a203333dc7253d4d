//! Two real nodes next to the control plane, each with its containerd and kubelet on a pod
//! bridge of its own, and one kube-proxy and kube-scheduler for both; `host.sh` fences them in.
//!
//! [`Host`] owns what lives outside the processes (bridges, routes, iptables,
//! sysctls, mounts) and puts it back when dropped; a [`Node`] owns its processes and
//! [`ClusterServices`] the shared ones. Drop the nodes before the host.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::repo;
use crate::toolkit::cluster::{ControlPlane, Proc, Processes};
use crate::toolkit::ports::listen_ports;

/// One node on this machine: its name, its address (the host's on its pod bridge, which is
/// the node's InternalIP and the kubelet's), its pod CIDR and its bridge. `host.sh` sets up
/// the same two; keep them in step.
pub struct NodeSpec {
    pub name: &'static str,
    pub ip: &'static str,
    pub pod_cidr: &'static str,
    pub bridge: &'static str,
}

/// Node A: the control plane, the harness and kube-proxy bind to its bridge, so that node B
/// can be taken away.
pub const NODE_A: NodeSpec =
    NodeSpec { name: "balancer-node", ip: "10.244.0.1", pod_cidr: "10.244.0.0/24", bridge: "balancer0" };
pub const NODE_B: NodeSpec =
    NodeSpec { name: "balancer-node-b", ip: "10.244.1.1", pod_cidr: "10.244.1.0/24", bridge: "balancer1" };
/// Both nodes' pod CIDRs: kube-proxy's `--cluster-cidr`, so that pod-to-Service traffic
/// between the nodes keeps its source address.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
pub const NODE_IP: &str = NODE_A.ip;
pub const POD_BRIDGE: &str = NODE_A.bridge;
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// The `kubernetes` Service: the first Service IP, on the API server's certificate for pods.
pub const KUBERNETES_SERVICE_IP: &str = "10.0.0.1";
/// The local pause image the sandboxes use.
pub const PAUSE_IMAGE: &str = "localhost/pause:3.4.1";

fn script(name: &str) -> PathBuf {
    repo("tests/node").join(name)
}

/// Runs `host.sh ACTION STATE`; `up` must succeed, the rest is best effort.
fn host_script(action: &str, state: &Path) -> bool {
    Command::new("bash").arg(script("host.sh")).arg(action).arg(state).status().is_ok_and(|s| s.success())
}

/// Runs `host.sh ACTION STATE NODE` for the node whose directory is `node_dir`.
fn node_script(action: &str, node_dir: &Path) {
    let (Some(state), Some(node)) = (node_dir.parent(), node_dir.file_name()) else { return };
    let _ = Command::new("bash").arg(script("host.sh")).arg(action).arg(state).arg(node).status();
}

/// What the suite could leave on the host by mistake, one line each: network namespaces pinned
/// under /var/run/netns, veth and bridge interfaces, and iptables chains of kube-proxy, the CNI
/// plugins and `host.sh`. Taken before the suite and after its teardown, which must leave
/// nothing new.
pub fn host_traces() -> BTreeSet<String> {
    let mut traces = BTreeSet::new();
    if let Ok(entries) = std::fs::read_dir("/var/run/netns") {
        traces.extend(entries.flatten().map(|e| format!("netns {}", e.file_name().to_string_lossy())));
    }
    for kind in ["veth", "bridge"] {
        let links = Command::new("ip").args(["-o", "link", "show", "type", kind]).output();
        let links = links.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
        // "7: vethab12@if3: <BROADCAST,...": the name is the second field, before any '@'.
        let names = links.lines().filter_map(|l| l.split(": ").nth(1)?.split('@').next().map(str::to_string));
        traces.extend(names.map(|name| format!("{kind} {name}")));
    }
    for tool in ["iptables-save", "ip6tables-save"] {
        let saved = Command::new(tool).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        let saved = saved.unwrap_or_default();
        let ours = |l: &&str| [":KUBE-", ":CNI-", ":BALANCER-"].iter().any(|prefix| l.starts_with(prefix));
        let chains = saved.lines().filter(ours);
        traces.extend(chains.filter_map(|l| l[1..].split(' ').next().map(|chain| format!("{tool} chain {chain}"))));
    }
    traces
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

/// One node: containerd and the kubelet, both in a mount namespace of their own in which
/// `/var/log/pods`, `/var/log/containers` and `/var/lib/kubelet/device-plugins` are the node's
/// own directories. The kubelet hard-codes those paths: each kubelet's garbage collector would
/// delete the other node's pod logs (which `kubectl logs` reads), and each clears the device
/// plugins' directory at start. Each kubelet's volumes are mounted in that namespace
/// too, where its containerd sees them.
pub struct Node {
    pub spec: &'static NodeSpec,
    pub containerd_socket: PathBuf,
    /// The node's own directory under the suite's state.
    dir: PathBuf,
    /// containerd first, then the kubelet.
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
        node_script("stop-containers", &self.dir);
        self.processes.clear();
    }
}

/// Runs its arguments with the node's own directories bound over the kubelet's fixed ones
/// (its pod logs, and the device plugins' sockets, which each kubelet clears at start):
/// `sh -c BIND_FIXED_PATHS sh POD_LOGS CONTAINER_LOGS DEVICE_PLUGINS PROGRAM ARGS...`, under
/// `unshare`.
const BIND_FIXED_PATHS: &str = "mount --bind \"$1\" /var/log/pods && mount --bind \"$2\" /var/log/containers \
     && mount --bind \"$3\" /var/lib/kubelet/device-plugins && shift 3 && exec \"$@\"";

impl Node {
    /// Starts containerd in a new mount namespace, imports every archive in `images`, then the
    /// kubelet in the same namespace; returns once the node is Ready and schedulable.
    pub async fn start(
        host: &Host,
        plane: &ControlPlane,
        assets: &Path,
        images: &Path,
        spec: &'static NodeSpec,
    ) -> Node {
        let dir = host.state.join(spec.name);
        let containerd_dir = dir.join("containerd");
        std::fs::create_dir_all(&containerd_dir).expect("containerd dir");
        let (pod_logs, container_logs) = (dir.join("pod-logs"), dir.join("container-logs"));
        let device_plugins = dir.join("device-plugins");
        for fixed in [&pod_logs, &container_logs, &device_plugins] {
            std::fs::create_dir_all(fixed).expect("a node directory");
        }
        let socket = containerd_dir.join("containerd.sock");
        write_containerd_config(&dir);
        write_cni_config(&dir, spec);
        let mut node = Node { spec, containerd_socket: socket.clone(), dir: dir.clone(), processes: Vec::new() };
        node.processes.push(Proc::spawn(
            "containerd",
            Command::new("unshare")
                .args(["--mount", "--propagation", "slave", "--", "sh", "-c", BIND_FIXED_PATHS, "sh"])
                .arg(&pod_logs)
                .arg(&container_logs)
                .arg(&device_plugins)
                .arg(assets.join("containerd"))
                .arg("--config")
                .arg(containerd_dir.join("config.toml")),
            &dir.join("containerd.log"),
        ));
        let namespace = format!("--mount=/proc/{}/ns/mnt", node.processes[0].child.id());
        wait_for("containerd's socket", Duration::from_secs(30), || socket.exists()).await;
        // On a blocking thread, so that both nodes import at once.
        let (to, from) = (socket.clone(), images.to_path_buf());
        tokio::task::spawn_blocking(move || import_images(&to, &from)).await.expect("importing images");

        let kubeconfig = node_kubeconfig(host, plane);
        let config = write_kubelet_config(&dir, host, spec, &socket);
        node.processes.push(Proc::spawn(
            "kubelet",
            Command::new("nsenter")
                .arg(&namespace)
                .arg("--")
                .arg(assets.join("kubelet"))
                .arg(format!("--config={}", config.display()))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!("--root-dir={}", dir.join("kubelet").display()))
                .arg(format!("--cert-dir={}", dir.join("kubelet-pki").display()))
                .arg(format!("--hostname-override={}", spec.name))
                .arg(format!("--node-ip={}", spec.ip)),
            &dir.join("kubelet.log"),
        ));
        node.wait_ready(plane).await;
        node
    }

    /// `ctr -n k8s.io ARGS` against this node's containerd.
    pub fn ctr(&self, args: &[&str]) -> std::process::Output {
        ctr(&self.containerd_socket, args)
    }

    /// Waits for the node to be Ready, then lifts the not-ready taint (the node lifecycle
    /// controller would, within its monitor period).
    async fn wait_ready(&self, plane: &ControlPlane) {
        let nodes: Api<NodeObject> = Api::all(plane.client("admin").await);
        let started = Instant::now();
        loop {
            let node = nodes.get_opt(self.spec.name).await.ok().flatten();
            if node.as_ref().is_some_and(is_ready) {
                break;
            }
            if started.elapsed() > Duration::from_secs(90) {
                let log = std::fs::read_to_string(self.dir.join("kubelet.log")).unwrap_or_default();
                let fatal: Vec<&str> = log
                    .lines()
                    .filter(|l| l.starts_with('F') || l.starts_with("panic") || l.starts_with("fatal"))
                    .take(10)
                    .collect();
                panic!(
                    "{} not Ready after 90 s; the kubelet's fatal lines:\n{}\nits log's tail:\n{}",
                    self.spec.name,
                    fatal.join("\n"),
                    self.log_tail("kubelet", 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let untaint = serde_json::json!({"spec": {"taints": null}});
        nodes.patch(self.spec.name, &PatchParams::default(), &Patch::Merge(&untaint)).await.expect("untaint the node");
    }

    /// The node lost, as after a crash: SIGKILL to the kubelet, containerd, its shims and every
    /// container process, and its pod bridge down (its pods' addresses unreachable, as on a
    /// dead machine; the host's unreachable route for the cluster CIDR keeps their packets in).
    pub fn crash(&mut self) {
        // The kubelet first, so that nothing starts a container after the list is taken.
        if let Some(kubelet) = self.processes.get_mut(1) {
            kubelet.kill();
        }
        let tasks = self.ctr(&["tasks", "ls"]);
        // "TASK PID STATUS" lines after a header.
        let pids: Vec<String> = String::from_utf8_lossy(&tasks.stdout)
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .filter(|pid| pid != "0")
            .collect();
        if let Some(containerd) = self.processes.first_mut() {
            containerd.kill();
        }
        let shims = format!("containerd-shim.*-address {}", self.containerd_socket.display());
        let _ = Command::new("pkill").args(["-KILL", "-f", &shims]).status();
        if !pids.is_empty() {
            let _ = Command::new("kill").arg("-KILL").args(&pids).stderr(std::process::Stdio::null()).status();
        }
        let down = Command::new("ip").args(["link", "set", self.spec.bridge, "down"]).status();
        assert!(down.is_ok_and(|s| s.success()), "ip link set {} down", self.spec.bridge);
    }

    /// SIGSTOP, or SIGCONT when `paused` is false, to the kubelet (`nsenter` execs it: the same
    /// pid). Its containers run on, and its lease (40 s) outlasts a pause of seconds.
    pub fn pause_kubelet(&self, paused: bool) {
        if let Some(kubelet) = self.processes.get(1) {
            kubelet.signal(if paused { "-STOP" } else { "-CONT" });
        }
    }

    /// The last `lines` lines of a node component's log.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.join(format!("{component}.log"))).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

/// What every node shares, since the nodes share the host's network namespace: one kube-proxy
/// (speaking for node A: `externalTrafficPolicy: Local` means node A's pods here) and the
/// scheduler.
pub struct ClusterServices {
    _processes: Processes,
}

impl ClusterServices {
    pub fn start(host: &Host, plane: &ControlPlane, assets: &Path) -> ClusterServices {
        let state = &host.state;
        let kubeconfig = node_kubeconfig(host, plane);
        let [healthz_port, metrics_port] = listen_ports();
        let kube_proxy = Proc::spawn(
            "kube-proxy",
            Command::new(assets.join("kube-proxy"))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!("--hostname-override={}", NODE_A.name))
                .arg(format!("--bind-address={NODE_IP}"))
                .arg("--proxy-mode=iptables")
                .arg(format!("--cluster-cidr={CLUSTER_CIDR}"))
                .arg(format!("--healthz-bind-address=127.0.0.1:{healthz_port}"))
                .arg(format!("--metrics-bind-address=127.0.0.1:{metrics_port}"))
                // Leave the host's conntrack settings alone.
                .arg("--conntrack-max-per-core=0")
                .arg("--conntrack-tcp-timeout-established=0")
                .arg("--conntrack-tcp-timeout-close-wait=0"),
            &state.join("kube-proxy.log"),
        );
        let scheduler = Proc::spawn(
            "kube-scheduler",
            Command::new(assets.join("kube-scheduler"))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg("--leader-elect=false")
                .arg("--secure-port=0"),
            &state.join("kube-scheduler.log"),
        );
        let mut processes = Processes::default();
        processes.push(kube_proxy);
        processes.push(scheduler);
        ClusterServices { _processes: processes }
    }
}

/// Whether a Node's `Ready` condition is `True`.
pub fn is_ready(node: &NodeObject) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// `ctr -n k8s.io ARGS` against the containerd at `socket`.
fn ctr(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new("ctr").arg("-a").arg(socket).args(["-n", "k8s.io"]).args(args).output().expect("ctr runs")
}

/// Imports every archive in `images` into the containerd at `socket`.
fn import_images(socket: &Path, images: &Path) {
    let mut archives: Vec<PathBuf> = std::fs::read_dir(images)
        .expect("images dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "tar"))
        .collect();
    archives.sort();
    for archive in archives {
        let out = ctr(socket, &["images", "import", &archive.display().to_string()]);
        assert!(out.status.success(), "importing {}: {}", archive.display(), String::from_utf8_lossy(&out.stderr));
    }
}

/// The admin kubeconfig, copied under the state directory: every node process names it, so
/// `host.sh down` can find them after a run that was killed outright.
fn node_kubeconfig(host: &Host, plane: &ControlPlane) -> PathBuf {
    let kubeconfig = host.state.join("node.kubeconfig");
    std::fs::copy(plane.kubeconfig("admin"), &kubeconfig).expect("node kubeconfig");
    kubeconfig
}

async fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The kubelet's configuration file (the flags of old are deprecated or gone). What this
/// machine needs: cgroupfs, no QoS cgroups and no node allocatable enforcement on its hybrid
/// cgroups (v1 controllers, which the kubelet refuses from v1.35 unless told not to), no swap
/// check, no eviction or image garbage collection thresholds that a busy test disk would trip.
/// The API server reaches the kubelet anonymously for logs and exec, as the old flags allowed.
fn write_kubelet_config(node_dir: &Path, host: &Host, spec: &NodeSpec, socket: &Path) -> PathBuf {
    let endpoint = format!("unix://{}", socket.display());
    let [healthz_port] = listen_ports();
    let config = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": spec.ip,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "readOnlyPort": 0,
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        "volumePluginDir": node_dir.join("volume-plugins").display().to_string(),
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": false,
        "enforceNodeAllocatable": [],
        "failCgroupV1": false,
        "failSwapOn": false,
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        // Pods get no nameserver: nothing may query a resolver outside the machine.
        "resolvConf": host.state.join("resolv.conf").display().to_string(),
        // Status checked every 2 s (posted on a change; node lifecycle sees the Lease,
        // renewed every 10 s, in between).
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "5s",
        "authentication": {"anonymous": {"enabled": true}, "webhook": {"enabled": false}},
        "authorization": {"mode": "AlwaysAllow"},
    });
    let path = node_dir.join("kubelet-config.json");
    std::fs::write(&path, config.to_string()).expect("kubelet config");
    path
}

/// containerd 2's configuration in its own current format (version 4), one per node: its
/// sockets, root and state under the node's directory.
fn write_containerd_config(node_dir: &Path) {
    let dir = node_dir.join("containerd");
    let config = format!(
        r#"version = 4
root = "{root}"
state = "{run}"
# The host's /etc/containerd is not the node's.
imports = []

[plugins]
  [plugins."io.containerd.server.v1.grpc"]
    address = "{dir}/containerd.sock"
  [plugins."io.containerd.server.v1.ttrpc"]
    address = "{dir}/containerd.sock.ttrpc"
  # Its socket is one per host, and no NRI plugin runs here.
  [plugins."io.containerd.nri.v1.nri"]
    disable = true

  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "{PAUSE_IMAGE}"

  [plugins."io.containerd.cri.v1.runtime"]
    # root here lacks CAP_SYS_RESOURCE: never lower a process's OOM score below its parent's.
    restrict_oom_score_adj = true
    # Pods' network namespaces are pinned in the node's state, not in the host's /var/run/netns.
    netns_mounts_under_state_dir = true
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          SystemdCgroup = false
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["/usr/lib/cni"]
      conf_dir = "{cni}"

  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
"#,
        root = dir.join("root").display(),
        run = dir.join("run").display(),
        dir = dir.display(),
        cni = node_dir.join("cni").display(),
    );
    std::fs::write(dir.join("config.toml"), config).expect("containerd config");
}

/// The node's pod network: its bridge, which the host is the gateway of, no masquerading
/// (nothing leaves).
fn write_cni_config(node_dir: &Path, spec: &NodeSpec) {
    let dir = node_dir.join("cni");
    std::fs::create_dir_all(&dir).expect("cni dir");
    let config = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": spec.name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": spec.bridge,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": spec.pod_cidr, "gateway": spec.ip}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": node_dir.join("cni-ipam").display().to_string(),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    });
    std::fs::write(dir.join("10-balancer.conflist"), config.to_string()).expect("cni config");
}

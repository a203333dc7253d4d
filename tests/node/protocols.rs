//! Protocols and Service settings on a real kube-proxy and nginx: UDP (and a live weight change
//! of it), a node port with client-IP affinity, the PROXY protocol, and a backup backend.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

use crate::fixtures::{
    self, backend_deployment, change_backends, front_ip, wait_available, wait_backends, wait_ready_balancer,
};
use crate::node::{NODE_A, NODE_IP, POD_BRIDGE};
use crate::toolkit::load::{Load, assert_shares, one_request, one_request_from, split};
use crate::toolkit::runner::eventually;
use crate::weights::leaving;
use crate::{NS, World};

/// Answers every datagram with `<version> <datagram>`, from one socket (socat's `fork` shares
/// its socket with the child that answers, which can swallow the next datagram).
const UDP_ECHO: &str = "import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('', 5353))
while True:
    data, peer = s.recvfrom(512)
    s.sendto(sys.argv[1].encode() + b' ' + data, peer)
";

/// A UDP echo Deployment: each datagram answered as `<version> <datagram>`.
fn udp_echo_backend(version: &str) -> String {
    let echo = json!({
        "name": "echo",
        "command": ["python3", "-c", UDP_ECHO, version],
        "ports": [{"containerPort": 5353, "protocol": "UDP"}],
    });
    let labels = json!({"app": "udp-echo", "version": version});
    backend_deployment(NS, &format!("udp-echo-{version}"), labels, echo).to_string()
}

const UDP_BALANCER: &str = "udp-echo";

/// The UDP echo backends u1 and u2, each with one ready pod.
pub async fn make_udp_backends(world: &mut World) {
    for version in ["u1", "u2"] {
        world.kubectl.apply(&udp_echo_backend(version));
    }
    for version in ["u1", "u2"] {
        wait_available(world, NS, &format!("udp-echo-{version}"), 1).await;
    }
    fixtures::udp_backends_made(world);
}

pub async fn udp_is_proxied_to_udp_echo_pods(world: &mut World) {
    world.ensure_namespace().await;
    make_udp_backends(world).await;
    let balancer = format!(
        "apiVersion: exposer.hliangzhao.io/v1alpha1\nkind: Balancer\nmetadata:\n  name: {UDP_BALANCER}\n  namespace: {NS}\n\
         spec:\n  ports:\n    - {{name: echo, protocol: UDP, port: 53, targetPort: 5353}}\n  selector: {{app: udp-echo}}\n\
         \x20 backends:\n    - {{name: u1, weight: 50, selector: {{version: u1}}}}\n    - {{name: u2, weight: 50, selector: {{version: u2}}}}\n"
    );
    world.kubectl.apply(&balancer);
    wait_ready_balancer(world, UDP_BALANCER, Duration::from_secs(120)).await;
    let front = front_ip(world, UDP_BALANCER).await;
    // Ready follows the Deployment; kube-proxy learns the new endpoints a moment later.
    let first = Instant::now();
    eventually("a first UDP reply", Duration::from_secs(60), || udp_exchange(&front, "hello")).await;
    println!("node: first UDP reply {:.1} s after Ready", first.elapsed().as_secs_f64());
    let mut replies = BTreeMap::new();
    for i in 0..40 {
        let line = format!("ping {i}");
        let what = format!("a reply to UDP exchange {i}");
        let reply = eventually(&what, Duration::from_secs(10), || udp_exchange(&front, &line)).await;
        let (version, echoed) = reply.trim().split_once(' ').unwrap_or_default();
        assert_eq!(echoed, format!("ping {i}"), "the reply echoes the request: {reply:?}");
        *replies.entry(version.to_string()).or_insert(0) += 1;
    }
    println!("node: 40 UDP exchanges through {front}:53: {replies:?}");
    assert_eq!(replies.keys().collect::<Vec<_>>(), ["u1", "u2"], "both backends answer: {replies:?}");

    // u2 scaled to 0 while clients exchange datagrams continuously, each once, without a retry.
    wait_backends(world, UDP_BALANCER, &[1, 1], &[50, 50], "True", Duration::from_secs(15)).await;
    let load = UdpLoad::start(front.clone(), 2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    world.kubectl.ok(&["-n", NS, "scale", "deployment/udp-echo-u2", "--replicas=0"]);
    let scaled = Instant::now();
    wait_backends(world, UDP_BALANCER, &[1, 0], &[100, 0], "False", Duration::from_secs(15)).await;
    println!("node: u2 without endpoints in the status {:.1} s after scaling it to 0", scaled.elapsed().as_secs_f64());
    tokio::time::sleep(Duration::from_secs(20)).await;
    let (sent, lost, answers) = load.finish().await;
    let without_endpoints = scaled.elapsed().as_secs_f64();
    println!(
        "node: {sent} UDP exchanges while u2 went to 0 pods ({without_endpoints:.0} s), {lost} lost; answers {answers:?}"
    );
    // nginx sends a UDP exchange to a backend that refused one again only after its failTimeout
    // (10 s), once per worker (2): each such exchange is lost. The docs state this bound.
    let bound = 2 * (without_endpoints / 10.0).ceil() as usize + 2;
    assert!(lost <= bound, "{lost} UDP exchanges lost, over the bound of {bound}");
    world.kubectl.ok(&["-n", NS, "scale", "deployment/udp-echo-u2", "--replicas=1"]);
    wait_available(world, NS, "udp-echo-u2", 1).await;
    wait_backends(world, UDP_BALANCER, &[1, 1], &[50, 50], "True", Duration::from_secs(15)).await;
    udp_weights_change_live(world, &front).await;
    world.kubectl.ok(&["-n", NS, "delete", "balancer", UDP_BALANCER]);
}

/// A weight change on the UDP Balancer, under continuous exchanges: on the wire within 2 s of
/// the write, and at most 1 in 1,000 exchanges lost across it: over 10 s, from 2 s before the
/// write to 8 s after.
async fn udp_weights_change_live(world: &World, front: &str) {
    // Six clients, over 10 s: enough exchanges (about 2,500) for a rate of 1 in 1,000. A change
    // loses the exchanges whose reply is on its way when nginx's old workers retire (at most one
    // per client; 0 to 2 in a run so far), so a shorter window measures that count, not a rate.
    let load = UdpLoad::start(front.to_string(), 6);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let written = Instant::now();
    change_backends(world, UDP_BALANCER, &[("u1", 100), ("u2", 0)], &[]).await;
    let only_u1 = eventually("only u1 answering UDP exchanges", Duration::from_secs(10), || async {
        let lines: Vec<String> = (0..16).map(|i| format!("flip {i}")).collect();
        let replies = futures::future::join_all(lines.iter().map(|line| udp_exchange(front, line))).await;
        let only = replies.iter().all(|r| r.as_deref().is_some_and(|r| r.starts_with("u1 ")));
        only.then(|| written.elapsed().as_secs_f64())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(written.elapsed())).await;
    let (sent, lost, answers) = load.finish().await;
    println!(
        "node: a UDP weight change on the wire {only_u1:.2} s after the write; {sent} exchanges across it, {lost} lost; answers {answers:?}"
    );
    assert!(only_u1 <= 2.0, "the UDP weight change took {only_u1:.2} s");
    assert!(lost * 1000 <= sent, "{lost} of {sent} UDP exchanges lost across the change");
}

/// UDP clients exchanging datagrams back to back until stopped, each exchange once, with no
/// retry: a datagram without a reply within a second is a lost exchange.
pub struct UdpLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: tokio::task::JoinSet<(usize, usize, BTreeMap<String, usize>)>,
}

impl UdpLoad {
    pub fn start(ip: String, clients: usize) -> UdpLoad {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for client in 0..clients {
            let (ip, stop) = (ip.clone(), stop.clone());
            tasks.spawn(async move {
                let (mut sent, mut lost, mut answers) = (0, 0, BTreeMap::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    sent += 1;
                    let line = format!("client {client} exchange {sent}");
                    match udp_exchange(&ip, &line).await {
                        // An answer echoes the line; nginx answers a refused exchange with an
                        // empty datagram.
                        Some(reply) if reply.trim_end().ends_with(&line) => {
                            let version = reply.split_whitespace().next().unwrap_or_default().to_string();
                            *answers.entry(version).or_insert(0) += 1;
                        }
                        _ => lost += 1,
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (sent, lost, answers)
            });
        }
        UdpLoad { stop, tasks }
    }

    /// Stops the clients: exchanges sent, lost, and the replies by backend.
    pub async fn finish(self) -> (usize, usize, BTreeMap<String, usize>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut all = (0, 0, BTreeMap::new());
        for (sent, lost, answers) in self.tasks.join_all().await {
            all.0 += sent;
            all.1 += lost;
            for (version, n) in answers {
                *all.2.entry(version).or_insert(0) += n;
            }
        }
        all
    }
}

/// One datagram from a fresh socket to `ip:53`, and the reply, if one came within a second.
pub async fn udp_exchange(ip: &str, line: &str) -> Option<String> {
    let socket = tokio::net::UdpSocket::bind("0.0.0.0:0").await.ok()?;
    socket.send_to(format!("{line}\n").as_bytes(), format!("{ip}:53")).await.ok()?;
    let mut buffer = [0u8; 512];
    let (n, _) = tokio::time::timeout(Duration::from_secs(1), socket.recv_from(&mut buffer)).await.ok()?.ok()?;
    Some(String::from_utf8_lossy(&buffer[..n]).into_owned())
}

/// A v1beta1 Balancer over the walkthrough's echo pods, 40/20/40, exposed at `node_port` on
/// the node. `Local` keeps the client's address: kube-proxy masquerades node-port traffic
/// under `Cluster`, and nginx would see the node's address for every client. `Local` also means
/// the node kube-proxy speaks for: the proxy pods stay on node A (`spec.proxy.nodeSelector`).
fn node_port_balancer(name: &str, node_port: u16, affinity: &str) -> String {
    let node = NODE_A.name;
    format!(
        "apiVersion: exposer.hliangzhao.io/v1beta1\nkind: Balancer\nmetadata:\n  name: {name}\n  namespace: {NS}\n\
         spec:\n  sessionAffinity: {affinity}\n  service: {{type: NodePort, externalTrafficPolicy: Local}}\n\
         \x20 proxy: {{nodeSelector: {{kubernetes.io/hostname: {node}}}}}\n\
         \x20 ports: [{{name: http, port: 80, targetPort: 5678, nodePort: {node_port}}}]\n  selector: {{app: test}}\n\
         \x20 backends:\n    - {{name: v1, weight: 40, selector: {{version: v1}}}}\n\
         \x20   - {{name: v2, weight: 20, selector: {{version: v2}}}}\n\
         \x20   - {{name: v3, weight: 40, selector: {{version: v3}}}}\n"
    )
}

/// Host addresses of the test's own on the pod bridge, so that clients can differ by source
/// address; removed when dropped (and with the bridge by `host.sh down` in any case).
struct BridgeAddresses(Vec<String>);

impl BridgeAddresses {
    fn add(addresses: impl IntoIterator<Item = String>) -> BridgeAddresses {
        let mut added = BridgeAddresses(Vec::new());
        for address in addresses {
            let ok = Command::new("ip")
                .args(["addr", "add", &format!("{address}/32"), "dev", POD_BRIDGE])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "ip addr add {address}/32 dev {POD_BRIDGE} failed");
            added.0.push(address);
        }
        added
    }
}

impl Drop for BridgeAddresses {
    fn drop(&mut self) {
        for address in &self.0 {
            let _ = Command::new("ip").args(["addr", "del", &format!("{address}/32"), "dev", POD_BRIDGE]).status();
        }
    }
}

/// `spec.service` and `spec.sessionAffinity` on a real kube-proxy and nginx: a NodePort
/// Balancer answers at the node's address, and its status says where. With `ClientIP`, every
/// request from one address lands on one backend (nginx's consistent hash of the client
/// address), where the same Balancer without affinity spreads that address 40/20/40; and
/// distinct client addresses do not all land on the same backend, so the hash does see them.
pub async fn a_node_port_balancer_with_client_ip_affinity_keeps_each_client_on_one_backend(world: &mut World) {
    world.ensure_echo_backends().await;
    let balancers = [("sticky", 30080, "ClientIP"), ("spread", 30081, "None")];
    for (name, node_port, affinity) in balancers {
        world.kubectl.apply(&node_port_balancer(name, node_port, affinity));
    }
    for (name, node_port, _) in balancers {
        let status = wait_ready_balancer(world, name, Duration::from_secs(120)).await.status.expect("a status");
        let front = front_ip(world, name).await;
        // Compared as JSON, in the status's own field names.
        let (node_ports, addresses) = (json!(status.node_ports), json!(status.addresses));
        assert_eq!(node_ports, json!([{"port": 80, "protocol": "TCP", "nodePort": node_port}]), "{status:?}");
        assert_eq!(addresses, json!([{"type": "IPAddress", "value": front}]), "{status:?}");
        let address = format!("{NODE_IP}:{node_port}");
        eventually(&format!("{name} answering at {address}"), Duration::from_secs(30), || async {
            one_request(&address).await.ok()
        })
        .await;
    }
    let weights = [("hello world v1", 40), ("hello world v2", 20), ("hello world v3", 40)];

    // One client (the node's own address), no affinity: the weights.
    let spread = split(NODE_IP, 30081, 600).await;
    println!("node: 600 requests from {NODE_IP} to {NODE_IP}:30081 without affinity: {spread:?}");
    assert_eq!(spread.get("failed"), None, "every request answered: {spread:?}");
    assert_shares(&spread, &weights, 6.0);
    // The same client with ClientIP: one backend.
    let sticky = split(NODE_IP, 30080, 60).await;
    println!("node: 60 requests from {NODE_IP} to {NODE_IP}:30080 with ClientIP: {sticky:?}");
    assert_eq!(sticky.get("failed"), None, "every request answered: {sticky:?}");
    assert_eq!(sticky.len(), 1, "every request from one address on one backend: {sticky:?}");

    // Twelve more clients, from addresses at the top of the pod subnet that no pod holds.
    let sources: Vec<String> = (240..252).map(|i| format!("10.244.0.{i}")).collect();
    let pods: Api<Pod> = Api::all(world.admin.clone());
    let taken: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items
        .into_iter()
        .filter_map(|p| p.status?.pod_ip)
        .filter(|ip| sources.contains(ip))
        .collect();
    assert!(taken.is_empty(), "pods hold {taken:?}");
    let clients = BridgeAddresses::add(sources);
    let address = format!("{NODE_IP}:30080");
    let mut landed = BTreeMap::new();
    for source in &clients.0 {
        let mut answers = BTreeSet::new();
        for _ in 0..5 {
            answers.insert(one_request_from(Some(source), &address).await.unwrap_or_else(|e| format!("failed: {e}")));
        }
        assert_eq!(answers.len(), 1, "5 requests from {source} on one backend: {answers:?}");
        assert!(!answers.iter().any(|a| a.starts_with("failed")), "from {source}: {answers:?}");
        landed.insert(source.clone(), answers.pop_first().unwrap_or_default());
    }
    drop(clients);
    let mut per_backend: BTreeMap<&str, usize> = BTreeMap::new();
    for backend in landed.values() {
        *per_backend.entry(backend).or_default() += 1;
    }
    println!("node: 12 client addresses × 5 requests with ClientIP, clients per backend: {per_backend:?}");
    // Twelve addresses hashed onto one backend by chance: 2 × 0.4¹² + 0.2¹², about 3 in 100,000.
    assert!(per_backend.len() >= 2, "every client on one backend: does nginx see one address? {landed:?}");

    for (name, _, _) in balancers {
        world.kubectl.ok(&["-n", NS, "delete", "balancer", name]);
    }
}

/// Reads the PROXY protocol header a connection starts with, answers with the client address
/// in it (or `no-header`), and closes.
const PROXY_PROTOCOL_ECHO: &str = "import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('', 8080))
s.listen(64)
while True:
    c, _ = s.accept()
    c.settimeout(5)
    data = b''
    try:
        while b'\\r\\n' not in data and len(data) < 256:
            chunk = c.recv(256)
            if not chunk:
                break
            data += chunk
        words = data.split(b'\\r\\n')[0].split(b' ')
        c.sendall((words[2] if len(words) > 2 and words[0] == b'PROXY' else b'no-header') + b'\\n')
    except OSError:
        pass
    c.close()
";

/// Connects from inside a pod to `address:port`, prints the first line answered.
const ASK_ONCE: &str = "import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)
print(c.makefile().readline().strip())
";

/// `proxyProtocol: true`: a backend behind the proxy reads the client pod's own address from
/// the header nginx sends, not the proxy pod's.
pub async fn a_backend_behind_the_proxy_sees_the_client_pods_address(world: &mut World) {
    world.ensure_udp_backends().await;
    let echo = json!({
        "name": "echo",
        "command": ["python3", "-c", PROXY_PROTOCOL_ECHO],
        "ports": [{"containerPort": 8080}],
        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
    });
    let backend = backend_deployment(NS, "pp-echo", json!({"app": "pp-echo"}), echo);
    world.kubectl.apply(&backend.to_string());
    let balancer = format!(
        "apiVersion: exposer.hliangzhao.io/v1beta1\nkind: Balancer\nmetadata:\n  name: pp\n  namespace: {NS}\n\
         spec:\n  ports:\n    - {{name: tcp, port: 80, targetPort: 8080, proxyProtocol: true}}\n\
         \x20 selector: {{app: pp-echo}}\n  backends:\n    - {{name: a, selector: {{app: pp-echo}}}}\n"
    );
    world.kubectl.apply(&balancer);
    wait_available(world, NS, "pp-echo", 1).await;
    wait_ready_balancer(world, "pp", Duration::from_secs(120)).await;
    let front = front_ip(world, "pp").await;
    // The client: a pod that is neither the proxy nor the backend (the UDP scenario's echo).
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let client = pods.list(&ListParams::default().labels("app=udp-echo,version=u1")).await.expect("pods");
    let client = client.items.into_iter().next().expect("the u1 echo pod");
    let (name, ip) = (client.metadata.name.clone().unwrap_or_default(), client.status.and_then(|s| s.pod_ip));
    let ip = ip.expect("a pod IP");
    let args = ["-n", NS, "exec", &name, "--", "python3", "-c", ASK_ONCE, &front, "80"];
    let seen = eventually("an answer through the PROXY protocol Balancer", Duration::from_secs(30), || async {
        let (ok, out, _) = world.kubectl.run(&args, None);
        ok.then(|| out.trim().to_string()).filter(|out| !out.is_empty())
    })
    .await;
    println!("node: the backend read {seen:?} from the PROXY protocol header; the client pod is {ip}");
    assert_eq!(seen, ip, "the client pod's address, not the proxy's");
    world.kubectl.ok(&["-n", NS, "delete", "balancer", "pp"]);
    world.kubectl.ok(&["-n", NS, "delete", "deployment", "pp-echo"]);
}

/// A Balancer whose only primary, v1, is scaled to 0 under load: every connection goes to the
/// backup, v3, with none failed, and back to v1 once it returns.
pub async fn with_every_primary_scaled_to_0_the_backup_serves_without_a_failed_request(world: &mut World) {
    world.ensure_echo_backends().await;
    let balancer = format!(
        "apiVersion: exposer.hliangzhao.io/v1beta1\nkind: Balancer\nmetadata:\n  name: spare\n  namespace: {NS}\n\
         spec:\n  ports:\n    - {{port: 80, targetPort: 5678}}\n  selector: {{app: test}}\n  backends:\n\
         \x20   - {{name: v1, selector: {{version: v1}}}}\n    - {{name: v3, selector: {{version: v3}}, backup: true}}\n"
    );
    world.kubectl.apply(&balancer);
    wait_ready_balancer(world, "spare", Duration::from_secs(120)).await;
    wait_backends(world, "spare", &[1, 1], &[100, 0], "True", Duration::from_secs(30)).await;
    let front = front_ip(world, "spare").await;
    eventually("the spare Balancer answering", Duration::from_secs(30), || async {
        (one_request(&format!("{front}:80")).await.ok()? == "hello world v1").then_some(())
    })
    .await;
    let load = Load::start(format!("{front}:80"), 4);
    let primary = load.answers_within(Duration::from_secs(3)).await;
    println!("node: 3 s with the primary up: {primary:?}");
    assert_eq!(primary.keys().collect::<Vec<_>>(), ["hello world v1"], "the backup waits");

    let v1 = leaving(world, "app=test,version=v1", "v1's pod").await;
    world.kubectl.ok(&["-n", NS, "scale", "deployment/echo-v1", "--replicas=0"]);
    wait_backends(world, "spare", &[0, 1], &[0, 100], "False", Duration::from_secs(30)).await;
    v1.gone();
    let backup = load.answers_within(Duration::from_secs(3)).await;
    println!("node: 3 s with v1 scaled to 0: {backup:?}");
    assert_eq!(backup.keys().collect::<Vec<_>>(), ["hello world v3"], "the backup takes every connection");

    world.kubectl.ok(&["-n", NS, "scale", "deployment/echo-v1", "--replicas=1"]);
    wait_available(world, NS, "echo-v1", 1).await;
    wait_backends(world, "spare", &[1, 1], &[100, 0], "True", Duration::from_secs(30)).await;
    // nginx tries v1 again once its failTimeout (10 s) since the last refusal is over.
    let back = Instant::now();
    let mut recovered = BTreeMap::new();
    while back.elapsed() < Duration::from_secs(30) {
        recovered = load.answers_within(Duration::from_secs(3)).await;
        if recovered.keys().collect::<Vec<_>>() == ["hello world v1"] {
            break;
        }
    }
    println!(
        "node: v1 back, all its connections again {:.1} s after it was ready: {recovered:?}",
        back.elapsed().as_secs_f64()
    );
    assert_eq!(recovered.keys().collect::<Vec<_>>(), ["hello world v1"], "back to the primary");
    load.assert_no_failures("while the primary went to 0 pods and back").await;
    world.kubectl.ok(&["-n", NS, "delete", "balancer", "spare"]);
}

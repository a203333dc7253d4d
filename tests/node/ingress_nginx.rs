//! The way off ingress-nginx: its `tcp-services` and `udp-services` ConfigMaps, rewritten by
//! `balancer from-ingress-nginx` as a user would (docs/cli.md), serve the same ports with the
//! same backends.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fixtures::{Sample, front_ip, wait_ready_balancer};
use crate::toolkit::load::one_request;
use crate::toolkit::runner::eventually;
use crate::{NS, World};

/// The namespace of ingress-nginx's ConfigMaps.
const INGRESS_NS: &str = "ingress-nginx";

/// The Services ingress-nginx forwarded to (the walkthrough's v1 echo pods over TCP, the UDP
/// echo pods), and its ConfigMaps: TCP 7000 to the echo by port name, TCP 7001 the same with
/// the PROXY protocol from clients, UDP 7053 to the UDP echo.
fn ingress_nginx_objects() -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: echo-v1, namespace: {NS}}}\n\
         spec: {{selector: {{app: test, version: v1}}, ports: [{{name: http, port: 80, targetPort: 5678}}]}}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: udp-echo, namespace: {NS}}}\n\
         spec: {{selector: {{app: udp-echo}}, ports: [{{name: dns, port: 53, protocol: UDP, targetPort: 5353}}]}}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: tcp-services, namespace: {INGRESS_NS}}}\n\
         data: {{\"7000\": \"{NS}/echo-v1:http\", \"7001\": \"{NS}/echo-v1:80:PROXY\"}}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: udp-services, namespace: {INGRESS_NS}}}\n\
         data: {{\"7053\": \"{NS}/udp-echo:53\"}}\n"
    )
}

/// ingress-nginx's ConfigMaps (TCP, UDP, the PROXY protocol) and the Services they name, as
/// `kubectl get -A configmaps,services -o yaml` lists them, become Balancers through `balancer
/// from-ingress-nginx`, which leaves nothing behind; applied, they serve each port with the
/// same pods: the v1 echo over TCP, the same behind the PROXY protocol (and nothing without it),
/// the UDP echo pods over UDP.
pub async fn ingress_nginx_tcp_and_udp_services_become_balancers(world: &mut World) {
    world.ensure_sample(Sample::AS_SHIPPED).await;
    world.ensure_udp_backends().await;
    world.kubectl.ok(&["create", "namespace", INGRESS_NS]);
    world.kubectl.apply(&ingress_nginx_objects());
    let listed = world.kubectl.ok(&["get", "-A", "configmaps,services", "-o", "yaml"]);
    let balancers = from_ingress_nginx(&listed);
    world.kubectl.ok_with(&["apply", "-f", "-"], &balancers);
    for name in ["echo-v1-balancer", "udp-echo-balancer"] {
        wait_ready_balancer(world, name, Duration::from_secs(120)).await;
    }
    let tcp = front_ip(world, "echo-v1-balancer").await;
    let udp = front_ip(world, "udp-echo-balancer").await;
    let plain = format!("{tcp}:7000");
    let answer = eventually("the v1 echo through TCP 7000", Duration::from_secs(60), || async {
        one_request(&plain).await.ok().filter(|a| a == "hello world v1")
    })
    .await;
    let behind_proxy = format!("{tcp}:7001");
    let proxied = eventually("the v1 echo through TCP 7001 behind the PROXY protocol", Duration::from_secs(30), || {
        request_behind_proxy_protocol(&behind_proxy)
    })
    .await;
    let refused = one_request(&behind_proxy).await;
    let echoed =
        eventually("a UDP echo through 7053", Duration::from_secs(60), || udp_exchange(&udp, 7053, "ping")).await;
    println!(
        "node: from ingress-nginx: TCP 7000 {answer:?}; TCP 7001 with a PROXY header {proxied:?}, without {refused:?}; UDP 7053 {echoed:?}"
    );
    assert!(refused.is_err() || refused.as_deref() == Ok(""), "7001 answered without a PROXY header: {refused:?}");
    assert!(echoed.trim().ends_with("ping"), "the UDP echo pods answer: {echoed:?}");

    world.kubectl.ok_with(&["delete", "-f", "-", "--wait=false"], &balancers);
    world.kubectl.ok(&["-n", NS, "delete", "service", "echo-v1", "udp-echo"]);
    world.kubectl.ok(&["delete", "namespace", INGRESS_NS, "--wait=false"]);
}

/// ingress-nginx's ConfigMaps and the Services they name, rewritten by `balancer
/// from-ingress-nginx --to gateway` as one Gateway and a route per entry: TCP 7000 and UDP 7053
/// serve the same pods through the Gateway's address; 7001, behind the PROXY protocol, is left
/// behind (Gateway API cannot say it) and said so.
pub async fn ingress_nginx_tcp_and_udp_services_become_a_gateway(world: &mut World) {
    world.ensure_sample(Sample::ANY).await;
    world.ensure_udp_backends().await;
    world.ensure_gateway_api().await;
    let namespace = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {INGRESS_NS}}}\n");
    world.kubectl.apply(&namespace);
    world.kubectl.apply(&ingress_nginx_objects());
    let listed = world.kubectl.ok(&["get", "-A", "configmaps,services", "-o", "yaml"]);
    let (gateway, left_behind) = convert(&listed, &["--to", "gateway"]);
    assert_eq!(
        left_behind.trim(),
        format!(
            "left behind: {NS}/echo-v1 TCP 7001: Gateway API has no PROXY protocol; convert this entry with --to balancer"
        )
    );
    world.kubectl.ok_with(&["apply", "-f", "-"], &gateway);
    let gateways: kube::Api<balancer::gateway::api::gateways::Gateway> =
        kube::Api::namespaced(world.admin.clone(), INGRESS_NS);
    let address = eventually("the converted Gateway Programmed", Duration::from_secs(120), || async {
        let status = gateways.get("tcp-udp-services").await.ok()?.status?;
        let programmed = status.conditions?.iter().any(|c| c.type_ == "Programmed" && c.status == "True");
        programmed.then_some(status.addresses?.first()?.value.clone())
    })
    .await;
    let plain = format!("{address}:7000");
    let answer = eventually("the v1 echo through the Gateway's TCP 7000", Duration::from_secs(60), || async {
        one_request(&plain).await.ok().filter(|a| a == "hello world v1")
    })
    .await;
    let echoed = eventually("a UDP echo through the Gateway's 7053", Duration::from_secs(60), || {
        udp_exchange(&address, 7053, "ping")
    })
    .await;
    println!("node: from ingress-nginx to a Gateway: TCP 7000 {answer:?}; UDP 7053 {echoed:?}");
    assert!(echoed.trim().ends_with("ping"), "the UDP echo pods answer: {echoed:?}");
    world.kubectl.ok_with(&["delete", "-f", "-", "--wait=false"], &gateway);
    world.kubectl.ok(&["-n", NS, "delete", "service", "echo-v1", "udp-echo"]);
    world.kubectl.ok(&["delete", "namespace", INGRESS_NS, "--wait=false"]);
}

/// What `balancer from-ingress-nginx -` writes for `listed`; it must leave nothing behind.
fn from_ingress_nginx(listed: &str) -> String {
    let (written, left_behind) = convert(listed, &[]);
    assert!(left_behind.is_empty(), "from-ingress-nginx left something behind: {left_behind}");
    written
}

/// What `balancer from-ingress-nginx [ARGS] -` writes for `listed`, and what it says it left
/// behind.
fn convert(listed: &str, args: &[&str]) -> (String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_balancer"))
        .arg("from-ingress-nginx")
        .args(args)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("balancer runs");
    child.stdin.take().expect("stdin").write_all(listed.as_bytes()).expect("the listing is written");
    let out = child.wait_with_output().expect("balancer ends");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (String::from_utf8(out.stdout).expect("YAML"), stderr)
}

/// `GET /` after a PROXY protocol v1 header: the body's first line.
async fn request_behind_proxy_protocol(address: &str) -> Option<String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
        let request = "PROXY TCP4 192.0.2.7 10.0.0.1 40000 7001\r\nGET / HTTP/1.0\r\nHost: balancer\r\n\r\n";
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await.ok()?;
        let text = String::from_utf8_lossy(&reply).into_owned();
        Some(text.split("\r\n\r\n").nth(1)?.lines().next()?.to_string())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange).await.ok().flatten().filter(|a| a == "hello world v1")
}

/// One datagram to `ip:port`, and the reply.
async fn udp_exchange(ip: &str, port: u16, line: &str) -> Option<String> {
    let socket = tokio::net::UdpSocket::bind("0.0.0.0:0").await.ok()?;
    socket.send_to(format!("{line}\n").as_bytes(), format!("{ip}:{port}")).await.ok()?;
    let mut buffer = [0u8; 512];
    let (n, _) = tokio::time::timeout(Duration::from_secs(1), socket.recv_from(&mut buffer)).await.ok()?.ok()?;
    Some(String::from_utf8_lossy(&buffer[..n]).into_owned())
}

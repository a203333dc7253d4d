//! A refused backend (a route's backend that does not resolve, or has no ready endpoint) takes
//! its share of new connections and refuses them, and drops its share of datagrams, on a
//! listener that tries one server a connection; a backend of weight 0 gets nothing. The
//! conformance suite's weighted routing asks 70/30/0 within 5 points over 500 connections.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use balancer::api::Protocol;
use balancer::proxy::model::{
    Destination, Listener, Method, OwnerKind, ProxyConfig, Targets, WeightedBackend, upstream_servers,
};
use balancer::proxy::nginx;
use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::timeout;

use crate::STEP;
use crate::backends::{Backend, tcp_backend, udp_backend};
use crate::process::{nginx_binary, start_nginx};

fn backend(name: &str, weight: u32, targets: Targets) -> WeightedBackend {
    let (backup, max_fails, fail_timeout, max_connections) = (false, None, None, None);
    WeightedBackend { name: name.into(), weight, backup, max_fails, fail_timeout, max_connections, targets }
}

fn pod(backend: &Backend) -> Targets {
    let service = Destination::Address(SocketAddr::from(([127, 0, 3, 99], 1)));
    Targets::Pods { service, pods: vec![backend.addr] }
}

/// 70 to `served`'s pod, 30 refused, 0 to `idle`'s pod, on one listener of `protocol`.
fn config(port: u16, protocol: Protocol, served: &Backend, idle: &Backend) -> ProxyConfig {
    let backends =
        [backend("served", 70, pod(served)), backend("refused", 30, Targets::Refused), backend("idle", 0, pod(idle))];
    let listener = Listener::of_route(port, protocol, upstream_servers(Method::RoundRobin, &backends));
    let drain_timeout = "1s".to_string();
    ProxyConfig {
        kind: OwnerKind::Gateway,
        name: "routes".into(),
        load_modules: vec![],
        drain_timeout,
        access_log: None,
        listeners: vec![listener],
        canary_window: None,
    }
}

/// The share of `asks` answered by the backend, and of those refused, in points.
fn shares(answered: usize, asks: usize) -> (f64, f64) {
    let answered = 100.0 * answered as f64 / asks as f64;
    (answered, 100.0 - answered)
}

#[tokio::test]
async fn a_refused_backend_refuses_its_share_of_connections() {
    let Some(bin) = nginx_binary() else { return };
    let served = tcp_backend("served", Ipv4Addr::new(127, 0, 3, 2), "served".into()).await;
    let idle = tcp_backend("idle", Ipv4Addr::new(127, 0, 3, 3), "idle".into()).await;
    let (nginx, port) = start_nginx(&bin, |p| nginx::write(&config(p, Protocol::Tcp, &served, &idle))).await;
    let asks = 500;
    let mut answered = 0;
    for _ in 0..asks {
        let reply = timeout(STEP, async {
            let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
            let mut reply = String::new();
            stream.read_to_string(&mut reply).await.map(|_| reply)
        })
        .await
        .expect("nginx answers or closes in time");
        // A refused connection is accepted by nginx, then closed without a byte.
        answered += usize::from(reply.is_ok_and(|r| r == "served"));
    }
    let (served_share, refused_share) = shares(answered, asks);
    eprintln!("70/30/0 over {asks} connections: {served_share:.1} % served, {refused_share:.1} % refused");
    assert!((served_share - 70.0).abs() <= 5.0, "{served_share:.1} % served, wanted 70 ± 5");
    assert_eq!(idle.served.load(std::sync::atomic::Ordering::SeqCst), 0, "weight 0 gets nothing");
    drop(nginx);
}

#[tokio::test]
async fn a_refused_backend_drops_its_share_of_datagrams() {
    let Some(bin) = nginx_binary() else { return };
    let served = udp_backend("served", Ipv4Addr::new(127, 0, 3, 4), "served".into()).await;
    let idle = udp_backend("idle", Ipv4Addr::new(127, 0, 3, 5), "idle".into()).await;
    let (nginx, port) = start_nginx(&bin, |p| nginx::write(&config(p, Protocol::Udp, &served, &idle))).await;
    let asks = 300;
    // Each from a socket of its own (a session of its own), all at once: a dropped datagram
    // costs its wait once, not once each.
    let mut sockets = Vec::new();
    for _ in 0..asks {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind a client");
        socket.connect((Ipv4Addr::LOCALHOST, port)).await.expect("connect");
        socket.send(b"who are you?").await.expect("send");
        sockets.push(socket);
    }
    let replies = futures::future::join_all(sockets.iter().map(|socket| async move {
        let mut buf = [0u8; 64];
        let n = timeout(Duration::from_secs(2), socket.recv(&mut buf)).await.ok()?.ok()?;
        Some(buf[..n].to_vec())
    }))
    .await;
    let answered = replies.iter().filter(|r| r.as_deref() == Some(b"served".as_slice())).count();
    let (served_share, dropped_share) = shares(answered, asks);
    eprintln!("70/30/0 over {asks} datagrams: {served_share:.1} % answered, {dropped_share:.1} % dropped");
    assert!((served_share - 70.0).abs() <= 5.0, "{served_share:.1} % answered, wanted 70 ± 5");
    assert_eq!(idle.served.load(std::sync::atomic::Ordering::SeqCst), 0, "weight 0 gets nothing");
    drop(nginx);
}

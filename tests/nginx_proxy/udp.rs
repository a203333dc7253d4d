//! UDP: datagrams split by weight, TCP and UDP on one port number side by side, and one-shot
//! (DNS-like) clients whose sessions end once answered, so they do not exhaust nginx's connections.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use balancer::api::{BackendSpec, BalancerPort, BalancerSpec};
use balancer::proxy::model::Destination;
use balancer::proxy::nginx;
use tokio::time::timeout;

use crate::BACKEND_IPS;
use crate::backends::{
    addresses, admitted, served, tally, tcp_ask, tcp_backend, udp_ask, udp_backend, udp_backends, weights,
};
use crate::process::{nginx_binary, start_nginx};
use crate::support::fixtures::{backend, port};
use crate::wrr::assert_split;

/// Each datagram comes from a fresh socket, so it opens a fresh nginx UDP session and
/// is balanced on its own. Sessions linger (proxy_timeout), so keep the count modest.
const DATAGRAMS: usize = 100;

#[tokio::test]
async fn udp_datagrams_are_answered_by_the_backends_by_weight() {
    let Some(bin) = nginx_binary() else { return };
    let backends = udp_backends(&["v1", "v2", "v3"]).await;
    let address = addresses(&backends);
    let spec = |p: u16| {
        admitted(BalancerSpec {
            replicas: None,
            session_affinity: None,
            algorithm: None,
            service: None,
            proxy: None,
            canary: None,
            ports: vec![port(Some("dns"), "UDP", i32::from(p))],
            selector: Some(BTreeMap::from([("app".to_string(), "dns".to_string())])),
            backends: vec![backend("v1", 50), backend("v2", 30), backend("v3", 20)],
        })
    };
    let (nginx, listen) = start_nginx(&bin, |p| {
        let rendered = nginx::render("dns", &spec(p), &[], None, &address);
        assert!(rendered.contains(&format!("listen {p} udp;")), "{rendered}");
        rendered
    })
    .await;

    let mut replies = Vec::with_capacity(DATAGRAMS);
    let mut clients = Vec::with_capacity(DATAGRAMS);
    for _ in 0..DATAGRAMS {
        let (reply, socket) = udp_ask(listen).await;
        replies.push(reply);
        clients.push(socket);
    }
    let observed = tally(replies);
    let workers = nginx.workers();
    eprintln!("50/30/20 over {DATAGRAMS} UDP sessions, {workers} nginx workers: {observed:?}");

    assert_eq!(served(&backends), observed, "every datagram reached exactly one backend, once");
    assert_split(&observed, &[("v1", 50), ("v2", 30), ("v3", 20)], &weights(&spec(listen)), workers);
}

#[tokio::test]
async fn tcp_and_udp_on_the_same_port_number_reach_their_own_servers() {
    let Some(bin) = nginx_binary() else { return };
    let names = ["v1", "v2"];
    let mut tcp = Vec::new();
    let mut udp = Vec::new();
    for (name, ip) in names.iter().zip(BACKEND_IPS) {
        tcp.push(tcp_backend(name, ip, format!("tcp:{name}")).await);
        udp.push(udp_backend(name, ip, format!("udp:{name}")).await);
    }
    let address = |b: &BackendSpec, p: &BalancerPort| {
        let servers = if p.written_protocol() == "UDP" { &udp } else { &tcp };
        Destination::Address(servers.iter().find(|s| s.name == b.name).expect("server").addr)
    };
    let spec = |p: u16| {
        admitted(BalancerSpec {
            replicas: None,
            session_affinity: None,
            algorithm: None,
            service: None,
            proxy: None,
            canary: None,
            ports: vec![port(Some("stream"), "TCP", i32::from(p)), port(Some("dgram"), "UDP", i32::from(p))],
            selector: None,
            backends: vec![backend("v1", 1), backend("v2", 1)],
        })
    };
    let (nginx, listen) = start_nginx(&bin, |p| nginx::render("dual", &spec(p), &[], None, &address)).await;

    let mut tcp_replies = Vec::new();
    let mut udp_replies = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..10 {
        tcp_replies.push(tcp_ask(listen).await);
        let (reply, socket) = udp_ask(listen).await;
        udp_replies.push(reply);
        clients.push(socket);
    }
    let workers = nginx.workers();
    let (tcp_seen, udp_seen) = (tally(tcp_replies), tally(udp_replies));
    eprintln!("same port {listen}, TCP and UDP, 1:1, {workers} nginx workers: {tcp_seen:?} {udp_seen:?}");
    assert_split(&tcp_seen, &[("tcp:v1", 5), ("tcp:v2", 5)], &[1, 1], workers);
    assert_split(&udp_seen, &[("udp:v1", 5), ("udp:v2", 5)], &[1, 1], workers);
}

/// A UDP client that sends one datagram and gets one answer (DNS, syslog-like request/
/// response) must not pin nginx resources for long. The rendered UDP `server` sets neither
/// `proxy_responses` nor `proxy_timeout`, so every session (one per client address:port,
/// i.e. per DNS query from a resolver with random source ports) stays open for nginx's
/// default `proxy_timeout` of 10 minutes and holds 2 of the worker's 1024 connections:
/// after ~511 one-shot clients per worker in 10 minutes, nginx logs
/// "1024 worker_connections are not enough" and drops every further datagram.
/// With `proxy_responses 1;` in the UDP server block this test passes (checked by hand).
#[tokio::test]
async fn udp_sessions_end_once_answered() {
    let Some(bin) = nginx_binary() else { return };
    let backends = udp_backends(&["v1"]).await;
    let address = addresses(&backends);
    let spec = |p: u16| {
        admitted(BalancerSpec {
            replicas: None,
            session_affinity: None,
            algorithm: None,
            service: None,
            proxy: None,
            canary: None,
            ports: vec![port(Some("dns"), "UDP", i32::from(p))],
            selector: Some(BTreeMap::from([("app".to_string(), "dns".to_string())])),
            backends: vec![backend("v1", 1)],
        })
    };
    let (nginx, listen) = start_nginx(&bin, |p| nginx::render("dns", &spec(p), &[], None, &address)).await;
    udp_ask(listen).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let workers = nginx.workers();
    // More one-shot clients than all workers together could hold sessions for (~511 each).
    let clients = 600 * workers + 100;
    let started = Instant::now();
    for client in 2..=clients {
        let reply = timeout(Duration::from_secs(1), udp_ask(listen)).await;
        assert!(
            reply.is_ok(),
            "one-shot UDP client #{client} got no answer after {} were answered in {:?} ({workers} workers)\n{}",
            client - 1,
            started.elapsed(),
            nginx.prefix.log()
        );
    }
}

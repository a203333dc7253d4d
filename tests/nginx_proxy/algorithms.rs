//! Least connections, a backup, `maxConnections` across workers, the PROXY protocol both ways,
//! and `nginx -t` over generated mixes of those settings.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use balancer::api::{BackendSpec, BalancerPort, BalancerSpec};
use balancer::proxy::model::Destination;
use balancer::proxy::nginx;
use balancer::spec::{ObjectName, SpecPolicy, admit};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::backends::{
    Backend, addresses, admitted, loopback_addresses, sample_spec, serving_backend, tally, tcp_ask, tcp_ask_from,
    tcp_backend,
};
use crate::process::{Nginx, NginxBinary, nginx_binary, nginx_check, start_nginx};
use crate::support::fixtures::{backend, port};
use crate::support::ports::listen_port;
use crate::{BACKEND_IPS, STEP};

/// Answers each connection with its name and a newline, then holds it until the client closes.
async fn holding_backend(name: &str, ip: Ipv4Addr) -> Backend {
    serving_backend(name, ip, format!("{name}\n"), |mut stream, reply| async move {
        let _ = stream.write_all(reply.as_bytes()).await;
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest).await;
    })
    .await
}

/// A connection through nginx kept open: the backend's name, or `None` when nginx closed it
/// without one (no backend could take it).
pub(crate) async fn held(port: u16) -> (Option<String>, TcpStream) {
    let mut stream = timeout(STEP, TcpStream::connect(("127.0.0.1", port))).await.expect("in time").expect("connect");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while timeout(STEP, stream.read(&mut byte)).await.expect("an answer or a close in time").expect("read") == 1 {
        if byte[0] == b'\n' {
            return (Some(String::from_utf8_lossy(&line).into_owned()), stream);
        }
        line.push(byte[0]);
    }
    (None, stream)
}

/// A backend holding one long connection gets no new one while the other has fewer: least
/// connections, with the count shared by nginx's workers (round robin would alternate).
#[tokio::test]
async fn least_connections_sends_new_connections_to_the_less_loaded_backend() {
    let Some(bin) = nginx_binary() else { return };
    let backends = [holding_backend("v1", BACKEND_IPS[0]).await, holding_backend("v2", BACKEND_IPS[1]).await];
    let address = addresses(&backends);
    let spec = |p| {
        let mut spec = sample_spec(p);
        spec.backends = vec![backend("v1", 1), backend("v2", 1)];
        spec.algorithm = Some("LeastConnections".into());
        admitted(spec)
    };
    let (_nginx, listen) = start_nginx(&bin, |p| nginx::render("lb", &spec(p), &[], None, &address)).await;
    let (Some(busy), _long) = held(listen).await else { panic!("the long connection was not served") };
    let mut short = Vec::new();
    for _ in 0..10 {
        let (answer, stream) = held(listen).await;
        short.push(answer.expect("served"));
        drop(stream);
        // nginx counts the closed session out before the next one arrives.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    eprintln!("least connections: {busy} holds one connection; 10 short ones went to {short:?}");
    assert!(short.iter().all(|s| s != &busy), "{busy} holds a connection, yet took new ones: {short:?}");
}

/// A backup takes nothing while the primary answers, everything once it refuses, and no
/// connection fails on the way.
#[tokio::test]
async fn a_backup_takes_connections_only_when_the_others_refuse() {
    let Some(bin) = nginx_binary() else { return };
    let primary = tcp_backend("primary", BACKEND_IPS[0], "primary".into()).await;
    let spare = tcp_backend("spare", BACKEND_IPS[1], "spare".into()).await;
    let (primary_addr, spare_addr) = (primary.addr, spare.addr);
    let address = move |backend: &BackendSpec, _: &BalancerPort| match backend.name.as_str() {
        "primary" => Destination::Address(primary_addr),
        _ => Destination::Address(spare_addr),
    };
    let spec = |p| {
        let mut spec = sample_spec(p);
        spec.backends = vec![backend("primary", 1), backend("spare", 100)];
        spec.backends[1].backup = Some(true);
        admitted(spec)
    };
    let (_nginx, listen) = start_nginx(&bin, |p| nginx::render("lb", &spec(p), &[], None, &address)).await;
    let mut before = Vec::new();
    for _ in 0..20 {
        before.push(tcp_ask(listen).await);
    }
    assert_eq!(tally(before), BTreeMap::from([("primary".to_string(), 20)]), "the backup waits, whatever its weight");
    drop(primary);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut after = Vec::new();
    for _ in 0..20 {
        after.push(tcp_ask(listen).await);
    }
    assert_eq!(tally(after), BTreeMap::from([("spare".to_string(), 20)]), "every connection served by the backup");
}

/// `maxConnections: 2` holds across nginx's workers (the upstream's zone): of 6 connections
/// held open at once, 2 reach the backend and nginx closes the others.
#[tokio::test]
async fn max_connections_refuses_past_its_limit_across_workers() {
    let Some(bin) = nginx_binary() else { return };
    let backends = [holding_backend("v1", BACKEND_IPS[0]).await];
    let address = addresses(&backends);
    let spec = |p| {
        let mut spec = sample_spec(p);
        spec.backends = vec![backend("v1", 1)];
        spec.backends[0].max_connections = Some(2);
        admitted(spec)
    };
    let (nginx, listen) = start_nginx(&bin, |p| nginx::render("lb", &spec(p), &[], None, &address)).await;
    let mut streams = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..6 {
        let (answer, stream) = held(listen).await;
        answers.push(answer);
        streams.push(stream);
    }
    let served = answers.iter().flatten().count();
    eprintln!("maxConnections 2, {} workers, 6 connections held: {answers:?}", nginx.workers());
    assert_eq!(served, 2, "{answers:?}");
    assert_eq!(backends[0].served.load(Ordering::SeqCst), 2);
    drop(streams);
}

/// nginx as the backend, answering with the client address its PROXY protocol header carried.
async fn proxy_protocol_backend(bin: &NginxBinary) -> (Nginx, SocketAddr) {
    let ip = BACKEND_IPS[2];
    let mut failures = Vec::new();
    for _ in 0..3 {
        let addr = SocketAddr::from((ip, listen_port()));
        let conf = format!(
            "events {{}}\nstream {{\n    server {{\n        listen {addr} proxy_protocol;\n        \
             return \"$proxy_protocol_addr\\n\";\n    }}\n}}\n"
        );
        match Nginx::start(bin, &conf).await {
            Ok(nginx) => return (nginx, addr),
            Err(log) => failures.push(log),
        }
    }
    panic!("the PROXY protocol backend did not start: {failures:?}");
}

/// The client's address reaches the backend: from the connection itself, and from a PROXY
/// protocol header an outer load balancer sent (`acceptProxyProtocol`).
#[tokio::test]
async fn the_proxy_protocol_carries_the_clients_address_to_the_backend() {
    let Some(bin) = nginx_binary() else { return };
    let (_backend, backend_addr) = proxy_protocol_backend(&bin).await;
    let address = move |_: &BackendSpec, _: &BalancerPort| Destination::Address(backend_addr);
    let spec = |p, accept: bool| {
        let mut spec = sample_spec(p);
        spec.backends = vec![backend("v1", 1)];
        spec.ports[0].proxy_protocol = Some(true);
        spec.ports[0].accept_proxy_protocol = Some(accept);
        admitted(spec)
    };
    let (_nginx, listen) = start_nginx(&bin, |p| nginx::render("lb", &spec(p, false), &[], None, &address)).await;
    let client = Ipv4Addr::new(127, 0, 0, 9);
    assert_eq!(tcp_ask_from(client, listen).await, "127.0.0.9\n");

    let (_outer, listen) = start_nginx(&bin, |p| nginx::render("lb", &spec(p, true), &[], None, &address)).await;
    let answer = timeout(STEP, async {
        let mut stream = TcpStream::connect(("127.0.0.1", listen)).await.expect("connect");
        stream.write_all(b"PROXY TCP4 203.0.113.7 127.0.0.1 40000 80\r\n").await.expect("header");
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.expect("reply");
        reply
    })
    .await
    .expect("in time");
    assert_eq!(answer, "203.0.113.7\n", "the address the outer load balancer saw, passed on");
}

/// Mixes of the L4 settings: algorithm, affinity, backups, limits, PROXY protocol; backups
/// only where nginx takes them (the rules' tests cover the rest), so nearly all are admitted.
fn arb_l4_spec() -> impl proptest::strategy::Strategy<Value = BalancerSpec> {
    use proptest::prelude::*;
    let ports = proptest::collection::vec((any::<bool>(), any::<bool>(), any::<bool>()), 1..5);
    let backends = proptest::collection::vec((0i32..=100, any::<bool>(), proptest::option::of(1i32..=1_000_000)), 1..9);
    let algorithm = proptest::sample::select(<balancer::api::Algorithm as strum::VariantNames>::VARIANTS);
    (algorithm, any::<bool>(), ports, backends).prop_map(|(algorithm, client_ip, ports, backends)| {
        let mut spec = sample_spec(1000);
        spec.algorithm = Some(algorithm.to_string());
        spec.session_affinity = Some(if client_ip { "ClientIP" } else { "None" }.into());
        spec.ports = ports
            .into_iter()
            .enumerate()
            .map(|(i, (udp, send, accept))| {
                let mut port = port(Some(&format!("p{i}")), if udp { "UDP" } else { "TCP" }, 1000 + i as i32);
                port.proxy_protocol = Some(send && !udp);
                port.accept_proxy_protocol = Some(accept && !udp);
                port
            })
            .collect();
        spec.backends = backends
            .into_iter()
            .enumerate()
            .map(|(i, (weight, backup, limit))| {
                let mut backend = backend(&format!("b{i}"), weight);
                backend.backup = Some(backup && i > 0 && !client_ip && algorithm != "PowerOfTwoChoices");
                backend.max_connections = limit;
                backend
            })
            .collect();
        spec
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Every combination the rules admit, nginx accepts; what they refuse is what nginx would.
    #[test]
    fn nginx_t_accepts_every_admitted_mix_of_l4_settings(spec in arb_l4_spec()) {
        let Some(bin) = nginx_binary() else { return Ok(()) };
        match admit(ObjectName::Name("mix"), spec, &SpecPolicy::default()) {
            Ok(spec) => {
                let rendered = nginx::render("mix", &spec, &[], None, &loopback_addresses(&spec));
                if let Err(log) = nginx_check(&bin, &rendered) {
                    proptest::prop_assert!(false, "nginx -t rejected an admitted spec:\n{log}\n{rendered}");
                }
            }
            Err(report) => {
                // Only the combinations nginx refuses, or an all-zero weight sum.
                let known = ["sessionAffinity ClientIP", "sum of weights"];
                for error in &report.errors {
                    proptest::prop_assert!(known.iter().any(|k| error.to_string().contains(k)), "{error}");
                }
            }
        }
    }
}

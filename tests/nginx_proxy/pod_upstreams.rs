//! Pod upstreams: each backend's weight shared across its pods, whatever their counts, and a
//! dead pod costing a retry, not a failure.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;

use balancer::api::BackendSpec;
use balancer::proxy::model::{Destination, ProxyConfig, Targets};
use balancer::proxy::nginx;
use balancer::spec::{Admitted, AdmittedPort};

use crate::backends::{Backend, admitted, sample_spec, tally, tcp_ask, tcp_backend};
use crate::process::{nginx_binary, start_nginx};

/// `counts[i]` pods per backend of the sample (each answers with its backend's name), on their
/// own loopback addresses; and a server of the sample's spec whose backends are those pods.
async fn pod_backends(counts: &[usize]) -> Vec<Vec<Backend>> {
    let names = ["v1", "v2", "v3"];
    let mut backends = Vec::new();
    for (b, &count) in counts.iter().enumerate() {
        let mut pods = Vec::new();
        for i in 0..count {
            let ip = Ipv4Addr::new(127, 0, 1 + b as u8, 2 + i as u8);
            pods.push(tcp_backend(names[b], ip, names[b].to_string()).await);
        }
        backends.push(pods);
    }
    backends
}

/// nginx.conf of `spec` whose upstreams are `pods` (per backend, in the spec's order), with
/// `dead` added to the first backend's.
fn pod_upstream_conf(spec: &Admitted, pods: &[Vec<Backend>], dead: &[SocketAddr]) -> String {
    let position =
        |backend: &BackendSpec| spec.backends.iter().position(|b| b.name == backend.name).expect("a backend");
    let targets = |backend: &BackendSpec, _: AdmittedPort<'_>| {
        let i = position(backend);
        let mut addresses: Vec<SocketAddr> = pods[i].iter().map(|p| p.addr).collect();
        if i == 0 {
            addresses.extend(dead);
        }
        let service = format!("127.0.0.{}:1", 10 + i).parse().map(Destination::Address).expect("an address");
        Targets::Pods { service, pods: addresses }
    };
    nginx::write(&ProxyConfig::of("pods", spec, &[], None, &&targets))
}

/// 10,000 new connections split 40/20/40 within a point, whatever each backend's pod count:
/// one pod of v1 weighs what three of v2 do.
#[tokio::test]
async fn pod_upstreams_keep_the_split_across_unequal_pod_counts() {
    let Some(bin) = nginx_binary() else { return };
    let pods = pod_backends(&[1, 3, 2]).await;
    let (nginx, listen) = start_nginx(&bin, |p| pod_upstream_conf(&admitted(sample_spec(p)), &pods, &[])).await;
    let connections = 10_000;
    let mut replies = Vec::with_capacity(connections);
    for _ in 0..connections {
        replies.push(tcp_ask(listen).await);
    }
    let observed = tally(replies);
    eprintln!("40/20/40 over pods 1/3/2, {connections} connections, {} workers: {observed:?}", nginx.workers());
    for (backend, wanted) in [("v1", 40.0), ("v2", 20.0), ("v3", 40.0)] {
        let share = 100.0 * *observed.get(backend).unwrap_or(&0) as f64 / connections as f64;
        assert!(
            (share - wanted).abs() <= 1.0,
            "{backend}: {share:.2} % of connections, wanted {wanted} %: {observed:?}"
        );
    }
    let per_pod: Vec<usize> = pods[1].iter().map(|p| p.served.load(Ordering::SeqCst)).collect();
    assert!(per_pod.iter().all(|&n| n > 500), "v2's pods share its connections: {per_pod:?}");
}

/// A pod that refuses connections costs a retry on another pod, never a failed connection, and
/// passive health then leaves it out (per pod, not the whole backend).
#[tokio::test]
async fn a_dead_pod_costs_a_retry_not_a_failure() {
    let Some(bin) = nginx_binary() else { return };
    let pods = pod_backends(&[2, 1, 1]).await;
    // A port nothing listens on: bound, then closed.
    let dead = std::net::TcpListener::bind("127.0.1.9:0").expect("bind").local_addr().expect("addr");
    let (_nginx, listen) = start_nginx(&bin, |p| pod_upstream_conf(&admitted(sample_spec(p)), &pods, &[dead])).await;
    let connections = 1_000;
    let mut replies = Vec::with_capacity(connections);
    for _ in 0..connections {
        replies.push(tcp_ask(listen).await);
    }
    let observed = tally(replies);
    eprintln!("1,000 connections with a dead pod in v1: {observed:?}");
    assert_eq!(observed.values().sum::<usize>(), connections, "every connection answered");
    let v1_pods: Vec<usize> = pods[0].iter().map(|p| p.served.load(Ordering::SeqCst)).collect();
    assert!(v1_pods.iter().all(|&n| n > 100), "v1's live pods still serve: {v1_pods:?}");
    let v1 = 100.0 * *observed.get("v1").unwrap_or(&0) as f64 / connections as f64;
    // The dead pod's share (a third of v1's) goes to the others while it is marked failed.
    assert!(v1 > 20.0, "the backend is not skipped for one dead pod: v1 got {v1:.1} %");
}

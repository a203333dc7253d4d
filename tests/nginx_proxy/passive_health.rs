//! Passive health: a backend refusing connections is tried once per `failTimeout` with
//! `maxFails: 1`, and on every connection with `maxFails: 0`.

use balancer::api::{BackendSpec, BalancerPort};
use balancer::proxy::model::Destination;
use balancer::proxy::nginx;
use tokio::net::TcpListener;

use crate::BACKEND_IPS;
use crate::backends::{admitted, sample_spec, tcp_ask, tcp_backend};
use crate::process::{NginxBinary, nginx_binary, start_nginx};
use crate::support::fixtures::backend;

/// 100 connections to a Balancer whose heavier backend refuses every connection: each one is
/// answered by the live backend (nginx tries the next one), and nginx's log tells how often it
/// tried the dead one. Returns that count and the number of workers.
async fn refused_attempts(bin: &NginxBinary, max_fails: i32) -> (usize, usize) {
    let live = tcp_backend("live", BACKEND_IPS[0], "live".into()).await;
    // A port nothing listens on: connections to it are refused at once.
    let dead = TcpListener::bind((BACKEND_IPS[1], 0)).await.expect("bind").local_addr().expect("addr");
    let address = move |backend: &BackendSpec, _: &BalancerPort| match backend.name.as_str() {
        "live" => Destination::Address(live.addr),
        _ => Destination::Address(dead),
    };
    let spec = |p: u16| {
        let mut spec = sample_spec(p);
        spec.backends = vec![backend("dead", 90), backend("live", 10)];
        spec.backends[0].max_fails = Some(max_fails);
        spec.backends[0].fail_timeout = Some("30s".into());
        spec
    };
    let (nginx, listen) =
        start_nginx(bin, |p| nginx::render("example-balancer", &admitted(spec(p)), &[], None, &address)).await;
    for _ in 0..100 {
        assert_eq!(tcp_ask(listen).await, "live", "every connection is answered by the live backend");
    }
    let refused = nginx.prefix.log().matches("Connection refused").count();
    (refused, nginx.workers())
}

#[tokio::test]
async fn a_failing_backend_is_left_alone_for_fail_timeout_after_max_fails() {
    let Some(bin) = nginx_binary() else { return };
    let (with_passive_health, workers) = refused_attempts(&bin, 1).await;
    let (without, _) = refused_attempts(&bin, 0).await;
    eprintln!("refused attempts over 100 connections: maxFails 1: {with_passive_health}, maxFails 0: {without}");
    // maxFails 1: each worker tries the dead backend once, then leaves it alone for 30 s.
    assert!(with_passive_health <= workers, "{with_passive_health} refused attempts with {workers} workers");
    // maxFails 0: it is never marked failed, so most connections try it first (weight 90 of 100).
    assert!(without >= 50, "only {without} refused attempts with maxFails 0");
}

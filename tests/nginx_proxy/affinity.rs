//! `sessionAffinity: ClientIP`: one client address always reaches the same backend, and many
//! client addresses still split by weight.

use std::net::Ipv4Addr;

use balancer::proxy::nginx;

use crate::backends::{addresses, admitted, sample_spec, tally, tcp_ask_from, tcp_backends};
use crate::process::{nginx_binary, start_nginx};

#[tokio::test]
async fn client_ip_affinity_keeps_each_client_on_one_backend_and_splits_clients_by_weight() {
    let Some(bin) = nginx_binary() else { return };
    let backends = tcp_backends(&["v1", "v2", "v3"]).await;
    let address = addresses(&backends);
    let affine = |p: u16| {
        let mut spec = sample_spec(p);
        spec.session_affinity = Some("ClientIP".into());
        spec
    };
    let (_nginx, listen) =
        start_nginx(&bin, |p| nginx::render("example-balancer", &admitted(affine(p)), &[], None, &address)).await;

    // 240 clients (127.0.1.1 ... 127.0.2.120), 3 connections each.
    const CLIENTS: u16 = 240;
    let mut first_picks = Vec::new();
    for i in 0..CLIENTS {
        let client = Ipv4Addr::new(127, 0, 1 + (i / 120) as u8, 1 + (i % 120) as u8);
        let replies = [
            tcp_ask_from(client, listen).await,
            tcp_ask_from(client, listen).await,
            tcp_ask_from(client, listen).await,
        ];
        assert!(replies.iter().all(|r| r == &replies[0]), "client {client} moved between backends: {replies:?}");
        first_picks.push(replies[0].clone());
    }
    let observed = tally(first_picks);
    eprintln!("ClientIP affinity, 40/20/40, {CLIENTS} client addresses: {observed:?}");
    // Consistent hashing places each address by its hash, with points in proportion to the
    // weights: no exact split as round-robin has, but every backend's share near its weight.
    for (name, weight) in [("v1", 40.0), ("v2", 20.0), ("v3", 40.0)] {
        let share = 100.0 * observed.get(name).copied().unwrap_or(0) as f64 / f64::from(CLIENTS);
        assert!(
            (share - weight).abs() <= 12.0,
            "{name}: {share:.0}% of the clients for a weight of {weight}%: {observed:?}"
        );
    }
}

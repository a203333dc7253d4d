//! TCP: the original sample's 40/20/40 split over 500 connections, and a weight-0 (`down`)
//! backend that gets nothing.

use std::sync::atomic::Ordering;

use balancer::proxy::nginx;

use crate::backends::{REQUESTS, addresses, admitted, sample_spec, served, tally, tcp_ask, tcp_backends, weights};
use crate::process::{nginx_binary, start_nginx};
use crate::wrr::assert_split;

#[tokio::test]
async fn tcp_sample_splits_500_connections_40_20_40() {
    let Some(bin) = nginx_binary() else { return };
    let backends = tcp_backends(&["v1", "v2", "v3"]).await;
    let address = addresses(&backends);
    let (nginx, listen) =
        start_nginx(&bin, |p| nginx::render("example-balancer", &admitted(sample_spec(p)), &[], None, &address)).await;

    let mut replies = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        replies.push(tcp_ask(listen).await);
    }
    let observed = tally(replies);
    let workers = nginx.workers();
    eprintln!("40/20/40 over {REQUESTS} TCP connections, {workers} nginx workers: {observed:?}");

    assert_eq!(served(&backends), observed, "the backends served exactly what the client saw");
    assert_split(&observed, &[("v1", 200), ("v2", 100), ("v3", 200)], &weights(&sample_spec(listen)), workers);
}

#[tokio::test]
async fn tcp_weight_zero_backend_is_down_and_gets_nothing() {
    let Some(bin) = nginx_binary() else { return };
    let backends = tcp_backends(&["v1", "v2", "v3"]).await;
    let address = addresses(&backends);
    let spec = |p| {
        let mut spec = sample_spec(p);
        spec.backends[1].weight = Some(0);
        spec.backends[2].weight = Some(10);
        admitted(spec)
    };
    let (nginx, listen) = start_nginx(&bin, |p| {
        let rendered = nginx::render("example-balancer", &spec(p), &[], None, &address);
        assert!(rendered.contains(&format!("server {} down;", backends[1].addr)), "{rendered}");
        rendered
    })
    .await;

    let mut replies = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        replies.push(tcp_ask(listen).await);
    }
    let observed = tally(replies);
    let workers = nginx.workers();
    eprintln!("40/0/10 over {REQUESTS} TCP connections, {workers} nginx workers: {observed:?}");

    assert_eq!(backends[1].served.load(Ordering::SeqCst), 0, "the drained backend was never connected to");
    assert_eq!(served(&backends), observed);
    assert_split(&observed, &[("v1", 400), ("v3", 100)], &weights(&spec(listen)), workers);
}

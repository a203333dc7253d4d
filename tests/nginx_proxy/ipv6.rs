//! An IPv6 client, in a network namespace of the test's own.

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::process::Command;

use balancer::api::{BackendSpec, BalancerPort};
use balancer::proxy::model::Destination;
use balancer::proxy::nginx;

use crate::backends::{admitted, sample_spec, tally};
use crate::process::{Nginx, nginx_binary};
use crate::support::fixtures::backend;
use crate::support::ports::listen_port;

/// A network namespace of the test's own, with its loopback up (127.0.0.0/8 and ::1); deleted
/// on drop, also when the test fails.
struct Netns(String);

impl Netns {
    fn new() -> Netns {
        let name = format!("balancer-v6-{}", std::process::id());
        let run = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().expect("ip runs");
            assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        run(&["netns", "add", &name]);
        let netns = Netns(name);
        run(&["-n", &netns.0, "link", "set", "lo", "up"]);
        netns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The proxy listens on IPv6 too: a client in a namespace with IPv6 reaches it at [::1] and
/// is answered by IPv4 backends, by weight. Backends and clients are nginx and bash inside the
/// namespace, since the test's own sockets live outside it.
#[tokio::test]
async fn an_ipv6_client_is_served() {
    let Some(bin) = nginx_binary() else { return };
    if !is_root() {
        return unusable_without("root, for a network namespace");
    }
    let netns = Netns::new();
    let listen = listen_port();
    let backends = "events {}\nstream {\n    server { listen 127.0.0.2:9001; return \"v1\\n\"; }\n    \
                    server { listen 127.0.0.3:9001; return \"v2\\n\"; }\n}\n";
    let _backends = Nginx::start_in(Some(&netns.0), &bin, backends).await.expect("the backends start");
    let address = |backend: &BackendSpec, _: &BalancerPort| match backend.name.as_str() {
        "v1" => Destination::Address(SocketAddr::from(([127, 0, 0, 2], 9001))),
        _ => Destination::Address(SocketAddr::from(([127, 0, 0, 3], 9001))),
    };
    let mut spec = sample_spec(listen);
    spec.backends = vec![backend("v1", 3), backend("v2", 1)];
    let rendered = nginx::render("lb", &admitted(spec), &[], None, &address);
    assert!(rendered.contains(&format!("listen [::]:{listen};")), "{rendered}");
    let _proxy = Nginx::start_in(Some(&netns.0), &bin, &rendered).await.expect("the proxy starts");
    let ask = format!("exec 3<>/dev/tcp/::1/{listen} && head -n1 <&3");
    let mut answers = Vec::new();
    for _ in 0..8 {
        let out = Command::new("ip").args(["netns", "exec", &netns.0, "bash", "-c", &ask]).output().expect("bash runs");
        assert!(out.status.success(), "bash: {}", String::from_utf8_lossy(&out.stderr));
        answers.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    eprintln!("8 connections to [::1]:{listen}: {answers:?}");
    assert_eq!(tally(answers), BTreeMap::from([("v1".to_string(), 6), ("v2".to_string(), 2)]));
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn unusable_without(what: &str) {
    crate::support::skip(&format!("this test needs {what}"));
}

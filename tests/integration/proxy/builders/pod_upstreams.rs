//! Pod upstreams: each backend's weight and connection limit shared across its ready pods, and
//! the Services when asked, without live delivery, or past a ConfigMap's size.

use std::net::IpAddr;

use balancer::api::Protocol;
use balancer::api::v1beta1::ProxySpec;
use balancer::proxy::{self, PodPort, ProxySettings, ReadyPod};

use super::fixtures::{admitted, cluster_ips, owner, sample, settings, targets};
use crate::support::fixtures::port;

/// `count` ready pods of backend `b` (0, 1, 2), each with the sample's `http` port at 5678.
pub(super) fn ready_pods(b: u8, count: u8) -> Vec<ReadyPod> {
    let port = PodPort { name: "http".into(), protocol: Protocol::Tcp, port: 5678 };
    (0..count).map(|i| ReadyPod { address: IpAddr::from([10, 244, b, 10 + i]), ports: vec![port.clone()] }).collect()
}

fn live_settings() -> ProxySettings {
    ProxySettings { metrics_image: Some("localhost/balancer:dev".into()), ..settings() }
}

/// Each pod weighs its backend's weight over its pod count: 40/20/40 over 1/3/2 pods gives
/// 6/1/3 per pod (6, 3×1 and 2×3 make 40/20/40 of 20); a backend without a ready pod keeps its
/// Service, down.
#[test]
fn pod_upstreams_share_each_backends_weight_across_its_ready_pods() {
    let balancer = sample();
    let spec = admitted(&balancer, &live_settings());
    let pods = [ready_pods(0, 1), ready_pods(1, 3), ready_pods(2, 2)];
    let ips = cluster_ips(&spec);
    let built = proxy::proxy(&owner(&balancer), &spec, &live_settings(), &targets(&spec, &ips, Some(&pods)));
    assert!(built.pod_upstreams);
    let servers: Vec<&str> = built.nginx_conf.lines().map(str::trim).filter(|l| l.starts_with("server 10.")).collect();
    assert_eq!(
        servers,
        [
            "server 10.244.0.10:5678 weight=6 max_fails=1 fail_timeout=10s;  # example-balancer-v1-backend",
            "server 10.244.1.10:5678 weight=1 max_fails=1 fail_timeout=10s;  # example-balancer-v2-backend",
            "server 10.244.1.11:5678 weight=1 max_fails=1 fail_timeout=10s;  # example-balancer-v2-backend",
            "server 10.244.1.12:5678 weight=1 max_fails=1 fail_timeout=10s;  # example-balancer-v2-backend",
            "server 10.244.2.10:5678 weight=3 max_fails=1 fail_timeout=10s;  # example-balancer-v3-backend",
            "server 10.244.2.11:5678 weight=3 max_fails=1 fail_timeout=10s;  # example-balancer-v3-backend",
        ]
    );
    let without_v2 = [ready_pods(0, 1), vec![], ready_pods(2, 2)];
    let built = proxy::proxy(&owner(&balancer), &spec, &live_settings(), &targets(&spec, &ips, Some(&without_v2)));
    assert!(
        built.nginx_conf.contains("server 10.96.0.11:80 down;  # example-balancer-v2-backend"),
        "{}",
        built.nginx_conf
    );
    // A backend of weight 0 keeps its Service, down, whatever pods it has.
    let mut weightless = balancer.clone();
    weightless.spec.backends[1].weight = Some(0);
    let spec = admitted(&weightless, &live_settings());
    let built = proxy::proxy(&owner(&weightless), &spec, &live_settings(), &targets(&spec, &ips, Some(&pods)));
    assert!(
        built.nginx_conf.contains("server 10.96.0.11:80 down;  # example-balancer-v2-backend"),
        "{}",
        built.nginx_conf
    );
    assert!(!built.nginx_conf.contains("server 10.244.1."), "{}", built.nginx_conf);
}

/// Endpoints that share an address (distinct pods in the slices, a hostile slice) are one server
/// per address and port, however their slices' ports sort them: here the second pod's port
/// sorts between the first's and the third's, which are the same (found by the
/// `endpoint_slices` fuzz target's invariant; before, `10.244.0.5:5678` was listed twice and
/// took twice its share).
#[test]
fn endpoints_at_one_address_are_one_server_however_their_ports_sort() {
    let balancer = sample();
    let spec = admitted(&balancer, &live_settings());
    let at = |other: u16, http: u16| ReadyPod {
        address: IpAddr::from([10, 244, 0, 5]),
        ports: vec![
            PodPort { name: "a".into(), protocol: Protocol::Tcp, port: other },
            PodPort { name: "http".into(), protocol: Protocol::Tcp, port: http },
        ],
    };
    // In the order ReadyEndpointSlices::ready_pods gives them: by address, then ports.
    let pods = [vec![at(4, 5678), at(5, 5679), at(6, 5678)], ready_pods(1, 1), ready_pods(2, 1)];
    let built =
        proxy::proxy(&owner(&balancer), &spec, &live_settings(), &targets(&spec, &cluster_ips(&spec), Some(&pods)));
    let servers: Vec<&str> = built
        .nginx_conf
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("server 10.244.0."))
        .map(|l| l.split(' ').nth(1).unwrap_or_default())
        .collect();
    assert_eq!(servers, ["10.244.0.5:5678", "10.244.0.5:5679"], "{}", built.nginx_conf);
}

/// A pod that two backends select (the webhook warns that they share it) is a server of each,
/// with each backend's weight: it serves both shares, as it did behind both Services. (The
/// `endpoint_slices` fuzz target's first invariant, one server per address in an upstream, was
/// too strict for this; it is one per address and backend.)
#[test]
fn a_pod_two_backends_select_is_a_server_of_each() {
    let balancer = sample();
    let spec = admitted(&balancer, &live_settings());
    let shared = ready_pods(0, 1);
    let pods = [shared.clone(), shared, ready_pods(2, 1)];
    let built =
        proxy::proxy(&owner(&balancer), &spec, &live_settings(), &targets(&spec, &cluster_ips(&spec), Some(&pods)));
    let servers: Vec<&str> =
        built.nginx_conf.lines().map(str::trim).filter(|l| l.starts_with("server 10.244.")).collect();
    assert_eq!(
        servers,
        [
            "server 10.244.0.10:5678 weight=2 max_fails=1 fail_timeout=10s;  # example-balancer-v1-backend",
            "server 10.244.0.10:5678 weight=1 max_fails=1 fail_timeout=10s;  # example-balancer-v2-backend",
            "server 10.244.2.10:5678 weight=2 max_fails=1 fail_timeout=10s;  # example-balancer-v3-backend",
        ],
        "{}",
        built.nginx_conf
    );
}

/// The weights are exact (`weight × lcm(pods) / pods`) while that stays within 1,000 units per
/// pod, as it does for 1:3 over 29 and 31 pods (31 and 87, 3,596 units); with ClientIP affinity
/// nginx's hash holds 50 units per pod at most (3,000 here), so the same split is rounded into
/// it (26 and 73), each backend still within a point of its share.
#[test]
fn pod_weights_are_exact_within_the_methods_budget() {
    let weights = |affinity: Option<&str>| {
        let mut balancer = sample();
        balancer.spec.backends.truncate(2);
        (balancer.spec.backends[0].weight, balancer.spec.backends[1].weight) = (Some(1), Some(3));
        balancer.spec.session_affinity = affinity.map(Into::into);
        let spec = admitted(&balancer, &live_settings());
        let pods = [ready_pods(0, 29), ready_pods(1, 31)];
        let built =
            proxy::proxy(&owner(&balancer), &spec, &live_settings(), &targets(&spec, &cluster_ips(&spec), Some(&pods)));
        let weight_of = |pod: &str| {
            let line =
                built.nginx_conf.lines().find(|l| l.trim().starts_with(&format!("server {pod}:5678 "))).expect(pod);
            line.split("weight=").nth(1).and_then(|w| w.split(' ').next()).expect("a weight").to_string()
        };
        (weight_of("10.244.0.10"), weight_of("10.244.1.10"))
    };
    assert_eq!(weights(None), ("31".to_string(), "87".to_string()), "exact: 31 × 29 : 87 × 31 is 1 : 3");
    assert_eq!(weights(Some("ClientIP")), ("26".to_string(), "73".to_string()), "within the hash's budget");
}

/// `maxConnections` is shared across the backend's pods, at least 1 each; a port the pods do not
/// have (by the Service port's name and protocol) leaves the backend without a server there.
#[test]
fn pod_upstreams_share_the_connection_limit_and_match_ports_by_name() {
    let mut balancer = sample();
    balancer.spec.backends[0].max_connections = Some(100);
    balancer.spec.ports.push(port(Some("dns"), "UDP", 53));
    let spec = admitted(&balancer, &live_settings());
    let pods = [ready_pods(0, 3), ready_pods(1, 1), ready_pods(2, 1)];
    let ips = cluster_ips(&spec);
    let built = proxy::proxy(&owner(&balancer), &spec, &live_settings(), &targets(&spec, &ips, Some(&pods)));
    let conf = &built.nginx_conf;
    assert_eq!(conf.matches("max_conns=33;").count(), 3, "{conf}");
    // No pod has a `dns` port: every backend keeps its Service at 53, down.
    for (i, backend) in ["v1", "v2", "v3"].iter().enumerate() {
        let line = format!("server 10.96.0.{}:53 down;  # example-balancer-{backend}-backend", 10 + i);
        assert!(conf.contains(&line), "{line} in {conf}");
    }
}

/// `upstreams: Services`, or no metrics sidecar (every endpoint change would roll the pods), keep
/// the Services' cluster IPs whatever pods are ready.
#[test]
fn services_are_the_upstreams_when_asked_or_without_live_delivery() {
    let pods = [ready_pods(0, 1), ready_pods(1, 1), ready_pods(2, 1)];
    let mut balancer = sample();
    balancer.spec.proxy = Some(ProxySpec { upstreams: Some("Services".into()), ..ProxySpec::default() });
    let asked = admitted(&balancer, &live_settings());
    let ips = cluster_ips(&asked);
    for (spec, settings) in [(asked, live_settings()), (admitted(&sample(), &settings()), settings())] {
        let built = proxy::proxy(&owner(&balancer), &spec, &settings, &targets(&spec, &ips, Some(&pods)));
        assert!(!built.pod_upstreams);
        assert!(built.nginx_conf.contains("server 10.96.0.10:80 weight=40"), "{}", built.nginx_conf);
        assert!(!built.nginx_conf.contains("10.244."), "{}", built.nginx_conf);
    }
}

/// A configuration of more pods than a ConfigMap holds falls back to the Services.
#[test]
fn too_many_pods_for_a_config_map_fall_back_to_the_services() {
    let balancer = sample();
    let spec = admitted(&balancer, &live_settings());
    let port = PodPort { name: "http".into(), protocol: Protocol::Tcp, port: 5678 };
    let many: Vec<ReadyPod> = (0..6000)
        .map(|i| ReadyPod {
            address: IpAddr::from([10, (i / 65536) as u8, ((i / 256) % 256) as u8, (i % 256) as u8]),
            ports: vec![port.clone()],
        })
        .collect();
    let pods = [many.clone(), many.clone(), many];
    let ips = cluster_ips(&spec);
    let built = proxy::proxy(&owner(&balancer), &spec, &live_settings(), &targets(&spec, &ips, Some(&pods)));
    assert!(!built.pod_upstreams, "{} bytes", built.nginx_conf.len());
    assert!(built.nginx_conf.contains("server 10.96.0.10:80 weight=40"));
}

/// An offline preview (`balancer render`) reads no pods: it names each backend's Service, at
/// its weight, rather than render pod upstreams with every backend down for want of pods.
#[test]
fn an_offline_preview_of_pod_upstreams_names_the_services() {
    let balancer = sample();
    let spec = admitted(&balancer, &live_settings());
    let built = proxy::proxy(&owner(&balancer), &spec, &live_settings(), &proxy::BackendTarget::previews(&spec));
    assert!(!built.pod_upstreams);
    let upstream_server = |line: &&str| line.starts_with("server ") && !line.ends_with('{');
    let servers: Vec<&str> = built.nginx_conf.lines().map(str::trim).filter(upstream_server).collect();
    assert_eq!(servers.len(), 3, "{}", built.nginx_conf);
    for (server, (name, weight)) in servers.iter().zip([("v1", 40), ("v2", 20), ("v3", 40)]) {
        let service = format!("server example-balancer-{name}-backend.");
        assert!(server.starts_with(&service) && server.contains(&format!(":80 weight={weight} ")), "{server}");
    }
}

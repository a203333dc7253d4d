//! A Gateway's TLS listeners and the hostnames of the routes tenants attach to them, as they
//! become `nginx.conf`: each line of the input is a listener's hostname (`L<name>`, or `L`
//! for none) or a route's hostnames (`R<name>,<name>…`, attached to the last listener). Built
//! and rendered, never a panic; every key of every `map` is an escaped Gateway API hostname,
//! and the only other lines there are the map's own `hostnames;` and `default`.
#![no_main]

use balancer::api::formats::is_hostname;
use balancer::gateway::api::gateways::GatewayListeners;
use balancer::gateway::listeners::{AttachedRoute, proxy_listeners};
use balancer::proxy::model::{Destination, OwnerKind, ProxyConfig, Targets, WeightedBackend};
use balancer::proxy::nginx;
use libfuzzer_sys::fuzz_target;

fn listener(index: usize, hostname: &str) -> Option<GatewayListeners> {
    let mut listener = serde_json::json!({"name": format!("l{index}"), "port": 443, "protocol": "TLS"});
    if !hostname.is_empty() {
        listener["hostname"] = hostname.into();
    }
    serde_json::from_value(listener).ok()
}

fn route(index: usize, hostnames: &str) -> AttachedRoute {
    let address = Destination::Address(std::net::SocketAddr::from(([10, 0, 0, 1], 443)));
    let backend = WeightedBackend {
        name: format!("b{index}"),
        weight: 1,
        backup: false,
        max_fails: None,
        fail_timeout: None,
        max_connections: None,
        targets: Targets::Service(address),
    };
    AttachedRoute {
        created: None,
        namespace: "tenant".into(),
        name: format!("r{index}"),
        hostnames: hostnames.split(',').filter(|h| !h.is_empty()).map(str::to_string).collect(),
        backends: vec![backend],
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (mut listeners, mut routes): (Vec<GatewayListeners>, Vec<Vec<AttachedRoute>>) = (Vec::new(), Vec::new());
    for (index, line) in text.lines().take(64).enumerate() {
        match line.split_at_checked(1) {
            Some(("L", hostname)) => {
                if let Some(listener) = listener(index, hostname) {
                    listeners.push(listener);
                    routes.push(Vec::new());
                }
            }
            Some(("R", hostnames)) => {
                if let Some(last) = routes.last_mut() {
                    last.push(route(index, hostnames));
                }
            }
            _ => {}
        }
    }
    let built = proxy_listeners(&listeners, &routes);
    let config = ProxyConfig {
        kind: OwnerKind::Gateway,
        name: "fuzz".into(),
        load_modules: Vec::new(),
        drain_timeout: "1h".into(),
        access_log: None,
        listeners: built.listeners,
        canary_window: None,
    };
    let conf = nginx::write(&config);
    let mut in_map = false;
    for line in conf.lines().map(str::trim) {
        if line.starts_with("map ") {
            in_map = true;
        } else if in_map && line == "}" {
            in_map = false;
        } else if in_map && line != "hostnames;" && !line.starts_with("default ") {
            let key = line.split(' ').next().and_then(|key| key.strip_prefix('\\'));
            assert!(key.is_some_and(is_hostname), "an unescaped or invalid key: {line:?}\n{conf}");
        }
    }
    assert_eq!(conf.matches('{').count(), conf.matches('}').count(), "{conf}");
});

//! The controller as it starts, against a mock API server: one list and then one watch per
//! cache, each granted by the RBAC the controller declares. The backends' readiness comes from
//! `discovery.k8s.io/v1` EndpointSlices (not the deprecated `v1` Endpoints), and budgets from
//! `policy/v1`, with no discovery request first.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::http::Method;
use balancer::controller::{self, Clients, Options, Scope};
use balancer::manager::Metrics;
use balancer::proxy::ProxySettings;
use balancer::spec::SpecPolicy;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::mock_api::{self, MockApi, Received, ok};

const NS: &str = "ns";

/// What the controller lists and watches, as collection paths in namespace `ns`.
const WATCHED: [&str; 9] = [
    "/api/v1/namespaces/ns/configmaps",
    "/api/v1/namespaces/ns/serviceaccounts",
    "/api/v1/namespaces/ns/services",
    "/apis/apps/v1/namespaces/ns/deployments",
    SLICES,
    "/apis/exposer.hliangzhao.io/v1beta1/namespaces/ns/balancers",
    "/apis/policy/v1/namespaces/ns/poddisruptionbudgets",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/ns/rolebindings",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/ns/roles",
];

const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices";

/// balancer's backend and front Services' labels, which their slices carry, as a URL-encoded
/// selector.
const BACKEND_SELECTOR: &str = "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dbalancer%2Capp.kubernetes.io%2Fcomponent+in+%28backend%2Cfrontend%29";

/// The next `n` requests, each a granted GET, by path (in any order: the watches start at once).
async fn next_gets(server: &mut MockApi, n: usize) -> BTreeMap<String, Received> {
    let mut received = BTreeMap::new();
    for _ in 0..n {
        let request = server.next().await;
        assert_eq!(request.method, Method::GET, "{}", request.uri);
        mock_api::assert_granted(&request.method, &request.uri);
        let path = request.uri.split_once('?').map_or(request.uri.as_str(), |(path, _)| path).to_string();
        received.insert(path, request);
    }
    received
}

fn query(request: &Received) -> &str {
    request.uri.split_once('?').map_or("", |(_, query)| query)
}

#[tokio::test]
async fn the_controller_lists_then_watches_each_cache_endpoint_slices_included_and_nothing_else() {
    let (client, mut server) = mock_api::pair();
    let metrics = Metrics::default();
    let clients = Clients { direct: client.clone(), throttled: client, contact: metrics.contact.clone() };
    let proxy = ProxySettings {
        image: "nginx-test:1".into(),
        load_modules: Vec::new(),
        metrics_image: None,
        policy: SpecPolicy::default(),
        signer: None,
    };
    let options = Options { scope: Scope::Namespace(NS.into()), proxy, concurrency: 4, gateway_api: false };
    let (synced, stop) = (Arc::new(AtomicBool::new(false)), CancellationToken::new());
    let running =
        tokio::spawn(controller::run(clients, options, metrics.controller.clone(), synced.clone(), stop.clone()));

    // The lists come first, with no discovery request before them.
    let lists = next_gets(&mut server, WATCHED.len()).await;
    assert_eq!(lists.keys().map(String::as_str).collect::<Vec<_>>(), WATCHED);
    assert!(lists.values().all(|list| !query(list).contains("watch=true")), "lists first");
    let slices = query(&lists[SLICES]);
    assert!(slices.contains(BACKEND_SELECTOR), "only balancer's backend and front Services' slices: {slices}");
    server.assert_none_within(Duration::from_millis(200)).await;
    assert!(!synced.load(Ordering::Acquire));
    for (_, list) in lists {
        ok(
            list.respond,
            &json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": []}),
        );
    }

    // Then a watch of each, from the list's version; every cache has listed.
    let watches = next_gets(&mut server, WATCHED.len()).await;
    assert_eq!(watches.keys().map(String::as_str).collect::<Vec<_>>(), WATCHED);
    assert!(watches.values().all(|watch| query(watch).contains("watch=true")), "then watches");
    assert!(query(&watches[SLICES]).contains(BACKEND_SELECTOR));
    for _ in 0..100 {
        if synced.load(Ordering::Acquire) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(synced.load(Ordering::Acquire), "every cache has listed");

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), running).await.expect("the controller stops").unwrap();
    drop(watches);
}

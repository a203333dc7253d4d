//! The Gateway API scale benchmark: the operator's memory with N TCPRoutes against the real API
//! server.
//!
//! `cargo test --test e2e -- --ignored gateway_scale` (not part of the suite, not timed in CI).
//! It starts a fresh control plane (with a /16 of Service IPs), installs Gateway API's v1.7.0
//! standard CRDs (from `tests/kubernetes/gateway-api.sh`'s cache) and balancer's GatewayClass,
//! then the operator out of cluster as the token user bound to `deploy/rbac.yaml`, with a
//! metrics sidecar image as deploy/ sets one (so proxies send to the backends' pods, read from
//! their EndpointSlices, not to their Services), and waits until the class is `Accepted`. Once
//! the operator is idle it records its RSS, then creates, `BALANCER_GATEWAY_SCALE_BATCH` routes
//! (default 100) per `kubectl create`:
//! - `BALANCER_GATEWAY_SCALE_ROUTES` TCPRoutes (default 1000), one per listener (by
//!   `sectionName`) of Gateways of 50 TCP listeners (`tcp-<port>`) each, each route with two
//!   backendRefs (weights 70/30) to two Services of its own;
//! - those Services, without a selector (kube-controller-manager leaves their endpoints alone)
//!   and with one named port, and for each an EndpointSlice (managed by `balancer-benchmark`)
//!   of `BALANCER_GATEWAY_SCALE_ENDPOINTS` ready endpoints (default 10, in 172.16.0.0/12).
//!
//! It waits, up to `BALANCER_GATEWAY_SCALE_TIMEOUT` seconds (default 900), until every route has
//! balancer's `Accepted=True` and `ResolvedRefs=True` and every Gateway's proxy ConfigMap sends
//! each listener to exactly its route's endpoints (no proxy is ever `Programmed`: no kubelet
//! runs their pods), and prints how long that took, the operator's RSS idle, converged and at
//! its peak (VmHWM), the growth per route, and the objects made. Then it stops everything.
//!
//! Nothing carries `kubectl apply`'s last-applied annotation, which the operator would cache
//! with each Gateway and route. `BALANCER_E2E_BINARY` and `BALANCER_E2E_RBAC` measure another
//! build, as for `scale`; the same note on `--release` applies.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::net::Ipv4Addr;
use std::ops::Range;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use balancer::gateway::api::gatewayclasses::GatewayClass;
use balancer::gateway::api::tcproutes::TcpRoute;
use balancer::proxy::model::{MODEL_FILE, ProxyConfig};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::ListParams;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::gateway_api::install_gateway_api_crds;
use crate::operator::Operator;
use crate::scale::{count_listed, count_until_done, env_or, memory, took};
use crate::toolkit::cluster::{ControlPlane, PlaneOptions};
use crate::toolkit::kubectl::Kubectl;
use crate::toolkit::runner::eventually;
use crate::{NS, World, apply_shipped_rbac, as_list, install_shipped_crd};

const CONTROLLER: &str = "exposer.hliangzhao.io/balancer";

const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: balancer}\n\
                     spec: {controllerName: exposer.hliangzhao.io/balancer}\n";

/// Listeners, so routes, per Gateway.
const LISTENERS: usize = 50;
/// The Services' port, named `tcp`, and the endpoints' port of that name.
const SERVICE_PORT: u16 = 80;
const ENDPOINT_PORT: u16 = 8080;
/// Each route's two backends: the suffix of its Service's name, and its weight.
const BACKENDS: [(&str, u32); 2] = [("a", 70), ("b", 30)];

/// Route `i` and what it is made of.
fn route_name(i: usize) -> String {
    format!("route-{i:05}")
}

fn gateway_name(g: usize) -> String {
    format!("gw-{g:03}")
}

/// The port of route `i`'s listener, on Gateway `i / LISTENERS`.
fn port(i: usize) -> u16 {
    10_000 + (i % LISTENERS) as u16
}

fn service_name(i: usize, backend: usize) -> String {
    format!("{}-{}", route_name(i), BACKENDS[backend].0)
}

/// Endpoint `e` of backend `backend` of route `i`: distinct, in 172.16.0.0/12.
fn endpoint_ip(endpoints: usize, i: usize, backend: usize, e: usize) -> Ipv4Addr {
    let index = u32::try_from((2 * i + backend) * endpoints + e + 1).expect("fewer endpoints");
    assert!(index < 1 << 20, "more endpoints than 172.16.0.0/12 holds");
    Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 0)) + index)
}

/// What the proxy of route `i`'s Gateway must send its listener to: both backends' endpoints.
fn endpoint_addresses(endpoints: usize, i: usize) -> BTreeSet<String> {
    (0..BACKENDS.len())
        .flat_map(|b| (0..endpoints).map(move |e| format!("{}:{ENDPOINT_PORT}", endpoint_ip(endpoints, i, b, e))))
        .collect()
}

/// Gateway `g`, with a listener for each of the routes `g * LISTENERS..` below `routes`.
fn gateway(g: usize, routes: usize) -> Value {
    let listeners: Vec<Value> = (g * LISTENERS..routes.min((g + 1) * LISTENERS))
        .map(|i| json!({"name": format!("tcp-{}", port(i)), "port": port(i), "protocol": "TCP"}))
        .collect();
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
           "metadata": {"name": gateway_name(g), "namespace": NS},
           "spec": {"gatewayClassName": "balancer", "listeners": listeners}})
}

fn route(i: usize) -> Value {
    let backend_refs: Vec<Value> = (0..BACKENDS.len())
        .map(|b| json!({"name": service_name(i, b), "port": SERVICE_PORT, "weight": BACKENDS[b].1}))
        .collect();
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute",
           "metadata": {"name": route_name(i), "namespace": NS},
           "spec": {"parentRefs": [{"name": gateway_name(i / LISTENERS), "sectionName": format!("tcp-{}", port(i))}],
                    "rules": [{"backendRefs": backend_refs}]}})
}

/// Backend `b` of route `i`: its Service, without a selector, and its EndpointSlice.
fn backend(i: usize, b: usize, endpoints: usize) -> [Value; 2] {
    let name = service_name(i, b);
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
        "spec": {"ports": [{"name": "tcp", "port": SERVICE_PORT, "targetPort": ENDPOINT_PORT}]}});
    let ready: Vec<Value> = (0..endpoints)
        .map(|e| json!({"addresses": [endpoint_ip(endpoints, i, b, e).to_string()], "conditions": {"ready": true}}))
        .collect();
    let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-bench"), "namespace": NS,
                     "labels": {"kubernetes.io/service-name": name,
                                "endpointslice.kubernetes.io/managed-by": "balancer-benchmark"}},
        "addressType": "IPv4", "ports": [{"name": "tcp", "port": ENDPOINT_PORT, "protocol": "TCP"}],
        "endpoints": ready});
    [service, slice]
}

/// The objects of the routes `batch`: the Gateways that start there, then each route's
/// Services and EndpointSlices, then the route.
fn batch_objects(batch: Range<usize>, routes: usize, endpoints: usize) -> Vec<Value> {
    let gateways = batch.clone().filter(|i| i % LISTENERS == 0).map(|i| gateway(i / LISTENERS, routes));
    let backends = batch.clone().flat_map(|i| (0..BACKENDS.len()).flat_map(move |b| backend(i, b, endpoints)));
    gateways.chain(backends).chain(batch.map(route)).collect()
}

/// Runs the benchmark.
pub async fn run(assets: &Path) -> ExitCode {
    let routes: usize = env_or("BALANCER_GATEWAY_SCALE_ROUTES", 1000).max(1);
    let endpoints: usize = env_or("BALANCER_GATEWAY_SCALE_ENDPOINTS", 10).max(1);
    let batch: usize = env_or("BALANCER_GATEWAY_SCALE_BATCH", 100).max(1);
    let timeout = Duration::from_secs(env_or("BALANCER_GATEWAY_SCALE_TIMEOUT", 900));
    let gateways = routes.div_ceil(LISTENERS);

    // Two Services per route: a /16 of cluster IPs.
    let options = PlaneOptions { service_cidr: "10.0.0.0/16".into(), ..PlaneOptions::default() };
    let plane = ControlPlane::start_with(assets, &options).await;
    let admin = plane.client("admin").await;
    let mut world = World { plane, admin, operators: Vec::new() };
    install_shipped_crd(&world);
    apply_shipped_rbac(&world);
    // The operator asks at its start whether Gateway API is served.
    install_gateway_api_crds(&world).await;
    world.plane.kubectl("admin").apply(CLASS);
    let operator =
        Operator::start(&world.plane, "operator-gateway-scale", &["--proxy-metrics-image=balancer:bench"]).await;
    operator.wait_for_log(&world.plane, "Gateway API is on").await;
    let pid = operator.process.child.id();
    world.operators.push(operator);
    let classes: Api<GatewayClass> = Api::all(world.admin.clone());
    eventually("balancer's GatewayClass Accepted", Duration::from_secs(60), || async {
        let conditions = classes.get("balancer").await.ok()?.status?.conditions?;
        conditions.iter().any(|c| c.type_ == "Accepted" && c.status == "True").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (idle, _) = memory(pid);
    println!(
        "gateway_scale: {routes} TCPRoutes on {gateways} Gateways, {endpoints} endpoints per backend, {batch} routes per batch"
    );

    let started = Instant::now();
    let creates = create_in_batches(world.plane.kubectl("admin"), routes, endpoints, batch, started);
    let converged = wait_converged(&world.admin, routes, endpoints, started, timeout);
    let ((created_in, failed_batches), converged_in) = tokio::join!(creates, converged);
    let (rss, peak) = memory(pid);
    let made = format!(
        "{} ConfigMaps, {} Deployments, {} Services",
        made_by_the_operator::<ConfigMap>(&world.admin).await,
        made_by_the_operator::<Deployment>(&world.admin).await,
        made_by_the_operator::<Service>(&world.admin).await
    );

    let per_route = |mib: f64| format!("{:.1} KiB", (mib - idle) * 1024.0 / routes as f64);
    println!("gateway_scale: ---- {routes} TCPRoutes ----");
    println!(
        "gateway_scale: made: {gateways} Gateways, {routes} TCPRoutes, {} Services (no selector), {} EndpointSlices of \
         {endpoints} ready endpoints ({} endpoints); {failed_batches} batches failed",
        2 * routes,
        2 * routes,
        2 * routes * endpoints
    );
    println!("gateway_scale: the operator made: {made}");
    println!("gateway_scale: kubectl create of all batches     {:.1} s", created_in.as_secs_f64());
    println!("gateway_scale: first create -> all converged      {}", took(converged_in, timeout));
    println!("gateway_scale: operator RSS idle (baseline)       {idle:.1} MiB");
    println!("gateway_scale: operator RSS when converged        {rss:.1} MiB (peak {peak:.1} MiB)");
    println!(
        "gateway_scale: per route, over the baseline        {} when converged, {} at the peak",
        per_route(rss),
        per_route(peak)
    );
    if converged_in.is_none() {
        crate::diagnose(&world);
    }
    world.stop();
    if converged_in.is_some() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// `kubectl create` of every route's objects, `batch` routes per call; how long it took and how
/// many calls failed.
async fn create_in_batches(
    kubectl: Kubectl,
    routes: usize,
    endpoints: usize,
    batch: usize,
    started: Instant,
) -> (Duration, usize) {
    tokio::task::spawn_blocking(move || {
        let mut failed = 0;
        for (n, first) in (0..routes).step_by(batch).enumerate() {
            let list = as_list(batch_objects(first..routes.min(first + batch), routes, endpoints));
            let t = Instant::now();
            let (ok, _, err) = kubectl.run(&["create", "-f", "-"], Some(&list));
            if !ok {
                failed += 1;
                println!("gateway_scale: kubectl create: {}", err.lines().take(3).collect::<Vec<_>>().join(" | "));
            }
            println!(
                "gateway_scale: batch {} created in {:.1} s (at {:.1} s){}",
                n + 1,
                t.elapsed().as_secs_f64(),
                started.elapsed().as_secs_f64(),
                if ok { "" } else { " with errors" }
            );
        }
        (started.elapsed(), failed)
    })
    .await
    .expect("the create task")
}

/// Waits until every route is `Accepted` with its references resolved by balancer, and every
/// Gateway's proxy sends each listener to its route's endpoints; `None` past `timeout`.
async fn wait_converged(
    admin: &Client,
    routes: usize,
    endpoints: usize,
    started: Instant,
    timeout: Duration,
) -> Option<Duration> {
    let tcp_routes: Api<TcpRoute> = Api::namespaced(admin.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    // From the API server's watch cache.
    let cached = ListParams::default().match_any();
    let what = "TCPRoutes Accepted with ResolvedRefs";
    count_until_done(routes, what, started, timeout, Duration::from_secs(2), || async {
        let accepted = count_listed(&tcp_routes, &cached, accepted_and_resolved).await?;
        let done = accepted >= routes && proxies_send_to_endpoints(&config_maps, routes, endpoints).await;
        Some((accepted, done))
    })
    .await
}

/// Whether balancer's entry in the route's `status.parents` says `Accepted` and `ResolvedRefs`.
fn accepted_and_resolved(route: &TcpRoute) -> bool {
    let mut parents = route.status.iter().flat_map(|s| &s.parents).filter(|p| p.controller_name == CONTROLLER);
    let holds =
        |conditions: &[Condition], type_: &str| conditions.iter().any(|c| c.type_ == type_ && c.status == "True");
    parents.any(|p| holds(&p.conditions, "Accepted") && holds(&p.conditions, "ResolvedRefs"))
}

/// Whether every route's listener, in its Gateway's proxy ConfigMap (`proxy.json`), has for
/// servers exactly the endpoints of the route's two EndpointSlices (not the Services' cluster IPs).
async fn proxies_send_to_endpoints(config_maps: &Api<ConfigMap>, routes: usize, endpoints: usize) -> bool {
    let Ok(listed) = config_maps.list(&ListParams::default().match_any()).await else { return false };
    let models: HashMap<String, ProxyConfig> = listed
        .items
        .into_iter()
        .filter_map(|map| {
            let model = serde_json::from_str(map.data?.get(MODEL_FILE)?).ok()?;
            Some((map.metadata.name?, model))
        })
        .collect();
    (0..routes).all(|i| {
        let name = format!("{}-balancer-proxy-configmap", gateway_name(i / LISTENERS));
        let listener = models.get(&name).and_then(|model| model.listeners.iter().find(|l| l.port == port(i)));
        listener.is_some_and(|l| {
            l.servers.iter().map(|s| s.address.clone()).collect::<BTreeSet<_>>() == endpoint_addresses(endpoints, i)
        })
    })
}

/// How many objects of kind `K` the operator made (with balancer's `managed-by` label).
async fn made_by_the_operator<K>(admin: &Client) -> String
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let lp = ListParams::default().labels("app.kubernetes.io/managed-by=balancer").match_any();
    match Api::<K>::namespaced(admin.clone(), NS).list_metadata(&lp).await {
        Ok(listed) => listed.items.len().to_string(),
        Err(e) => format!("? ({e})"),
    }
}

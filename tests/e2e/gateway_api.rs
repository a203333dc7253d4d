//! Gateway API's standard-channel CRDs (v1.7.0, from the Go module proxy) on the real API
//! server: discovery then says Gateway API is served, and the objects a user writes (a
//! GatewayClass, a Gateway, a route of each kind, a ReferenceGrant) read back through
//! balancer's generated types with the defaults the API server fills in.

use std::time::Duration;

use balancer::gateway::api::gatewayclasses::GatewayClass;
use balancer::gateway::api::gateways::{Gateway, GatewayListenersAllowedRoutesNamespacesFrom};
use balancer::gateway::api::referencegrants::ReferenceGrant;
use balancer::gateway::api::tcproutes::TcpRoute;
use balancer::gateway::api::tlsroutes::TlsRoute;
use balancer::gateway::api::udproutes::UdpRoute;
use balancer::gateway::{GatewayApi, discover};
use kube::Api;

use crate::toolkit::repo::repo;
use crate::toolkit::runner::eventually;
use crate::{NS, World};

const OBJECTS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: balancer}
spec: {controllerName: exposer.hliangzhao.io/balancer}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: default}
spec:
  gatewayClassName: balancer
  listeners:
  - {name: pg, port: 5432, protocol: TCP}
  - {name: dns, port: 53, protocol: UDP}
  - {name: tls, port: 443, protocol: TLS, hostname: "*.example.com", tls: {mode: Passthrough}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {name: pg, namespace: default}
spec:
  parentRefs: [{name: edge, sectionName: pg}]
  rules: [{backendRefs: [{name: pg-v1, port: 5432, weight: 90}, {name: pg-v2, port: 5432, weight: 10}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: UDPRoute
metadata: {name: dns, namespace: default}
spec:
  parentRefs: [{name: edge, port: 53}]
  rules: [{backendRefs: [{name: coredns, namespace: kube-system, port: 53}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: db, namespace: default}
spec:
  parentRefs: [{name: edge, sectionName: tls}]
  hostnames: [db.example.com]
  rules: [{backendRefs: [{name: db, port: 8443}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: dns-from-default, namespace: kube-system}
spec:
  from: [{group: gateway.networking.k8s.io, kind: UDPRoute, namespace: default}]
  to: [{group: "", kind: Service, name: coredns}]
"#;

pub(crate) async fn gateway_api_objects_read_through_the_generated_types(world: &mut World) {
    install_gateway_api_crds(world).await;
    let kubectl = world.plane.kubectl("admin");
    kubectl.apply(OBJECTS);

    let class = Api::<GatewayClass>::all(world.admin.clone()).get("balancer").await.expect("the GatewayClass");
    assert_eq!(class.spec.controller_name, "exposer.hliangzhao.io/balancer");
    let gateway = Api::<Gateway>::namespaced(world.admin.clone(), NS).get("edge").await.expect("the Gateway");
    let listeners = &gateway.spec.listeners;
    assert_eq!(
        listeners.iter().map(|l| (l.name.as_str(), l.port)).collect::<Vec<_>>(),
        [("pg", 5432), ("dns", 53), ("tls", 443)]
    );
    // The API server's defaults: routes from the Gateway's own namespace.
    let from = listeners[0].allowed_routes.as_ref().and_then(|a| a.namespaces.as_ref()).and_then(|n| n.from.clone());
    assert_eq!(from, Some(GatewayListenersAllowedRoutesNamespacesFrom::Same), "{gateway:?}");
    let tcp = Api::<TcpRoute>::namespaced(world.admin.clone(), NS).get("pg").await.expect("the TCPRoute");
    let weights: Vec<Option<i32>> = tcp.spec.rules[0].backend_refs.iter().map(|b| b.weight).collect();
    assert_eq!(weights, [Some(90), Some(10)]);
    let udp = Api::<UdpRoute>::namespaced(world.admin.clone(), NS).get("dns").await.expect("the UDPRoute");
    assert_eq!(udp.spec.parent_refs.as_ref().and_then(|p| p[0].port), Some(53));
    let tls = Api::<TlsRoute>::namespaced(world.admin.clone(), NS).get("db").await.expect("the TLSRoute");
    assert_eq!(tls.spec.hostnames, ["db.example.com"]);
    let grant = Api::<ReferenceGrant>::namespaced(world.admin.clone(), "kube-system").get("dns-from-default").await;
    assert_eq!(grant.expect("the ReferenceGrant").spec.from[0].kind, "UDPRoute");
}

/// Installs the standard-channel CRDs from `tests/kubernetes/gateway-api.sh`'s cache, and waits
/// until they are Established and discovery says Gateway API is served (an operator started
/// after that serves it).
pub(crate) async fn install_gateway_api_crds(world: &World) {
    let out =
        std::process::Command::new("bash").arg(repo("tests/kubernetes/gateway-api.sh")).output().expect("bash runs");
    assert!(out.status.success(), "gateway-api.sh: {}", String::from_utf8_lossy(&out.stderr));
    let crds = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let kubectl = world.plane.kubectl("admin");
    kubectl.ok(&["apply", "--server-side", "-f", &crds]);
    let names: Vec<String> =
        balancer::gateway::RESOURCES.iter().map(|r| format!("crd/{r}.gateway.networking.k8s.io")).collect();
    let mut wait = vec!["wait", "--for=condition=Established", "--timeout=60s"];
    wait.extend(names.iter().map(String::as_str));
    kubectl.ok(&wait);
    eventually("discovery to serve Gateway API", Duration::from_secs(30), || async {
        (discover(&world.admin).await == GatewayApi::Served).then_some(())
    })
    .await;
}

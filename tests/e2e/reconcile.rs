//! Reconcile: Balancers become their children and a status; backends' ready endpoints, a
//! namesake, a dropped port, and the exposure by node ports and a load balancer.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::toolkit::runner::eventually;
use crate::toolkit::wait::{self, balancer_until};
use crate::{NS, SAMPLE, World, apply, balancer_yaml, balancers, ready_condition, run_proxy_pods};

pub(crate) async fn balancers_are_reconciled_into_children_and_status(world: &mut World) {
    let world: &World = world;
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(world.admin.clone(), NS);
    let deployments: Api<Deployment> = Api::namespaced(world.admin.clone(), NS);
    let uid = balancers(world).get(SAMPLE).await.unwrap().uid().unwrap();

    let names = ["example-balancer-v1-backend", "example-balancer-v2-backend", "example-balancer-v3-backend", SAMPLE];
    for name in names {
        let service = eventually(&format!("Service {name}"), Duration::from_secs(30), || async {
            services.get_opt(name).await.ok().flatten()
        })
        .await;
        let owner = &service.owner_references()[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller, owner.block_owner_deletion),
            (uid.as_str(), Some(true), Some(true))
        );
    }
    let config = eventually("the ConfigMap", Duration::from_secs(30), || async {
        config_maps.get_opt("example-balancer-proxy-configmap").await.ok().flatten()
    })
    .await;
    let conf = config.data.unwrap()["nginx.conf"].clone();
    let v2 = services.get("example-balancer-v2-backend").await.expect("v2 backend Service");
    let v2_ip = v2.spec.and_then(|s| s.cluster_ip).expect("a cluster IP");
    let v2_line = format!("server {v2_ip}:80 weight=20 max_fails=1 fail_timeout=10s;  # example-balancer-v2-backend");
    assert!(conf.contains(&v2_line), "{conf}");
    eventually("the Deployment", Duration::from_secs(30), || async {
        deployments.get_opt("example-balancer-proxy").await.ok().flatten()
    })
    .await;

    let status_reached = |want_ready: &'static str| {
        let api = balancers(world);
        move || {
            let api = api.clone();
            async move {
                let b = api.get(SAMPLE).await.ok()?;
                let s = b.status.as_ref()?;
                let (status, _) = ready_condition(&b)?;
                (s.active_backends == 3 && s.observed_generation == b.metadata.generation && status == want_ready)
                    .then_some(b)
            }
        }
    };
    let waiting = eventually("status active=3, Ready=False", Duration::from_secs(30), status_reached("False")).await;
    assert_eq!(ready_condition(&waiting).unwrap().1, "ProxyNotAvailable");
    if world.plane.has_controller_manager() {
        // With pods "running", the Deployment becomes available and the Balancer Ready.
        let api = balancers(world);
        eventually("Ready=True", Duration::from_secs(60), || {
            let api = api.clone();
            async move {
                run_proxy_pods(world, SAMPLE).await;
                let b = api.get(SAMPLE).await.ok()?;
                (ready_condition(&b)?.0 == "True").then_some(())
            }
        })
        .await;
    }
    // Every line of a reconcile names its Balancer (the guide's "Reading a reconcile's log").
    let span =
        format!("reconcile{{namespace=\"{NS}\" name=\"{SAMPLE}\"}}: balancer::controller::reconcile: reconciled");
    let log = world.operators.iter().map(|op| op.log(&world.plane)).collect::<String>();
    assert!(log.contains(&span), "no {span:?} in the operators' log:\n{log}");
    // This API server has no Gateway API CRDs: the operator says it runs without them.
    assert!(log.contains("Gateway API is off"), "the operators' log does not say Gateway API is off:\n{log}");
    let (ok, out, err) = world.plane.kubectl("admin").run(&["get", "bal", SAMPLE], None);
    // Printer columns: a `[*]` path shows only its first value (v1, not v1,v2,v3).
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    // v1beta1's columns: Active, Ready-Replicas and Obsolete only with `-o wide` (priority 1); the
    // canary's three are blank without a canary.
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    let columns = ["NAME", "PORTS", "BACKENDS", "ADDRESS", "READY", "BACKENDS-READY", "REPLICAS"];
    assert_eq!(header, [&columns[..], &["CANARY", "STEP", "CANARY-WEIGHT", "AGE"]].concat(), "{out}");
    let ready = if world.plane.has_controller_manager() { "True" } else { "False" };
    let front = Api::<Service>::namespaced(world.admin.clone(), NS).get(SAMPLE).await.expect("the front Service");
    let cluster_ip = front.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
    assert!(
        ok && row.len() == 8 && row[..7] == [SAMPLE, "80", "v1", cluster_ip.as_str(), ready, "0/3", "1"],
        "printer columns: {out}{err}"
    );

    // Events were recorded on the Balancer: one for the six children, one for Ready.
    let events: Api<Event> = Api::namespaced(world.admin.clone(), NS);
    let recorded = eventually("the Created event", Duration::from_secs(10), || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let mine: Vec<Event> = list
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str()))
            .collect();
        mine.iter().any(|e| e.reason.as_deref() == Some("Created")).then_some(mine)
    })
    .await;
    assert!(recorded.iter().all(|e| e.reporting_controller.as_deref() == Some("balancer")));
    let created: Vec<&Event> = recorded.iter().filter(|e| e.reason.as_deref() == Some("Created")).collect();
    assert_eq!(created.len(), 1, "one Created event for all children: {created:#?}");
    let warned = recorded.iter().any(|e| e.reason.as_deref() == Some("ProxyNotAvailable"));
    assert!(!warned, "a new Balancer's first rollout is no warning: {recorded:#?}");
    let note = created[0].note.as_deref().unwrap_or_default();
    for child in [
        "Service example-balancer-v1-backend",
        "ConfigMap example-balancer-proxy-configmap",
        "Deployment example-balancer-proxy",
    ] {
        assert!(note.contains(child), "{child} missing from {note}");
    }

    // Removing a backend deletes its Service and updates nginx.conf and the status.
    let patch = json!({"spec": {"backends": [
            {"name": "v1", "weight": 40, "selector": {"version": "v1"}},
            {"name": "v3", "weight": 40, "selector": {"version": "v3"}}]}});
    balancers(world).patch(SAMPLE, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    // Only once the proxy has rolled out (the test plays the kubelet for the new pod).
    eventually("v2's Service to go", Duration::from_secs(30), || async {
        if world.plane.has_controller_manager() {
            run_proxy_pods(world, SAMPLE).await;
        }
        services.get_opt("example-balancer-v2-backend").await.ok()?.is_none().then_some(())
    })
    .await;
    eventually("nginx.conf without v2", Duration::from_secs(30), || async {
        let cm = config_maps.get("example-balancer-proxy-configmap").await.ok()?;
        (!cm.data?["nginx.conf"].contains("v2-backend")).then_some(())
    })
    .await;
    let api = balancers(world);
    eventually("status active=2", Duration::from_secs(30), || {
        let api = api.clone();
        async move {
            let b = api.get(SAMPLE).await.ok()?;
            let s = b.status?;
            (s.active_backends == 2 && s.obsolete_backends == 0 && s.observed_generation == b.metadata.generation)
                .then_some(())
        }
    })
    .await;

    // A deleted child comes back; so does a hand-edited ConfigMap.
    services.delete(SAMPLE, &DeleteParams::default()).await.unwrap();
    eventually("the front Service restored", Duration::from_secs(30), || async {
        services.get_opt(SAMPLE).await.ok().flatten().filter(|s| s.metadata.deletion_timestamp.is_none())
    })
    .await;
    let edit = json!({"data": {"nginx.conf": "events {}\n"}});
    config_maps.patch("example-balancer-proxy-configmap", &PatchParams::default(), &Patch::Merge(edit)).await.unwrap();
    eventually("the ConfigMap restored", Duration::from_secs(30), || async {
        let cm = config_maps.get("example-balancer-proxy-configmap").await.ok()?;
        cm.data?["nginx.conf"].contains("upstream port_80_tcp").then_some(())
    })
    .await;
}

/// A backend pod, bound and "running" as a kubelet would report it (the test plays the kubelet).
async fn run_backend_pod(world: &World, name: &str, labels: Value, ip: &str) {
    register_the_e2e_node(world).await;
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": "e2e-node", "automountServiceAccountToken": false,
                 "containers": [{"name": "app", "image": "app:e2e"}]}});
    pods.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.expect("a backend pod");
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let ready = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    let status = json!({"status": {"phase": "Running", "podIP": ip, "startTime": now,
        "conditions": [ready("Initialized"), ready("Ready"), ready("ContainersReady"), ready("PodScheduled")]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await.expect("the pod's status");
}

/// The Node object the test's pods are bound to. The EndpointSlice controller leaves out the
/// pods of a node it does not know (the old endpoints controller did not look).
async fn register_the_e2e_node(world: &World) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(world.admin.clone());
    if nodes.get_opt("e2e-node").await.expect("read the e2e node").is_none() {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "e2e-node"}});
        nodes.create(&PostParams::default(), &serde_json::from_value(node).unwrap()).await.expect("the e2e node");
    }
}

/// `status.backends` follows the backend Services' EndpointSlices, which the real
/// EndpointSlice controller writes: one pod per backend, then one backend's pod gone.
pub(crate) async fn each_backends_ready_endpoints_are_in_the_status(world: &mut World) {
    let world: &World = world;
    if !world.plane.has_controller_manager() {
        println!("e2e: no kube-controller-manager: no EndpointSlices to follow");
        return;
    }
    let name = "seen";
    let spec = "spec:\n  ports: [{port: 80}]\n  selector: {app: seen}\n  backends:\n\
                \x20   - {name: v1, weight: 40, selector: {version: v1}}\n\
                \x20   - {name: v2, weight: 20, selector: {version: v2}}\n\
                \x20   - {name: v3, weight: 40, selector: {version: v3}}\n";
    let (ok, out) = apply(world, "admin", &balancer_yaml(name, spec));
    assert!(ok, "{out}");
    for (i, version) in ["v1", "v2", "v3"].iter().enumerate() {
        let pod = format!("seen-{version}");
        run_backend_pod(world, &pod, json!({"app": "seen", "version": version}), &format!("10.244.9.{}", i + 1)).await;
    }
    let api = balancers(world);
    let seen = |what: &'static str, timeout: u64, ready: [i32; 3], shares: [i32; 3], available: &'static str| {
        let condition = wait::backends_show(&ready, &shares, available);
        let api = api.clone();
        async move {
            let balancer = balancer_until(&api, name, what, Duration::from_secs(timeout), condition).await;
            balancer.status.expect("a status")
        }
    };
    let status = seen("3 backends, 1 ready endpoint each", 30, [1, 1, 1], [40, 20, 40], "True").await;
    assert_eq!(status.backends_ready.as_deref(), Some("3/3"));
    let (ok, out, err) = world.plane.kubectl("admin").run(&["get", "bal", name, "-o", "wide"], None);
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert!(ok && header.contains(&"BACKENDS-READY") && header.contains(&"BACKENDS-AVAILABLE"), "{out}{err}");
    assert!(row.contains(&"3/3") && row.contains(&"True"), "{out}");

    // v2's pod goes: its endpoint leaves, and its share goes to the others.
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    pods.delete("seen-v2", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() }).await.unwrap();
    let started = Instant::now();
    let status = seen("v2 without endpoints", 15, [1, 0, 1], [50, 0, 50], "False").await;
    println!("e2e: v2's lost endpoint in the status after {:?}", started.elapsed());
    assert_eq!(status.backends_ready.as_deref(), Some("2/3"));
    let condition = status.conditions.iter().find(|c| c.type_ == "BackendsAvailable").unwrap();
    assert_eq!(condition.reason, "NoReadyEndpoints");
    assert!(condition.message.contains("v2") && !condition.message.contains("v1"), "{}", condition.message);

    run_backend_pod(world, "seen-v2", json!({"app": "seen", "version": "v2"}), "10.244.9.2").await;
    seen("v2 back", 15, [1, 1, 1], [40, 20, 40], "True").await;
    balancers(world).delete(name, &DeleteParams::default()).await.unwrap();
    for version in ["v1", "v2", "v3"] {
        let _ = pods.delete(&format!("seen-{version}"), &DeleteParams::default()).await;
    }
}

/// A name taken by a hand-made object: the create-only apply is refused by the real API server,
/// and the Balancer reports the conflict instead of adopting the object.
pub(crate) async fn a_namesake_is_never_adopted(world: &mut World) {
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    let mine = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "taken-a-backend", "namespace": NS},
        "spec": {"selector": {"app": "mine"}, "ports": [{"port": 8080}]}});
    services.create(&PostParams::default(), &serde_json::from_value(mine).unwrap()).await.unwrap();
    let (ok, out) = apply(
        world,
        "admin",
        &balancer_yaml("taken", "spec:\n  ports: [{port: 80}]\n  backends: [{name: a, selector: {app: a}}]\n"),
    );
    assert!(ok, "{out}");
    let api = balancers(world);
    let message = eventually("Ready=False Conflict", Duration::from_secs(30), || {
        let api = api.clone();
        async move {
            let b = api.get("taken").await.ok()?;
            let c = b.status?.conditions.into_iter().find(|c| c.type_ == "Ready")?;
            (c.reason == "Conflict").then_some(c.message)
        }
    })
    .await;
    assert!(message.contains("Service taken-a-backend already exists"), "{message}");
    let untouched = services.get("taken-a-backend").await.unwrap();
    assert!(untouched.owner_references().is_empty(), "adopted: {:?}", untouched.metadata);
    assert_eq!(untouched.spec.unwrap().selector, Some([("app".to_string(), "mine".to_string())].into()));
    api.delete("taken", &DeleteParams::default()).await.unwrap();
    services.delete("taken-a-backend", &DeleteParams::default()).await.unwrap();
}

/// Children are created with a POST, whose fields the API server records under an `Update`
/// entry; a field the Balancer later drops must still leave every child (the operator folds
/// that entry into its apply's before the first apply).
pub(crate) async fn a_dropped_port_leaves_every_child(world: &mut World) {
    let two_ports = "spec:\n  ports: [{name: http, port: 80}, {name: alt, port: 8080}]\n  \
                     backends: [{name: a, selector: {app: a}}]\n";
    let (ok, out) = apply(world, "admin", &balancer_yaml("dropped", two_ports));
    assert!(ok, "{out}");
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    let ports = |name: &'static str| {
        let services = services.clone();
        async move {
            let service = services.get_opt(name).await.ok()??;
            Some(service.spec?.ports?.iter().map(|p| p.port).collect::<Vec<_>>())
        }
    };
    for name in ["dropped", "dropped-a-backend"] {
        eventually(&format!("{name} with two ports"), Duration::from_secs(30), || async {
            (ports(name).await? == [80, 8080]).then_some(())
        })
        .await;
    }
    let one_port = "spec:\n  ports: [{name: http, port: 80}]\n  backends: [{name: a, selector: {app: a}}]\n";
    let (ok, out) = apply(world, "admin", &balancer_yaml("dropped", one_port));
    assert!(ok, "{out}");
    for name in ["dropped", "dropped-a-backend"] {
        eventually(&format!("{name} down to one port"), Duration::from_secs(30), || async {
            (ports(name).await? == [80]).then_some(())
        })
        .await;
    }
    let config_maps: Api<ConfigMap> = Api::namespaced(world.admin.clone(), NS);
    let conf = config_maps.get("dropped-proxy-configmap").await.unwrap().data.unwrap()["nginx.conf"].clone();
    assert!(!conf.contains("8080"), "{conf}");
    balancers(world).delete("dropped", &DeleteParams::default()).await.unwrap();
}

/// `spec.service`: node ports allocated (or chosen) by the API server and reported in the
/// status; a LoadBalancer's settings on the Service and its ingress as the Balancer's
/// address; back to ClusterIP without a trace.
pub(crate) async fn a_balancer_is_exposed_by_node_ports_and_a_load_balancer(world: &mut World) {
    const NAME: &str = "exposed";
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    let front = || async { services.get_opt(NAME).await.ok().flatten().and_then(|s| s.spec) };
    let status = || async { balancers(world).get_opt(NAME).await.ok().flatten().and_then(|b| b.status) };
    let ports = "  ports: [{name: http, port: 80, nodePort: 30080}, {name: dns, port: 53, protocol: UDP}]\n  \
                 backends: [{name: a, selector: {app: a}}]\n";

    // ClusterIP with a node port: the webhook names the field.
    let (ok, out) = apply(world, "admin", &balancer_yaml(NAME, &format!("spec:\n{ports}")));
    assert!(!ok && out.contains("spec.ports[0].nodePort: applies to type NodePort or LoadBalancer only"), "{out}");

    let node_port = format!("spec:\n  service: {{type: NodePort}}\n{ports}");
    let (ok, out) = apply(world, "admin", &balancer_yaml(NAME, &node_port));
    assert!(ok, "{out}");
    let (cluster_ip, allocated) =
        eventually("NodePort Service, ports in the status", Duration::from_secs(30), || async {
            let spec = front().await?;
            let node_ports: Vec<i32> = spec.ports?.iter().map(|p| p.node_port.unwrap_or(0)).collect();
            let status = status().await?;
            let reported: Vec<i32> = status.node_ports.iter().map(|p| p.node_port).collect();
            let ip = spec.cluster_ip?;
            let addresses: Vec<&str> = status.addresses.iter().map(|a| a.value.as_str()).collect();
            (spec.type_.as_deref() == Some("NodePort")
                && node_ports[0] == 30080
                && node_ports[1] > 0
                && reported == node_ports
                && addresses == [ip.as_str()])
            .then_some((ip, node_ports[1]))
        })
        .await;
    println!("e2e: NodePort {NAME}: cluster IP {cluster_ip}, node ports 30080 (chosen) and {allocated} (allocated)");

    let load_balancer = format!(
        "spec:\n  service:\n    type: LoadBalancer\n    externalTrafficPolicy: Local\n    \
         loadBalancerSourceRanges: [10.0.0.0/8]\n    annotations: {{example.com/lb-scheme: internal}}\n{ports}"
    );
    let (ok, out) = apply(world, "admin", &balancer_yaml(NAME, &load_balancer));
    assert!(ok, "{out}");
    eventually("LoadBalancer Service, no address while pending", Duration::from_secs(30), || async {
        let service = services.get_opt(NAME).await.ok().flatten()?;
        let annotation = service.annotations().get("example.com/lb-scheme").cloned();
        let spec = service.spec?;
        let status = status().await?;
        (spec.type_.as_deref() == Some("LoadBalancer")
            && spec.external_traffic_policy.as_deref() == Some("Local")
            && spec.load_balancer_source_ranges == Some(vec!["10.0.0.0/8".into()])
            && annotation.as_deref() == Some("internal")
            && status.addresses.is_empty()
            && status.node_ports.len() == 2)
            .then_some(())
    })
    .await;
    // What a cloud controller would do (a documentation address: nothing is sent to it).
    let ingress = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}});
    services.patch_status(NAME, &PatchParams::default(), &Patch::Merge(&ingress)).await.expect("ingress set");
    eventually("the ingress as the Balancer's address", Duration::from_secs(30), || async {
        let status = status().await?;
        (status.addresses.len() == 1 && status.addresses[0].value == "192.0.2.10").then_some(())
    })
    .await;
    let out = world.plane.kubectl("admin").ok(&["get", "bal", NAME]);
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    let address = header.iter().position(|h| *h == "ADDRESS").expect("an ADDRESS column");
    assert_eq!(row.get(address), Some(&"192.0.2.10"), "{out}");

    // Settings dropped from the spec leave the Service too (every one it asked for is still
    // there, so only the hash of the wanted Service tells the controller to apply it again).
    let (ok, out) =
        apply(world, "admin", &balancer_yaml(NAME, &format!("spec:\n  service: {{type: LoadBalancer}}\n{ports}")));
    assert!(ok, "{out}");
    eventually("the dropped LoadBalancer settings to go", Duration::from_secs(30), || async {
        let service = services.get_opt(NAME).await.ok().flatten()?;
        let annotated = service.annotations().contains_key("example.com/lb-scheme");
        let spec = service.spec?;
        let dropped =
            spec.load_balancer_source_ranges.is_none() && spec.external_traffic_policy.as_deref() == Some("Cluster");
        (spec.type_.as_deref() == Some("LoadBalancer") && !annotated && dropped).then_some(())
    })
    .await;

    // Back to ClusterIP: no node port, policy, range or annotation is left behind.
    let ports_only = "  ports: [{name: http, port: 80}, {name: dns, port: 53, protocol: UDP}]\n  \
                      backends: [{name: a, selector: {app: a}}]\n";
    let (ok, out) = apply(world, "admin", &balancer_yaml(NAME, &format!("spec:\n{ports_only}")));
    assert!(ok, "{out}");
    eventually("ClusterIP again, node ports gone", Duration::from_secs(30), || async {
        let service = services.get_opt(NAME).await.ok().flatten()?;
        let annotated = service.annotations().contains_key("example.com/lb-scheme");
        let spec = service.spec?;
        let status = status().await?;
        let node_ports = spec.ports?.iter().any(|p| p.node_port.is_some());
        (spec.type_.as_deref() == Some("ClusterIP")
            && !node_ports
            && !annotated
            && spec.load_balancer_source_ranges.is_none()
            && status.node_ports.is_empty()
            && status.addresses.first().map(|a| a.value.as_str()) == spec.cluster_ip.as_deref())
        .then_some(())
    })
    .await;
    balancers(world).delete(NAME, &DeleteParams::default()).await.unwrap();
}

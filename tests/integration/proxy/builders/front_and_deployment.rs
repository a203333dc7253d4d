//! The front Service and the proxy Deployment: what they select and expose, how the proxy pods
//! are locked down, probed, stopped, spread and shaped.

use std::collections::BTreeMap;

use balancer::api::BalancerPort;
use balancer::api::v1beta1::{FrontService, ProxySpec};
use balancer::proxy::model::MODEL_FILE;
use balancer::proxy::nginx;
use balancer::proxy::{self, BALANCER_NAME_LABEL, COMPONENT_LABEL, CONFIG_HASH_ANNOTATION};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::fixtures::{
    admitted, container, desired, desired_for, is_subset, labels, owner, pod_labels, pod_spec, sample, selector,
    service_ports, settings, with_ports,
};
use crate::support::fixtures::port;

#[test]
fn front_service_selects_exactly_this_balancers_proxy_pods() {
    let desired = desired_for(&sample());
    let front = selector(&desired.front_service);
    assert_eq!(front, &proxy::proxy_selector("example-balancer"));
    assert_eq!(front, &labels(&[(BALANCER_NAME_LABEL, "example-balancer"), (COMPONENT_LABEL, "proxy")]));
    assert!(is_subset(front, pod_labels(&desired.deployment)), "selects the proxy pods");

    // Not another Balancer's proxy pods, not its own backends' pods.
    let mut other = sample();
    other.metadata.name = Some("example-balancer-2".into());
    assert!(!is_subset(front, pod_labels(&desired_for(&other).deployment)));
    for backend in &desired.backend_services {
        assert!(!is_subset(front, selector(backend)));
    }
}

#[test]
fn front_service_ports_target_the_proxy_container_ports() {
    let mut named = port(Some("dns"), "UDP", 53);
    named.target_port = Some(IntOrString::String("dns".into()));
    let mut http = port(Some("http"), "TCP", 80);
    http.target_port = Some(IntOrString::Int(5678));
    let balancer = with_ports(vec![named, http, port(Some("dns-tcp"), "TCP", 53)]);
    let desired = desired_for(&balancer);
    let front: Vec<_> = service_ports(&desired.front_service)
        .iter()
        .map(|p| {
            (p.name.clone().unwrap_or_default(), p.protocol.clone().unwrap_or_default(), p.port, p.target_port.clone())
        })
        .collect();
    assert_eq!(
        front,
        vec![
            ("dns".into(), "UDP".into(), 53, Some(IntOrString::Int(53))),
            ("http".into(), "TCP".into(), 80, Some(IntOrString::Int(80))),
            ("dns-tcp".into(), "TCP".into(), 53, Some(IntOrString::Int(53))),
        ],
        "the proxy listens on the Balancer port; the named/backend targetPort is the backend Services' business"
    );
    let container_ports: Vec<_> = container(&desired.deployment)
        .ports
        .as_ref()
        .expect("container ports")
        .iter()
        .map(|p| (p.container_port, p.protocol.clone().unwrap_or_default()))
        .collect();
    assert_eq!(container_ports, vec![(53, "UDP".to_string()), (80, "TCP".into()), (53, "TCP".into())]);
    assert_eq!(desired.front_service.spec.as_ref().and_then(|s| s.type_.as_deref()), Some("ClusterIP"));
}

#[test]
fn deployment_selector_is_a_subset_of_its_pod_template_labels() {
    for name in ["example-balancer", "a", "with-dashes-1"] {
        let mut balancer = sample();
        balancer.metadata.name = Some(name.into());
        let deployment = desired_for(&balancer).deployment;
        let spec = deployment.spec.as_ref().expect("spec");
        let selector = spec.selector.match_labels.as_ref().expect("matchLabels");
        assert!(spec.selector.match_expressions.is_none());
        assert_eq!(selector, &proxy::proxy_selector(name));
        assert!(is_subset(selector, pod_labels(&deployment)), "{selector:?} ⊄ {:?}", pod_labels(&deployment));
        assert_eq!(spec.replicas, Some(2));
    }
}

#[test]
fn proxy_container_runs_the_configured_image_with_nginx_args() {
    let desired = desired_for(&sample());
    let nginx = container(&desired.deployment);
    assert_eq!(nginx.image.as_deref(), Some("nginxinc/nginx-unprivileged:1.28.0-alpine"));
    let entrypoint = ["/bin/sh", "-c", nginx::ENTRYPOINT, "nginx"].map(String::from).to_vec();
    assert_eq!(nginx.command, Some(entrypoint));
    // The program is constant: the pod's files, and the hash of the file it waits for, are in
    // its environment.
    let environment: Vec<_> =
        nginx.env.iter().flatten().map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default())).collect();
    let hash = nginx::config_hash(&desired.nginx_conf);
    let expected = [
        (nginx::CONFIG_HASH_ENV, hash.as_str()),
        ("BALANCER_MOUNTED", "/etc/balancer/nginx.conf"),
        ("BALANCER_RUNNING", "/tmp/nginx.conf"),
        ("BALANCER_PID_FILE", "/tmp/nginx.pid"),
        ("BALANCER_IPV6_PROBE", "/proc/net/if_inet6"),
        ("BALANCER_DRAIN_SECONDS", "20"),
    ];
    assert_eq!(environment, expected);
    // The copy the entrypoint makes of the mounted file (see tests/integration/proxy/entrypoint.rs).
    assert_eq!(
        nginx.args,
        Some(
            ["-c", "/tmp/nginx.conf", "-e", "stderr", "-g", "daemon off; pid /tmp/nginx.pid;"]
                .map(String::from)
                .to_vec()
        )
    );
    assert_eq!(nginx.args, Some(proxy::nginx::nginx_args()));
}

#[test]
fn the_config_map_is_mounted_where_the_entrypoint_reads_it() {
    let desired = desired_for(&sample());
    let nginx = container(&desired.deployment);
    let args = nginx.args.as_ref().expect("args");
    // nginx runs the entrypoint's copy, in the writable /tmp, of the mounted file.
    let conf_path = &args[args.iter().position(|a| a == "-c").expect("-c") + 1];
    assert_eq!(conf_path, nginx::POD_FILES.running);
    assert!(conf_path.starts_with("/tmp/"), "{conf_path}");
    let (dir, file) = nginx::POD_FILES.mounted.rsplit_once('/').expect("absolute path");

    let mount = nginx
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == dir)
        .unwrap_or_else(|| panic!("nothing mounted at {dir}: {:?}", nginx.volume_mounts));
    assert_eq!(mount.read_only, Some(true));
    assert!(mount.sub_path.is_none());
    let volume = pod_spec(&desired.deployment)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .expect("the mounted volume exists");
    let source = volume.config_map.as_ref().expect("a ConfigMap volume");
    assert_eq!(Some(&source.name), desired.config_map.metadata.name.as_ref());
    assert!(source.items.is_none(), "every key is projected as a file");
    assert_eq!(file, nginx::CONFIG_FILE);
    let data = desired.config_map.data.as_ref().expect("data");
    assert_eq!(data.keys().collect::<Vec<_>>(), [file, MODEL_FILE], "the file and its model");
    assert_eq!(data[file], desired.nginx_conf);

    // The pid file goes to /tmp, a writable emptyDir under the read-only root filesystem.
    let directives = &args[args.iter().position(|a| a == "-g").expect("-g") + 1];
    assert!(directives.contains("pid /tmp/nginx.pid;"), "{directives}");
    let tmp = nginx.volume_mounts.iter().flatten().find(|m| m.mount_path == "/tmp").expect("/tmp mounted");
    assert_ne!(tmp.read_only, Some(true));
    let tmp_volume =
        pod_spec(&desired.deployment).volumes.iter().flatten().find(|v| v.name == tmp.name).expect("volume");
    assert!(tmp_volume.empty_dir.is_some());
}

#[test]
fn proxy_is_locked_down() {
    let desired = desired_for(&sample());
    let pod = pod_spec(&desired.deployment);
    let pod_security = pod.security_context.as_ref().expect("pod securityContext");
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(pod_security.run_as_user, Some(101));
    assert_eq!(pod_security.run_as_group, Some(101));
    let seccomp = pod_security.seccomp_profile.as_ref().expect("seccomp");
    assert_eq!(seccomp.type_, "RuntimeDefault");
    assert_eq!(pod.automount_service_account_token, Some(false));

    let security = container(&desired.deployment).security_context.as_ref().expect("container securityContext");
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.privileged, None);
    let capabilities = security.capabilities.as_ref().expect("capabilities");
    assert_eq!(capabilities.drop, Some(vec!["ALL".to_string()]));
    assert_eq!(capabilities.add, None);
}

#[test]
fn unprivileged_port_sysctl_only_for_ports_below_1024() {
    let sysctls = |ports: Vec<BalancerPort>| {
        let deployment = desired_for(&with_ports(ports)).deployment;
        pod_spec(&deployment).security_context.as_ref().and_then(|s| s.sysctls.clone())
    };
    let expected = Some(vec![k8s_openapi::api::core::v1::Sysctl {
        name: "net.ipv4.ip_unprivileged_port_start".into(),
        value: "0".into(),
    }]);
    assert_eq!(sysctls(vec![port(None, "TCP", 80)]), expected, "the sample's port 80");
    assert_eq!(sysctls(vec![port(None, "TCP", 1023)]), expected);
    assert_eq!(sysctls(vec![port(Some("a"), "TCP", 8080), port(Some("b"), "UDP", 53)]), expected, "any low port");
    assert_eq!(sysctls(vec![port(None, "TCP", 1024)]), None);
    assert_eq!(sysctls(vec![port(Some("a"), "TCP", 8080), port(Some("b"), "UDP", 65535)]), None);
}

#[test]
fn readiness_probes_the_first_tcp_port_or_checks_the_config_when_udp_only() {
    let probe = |ports: Vec<BalancerPort>| {
        container(&desired_for(&with_ports(ports)).deployment).readiness_probe.clone().expect("readiness probe")
    };
    let mixed = probe(vec![port(Some("dns"), "UDP", 53), port(Some("a"), "TCP", 8080), port(Some("b"), "TCP", 9090)]);
    assert_eq!(mixed.tcp_socket.as_ref().map(|t| t.port.clone()), Some(IntOrString::Int(8080)));
    assert!(mixed.tcp_socket.as_ref().is_some_and(|t| t.host.is_none()), "the pod's own IP");
    assert!(mixed.exec.is_none() && mixed.http_get.is_none());
    assert_eq!(mixed.period_seconds, Some(5));
    assert_eq!(mixed.failure_threshold, Some(3));

    let udp_only = probe(vec![port(Some("dns"), "UDP", 53), port(Some("syslog"), "UDP", 514)]);
    assert!(udp_only.tcp_socket.is_none());
    let command = udp_only.exec.as_ref().and_then(|e| e.command.clone()).expect("exec probe");
    // nginx runs (its pid file, which the entrypoint removes first, is there), and accepts the
    // file; every argument, the pid file's path included: the default one is on the read-only root.
    let expected = [
        "/bin/sh",
        "-c",
        nginx::READINESS,
        "nginx",
        "/tmp/nginx.pid",
        "-c",
        "/tmp/nginx.conf",
        "-e",
        "stderr",
        "-g",
        "daemon off; pid /tmp/nginx.pid;",
    ];
    assert_eq!(command, expected.map(String::from));

    // A port that requires a PROXY protocol header is not probed with a bare connection.
    let mut behind_a_load_balancer = port(Some("nlb"), "TCP", 8443);
    behind_a_load_balancer.accept_proxy_protocol = Some(true);
    let skipped = probe(vec![behind_a_load_balancer.clone(), port(Some("plain"), "TCP", 80)]);
    assert_eq!(skipped.tcp_socket.map(|t| t.port), Some(IntOrString::Int(80)));
    let only = probe(vec![behind_a_load_balancer]);
    assert!(only.tcp_socket.is_none());
    assert_eq!(only.exec.and_then(|e| e.command), Some(expected.map(String::from).to_vec()));
}

/// A stopping proxy pod drops no connection: it keeps serving while it leaves the endpoints
/// (at least 5 s, on while new connections still arrive, at most 30 s), then nginx quits
/// gracefully, then the metrics sidecar stops, within a grace period that covers all three.
#[test]
fn proxy_pods_stop_gracefully() {
    use proxy::stop::{PRE_STOP, PROXY_STOP_WAIT, StopWait};
    let desired = desired_for(&sample());
    let nginx = container(&desired.deployment);
    let hook = nginx.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).and_then(|h| h.exec.as_ref());
    let command = hook.and_then(|e| e.command.clone()).expect("a preStop exec hook");
    assert_eq!(command, ["/bin/sh", "-c", PRE_STOP, "pre-stop", "/proc/net/snmp", "5", "3", "30"]);
    assert_eq!(PROXY_STOP_WAIT, StopWait { min: 5, quiet: 3, max: 30 });
    let script = nginx::ENTRYPOINT;
    let quit = "trap 'kill -QUIT \"$nginx\"; { sleep \"$BALANCER_DRAIN_SECONDS\"; kill -TERM \"$nginx\"; } 2>/dev/null & wait \"$nginx\"; exit $?' TERM";
    assert!(script.ends_with(&format!("{quit}\nnginx \"$@\" & nginx=$!\nwait \"$nginx\"\n")), "{script}");
    let live = proxy::reload::LIVE_ENTRYPOINT;
    assert!(live.contains(&format!("\n{quit}\n")), "{live}");
    // The drain both entrypoints are given.
    let environment = nginx.env.iter().flatten().map(|e| (e.name.as_str(), e.value.as_deref())).collect::<Vec<_>>();
    assert!(environment.contains(&("BALANCER_DRAIN_SECONDS", Some("20"))), "{environment:?}");
    // Connections opened before a configuration change live an hour; a stopping pod closes them
    // after 20 s.
    assert!(desired.nginx_conf.contains("\nworker_shutdown_timeout 1h;\n"), "{}", desired.nginx_conf);
    let grace = pod_spec(&desired.deployment).termination_grace_period_seconds;
    assert_eq!(grace, Some(65), "30 s of stop wait + 20 s of nginx's drain + 10 s of the sidecar's + 5 s to spare");
}

/// Losing a node loses one proxy replica at most, and a single node still runs them all.
#[test]
fn proxy_pods_spread_across_nodes() {
    let desired = desired_for(&sample());
    let spread = pod_spec(&desired.deployment).topology_spread_constraints.clone().expect("a spread constraint");
    assert_eq!(spread.len(), 1);
    assert_eq!(
        (spread[0].max_skew, spread[0].topology_key.as_str(), spread[0].when_unsatisfiable.as_str()),
        (1, "kubernetes.io/hostname", "ScheduleAnyway")
    );
    let selector = spread[0].label_selector.as_ref().and_then(|s| s.match_labels.clone());
    assert_eq!(selector, desired.deployment.spec.as_ref().and_then(|s| s.selector.match_labels.clone()));
}

/// `spec.service` shapes the front Service only: type, chosen node ports, the LoadBalancer
/// settings and the annotations; the backend Services stay ClusterIP without node ports.
#[test]
fn the_front_service_is_exposed_as_spec_service_says() {
    let mut balancer = with_ports(vec![port(Some("http"), "TCP", 80), port(Some("dns"), "UDP", 53)]);
    balancer.spec.ports[0].node_port = Some(30080);
    balancer.spec.service = Some(FrontService {
        type_: Some("LoadBalancer".into()),
        load_balancer_class: Some("example.com/internal".into()),
        external_traffic_policy: Some("Local".into()),
        load_balancer_source_ranges: Some(vec!["10.0.0.0/8".into()]),
        annotations: Some(BTreeMap::from([("example.com/lb-scheme".into(), "internal".into())])),
    });
    let desired = desired_for(&balancer);
    let front = desired.front_service.spec.as_ref().expect("a spec");
    assert_eq!(front.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(front.load_balancer_class.as_deref(), Some("example.com/internal"));
    assert_eq!(front.external_traffic_policy.as_deref(), Some("Local"));
    assert_eq!(front.load_balancer_source_ranges, Some(vec!["10.0.0.0/8".to_string()]));
    let node_ports: Vec<Option<i32>> = service_ports(&desired.front_service).iter().map(|p| p.node_port).collect();
    assert_eq!(node_ports, [Some(30080), None], "the other is the API server's to allocate");
    let annotations = desired.front_service.metadata.annotations.as_ref().expect("annotations");
    assert_eq!(annotations.get("example.com/lb-scheme").map(String::as_str), Some("internal"));
    for backend in &desired.backend_services {
        let spec = backend.spec.as_ref().expect("a spec");
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert!(spec.ports.iter().flatten().all(|p| p.node_port.is_none()));
        assert!(backend.metadata.annotations.is_none());
    }

    // The default: ClusterIP, no node port, no annotation.
    balancer.spec.service = None;
    balancer.spec.ports[0].node_port = None;
    let desired = desired_for(&balancer);
    let front = desired.front_service.spec.as_ref().expect("a spec");
    assert_eq!(front.type_.as_deref(), Some("ClusterIP"));
    assert!(service_ports(&desired.front_service).iter().all(|p| p.node_port.is_none()));
    assert_eq!(
        (front.external_traffic_policy.as_ref(), desired.front_service.metadata.annotations.as_ref()),
        (None, None)
    );
}

/// `spec.proxy` goes into the proxy pods as it is: image, resources, placement, priority and
/// annotations (the config hash stays the operator's); unset, the defaults stand.
#[test]
fn the_proxy_pods_are_shaped_as_spec_proxy_says() {
    use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let mut balancer = with_ports(vec![port(Some("http"), "TCP", 80)]);
    let defaults = desired_for(&balancer);
    let default_pod = pod_spec(&defaults.deployment).clone();
    let requests = BTreeMap::from([("cpu".to_string(), Quantity("250m".into()))]);
    let spread = TopologySpreadConstraint {
        max_skew: 2,
        topology_key: "topology.kubernetes.io/zone".into(),
        when_unsatisfiable: "DoNotSchedule".into(),
        ..TopologySpreadConstraint::default()
    };
    balancer.spec.proxy = Some(ProxySpec {
        image: Some("registry.example.com/nginx/stream:1".into()),
        resources: Some(ResourceRequirements { requests: Some(requests.clone()), ..Default::default() }),
        node_selector: Some(BTreeMap::from([("kubernetes.io/os".into(), "linux".into())])),
        tolerations: Some(vec![Toleration {
            key: Some("dedicated".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }]),
        affinity: Some(Affinity::default()),
        topology_spread_constraints: Some(vec![spread.clone()]),
        priority_class_name: Some("system-cluster-critical".into()),
        upstreams: None,
        pod_annotations: Some(BTreeMap::from([
            ("example.com/scrape".into(), "true".into()),
            (CONFIG_HASH_ANNOTATION.into(), "mine".into()),
        ])),
        drain_timeout: Some("8h".into()),
    });
    let mut settings = settings();
    settings.policy.allowed_images = vec!["registry.example.com/nginx/".into()];
    let desired = desired(&owner(&balancer), &admitted(&balancer, &settings), &settings);
    let pod = pod_spec(&desired.deployment);
    let nginx = container(&desired.deployment);
    assert_eq!(nginx.image.as_deref(), Some("registry.example.com/nginx/stream:1"));
    assert_eq!(nginx.resources.as_ref().and_then(|r| r.requests.clone()), Some(requests));
    assert_eq!(pod.node_selector.as_ref().map(|s| s.len()), Some(1));
    assert_eq!(pod.tolerations.as_ref().map(Vec::len), Some(1));
    assert_eq!(pod.affinity, Some(Affinity::default()));
    assert_eq!(pod.topology_spread_constraints, Some(vec![spread]), "replaces the default spread");
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-cluster-critical"));
    let template = desired.deployment.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).expect("metadata");
    let annotations = template.annotations.as_ref().expect("annotations");
    assert_eq!(annotations.get("example.com/scrape").map(String::as_str), Some("true"));
    let hash = nginx::config_hash(&desired.nginx_conf);
    assert_eq!(annotations.get(CONFIG_HASH_ANNOTATION), Some(&hash), "the controller's, not the user's");
    assert!(desired.nginx_conf.contains("\nworker_shutdown_timeout 8h;\n"), "{}", desired.nginx_conf);
    // Unset: the operator's image, requests, spread; no placement of its own.
    assert_eq!(container(&defaults.deployment).image.as_deref(), Some(settings.image.as_str()));
    assert!(default_pod.node_selector.is_none() && default_pod.tolerations.is_none() && default_pod.affinity.is_none());
    assert_eq!(
        default_pod.topology_spread_constraints.as_ref().map(|t| t[0].topology_key.as_str()),
        Some("kubernetes.io/hostname")
    );
}

//! The metrics sidecar: run as strictly as the proxy, its port clear of the Balancer's, reading
//! the model beside the file; with it a new configuration changes no pod.

use std::net::IpAddr;

use balancer::api::Protocol;
use balancer::proxy::access_log::metrics_port;
use balancer::proxy::model::{MODEL_FILE, OwnerKind, ProxyConfig};
use balancer::proxy::nginx;
use balancer::proxy::upstreams::Upstreams;
use balancer::proxy::{self, ProxySettings};
use balancer::spec::SpecPolicy;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Container;

use super::fixtures::{admitted, desired, desired_for, owner, pod_spec, sample, settings, targets};
use crate::support::fixtures::{self, port};

fn with_sidecar() -> ProxySettings {
    ProxySettings { metrics_image: Some("registry.example.com/balancer:1.2".into()), ..settings() }
}

pub(super) fn template(deployment: &Deployment) -> serde_json::Value {
    serde_json::to_value(&deployment.spec.as_ref().expect("a spec").template).expect("serializes")
}

#[test]
fn without_a_metrics_image_the_proxy_has_no_sidecar_and_logs_nothing() {
    let desired = desired_for(&sample());
    assert_eq!(pod_spec(&desired.deployment).containers.len(), 1);
    assert_eq!(pod_spec(&desired.deployment).init_containers, None);
    assert!(!desired.nginx_conf.contains("access_log"), "{}", desired.nginx_conf);
}

#[test]
fn the_metrics_sidecar_runs_balancers_image_as_strictly_as_the_proxy() {
    let balancer = sample();
    let settings = with_sidecar();
    let desired = desired(&owner(&balancer), &admitted(&balancer, &settings), &settings);
    let pod = pod_spec(&desired.deployment);
    let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["nginx"]);
    let init: Vec<&str> = pod.init_containers.iter().flatten().map(|c| c.name.as_str()).collect();
    assert_eq!(init, [proxy::METRICS_CONTAINER], "a native sidecar: starts before nginx, stops after it");
    let (nginx, sidecar) = (&pod.containers[0], &pod.init_containers.as_ref().unwrap()[0]);
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    assert_eq!(sidecar.image.as_deref(), Some("registry.example.com/balancer:1.2"));
    assert_eq!(sidecar.command.as_deref(), Some(&["/balancer".to_string()][..]));
    assert_eq!(
        sidecar.args.as_deref().unwrap_or_default(),
        [
            "proxy-metrics",
            "--configmap=example-balancer-proxy-configmap",
            "--live-dir=/run/balancer",
            "--owner=example-balancer",
            "--owner-uid=6a1c3b3e-1f0e-4d2a-9b7c-0123456789ab",
            "--listen=[::]:9113",
            "--log-file=/var/log/balancer/access.log",
            "--drain=10s"
        ]
    );
    assert_eq!(sidecar.security_context, nginx.security_context, "as strict as the proxy");
    let port = &sidecar.ports.as_ref().unwrap()[0];
    assert_eq!((port.name.as_deref(), port.container_port), (Some(proxy::METRICS_PORT_NAME), 9113));
    let limits = sidecar.resources.as_ref().and_then(|r| r.limits.as_ref()).expect("limits");
    assert!(limits.contains_key("memory"));
    assert!(sidecar.readiness_probe.is_none() && sidecar.liveness_probe.is_none(), "never gates the proxy");
    let mounts: Vec<(&str, &str, Option<bool>)> =
        sidecar.volume_mounts.iter().flatten().map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only)).collect();
    assert_eq!(
        mounts,
        [
            ("live", "/run/balancer", None),
            ("token", proxy::TOKEN_DIR, Some(true)),
            ("access-log", "/var/log/balancer", None)
        ],
        "writes the configuration for nginx; reads its token; reads and frees the access log"
    );
    let log_volume = pod.volumes.iter().flatten().find(|v| v.name == "access-log").expect("the log's volume");
    let empty_dir = log_volume.empty_dir.as_ref().expect("an emptyDir");
    assert_eq!(
        (empty_dir.medium.as_deref(), empty_dir.size_limit.as_ref().map(|q| q.0.as_str())),
        (Some("Memory"), Some("8Mi")),
        "a bounded tmpfs: a stalled sidecar makes nginx drop lines, and never gets the pod evicted"
    );
    assert!(
        desired.nginx_conf.contains("    access_log /var/log/balancer/access.log balancer buffer=64k flush=1s;\n"),
        "{}",
        desired.nginx_conf
    );
}

#[test]
fn the_sidecars_port_stays_clear_of_the_balancers_own() {
    let mut spec = sample().spec;
    spec.ports = vec![port(Some("a"), "TCP", 9113), port(Some("b"), "UDP", 5514), port(Some("c"), "TCP", 9114)];
    assert_eq!(metrics_port(spec.ports.iter().map(|p| p.port)), 9115);
}

/// What the sidecar reads from the ConfigMap's model: which backend each server is, the ports
/// nginx listens on, and the weights; and the file beside it is the rendering of that model.
#[test]
fn the_sidecar_reads_every_backend_and_weight_from_the_model_beside_the_file() {
    let mut spec = sample().spec;
    spec.ports.push(port(Some("dns"), "UDP", 53));
    spec.backends[1].weight = Some(0);
    let ips: Vec<IpAddr> = (0..3).map(|i| IpAddr::from([10, 96, 0, 10 + i])).collect();
    let spec = fixtures::admitted("example-balancer", spec.clone(), &SpecPolicy::default());
    let settings = ProxySettings { metrics_image: Some("localhost/balancer:dev".into()), ..settings() };
    let built = proxy::proxy(&owner(&sample()), &spec, &settings, &targets(&spec, &ips, None));
    let data = built.config_map.data.expect("data");
    let model = ProxyConfig::from_json(&data[MODEL_FILE]).expect("a model");
    assert_eq!(nginx::write(&model), data[nginx::CONFIG_FILE], "the file is the model's rendering");
    assert!(nginx::is_rendered_for(&data[nginx::CONFIG_FILE], &model));
    let another = ProxyConfig { name: "example".into(), ..model.clone() };
    assert!(!nginx::is_rendered_for(&data[nginx::CONFIG_FILE], &another), "another Balancer's file");
    let gateway = ProxyConfig { kind: OwnerKind::Gateway, ..model.clone() };
    assert!(!nginx::is_rendered_for(&data[nginx::CONFIG_FILE], &gateway), "a Gateway's of the same name");
    assert_eq!(gateway.identity(), "Gateway/example-balancer");
    let upstreams = Upstreams::of(&model);
    assert_eq!(upstreams.balancer, "example-balancer");
    for (i, name) in ["v1", "v2", "v3"].iter().enumerate() {
        assert_eq!(upstreams.backend(&format!("{}:80", ips[i])), Some(*name));
        assert_eq!(upstreams.backend(&format!("{}:53", ips[i])), Some(*name));
    }
    assert!(upstreams.listens(80, Protocol::Tcp) && upstreams.listens(53, Protocol::Udp));
    assert!(!upstreams.listens(53, Protocol::Tcp) && !upstreams.listens(81, Protocol::Tcp));
    let weights: Vec<(u16, &str, &str, u32)> =
        upstreams.weights().iter().map(|w| (w.port, w.protocol.as_str(), w.backend.as_str(), w.weight)).collect();
    assert_eq!(
        weights,
        [
            (80, "TCP", "v1", 40),
            (80, "TCP", "v2", 0),
            (80, "TCP", "v3", 40),
            (53, "UDP", "v1", 40),
            (53, "UDP", "v2", 0),
            (53, "UDP", "v3", 40)
        ]
    );
    assert_eq!(ProxyConfig::from_json("events {}\n"), None, "not a model");
}

/// Without the sidecar, nginx reads the mounted file once: it is told which file to wait for
/// (see `proxy::nginx::ENTRYPOINT`), and a new configuration rolls the pods.
#[test]
fn without_the_sidecar_a_new_configuration_rolls_the_pods() {
    let mut balancer = sample();
    let desired = desired_for(&balancer);
    let hash = nginx::config_hash(&desired.nginx_conf);
    let nginx = &pod_spec(&desired.deployment).containers[0];
    let env = nginx.env.clone().unwrap_or_default();
    let told: Vec<_> = env.iter().filter(|e| e.name == nginx::CONFIG_HASH_ENV).collect();
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].value.as_deref(), Some(hash.as_str()));
    balancer.spec.backends[0].weight = Some(7);
    let changed = desired_for(&balancer);
    assert_ne!(template(&changed.deployment), template(&desired.deployment));
}

/// With the sidecar, a new configuration reaches the running pods: the pod template holds
/// nothing it changes. The sidecar, and only it, holds a token of the proxy's own
/// ServiceAccount, which may read the proxy's ConfigMap and nothing else.
#[test]
fn with_the_sidecar_a_new_configuration_changes_no_pod_and_only_the_sidecar_holds_a_token() {
    let settings = with_sidecar();
    let mut balancer = sample();
    let before = desired(&owner(&balancer), &admitted(&balancer, &settings), &settings);
    balancer.spec.backends[0].weight = Some(7);
    balancer.spec.algorithm = Some("LeastConnections".into());
    let changed = desired(&owner(&balancer), &admitted(&balancer, &settings), &settings);
    assert_ne!(changed.nginx_conf, before.nginx_conf);
    assert_eq!(template(&changed.deployment), template(&before.deployment), "no pod rolls");

    let pod = pod_spec(&before.deployment);
    assert_eq!(pod.service_account_name.as_deref(), Some("example-balancer-proxy"));
    assert_eq!(pod.automount_service_account_token, Some(false), "no token for nginx");
    let (nginx, sidecar) = (&pod.containers[0], &pod.init_containers.as_ref().unwrap()[0]);
    let mounts = |c: &Container| c.volume_mounts.iter().flatten().map(|m| m.name.clone()).collect::<Vec<_>>();
    assert_eq!(mounts(nginx), ["live", "tmp", "access-log"]);
    assert!(mounts(sidecar).contains(&"token".to_string()));
    assert!(sidecar.env.is_none(), "no hash to wait for");
    // nginx's environment is the live entrypoint's: where its files are and its pace, no hash.
    let environment: Vec<_> =
        nginx.env.iter().flatten().map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default())).collect();
    let expected = [
        ("BALANCER_DESIRED", "/run/balancer/nginx.conf"),
        ("BALANCER_CANDIDATE", "/tmp/nginx.conf.next"),
        ("BALANCER_SERVED", "/run/balancer/served"),
        ("BALANCER_REJECTED", "/run/balancer/rejected"),
        ("BALANCER_POLL_SECONDS", "0.250"),
        ("BALANCER_RELOAD_POLLS", "2"),
        ("BALANCER_MAX_DRAINING_WORKERS", "8"),
        ("BALANCER_RUNNING", "/tmp/nginx.conf"),
        ("BALANCER_PID_FILE", "/tmp/nginx.pid"),
        ("BALANCER_IPV6_PROBE", "/proc/net/if_inet6"),
        ("BALANCER_DRAIN_SECONDS", "20"),
    ];
    assert_eq!(environment, expected);
    let command = nginx.command.clone().unwrap_or_default();
    assert_eq!(command, ["/bin/sh", "-c", proxy::reload::LIVE_ENTRYPOINT, "nginx"]);

    let owner = owner(&balancer);
    let role = proxy::proxy_config_reader(&owner);
    let rules = role.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].resources.as_deref(), Some(&["configmaps".to_string()][..]));
    assert_eq!(rules[0].resource_names.as_deref(), Some(&["example-balancer-proxy-configmap".to_string()][..]));
    assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
    let binding = proxy::proxy_config_reader_binding(&owner);
    assert_eq!((binding.role_ref.kind.as_str(), binding.role_ref.name.as_str()), ("Role", "example-balancer-proxy"));
    let subject = &binding.subjects.unwrap_or_default()[0];
    assert_eq!((subject.kind.as_str(), subject.name.as_str()), ("ServiceAccount", "example-balancer-proxy"));
    let account = proxy::proxy_service_account(&owner);
    assert_eq!(account.automount_service_account_token, Some(false));
}

/// The builders sign nothing (the write path seals each configuration against the ConfigMap as
/// it then is); the live sidecar is given the operator's public key, and the owner's UID that
/// the signature binds.
#[test]
fn the_live_sidecar_is_given_the_operators_public_key_and_the_owners_uid() {
    use balancer::proxy::signature::{CONFIG_KEY_ENV, ConfigSigner, SIGNATURE_FILE};
    let signer = ConfigSigner::from_pkcs8(&ConfigSigner::generate().expect("a key")).expect("a signer");
    let balancer = sample();
    let owner = owner(&balancer);
    let sidecar = |settings: &ProxySettings| {
        let desired = desired(&owner, &admitted(&balancer, settings), settings);
        let pod = pod_spec(&desired.deployment);
        let sidecar = pod.init_containers.iter().flatten().find(|c| c.name == proxy::METRICS_CONTAINER).cloned();
        (desired.config_map, sidecar.expect("a sidecar"))
    };
    let live = ProxySettings { signer: Some(signer.clone()), ..with_sidecar() };
    let (config_map, container) = sidecar(&live);
    assert!(!config_map.data.expect("data").contains_key(SIGNATURE_FILE), "signed on its way out, not here");
    let env = container.env.unwrap_or_default();
    let given: Vec<_> = env.iter().filter(|e| e.name == CONFIG_KEY_ENV).map(|e| e.value.clone()).collect();
    assert_eq!(given, [Some(signer.public_key().to_string())], "the public key, and nothing of the private one");
    let uid = format!("--owner-uid={}", owner.reference.uid);
    assert!(container.args.unwrap_or_default().contains(&uid), "the owner's UID");
}

/// The controller tells a ConfigMap someone else wrote from its own: the one it wants, an older
/// one it signed for this owner, or the unsigned one an earlier release wrote are its own.
#[test]
fn a_configuration_balancer_did_not_sign_for_the_owner_is_written_by_another() {
    use balancer::proxy::signature::{ConfigSigner, SEQUENCE_FILE, SIGNATURE_FILE, Subject};
    let signer = ConfigSigner::from_pkcs8(&ConfigSigner::generate().expect("a key")).expect("a signer");
    let key = signer.public_key();
    let balancer = sample();
    let owner = owner(&balancer);
    let settings = ProxySettings { signer: Some(signer.clone()), ..with_sidecar() };
    let mut desired = desired(&owner, &admitted(&balancer, &settings), &settings).config_map;
    signer.seal(desired.data.get_or_insert_default(), &owner.subject(), None, 0, 1_000);
    let data = desired.data.clone().expect("data");
    let with = |changes: &[(&str, Option<String>)]| {
        let mut current = desired.clone();
        let data = current.data.get_or_insert_default();
        for (name, value) in changes {
            match value {
                Some(value) => data.insert(name.to_string(), value.clone()),
                None => data.remove(*name),
            };
        }
        proxy::written_by_another(&current, &desired, &owner, &key)
    };
    let (conf, model) = (&data[nginx::CONFIG_FILE], &data[MODEL_FILE]);
    let forged_conf = conf.replace("server ", "server 169.254.169.254:80; #");
    let older = (conf.replace("weight=", "weight=1"), model.clone());
    assert!(forged_conf != *conf && older.0 != *conf, "both differ from the wanted file");
    assert!(!with(&[]), "its own");
    assert!(!with(&[(SIGNATURE_FILE, None), (SEQUENCE_FILE, None)]), "its own, as an earlier release wrote it");
    let older_signature = signer.sign(&owner.subject(), 900, &older.0, &older.1);
    let older_files = [
        (nginx::CONFIG_FILE, Some(older.0.clone())),
        (SEQUENCE_FILE, Some("900".to_string())),
        (SIGNATURE_FILE, Some(older_signature)),
    ];
    assert!(!with(&older_files), "older, and signed: written back, but not by another");
    assert!(with(&[(nginx::CONFIG_FILE, Some(forged_conf.clone()))]), "a forged file under its signature");
    assert!(with(&[(nginx::CONFIG_FILE, Some(forged_conf)), (SIGNATURE_FILE, None)]), "a forged unsigned file");
    let namesake = Subject { uid: "a-deleted-namesake", ..owner.subject() };
    let namesakes = signer.sign(&namesake, 900, &older.0, &older.1);
    let namesake_files = [
        (nginx::CONFIG_FILE, Some(older.0)),
        (SEQUENCE_FILE, Some("900".to_string())),
        (SIGNATURE_FILE, Some(namesakes)),
    ];
    assert!(with(&namesake_files), "signed for a deleted namesake");
}

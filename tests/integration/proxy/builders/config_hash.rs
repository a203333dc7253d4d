//! Determinism, and the config hash that rolls the pods exactly when `nginx.conf` changes.

use std::net::IpAddr;

use balancer::api::Balancer;
use balancer::proxy::ProxySettings;
use balancer::proxy::nginx;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::fixtures::{
    admitted, as_json, config_hash, container, desired, desired_for, desired_with, labels, owner, sample, settings,
};
use crate::support::fixtures::{self, backend};

#[test]
fn output_is_deterministic() {
    let balancer = sample();
    let spec = &admitted(&balancer, &settings());
    let address = fixtures::named;
    assert_eq!(
        nginx::render("example-balancer", spec, &[], None, &address),
        nginx::render("example-balancer", spec, &[], None, &address)
    );
    let first = as_json(&desired_for(&balancer));
    let second = as_json(&desired_for(&sample()));
    assert_eq!(first, second);
}

#[test]
fn config_hash_is_hex_sha256() {
    assert_eq!(nginx::config_hash(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_eq!(nginx::config_hash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

#[test]
fn config_hash_annotation_is_the_hash_of_nginx_conf() {
    let desired = desired_for(&sample());
    assert_eq!(config_hash(&desired.deployment), nginx::config_hash(&desired.nginx_conf));
    assert_eq!(config_hash(&desired.deployment).len(), 64);
}

#[test]
fn config_hash_changes_exactly_when_nginx_conf_changes() {
    let base = desired_for(&sample());
    type Change = fn(&mut Balancer, &mut ProxySettings, &mut Vec<IpAddr>);
    // (change, whether it changes nginx.conf)
    let changes: [(&str, Change, bool); 16] = [
        ("weight", |b, _, _| b.spec.backends[0].weight = Some(41), true),
        ("weight to 0", |b, _, _| b.spec.backends[1].weight = Some(0), true),
        ("backend added", |b, _, _| b.spec.backends.push(backend("v4", 1)), true),
        ("backend renamed", |b, _, _| b.spec.backends[2].name = "v9".into(), true),
        ("port number", |b, _, _| b.spec.ports[0].port = 8080, true),
        ("protocol", |b, _, _| b.spec.ports[0].protocol = Some("UDP".into()), true),
        ("backend cluster IP", |_, _, ips| ips[1] = IpAddr::from([10, 96, 7, 7]), true),
        ("module loaded", |_, s, _| s.load_modules = vec!["/m.so".into()], true),
        ("namespace", |b, _, _| b.metadata.namespace = Some("other".into()), false),
        ("proxy image", |_, s, _| s.image = "nginx:1.29".into(), false),
        ("replicas", |b, _, _| b.spec.replicas = Some(5), false),
        ("scaled to zero", |b, _, _| b.spec.replicas = Some(0), false),
        ("default replicas", |b, s, _| (b.spec.replicas, s.policy.replicas) = (None, 5), false),
        ("selector", |b, _, _| b.spec.selector = Some(labels(&[("app", "other")])), false),
        ("targetPort", |b, _, _| b.spec.ports[0].target_port = Some(IntOrString::String("web".into())), false),
        ("port name", |b, _, _| b.spec.ports[0].name = Some("web".into()), false),
    ];
    for (what, change, changes_conf) in changes {
        let mut balancer = sample();
        let mut settings = settings();
        // One IP more than the sample has backends, for the one added.
        let mut ips: Vec<IpAddr> = (0..4).map(|i| IpAddr::from([10, 96, 0, 10 + i])).collect();
        change(&mut balancer, &mut settings, &mut ips);
        let desired = desired_with(&owner(&balancer), &admitted(&balancer, &settings), &settings, &ips);
        let conf_changed = desired.nginx_conf != base.nginx_conf;
        let hash_changed = config_hash(&desired.deployment) != config_hash(&base.deployment);
        assert_eq!(conf_changed, changes_conf, "{what}: nginx.conf changed = {conf_changed}");
        assert_eq!(hash_changed, conf_changed, "{what}: the hash follows nginx.conf");
        assert_eq!(config_hash(&desired.deployment), nginx::config_hash(&desired.nginx_conf), "{what}");
    }
    // The image change still reaches the Deployment, just without a config roll.
    let mut settings = settings();
    settings.image = "nginx:1.29".into();
    let desired = desired(&owner(&sample()), &admitted(&sample(), &settings), &settings);
    assert_eq!(container(&desired.deployment).image.as_deref(), Some("nginx:1.29"));
    // So does a replica count, by the Deployment's own field.
    let mut scaled = sample();
    scaled.spec.replicas = Some(5);
    let scaled = self::desired(&owner(&scaled), &admitted(&scaled, &settings), &settings);
    assert_eq!(scaled.deployment.spec.as_ref().and_then(|s| s.replicas), Some(5));
}

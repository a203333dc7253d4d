//! Backends and their selectors, weights, passive health, timeouts, backups and connection
//! limits.

use std::collections::BTreeMap;

use super::table::{
    backend, bad_key_name, bad_key_prefix, bad_value, case, derived_too_long, drains, empty_merged_selector, labels,
    not_dns1123, run, same_pods, strings, subdomain,
};

#[test]
fn backend_rules() {
    run(vec![
        case(
            "no backends",
            |s| s.spec.backends.clear(),
            strings!["spec.backends: must have at least one backend"],
            vec![],
        ),
        case(
            "64 backends is the maximum",
            |s| {
                s.spec.backends = (0..64)
                    .map(|i| backend(&format!("b{i}"), Some(1), Some(&[("version", &format!("b{i}"))])))
                    .collect()
            },
            vec![],
            vec![],
        ),
        case(
            "65 backends",
            |s| {
                s.spec.backends = (0..65)
                    .map(|i| backend(&format!("b{i}"), Some(1), Some(&[("version", &format!("b{i}"))])))
                    .collect()
            },
            strings!["spec.backends: must have at most 64 backends, got 65"],
            vec![],
        ),
        case(
            "uppercase backend name",
            |s| s.spec.backends[1].name = "V2".into(),
            strings![not_dns1123("spec.backends[1].name", "V2")],
            vec![],
        ),
        case(
            "empty backend name",
            |s| s.spec.backends[0].name = String::new(),
            strings![not_dns1123("spec.backends[0].name", "")],
            vec![],
        ),
        case(
            "backend name with a dot",
            |s| s.spec.backends[2].name = "v3.0".into(),
            strings![not_dns1123("spec.backends[2].name", "v3.0")],
            vec![],
        ),
        case(
            "backend name ending with a dash",
            |s| s.spec.backends[2].name = "v3-".into(),
            strings![not_dns1123("spec.backends[2].name", "v3-")],
            vec![],
        ),
        case(
            "duplicate backend names",
            |s| s.spec.backends[1].name = "v1".into(),
            strings!["spec.backends[1].name: duplicate backend name \"v1\" (also spec.backends[0].name)"],
            vec![],
        ),
        case(
            "38-character backend name: derived Service name is exactly 63",
            |s| s.spec.backends[0].name = "a".repeat(38),
            vec![],
            vec![],
        ),
        case(
            "39-character backend name: derived Service name is 64",
            |s| s.spec.backends[0].name = "a".repeat(39),
            strings![derived_too_long(0, "example-balancer", &"a".repeat(39))],
            vec![],
        ),
        case(
            "64-character backend name is neither a label nor short enough",
            |s| s.spec.backends[0].name = "a".repeat(64),
            strings![
                not_dns1123("spec.backends[0].name", &"a".repeat(64)),
                derived_too_long(0, "example-balancer", &"a".repeat(64)),
            ],
            vec![],
        ),
        case(
            "weight -1",
            |s| s.spec.backends[0].weight = Some(-1),
            strings!["spec.backends[0].weight: must be between 0 and 100, got -1"],
            vec![],
        ),
        case(
            "weight 101",
            |s| s.spec.backends[2].weight = Some(101),
            strings!["spec.backends[2].weight: must be between 0 and 100, got 101"],
            vec![],
        ),
        case(
            "weight 150",
            |s| s.spec.backends[1].weight = Some(150),
            strings!["spec.backends[1].weight: must be between 0 and 100, got 150"],
            vec![],
        ),
        case("weight 100", |s| s.spec.backends[1].weight = Some(100), vec![], vec![]),
        case(
            "unset weight counts as 1",
            |s| {
                for b in &mut s.spec.backends {
                    b.weight = None;
                }
            },
            vec![],
            vec![],
        ),
        case("weight 0 drains a backend", |s| s.spec.backends[1].weight = Some(0), vec![], strings![drains(1, "v2")]),
        case(
            "all weights 0",
            |s| {
                for b in &mut s.spec.backends {
                    b.weight = Some(0);
                }
            },
            strings!["spec.backends: the sum of weights must be greater than 0, got 0"],
            strings![drains(0, "v1"), drains(1, "v2"), drains(2, "v3")],
        ),
        case(
            "a single backend with weight 0",
            |s| {
                s.spec.backends.truncate(1);
                s.spec.backends[0].weight = Some(0);
            },
            strings!["spec.backends: the sum of weights must be greater than 0, got 0"],
            strings![drains(0, "v1")],
        ),
        case(
            "no sum error while a weight is out of range",
            |s| {
                s.spec.backends[0].weight = Some(0);
                s.spec.backends[1].weight = Some(101);
                s.spec.backends[2].weight = Some(0);
            },
            strings!["spec.backends[1].weight: must be between 0 and 100, got 101"],
            strings![drains(0, "v1"), drains(2, "v3")],
        ),
        case("backend selectors alone suffice", |s| s.spec.selector = None, vec![], vec![]),
        case(
            "empty merged selector",
            |s| {
                s.spec.selector = None;
                s.spec.backends[1].selector = None;
            },
            strings![empty_merged_selector(1)],
            vec![],
        ),
        case(
            "empty maps on both levels",
            |s| {
                s.spec.selector = Some(BTreeMap::new());
                for b in &mut s.spec.backends {
                    b.selector = Some(BTreeMap::new());
                }
            },
            strings![empty_merged_selector(0), empty_merged_selector(1), empty_merged_selector(2)],
            vec![],
        ),
        case(
            "backends without selectors share spec.selector",
            |s| {
                for b in &mut s.spec.backends {
                    b.selector = None;
                }
            },
            vec![],
            strings![same_pods(1, 0), same_pods(2, 0)],
        ),
        case(
            "identical merged selectors",
            |s| s.spec.backends[2].selector = Some(labels(&[("version", "v1")])),
            vec![],
            strings![same_pods(2, 0)],
        ),
        case(
            "a selector of 32 labels, the bound",
            |s| s.spec.backends[1].selector = Some((0..32).map(|i| (format!("k{i}"), "v".to_string())).collect()),
            vec![],
            vec![],
        ),
        case(
            // Selectors over the bound are refused, and not compared (a cost a client would set).
            "two backends with the same oversized selector are refused, not compared",
            |s| {
                let oversized: BTreeMap<String, String> = (0..33).map(|i| (format!("k{i}"), "v".to_string())).collect();
                s.spec.backends[1].selector = Some(oversized.clone());
                s.spec.backends[2].selector = Some(oversized);
            },
            strings![
                "spec.backends[1].selector: must have at most 32 labels, got 33",
                "spec.backends[2].selector: must have at most 32 labels, got 33"
            ],
            vec![],
        ),
        case(
            "a backend restating spec.selector selects the same pods as one without a selector",
            |s| {
                s.spec.selector = Some(labels(&[("app", "test"), ("version", "v1")]));
                s.spec.backends[0].selector = None;
                s.spec.backends[1].selector = Some(labels(&[("app", "test")]));
            },
            vec![],
            strings![same_pods(1, 0)],
        ),
    ]);
}

#[test]
fn selector_rules() {
    run(vec![
        case(
            "label key with an uppercase prefix",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("Example.com/app".into(), "x".into());
            },
            strings![bad_key_prefix("spec.selector", "Example.com/app")],
            vec![],
        ),
        case(
            "label key with an empty prefix",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("/app".into(), "x".into());
            },
            strings![bad_key_prefix("spec.selector", "/app")],
            vec![],
        ),
        case(
            "label key with a 254-character prefix",
            |s| {
                s.spec.selector.as_mut().unwrap().insert(format!("{}/app", subdomain(254)), "x".into());
            },
            strings![bad_key_prefix("spec.selector", &format!("{}/app", subdomain(254)))],
            vec![],
        ),
        case(
            "label key with a 253-character prefix",
            |s| {
                s.spec.selector.as_mut().unwrap().insert(format!("{}/app", subdomain(253)), "x".into());
            },
            vec![],
            vec![],
        ),
        case(
            "label key whose name starts with a dash",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("-app".into(), "x".into());
            },
            strings![bad_key_name("spec.selector", "-app")],
            vec![],
        ),
        case(
            "label key with a space",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("my app".into(), "x".into());
            },
            strings![bad_key_name("spec.selector", "my app")],
            vec![],
        ),
        case(
            "label key with two slashes",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("example.com/a/b".into(), "x".into());
            },
            strings![bad_key_name("spec.selector", "example.com/a/b")],
            vec![],
        ),
        case(
            "label key with an empty name after the prefix",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("example.com/".into(), "x".into());
            },
            strings![bad_key_name("spec.selector", "example.com/")],
            vec![],
        ),
        case(
            "label key with a 64-character name",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("k".repeat(64), "x".into());
            },
            strings![bad_key_name("spec.selector", &"k".repeat(64))],
            vec![],
        ),
        case(
            "prefixed label key with a 63-character mixed-case name",
            |s| {
                s.spec
                    .selector
                    .as_mut()
                    .unwrap()
                    .insert(format!("example.com/A{}", "_.-b".repeat(15) + "cZ"), "x".into());
            },
            vec![],
            vec![],
        ),
        case(
            "label value starting with a dash",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("app".into(), "-test".into());
            },
            strings![bad_value("spec.selector", "app", "-test")],
            vec![],
        ),
        case(
            "64-character label value",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("app".into(), "v".repeat(64));
            },
            strings![bad_value("spec.selector", "app", &"v".repeat(64))],
            vec![],
        ),
        case(
            "label value with a slash",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("app".into(), "a/b".into());
            },
            strings![bad_value("spec.selector", "app", "a/b")],
            vec![],
        ),
        case(
            "empty label value",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("app".into(), String::new());
            },
            vec![],
            vec![],
        ),
        case(
            "bad key and bad value on the same label",
            |s| {
                s.spec.selector.as_mut().unwrap().insert("bad key".into(), "bad value".into());
            },
            strings![bad_key_name("spec.selector", "bad key"), bad_value("spec.selector", "bad key", "bad value"),],
            vec![],
        ),
        case(
            "invalid label key in a backend selector",
            |s| {
                s.spec.backends[1].selector.as_mut().unwrap().insert("_tier".into(), "web".into());
            },
            strings![bad_key_name("spec.backends[1].selector", "_tier")],
            vec![],
        ),
        case(
            "invalid label value in a backend selector",
            |s| {
                s.spec.backends[2].selector.as_mut().unwrap().insert("version".into(), "v 3".into());
            },
            strings![bad_value("spec.backends[2].selector", "version", "v 3")],
            vec![],
        ),
    ]);
}

#[test]
fn passive_health_and_timeout_rules() {
    run(vec![
        case(
            "every field set within bounds",
            |s| {
                s.spec.ports[0].connect_timeout = Some("100ms".into());
                s.spec.ports[0].idle_timeout = Some("24h".into());
                s.spec.backends[0].max_fails = Some(0);
                s.spec.backends[0].fail_timeout = Some("1h".into());
            },
            vec![],
            vec![],
        ),
        case(
            "out of bounds",
            |s| {
                s.spec.ports[0].connect_timeout = Some("6m".into());
                s.spec.ports[0].idle_timeout = Some("999ms".into());
                s.spec.backends[0].max_fails = Some(101);
                s.spec.backends[0].fail_timeout = Some("2h".into());
            },
            strings![
                "spec.ports[0].connectTimeout: must be between 100ms and 5m, got \"6m\"",
                "spec.ports[0].idleTimeout: must be between 1s and 24h, got \"999ms\"",
                "spec.backends[0].maxFails: must be between 0 and 100, got 101",
                "spec.backends[0].failTimeout: must be between 1s and 1h, got \"2h\""
            ],
            vec![],
        ),
        case(
            "not durations nginx reads",
            |s| {
                s.spec.ports[0].connect_timeout = Some("5 s".into());
                s.spec.backends[0].fail_timeout = Some("10s; evil".into());
            },
            strings![
                "spec.ports[0].connectTimeout: must be a number and a unit (ms, s, m or h), such as 5s, got \"5 s\"",
                "spec.backends[0].failTimeout: must be a number and a unit (ms, s, m or h), such as 5s, got \"10s; evil\""
            ],
            vec![],
        ),
    ]);
}

/// What nginx refuses about backups ("balancing method does not support parameter backup",
/// "no servers in upstream"), refused with the field that causes it.
#[test]
fn backup_and_connection_limit_rules() {
    run(vec![
        case(
            "a backup with round robin, a limit in range",
            |s| {
                s.spec.backends[2].backup = Some(true);
                s.spec.backends[0].max_connections = Some(1);
                s.spec.backends[1].max_connections = Some(1_000_000);
            },
            vec![],
            vec![],
        ),
        case(
            "a backup with LeastConnections",
            |s| {
                s.spec.backends[2].backup = Some(true);
                s.spec.algorithm = Some("LeastConnections".into());
            },
            vec![],
            vec![],
        ),
        case(
            "backup: false everywhere",
            |s| s.spec.backends.iter_mut().for_each(|b| b.backup = Some(false)),
            vec![],
            vec![],
        ),
        case(
            "a backup with ClientIP",
            |s| {
                s.spec.backends[1].backup = Some(true);
                s.spec.session_affinity = Some("ClientIP".into());
            },
            strings![
                "spec.backends[1].backup: cannot be used with sessionAffinity ClientIP, which has no fallback to a backup"
            ],
            vec![],
        ),
        case(
            "a backup with PowerOfTwoChoices",
            |s| {
                s.spec.backends[1].backup = Some(true);
                s.spec.algorithm = Some("PowerOfTwoChoices".into());
            },
            strings![
                "spec.backends[1].backup: cannot be used with algorithm PowerOfTwoChoices, which has no fallback to a \
                 backup"
            ],
            vec![],
        ),
        case(
            "every backend a backup",
            |s| s.spec.backends.iter_mut().for_each(|b| b.backup = Some(true)),
            strings![
                "spec.backends: at least one backend must not be a backup: backups take connections only when another \
                 backend cannot"
            ],
            vec![],
        ),
        case(
            "limits out of range",
            |s| {
                s.spec.backends[0].max_connections = Some(0);
                s.spec.backends[1].max_connections = Some(1_000_001);
            },
            strings![
                "spec.backends[0].maxConnections: must be between 1 and 1000000, got 0",
                "spec.backends[1].maxConnections: must be between 1 and 1000000, got 1000001"
            ],
            vec![],
        ),
    ]);
}

//! The shipped alerts, unit-tested by promtool. promtool reads rule files, not PrometheusRule
//! objects, so the rule groups are the PrometheusRule's own `spec.groups`, written out for it:
//! the rules tested are the rules shipped. `tests/alerts/rules.test.yaml` tests each alert.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::support;
use crate::support::repo::repo;

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(repo(path)).expect("a repository file");
    serde_saphyr::from_str(&text).expect("YAML")
}

/// The shipped PrometheusRule's rule groups.
fn rule_groups() -> Value {
    yaml("deploy/components/monitoring/prometheusrule.yaml")["spec"]["groups"].clone()
}

/// A folder holding the rule groups as `rules.yaml` and the unit tests beside them, as the
/// tests' `rule_files` names them.
fn promtool_folder() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("alerts");
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    // JSON is YAML: promtool reads it as a rule file.
    std::fs::write(dir.join("rules.yaml"), json!({"groups": rule_groups()}).to_string()).expect("rules written");
    std::fs::copy(repo("tests/alerts/rules.test.yaml"), dir.join("rules.test.yaml")).expect("tests copied");
    dir
}

fn promtool(dir: &Path, args: &[&str]) {
    let output = Command::new("promtool").args(args).current_dir(dir).output().expect("promtool runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "promtool {}:\n{text}", args.join(" "));
}

#[test]
fn the_shipped_rules_pass_promtool_check_and_their_unit_tests() {
    if !support::have_tool("promtool") {
        return;
    }
    let dir = promtool_folder();
    promtool(&dir, &["check", "rules", "rules.yaml"]);
    promtool(&dir, &["test", "rules", "rules.test.yaml"]);
}

/// `10m`, `1h`, `30s` in seconds.
fn seconds(duration: &str) -> u64 {
    let (number, unit) = duration.split_at(duration.len() - 1);
    let number: u64 = number.parse().unwrap_or_else(|_| panic!("a duration: {duration:?}"));
    number
        * match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            _ => panic!("a duration in s, m or h: {duration:?}"),
        }
}

/// Each alert's `for:` duration, in seconds.
fn alerts() -> BTreeMap<String, u64> {
    let groups = rule_groups();
    let rules = groups.as_array().expect("groups").iter().flat_map(|g| g["rules"].as_array().expect("rules").iter());
    rules
        .filter_map(|rule| Some((rule["alert"].as_str()?.to_string(), seconds(rule["for"].as_str().unwrap_or("0s")))))
        .collect()
}

/// Per alert, the evaluation times of its tests that expect it firing, and of those that
/// expect it silent.
fn tested() -> BTreeMap<String, (Vec<u64>, Vec<u64>)> {
    let mut tested: BTreeMap<String, (Vec<u64>, Vec<u64>)> = BTreeMap::new();
    let tests = yaml("tests/alerts/rules.test.yaml");
    for case in tests["tests"].as_array().expect("tests").iter().flat_map(|t| t["alert_rule_test"].as_array()) {
        for check in case {
            let entry = tested.entry(check["alertname"].as_str().expect("alertname").to_string()).or_default();
            let at = seconds(check["eval_time"].as_str().expect("eval_time"));
            let firing = check["exp_alerts"].as_array().is_some_and(|alerts| !alerts.is_empty());
            if firing { &mut entry.0 } else { &mut entry.1 }.push(at);
        }
    }
    tested
}

/// Every alert is tested firing once its condition held for its `for:` (the condition may
/// need the first evaluations to hold, a rate two samples), and silent one evaluation before.
#[test]
fn every_alert_is_tested_firing_at_its_duration_and_silent_just_before() {
    let tested = tested();
    let interval = seconds(yaml("tests/alerts/rules.test.yaml")["evaluation_interval"].as_str().expect("interval"));
    for (alert, duration) in alerts() {
        let (firing, silent) = tested.get(&alert).unwrap_or_else(|| panic!("{alert} has no test"));
        let fires_on_time = firing.iter().any(|at| (duration..=duration + 2 * interval).contains(at));
        assert!(fires_on_time, "{alert} (for {duration} s) is not tested firing on time: {firing:?}");
        let first = firing.iter().min().expect("a firing test");
        assert!(silent.contains(&(first - interval)), "{alert} is not tested silent at {} s", first - interval);
    }
}

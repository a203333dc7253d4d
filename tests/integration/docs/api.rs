//! `docs/api.md`, generated from the code: every field of both versions from the CRD that
//! `balancer crd` prints (types, bounds, descriptions from the doc comments), and every default
//! from the one defaulting code, since the CRD itself carries almost none. The test fails when
//! the file is not what the code generates, as `deploy/crd.yaml`'s does; regenerate it with
//! `BALANCER_REGENERATE=1 cargo test --test integration docs::api`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::support::repo::repo;

use balancer::api::BalancerSpec;
use balancer::spec::{SpecPolicy, with_defaults};
use serde_json::{Value, json};

/// Kubernetes' own types inside a Balancer: named and linked, not expanded.
const EMBEDDED: &[(&str, &str, &str)] = &[
    (
        "spec.proxy.affinity",
        "core/v1 Affinity",
        "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling",
    ),
    (
        "spec.proxy.resources",
        "core/v1 ResourceRequirements",
        "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#resources",
    ),
    (
        "spec.proxy.tolerations[]",
        "core/v1 Toleration",
        "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling",
    ),
    (
        "spec.proxy.topologySpreadConstraints[]",
        "core/v1 TopologySpreadConstraint",
        "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling",
    ),
    (
        "status.conditions[]",
        "meta/v1 Condition",
        "https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/object-meta/",
    ),
];

/// The CRD as `balancer crd` prints it.
fn crd() -> Value {
    serde_json::to_value(balancer::api::crd().expect("the versions merge")).expect("the CRD encodes")
}

/// One documented field.
struct Row {
    path: String,
    kind: String,
    bounds: Vec<String>,
    default: Option<String>,
    description: String,
}

/// The defaults the defaulting code writes, by field path (`[]` for any item): a spec with one
/// TCP and one UDP port and one backend, each without a field that has a default.
fn defaults() -> BTreeMap<String, String> {
    let bare = json!({
        "ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}],
        "backends": [{"name": "a", "selector": {"app": "a"}}]
    });
    let spec: BalancerSpec = serde_json::from_value(bare.clone()).expect("a spec");
    let default_policy = SpecPolicy::default();
    let other_policy = SpecPolicy { replicas: 7, ..SpecPolicy::default() };
    let defaulted = serde_json::to_value(with_defaults(&spec, &default_policy)).expect("encodes");
    let other = serde_json::to_value(with_defaults(&spec, &other_policy)).expect("encodes");
    let mut found: BTreeMap<String, Vec<(String, Value)>> = BTreeMap::new();
    added(&bare, &defaulted, "spec", &Value::Null, &mut found);
    let mut out = BTreeMap::new();
    for (path, values) in found {
        let text = describe_default(&path, &values, &defaulted, &other);
        out.insert(path, text);
    }
    out
}

/// Records the leaves `after` has that `before` lacks, with the list item they sit in.
fn added(before: &Value, after: &Value, at: &str, item: &Value, found: &mut BTreeMap<String, Vec<(String, Value)>>) {
    match after {
        Value::Object(fields) => {
            for (key, value) in fields {
                let before = before.get(key).unwrap_or(&Value::Null);
                let path = format!("{at}.{key}");
                match (before, value) {
                    (Value::Null, Value::Object(_)) => added(before, value, &path, item, found),
                    (Value::Null, _) => {
                        let value = value.to_string();
                        found.entry(path).or_default().push((value, item.clone()));
                    }
                    _ => added(before, value, &path, item, found),
                }
            }
        }
        Value::Array(items) => {
            for (i, value) in items.iter().enumerate() {
                let before = before.get(i).unwrap_or(&Value::Null);
                added(before, value, &format!("{at}[]"), value, found);
            }
        }
        _ => {}
    }
}

/// How a default reads: its value; the item's own `port` when it is that; by protocol when it
/// depends on it; the flag when the operator's policy sets it.
fn describe_default(path: &str, values: &[(String, Value)], defaulted: &Value, other: &Value) -> String {
    let field = path.rsplit('.').next().unwrap_or(path);
    if path == "spec.replicas" && defaulted["replicas"] != other["replicas"] {
        return format!("`--proxy-replicas` ({})", values[0].0);
    }
    if values.iter().all(|(value, item)| {
        item.get("port").is_some_and(|port| serde_json::from_str::<Value>(value).ok().as_ref() == Some(port))
    }) {
        return "the `port`".to_string();
    }
    let distinct: Vec<&String> =
        values.iter().map(|(v, _)| v).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    if distinct.len() == 1 {
        return format!("`{}`", distinct[0].trim_matches('"'));
    }
    // Otherwise the default must follow the port's protocol: one value per protocol.
    let mut by_protocol: BTreeMap<&str, &str> = BTreeMap::new();
    for (value, item) in values {
        let protocol = item["protocol"].as_str().unwrap_or_default();
        let previous = by_protocol.insert(protocol, value.trim_matches('"'));
        assert!(
            previous.is_none_or(|p| p == value.trim_matches('"')),
            "{field}: a default that depends on more than the port's protocol; teach describe_default"
        );
    }
    let shown: Vec<String> = by_protocol.iter().map(|(protocol, value)| format!("`{value}` ({protocol})")).collect();
    shown.join(", ")
}

/// Every field under `schema`, depth first, in the schema's (alphabetical) order.
fn walk(schema: &Value, path: &str, required: bool, defaults: &BTreeMap<String, String>, rows: &mut Vec<Row>) {
    let embedded = EMBEDDED.iter().find(|(p, _, _)| *p == path || p.strip_suffix("[]") == Some(path));
    let (kind, items) = kind_of(schema, embedded.map(|(_, name, url)| (*name, *url)));
    let mut bounds = bounds_of(schema);
    if required {
        bounds.insert(0, "required".into());
    }
    rows.push(Row {
        path: path.to_string(),
        kind,
        bounds,
        default: defaults.get(path).cloned(),
        description: description_of(schema),
    });
    if embedded.is_some() {
        return;
    }
    match items {
        Some(items) => walk_properties(items, &format!("{path}[]"), defaults, rows),
        None => walk_properties(schema, path, defaults, rows),
    }
}

/// The fields of an object (or of a list's items) at `path`.
fn walk_properties(schema: &Value, path: &str, defaults: &BTreeMap<String, String>, rows: &mut Vec<Row>) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return };
    let required: Vec<&str> =
        schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    for (name, field) in properties {
        walk(field, &format!("{path}.{name}"), required.contains(&name.as_str()), defaults, rows);
    }
}

/// The field's type as the docs say it, and its item schema when it is a list.
fn kind_of<'a>(schema: &'a Value, embedded: Option<(&str, &str)>) -> (String, Option<&'a Value>) {
    let linked = |name: &str, url: &str| format!("[{name}]({url})");
    if schema.get("x-kubernetes-int-or-string") == Some(&json!(true)) {
        return ("integer or string".into(), None);
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("array") => {
            let items = &schema["items"];
            let item = match embedded {
                Some((name, url)) => linked(name, url),
                None => kind_of(items, None).0,
            };
            (format!("list of {item}"), Some(items))
        }
        Some("object") if schema.get("additionalProperties").is_some() => {
            let value = kind_of(&schema["additionalProperties"], None).0;
            (format!("map of string to {value}"), None)
        }
        Some("object") => (embedded.map_or("object".into(), |(name, url)| linked(name, url)), None),
        Some("integer") => (schema.get("format").and_then(Value::as_str).unwrap_or("integer").to_string(), None),
        Some(other) => (other.to_string(), None),
        None => ("any".into(), None),
    }
}

fn bounds_of(schema: &Value) -> Vec<String> {
    let number = |key: &str| schema.get(key).and_then(Value::as_f64).map(|n| n.to_string());
    let mut bounds = Vec::new();
    match (number("minimum"), number("maximum")) {
        (Some(min), Some(max)) => bounds.push(format!("{min}–{max}")),
        (Some(min), None) => bounds.push(format!("≥ {min}")),
        (None, Some(max)) => bounds.push(format!("≤ {max}")),
        (None, None) => {}
    }
    match (number("minItems"), number("maxItems")) {
        (Some(min), Some(max)) => bounds.push(format!("{min}–{max} items")),
        (None, Some(max)) => bounds.push(format!("≤ {max} items")),
        (Some(min), None) => bounds.push(format!("≥ {min} items")),
        (None, None) => {}
    }
    if let Some(max) = number("maxLength") {
        bounds.push(format!("≤ {max} characters"));
    }
    if let Some(max) = number("maxProperties") {
        bounds.push(format!("≤ {max} entries"));
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values.iter().map(|v| format!("`{}`", v.as_str().unwrap_or_default())).collect();
        bounds.push(format!("one of {}", values.join(", ")));
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        bounds.push(format!("matches `{}`", pattern.replace('|', "\\|")));
    }
    bounds
}

/// The doc comment, on one line, for a table cell.
fn description_of(schema: &Value) -> String {
    let text = schema.get("description").and_then(Value::as_str).unwrap_or_default();
    text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

/// The whole page.
fn generate() -> String {
    let crd = crd();
    let defaults = defaults();
    let mut page = String::from(
        "# API reference\n\n\
         <!-- Generated from the code by tests/integration/docs/api.rs; do not edit. Regenerate with\n\
         `BALANCER_REGENERATE=1 cargo test --test integration docs::api`. -->\n\n\
         Group `exposer.hliangzhao.io`, kind `Balancer` (short name `bal`), namespaced. Types and bounds are\n\
         the CRD's, which the API server enforces; the webhooks' own rules are in\n\
         [Validation rules and limits](validation.md). Defaults are written by the mutating webhook (the\n\
         CRD carries almost none): a field left out is stored with its default. Kubernetes' own types are\n\
         linked, not expanded.\n",
    );
    let mut versions: Vec<&Value> = crd["spec"]["versions"].as_array().expect("versions").iter().collect();
    versions.sort_by_key(|v| std::cmp::Reverse(v["storage"] == json!(true)));
    for version in versions {
        let name = version["name"].as_str().expect("a name");
        let role = if version["storage"] == json!(true) { "stored" } else { "served, converted losslessly" };
        let _ = writeln!(page, "\n## {name} ({role})\n");
        let _ = writeln!(page, "| field | type | bounds | default | description |");
        let _ = writeln!(page, "|---|---|---|---|---|");
        let schema = &version["schema"]["openAPIV3Schema"];
        let mut rows = Vec::new();
        for part in ["spec", "status"] {
            if let Some(field) = schema["properties"].get(part) {
                walk(field, part, false, &defaults, &mut rows);
            }
        }
        for row in rows {
            let default = row.default.unwrap_or_default();
            let _ = writeln!(
                page,
                "| `{}` | {} | {} | {} | {} |",
                row.path,
                row.kind,
                row.bounds.join("; "),
                default,
                row.description
            );
        }
    }
    page
}

#[test]
fn the_api_reference_is_what_the_code_generates() {
    let path = repo("docs/api.md");
    let generated = generate();
    if std::env::var_os("BALANCER_REGENERATE").is_some() {
        std::fs::write(&path, &generated).expect("docs/api.md is writable");
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == generated,
        "docs/api.md is not what the code generates: run BALANCER_REGENERATE=1 cargo test --test integration docs::api"
    );
}

#[test]
fn every_default_is_documented_on_a_field_of_the_stored_version() {
    let page = generate();
    for (path, default) in defaults() {
        let row = page.lines().find(|l| l.starts_with(&format!("| `{path}` |")));
        let row = row.unwrap_or_else(|| panic!("{path} has a default but no row"));
        assert!(row.contains(&default), "{path}: {default} missing from {row}");
    }
}

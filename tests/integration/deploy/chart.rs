//! charts/balancer against deploy/: one installation, two tools. With default values the
//! chart renders the objects `kubectl kustomize deploy/` renders, so users never get two
//! different operators depending on how they installed it. The differences allowed are
//! Helm's own labels and the exceptions listed in `listed_exceptions`, each with its reason.
//! Gateway API's CRDs, which the chart installs only when asked (`gatewayAPI.crds.install`),
//! are rendered from a copy of the chart that its script fills, and checked against their files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Number, Value};

use crate::support;
use crate::support::repo::repo;

const CHART: &str = "charts/balancer";
const NAMESPACE: &str = "balancer-system";
const CRD: &str = "CustomResourceDefinition";

/// The labels Helm's conventions add to every object; kustomize has no release to name.
const HELM_LABELS: [&str; 4] =
    ["helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"];

/// Rendered objects keyed `Kind namespace/name`, so that order and text do not matter.
type Objects = BTreeMap<String, Value>;

/// `helm ARGS`, run from the repository's root.
fn helm(args: &[&str]) -> Output {
    Command::new("helm").args(args).current_dir(repo("")).output().expect("helm runs")
}

/// helm, and kubectl for the tests that compare with kustomize; without them the tests are
/// skipped, loudly outside CI.
fn have_tools(kustomize_too: bool) -> bool {
    support::have_tool("helm") && (!kustomize_too || support::have_tool("kubectl"))
}

/// `helm template` of the chart as release `balancer` in `namespace`, with `--set` `values`.
fn template_in(namespace: &str, values: &[&str]) -> Objects {
    template_chart(CHART, namespace, values)
}

/// `helm template` of the chart at `chart` (in the repository, or a path of its own) as
/// release `balancer` in `namespace`, with `--set` `values`.
fn template_chart(chart: &str, namespace: &str, values: &[&str]) -> Objects {
    let mut args = vec!["template", "balancer", chart, "--namespace", namespace];
    for value in values {
        args.extend(["--set", value]);
    }
    let output = helm(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "helm template {values:?} failed: {stderr}");
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("every rendered document parses");
    keyed(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn template(values: &[&str]) -> Objects {
    template_in(NAMESPACE, values)
}

/// kustomize re-encodes numbers (`100.0` becomes `100`), and so does Helm's `toYaml`; whole
/// floats become integers on both sides.
fn normalise(value: &mut Value) {
    match value {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15) {
                *n = Number::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalise),
        Value::Object(map) => map.values_mut().for_each(normalise),
        _ => {}
    }
}

fn keyed(docs: Vec<Value>) -> Objects {
    let mut objects = Objects::new();
    for mut doc in docs {
        normalise(&mut doc);
        let meta = &doc["metadata"];
        let key = format!(
            "{} {}/{}",
            doc["kind"].as_str().unwrap(),
            meta["namespace"].as_str().unwrap_or(""),
            meta["name"].as_str().unwrap()
        );
        assert!(objects.insert(key.clone(), doc).is_none(), "{key} is rendered twice");
    }
    objects
}

/// The chart's objects without Helm's labels, which every one of them must carry.
fn without_helm_labels(mut chart: Objects) -> Objects {
    for (key, object) in &mut chart {
        let labels = object["metadata"]["labels"].as_object_mut().unwrap_or_else(|| panic!("{key} has no labels"));
        for label in HELM_LABELS {
            assert!(labels.remove(label).is_some(), "{key} lacks the label {label}");
        }
    }
    chart
}

/// The differences between the chart's default objects and deploy/'s that are not Helm's
/// labels, each removed here with its reason; the rest must be equal.
fn listed_exceptions(chart: &mut Objects, kustomize: &mut Objects) {
    // Helm installs into a namespace that exists (or that `--create-namespace` makes) and
    // cannot own it: a chart's Namespace named like the release's conflicts with it. The
    // chart's NOTES and README say to add deploy/namespace.yaml's Pod Security label.
    let namespace = format!("Namespace /{NAMESPACE}");
    assert!(kustomize.remove(&namespace).is_some(), "deploy/ renders {namespace}");
    // kustomize's schema does not know the admission policy and its binding are cluster-scoped,
    // and gives them the namespace; the API server has none for them, and kubectl drops it.
    for kind in ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] {
        for name in ["balancer-proxy-identity", "balancer-proxy-workloads"] {
            let key = format!("{kind} {NAMESPACE}/{name}");
            let mut object = kustomize.remove(&key).unwrap_or_else(|| panic!("deploy/ renders {key}"));
            object["metadata"].as_object_mut().unwrap().remove("namespace");
            kustomize.insert(format!("{kind} /{name}"), object);
        }
    }
    // An uninstall must not delete the CRD, and with it every Balancer: cert-manager's chart
    // keeps its CRDs the same way. kustomize has no uninstall to survive.
    let crd = chart.get_mut(&format!("{CRD} /balancers.exposer.hliangzhao.io")).expect("the chart renders the CRD");
    let annotations = crd["metadata"]["annotations"].as_object_mut().unwrap();
    assert_eq!(annotations.remove("helm.sh/resource-policy"), Some(Value::from("keep")));
    if annotations.is_empty() {
        crd["metadata"].as_object_mut().unwrap().remove("annotations");
    }
}

/// The first place where `a` and `b` differ, as a JSON pointer with both values.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(a), Some(b)) => first_difference(a, b, &format!("{at}/{k}")),
                (a, b) => Some(format!("{at}/{k}: chart {}, kustomize {}", missing_or(a), missing_or(b))),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (x, y))| first_difference(x, y, &format!("{at}/{i}")))
        }
        _ if a == b => None,
        _ => Some(format!("{at}: chart {}, kustomize {}", short(a), short(b))),
    }
}

fn missing_or(value: Option<&Value>) -> String {
    value.map_or("(missing)".into(), short)
}

/// `value` as JSON, cut short: a differing CRD schema would fill the screen.
fn short(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(300) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    }
}

fn assert_same(chart: &Objects, kustomize: &Objects) {
    let only = |a: &Objects, b: &Objects| a.keys().filter(|k| !b.contains_key(*k)).cloned().collect::<Vec<_>>();
    assert_eq!(only(chart, kustomize), Vec::<String>::new(), "objects only the chart renders");
    assert_eq!(only(kustomize, chart), Vec::<String>::new(), "objects only kustomize renders");
    let differences: Vec<String> = chart
        .iter()
        .filter_map(|(key, object)| first_difference(object, &kustomize[key], "").map(|d| format!("{key} at {d}")))
        .collect();
    assert!(differences.is_empty(), "the chart and kustomize differ:\n{}", differences.join("\n"));
}

/// The chart rendered with `values` and deploy/ with `components`, without Helm's labels and
/// the listed exceptions; `None` when the tools are missing.
fn chart_and_kustomize(values: &[&str], components: &[&str]) -> Option<(Objects, Objects)> {
    if !have_tools(true) {
        return None;
    }
    let mut chart = without_helm_labels(template(values));
    let mut kustomize = match components {
        [] => keyed(support::kustomize(&repo("deploy"))),
        _ => keyed(support::kustomize_deploy_with(&format!("chart-{}", components.join("-")), components)),
    };
    listed_exceptions(&mut chart, &mut kustomize);
    Some((chart, kustomize))
}

/// `helm lint --strict` fails on warnings too, such as a template that renders badly.
#[test]
fn helm_lint_strict_passes() {
    if !have_tools(false) {
        return;
    }
    let output = helm(&["lint", "--strict", CHART]);
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The chart's version and the operator's it installs by default are the crate's.
#[test]
fn chart_version_and_app_version_are_the_crates() {
    let chart: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(repo(CHART).join("Chart.yaml")).unwrap()).unwrap();
    assert_eq!((&chart["apiVersion"], &chart["name"]), (&Value::from("v2"), &Value::from("balancer")));
    assert_eq!(chart["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
}

/// The heart of it: default values install exactly deploy/ (RBAC, hardening, webhooks, CRD).
#[test]
fn default_values_render_what_kustomize_renders() {
    let Some((chart, kustomize)) = chart_and_kustomize(&[], &[]) else { return };
    assert_same(&chart, &kustomize);
}

/// `monitoring.enabled` adds what deploy/components/monitoring adds.
#[test]
fn monitoring_renders_what_the_monitoring_component_adds() {
    let Some((chart, kustomize)) = chart_and_kustomize(&["monitoring.enabled=true"], &["monitoring"]) else { return };
    assert_same(&chart, &kustomize);
}

/// `certificates.certManager: false` renders what deploy/components/without-cert-manager
/// does: no cert-manager object, no CA injection; the user supplies the Secret and the CA.
#[test]
fn supplied_certificates_render_what_without_cert_manager_renders() {
    let Some((chart, kustomize)) = chart_and_kustomize(&["certificates.certManager=false"], &["without-cert-manager"])
    else {
        return;
    };
    assert_same(&chart, &kustomize);
}

/// With a supplied caBundle, it reaches the three clients of the webhook Service.
#[test]
fn a_supplied_ca_bundle_reaches_both_webhooks_and_the_crd() {
    if !have_tools(false) {
        return;
    }
    let chart = template(&["certificates.certManager=false", "certificates.caBundle=Q0E="]);
    let crd = &chart[&format!("{CRD} /balancers.exposer.hliangzhao.io")];
    assert_eq!(crd["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"], "Q0E=");
    for key in
        ["MutatingWebhookConfiguration /balancer-mutating", "ValidatingWebhookConfiguration /balancer-validating"]
    {
        assert_eq!(chart[key]["webhooks"][0]["clientConfig"]["caBundle"], "Q0E=", "{key}");
    }
}

/// The CRD, the webhooks, the certificate's names and the RBAC subjects all name the
/// release's namespace: nothing is left pointing at balancer-system.
#[test]
fn another_release_namespace_is_followed_everywhere() {
    if !have_tools(false) {
        return;
    }
    let chart = template_in("elsewhere", &["monitoring.enabled=true"]);
    for (key, object) in &chart {
        assert!(!object.to_string().contains(NAMESPACE), "{key} still names {NAMESPACE}");
    }
    let crd = &chart[&format!("{CRD} /balancers.exposer.hliangzhao.io")];
    assert_eq!(crd["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], "elsewhere/balancer-serving-cert");
    assert_eq!(crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["namespace"], "elsewhere");
}

/// The admission policies hold the operator's ServiceAccount wherever it is installed: deploy/
/// under an overlay that moves it to another namespace (kustomize's `namespace` never reaches
/// into a CEL expression), and the chart in another release namespace.
#[test]
fn the_admission_policies_follow_the_operator_into_another_namespace() {
    const CONDITION: &str = "request.userInfo.username.startsWith('system:serviceaccount:') && \
                             request.userInfo.username.endsWith(':balancer')";
    if !have_tools(true) {
        return;
    }
    let overlay = support::kustomize_overlay("policies-elsewhere", "namespace: elsewhere\nresources: [@deploy@]\n");
    let chart: Vec<Value> = template_in("elsewhere", &[]).into_values().collect();
    for (what, docs) in [("deploy/ under an overlay", overlay), ("the chart", chart)] {
        let account = support::find(&docs, "ServiceAccount", "balancer");
        assert_eq!(account["metadata"]["namespace"], "elsewhere", "{what}");
        let username = "system:serviceaccount:elsewhere:balancer";
        assert!(username.starts_with("system:serviceaccount:") && username.ends_with(":balancer"));
        for name in ["balancer-proxy-identity", "balancer-proxy-workloads"] {
            let policy = support::find(&docs, "ValidatingAdmissionPolicy", name);
            let condition = &policy["spec"]["matchConditions"][0]["expression"];
            assert_eq!(condition, CONDITION, "{what}: {name} holds {username} by this condition alone");
        }
    }
}

/// The proxy defaults and the watched namespace become `balancer run`'s flags, and a watched
/// namespace binds the operator's role in that namespace only.
#[test]
fn proxy_and_scope_values_become_the_operators_flags() {
    if !have_tools(false) {
        return;
    }
    let chart = template(&[
        "proxy.image=registry.example.com/nginx:1.28",
        "proxy.replicas=3",
        "proxy.loadModules={/usr/lib/nginx/modules/ngx_stream_module.so}",
        "proxy.allowedImages={registry.example.com/nginx/}",
        "proxy.scheduling.allowedPriorityClasses={balancer-proxy,system-cluster-critical}",
        "proxy.scheduling.allowedPodAnnotationPrefixes={prometheus.io/}",
        "proxy.metrics.enabled=false",
        "watchNamespace=shop",
    ]);
    let container = &chart[&format!("Deployment {NAMESPACE}/balancer")]["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for flag in [
        "--namespace=shop",
        "--proxy-image=registry.example.com/nginx:1.28",
        "--proxy-replicas=3",
        "--proxy-load-module=/usr/lib/nginx/modules/ngx_stream_module.so",
        "--allowed-proxy-images=registry.example.com/nginx/",
        "--allowed-priority-classes=balancer-proxy,system-cluster-critical",
        "--allowed-pod-annotation-prefixes=prometheus.io/",
    ] {
        assert!(args.contains(&flag), "{flag} not in {args:?}");
    }
    let unset = ["--allowed-node-label-keys", "--allowed-toleration-keys"];
    assert!(!args.iter().any(|a| unset.iter().any(|u| a.starts_with(u))), "unset values give no flag: {args:?}");
    assert!(!container["env"].to_string().contains("BALANCER_PROXY_METRICS_IMAGE"), "no sidecar without metrics");
    assert!(!chart.contains_key("ClusterRoleBinding /balancer-manager"), "no cluster-wide manager binding");
    assert_eq!(chart["RoleBinding shop/balancer-manager"]["roleRef"]["name"], "balancer-manager");
    assert!(
        chart.contains_key("ClusterRoleBinding /balancer-metrics-auth"),
        "token and access reviews stay cluster-wide"
    );
}

/// values.schema.json is strict: a misspelt key or a wrong type stops `helm template`,
/// naming the value, instead of being silently ignored.
#[test]
fn the_schema_refuses_unknown_keys_and_wrong_types() {
    if !have_tools(false) {
        return;
    }
    for (value, says) in [
        ("replica=3", "additional properties 'replica' not allowed"),
        ("proxy.replicas=many", "/proxy/replicas"),
        ("proxy.replicas=101", "/proxy/replicas"),
        ("certificates.certmanager=false", "additional properties 'certmanager' not allowed"),
        ("gatewayAPI.crds.install=yes", "/gatewayAPI/crds/install"),
        ("gatewayApi.crds.install=true", "additional properties 'gatewayApi' not allowed"),
    ] {
        let output = helm(&["template", "balancer", CHART, "--namespace", NAMESPACE, "--set", value]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "--set {value} was accepted");
        assert!(
            stderr.contains("values don't meet the specifications of the schema") && stderr.contains(says),
            "--set {value}: {stderr}"
        );
    }
}

/// The chart reads copies of files it cannot reach outside its folder: the CRD, exactly what
/// `balancer crd` prints (as deploy/crd.yaml is), and the monitoring component's alert rules and
/// dashboard. Each must be byte-for-byte its source.
#[test]
fn the_charts_files_are_copies_of_their_sources() {
    let crd = Command::new(env!("CARGO_BIN_EXE_balancer")).arg("crd").output().unwrap();
    assert!(crd.status.success());
    let copy = |path: &str| std::fs::read(repo(CHART).join("files").join(path)).unwrap();
    assert!(
        copy("crd.yaml") == crd.stdout,
        "charts/balancer/files/crd.yaml is stale: run `cargo run -- crd | tee deploy/crd.yaml > charts/balancer/files/crd.yaml`"
    );
    for file in ["dashboard.json", "prometheusrule.yaml"] {
        let source = format!("deploy/components/monitoring/{file}");
        assert!(
            copy(file) == std::fs::read(repo(&source)).unwrap(),
            "charts/balancer/files/{file} is stale: run `cp {source} charts/balancer/files/`"
        );
    }
}

/// `networkPolicy.webhookSources` renders what the overlay docs/security.md shows for
/// `kubectl apply -k` renders: port 9443 admitted from the given sources only, the metrics and
/// probe ports as before.
#[test]
fn webhook_sources_render_what_the_documented_overlay_renders() {
    if !have_tools(true) {
        return;
    }
    const CIDR: &str = "172.18.0.0/16";
    let docs = std::fs::read_to_string(repo("docs/security.md")).expect("docs/security.md");
    let overlay = docs
        .split("```yaml\n")
        .find(|block| block.starts_with("# my-balancer/kustomization.yaml"))
        .and_then(|block| block.split("```").next())
        .expect("docs/security.md shows the overlay that restricts the webhook port");
    assert!(overlay.contains(CIDR), "the overlay admits {CIDR}: {overlay}");
    let chart_value = format!("networkPolicy.webhookSources=[{{\"ipBlock\":{{\"cidr\":\"{CIDR}\"}}}}]");
    assert!(docs.contains(&format!("--set-json '{chart_value}'")), "docs/security.md shows the chart's value");

    let mut kustomize = keyed(support::kustomize_overlay("webhook-sources", &overlay.replace("../deploy", "@deploy@")));
    let mut chart = without_helm_labels(objects_with_json(&chart_value));
    listed_exceptions(&mut chart, &mut kustomize);
    assert_same(&chart, &kustomize);
    let policy = &chart[&format!("NetworkPolicy {NAMESPACE}/balancer")]["spec"]["ingress"];
    assert_eq!(policy[0]["ports"][0]["port"], 9443);
    assert_eq!(policy[0]["from"], serde_json::json!([{"ipBlock": {"cidr": CIDR}}]));
    assert!(policy[1].get("from").is_none(), "metrics and probes from anywhere: {policy}");
    let default = &template(&[])[&format!("NetworkPolicy {NAMESPACE}/balancer")]["spec"]["ingress"];
    assert!(default[0].get("from").is_none(), "by default the webhook port admits any source: {default}");
}

/// `helm template` with one `--set-json` value.
fn objects_with_json(value: &str) -> Objects {
    let output = helm(&["template", "balancer", CHART, "--namespace", NAMESPACE, "--set-json", value]);
    assert!(output.status.success(), "helm template --set-json {value}: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("every rendered document parses");
    keyed(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// Gateway API's standard-channel CRDs, as `tests/kubernetes/gateway-api.sh --cached` has
/// them (one file per CRD); without them the tests that render them are skipped, loudly, and
/// under `.ci/run` (which fetches them first and sets `BALANCER_REQUIRE_TOOLS`), they fail.
fn gateway_api_crds() -> Option<PathBuf> {
    let output =
        Command::new("bash").arg(repo("tests/kubernetes/gateway-api.sh")).arg("--cached").output().expect("bash runs");
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        support::skip(&format!(
            "Gateway API's CRDs are not cached ({}); run `bash tests/kubernetes/gateway-api.sh`",
            stderr.trim()
        ));
        return None;
    }
    Some(PathBuf::from(String::from_utf8(output.stdout).expect("UTF-8").trim()))
}

/// A copy of the chart, as `<temporary directory>/balancer`, without its gateway-api/: the
/// tests fill it themselves, whatever the work tree's holds.
fn chart_copy() -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
    let dir = tempfile::TempDir::new().expect("a temporary directory");
    copy(&repo(CHART), &dir.path().join("balancer"));
    let _ = std::fs::remove_dir_all(dir.path().join("balancer/gateway-api"));
    dir
}

/// The YAML files of `dir`, by name.
fn yaml_files(dir: &Path) -> BTreeMap<String, Value> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name.ends_with(".yaml") {
            let mut doc: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{name} parses: {e}"));
            normalise(&mut doc);
            files.insert(name, doc);
        }
    }
    files
}

/// The rendered CRDs of Gateway API's group, by name.
fn gateway_api_crds_of(chart: &Objects) -> BTreeMap<String, Value> {
    chart
        .values()
        .filter(|o| o["kind"] == CRD && o["spec"]["group"] == "gateway.networking.k8s.io")
        .map(|o| (o["metadata"]["name"].as_str().unwrap().to_string(), o.clone()))
        .collect()
}

const CRDS_CHECKSUM: &str = "balancer.exposer.hliangzhao.io/gateway-api-crds";

/// The annotation of the operator's pod template that rolls it with Gateway API's CRDs.
fn crds_checksum(chart: &Objects) -> Option<String> {
    let template = &chart[&format!("Deployment {NAMESPACE}/balancer")]["spec"]["template"]["metadata"];
    template["annotations"][CRDS_CHECKSUM].as_str().map(str::to_string)
}

/// `gatewayAPI.crds.install`, with the chart's gateway-api/ filled by gateway-api-crds.sh:
/// exactly the CRDs of the directory, each as its file with the chart's labels and
/// `helm.sh/resource-policy: keep` added; nothing else but the operator's pods rolling with
/// them. Off, a filled directory renders nothing.
#[test]
fn gateway_api_crds_render_as_their_files_and_are_kept() {
    if !have_tools(false) {
        return;
    }
    let Some(cache) = gateway_api_crds() else { return };
    let copy = chart_copy();
    let chart = copy.path().join("balancer");
    let crds_dir = chart.join("gateway-api");
    let script = Command::new("bash")
        .arg(repo(CHART).join("gateway-api-crds.sh"))
        .arg("--cached")
        .arg(&crds_dir)
        .output()
        .expect("bash runs");
    assert!(script.status.success(), "gateway-api-crds.sh: {}", String::from_utf8_lossy(&script.stderr));
    let files = yaml_files(&crds_dir);
    let fetched = yaml_files(&cache);
    assert!(files.len() >= 6, "GatewayClass, Gateway, the routes and ReferenceGrant at least: {:?}", files.keys());
    assert!(files == fetched, "gateway-api-crds.sh copies gateway-api.sh's CRDs as they are: {:?}", files.keys());

    let chart = chart.to_str().unwrap();
    let on = template_chart(chart, NAMESPACE, &["gatewayAPI.crds.install=true"]);
    let rendered = gateway_api_crds_of(&on);
    let names: BTreeSet<&str> = files.values().map(|f| f["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(rendered.keys().map(String::as_str).collect::<BTreeSet<_>>(), names, "exactly the directory's CRDs");
    let chart_labels = on[&format!("Deployment {NAMESPACE}/balancer")]["metadata"]["labels"].clone();
    for file in files.values() {
        let name = file["metadata"]["name"].as_str().unwrap();
        let mut crd = rendered[name].clone();
        let metadata = crd["metadata"].as_object_mut().unwrap();
        let annotations = metadata["annotations"].as_object_mut().unwrap();
        assert_eq!(annotations.remove("helm.sh/resource-policy"), Some(Value::from("keep")), "{name}");
        let labels = metadata["labels"].as_object_mut().unwrap();
        for label in HELM_LABELS.iter().copied().chain(["app.kubernetes.io/part-of"]) {
            assert_eq!(labels.remove(label).as_ref(), Some(&chart_labels[label]), "{name}: {label}");
        }
        if labels.is_empty() {
            metadata.remove("labels");
        }
        assert_eq!(first_difference(&crd, file, ""), None, "{name} is its file, but for the labels and keep");
    }

    let off = template_chart(chart, NAMESPACE, &[]);
    assert!(gateway_api_crds_of(&off).is_empty(), "a filled gateway-api/ renders nothing while the value is off");
    assert_eq!(crds_checksum(&off), None, "nor rolls the operator");
    let checksum = crds_checksum(&on).expect("the operator's pods roll with Gateway API's CRDs");
    let mut rest = on.clone();
    rest.retain(|_, o| !(o["kind"] == CRD && o["spec"]["group"] == "gateway.networking.k8s.io"));
    let pod = &mut rest.get_mut(&format!("Deployment {NAMESPACE}/balancer")).unwrap()["spec"]["template"]["metadata"];
    pod.as_object_mut().unwrap().remove("annotations");
    assert_eq!(rest.keys().collect::<Vec<_>>(), off.keys().collect::<Vec<_>>(), "the value adds the CRDs only");
    for (key, object) in &rest {
        assert_eq!(
            first_difference(object, &off[key], ""),
            None,
            "{key}: the value adds the pod template's checksum only"
        );
    }

    let lint = helm(&["lint", "--strict", chart, "--set", "gatewayAPI.crds.install=true"]);
    assert!(
        lint.status.success(),
        "{}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );

    // One CRD fewer: it is no longer rendered, and the operator's pods roll.
    let (dropped, file) = files.iter().find(|(_, f)| f["spec"]["names"]["kind"] == "HTTPRoute").expect("HTTPRoute's");
    std::fs::remove_file(crds_dir.join(dropped)).unwrap();
    let fewer = template_chart(chart, NAMESPACE, &["gatewayAPI.crds.install=true"]);
    let name = file["metadata"]["name"].as_str().unwrap();
    assert!(!gateway_api_crds_of(&fewer).contains_key(name), "{name} is still rendered");
    assert_eq!(gateway_api_crds_of(&fewer).len(), files.len() - 1);
    assert_ne!(crds_checksum(&fewer), Some(checksum), "the pod template's checksum follows the CRDs");
}

/// `gatewayAPI.crds.install` without the CRDs (gateway-api/ missing or empty, as in a fresh
/// clone) stops `helm template`, saying to run the script; so does a file that is no Gateway
/// API CRD.
#[test]
fn gateway_api_crds_without_their_files_fail_saying_to_run_the_script() {
    if !have_tools(false) {
        return;
    }
    let copy = chart_copy();
    let chart = copy.path().join("balancer");
    let crds_dir = chart.join("gateway-api");
    let render = || {
        let output = helm(&[
            "template",
            "balancer",
            chart.to_str().unwrap(),
            "--namespace",
            NAMESPACE,
            "--set",
            "gatewayAPI.crds.install=true",
        ]);
        assert!(!output.status.success(), "rendered: {}", String::from_utf8_lossy(&output.stdout));
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    for state in ["missing", "empty"] {
        if state == "empty" {
            std::fs::create_dir(&crds_dir).unwrap();
        }
        let stderr = render();
        assert!(
            stderr.contains("gatewayAPI.crds.install is true, but the chart's gateway-api/ holds no CRD")
                && stderr.contains("run charts/balancer/gateway-api-crds.sh first"),
            "gateway-api/ {state}: {stderr}"
        );
    }
    std::fs::write(crds_dir.join("other.yaml"), "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other}\n").unwrap();
    let stderr = render();
    assert!(stderr.contains("gateway-api/other.yaml is not a Gateway API CRD"), "{stderr}");
}

/// The Gateway API commands docs/install.md and the chart's README show are the ones the tests
/// run, and the version they name is gateway-api.sh's.
#[test]
fn the_documented_gateway_api_crds_are_the_tested_ones() {
    let script = std::fs::read_to_string(repo("tests/kubernetes/gateway-api.sh")).unwrap();
    let version = script.lines().find_map(|l| l.strip_prefix("version=")).expect("gateway-api.sh names its version");
    for page in ["docs/install.md", "charts/balancer/README.md"] {
        let text = std::fs::read_to_string(repo(page)).unwrap();
        let commands: String = text.split("```sh\n").skip(1).filter_map(|b| b.split("```").next()).collect();
        for command in [
            "charts/balancer/gateway-api-crds.sh ",
            "helm install balancer charts/balancer --namespace balancer-system --set gatewayAPI.crds.install=true\n",
        ] {
            assert!(commands.contains(command), "{page} shows `{command}`");
        }
        assert!(text.contains(&format!("({version}, ")), "{page} names Gateway API {version}");
    }
    let values = std::fs::read_to_string(repo(CHART).join("values.yaml")).unwrap();
    assert!(values.contains("gatewayAPI:\n  crds:\n"), "values.yaml documents gatewayAPI.crds");
}

//! deploy/: renders with `kubectl kustomize`, and its pieces agree with each other,
//! with the server's routes and flags, and with what the controller uses.

use std::collections::BTreeSet;

use balancer::deploy::{
    CLUSTER_PERMISSIONS, LEADER_ELECTION_PERMISSIONS, Permission, SIGNING_PERMISSIONS, SIGNING_ROLE, SIGNING_SECRET,
};
use serde_json::{Value, json};

use crate::support;
use crate::support::find;
use crate::support::repo::repo;

/// The rendered installation, or `None` (skipped loudly outside CI) without kubectl.
fn rendered() -> Option<Vec<Value>> {
    if !support::have_tool("kubectl") {
        return None;
    }
    Some(support::kustomize(&repo("deploy")))
}

fn container(docs: &[Value]) -> &Value {
    &find(docs, "Deployment", "balancer")["spec"]["template"]["spec"]["containers"][0]
}

/// The value of `--flag=value` in the container's args.
fn flag(docs: &[Value], name: &str) -> String {
    let prefix = format!("--{name}=");
    container(docs)["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("the Deployment does not set --{name}"))
        .to_string()
}

#[test]
fn everything_is_namespaced_in_balancer_system_and_labelled() {
    let Some(docs) = rendered() else { return };
    let cluster_scoped = [
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ];
    for doc in &docs {
        let kind = doc["kind"].as_str().unwrap();
        if !cluster_scoped.contains(&kind) {
            assert_eq!(doc["metadata"]["namespace"], "balancer-system", "{kind} {}", doc["metadata"]["name"]);
        }
        assert_eq!(doc["metadata"]["labels"]["app.kubernetes.io/part-of"], "balancer");
    }
    // kustomize re-encodes numbers (100.0 becomes 100), so compare what matters; the file
    // itself is checked against `balancer crd` in tests/integration/cli.rs.
    let crd = find(&docs, "CustomResourceDefinition", "balancers.exposer.hliangzhao.io");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["bal"]));
    let versions = crate::support::crd_versions(crd);
    assert_eq!(versions, [("v1beta1", true, true), ("v1alpha1", true, false)], "v1beta1 stored, both served");
    assert_eq!(
        crd["spec"]["versions"][0]["subresources"],
        json!({"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                                     "labelSelectorPath": ".status.selector"}})
    );
    assert_eq!(crd["spec"]["versions"][1]["subresources"], json!({"status": {}}));
}

#[test]
fn webhooks_service_certificate_and_deployment_agree() {
    let Some(docs) = rendered() else { return };
    let (service, certificate) = support::webhook_service_and_certificate(&docs);
    let deployment = find(&docs, "Deployment", "balancer");
    let pod = &deployment["spec"]["template"]["spec"];

    // The CRD's conversion webhook → the same Service, with the CA cert-manager injects from the
    // serving Certificate (the one whose Secret the Deployment mounts, checked below).
    let crd = find(&docs, "CustomResourceDefinition", "balancers.exposer.hliangzhao.io");
    assert_eq!(
        crd["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "balancer-system/balancer-serving-cert"
    );
    assert_eq!(crd["spec"]["conversion"]["strategy"], "Webhook");
    let conversion = &crd["spec"]["conversion"]["webhook"];
    assert_eq!(
        conversion["clientConfig"]["service"],
        json!({"name": "balancer-webhook", "namespace": "balancer-system", "path": "/convert", "port": 443})
    );
    assert_eq!(conversion["conversionReviewVersions"], json!(["v1"]));
    assert_eq!(service["metadata"]["name"], crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["name"]);

    // Webhooks → Service: name, namespace, port; Service → container port → --webhook-addr.
    for (kind, name, path) in [
        ("ValidatingWebhookConfiguration", "balancer-validating", "/validate"),
        ("MutatingWebhookConfiguration", "balancer-mutating", "/mutate"),
    ] {
        let config = find(&docs, kind, name);
        assert_eq!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "balancer-system/balancer-serving-cert"
        );
        let webhooks = config["webhooks"].as_array().unwrap();
        assert_eq!(webhooks.len(), 1);
        let hook = &webhooks[0];
        assert_eq!(
            hook["clientConfig"]["service"],
            json!({"name": "balancer-webhook", "namespace": "balancer-system", "path": path, "port": 443})
        );
        assert_eq!(hook["admissionReviewVersions"], json!(["v1"]));
        assert_eq!(hook["sideEffects"], "None");
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(hook["matchPolicy"], "Equivalent");
        assert!(hook["timeoutSeconds"].as_i64().unwrap() <= 10);
        // Only Balancers: the webhooks can never block core resources or the operator's own namespace.
        // Registered for v1beta1 only: with matchPolicy Equivalent the API server converts a
        // v1alpha1 write to v1beta1 (through /convert) before calling them.
        assert_eq!(
            hook["rules"],
            json!([{"apiGroups": ["exposer.hliangzhao.io"], "apiVersions": ["v1beta1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["balancers"], "scope": "Namespaced"}])
        );
    }
    let webhook_port = service["spec"]["ports"].as_array().unwrap().iter().find(|p| p["port"] == 443).unwrap();
    let target = webhook_port["targetPort"].as_str().unwrap();
    let container_port = container(&docs)["ports"].as_array().unwrap().iter().find(|p| p["name"] == target).unwrap();
    let addr = flag(&docs, "webhook-addr");
    assert_eq!(addr.rsplit(':').next().unwrap(), container_port["containerPort"].to_string());
    assert_eq!(service["spec"]["selector"], deployment["spec"]["selector"]["matchLabels"]);

    // Certificate: valid for the Service's DNS names, stored where the Deployment mounts it from.
    let dns: Vec<&str> =
        certificate["spec"]["dnsNames"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(dns, ["balancer-webhook.balancer-system.svc", "balancer-webhook.balancer-system.svc.cluster.local"]);
    let secret = certificate["spec"]["secretName"].as_str().unwrap();
    let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["secret"]["secretName"] == secret).unwrap();
    let mount =
        container(&docs)["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == volume["name"]).unwrap();
    let dir = mount["mountPath"].as_str().unwrap();
    assert_eq!(flag(&docs, "tls-cert"), format!("{dir}/tls.crt"));
    assert_eq!(flag(&docs, "tls-key"), format!("{dir}/tls.key"));
    assert!(certificate["spec"]["renewBefore"].is_string(), "rotation before expiry");

    // The Service's metrics port leads to --metrics-addr.
    let metrics_port = service["spec"]["ports"].as_array().unwrap().iter().find(|p| p["name"] == "metrics").unwrap();
    let metrics_target = metrics_port["targetPort"].as_str().unwrap();
    let metrics_container =
        container(&docs)["ports"].as_array().unwrap().iter().find(|p| p["name"] == metrics_target).unwrap();
    assert_eq!(flag(&docs, "metrics-addr").rsplit(':').next().unwrap(), metrics_container["containerPort"].to_string());

    // Probes hit the probe port's routes.
    let probe_addr = flag(&docs, "probe-addr");
    let probes = container(&docs)["ports"].as_array().unwrap().iter().find(|p| p["name"] == "probes").unwrap();
    assert_eq!(probe_addr.rsplit(':').next().unwrap(), probes["containerPort"].to_string());
    assert_eq!(container(&docs)["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container(&docs)["readinessProbe"]["httpGet"]["path"], "/readyz");
}

#[test]
fn the_operator_pods_are_hardened_and_highly_available() {
    let Some(docs) = rendered() else { return };
    let deployment = find(&docs, "Deployment", "balancer");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = container(&docs);
    assert_eq!(deployment["spec"]["replicas"], 2);
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(args.contains(&"--leader-elect") && args.contains(&"--require-controller"), "{args:?}");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(container["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(container["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert!(container["resources"]["requests"].is_object() && container["resources"]["limits"].is_object());
    assert!(pod["topologySpreadConstraints"].is_array());
    assert_eq!(pod["serviceAccountName"], "balancer");
    let pdb = find(&docs, "PodDisruptionBudget", "balancer");
    assert_eq!(pdb["spec"]["selector"], deployment["spec"]["selector"]);
    let policy = find(&docs, "NetworkPolicy", "balancer");
    assert_eq!(policy["spec"]["podSelector"], deployment["spec"]["selector"]);
    // The webhook port's rule comes first, so that an overlay can restrict its sources alone.
    let rules = policy["spec"]["ingress"].as_array().unwrap();
    let ports: Vec<Vec<i64>> = rules
        .iter()
        .map(|rule| rule["ports"].as_array().unwrap().iter().map(|p| p["port"].as_i64().unwrap()).collect())
        .collect();
    assert_eq!(ports, [vec![9443], vec![8443, 8080]]);
    assert!(rules.iter().all(|rule| rule.get("from").is_none()), "any source by default: {rules:?}");
    assert_eq!(
        find(&docs, "Namespace", "balancer-system")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
}

/// Turns RBAC rules into (group, resource, verb) triples.
fn grants(rules: &Value) -> BTreeSet<(String, String, String)> {
    let mut set = BTreeSet::new();
    for rule in rules.as_array().unwrap() {
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    set.insert((
                        group.as_str().unwrap().into(),
                        resource.as_str().unwrap().into(),
                        verb.as_str().unwrap().into(),
                    ));
                }
            }
        }
    }
    set
}

fn expected(permissions: &[Permission]) -> BTreeSet<(String, String, String)> {
    permissions
        .iter()
        .flat_map(|(g, r, verbs)| verbs.iter().map(move |v| (g.to_string(), r.to_string(), v.to_string())))
        .collect()
}

/// The shipped RBAC grants every verb the controller uses, and no more.
#[test]
fn rbac_grants_exactly_what_the_controller_uses() {
    let Some(docs) = rendered() else { return };
    assert_eq!(grants(&find(&docs, "ClusterRole", "balancer-manager")["rules"]), expected(CLUSTER_PERMISSIONS));
    assert_eq!(
        grants(&find(&docs, "Role", "balancer-leader-election")["rules"]),
        expected(LEADER_ELECTION_PERMISSIONS)
    );
    let signing = &find(&docs, "Role", SIGNING_ROLE)["rules"];
    assert_eq!(grants(signing), expected(SIGNING_PERMISSIONS));
    let named = |verb: &str| signing.as_array().unwrap().iter().find(|r| r["verbs"] == json!([verb])).cloned();
    assert_eq!(named("get").expect("a get rule")["resourceNames"], json!([SIGNING_SECRET]), "the one Secret");
    for (kind, name, role) in [
        ("ClusterRoleBinding", "balancer-manager", "balancer-manager"),
        ("RoleBinding", "balancer-leader-election", "balancer-leader-election"),
        ("RoleBinding", SIGNING_ROLE, SIGNING_ROLE),
    ] {
        let binding = find(&docs, kind, name);
        assert_eq!(binding["roleRef"]["name"], role);
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "balancer", "namespace": "balancer-system"}])
        );
    }
    let editor = find(&docs, "ClusterRole", "balancer-editor");
    assert_eq!(editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"], "true");
    let reader = &find(&docs, "ClusterRole", "balancer-metrics-reader")["rules"];
    assert_eq!(reader, &json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]));
    let viewer = grants(&find(&docs, "ClusterRole", "balancer-viewer")["rules"]);
    assert!(viewer.iter().all(|(_, _, verb)| ["get", "list", "watch"].contains(&verb.as_str())));

    // Users who may edit Balancers may scale them (`kubectl scale bal/x`, an HPA's owner);
    // viewers may read the scale.
    let triple =
        |resource: &str, verb: &str| ("exposer.hliangzhao.io".to_string(), resource.to_string(), verb.to_string());
    let editor = grants(&editor["rules"]);
    for verb in ["get", "update", "patch"] {
        assert!(editor.contains(&triple("balancers/scale", verb)), "editor: {verb} balancers/scale");
    }
    for verb in ["get", "list", "watch"] {
        assert!(viewer.contains(&triple("balancers/scale", verb)), "viewer: {verb} balancers/scale");
        assert!(viewer.contains(&triple("balancers", verb)), "viewer: {verb} balancers");
    }
    assert!(!viewer.contains(&triple("balancers/scale", "update")));

    // Canary control is the status subresource: its own role, aggregated nowhere, since a status
    // write reaches every status field; editors only read the status.
    let canary = find(&docs, "ClusterRole", "balancer-canary");
    let labels = canary["metadata"]["labels"].as_object().cloned().unwrap_or_default();
    assert!(!labels.keys().any(|k| k.starts_with("rbac.authorization.k8s.io/aggregate-to")), "{labels:?}");
    let canary = grants(&canary["rules"]);
    assert!(canary.contains(&triple("balancers/status", "patch")) && canary.contains(&triple("balancers", "get")));
    assert!(!editor.contains(&triple("balancers/status", "patch")), "editors cannot steer a canary");
}

/// Without cert-manager, docs/install.md's overlay (deploy/ plus the without-cert-manager component)
/// leaves out exactly the cert-manager objects and the CA injection annotations.
#[test]
fn the_without_cert_manager_component_leaves_out_exactly_the_cert_manager_objects() {
    let Some(docs) = rendered() else { return };
    let overlay = tempfile::TempDir::new().expect("temp dir");
    // Kustomize takes only relative paths to other kustomizations: up to / and down again.
    let up = "../".repeat(overlay.path().components().count() - 1);
    let deploy = format!("{up}{}", repo("deploy").display().to_string().trim_start_matches('/'));
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        format!("resources: [{deploy}]\ncomponents: [{deploy}/components/without-cert-manager]\n"),
    )
    .unwrap();
    let without = support::kustomize(overlay.path());

    let needs_cert_manager = |d: &&Value| d["apiVersion"].as_str().unwrap().starts_with("cert-manager.io/");
    let labelled: Vec<&str> = docs
        .iter()
        .filter(|d| d["metadata"]["labels"]["balancer.exposer.hliangzhao.io/requires"] == "cert-manager")
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    assert_eq!(labelled, ["Certificate", "Certificate", "Issuer", "Issuer"]);
    assert_eq!(docs.iter().filter(needs_cert_manager).count(), 4);
    assert_eq!(without.iter().filter(needs_cert_manager).count(), 0);
    let mut expected: Vec<Value> = docs.iter().filter(|d| !needs_cert_manager(d)).cloned().collect();
    for doc in &mut expected {
        let metadata = doc["metadata"].as_object_mut().unwrap();
        if let Some(annotations) = metadata.get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.remove("cert-manager.io/inject-ca-from");
            if annotations.is_empty() {
                metadata.remove("annotations");
            }
        }
    }
    assert_eq!(without.len(), expected.len());
    for (got, want) in without.iter().zip(&expected) {
        assert!(got == want, "{} {} differs from deploy/'s", want["kind"], want["metadata"]["name"]);
    }
}

/// The paths the webhook configurations and the CRD's conversion call are routes the real
/// server answers, with the review each sends.
#[tokio::test]
async fn webhook_paths_are_served() {
    let Some(docs) = rendered() else { return };
    let server = support::TestServer::start().await;
    for kind in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
        let config = docs.iter().find(|d| d["kind"] == kind).unwrap();
        let path = config["webhooks"][0]["clientConfig"]["service"]["path"].as_str().unwrap();
        let review = support::review("CREATE", support::fixtures::sample_json());
        let response = server.client().post(server.url(path)).json(&review).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200, "{kind} calls {path}");
    }
    let crd = find(&docs, "CustomResourceDefinition", "balancers.exposer.hliangzhao.io");
    let path = crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["path"].as_str().unwrap();
    let review =
        support::conversion_review("exposer.hliangzhao.io/v1beta1", vec![support::fixtures::sample_v1alpha1()]);
    let response = server.client().post(server.url(path)).json(&review).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200, "the CRD's conversion calls {path}");
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["response"]["result"]["status"], "Success", "{answer}");
    server.stop().await;
}

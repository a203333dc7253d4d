//! The test objects, written once: the Go project's sample Balancer, read from
//! `deploy/samples/balancer.yaml` (one HTTP port split 40/20/40 over three backends), and
//! builder-style variants of it, as controller-rs's `Document::test().finalized()`.

use std::collections::BTreeMap;

use balancer::api::{BackendSpec, Balancer, BalancerPort, BalancerSpec};
use balancer::proxy::ProxySettings;
use balancer::proxy::model::Destination;
use balancer::spec::{Admitted, ObjectName, SpecPolicy, admit, with_defaults};
use serde_json::{Value, json};

/// The sample's name.
pub const SAMPLE: &str = "example-balancer";

/// The sample as the Go project wrote it (v1alpha1), in namespace `default`.
pub fn sample_v1alpha1() -> Value {
    let text = include_str!("../../deploy/samples/balancer.yaml");
    let mut sample: Value = serde_saphyr::from_str(text).expect("the sample is YAML");
    sample["metadata"]["namespace"] = json!("default");
    sample
}

/// The sample in the version the operator works on: what the API server sends the webhooks
/// (registered for v1beta1, with `matchPolicy: Equivalent`) and what the controller reads.
pub fn sample_json() -> Value {
    let mut sample = sample_v1alpha1();
    sample["apiVersion"] = json!("exposer.hliangzhao.io/v1beta1");
    sample
}

/// The least a user writes: the sample's first port and backend, without a field that has a
/// default, and without a namespace.
pub fn minimal_json() -> Value {
    let mut sample = sample_json();
    sample["metadata"] = json!({"name": SAMPLE});
    sample["spec"]["ports"] = json!([{"name": "http", "port": 80}]);
    sample["spec"]["backends"] = json!([{"name": "v1", "selector": {"version": "v1"}}]);
    sample
}

/// The sample, typed (v1beta1).
pub fn sample() -> Balancer {
    serde_json::from_value(sample_json()).expect("the sample is a Balancer")
}

/// The sample's spec.
pub fn sample_spec() -> BalancerSpec {
    sample().spec
}

/// Variants of a Balancer, each a step towards how the cluster holds it.
pub trait BalancerVariants: Sized {
    /// Stored by the API server: in `namespace`, with `uid` and generation 1.
    fn stored(self, namespace: &str, uid: &str) -> Self;
    /// With its defaults filled in under `policy`, as the mutating webhook leaves it.
    fn defaulted(self, policy: &SpecPolicy) -> Self;
}

impl BalancerVariants for Balancer {
    fn stored(mut self, namespace: &str, uid: &str) -> Self {
        self.metadata.namespace = Some(namespace.into());
        self.metadata.uid = Some(uid.into());
        self.metadata.generation = Some(1);
        self
    }

    fn defaulted(mut self, policy: &SpecPolicy) -> Self {
        self.spec = with_defaults(&self.spec, policy);
        self
    }
}

/// `spec` through the one spec pipeline, named `name`; fixtures are valid, so a report panics.
pub fn admitted(name: &str, spec: BalancerSpec, policy: &SpecPolicy) -> Admitted {
    admit(ObjectName::Name(name), spec, policy).unwrap_or_else(|report| panic!("a valid fixture: {:?}", report.errors))
}

/// A port of `protocol` at `number`, named `name`; its target port left to the defaults.
pub fn port(name: Option<&str>, protocol: &str, number: i32) -> BalancerPort {
    BalancerPort { name: name.map(str::to_string), protocol: Some(protocol.into()), port: number, ..Default::default() }
}

/// A backend `name` of weight `weight`, selecting the pods labelled `version: <name>`.
/// A backend at `<backend name>:<port>`: a stand-in address for a rendering that is only read.
pub fn named(backend: &BackendSpec, port: &BalancerPort) -> Destination {
    Destination::Name { host: backend.name.clone(), port: u16::try_from(port.port).expect("a port") }
}

pub fn backend(name: &str, weight: i32) -> BackendSpec {
    BackendSpec {
        name: name.into(),
        weight: Some(weight),
        selector: Some(BTreeMap::from([("version".into(), name.into())])),
        ..Default::default()
    }
}

/// The proxy settings of `balancer run` with its default image, and `replicas` proxy pods for
/// a Balancer that does not say.
pub fn proxy_settings(replicas: i32) -> ProxySettings {
    ProxySettings {
        image: "nginxinc/nginx-unprivileged:1.28.0-alpine".into(),
        load_modules: Vec::new(),
        metrics_image: None,
        policy: SpecPolicy { replicas, ..SpecPolicy::default() },
        signer: None,
    }
}

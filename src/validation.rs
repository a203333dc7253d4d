//! The Balancer admission rules, as pure functions.
//!
//! Every violation is collected (never just the first), each as
//! `<field path>: <problem>`, the way the API server reports field errors.
//! Rules see the object *after* defaulting, as the validating webhook does.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::api::v1beta1::ProxySpec;
use crate::api::{
    self, BalancerSpec, EXTERNAL_TRAFFIC_POLICIES, MAX_ANNOTATION_VALUE_LEN, MAX_ANNOTATIONS_BYTES, MAX_BACKENDS,
    MAX_MAX_FAILS, MAX_PORTS, MAX_REPLICAS, MAX_SELECTOR_LABELS, MAX_SERVICE_ANNOTATIONS, MAX_SOURCE_RANGES,
    MAX_SPREAD_CONSTRAINTS, MAX_TOLERATIONS, MAX_WEIGHT, PROTOCOLS, SERVICE_TYPES, SESSION_AFFINITIES,
};
use crate::defaulting::SpecPolicy;
use crate::echo::{MAX_QUOTED_BYTES, cut, quoted};

/// Longest DNS-1123 / DNS-1035 label, and so longest Service name.
pub const MAX_LABEL_LEN: usize = 63;
/// Longest DNS-1123 subdomain.
pub const MAX_SUBDOMAIN_LEN: usize = 253;
/// Longest IANA service name (a named `targetPort`).
pub const MAX_IANA_SVC_NAME_LEN: usize = 15;
/// Longest Balancer name: the shortest backend Service name `<name>-x-backend` must fit 63 characters.
pub const MAX_BALANCER_NAME_LEN: usize = MAX_LABEL_LEN - 2 - api::BACKEND_SERVICE_SUFFIX.len();
/// Characters `generateName` gets appended by the API server.
const GENERATED_SUFFIX_LEN: usize = 5;

/// One rule violation at one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the offending field, e.g. `spec.backends[1].weight`.
    pub field: String,
    /// What is wrong with it.
    pub detail: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

/// The verdict on one Balancer: hard errors and legal-but-suspicious warnings.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub errors: Vec<FieldError>,
    pub warnings: Vec<String>,
}

impl Report {
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }

    fn error(&mut self, field: impl Into<String>, detail: impl Into<String>) {
        self.errors.push(FieldError { field: field.into(), detail: detail.into() });
    }
}

/// The Balancer's name as the validating webhook sees it: `metadata.name`,
/// or `metadata.generateName` plus the suffix the API server will add.
#[derive(Debug, Clone, Copy)]
pub enum ObjectName<'a> {
    Name(&'a str),
    GenerateName(&'a str),
    Unknown,
}

impl<'a> ObjectName<'a> {
    pub fn from_meta(name: Option<&'a str>, generate_name: Option<&'a str>) -> Self {
        match (name.filter(|n| !n.is_empty()), generate_name.filter(|n| !n.is_empty())) {
            (Some(name), _) => ObjectName::Name(name),
            (None, Some(prefix)) => ObjectName::GenerateName(prefix),
            (None, None) => ObjectName::Unknown,
        }
    }

    /// The final name for messages; generated characters show as `?`.
    fn display(&self) -> String {
        match self {
            ObjectName::Name(n) => n.to_string(),
            ObjectName::GenerateName(p) => format!("{p}{}", "?".repeat(GENERATED_SUFFIX_LEN)),
            ObjectName::Unknown => String::new(),
        }
    }

    /// Length of the final name, when it can be known.
    fn len(&self) -> Option<usize> {
        match self {
            ObjectName::Name(n) => Some(n.len()),
            ObjectName::GenerateName(p) => Some(p.len() + GENERATED_SUFFIX_LEN),
            ObjectName::Unknown => None,
        }
    }
}

/// Checks a Balancer (already defaulted) against every rule; `policy` says which proxy
/// images it may choose.
pub fn validate(name: ObjectName<'_>, spec: &BalancerSpec, policy: &SpecPolicy) -> Report {
    let mut report = Report::default();
    validate_proxy(spec.proxy.as_ref(), policy, &mut report);
    validate_name(name, &mut report);
    validate_replicas(spec.replicas, &mut report);
    validate_session_affinity(spec.session_affinity.as_deref(), &mut report);
    validate_ports(spec, &mut report);
    validate_service(spec, &mut report);
    validate_selector(&"spec.selector", spec.selector.as_ref(), &mut report);
    validate_backends(name, spec, &mut report);
    report
}

fn validate_replicas(replicas: Option<i32>, report: &mut Report) {
    if let Some(n) = replicas.filter(|n| !(0..=MAX_REPLICAS).contains(n)) {
        report.error("spec.replicas", format!("must be between 0 and {MAX_REPLICAS}, got {n}"));
    }
}

fn validate_session_affinity(affinity: Option<&str>, report: &mut Report) {
    if let Some(affinity) = affinity.filter(|a| !SESSION_AFFINITIES.contains(a)) {
        report.error("spec.sessionAffinity", format!("must be None or ClientIP, got {}", quoted(affinity)));
    }
}

fn validate_name(name: ObjectName<'_>, report: &mut Report) {
    let (field, shown) = match name {
        ObjectName::Name(n) => ("metadata.name", n),
        ObjectName::GenerateName(p) => ("metadata.generateName", p),
        ObjectName::Unknown => return,
    };
    // The name is the front-end Service's name, which must be a DNS-1035 label;
    // a generateName prefix may end in '-' because a suffix follows it.
    let candidate = match name {
        ObjectName::GenerateName(p) => format!("{p}x"),
        _ => shown.to_string(),
    };
    if !is_dns1035_label(&candidate) {
        report.error(
            field,
            format!(
                "must be a DNS-1035 label because it names the front-end Service \
                 (lowercase letters, digits and '-', starting with a letter and ending with a letter or digit), got {}",
                quoted(shown)
            ),
        );
    }
    if let Some(len) = name.len().filter(|&l| l > MAX_BALANCER_NAME_LEN) {
        report.error(
            field,
            format!(
                "must be at most {MAX_BALANCER_NAME_LEN} characters so that child names \
                 (\"<name>-<backend>-backend\") fit in {MAX_LABEL_LEN}, got {len}"
            ),
        );
    }
}

fn validate_ports(spec: &BalancerSpec, report: &mut Report) {
    let ports = &spec.ports;
    if ports.is_empty() {
        report.error("spec.ports", "must have at least one port");
    }
    if ports.len() > MAX_PORTS {
        // Checking each of an unbounded list would let one request cost unbounded time and memory.
        report.error("spec.ports", format!("must have at most {MAX_PORTS} ports, got {}", ports.len()));
        return;
    }
    let mut names: Vec<(&str, usize)> = Vec::with_capacity(ports.len());
    let mut pairs: Vec<((i32, &str), usize)> = Vec::with_capacity(ports.len());
    for (i, port) in ports.iter().enumerate() {
        let at = Item("ports", i);
        if !(1..=65535).contains(&port.port) {
            report.error(format!("{at}.port"), format!("must be between 1 and 65535, got {}", port.port));
        }
        let protocol = port.effective_protocol();
        if !PROTOCOLS.contains(&protocol) {
            report.error(format!("{at}.protocol"), format!("must be TCP or UDP, got {}", quoted(protocol)));
        }
        match port.name.as_deref().filter(|n| !n.is_empty()) {
            None if ports.len() > 1 => {
                report.error(format!("{at}.name"), "is required when there is more than one port")
            }
            None => {}
            Some(name) => {
                if !is_dns1123_label(name) {
                    report.error(format!("{at}.name"), dns1123_label_problem(name));
                }
                if let Some(first) = first_seen(&mut names, name, i) {
                    report.error(
                        format!("{at}.name"),
                        format!("duplicate port name {} (also spec.ports[{first}].name)", quoted(name)),
                    );
                }
            }
        }
        if let Some(first) = first_seen(&mut pairs, (port.port, protocol), i) {
            report.error(at.to_string(), format!("duplicate port {}/{protocol} (also spec.ports[{first}])", port.port));
        }
        validate_target_port(at, port.target_port.as_ref(), report);
        validate_duration(
            &format_args!("{at}.connectTimeout"),
            port.connect_timeout.as_deref(),
            CONNECT_TIMEOUT,
            report,
        );
        validate_duration(&format_args!("{at}.idleTimeout"), port.idle_timeout.as_deref(), IDLE_TIMEOUT, report);
    }
}

/// `spec.service`, and the ports' `nodePort`s, which only some Service types have.
fn validate_service(spec: &BalancerSpec, report: &mut Report) {
    let kind = spec.service_type();
    if !SERVICE_TYPES.contains(&kind) {
        let detail = format!("must be ClusterIP, NodePort or LoadBalancer, got {}", quoted(kind));
        report.error("spec.service.type", detail);
    }
    let load_balancer = kind == "LoadBalancer";
    let node_ports = load_balancer || kind == "NodePort";
    let only = |types: &str| format!("applies to type {types} only, and the type is {}", quoted(kind));
    if spec.ports.len() <= MAX_PORTS {
        let mut seen: Vec<((i32, &str), usize)> = Vec::new();
        for (i, port) in spec.ports.iter().enumerate() {
            let Some(node_port) = port.node_port else { continue };
            let at = format!("{}.nodePort", Item("ports", i));
            if !node_ports {
                report.error(at, only("NodePort or LoadBalancer"));
            } else if !(1..=65535).contains(&node_port) {
                report.error(at, format!("must be between 1 and 65535, got {node_port}"));
            } else if let Some(first) = first_seen(&mut seen, (node_port, port.effective_protocol()), i) {
                report.error(at, format!("duplicate node port {node_port} (also spec.ports[{first}].nodePort)"));
            }
        }
    }
    let Some(service) = &spec.service else { return };
    if let Some(class) = &service.load_balancer_class {
        if !load_balancer {
            report.error("spec.service.loadBalancerClass", only("LoadBalancer"));
        } else if let Err(problem) = check_label_key(class) {
            let detail = format!("must be a label-style key such as example.com/lb ({problem}), got {}", quoted(class));
            report.error("spec.service.loadBalancerClass", detail);
        }
    }
    if let Some(policy) = &service.external_traffic_policy {
        if !node_ports {
            report.error("spec.service.externalTrafficPolicy", only("NodePort or LoadBalancer"));
        } else if !EXTERNAL_TRAFFIC_POLICIES.contains(&policy.as_str()) {
            report.error(
                "spec.service.externalTrafficPolicy",
                format!("must be Cluster or Local, got {}", quoted(policy)),
            );
        }
    }
    let ranges = service.load_balancer_source_ranges.as_deref().unwrap_or_default();
    if !ranges.is_empty() && !load_balancer {
        report.error("spec.service.loadBalancerSourceRanges", only("LoadBalancer"));
    } else if ranges.len() > MAX_SOURCE_RANGES {
        let detail = format!("must have at most {MAX_SOURCE_RANGES} CIDRs, got {}", ranges.len());
        report.error("spec.service.loadBalancerSourceRanges", detail);
    } else {
        for (i, range) in ranges.iter().enumerate().filter(|(_, r)| !is_cidr(r)) {
            let detail = format!("must be a CIDR such as 10.0.0.0/8 or fd00::/8, got {}", quoted(range));
            report.error(format!("spec.service.loadBalancerSourceRanges[{i}]"), detail);
        }
    }
    validate_annotations("spec.service.annotations", service.annotations.as_ref(), report);
}

/// What an UPDATE may not change: the API server refuses to change a LoadBalancer Service's
/// `loadBalancerClass` (set or unset included), so the controller could never apply it.
pub fn unchangeable(old: &BalancerSpec, new: &BalancerSpec) -> Vec<FieldError> {
    let class = |spec: &BalancerSpec| spec.service.as_ref().and_then(|s| s.load_balancer_class.clone());
    let load_balancer = |spec: &BalancerSpec| spec.service_type() == "LoadBalancer";
    if load_balancer(old) && load_balancer(new) && class(old) != class(new) {
        let detail = "may not change while the type is LoadBalancer (Kubernetes refuses it on the Service): \
                      set the type to ClusterIP first, then to LoadBalancer with the new class";
        return vec![FieldError { field: "spec.service.loadBalancerClass".into(), detail: detail.into() }];
    }
    Vec::new()
}

/// `spec.proxy`: the image against the operator's allowlist, and the fields the API server
/// would otherwise refuse only on the Deployment, where the user would not see why.
fn validate_proxy(proxy: Option<&ProxySpec>, policy: &SpecPolicy, report: &mut Report) {
    let Some(proxy) = proxy else { return };
    if let Some(image) = &proxy.image {
        validate_image(image, &policy.allowed_images, report);
    }
    validate_selector(&"spec.proxy.nodeSelector", proxy.node_selector.as_ref(), report);
    validate_annotations("spec.proxy.podAnnotations", proxy.pod_annotations.as_ref(), report);
    if let Some(class) = proxy.priority_class_name.as_deref().filter(|c| !is_dns1123_subdomain(c)) {
        let detail = format!("must be a DNS-1123 subdomain (a PriorityClass name), got {}", quoted(class));
        report.error("spec.proxy.priorityClassName", detail);
    }
    let tolerations = proxy.tolerations.as_ref().map_or(0, Vec::len);
    if tolerations > MAX_TOLERATIONS {
        report.error(
            "spec.proxy.tolerations",
            format!("must have at most {MAX_TOLERATIONS} tolerations, got {tolerations}"),
        );
    }
    let spread = proxy.topology_spread_constraints.as_ref().map_or(0, Vec::len);
    if spread > MAX_SPREAD_CONSTRAINTS {
        let detail = format!("must have at most {MAX_SPREAD_CONSTRAINTS} constraints, got {spread}");
        report.error("spec.proxy.topologySpreadConstraints", detail);
    }
    let resources = proxy.resources.iter().flat_map(|r| [("limits", &r.limits), ("requests", &r.requests)]);
    for (kind, quantities) in resources {
        for (name, quantity) in quantities.iter().flatten().filter(|(_, q)| !is_quantity(&q.0)) {
            let at = format!("spec.proxy.resources.{kind}[{}]", cut(name, MAX_QUOTED_BYTES));
            report.error(at, format!("must be a quantity such as 100m, 1, 64Mi or 1G, got {}", quoted(&quantity.0)));
        }
    }
}

/// A per-Balancer image runs with the operator's authority: only with the installer's consent.
fn validate_image(image: &str, allowed: &[String], report: &mut Report) {
    let at = "spec.proxy.image";
    if allowed.is_empty() {
        let detail = "is not allowed: this operator runs every proxy with its own --proxy-image, since the \
                      image would run with the operator's authority; the installer can allow image prefixes \
                      with --allowed-proxy-images";
        report.error(at, detail);
    } else if !allowed.iter().any(|prefix| image_under(image, prefix)) {
        let prefixes: Vec<String> = allowed.iter().map(|p| quoted(p)).collect();
        let detail = format!(
            "must start with one of the prefixes the operator allows (--allowed-proxy-images): {}; got {}",
            prefixes.join(", "),
            quoted(image)
        );
        report.error(at, detail);
    } else if image.is_empty() || image.contains(|c: char| c.is_whitespace() || c.is_control()) {
        report.error(at, format!("must be an image reference without spaces, got {}", quoted(image)));
    }
}

/// Whether `image` lies under `prefix` at a boundary: `registry.example.com/nginx` admits
/// `registry.example.com/nginx:1.27` and `registry.example.com/nginx/stream`, not
/// `registry.example.com/nginx-evil` (nor, for `registry.example.com`, `registry.example.com.evil.io/x`).
fn image_under(image: &str, prefix: &str) -> bool {
    let Some(rest) = image.strip_prefix(prefix) else { return false };
    prefix.ends_with(['/', ':', '@']) || rest.is_empty() || rest.starts_with(['/', ':', '@'])
}

/// A Kubernetes quantity's form: a decimal number, then an optional SI, binary or exponent suffix.
fn is_quantity(text: &str) -> bool {
    let number_end =
        text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let number = number.strip_prefix(['+', '-']).unwrap_or(number);
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    let well_formed = digits > 0
        && number.bytes().filter(|b| *b == b'.').count() <= 1
        && number.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    let suffix_ok =
        matches!(suffix, "" | "m" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei")
            || suffix.strip_prefix(['e', 'E']).is_some_and(|exp| {
                let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
                !exp.is_empty() && exp.bytes().all(|b| b.is_ascii_digit())
            });
    well_formed && suffix_ok && text.len() <= 64
}

fn validate_annotations(at: &str, annotations: Option<&BTreeMap<String, String>>, report: &mut Report) {
    let len = annotations.map_or(0, BTreeMap::len);
    if len > MAX_SERVICE_ANNOTATIONS {
        report.error(at, format!("must have at most {MAX_SERVICE_ANNOTATIONS} annotations, got {len}"));
        return;
    }
    let total: usize = annotations.into_iter().flatten().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_ANNOTATIONS_BYTES {
        report
            .error(at, format!("must be at most {MAX_ANNOTATIONS_BYTES} bytes in all (keys and values), got {total}"));
    }
    for (key, value) in annotations.into_iter().flatten() {
        if let Err(problem) = check_label_key(key) {
            report.error(at, format!("invalid annotation key {}: {problem}", quoted(key)));
        }
        if value.len() > MAX_ANNOTATION_VALUE_LEN {
            report.error(
                format!("{at}[{}]", cut(key, MAX_QUOTED_BYTES)),
                format!("must be at most {MAX_ANNOTATION_VALUE_LEN} bytes, got {}", value.len()),
            );
        }
    }
}

/// An address and a prefix length that fits it (`10.0.0.0/8`, `fd00::/8`), as Kubernetes'
/// `loadBalancerSourceRanges` takes them.
fn is_cidr(text: &str) -> bool {
    let Some((ip, prefix)) = text.split_once('/') else { return false };
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let (Ok(ip), Ok(prefix)) = (ip.parse::<std::net::IpAddr>(), prefix.parse::<u8>()) else { return false };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    prefix <= max
}

/// Bounds of a duration field, in milliseconds, with how they are written in messages.
struct DurationBounds {
    min: (u64, &'static str),
    max: (u64, &'static str),
}

const CONNECT_TIMEOUT: DurationBounds = DurationBounds { min: (100, "100ms"), max: (300_000, "5m") };
const IDLE_TIMEOUT: DurationBounds = DurationBounds { min: (1_000, "1s"), max: (86_400_000, "24h") };
const FAIL_TIMEOUT: DurationBounds = DurationBounds { min: (1_000, "1s"), max: (3_600_000, "1h") };

fn validate_duration(field: &dyn fmt::Display, value: Option<&str>, bounds: DurationBounds, report: &mut Report) {
    let Some(text) = value else { return };
    let (min, max) = (bounds.min, bounds.max);
    match api::duration_millis(text) {
        None => report.error(
            field.to_string(),
            format!("must be a number and a unit (ms, s, m or h), such as 5s, got {}", quoted(text)),
        ),
        Some(ms) if ms < min.0 || ms > max.0 => {
            report.error(field.to_string(), format!("must be between {} and {}, got {}", min.1, max.1, quoted(text)))
        }
        Some(_) => {}
    }
}

fn validate_target_port(at: Item, target: Option<&IntOrString>, report: &mut Report) {
    match target {
        Some(IntOrString::Int(n)) if !(1..=65535).contains(n) => {
            report.error(format!("{at}.targetPort"), format!("must be between 1 and 65535, got {n}"));
        }
        Some(IntOrString::String(s)) if !is_iana_svc_name(s) => {
            report.error(
                format!("{at}.targetPort"),
                format!(
                    "must be a port number or an IANA service name (at most {MAX_IANA_SVC_NAME_LEN} \
                     lowercase letters, digits and '-', with at least one letter), got {}",
                    quoted(s)
                ),
            );
        }
        _ => {}
    }
}

fn validate_backends(name: ObjectName<'_>, spec: &BalancerSpec, report: &mut Report) {
    let backends = &spec.backends;
    if backends.is_empty() {
        report.error("spec.backends", "must have at least one backend");
    }
    if backends.len() > MAX_BACKENDS {
        report.error("spec.backends", format!("must have at most {MAX_BACKENDS} backends, got {}", backends.len()));
        return;
    }
    // Merged selectors are only compared when every selector is within bounds.
    let selectors_bounded = selector_len(spec.selector.as_ref()) <= MAX_SELECTOR_LABELS
        && backends.iter().all(|b| selector_len(b.selector.as_ref()) <= MAX_SELECTOR_LABELS);
    let mut names: Vec<(&str, usize)> = Vec::with_capacity(backends.len());
    // Merged selectors seen so far, with a fingerprint so that most comparisons are one integer.
    let mut selectors: Vec<(usize, u64, BTreeMap<&str, &str>)> = Vec::with_capacity(backends.len());
    for (i, backend) in backends.iter().enumerate() {
        let at = Item("backends", i);
        if !is_dns1123_label(&backend.name) {
            report.error(format!("{at}.name"), dns1123_label_problem(&backend.name));
        }
        if let Some(first) = first_seen(&mut names, backend.name.as_str(), i) {
            report.error(
                format!("{at}.name"),
                format!("duplicate backend name {} (also spec.backends[{first}].name)", quoted(&backend.name)),
            );
        }
        if let Some(len) = name.len() {
            let service_len = len + 1 + backend.name.len() + api::BACKEND_SERVICE_SUFFIX.len();
            if service_len > MAX_LABEL_LEN {
                // Only its start is shown: the name can be as long as a client makes it.
                let service = api::backend_service_name(&cut(&name.display(), MAX_QUOTED_BYTES), &backend.name);
                report.error(
                    format!("{at}.name"),
                    format!(
                        "the derived Service name {} must be at most {MAX_LABEL_LEN} characters, got {service_len}",
                        quoted(&service)
                    ),
                );
            }
        }
        let weight = backend.effective_weight();
        if !(0..=MAX_WEIGHT).contains(&weight) {
            report.error(format!("{at}.weight"), format!("must be between 0 and {MAX_WEIGHT}, got {weight}"));
        } else if weight == 0 {
            report.warnings.push(format!(
                "{at}.weight: weight 0 drains backend {}: it receives no traffic",
                quoted(&backend.name)
            ));
        }
        if let Some(n) = backend.max_fails.filter(|n| !(0..=MAX_MAX_FAILS).contains(n)) {
            report.error(format!("{at}.maxFails"), format!("must be between 0 and {MAX_MAX_FAILS}, got {n}"));
        }
        validate_duration(&format_args!("{at}.failTimeout"), backend.fail_timeout.as_deref(), FAIL_TIMEOUT, report);
        validate_selector(&format_args!("{at}.selector"), backend.selector.as_ref(), report);
        if !selectors_bounded {
            continue;
        }
        let merged = spec.merged_selector_refs(backend);
        if merged.is_empty() {
            report.error(
                format!("{at}.selector"),
                "the merged selector (spec.selector and this backend's selector) must not be empty, \
                 or the backend would select every pod in the namespace",
            );
            continue;
        }
        let fingerprint = fingerprint(&merged);
        if let Some((first, _, _)) = selectors.iter().find(|(_, f, s)| *f == fingerprint && *s == merged) {
            report.warnings.push(format!(
                "{at}.selector: selects the same pods as spec.backends[{first}], so both backends share them"
            ));
        }
        selectors.push((i, fingerprint, merged));
    }
    let weights_valid = backends.iter().all(|b| (0..=MAX_WEIGHT).contains(&b.effective_weight()));
    if !backends.is_empty() && weights_valid && backends.iter().all(|b| b.effective_weight() == 0) {
        report.error("spec.backends", "the sum of weights must be greater than 0, got 0");
    }
}

fn fingerprint(selector: &BTreeMap<&str, &str>) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    selector.hash(&mut hasher);
    hasher.finish()
}

/// Records `key` at `index`; returns where it was first seen if this is a repeat.
/// (A scan: the lists are at most 64 long, where hashing costs more than it saves.)
fn first_seen<K: PartialEq>(seen: &mut Vec<(K, usize)>, key: K, index: usize) -> Option<usize> {
    if let Some((_, first)) = seen.iter().find(|(k, _)| *k == key) {
        return Some(*first);
    }
    seen.push((key, index));
    None
}

/// `spec.<list>[<index>]`, formatted only when a message needs it.
#[derive(Clone, Copy)]
struct Item(&'static str, usize);

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spec.{}[{}]", self.0, self.1)
    }
}

fn selector_len(selector: Option<&BTreeMap<String, String>>) -> usize {
    selector.map_or(0, BTreeMap::len)
}

fn validate_selector(at: &dyn fmt::Display, selector: Option<&BTreeMap<String, String>>, report: &mut Report) {
    let len = selector_len(selector);
    if len > MAX_SELECTOR_LABELS {
        report.error(at.to_string(), format!("must have at most {MAX_SELECTOR_LABELS} labels, got {len}"));
        return;
    }
    for (key, value) in selector.into_iter().flatten() {
        if let Err(problem) = check_label_key(key) {
            report.error(at.to_string(), format!("invalid label key {}: {problem}", quoted(key)));
        }
        if let Err(problem) = check_label_value(value) {
            report.error(
                format!("{at}[{}]", cut(key, MAX_QUOTED_BYTES)),
                format!("invalid label value {}: {problem}", quoted(value)),
            );
        }
    }
}

fn dns1123_label_problem(name: &str) -> String {
    format!(
        "must be a DNS-1123 label (at most {MAX_LABEL_LEN} lowercase letters, digits and '-', \
         starting and ending with a letter or digit), got {}",
        quoted(name)
    )
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL_LEN
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
}

/// `[a-z]([-a-z0-9]*[a-z0-9])?`, at most 63 characters: what Service names must be.
pub fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// Dot-separated DNS-1123 labels, at most 253 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SUBDOMAIN_LEN && s.split('.').all(is_dns1123_label)
}

/// An IANA service name as Kubernetes accepts it for a named port.
pub fn is_iana_svc_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_IANA_SVC_NAME_LEN
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        && b.iter().any(|c| c.is_ascii_lowercase())
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !s.contains("--")
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, at most 63 characters: a label name or value.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_alphanumeric();
    !b.is_empty()
        && b.len() <= MAX_LABEL_LEN
        && alnum(b[0])
        && alnum(b[b.len() - 1])
        && b.iter().all(|&c| alnum(c) || matches!(c, b'-' | b'_' | b'.'))
}

const NAME_PART_RULE: &str = "at most 63 alphanumeric characters, '-', '_' or '.', \
                              starting and ending with an alphanumeric character";

/// A label key: an optional DNS-1123 subdomain prefix and '/', then a name.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns1123_subdomain(prefix)
    {
        return Err(format!("the prefix must be a DNS-1123 subdomain of at most {MAX_SUBDOMAIN_LEN} characters"));
    }
    if !is_qualified_name_part(name) {
        return Err(format!("the name must be {NAME_PART_RULE}"));
    }
    Ok(())
}

/// A label value: empty, or a name part.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_qualified_name_part(value) {
        Ok(())
    } else {
        Err(format!("must be empty or {NAME_PART_RULE}"))
    }
}

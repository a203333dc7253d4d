//! Where the proxy runs and how it is exposed: `spec.service` and `spec.proxy`.

use super::fields::*;
use super::scheduling::validate_scheduling;
use crate::api::formats::{check_label_key, is_dns1123_subdomain};
use crate::api::v1beta1::ProxySpec;
use crate::api::{
    BalancerSpec, ExternalTrafficPolicy, MAX_PORTS, MAX_SOURCE_RANGES, MAX_SPREAD_CONSTRAINTS, MAX_TOLERATIONS,
    ServiceType, UpstreamKind,
};
use crate::spec::policy::SpecPolicy;
use crate::spec::report::{FieldError, Report};
use crate::util::echo::{MAX_QUOTED_BYTES, cut, quoted};

/// `spec.service`, and the ports' `nodePort`s, which only some Service types have.
pub(super) fn validate_service(spec: &BalancerSpec, report: &mut Report) {
    let kind = spec.written_service_type();
    let read = one_of::<ServiceType>("spec.service.type", kind, report);
    let load_balancer = read == Some(ServiceType::LoadBalancer);
    let node_ports = read.is_some_and(ServiceType::has_node_ports);
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
            } else if let Some(first) = first_seen(&mut seen, (node_port, port.written_protocol()), i) {
                report.error(at, format!("duplicate node port {node_port} (also spec.ports[{first}].nodePort)"));
            }
        }
    }
    let Some(service) = &spec.service else { return };
    if let Some(class) = &service.load_balancer_class {
        if !load_balancer {
            report.error("spec.service.loadBalancerClass", only(ServiceType::LoadBalancer.as_str()));
        } else if let Err(problem) = check_label_key(class) {
            let detail = format!("must be a label-style key such as example.com/lb ({problem}), got {}", quoted(class));
            report.error("spec.service.loadBalancerClass", detail);
        }
    }
    if let Some(policy) = &service.external_traffic_policy {
        if !node_ports {
            report.error("spec.service.externalTrafficPolicy", only("NodePort or LoadBalancer"));
        } else {
            one_of::<ExternalTrafficPolicy>("spec.service.externalTrafficPolicy", policy, report);
        }
    }
    let ranges = service.load_balancer_source_ranges.as_deref().unwrap_or_default();
    if !ranges.is_empty() && !load_balancer {
        report.error("spec.service.loadBalancerSourceRanges", only(ServiceType::LoadBalancer.as_str()));
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
    let load_balancer = |spec: &BalancerSpec| spec.written_service_type() == ServiceType::LoadBalancer.as_str();
    if load_balancer(old) && load_balancer(new) && class(old) != class(new) {
        let detail = "may not change while the type is LoadBalancer (Kubernetes refuses it on the Service): \
                      set the type to ClusterIP first, then to LoadBalancer with the new class";
        return vec![FieldError { field: "spec.service.loadBalancerClass".into(), detail: detail.into() }];
    }
    Vec::new()
}

/// `spec.proxy`: the image and the scheduling fields against the operator's policy, and the fields the API server
/// would otherwise refuse only on the Deployment, where the user would not see why.
pub(super) fn validate_proxy(proxy: Option<&ProxySpec>, policy: &SpecPolicy, report: &mut Report) {
    let Some(proxy) = proxy else { return };
    if let Some(image) = &proxy.image {
        validate_image(image, &policy.allowed_images, report);
    }
    validate_scheduling(proxy, &policy.scheduling, report);
    validate_selector(&"spec.proxy.nodeSelector", proxy.node_selector.as_ref(), report);
    validate_annotations("spec.proxy.podAnnotations", proxy.pod_annotations.as_ref(), report);
    validate_duration(&"spec.proxy.drainTimeout", proxy.drain_timeout.as_deref(), DRAIN_TIMEOUT, report);
    if let Some(kind) = proxy.upstreams.as_deref() {
        one_of::<UpstreamKind>("spec.proxy.upstreams", kind, report);
    }
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

/// A per-Balancer image runs with the operator's authority, so it is allowed only under a prefix
/// the installer listed in `--allowed-proxy-images`.
pub(super) fn validate_image(image: &str, allowed: &[String], report: &mut Report) {
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
pub(super) fn image_under(image: &str, prefix: &str) -> bool {
    let Some(rest) = image.strip_prefix(prefix) else { return false };
    prefix.ends_with(['/', ':', '@']) || rest.is_empty() || rest.starts_with(['/', ':', '@'])
}

/// A Kubernetes quantity's form: a decimal number, then an optional SI, binary or exponent suffix.
pub(super) fn is_quantity(text: &str) -> bool {
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

/// An address and a prefix length that fits it (`10.0.0.0/8`, `fd00::/8`), as Kubernetes'
/// `loadBalancerSourceRanges` takes them.
pub(super) fn is_cidr(text: &str) -> bool {
    let Some((ip, prefix)) = text.split_once('/') else { return false };
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let (Ok(ip), Ok(prefix)) = (ip.parse::<std::net::IpAddr>(), prefix.parse::<u8>()) else { return false };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    prefix <= max
}

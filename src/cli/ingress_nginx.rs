//! `balancer from-ingress-nginx`: ingress-nginx's `tcp-services` and `udp-services` ConfigMaps
//! rewritten as Balancers, one per Service they name, serving the same ports with the same pods;
//! or (`--to gateway`) as one Gateway with a listener per entry, and a TCPRoute or UDPRoute per
//! entry in its Service's namespace.
//!
//! Each entry of those ConfigMaps reads `"PORT": "namespace/service:port[:PROXY][:PROXY]"`: the
//! controller's PORT forwards to the Service's port (a number or a name); the first `PROXY`
//! expects the PROXY protocol from clients (`acceptProxyProtocol`), the second sends it to the
//! backends (`proxyProtocol`). A Balancer selects pods, so it takes the Service's selector, and
//! the Service port's `targetPort`. What cannot be carried over is said, entry by entry.

use std::collections::BTreeMap;
use std::process::ExitCode;

use k8s_openapi::api::core::v1::{ConfigMap, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::args::{FromIngressNginxArgs, MigrationTarget as Target};
use super::io::{fail, out, read_input};
use super::yaml::{YamlError, admit_document, doc_kind, is_list, yaml_documents};
use crate::api::{GROUP, KIND, STORAGE_VERSION};
use crate::spec::{SpecPolicy, denial_message};

/// Why `balancer from-ingress-nginx` cannot read its input.
#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
#[derive(Debug, thiserror::Error)]
pub enum FromIngressNginxError {
    #[error(transparent)]
    Yaml(#[from] YamlError),
    #[error("{source_name}: neither ConfigMap {tcp} nor {udp} is in it")]
    NoConfigMap { source_name: String, tcp: String, udp: String },
    #[error("cannot encode YAML: {0}")]
    Encode(String),
}

/// What the conversion made: Balancers (or a Gateway and its routes), and what it could not
/// carry over.
#[derive(Debug, Default, PartialEq)]
pub struct Migration {
    /// The objects, in apply order.
    pub objects: Vec<Value>,
    /// One line per entry (or Service) left behind, saying why.
    pub left_behind: Vec<String>,
}

/// Which protocol a ConfigMap's entries carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}

/// One entry of a `tcp-services` or `udp-services` ConfigMap, read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// The port clients connect to.
    port: i32,
    protocol: Protocol,
    namespace: String,
    service: String,
    /// The Service's port: its number or its name.
    service_port: IntOrString,
    /// `:PROXY` third: clients send the PROXY protocol.
    decode_proxy: bool,
    /// `:PROXY` fourth: the backends receive it.
    encode_proxy: bool,
}

/// Reads one entry: `"PORT": "namespace/service:port[:PROXY][:PROXY]"`.
fn parse_entry(key: &str, value: &str, protocol: Protocol) -> Result<Entry, String> {
    let port = key.trim().parse::<i32>().ok().filter(|p| (1..=65535).contains(p));
    let port = port.ok_or_else(|| format!("{key:?} is not a port (1-65535)"))?;
    let mut fields = value.trim().split(':');
    let (namespace, service) = fields
        .next()
        .and_then(|target| target.split_once('/'))
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
        .ok_or_else(|| format!("{value:?} does not start with namespace/service"))?;
    let service_port = match fields.next().filter(|p| !p.is_empty()) {
        Some(p) => p.parse::<i32>().map_or_else(|_| IntOrString::String(p.to_string()), IntOrString::Int),
        None => return Err(format!("{value:?} names no port of the Service")),
    };
    let mut flag = |place: &str| match fields.next() {
        None | Some("") => Ok(false),
        Some("PROXY") => Ok(true),
        Some(other) => Err(format!("{value:?}: the {place} field is {other:?}, not PROXY")),
    };
    let (decode_proxy, encode_proxy) = (flag("third")?, flag("fourth")?);
    if fields.next().is_some() {
        return Err(format!("{value:?} has more than four fields"));
    }
    Ok(Entry {
        port,
        protocol,
        namespace: namespace.to_string(),
        service: service.to_string(),
        service_port,
        decode_proxy,
        encode_proxy,
    })
}

/// The objects of a YAML text, `List` items included.
fn objects(source_name: &str, text: &str) -> Result<Vec<Value>, YamlError> {
    let mut objects = Vec::new();
    for mut doc in yaml_documents(source_name, text)? {
        match doc.get_mut("items").map(Value::take) {
            Some(Value::Array(items)) if is_list(&doc_kind(&doc)) => objects.extend(items),
            _ => objects.push(doc),
        }
    }
    Ok(objects)
}

/// `namespace/name` of an object.
fn key_of(namespace: Option<&String>, name: Option<&String>) -> String {
    format!("{}/{}", namespace.map_or("default", String::as_str), name.map_or("", String::as_str))
}

/// Where the entries are, and what the Balancers' front Services are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources<'a> {
    /// The `tcp-services` ConfigMap, as `namespace/name`.
    pub tcp: &'a str,
    /// The `udp-services` ConfigMap, as `namespace/name`.
    pub udp: &'a str,
    /// The front Services' type.
    pub service_type: &'a str,
}

/// Balancers for the entries of the ConfigMaps `sources` names in `text`, with the Services they
/// name, also in `text`.
pub fn from_ingress_nginx(
    source_name: &str,
    text: &str,
    sources: &Sources<'_>,
) -> Result<Migration, FromIngressNginxError> {
    let Input { services, entries, unread: left_behind } = read_entries(source_name, text, sources)?;
    let service_type = sources.service_type;
    let mut migration = Migration { objects: Vec::new(), left_behind };
    let mut by_service: BTreeMap<(String, String), Vec<Entry>> = BTreeMap::new();
    for entry in entries {
        by_service.entry((entry.namespace.clone(), entry.service.clone())).or_default().push(entry);
    }
    for ((namespace, name), entries) in by_service {
        let service = services.get(&format!("{namespace}/{name}"));
        match balancer_for(&namespace, &name, service, &entries, service_type, &mut migration.left_behind) {
            Some(balancer) => migration.objects.push(balancer),
            None => continue,
        }
    }
    Ok(migration)
}

/// The most listeners a Gateway may have (its CRD's `maxItems`).
const MAX_LISTENERS: usize = 64;

/// Where the Gateway goes: its namespace and name, and its GatewayClass.
#[derive(Clone, Copy)]
pub struct GatewayTarget<'a> {
    /// The Gateway's namespace (its routes are in their Services' namespaces).
    pub namespace: &'a str,
    /// The Gateway's name.
    pub name: &'a str,
    /// Its `gatewayClassName`.
    pub class: &'a str,
}

/// One Gateway for the entries of the ConfigMaps `sources` names in `text` (a listener per
/// entry, admitting routes from the entries' namespaces only), and a TCPRoute or UDPRoute per
/// entry, in its Service's namespace, to the Service's port. Gateway API has no PROXY protocol:
/// an entry with a `PROXY` flag is left behind, and said so.
pub fn gateway_from_ingress_nginx(
    source_name: &str,
    text: &str,
    sources: &Sources<'_>,
    target: &GatewayTarget<'_>,
) -> Result<Migration, FromIngressNginxError> {
    let Input { services, entries, unread: mut left_behind } = read_entries(source_name, text, sources)?;
    let mut listeners = Vec::new();
    let mut routes = Vec::new();
    let mut namespaces: Vec<String> = Vec::new();
    for entry in entries {
        let at = format!("{}/{} {} {}", entry.namespace, entry.service, entry.protocol.as_str(), entry.port);
        if entry.decode_proxy || entry.encode_proxy {
            left_behind.push(format!("{at}: Gateway API has no PROXY protocol; convert this entry with --to balancer"));
            continue;
        }
        let service = services.get(&format!("{}/{}", entry.namespace, entry.service));
        let Some(service) = service else {
            left_behind.push(format!("{at}: the Service is not in the input"));
            continue;
        };
        if service.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
            left_behind.push(format!(
                "{at}: an ExternalName Service may point outside the cluster; balancer does not send to it"
            ));
            continue;
        }
        let ports = service.spec.as_ref().and_then(|s| s.ports.clone()).unwrap_or_default();
        let port = match service_port(&entry, &ports) {
            Ok(port) => port,
            Err(why) => {
                left_behind.push(format!("{at}: {why}"));
                continue;
            }
        };
        if listeners.len() == MAX_LISTENERS {
            left_behind.push(format!("{at}: a Gateway holds {MAX_LISTENERS} listeners at most"));
            continue;
        }
        let section = format!("{}-{}", entry.protocol.as_str().to_ascii_lowercase(), entry.port);
        let kind = match entry.protocol {
            Protocol::Tcp => "TCPRoute",
            Protocol::Udp => "UDPRoute",
        };
        listeners.push(json!({
            "name": section,
            "port": entry.port,
            "protocol": entry.protocol.as_str(),
            "allowedRoutes": {
                "kinds": [{"kind": kind}],
                "namespaces": {"from": "Selector", "selector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [entry.namespace]},
                ]}},
            },
        }));
        routes.push(json!({
            "apiVersion": crate::gateway::GROUP_VERSION,
            "kind": kind,
            "metadata": {"name": format!("{}-{section}", entry.service), "namespace": entry.namespace},
            "spec": {
                "parentRefs": [{"name": target.name, "namespace": target.namespace, "sectionName": section}],
                "rules": [{"backendRefs": [{"name": entry.service, "port": port.port}]}],
            },
        }));
        if !namespaces.contains(&entry.namespace) {
            namespaces.push(entry.namespace.clone());
        }
    }
    let mut migration = Migration { objects: Vec::new(), left_behind };
    if listeners.is_empty() {
        return Ok(migration);
    }
    migration.objects.push(json!({
        "apiVersion": crate::gateway::GROUP_VERSION,
        "kind": "Gateway",
        "metadata": {"name": target.name, "namespace": target.namespace},
        "spec": {"gatewayClassName": target.class, "listeners": listeners},
    }));
    migration.objects.extend(routes);
    Ok(migration)
}

/// What the input holds: its Services by `namespace/name`, the ConfigMaps' entries, and the
/// entries that did not read, each with why.
struct Input {
    services: BTreeMap<String, Service>,
    entries: Vec<Entry>,
    unread: Vec<String>,
}

/// The Services in `text`, and the entries of the ConfigMaps `sources` names, with what could
/// not be read.
fn read_entries(source_name: &str, text: &str, sources: &Sources<'_>) -> Result<Input, FromIngressNginxError> {
    let Sources { tcp, udp, .. } = *sources;
    let mut services: BTreeMap<String, Service> = BTreeMap::new();
    let mut config_maps: BTreeMap<String, ConfigMap> = BTreeMap::new();
    for object in objects(source_name, text)? {
        match doc_kind(&object).as_str() {
            "Service" => {
                if let Ok(service) = serde_json::from_value::<Service>(object) {
                    services
                        .insert(key_of(service.metadata.namespace.as_ref(), service.metadata.name.as_ref()), service);
                }
            }
            "ConfigMap" => {
                if let Ok(map) = serde_json::from_value::<ConfigMap>(object) {
                    config_maps.insert(key_of(map.metadata.namespace.as_ref(), map.metadata.name.as_ref()), map);
                }
            }
            _ => {}
        }
    }
    if !config_maps.contains_key(tcp) && !config_maps.contains_key(udp) {
        return Err(FromIngressNginxError::NoConfigMap {
            source_name: source_name.into(),
            tcp: tcp.into(),
            udp: udp.into(),
        });
    }
    let mut left_behind = Vec::new();
    let mut entries = Vec::new();
    for (name, protocol) in [(tcp, Protocol::Tcp), (udp, Protocol::Udp)] {
        let data = config_maps.get(name).and_then(|map| map.data.clone()).unwrap_or_default();
        for (key, value) in data {
            match parse_entry(&key, &value, protocol) {
                Ok(entry) => entries.push(entry),
                Err(why) => left_behind.push(format!("{name} {key}: {why}")),
            }
        }
    }
    Ok(Input { services, entries, unread: left_behind })
}

/// The Balancer that serves `entries` with the pods of `service`; `None` (and why, in
/// `left_behind`) when none can.
fn balancer_for(
    namespace: &str,
    name: &str,
    service: Option<&Service>,
    entries: &[Entry],
    service_type: &str,
    left_behind: &mut Vec<String>,
) -> Option<Value> {
    let ports: Vec<String> = entries.iter().map(|e| format!("{} {}", e.protocol.as_str(), e.port)).collect();
    let Some(service) = service else {
        left_behind.push(format!("{namespace}/{name} ({}): the Service is not in the input", ports.join(", ")));
        return None;
    };
    let spec = service.spec.clone().unwrap_or_default();
    let Some(selector) = spec.selector.filter(|s| !s.is_empty()) else {
        left_behind.push(format!(
            "{namespace}/{name} ({}): the Service has no selector (an ExternalName, or endpoints kept by hand); a Balancer selects pods",
            ports.join(", ")
        ));
        return None;
    };
    let service_ports = spec.ports.unwrap_or_default();
    let mut balancer_ports = Vec::new();
    for entry in entries {
        match balancer_port(entry, &service_ports) {
            Ok(port) => balancer_ports.push(port),
            Err(why) => {
                left_behind.push(format!("{namespace}/{name} {} {}: {why}", entry.protocol.as_str(), entry.port))
            }
        }
    }
    if balancer_ports.is_empty() {
        return None;
    }
    let balancer = json!({
        "apiVersion": format!("{GROUP}/{STORAGE_VERSION}"),
        "kind": KIND,
        "metadata": {"name": format!("{name}-balancer"), "namespace": namespace},
        "spec": {
            "service": {"type": service_type},
            "ports": balancer_ports,
            "backends": [{"name": "pods", "weight": 100, "selector": selector}],
        },
    });
    match admit_document(&balancer, &SpecPolicy::default()) {
        Ok(_) => Some(balancer),
        Err(report) => {
            left_behind.push(denial_message(&format!("{namespace}/{name}'s Balancer"), &report.errors));
            None
        }
    }
}

/// The Balancer port for `entry`: its name, protocol, port, the Service port's `targetPort`, and
/// the PROXY protocol flags.
fn balancer_port(entry: &Entry, service_ports: &[ServicePort]) -> Result<Value, String> {
    let found = service_port(entry, service_ports)?;
    if entry.protocol == Protocol::Udp && (entry.decode_proxy || entry.encode_proxy) {
        return Err("the PROXY protocol is TCP only in a Balancer".to_string());
    }
    let target = found.target_port.clone().unwrap_or(IntOrString::Int(found.port));
    let mut port = json!({
        "name": format!("{}-{}", entry.protocol.as_str().to_ascii_lowercase(), entry.port),
        "protocol": entry.protocol.as_str(),
        "port": entry.port,
        "targetPort": target,
    });
    if entry.decode_proxy {
        port["acceptProxyProtocol"] = json!(true);
    }
    if entry.encode_proxy {
        port["proxyProtocol"] = json!(true);
    }
    Ok(port)
}

/// The Service port `entry` names (by number or name), of its protocol; or why there is none.
fn service_port<'a>(entry: &Entry, service_ports: &'a [ServicePort]) -> Result<&'a ServicePort, String> {
    let found = service_ports.iter().find(|p| match &entry.service_port {
        IntOrString::Int(number) => p.port == *number,
        IntOrString::String(name) => p.name.as_deref() == Some(name.as_str()),
    });
    let Some(found) = found else {
        let wanted = match &entry.service_port {
            IntOrString::Int(n) => n.to_string(),
            IntOrString::String(s) => s.clone(),
        };
        return Err(format!("the Service has no port {wanted}"));
    };
    let service_protocol = found.protocol.as_deref().unwrap_or("TCP");
    if service_protocol != entry.protocol.as_str() {
        return Err(format!("the Service's port {} is {service_protocol}", found.port));
    }
    Ok(found)
}

/// Runs `balancer from-ingress-nginx`: the Balancers to standard output, what was left behind
/// to standard error (exit status 1 when anything was).
pub(super) fn command(args: &FromIngressNginxArgs) -> ExitCode {
    let (name, text) = match read_input(&args.file) {
        Ok(input) => input,
        Err(message) => return fail(&message),
    };
    let sources = Sources { tcp: &args.tcp_services, udp: &args.udp_services, service_type: &args.service_type };
    let converted = match args.to {
        Target::Balancer => from_ingress_nginx(&name, &text, &sources),
        Target::Gateway => {
            let namespace = args.tcp_services.split_once('/').map_or("default", |(namespace, _)| namespace);
            let target = GatewayTarget { namespace, name: &args.gateway_name, class: &args.gateway_class };
            gateway_from_ingress_nginx(&name, &text, &sources, &target)
        }
    };
    let migration = match converted {
        Ok(migration) => migration,
        Err(e) => return fail(&e.to_string()),
    };
    let mut yaml = String::new();
    for object in &migration.objects {
        yaml.push_str("---\n");
        match serde_saphyr::to_string(object) {
            Ok(text) => yaml.push_str(&text),
            Err(e) => return fail(&FromIngressNginxError::Encode(e.to_string()).to_string()),
        }
    }
    let written = out(&yaml);
    if migration.left_behind.is_empty() {
        return written;
    }
    for line in &migration.left_behind {
        eprintln!("left behind: {line}");
    }
    ExitCode::from(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_its_service_port_and_proxy_flags() {
        let entry = parse_entry("9000", "mqtt/broker:1883:PROXY", Protocol::Tcp).expect("reads");
        assert_eq!((entry.port, entry.service_port.clone()), (9000, IntOrString::Int(1883)));
        assert_eq!((entry.decode_proxy, entry.encode_proxy), (true, false));
        let entry = parse_entry("5432", "db/postgres:pg::PROXY", Protocol::Tcp).expect("reads");
        assert_eq!(entry.service_port, IntOrString::String("pg".into()));
        assert_eq!((entry.decode_proxy, entry.encode_proxy), (false, true));
        for (key, value) in [
            ("0", "a/b:1"),
            ("x", "a/b:1"),
            ("1", "b:1"),
            ("1", "/b:1"),
            ("1", "a/b"),
            ("1", "a/b:1:proxy"),
            ("1", "a/b:1:PROXY:PROXY:PROXY"),
        ] {
            assert!(parse_entry(key, value, Protocol::Tcp).is_err(), "{key}: {value}");
        }
    }

    const SOURCES: Sources<'static> = Sources { tcp: "edge/tcp", udp: "edge/udp", service_type: "ClusterIP" };

    /// A `List` as `kubectl get -o yaml` prints it: the ConfigMaps `edge/tcp` and `edge/udp`
    /// with `entries`, and a Service `app/echo` with a TCP port 80 named `web` and a UDP port 53.
    fn input(tcp: &str, udp: &str) -> String {
        format!(
            "apiVersion: v1\nkind: List\nitems:\n\
             - {{apiVersion: v1, kind: ConfigMap, metadata: {{name: tcp, namespace: edge}}, data: {{{tcp}}}}}\n\
             - {{apiVersion: v1, kind: ConfigMap, metadata: {{name: udp, namespace: edge}}, data: {{{udp}}}}}\n\
             - {{apiVersion: v1, kind: Service, metadata: {{name: echo, namespace: app}}, spec: {{selector: {{app: echo}}, \
                ports: [{{name: web, port: 80, targetPort: 8080}}, {{name: dns, port: 53, protocol: UDP}}]}}}}\n"
        )
    }

    #[test]
    fn each_entry_is_a_port_of_its_services_balancer_or_is_said_to_be_left_behind() {
        let text = input(
            r#""8080": "app/echo:web", "9090": "app/echo:81", "9191": "app/echo:53", "1": "nowhere""#,
            r#""53": "app/echo:dns", "54": "app/echo:dns:PROXY", "55": "app/gone:53""#,
        );
        let migration = from_ingress_nginx("in", &text, &SOURCES).expect("reads");
        assert_eq!(migration.objects.len(), 1);
        let balancer = &migration.objects[0];
        assert_eq!(balancer["metadata"], json!({"name": "echo-balancer", "namespace": "app"}));
        assert_eq!(balancer["spec"]["service"], json!({"type": "ClusterIP"}));
        assert_eq!(balancer["spec"]["backends"], json!([{"name": "pods", "weight": 100, "selector": {"app": "echo"}}]));
        assert_eq!(
            balancer["spec"]["ports"],
            json!([
                {"name": "tcp-8080", "protocol": "TCP", "port": 8080, "targetPort": 8080},
                {"name": "udp-53", "protocol": "UDP", "port": 53, "targetPort": 53},
            ])
        );
        assert_eq!(
            migration.left_behind,
            [
                "edge/tcp 1: \"nowhere\" does not start with namespace/service",
                "app/echo TCP 9090: the Service has no port 81",
                "app/echo TCP 9191: the Service's port 53 is UDP",
                "app/echo UDP 54: the PROXY protocol is TCP only in a Balancer",
                "app/gone (UDP 55): the Service is not in the input",
            ]
        );
    }

    #[test]
    fn to_gateway_each_entry_is_a_listener_and_a_route_to_its_services_port() {
        let text = input(
            r#""8080": "app/echo:web", "9090": "app/echo:80:PROXY", "9191": "app/gone:80""#,
            r#""53": "app/echo:dns""#,
        );
        let target = GatewayTarget { namespace: "edge", name: "moved", class: "balancer" };
        let migration = gateway_from_ingress_nginx("in", &text, &SOURCES, &target).expect("reads");
        let kinds: Vec<&Value> = migration.objects.iter().map(|o| &o["kind"]).collect();
        assert_eq!(kinds, ["Gateway", "TCPRoute", "UDPRoute"]);
        let gateway = &migration.objects[0];
        assert_eq!(gateway["metadata"], json!({"name": "moved", "namespace": "edge"}));
        assert_eq!(gateway["spec"]["gatewayClassName"], "balancer");
        let listeners: Vec<(&Value, &Value, &Value)> = gateway["spec"]["listeners"]
            .as_array()
            .expect("listeners")
            .iter()
            .map(|l| (&l["name"], &l["port"], &l["protocol"]))
            .collect();
        assert_eq!(
            listeners,
            [(&json!("tcp-8080"), &json!(8080), &json!("TCP")), (&json!("udp-53"), &json!(53), &json!("UDP"))]
        );
        assert_eq!(
            gateway["spec"]["listeners"][0]["allowedRoutes"]["namespaces"]["selector"]["matchExpressions"][0]["values"],
            json!(["app"]),
            "only the Services' namespaces attach"
        );
        let tcp = &migration.objects[1];
        assert_eq!(tcp["metadata"], json!({"name": "echo-tcp-8080", "namespace": "app"}));
        assert_eq!(
            tcp["spec"],
            json!({"parentRefs": [{"name": "moved", "namespace": "edge", "sectionName": "tcp-8080"}],
                   "rules": [{"backendRefs": [{"name": "echo", "port": 80}]}]}),
            "the Service's port by number, found by its name"
        );
        assert_eq!(
            migration.left_behind,
            [
                "app/echo TCP 9090: Gateway API has no PROXY protocol; convert this entry with --to balancer",
                "app/gone TCP 9191: the Service is not in the input",
            ]
        );
        for object in &migration.objects {
            let kind = object["kind"].as_str().unwrap_or_default();
            let reads = match kind {
                "Gateway" => serde_json::from_value::<crate::gateway::api::gateways::Gateway>(object.clone()).is_ok(),
                "TCPRoute" => {
                    serde_json::from_value::<crate::gateway::api::tcproutes::TcpRoute>(object.clone()).is_ok()
                }
                _ => serde_json::from_value::<crate::gateway::api::udproutes::UdpRoute>(object.clone()).is_ok(),
            };
            assert!(reads, "{kind} reads as Gateway API's type: {object}");
        }
    }

    #[test]
    fn input_without_either_configmap_is_an_error() {
        let text = input("", "");
        let elsewhere = Sources { tcp: "ingress-nginx/tcp-services", udp: "ingress-nginx/udp-services", ..SOURCES };
        let error = from_ingress_nginx("in", &text, &elsewhere).expect_err("no ConfigMap");
        assert_eq!(
            error.to_string(),
            "in: neither ConfigMap ingress-nginx/tcp-services nor ingress-nginx/udp-services is in it"
        );
        assert_eq!(from_ingress_nginx("in", &text, &SOURCES).expect("reads"), Migration::default());
    }
}

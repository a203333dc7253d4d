//! Ports and their target ports.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::table::{case, named, not_dns1123, not_iana, port, run, strings};

#[test]
fn port_rules() {
    run(vec![
        case("no ports", |s| s.spec.ports.clear(), strings!["spec.ports: must have at least one port"], vec![]),
        case(
            "32 ports is the maximum",
            |s| s.spec.ports = (0..32).map(|i| named(&format!("p{i}"), "TCP", 1000 + i)).collect(),
            vec![],
            vec![],
        ),
        case(
            "33 ports",
            |s| s.spec.ports = (0..33).map(|i| named(&format!("p{i}"), "TCP", 1000 + i)).collect(),
            strings!["spec.ports: must have at most 32 ports, got 33"],
            vec![],
        ),
        case(
            "port 0",
            |s| s.spec.ports[0].port = 0,
            strings!["spec.ports[0].port: must be between 1 and 65535, got 0"],
            vec![],
        ),
        case(
            "port 65536",
            |s| s.spec.ports[0].port = 65536,
            strings!["spec.ports[0].port: must be between 1 and 65535, got 65536"],
            vec![],
        ),
        case(
            "negative port",
            |s| s.spec.ports[0].port = -80,
            strings!["spec.ports[0].port: must be between 1 and 65535, got -80"],
            vec![],
        ),
        case(
            "ports 1 and 65535 are in range",
            |s| s.spec.ports = vec![named("low", "TCP", 1), named("high", "TCP", 65535)],
            vec![],
            vec![],
        ),
        case(
            "protocol SCTP",
            |s| s.spec.ports[0].protocol = Some("SCTP".into()),
            strings!["spec.ports[0].protocol: must be TCP or UDP, got \"SCTP\""],
            vec![],
        ),
        case(
            "protocol in lowercase",
            |s| s.spec.ports[0].protocol = Some("tcp".into()),
            strings!["spec.ports[0].protocol: must be TCP or UDP, got \"tcp\""],
            vec![],
        ),
        case("protocol UDP", |s| s.spec.ports[0].protocol = Some("UDP".into()), vec![], vec![]),
        case("unset protocol is TCP", |s| s.spec.ports[0].protocol = None, vec![], vec![]),
        case("a single port needs no name", |s| s.spec.ports[0].name = None, vec![], vec![]),
        case(
            "second of two ports has no name",
            |s| s.spec.ports.push(port(None, Some("TCP"), 8080, None)),
            strings!["spec.ports[1].name: is required when there is more than one port"],
            vec![],
        ),
        case(
            "an empty name is a missing name",
            |s| {
                s.spec.ports[0].name = Some(String::new());
                s.spec.ports.push(named("admin", "TCP", 8080));
            },
            strings!["spec.ports[0].name: is required when there is more than one port"],
            vec![],
        ),
        case(
            "three ports, none named",
            |s| {
                s.spec.ports = vec![
                    port(None, Some("TCP"), 80, None),
                    port(None, Some("TCP"), 81, None),
                    port(None, Some("UDP"), 82, None),
                ]
            },
            strings![
                "spec.ports[0].name: is required when there is more than one port",
                "spec.ports[1].name: is required when there is more than one port",
                "spec.ports[2].name: is required when there is more than one port",
            ],
            vec![],
        ),
        case(
            "uppercase port name",
            |s| s.spec.ports[0].name = Some("HTTP".into()),
            strings![not_dns1123("spec.ports[0].name", "HTTP")],
            vec![],
        ),
        case(
            "port name with an underscore",
            |s| s.spec.ports[0].name = Some("web_ui".into()),
            strings![not_dns1123("spec.ports[0].name", "web_ui")],
            vec![],
        ),
        case(
            "port name starting with a dash",
            |s| s.spec.ports[0].name = Some("-http".into()),
            strings![not_dns1123("spec.ports[0].name", "-http")],
            vec![],
        ),
        case(
            "64-character port name",
            |s| s.spec.ports[0].name = Some("p".repeat(64)),
            strings![not_dns1123("spec.ports[0].name", &"p".repeat(64))],
            vec![],
        ),
        case(
            "63-character port name starting with a digit is a DNS-1123 label",
            |s| s.spec.ports[0].name = Some(format!("8{}", "p".repeat(62))),
            vec![],
            vec![],
        ),
        case(
            "duplicate port names",
            |s| s.spec.ports.push(named("http", "TCP", 8080)),
            strings!["spec.ports[1].name: duplicate port name \"http\" (also spec.ports[0].name)"],
            vec![],
        ),
        case(
            "invalid and duplicate port name reports both",
            |s| s.spec.ports = vec![named("Web", "TCP", 80), named("Web", "TCP", 81)],
            strings![
                not_dns1123("spec.ports[0].name", "Web"),
                not_dns1123("spec.ports[1].name", "Web"),
                "spec.ports[1].name: duplicate port name \"Web\" (also spec.ports[0].name)",
            ],
            vec![],
        ),
        case(
            "duplicate port and protocol",
            |s| s.spec.ports.push(named("alt", "TCP", 80)),
            strings!["spec.ports[1]: duplicate port 80/TCP (also spec.ports[0])"],
            vec![],
        ),
        case(
            "53/TCP and 53/UDP may coexist",
            |s| s.spec.ports = vec![named("dns-tcp", "TCP", 53), named("dns-udp", "UDP", 53)],
            vec![],
            vec![],
        ),
        case(
            "an unset protocol collides with an explicit TCP",
            |s| s.spec.ports = vec![port(Some("dns"), None, 53, None), named("dns-tcp", "TCP", 53)],
            strings!["spec.ports[1]: duplicate port 53/TCP (also spec.ports[0])"],
            vec![],
        ),
        case(
            "same name and same port/protocol report both duplicates",
            |s| s.spec.ports = vec![named("dns", "UDP", 53), named("dns", "UDP", 53)],
            strings![
                "spec.ports[1].name: duplicate port name \"dns\" (also spec.ports[0].name)",
                "spec.ports[1]: duplicate port 53/UDP (also spec.ports[0])",
            ],
            vec![],
        ),
    ]);
}

#[test]
fn target_port_rules() {
    run(vec![
        case(
            "numeric targetPort 0",
            |s| s.spec.ports[0].target_port = Some(IntOrString::Int(0)),
            strings!["spec.ports[0].targetPort: must be between 1 and 65535, got 0"],
            vec![],
        ),
        case(
            "numeric targetPort 65536",
            |s| s.spec.ports[0].target_port = Some(IntOrString::Int(65536)),
            strings!["spec.ports[0].targetPort: must be between 1 and 65535, got 65536"],
            vec![],
        ),
        case(
            "numeric targetPort -1",
            |s| s.spec.ports[0].target_port = Some(IntOrString::Int(-1)),
            strings!["spec.ports[0].targetPort: must be between 1 and 65535, got -1"],
            vec![],
        ),
        case(
            "numeric targetPorts 1 and 65535",
            |s| {
                s.spec.ports = vec![
                    port(Some("low"), Some("TCP"), 80, Some(IntOrString::Int(1))),
                    port(Some("high"), Some("TCP"), 81, Some(IntOrString::Int(65535))),
                ]
            },
            vec![],
            vec![],
        ),
        case("no targetPort", |s| s.spec.ports[0].target_port = None, vec![], vec![]),
        case(
            "valid named targetPort",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("http-alt".into())),
            vec![],
            vec![],
        ),
        case(
            "15-character named targetPort starting with a digit",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String(format!("8{}", "a".repeat(14)))),
            vec![],
            vec![],
        ),
        case(
            "16-character named targetPort",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("a".repeat(16))),
            strings![not_iana("spec.ports[0].targetPort", &"a".repeat(16))],
            vec![],
        ),
        case(
            "uppercase named targetPort",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("HTTP".into())),
            strings![not_iana("spec.ports[0].targetPort", "HTTP")],
            vec![],
        ),
        case(
            "digits-only named targetPort",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("8080".into())),
            strings![not_iana("spec.ports[0].targetPort", "8080")],
            vec![],
        ),
        case(
            "named targetPort with a double dash",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("http--alt".into())),
            strings![not_iana("spec.ports[0].targetPort", "http--alt")],
            vec![],
        ),
        case(
            "named targetPort starting with a dash",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("-http".into())),
            strings![not_iana("spec.ports[0].targetPort", "-http")],
            vec![],
        ),
        case(
            "named targetPort ending with a dash",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String("http-".into())),
            strings![not_iana("spec.ports[0].targetPort", "http-")],
            vec![],
        ),
        case(
            "empty named targetPort (before defaulting)",
            |s| s.spec.ports[0].target_port = Some(IntOrString::String(String::new())),
            strings![not_iana("spec.ports[0].targetPort", "")],
            vec![],
        ),
        case(
            "targetPort is checked on every port",
            |s| s.spec.ports.push(port(Some("admin"), Some("TCP"), 8080, Some(IntOrString::String("Admin".into())))),
            strings![not_iana("spec.ports[1].targetPort", "Admin")],
            vec![],
        ),
    ]);
}

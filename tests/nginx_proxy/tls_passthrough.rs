//! TLS passthrough: one TCP listener routed by the name in the client's ClientHello (SNI), each
//! name to its own backends, which finish the handshake themselves with their own certificates;
//! a name no route lists, or none at all, is refused.

use std::net::Ipv4Addr;
use std::sync::Arc;

use balancer::proxy::model::{
    Destination, Listener, Method, OwnerKind, ProxyConfig, SniRoute, Targets, WeightedBackend,
};
use balancer::proxy::nginx;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::STEP;
use crate::backends::{Backend, serving_backend};
use crate::process::{nginx_binary, start_nginx};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A backend on `ip` that finishes each TLS handshake with a certificate for `hostnames`, then
/// answers with its name; and that certificate, for the clients to trust.
async fn tls_backend(name: &str, ip: Ipv4Addr, hostnames: &[&str]) -> (Backend, CertificateDer<'static>) {
    let names: Vec<String> = hostnames.iter().map(|h| h.to_string()).collect();
    let rcgen::CertifiedKey { cert, signing_key } = rcgen::generate_simple_self_signed(names).expect("a certificate");
    let der = cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![der.clone()], key)
        .expect("a server configuration");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let backend = serving_backend(name, ip, name.to_string(), move |stream, reply| {
        let acceptor = acceptor.clone();
        async move {
            let _ = timeout(STEP, async {
                let mut tls = acceptor.accept(stream).await?;
                tls.write_all(reply.as_bytes()).await?;
                tls.shutdown().await
            })
            .await;
        }
    })
    .await;
    (backend, der)
}

/// Connects through the proxy with `name` as the server name (none for an IP address, as TLS
/// clients do), verifies the backend's certificate for it, and reads the backend's answer; the
/// error when the proxy refused the connection (or the certificate is not for `name`).
async fn tls_ask(port: u16, name: &str, roots: &RootCertStore) -> Result<String, String> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    let server_name = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
    let answer = timeout(STEP, async {
        let tcp = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
        let mut tls = TlsConnector::from(Arc::new(config)).connect(server_name, tcp).await?;
        let mut answer = String::new();
        tls.read_to_string(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    })
    .await;
    match answer {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err("timed out".to_string()),
    }
}

fn to(backend: &Backend) -> WeightedBackend {
    let targets = Targets::Service(Destination::Address(backend.addr));
    WeightedBackend {
        name: backend.name.clone(),
        weight: 1,
        backup: false,
        max_fails: None,
        fail_timeout: None,
        max_connections: None,
        targets,
    }
}

/// A model whose one TCP listener on `port` routes by SNI to `routes`, and refuses the rest.
fn passthrough(port: u16, routes: Vec<SniRoute>) -> ProxyConfig {
    let listener = Listener::tls_passthrough(port, routes);
    let drain_timeout = "1s".to_string();
    ProxyConfig {
        kind: OwnerKind::Gateway,
        name: "tls".into(),
        load_modules: vec![],
        drain_timeout,
        access_log: None,
        listeners: vec![listener],
        canary_window: None,
    }
}

fn route(hostnames: &[&str], backends: &[&Backend]) -> SniRoute {
    let hostnames = hostnames.iter().map(|h| h.to_string()).collect();
    let backends: Vec<WeightedBackend> = backends.iter().map(|b| to(b)).collect();
    SniRoute::new(hostnames, Method::RoundRobin, &backends).expect("valid hostnames")
}

/// Two names on one listener reach their own backends, whose certificates the clients verify
/// (the handshake went through nginx unread); a wildcard covers one label or more, an exact
/// name wins over it, and its base name is not covered; an unknown name and no name are
/// refused, as is a second backend's certificate for a name it does not hold.
#[tokio::test]
async fn each_server_name_reaches_its_own_backend_and_an_unknown_one_is_refused() {
    let Some(bin) = nginx_binary() else { return };
    let a_ip = Ipv4Addr::new(127, 0, 2, 2);
    let b_ip = Ipv4Addr::new(127, 0, 2, 3);
    let (a, a_cert) = tls_backend("a", a_ip, &["a.example.test", "exact.b.example.test"]).await;
    let (b, b_cert) = tls_backend("b", b_ip, &["*.b.example.test", "y.z.b.example.test", "b.example.test"]).await;
    let mut roots = RootCertStore::empty();
    for cert in [a_cert, b_cert] {
        roots.add(cert).expect("a root");
    }
    let routes =
        |_: u16| vec![route(&["a.example.test", "exact.b.example.test"], &[&a]), route(&["*.b.example.test"], &[&b])];
    let (nginx, port) = start_nginx(&bin, |p| nginx::write(&passthrough(p, routes(p)))).await;
    for (name, wanted) in
        [("a.example.test", "a"), ("x.b.example.test", "b"), ("y.z.b.example.test", "b"), ("exact.b.example.test", "a")]
    {
        for _ in 0..5 {
            assert_eq!(tls_ask(port, name, &roots).await.as_deref(), Ok(wanted), "{name}");
        }
    }
    for refused in ["c.example.test", "b.example.test", "127.0.0.1"] {
        let answer = tls_ask(port, refused, &roots).await;
        assert!(answer.is_err(), "{refused} is routed nowhere, yet: {answer:?}");
    }
    let served = |backend: &Backend| backend.served.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!((served(&a), served(&b)), (10, 10), "a refused connection reaches no backend");
    drop(nginx);
}

/// Gateway API's listener precedence on a shared port, through the real nginx: a tenant's
/// route on an open `*.example.test` listener names `api.pay.example.test` and
/// `db.example.test`, which a restricted wildcard listener and a restricted exact listener
/// take. In either listing order, 50 connections for each restricted name reach the
/// restricted listener's backend and none the tenant's, whose certificate covers every name
/// (so a misrouted handshake would succeed), and a name the restricted wildcard listener has no
/// route for is refused rather than sent to the tenant.
#[tokio::test]
async fn the_most_specific_listener_takes_its_names_from_a_tenants_route() {
    use balancer::gateway::api::gateways::GatewayListeners;
    use balancer::gateway::listeners::{AttachedRoute, proxy_listeners};

    let Some(bin) = nginx_binary() else { return };
    let all = ["web.example.test", "api.pay.example.test", "other.pay.example.test", "db.example.test"];
    let (tenant, tenant_cert) = tls_backend("tenant", Ipv4Addr::new(127, 0, 9, 2), &all).await;
    let (payments, payments_cert) = tls_backend("payments", Ipv4Addr::new(127, 0, 9, 3), &all).await;
    let (database, database_cert) = tls_backend("database", Ipv4Addr::new(127, 0, 9, 4), &all).await;
    let mut roots = RootCertStore::empty();
    for cert in [tenant_cert, payments_cert, database_cert] {
        roots.add(cert).expect("a root");
    }
    let listener = |name: &str, hostname: &str| -> GatewayListeners {
        let listener = serde_json::json!({"name": name, "port": 443, "protocol": "TLS", "hostname": hostname});
        serde_json::from_value(listener).expect("a listener")
    };
    let attached = |name: &str, hostnames: &[&str], backend: &Backend| AttachedRoute {
        created: None,
        namespace: name.into(),
        name: name.into(),
        hostnames: hostnames.iter().map(|h| h.to_string()).collect(),
        backends: vec![to(backend)],
    };
    for reversed in [false, true] {
        let mut gateway = vec![
            (
                listener("open", "*.example.test"),
                vec![attached("tenant", &["api.pay.example.test", "db.example.test", "web.example.test"], &tenant)],
            ),
            (listener("pay", "*.pay.example.test"), vec![attached("payments", &["api.pay.example.test"], &payments)]),
            (listener("db", "db.example.test"), vec![attached("database", &[], &database)]),
        ];
        if reversed {
            gateway.reverse();
        }
        let (listeners, routes): (Vec<_>, Vec<_>) = gateway.into_iter().unzip();
        let built = proxy_listeners(&listeners, &routes).listeners;
        let config = |port: u16| {
            let listeners = built.iter().map(|l| Listener { port, ..l.clone() }).collect();
            ProxyConfig { listeners, ..passthrough(port, Vec::new()) }
        };
        let (nginx, port) = start_nginx(&bin, |p| nginx::write(&config(p))).await;
        for (name, wanted) in [("api.pay.example.test", "payments"), ("db.example.test", "database")] {
            for _ in 0..50 {
                assert_eq!(tls_ask(port, name, &roots).await.as_deref(), Ok(wanted), "{name}, reversed: {reversed}");
            }
        }
        assert_eq!(tls_ask(port, "web.example.test", &roots).await.as_deref(), Ok("tenant"));
        let refused = tls_ask(port, "other.pay.example.test", &roots).await;
        assert!(refused.is_err(), "the pay listener has no route for it, reversed: {reversed}: {refused:?}");
        drop(nginx);
    }
    let served = |backend: &Backend| backend.served.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!((served(&tenant), served(&payments), served(&database)), (2, 100, 100));
}

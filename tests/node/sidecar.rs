//! The proxy pods' metrics sidecar: what it counts, read from its `/metrics`, and that it
//! outlives nginx to count a pod's last session.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fixtures::{Sample, wait_available, wait_ready_balancer};
use crate::toolkit::runner::eventually;
use crate::{NS, SAMPLE, World};

/// The completed sessions per backend (`outcome="ok"`), from a proxy pod's metrics sidecar.
pub async fn proxy_sessions(address: &str) -> Option<BTreeMap<String, f64>> {
    sidecar_counts(address, "balancer_proxy_sessions_total", "outcome=\"ok\"").await
}

/// A counter of a proxy pod's metrics sidecar, summed per backend (`""` for series without
/// one) over its series that have `label` (`""`: all).
pub async fn sidecar_counts(address: &str, metric: &str, label: &str) -> Option<BTreeMap<String, f64>> {
    let text = scrape(address).await?;
    let mut counts = BTreeMap::new();
    let series = format!("{metric}{{");
    for line in text.lines().filter(|l| l.starts_with(&series) && l.contains(label)) {
        let backend = line.split("backend=\"").nth(1).and_then(|rest| rest.split('"').next()).unwrap_or_default();
        let backend = backend.to_string();
        let value: f64 = line.rsplit(' ').next()?.parse().ok()?;
        *counts.entry(backend).or_insert(0.0) += value;
    }
    text.starts_with("HTTP/1.1 200").then_some(counts)
}

/// The id of the configuration a proxy pod's nginx serves, as its sidecar exports it (the first
/// 16 hex digits of the SHA-256 of its `nginx.conf`).
pub async fn served_config(address: &str) -> Option<String> {
    let text = scrape(address).await?;
    let line = text.lines().find(|l| l.starts_with("balancer_proxy_config_info{"))?;
    Some(line.split("id=\"").nth(1)?.split('"').next()?.to_string())
}

/// The sidecar's `/metrics` answer, status line and headers included.
async fn scrape(address: &str) -> Option<String> {
    let mut stream =
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(address)).await.ok()?.ok()?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n").await.ok()?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut text)).await.ok()?.ok()?;
    Some(text)
}

/// The runtime's ID of `pod`'s container `name`.
pub fn container_id(pod: &Pod, name: &str) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let id = statuses.iter().find(|c| c.name == name)?.container_id.as_deref()?;
    Some(id.rsplit("://").next()?.to_string())
}

/// Whether a process of container `id` runs, as the host sees it: runc names a container's
/// cgroup after its ID. (The kubelet reports a container of a terminating pod as exited only
/// once every container has, native sidecars included.)
fn container_runs(id: &str) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else { return false };
    entries.flatten().any(|entry| std::fs::read_to_string(entry.path().join("cgroup")).is_ok_and(|c| c.contains(id)))
}

/// The metrics sidecar is a native sidecar: it outlives nginx. A session open through a proxy
/// pod when the pod is deleted is served during nginx's stop, and its bytes can be scraped
/// from the sidecar once nginx has exited, before the pod is gone.
pub async fn the_metrics_sidecar_counts_the_last_session_after_nginx_exits(world: &mut World) {
    world.ensure_sample(Sample::ANY.replicas(1)).await;
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let params = ListParams::default().labels(&format!("balancer.exposer.hliangzhao.io/balancer-name={SAMPLE}"));
    let pod = pods.list(&params).await.expect("pods").items.into_iter().next().expect("a proxy pod");
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("a pod IP");
    let metrics = format!("{ip}:9113");
    let received = || sidecar_counts(&metrics, "balancer_proxy_received_bytes_total", "");
    // Once the lines of earlier sessions are all in.
    let before = eventually("the sidecar's counts to settle", Duration::from_secs(30), || async {
        let first = received().await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        (received().await? == first).then_some(first)
    })
    .await;
    let mut session = tokio::net::TcpStream::connect(format!("{ip}:80")).await.expect("a session to the proxy pod");
    pods.delete(&pod.name_any(), &kube::api::DeleteParams::default()).await.expect("delete the proxy pod");
    let deleted = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let request = b"GET / HTTP/1.1\r\nHost: echo\r\nConnection: close\r\n\r\n";
    session.write_all(request).await.expect("the request, on the session opened before the stop");
    let mut answer = String::new();
    session.read_to_string(&mut answer).await.expect("the answer");
    let backend = answer.lines().last().and_then(|l| l.strip_prefix("hello world ")).expect("an echo").to_string();
    let nginx = container_id(&pod, "nginx").expect("nginx's container ID");
    assert!(container_runs(&nginx), "nginx's processes are found on the host");
    let exited = eventually("nginx exited", Duration::from_secs(60), || async {
        (!container_runs(&nginx)).then_some(deleted.elapsed())
    })
    .await;
    let after = received().await.expect("the sidecar still serving after nginx exited");
    let counted = after.get(&backend).copied().unwrap_or(0.0) - before.get(&backend).copied().unwrap_or(0.0);
    println!(
        "node: nginx exited {:.1} s after its pod's delete; then the sidecar counted {counted} bytes from clients to \
         {backend} since before the delete",
        exited.as_secs_f64()
    );
    assert_eq!(counted, request.len() as f64, "the last session's request, and only it (probes send nothing)");
    eventually("the deleted proxy pod gone", Duration::from_secs(60), || async {
        pods.get_opt(&pod.name_any()).await.ok()?.is_none().then_some(())
    })
    .await;
    println!("node: the proxy pod gone {:.1} s after its delete", deleted.elapsed().as_secs_f64());
    wait_available(world, NS, &format!("{SAMPLE}-proxy"), 1).await;
    wait_ready_balancer(world, SAMPLE, Duration::from_secs(60)).await;
}

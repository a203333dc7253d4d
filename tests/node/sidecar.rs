//! The proxy pods' metrics sidecar: what it counts, read from its `/metrics`, and that it
//! outlives nginx to count a pod's last session.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fixtures::{Sample, wait_available, wait_ready_balancer};
use crate::toolkit::load::one_request;
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

/// The runtime's ID of `pod`'s container `name` (an init container, native sidecars included, too).
pub fn container_id(pod: &Pod, name: &str) -> Option<String> {
    let status = pod.status.as_ref()?;
    let mut statuses = status.container_statuses.iter().chain(&status.init_container_statuses).flatten();
    let id = statuses.find(|c| c.name == name)?.container_id.as_deref()?;
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
/// The sample with one proxy pod: the pods' API in its namespace, the pod, and its address.
async fn the_samples_one_proxy_pod(world: &mut World) -> (Api<Pod>, Pod, String) {
    world.ensure_sample(Sample::ANY.replicas(1)).await;
    let pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    let params = ListParams::default().labels(&format!("balancer.exposer.hliangzhao.io/balancer-name={SAMPLE}"));
    let pod = pods.list(&params).await.expect("pods").items.into_iter().next().expect("a proxy pod");
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("a pod IP");
    (pods, pod, ip)
}

pub async fn the_metrics_sidecar_counts_the_last_session_after_nginx_exits(world: &mut World) {
    let (pods, pod, ip) = the_samples_one_proxy_pod(world).await;
    let metrics = format!("{ip}:9113");
    let received = || sidecar_counts(&metrics, "balancer_proxy_received_bytes_total", "");
    // Once the lines of earlier sessions are all in: nginx's workers write theirs within a
    // second, and the sidecar reads them within 0.2 s.
    let before = eventually("the sidecar's counts to settle", Duration::from_secs(30), || async {
        let first = received().await?;
        tokio::time::sleep(Duration::from_millis(2500)).await;
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
    // nginx's workers write what they hold as they exit, and the sidecar reads it within 0.2 s.
    let since_before = |after: &BTreeMap<String, f64>| {
        after.get(&backend).copied().unwrap_or(0.0) - before.get(&backend).copied().unwrap_or(0.0)
    };
    let read_by = Instant::now() + Duration::from_secs(3);
    let mut after = received().await.expect("the sidecar still serving after nginx exited");
    while since_before(&after) == 0.0 && Instant::now() < read_by {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = received().await.expect("the sidecar still serving after nginx exited");
    }
    let counted = since_before(&after);
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

/// The pid of the process of container `id` whose command is `name`, as the host sees it.
fn container_process(id: &str, name: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid = entry.file_name().to_str()?.parse().ok()?;
        let ours = std::fs::read_to_string(entry.path().join("cgroup")).ok()?.contains(id);
        let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
        (ours && comm.trim() == name).then_some(pid)
    })
}

/// `path` in the container of process `pid`, as the host reaches it (through its root, which
/// shows the container's mounts).
fn in_container_of(pid: u32, path: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/{pid}/root{path}"))
}

/// The access log's volume in the proxy pod, as its containers see it.
const LOG_DIR: &str = balancer::proxy::access_log::LOG_DIR;

/// A process held still (SIGSTOP) until this is dropped (SIGCONT), on a panic too.
struct HeldStill(u32);

impl HeldStill {
    fn new(pid: u32) -> HeldStill {
        let _ = std::process::Command::new("kill").args(["-STOP", &pid.to_string()]).status();
        HeldStill(pid)
    }
}

impl Drop for HeldStill {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").args(["-CONT", &self.0.to_string()]).status();
    }
}

/// The access log's volume all but full, of a file nobody reads, until this is dropped (on a
/// panic too: the later scenarios count sessions). `pid` is a process of the proxy pod.
struct LogVolumeFilled(std::path::PathBuf);

impl LogVolumeFilled {
    fn new(pid: u32) -> LogVolumeFilled {
        let filler = in_container_of(pid, &format!("{LOG_DIR}/filler"));
        let size = balancer::proxy::access_log::LOG_VOLUME_BYTES as usize - 16 * 1024;
        // Whatever fits: the log may hold a few unread KiB already.
        let _ = std::fs::write(&filler, vec![0u8; size]);
        LogVolumeFilled(filler)
    }
}

impl Drop for LogVolumeFilled {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A stalled metrics sidecar fills the access log's volume and no more: the volume is an 8 MiB
/// tmpfs, nginx's writes to a full one fail, and nginx serves every request meanwhile; the pod
/// is neither evicted nor restarted. Let go, the sidecar counts again and its backlog clears.
pub async fn a_stalled_metrics_sidecar_costs_lines_not_the_proxy(world: &mut World) {
    let (pods, pod, ip) = the_samples_one_proxy_pod(world).await;
    let nginx = container_id(&pod, "nginx").and_then(|id| container_process(&id, "nginx")).expect("nginx's master");
    let sidecar = container_id(&pod, "metrics").and_then(|id| container_process(&id, "balancer")).expect("the sidecar");
    let mounts = std::fs::read_to_string(format!("/proc/{nginx}/mounts")).expect("nginx's mounts");
    let volume = mounts.lines().find(|l| l.contains(&format!(" {LOG_DIR} "))).expect("the log's volume").to_string();
    println!("node: the access log's volume, as nginx sees it: {volume}");
    assert!(volume.starts_with("tmpfs ") && volume.contains("size=8192k"), "an 8 MiB tmpfs: {volume}");

    let metrics = format!("{ip}:9113");
    let unread = || async {
        let text = scrape(&metrics).await?;
        text.lines()
            .find_map(|l| l.strip_prefix("balancer_proxy_log_unread_bytes{")?.split(' ').nth(1)?.parse::<f64>().ok())
    };
    let restarts = |pod: &Pod| -> i32 {
        let statuses = pod.status.iter().flat_map(|s| s.container_statuses.iter().chain(&s.init_container_statuses));
        statuses.flatten().map(|c| c.restart_count).sum()
    };
    // The sidecar stalls, and the volume is all but full.
    let stalled = HeldStill::new(sidecar);
    let filled = LogVolumeFilled::new(nginx);
    let volume = rustix::fs::statvfs(in_container_of(nginx, LOG_DIR)).expect("the volume's usage");
    let free = volume.f_bavail * volume.f_frsize;
    assert!(free < 64 * 1024, "less free than one of nginx's buffers: {free} bytes");
    let address = format!("{ip}:80");
    let mut failed = Vec::new();
    for _ in 0..2000 {
        if let Err(e) = one_request(&address).await {
            failed.push(e);
        }
    }
    // nginx writes its buffers within a second; the kubelet's eviction manager looks every 10 s.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let log = std::fs::metadata(in_container_of(nginx, &format!("{LOG_DIR}/access.log"))).map(|m| m.len());
    println!("node: 2,000 requests with the log's volume full: {} failed; the log's size {log:?}", failed.len());
    assert!(failed.is_empty(), "nginx served on with its log full: {failed:?}");
    let said = world.kubectl.ok(&["-n", NS, "logs", &pod.name_any(), "-c", "nginx"]);
    let full = said.lines().find(|l| l.contains("No space left on device") || l.contains("was incomplete"));
    println!("node: nginx said: {full:?}");
    assert!(full.is_some(), "nginx's writes to the full volume failed:\n{said}");
    let now = pods.get(&pod.name_any()).await.expect("the proxy pod, still there");
    assert_eq!(now.metadata.uid, pod.metadata.uid, "the same pod");
    assert_eq!(now.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"), "not evicted");
    assert_eq!(restarts(&now), restarts(&pod), "no container restarted");

    // Let go: the sidecar reads the backlog, and counts new sessions again.
    drop(filled);
    drop(stalled);
    let before = eventually("the sidecar's backlog to clear", Duration::from_secs(10), || async {
        (unread().await? < 4096.0).then_some(())?;
        proxy_sessions(&metrics).await
    })
    .await;
    for _ in 0..100 {
        one_request(&address).await.expect("an answer");
    }
    let counted = eventually("the sidecar to count the next sessions", Duration::from_secs(10), || async {
        let after = proxy_sessions(&metrics).await?;
        let counted: f64 = after.iter().map(|(b, n)| n - before.get(b).copied().unwrap_or(0.0)).sum();
        (counted >= 100.0).then_some(counted)
    })
    .await;
    println!("node: the sidecar let go cleared its backlog and counted {counted} of the next 100 sessions");
}

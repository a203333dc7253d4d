//! Live configuration: the sidecar watches its Balancer's ConfigMap with the pod's own token
//! (which may read that ConfigMap only), writes each new `nginx.conf` where the proxy container
//! picks it up, and learns from that container what nginx serves (see
//! [`reload`](crate::proxy::reload)).
//!
//! A pod's first configuration comes from a consistent list (the newest the API server has),
//! never from a kubelet's cache: a new pod serves the configuration current when it was created,
//! or a newer one. While the API server is away, nginx keeps serving the last configuration.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::metrics::{ProxyMetrics, Refusal};
use crate::proxy::nginx::CONFIG_FILE;
use crate::proxy::reload::{CONFIG_ID_PREFIX, LiveFiles, desired_file, short_id};
use crate::proxy::upstreams::Upstreams;
use crate::runtime::retry::{RetryDelay, relist_at_once};
use crate::util::hash::sha256_hex;

/// Where the configuration comes from in a live pod.
#[derive(Debug, Clone)]
pub struct LiveSource {
    /// The proxy's ConfigMap, in the pod's own namespace.
    pub config_map: String,
    /// The directory the proxy container shares with the sidecar.
    pub dir: PathBuf,
}

/// The largest `nginx.conf` applied; the API server stores no object above about 1.5 MiB.
pub const MAX_LIVE_CONFIG_BYTES: usize = 1 << 20;

/// How often the proxy container's answer (served or refused) is looked for.
const ANSWER_POLL: Duration = Duration::from_millis(100);

/// A configuration fit to hand to nginx: its text, id and upstreams.
#[derive(Debug, Clone)]
pub(super) struct Candidate {
    pub id: String,
    pub conf: String,
    pub upstreams: Upstreams,
}

/// Reads a ConfigMap's `nginx.conf`, or says why it cannot be applied. `balancer` is the one
/// this pod proxies for (`None` before its first configuration).
pub(super) fn candidate(config_map: &ConfigMap, balancer: Option<&str>) -> Result<Candidate, Refusal> {
    let conf = config_map.data.as_ref().and_then(|d| d.get(CONFIG_FILE)).ok_or(Refusal::NotRendered)?;
    if conf.len() > MAX_LIVE_CONFIG_BYTES {
        return Err(Refusal::TooLarge);
    }
    let upstreams = Upstreams::read(conf).ok_or(Refusal::NotRendered)?;
    if balancer.is_some_and(|b| b != upstreams.balancer) {
        return Err(Refusal::NotRendered);
    }
    Ok(Candidate { id: sha256_hex(conf), conf: conf.clone(), upstreams })
}

/// The watch of one ConfigMap, retried a few seconds apart at most while the API server is away.
pub(super) fn watch_config_map(
    client: Client,
    name: &str,
) -> impl Stream<Item = Result<ConfigMap, watcher::Error>> + Send + use<> {
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    // A list and a watch with this field selector are what a Role naming the one ConfigMap allows.
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    relist_at_once(watcher(api, config)).backoff(RetryDelay::default()).applied_objects()
}

/// Writes `candidate` for the proxy container: its id line, then the file, renamed into place
/// so that nginx never reads half of it.
pub(super) async fn hand_over(files: &LiveFiles<'_>, candidate: &Candidate) -> std::io::Result<()> {
    let next = format!("{}.next", files.desired);
    tokio::fs::write(&next, desired_file(&candidate.conf)).await?;
    tokio::fs::rename(&next, files.desired).await
}

/// The id in the first line of `path` (as the proxy container writes `served` and `rejected`).
async fn answered_id(path: &str) -> Option<String> {
    let text = tokio::fs::read_to_string(path).await.ok()?;
    let id = text.lines().next()?.strip_prefix(CONFIG_ID_PREFIX)?;
    Some(id.trim().to_string())
}

/// What the proxy container said about `id`: served, refused, or nothing yet.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answer {
    Served,
    Refused(String),
    Pending,
}

pub(super) async fn answer(files: &LiveFiles<'_>, id: &str) -> Answer {
    if answered_id(files.served).await.as_deref() == Some(id) {
        return Answer::Served;
    }
    if answered_id(files.rejected).await.as_deref() == Some(id) {
        let why = tokio::fs::read_to_string(files.rejected).await.unwrap_or_default();
        // The file holds at most 4 KiB of nginx's check; a log line gets its first lines.
        let why: String = why.lines().skip(1).take(4).collect::<Vec<_>>().join(" | ");
        return Answer::Refused(why.chars().take(1024).collect());
    }
    Answer::Pending
}

/// The files of a live pod, in `dir`.
pub fn files_in(dir: &Path) -> OwnedLiveFiles {
    let at = |name: &str| dir.join(name).display().to_string();
    OwnedLiveFiles { desired: at("nginx.conf"), served: at("served"), rejected: at("rejected") }
}

/// The sidecar's side of [`LiveFiles`], under a directory chosen at run time.
#[derive(Debug, Clone)]
pub struct OwnedLiveFiles {
    pub desired: String,
    pub served: String,
    pub rejected: String,
}

impl OwnedLiveFiles {
    /// The shared files as [`LiveFiles`] (the proxy container's own paths left empty).
    pub fn borrowed(&self) -> LiveFiles<'_> {
        LiveFiles {
            desired: &self.desired,
            running: "",
            candidate: "",
            pid_file: "",
            ipv6_probe: "",
            served: &self.served,
            rejected: &self.rejected,
        }
    }
}

/// Why a live sidecar cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot reach the API server from this pod: {0}")]
    Client(String),
    #[error("cannot write the configuration for nginx at {path}: {source}")]
    HandOver { path: String, source: std::io::Error },
}

/// The watch of a live pod's ConfigMap, once its first configuration is handed to nginx; `None`
/// when the pod stopped first. Until then the proxy container waits, and the pod is not Ready.
pub(super) async fn start(
    source: &LiveSource,
    stop: &CancellationToken,
) -> Result<Option<(ConfigMapChanges, OwnedLiveFiles, Candidate)>, StartError> {
    let config = kube::Config::incluster().map_err(|e| StartError::Client(e.to_string()))?;
    let client = kube::Client::try_from(config).map_err(|e| StartError::Client(e.to_string()))?;
    let files = files_in(&source.dir);
    let mut changes: ConfigMapChanges = Box::pin(watch_config_map(client, &source.config_map));
    let mut told = false;
    let first = loop {
        let next = tokio::select! {
            next = changes.next() => next,
            () = stop.cancelled() => return Ok(None),
        };
        match next {
            Some(Ok(config_map)) => match candidate(&config_map, None) {
                Ok(candidate) => break candidate,
                Err(reason) => {
                    tracing::warn!(reason = reason.as_str(), "the proxy's ConfigMap holds no configuration to serve")
                }
            },
            Some(Err(e)) if !told => {
                tracing::warn!(error = %e, config_map = %source.config_map, "cannot read the proxy's configuration yet; retrying");
                told = true;
            }
            Some(Err(_)) => {}
            None => return Ok(None),
        }
    };
    hand_over(&files.borrowed(), &first)
        .await
        .map_err(|source| StartError::HandOver { path: files.desired.clone(), source })?;
    tracing::info!(id = short_id(&first.id), "handed the first configuration to nginx");
    Ok(Some((changes, files, first)))
}

/// The ConfigMap's changes, as [`watch_config_map`] gives them.
pub(super) type ConfigMapChanges = std::pin::Pin<Box<dyn Stream<Item = Result<ConfigMap, watcher::Error>> + Send>>;

/// Follows the ConfigMap after the first configuration (`first`): each new one is handed to
/// nginx, and the metrics switch to it once nginx serves it. A refused one is counted and
/// logged; the last good one keeps serving. A change that arrives before nginx answered about
/// the one before replaces it (nginx applies only the newest). Runs until `stop`.
pub(super) async fn follow(
    changes: impl Stream<Item = Result<ConfigMap, watcher::Error>>,
    files: OwnedLiveFiles,
    first: &Candidate,
    metrics: Arc<ProxyMetrics>,
    stop: CancellationToken,
) {
    let balancer = first.upstreams.balancer.clone();
    let mut handed = first.id.clone();
    let mut pending: Option<Candidate> = None;
    let mut changes = std::pin::pin!(changes);
    let mut lost = false;
    let mut poll = tokio::time::interval(ANSWER_POLL);
    loop {
        let next = tokio::select! {
            next = changes.next() => next,
            _ = poll.tick(), if pending.is_some() => {
                if let Some(candidate) = pending.take() {
                    pending = report_answer(&files, candidate, &metrics).await;
                }
                continue;
            }
            () = stop.cancelled() => return,
        };
        let config_map = match next {
            Some(Ok(config_map)) => {
                if std::mem::take(&mut lost) {
                    tracing::info!("watching the proxy's ConfigMap again");
                }
                config_map
            }
            Some(Err(e)) => {
                if !std::mem::replace(&mut lost, true) {
                    tracing::warn!(error = %e, "lost the watch of the proxy's ConfigMap; nginx serves its last configuration");
                }
                continue;
            }
            None => return,
        };
        let candidate = match candidate(&config_map, Some(&balancer)) {
            Ok(candidate) if candidate.id == handed => continue,
            Ok(candidate) => candidate,
            Err(reason) => {
                tracing::warn!(config_map = %config_map.name_any(), reason = reason.as_str(), "configuration refused; nginx serves the last good one");
                metrics.refuse(reason);
                continue;
            }
        };
        if let Err(e) = hand_over(&files.borrowed(), &candidate).await {
            tracing::error!(error = %e, path = %files.desired, "cannot write the configuration for nginx");
            continue;
        }
        handed = candidate.id.clone();
        pending = Some(candidate);
    }
}

/// Reports nginx's answer about `candidate`, if it has one; otherwise gives it back.
async fn report_answer(files: &OwnedLiveFiles, candidate: Candidate, metrics: &ProxyMetrics) -> Option<Candidate> {
    let id = short_id(&candidate.id);
    match answer(&files.borrowed(), &candidate.id).await {
        Answer::Served => {
            tracing::info!(id, "nginx serves a new configuration");
            metrics.serve(&candidate.id, candidate.upstreams);
        }
        Answer::Refused(why) => {
            tracing::warn!(id, nginx = %why, "nginx refused a configuration; it serves the last good one");
            metrics.refuse(Refusal::Nginx);
        }
        Answer::Pending => return Some(candidate),
    }
    None
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use prometheus_client::registry::Registry;

    use super::*;
    use crate::proxy::nginx::config_hash;

    fn conf(balancer: &str, weight: u32) -> String {
        format!(
            "# Generated by balancer for Balancer \"{balancer}\". Do not edit: changes are overwritten.\n\
             stream {{\n    upstream port_80_tcp {{\n        server 10.0.0.1:80 weight={weight};  # {balancer}-v1-backend\n    }}\n\
             \x20   server {{\n        listen 80;\n        proxy_pass port_80_tcp;\n    }}\n}}\n"
        )
    }

    fn config_map(data: Option<&str>) -> ConfigMap {
        ConfigMap {
            data: data.map(|d| BTreeMap::from([(CONFIG_FILE.to_string(), d.to_string())])),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn only_balancers_rendering_for_this_balancer_within_the_bound_is_a_candidate() {
        let good = conf("lb", 1);
        let candidate = candidate(&config_map(Some(&good)), Some("lb")).expect("a candidate");
        assert_eq!(candidate.id, config_hash(&good));
        let refused = |data: Option<&str>| candidate_reason(&config_map(data));
        assert_eq!(refused(None), Some(Refusal::NotRendered));
        assert_eq!(refused(Some("events {}\n")), Some(Refusal::NotRendered));
        assert_eq!(refused(Some(&conf("other", 1))), Some(Refusal::NotRendered), "another Balancer's");
        let huge = format!("{good}{}", "#".repeat(MAX_LIVE_CONFIG_BYTES));
        assert_eq!(refused(Some(&huge)), Some(Refusal::TooLarge));
    }

    fn candidate_reason(config_map: &ConfigMap) -> Option<Refusal> {
        candidate(config_map, Some("lb")).err()
    }

    /// What the proxy container does: serves every id it is handed, except a refused one.
    async fn play_nginx(files: OwnedLiveFiles, refuse_weight: &'static str, stop: CancellationToken) {
        let mut last = String::new();
        while !stop.is_cancelled() {
            let text = tokio::fs::read_to_string(&files.desired).await.unwrap_or_default();
            let id = text.lines().next().unwrap_or_default().to_string();
            if !id.is_empty() && id != last {
                let (path, body) = match text.contains(refuse_weight) {
                    true => (&files.rejected, format!("{id}\nnginx: [emerg] no\n")),
                    false => (&files.served, format!("{id}\n")),
                };
                tokio::fs::write(path, body).await.expect("the answer");
                last = id;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn each_new_configuration_is_handed_to_nginx_and_counted_once_served_or_refused() {
        let dir = tempfile::tempdir().expect("a directory");
        let files = files_in(dir.path());
        let first = candidate(&config_map(Some(&conf("lb", 1))), None).expect("the first");
        let mut registry = Registry::default();
        let metrics = Arc::new(ProxyMetrics::register(&first.id, first.upstreams.clone(), &mut registry));
        let stop = CancellationToken::new();
        let nginx = tokio::spawn(play_nginx(files.clone(), "weight=66", stop.clone()));
        let (sender, changes) = futures::channel::mpsc::unbounded();
        let following = tokio::spawn({
            let (files, first, metrics, stop) = (files.clone(), first.clone(), metrics.clone(), stop.clone());
            async move { follow(changes, files, &first, metrics, stop).await }
        });
        let text = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
            text
        };
        let until = |wanted: &'static str| async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while !text().contains(wanted) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let text = text();
            assert!(text.contains(wanted), "no {wanted}: {text}");
            text
        };
        let send = |conf: Option<String>| sender.unbounded_send(Ok(config_map(conf.as_deref()))).expect("sent");
        send(Some(conf("lb", 1)));
        send(None);
        until("reason=\"not_rendered\"} 1").await;
        send(Some(conf("lb", 2)));
        let served = until("config_reloads_total{balancer=\"lb\"} 1").await;
        let id = short_id(&config_hash(&conf("lb", 2))).to_string();
        assert!(served.contains(&format!("balancer_proxy_config_info{{balancer=\"lb\",id=\"{id}\"}} 1")), "{served}");
        assert!(served.contains("backend=\"v1\"} 2"), "the new weight: {served}");
        send(Some(conf("lb", 66)));
        let refused = until("reason=\"nginx\"} 1").await;
        assert!(refused.contains("config_reloads_total{balancer=\"lb\"} 1"), "the same configuration once: {refused}");
        assert_eq!(refused.matches("balancer_proxy_config_info{").count(), 1, "one served configuration: {refused}");
        stop.cancel();
        let (_, _) = (nginx.await, following.await);
    }
}

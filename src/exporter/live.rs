//! Live configuration: the sidecar watches its Balancer's ConfigMap with the pod's own token
//! (which may read that ConfigMap only), writes each new `nginx.conf` where the proxy container
//! picks it up, and learns from that container what nginx serves (see
//! [`reload`](crate::proxy::reload)).
//!
//! A pod's first configuration comes from a consistent list (the newest the API server has),
//! never from a kubelet's cache: a new pod serves the configuration current when it was created,
//! or a newer one. While the API server is away, nginx keeps serving the last configuration.
//! The sidecar says a configuration is served (its metrics, and `/config`) only once the proxy
//! container says so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use super::metrics::{ProxyMetrics, Refusal};
use crate::proxy::model::{MAX_CONFIG_BYTES, MODEL_FILE, ProxyConfig};
use crate::proxy::nginx::{self, CONFIG_FILE};
use crate::proxy::reload::{CONFIG_ID_PREFIX, desired_file, short_id};
use crate::proxy::signature::{ConfigKey, Subject};
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
    /// The operator's public key: only configurations it signed for this pod's namespace and
    /// Balancer are applied. `None`: any rendering for the Balancer (a pod the operator did
    /// not make, from `balancer render`).
    pub key: Option<ConfigKey>,
    /// Whose configurations the pod applies ([`ProxyConfig::identity`]), from the pod template,
    /// so that not even its first is another owner's; `None`: the first one's owner.
    pub owner: Option<String>,
    /// The owner's `metadata.uid`, which the operator's signature binds (from the pod template).
    pub owner_uid: String,
}

/// Whose configurations this pod applies: those signed with `key` for its `namespace` and
/// owner.
#[derive(Debug, Clone)]
pub(super) struct Trust {
    key: Option<ConfigKey>,
    namespace: String,
    owner_uid: String,
}

impl Trust {
    /// The sequence of the configuration in `data` when the operator signed it for `owner` (see
    /// [`signature`](crate::proxy::signature)); `Some(0)` for a pod that checks nothing.
    fn sequence(&self, owner: &str, data: &BTreeMap<String, String>) -> Option<u64> {
        let Some(key) = self.key else { return Some(0) };
        key.sealed_sequence(data, &Subject { namespace: &self.namespace, owner, uid: &self.owner_uid })
    }

    /// Whether `candidate` is an earlier configuration written back: signed, and below `floor`
    /// (the sequence of the newest one taken), or at it with other files than `handed`'s. A pod
    /// that checks no signature has no sequence to go by.
    fn replayed(&self, candidate: &Candidate, floor: u64, handed: &str) -> bool {
        self.key.is_some() && (candidate.sequence < floor || (candidate.sequence == floor && candidate.id != handed))
    }
}

/// The most of the proxy container's answers read: an id line and 4 KiB of `nginx -t`.
const MAX_ANSWER_BYTES: u64 = 8 << 10;

/// How often the proxy container's answer (served or refused), or a write that failed, is
/// looked at again.
const ANSWER_POLL: Duration = Duration::from_millis(100);

/// The files the sidecar shares with the proxy container (see
/// [`LiveFiles`](crate::proxy::reload::LiveFiles) for the container's side).
#[derive(Debug, Clone)]
pub(super) struct SharedFiles {
    /// The newest configuration, with its id line, for nginx.
    desired: PathBuf,
    /// The id line of the configuration nginx serves.
    served: PathBuf,
    /// The id line of the last configuration nginx refused, then why.
    rejected: PathBuf,
    /// The sidecar's own: the sequence of the newest configuration it took, which outlives a
    /// restart of the sidecar alone (nginx, still running, must not be handed an older one).
    floor: PathBuf,
}

impl SharedFiles {
    /// The files in `dir`, named as [`LIVE_POD_FILES`](crate::proxy::reload::LIVE_POD_FILES) has them.
    pub(super) fn in_dir(dir: &Path) -> SharedFiles {
        SharedFiles {
            desired: dir.join("nginx.conf"),
            served: dir.join("served"),
            rejected: dir.join("rejected"),
            floor: dir.join("sequence"),
        }
    }

    /// The sequence a sidecar of this pod took last (0 when none did).
    pub(super) async fn floor(&self) -> u64 {
        let text = read_answer(&self.floor).await.unwrap_or_default();
        text.trim().parse().unwrap_or_default()
    }

    /// Keeps `floor` for a restarted sidecar; one that cannot be written is logged, and costs
    /// only the restart's check.
    async fn keep_floor(&self, floor: u64) {
        if let Err(e) = tokio::fs::write(&self.floor, floor.to_string()).await {
            tracing::warn!(error = %e, path = %self.floor.display(), "cannot keep the configuration's sequence");
        }
    }
}

/// The first configuration a sidecar takes: [`candidate`], and not below `floor`, the sequence
/// an earlier run of the sidecar in this pod took (its nginx still serves that one or newer).
pub(super) fn first_candidate(
    config_map: &ConfigMap,
    owner: Option<&str>,
    trust: &Trust,
    floor: u64,
) -> Result<Candidate, Refusal> {
    let first = candidate(config_map, owner, trust)?;
    if trust.key.is_some() && first.sequence < floor {
        return Err(Refusal::Replayed);
    }
    Ok(first)
}

/// A configuration fit to hand to nginx: its text, id and upstreams.
#[derive(Debug, Clone)]
pub(super) struct Candidate {
    pub id: String,
    pub conf: String,
    pub upstreams: Upstreams,
    /// The canary window it was made for (see [`ProxyConfig::canary_window`]).
    pub window: Option<String>,
    /// The operator's sequence for it: a pod never applies one below what it applied before.
    pub sequence: u64,
}

/// Reads a ConfigMap's `nginx.conf` and its model, or says why they cannot be applied.
/// `balancer` is the one this pod proxies for (`None` before its first configuration).
pub(super) fn candidate(config_map: &ConfigMap, balancer: Option<&str>, trust: &Trust) -> Result<Candidate, Refusal> {
    let data = config_map.data.as_ref();
    let conf = data.and_then(|d| d.get(CONFIG_FILE)).ok_or(Refusal::NotRendered)?;
    let model = data.and_then(|d| d.get(MODEL_FILE)).ok_or(Refusal::NotRendered)?;
    if conf.len() > MAX_CONFIG_BYTES || model.len() > MAX_CONFIG_BYTES {
        return Err(Refusal::TooLarge);
    }
    let (upstreams, window) = rendered(conf, model).ok_or(Refusal::NotRendered)?;
    if balancer.is_some_and(|b| b != upstreams.balancer) {
        return Err(Refusal::NotRendered);
    }
    let sequence = data.and_then(|data| trust.sequence(&upstreams.balancer, data)).ok_or(Refusal::Unsigned)?;
    Ok(Candidate { id: sha256_hex(conf), conf: conf.clone(), upstreams, window, sequence })
}

/// The upstreams of `model`, and the canary window it was made for, when it reads and `conf` is
/// balancer's rendering for its Balancer.
pub(super) fn rendered(conf: &str, model: &str) -> Option<(Upstreams, Option<String>)> {
    let model = ProxyConfig::from_json(model)?;
    nginx::is_rendered_for(conf, &model).then(|| (Upstreams::of(&model), model.canary_window))
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
pub(super) async fn hand_over(files: &SharedFiles, candidate: &Candidate) -> std::io::Result<()> {
    let next = files.desired.with_extension("conf.next");
    tokio::fs::write(&next, desired_file(&candidate.conf)).await?;
    tokio::fs::rename(&next, &files.desired).await
}

/// The start of a file the proxy container writes, [`MAX_ANSWER_BYTES`] at most.
async fn read_answer(path: &Path) -> Option<String> {
    let file = tokio::fs::File::open(path).await.ok()?;
    let mut text = String::new();
    file.take(MAX_ANSWER_BYTES).read_to_string(&mut text).await.ok()?;
    Some(text)
}

/// The id in the first line of an answer.
fn answered_id(text: &str) -> Option<&str> {
    Some(text.lines().next()?.strip_prefix(CONFIG_ID_PREFIX)?.trim())
}

/// What the proxy container said about `id`: served, refused, or nothing yet.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answer {
    Served,
    Refused(String),
    Pending,
}

pub(super) async fn answer(files: &SharedFiles, id: &str) -> Answer {
    let served = read_answer(&files.served).await;
    if served.as_deref().and_then(answered_id) == Some(id) {
        return Answer::Served;
    }
    let Some(rejected) = read_answer(&files.rejected).await else { return Answer::Pending };
    if answered_id(&rejected) != Some(id) {
        return Answer::Pending;
    }
    // A log line gets the first lines of nginx's check.
    let why: String = rejected.lines().skip(1).take(4).collect::<Vec<_>>().join(" | ");
    Answer::Refused(why.chars().take(1024).collect())
}

/// Why a live sidecar cannot start.
#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot reach the API server from this pod: {0}")]
    Client(String),
}

/// The watch of a live pod's ConfigMap and its first configuration, found; `None` when the pod
/// stopped first. Until [`follow`] hands it over, the proxy container waits, and the pod is not
/// Ready.
pub(super) async fn start(
    source: &LiveSource,
    stop: &CancellationToken,
) -> Result<Option<(ConfigMapChanges, Candidate, Trust)>, StartError> {
    let config = kube::Config::incluster().map_err(|e| StartError::Client(e.to_string()))?;
    let client = kube::Client::try_from(config).map_err(|e| StartError::Client(e.to_string()))?;
    let namespace = client.default_namespace().to_string();
    let trust = Trust { key: source.key, namespace, owner_uid: source.owner_uid.clone() };
    let mut changes: ConfigMapChanges = Box::pin(watch_config_map(client, &source.config_map));
    let floor = SharedFiles::in_dir(&source.dir).floor().await;
    let mut told = false;
    loop {
        let next = tokio::select! {
            next = changes.next() => next,
            () = stop.cancelled() => return Ok(None),
        };
        match next {
            Some(Ok(config_map)) => match first_candidate(&config_map, source.owner.as_deref(), &trust, floor) {
                Ok(first) => return Ok(Some((changes, first, trust))),
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
    }
}

/// The ConfigMap's changes, as [`watch_config_map`] gives them.
pub(super) type ConfigMapChanges = std::pin::Pin<Box<dyn Stream<Item = Result<ConfigMap, watcher::Error>> + Send>>;

/// A configuration handed, or to hand, to nginx, and not yet answered.
struct Pending {
    candidate: Candidate,
    /// Written to the shared directory (a failed write is tried again at the next poll).
    written: bool,
    /// The pod's first: nginx starts on it rather than reloading.
    first: bool,
}

/// Hands `first` and each later configuration to nginx, and follows the ConfigMap: the metrics
/// (and `/config`) switch to a configuration once nginx serves it. A refused one is counted and
/// logged, and the last good one keeps serving, as does an earlier one written back (its
/// sequence is below the newest taken). A change that arrives before nginx answered about the
/// one before replaces it: nginx applies only the newest. Runs until `stop`.
pub(super) async fn follow(
    changes: impl Stream<Item = Result<ConfigMap, watcher::Error>>,
    files: SharedFiles,
    first: Candidate,
    trust: Trust,
    metrics: Arc<ProxyMetrics>,
    stop: CancellationToken,
) {
    let balancer = first.upstreams.balancer.clone();
    let mut handed = first.id.clone();
    let mut handed_window = first.window.clone();
    // The sequence of the newest configuration taken: none below it is taken again.
    let mut floor = first.sequence;
    files.keep_floor(floor).await;
    let mut pending = Some(Pending { candidate: first, written: false, first: true });
    let mut changes = std::pin::pin!(changes);
    let mut lost = false;
    let mut poll = tokio::time::interval(ANSWER_POLL);
    // After a quiet hour, the next change is looked at once per poll, not in a burst of the
    // ticks missed meanwhile.
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let next = tokio::select! {
            _ = poll.tick(), if pending.is_some() => {
                if let Some(waiting) = pending.take() {
                    pending = advance(&files, waiting, &metrics).await;
                }
                continue;
            }
            next = changes.next() => next,
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
        match candidate(&config_map, Some(&balancer), &trust) {
            Ok(candidate) if trust.replayed(&candidate, floor, &handed) => {
                tracing::warn!(config_map = %config_map.name_any(), sequence = candidate.sequence, floor, "an earlier configuration was written back; nginx serves the newer one");
                metrics.refuse(Refusal::Replayed);
            }
            Ok(candidate) if candidate.id == handed => {
                floor = candidate.sequence;
                files.keep_floor(floor).await;
                // The same nginx.conf for another canary step: its window opens once nginx
                // serves it, which it may do already.
                if candidate.window != handed_window {
                    handed_window = candidate.window.clone();
                    match pending.as_mut() {
                        Some(waiting) => waiting.candidate.window = candidate.window,
                        // Only over the configuration nginx serves: not over one it refused.
                        None if metrics.served_id() == short_id(&candidate.id) => {
                            metrics.serve_window(candidate.window.as_deref())
                        }
                        None => {}
                    }
                }
            }
            Ok(candidate) => {
                floor = candidate.sequence;
                files.keep_floor(floor).await;
                handed = candidate.id.clone();
                handed_window = candidate.window.clone();
                let first = pending.as_ref().is_some_and(|p| p.first);
                pending = Some(Pending { candidate, written: false, first });
                poll.reset_immediately();
            }
            Err(reason) => {
                tracing::warn!(config_map = %config_map.name_any(), reason = reason.as_str(), "configuration refused; nginx serves the last good one");
                metrics.refuse(reason);
            }
        }
    }
}

/// One step for a pending configuration: written, then answered. Gives it back while it waits.
async fn advance(files: &SharedFiles, mut pending: Pending, metrics: &ProxyMetrics) -> Option<Pending> {
    let id = short_id(&pending.candidate.id).to_string();
    if !pending.written {
        match hand_over(files, &pending.candidate).await {
            Ok(()) => pending.written = true,
            Err(e) => {
                tracing::error!(error = %e, path = %files.desired.display(), id, "cannot write the configuration for nginx; trying again");
                return Some(pending);
            }
        }
    }
    match answer(files, &pending.candidate.id).await {
        Answer::Served if pending.first => {
            tracing::info!(id, "nginx serves its first configuration");
            metrics.serve_window(pending.candidate.window.as_deref());
            metrics.started(&pending.candidate.id, pending.candidate.upstreams);
        }
        Answer::Served => {
            tracing::info!(id, "nginx serves a new configuration");
            metrics.serve_window(pending.candidate.window.as_deref());
            metrics.serve(&pending.candidate.id, pending.candidate.upstreams);
        }
        Answer::Refused(why) => {
            tracing::warn!(id, nginx = %why, "nginx refused a configuration; it serves the last good one");
            metrics.refuse(Refusal::Nginx);
        }
        Answer::Pending => return Some(pending),
    }
    None
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use prometheus_client::registry::Registry;

    use super::*;
    use crate::proxy::nginx::config_hash;

    /// A file and its model, as the controller writes them: one backend of `weight`.
    fn rendered(balancer: &str, weight: u32) -> (String, String) {
        let model = format!(
            r#"{{"balancer": "{balancer}", "drainTimeout": "1h", "listeners": [{{"port": 80, "protocol": "TCP",
                "method": "RoundRobin", "servers": [{{"address": "10.0.0.1:80", "backend": "v1", "weight": {weight}}}]}}]}}"#
        );
        let conf = nginx::write(&ProxyConfig::from_json(&model).expect("a model"));
        (conf, model)
    }

    fn conf(balancer: &str, weight: u32) -> String {
        rendered(balancer, weight).0
    }

    fn config_map(data: Option<&(String, String)>) -> ConfigMap {
        let data = data.map(|(conf, model)| {
            BTreeMap::from([(CONFIG_FILE.to_string(), conf.clone()), (MODEL_FILE.to_string(), model.clone())])
        });
        ConfigMap { data, ..ConfigMap::default() }
    }

    #[test]
    fn only_balancers_rendering_for_this_balancer_within_the_bound_is_a_candidate() {
        let good = rendered("lb", 1);
        let candidate = candidate(&config_map(Some(&good)), Some("lb"), &unsigned()).expect("a candidate");
        assert_eq!(candidate.id, config_hash(&good.0));
        assert_eq!(candidate.upstreams.backend("10.0.0.1:80"), Some("v1"), "read from the model");
        let refused = |data: Option<(String, String)>| candidate_reason(&config_map(data.as_ref()));
        let model = good.1.clone();
        assert_eq!(refused(None), Some(Refusal::NotRendered));
        assert_eq!(refused(Some(("events {}\n".into(), model.clone()))), Some(Refusal::NotRendered));
        assert_eq!(refused(Some((good.0.clone(), "{}".into()))), Some(Refusal::NotRendered), "no model");
        assert_eq!(refused(Some(rendered("other", 1))), Some(Refusal::NotRendered), "another Balancer's");
        let (other_conf, _) = rendered("other", 1);
        assert_eq!(refused(Some((other_conf, model.clone()))), Some(Refusal::NotRendered), "a file not of its model");
        let huge = format!("{}{}", good.0, "#".repeat(MAX_CONFIG_BYTES));
        assert_eq!(refused(Some((huge, model))), Some(Refusal::TooLarge));
        let only_file = ConfigMap {
            data: Some(BTreeMap::from([(CONFIG_FILE.to_string(), good.0.clone())])),
            ..ConfigMap::default()
        };
        assert_eq!(candidate_reason(&only_file), Some(Refusal::NotRendered), "a file without its model");
    }

    fn candidate_reason(config_map: &ConfigMap) -> Option<Refusal> {
        candidate(config_map, Some("lb"), &unsigned()).err()
    }

    const UID: &str = "uid-1";

    /// `data` sealed by `signer` for Balancer `lb` of `uid` in `namespace`, at `sequence`.
    fn sealed(
        signer: &crate::proxy::signature::ConfigSigner,
        (namespace, uid): (&str, &str),
        (conf, model): &(String, String),
        sequence: u64,
    ) -> ConfigMap {
        let mut config_map = config_map(Some(&(conf.clone(), model.clone())));
        let subject = Subject { namespace, owner: "lb", uid };
        let data = config_map.data.get_or_insert_default();
        signer.seal(data, &subject, None, 0, sequence);
        config_map
    }

    fn signer() -> crate::proxy::signature::ConfigSigner {
        use crate::proxy::signature::ConfigSigner;
        ConfigSigner::from_pkcs8(&ConfigSigner::generate().expect("a key")).expect("a signer")
    }

    fn trusting(signer: &crate::proxy::signature::ConfigSigner) -> Trust {
        Trust { key: Some(signer.public_key()), namespace: "ns".into(), owner_uid: UID.into() }
    }

    #[test]
    fn a_pod_with_the_operators_key_takes_only_what_the_operator_signed_for_its_owner() {
        use crate::proxy::signature::SIGNATURE_FILE;
        let signer = signer();
        let trust = trusting(&signer);
        let good = rendered("lb", 1);
        let taken = candidate(&sealed(&signer, ("ns", UID), &good, 7), Some("lb"), &trust).expect("a candidate");
        assert_eq!(taken.sequence, 7);
        assert_eq!(candidate(&config_map(Some(&good)), Some("lb"), &trust).err(), Some(Refusal::Unsigned), "unsigned");
        let elsewhere = candidate(&sealed(&signer, ("other", UID), &good, 7), Some("lb"), &trust).err();
        assert_eq!(elsewhere, Some(Refusal::Unsigned), "signed for another namespace's namesake");
        let namesake = candidate(&sealed(&signer, ("ns", "uid-0"), &good, 7), Some("lb"), &trust).err();
        assert_eq!(namesake, Some(Refusal::Unsigned), "signed for a deleted namesake");
        // A well-formed model with another upstream, under the signature of the operator's.
        let mut forged = sealed(&signer, ("ns", UID), &good, 7);
        let (conf, model) = rendered("lb", 1);
        let data = forged.data.get_or_insert_default();
        data.insert(CONFIG_FILE.into(), conf.replace("10.0.0.1:80", "169.254.169.254:80"));
        data.insert(MODEL_FILE.into(), model.replace("10.0.0.1:80", "169.254.169.254:80"));
        assert_eq!(candidate(&forged, Some("lb"), &trust).err(), Some(Refusal::Unsigned), "forged upstream");
        let mut renumbered = sealed(&signer, ("ns", UID), &good, 7);
        renumbered.data.get_or_insert_default().insert(crate::proxy::signature::SEQUENCE_FILE.into(), "8".into());
        assert_eq!(candidate(&renumbered, Some("lb"), &trust).err(), Some(Refusal::Unsigned), "another sequence");
        renumbered.data.get_or_insert_default().remove(SIGNATURE_FILE);
        assert_eq!(candidate(&renumbered, Some("lb"), &trust).err(), Some(Refusal::Unsigned), "no signature");
    }

    /// A pod that checks no signature.
    fn unsigned() -> Trust {
        Trust { key: None, namespace: "ns".into(), owner_uid: String::new() }
    }

    /// What the proxy container does: serves every id it is handed, except a refused one.
    async fn play_nginx(files: SharedFiles, refuse_weight: &'static str, stop: CancellationToken) {
        let mut last = String::new();
        while !stop.is_cancelled() {
            let text = tokio::fs::read_to_string(&files.desired).await.unwrap_or_default();
            let id = text.lines().next().unwrap_or_default().to_string();
            if !id.is_empty() && id != last {
                let (path, body) = if text.contains(refuse_weight) {
                    (&files.rejected, format!("{id}\nnginx: [emerg] no\n"))
                } else {
                    (&files.served, format!("{id}\n"))
                };
                tokio::fs::write(path, body).await.expect("the answer");
                last = id;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A sidecar following the ConfigMaps sent to it, from `first`, under `trust`, writing for
    /// nginx in `files`; its metrics, as `/metrics` would give them.
    struct Following {
        sender: futures::channel::mpsc::UnboundedSender<Result<ConfigMap, watcher::Error>>,
        registry: Registry,
        metrics: Arc<ProxyMetrics>,
        stop: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    impl Following {
        fn start(files: &SharedFiles, first: Candidate, trust: Trust) -> Following {
            let mut registry = Registry::default();
            let metrics = Arc::new(ProxyMetrics::register(None, first.upstreams.clone(), &mut registry));
            let stop = CancellationToken::new();
            let (sender, changes) = futures::channel::mpsc::unbounded();
            let task = tokio::spawn(follow(changes, files.clone(), first, trust, metrics.clone(), stop.clone()));
            Following { sender, registry, metrics, stop, task }
        }

        fn send(&self, config_map: ConfigMap) {
            self.sender.unbounded_send(Ok(config_map)).expect("sent");
        }

        fn text(&self) -> String {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("encodes");
            text
        }

        /// The metrics once they hold `wanted` (5 s at most).
        async fn until(&self, wanted: &str) -> String {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while !self.text().contains(wanted) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let text = self.text();
            assert!(text.contains(wanted), "no {wanted}: {text}");
            text
        }

        /// Stops it, and waits until it has.
        async fn stop(self) {
            self.stop.cancel();
            let _ = self.task.await;
        }
    }

    #[tokio::test]
    async fn each_new_configuration_is_handed_to_nginx_and_counted_once_served_or_refused() {
        let dir = tempfile::tempdir().expect("a directory");
        let files = SharedFiles::in_dir(dir.path());
        let first = candidate(&config_map(Some(&rendered("lb", 1))), None, &unsigned()).expect("the first");
        let following = Following::start(&files, first.clone(), unsigned());
        // Handed over, and not yet said to be served: nginx has not started on it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let handed = std::fs::read_to_string(&files.desired).expect("the desired file");
        assert_eq!(handed, crate::proxy::reload::desired_file(&conf("lb", 1)));
        assert_eq!(following.metrics.served_id(), "", "nothing served before nginx says so");
        let nginx = tokio::spawn(play_nginx(files.clone(), "weight=66", following.stop.clone()));
        let send = |data: Option<(String, String)>| following.send(config_map(data.as_ref()));
        let started = following.until("balancer_proxy_config_info{").await;
        assert!(started.contains(&format!("id=\"{}\"}} 1", short_id(&first.id))), "{started}");
        assert!(started.contains("config_reloads_total{balancer=\"lb\"} 0"), "a start is no reload: {started}");
        send(Some(rendered("lb", 1)));
        send(None);
        following.until("reason=\"not_rendered\"} 1").await;
        send(Some(rendered("lb", 2)));
        let served = following.until("config_reloads_total{balancer=\"lb\"} 1").await;
        let id = short_id(&config_hash(&conf("lb", 2))).to_string();
        assert!(served.contains(&format!("balancer_proxy_config_info{{balancer=\"lb\",id=\"{id}\"}} 1")), "{served}");
        assert!(served.contains("backend=\"v1\"} 2"), "the new weight: {served}");
        send(Some(rendered("lb", 66)));
        let refused = following.until("reason=\"nginx\"} 1").await;
        assert!(refused.contains("config_reloads_total{balancer=\"lb\"} 1"), "the same configuration once: {refused}");
        assert_eq!(refused.matches("balancer_proxy_config_info{").count(), 1, "one served configuration: {refused}");
        following.stop().await;
        let _ = nginx.await;
    }

    /// The newest sequence taken is kept in the pod's shared directory, and a restarted sidecar
    /// takes no first configuration below it.
    #[tokio::test]
    async fn a_restarted_sidecar_takes_nothing_older_than_its_pod_took() {
        let signer = signer();
        let trust = trusting(&signer);
        let dir = tempfile::tempdir().expect("a directory");
        let files = SharedFiles::in_dir(dir.path());
        assert_eq!(files.floor().await, 0, "a new pod has no floor");
        let at = |weight: u32, sequence: u64| sealed(&signer, ("ns", UID), &rendered("lb", weight), sequence);
        let first = candidate(&at(1, 100), Some("lb"), &trust).expect("the first");
        let following = Following::start(&files, first, trust.clone());
        following.send(at(2, 200));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while files.floor().await != 200 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        following.stop().await;
        assert_eq!(files.floor().await, 200, "kept for a restart");
        let refused = first_candidate(&at(1, 100), Some("lb"), &trust, files.floor().await).err();
        assert_eq!(refused, Some(Refusal::Replayed), "the restarted sidecar refuses the older one");
        assert!(first_candidate(&at(2, 200), Some("lb"), &trust, 200).is_ok(), "the one it took");
        assert!(first_candidate(&at(1, 100), Some("lb"), &unsigned(), 200).is_ok(), "nothing to go by unsigned");
    }

    /// An earlier signed configuration written back is refused and counted, whether its
    /// `nginx.conf` differs (no reload) or only its canary window does; the newer one stays.
    #[tokio::test]
    async fn an_earlier_signed_configuration_is_never_taken_again() {
        let signer = signer();
        let trust = trusting(&signer);
        let dir = tempfile::tempdir().expect("a directory");
        let files = SharedFiles::in_dir(dir.path());
        let at = |weight: u32, sequence: u64| sealed(&signer, ("ns", UID), &rendered("lb", weight), sequence);
        let first = candidate(&at(1, 100), Some("lb"), &trust).expect("the first");
        let following = Following::start(&files, first, trust);
        let nginx = tokio::spawn(play_nginx(files.clone(), "weight=66", following.stop.clone()));
        following.until("balancer_proxy_config_info{").await;
        following.send(at(2, 200));
        following.until("config_reloads_total{balancer=\"lb\"} 1").await;
        // Written back: the first, with its own sequence; the same sequence with other files.
        following.send(at(1, 100));
        following.until("reason=\"replayed\"} 1").await;
        following.send(at(3, 200));
        let refused = following.until("reason=\"replayed\"} 2").await;
        assert!(refused.contains("config_reloads_total{balancer=\"lb\"} 1"), "no reload: {refused}");
        let id = short_id(&config_hash(&conf("lb", 2))).to_string();
        assert!(refused.contains(&format!("id=\"{id}\"}} 1")), "the newer one serves: {refused}");
        // The same file again at its own sequence (a relist) is nothing; a newer one is taken.
        following.send(at(2, 200));
        following.send(at(3, 300));
        let served = following.until("config_reloads_total{balancer=\"lb\"} 2").await;
        assert!(served.contains("reason=\"replayed\"} 2"), "{served}");
        following.stop().await;
        let _ = nginx.await;
    }
}

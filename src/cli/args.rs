//! Every flag of every command, and what each becomes: the only place that knows flags.
#![allow(
    missing_docs,
    reason = "clap reads doc comments as help text: each command and flag is documented by its help, which docs/cli.md and its test check"
)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::api::conversion::Version;
use crate::controller::{self, Scope};
use crate::manager::{Certificate, ClusterConfig, Config, LeaderElection};
use crate::proxy::ProxySettings;
use crate::proxy::signature::ConfigKey;
use crate::runtime::logging::LogFormat;
use crate::runtime::throttle::Rate;
use crate::spec::{SchedulingPolicy, SpecPolicy};

#[derive(Debug, Parser)]
#[command(
    name = "balancer",
    version,
    about = "Weighted TCP/UDP load balancers for Kubernetes: admission webhooks and controller"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the admission webhooks over HTTPS, plus health and metrics over HTTP.
    Run(Box<RunArgs>),
    /// Generate a CA and a serving certificate (for clusters without cert-manager); prints the base64 caBundle.
    Certs(CertsArgs),
    /// Print the Balancer CustomResourceDefinition as YAML.
    Crd,
    /// Validate Balancer YAML files offline with exactly the webhook's rules.
    Check(CheckArgs),
    /// Print, as YAML, every object the controller would apply for the Balancers in FILE (a dry run).
    Render(RenderArgs),
    /// Rewrite the Balancers in FILE to another API version, as the conversion webhook would.
    Convert(ConvertArgs),
    /// Rewrite ingress-nginx's tcp-services and udp-services ConfigMaps in FILE, with the Services
    /// they name, as Balancers serving the same ports with the same pods.
    FromIngressNginx(FromIngressNginxArgs),
    /// Count a proxy pod's sessions from nginx's log and serve them as Prometheus metrics (the
    /// sidecar the controller adds to proxy pods with --proxy-metrics-image).
    ProxyMetrics(ProxyMetricsArgs),
    /// Promote, abort, retry or show a Balancer's canary (through its status, which a GitOps sync
    /// does not overwrite).
    Canary(CanaryArgs),
}

#[derive(Debug, Args)]
pub struct CanaryArgs {
    #[command(subcommand)]
    pub command: CanaryCommand,
}

#[derive(Debug, Subcommand)]
pub enum CanaryCommand {
    /// End the current step (a pause, or one held for data) and take the next; with --full, take
    /// every step left.
    Promote {
        #[command(flatten)]
        target: CanaryTarget,
        /// Take every step left at once: the spec's weights serve.
        #[arg(long)]
        full: bool,
    },
    /// Roll the canary back, as spec.canary.rollback says.
    Abort(CanaryTarget),
    /// Start an aborted canary again from its first step.
    Retry(CanaryTarget),
    /// Show where the canary is, what it measured and what it decided.
    Status(CanaryTarget),
}

#[derive(Debug, Args)]
pub struct CanaryTarget {
    /// The Balancer.
    pub name: String,
    /// Its namespace; the kubeconfig context's by default.
    #[arg(short, long)]
    pub namespace: Option<String>,
}

#[derive(Debug, Args)]
pub struct ProxyMetricsArgs {
    /// The proxy's nginx.conf, as balancer rendered it (read once, at start).
    #[arg(long, required_unless_present = "configmap", conflicts_with = "configmap")]
    pub config: Option<PathBuf>,
    /// The proxy's ConfigMap, in the pod's namespace: followed live with the pod's token, each
    /// new nginx.conf written to --live-dir for the proxy container to reload.
    #[arg(long)]
    pub configmap: Option<String>,
    /// The directory the sidecar shares with the proxy container (with --configmap).
    #[arg(long, default_value = "/run/balancer")]
    pub live_dir: PathBuf,
    /// The operator's public key (base64 Ed25519): with --configmap, only configurations it
    /// signed for this pod's Balancer (--owner-uid) are applied, each no older than the last.
    /// The controller sets it on proxy pods.
    #[arg(long, env = "BALANCER_CONFIG_KEY", requires = "owner_uid")]
    pub config_key: Option<ConfigKey>,
    /// The `metadata.uid` of the Balancer (or Gateway) the pod serves, which the operator's
    /// signature binds: a deleted namesake's configurations are refused. The controller sets it.
    #[arg(long, env = "BALANCER_OWNER_UID")]
    pub owner_uid: Option<String>,
    /// Whose configurations are applied, with --configmap: a Balancer's name (or
    /// `Gateway/<name>`); any other owner's is refused, the first one included. Without it, the
    /// owner of the first configuration read. The controller sets it on proxy pods.
    #[arg(long, env = "BALANCER_OWNER")]
    pub owner: Option<String>,
    /// The SHA-256 (hex) the config must have: the sidecar waits until the mounted file is that
    /// one. The controller sets it on proxy pods.
    #[arg(long, env = "BALANCER_CONFIG_HASH")]
    pub config_hash: Option<String>,
    /// Address of the plain-HTTP /metrics server.
    #[arg(long, default_value = "0.0.0.0:9113")]
    pub listen: SocketAddr,
    /// The file nginx appends its log to, on a volume shared with the proxy container: read as
    /// it grows, and freed as it is read (created when missing).
    #[arg(long, default_value = crate::proxy::access_log::LOG_FILE)]
    pub log_file: PathBuf,
    /// How long, after SIGTERM, to go on counting and serving the last count at most (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub drain: Duration,
    /// Log format.
    #[arg(long, env = "BALANCER_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormatArg,
    /// Log filter when RUST_LOG is unset (e.g. info, balancer=debug).
    #[arg(long, env = "BALANCER_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Address of the HTTPS admission webhook server.
    #[arg(long, env = "BALANCER_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,
    /// Address of the plain-HTTP server for /healthz and /readyz (and /metrics with --insecure-metrics).
    #[arg(long, env = "BALANCER_PROBE_ADDR", default_value = "0.0.0.0:8080")]
    pub probe_addr: SocketAddr,
    /// Address of the HTTPS /metrics endpoint, which admits bearer tokens allowed to `get /metrics`
    /// (TokenReview + SubjectAccessReview).
    #[arg(long, env = "BALANCER_METRICS_ADDR", default_value = "0.0.0.0:8443")]
    pub metrics_addr: SocketAddr,
    /// Serve /metrics without authentication on the plain-HTTP probe port instead (local use).
    #[arg(long, env = "BALANCER_INSECURE_METRICS")]
    pub insecure_metrics: bool,
    /// PEM certificate chain for the webhook (e.g. the tls.crt of a cert-manager Secret).
    #[arg(long, env = "BALANCER_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for the webhook (e.g. the tls.key of a cert-manager Secret).
    #[arg(long, env = "BALANCER_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Where dev certificates are created and reused when --tls-cert/--tls-key are not given.
    #[arg(long, env = "BALANCER_DEV_CERT_DIR", default_value = "certs")]
    pub dev_cert_dir: PathBuf,
    /// How often the certificate files are checked for rotation (e.g. 10s, 500ms).
    #[arg(long, env = "BALANCER_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = positive_duration)]
    pub tls_reload_interval: Duration,
    /// On SIGTERM, how long to keep serving while reporting not-ready, so the API server
    /// stops sending reviews here before the listener closes.
    #[arg(long, env = "BALANCER_SHUTDOWN_DELAY", default_value = "5s", value_parser = humantime::parse_duration)]
    pub shutdown_delay: Duration,
    /// Largest AdmissionReview body accepted, in bytes (4 KiB to 64 MiB).
    #[arg(long, env = "BALANCER_MAX_BODY_BYTES", default_value_t = 1024 * 1024, value_parser = body_limit)]
    pub max_body_bytes: usize,
    /// Slowest a review body may arrive once its first second has passed, in bytes a second,
    /// judged over the last two seconds (0: no floor); a body behind it gets 408 at once.
    #[arg(long, env = "BALANCER_MIN_BODY_RATE", default_value_t = 64 * 1024)]
    pub min_body_rate: u64,
    #[command(flatten)]
    pub controller: ControllerArgs,
    /// Log format.
    #[arg(long, env = "BALANCER_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormatArg,
    /// Log filter when RUST_LOG is unset (e.g. info, balancer=debug).
    #[arg(long, env = "BALANCER_LOG_LEVEL", default_value = "info,rustls=error")]
    pub log_level: String,
}

/// A body limit that can hold a real review and that the body budget can account for.
fn body_limit(text: &str) -> Result<usize, String> {
    const RANGE: std::ops::RangeInclusive<usize> = 4 * 1024..=64 * 1024 * 1024;
    match text.parse::<usize>() {
        Ok(n) if RANGE.contains(&n) => Ok(n),
        Ok(n) => Err(format!("must be between {} and {} bytes, got {n}", RANGE.start(), RANGE.end())),
        Err(e) => Err(e.to_string()),
    }
}

/// A duration greater than zero, such as `10s` or `500ms`.
fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("must be greater than zero".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

/// How the reconcile loop runs and what it builds.
#[derive(Debug, Clone, Args)]
pub struct ControllerArgs {
    /// Fail at start when no cluster is reachable, instead of serving the webhooks with the controller off.
    #[arg(long, env = "BALANCER_REQUIRE_CONTROLLER")]
    pub require_controller: bool,
    /// Kubeconfig file to use instead of in-cluster configuration, KUBECONFIG or ~/.kube/config
    /// (client-go's --kubeconfig).
    #[arg(long, env = "BALANCER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use instead of the current one (kubectl's --context).
    #[arg(long, env = "BALANCER_CONTEXT")]
    pub context: Option<String>,
    /// Do not run the controller at all (webhooks only).
    #[arg(long, env = "BALANCER_DISABLE_CONTROLLER", conflicts_with = "require_controller")]
    pub disable_controller: bool,
    /// Watch Balancers in this namespace only (default: all namespaces).
    #[arg(long, env = "BALANCER_NAMESPACE")]
    pub namespace: Option<String>,
    /// Elect a leader through a coordination.k8s.io Lease; only the leader reconciles.
    #[arg(long, env = "BALANCER_LEADER_ELECT")]
    pub leader_elect: bool,
    /// Name of the leader election Lease.
    #[arg(long, env = "BALANCER_LEADER_ELECTION_ID", default_value = "balancer-leader")]
    pub leader_election_id: String,
    /// Namespace of the leader election Lease (default: POD_NAMESPACE, else the client's namespace).
    #[arg(long, env = "BALANCER_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// How long a leader's Lease lasts without renewal, in seconds.
    #[arg(long, env = "BALANCER_LEASE_DURATION", default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..=300))]
    pub lease_duration: u64,
    /// Balancers reconciled at the same time (never the same one twice at once).
    #[arg(long, env = "BALANCER_MAX_CONCURRENT_RECONCILES", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub max_concurrent_reconciles: u16,
    /// Requests per second the controller sends to the API server, at most (halved whenever the
    /// API server answers that it is overloaded, then grown back).
    #[arg(long, env = "BALANCER_API_QPS", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub api_qps: u32,
    /// Requests that may start at once after a lull.
    #[arg(long, env = "BALANCER_API_BURST", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub api_burst: u32,
    #[command(flatten)]
    pub proxy: ProxyArgs,
}

/// How proxy Deployments are built (shared by `run` and `render`, where the policy flags also
/// read the environment).
#[derive(Debug, Clone, Args)]
#[command(
    mut_arg("proxy_replicas", |arg| arg.env("BALANCER_PROXY_REPLICAS")),
    mut_arg("allowed_proxy_images", |arg| arg.env("BALANCER_ALLOWED_PROXY_IMAGES")),
)]
pub struct ProxyArgs {
    /// nginx image for the proxy Deployments (needs the stream module and a non-root user, uid 101).
    #[arg(long, env = "BALANCER_PROXY_IMAGE", default_value = "nginxinc/nginx-unprivileged:1.28.0-alpine")]
    pub proxy_image: String,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Dynamic nginx module to load first in nginx.conf, for proxy images whose stream module
    /// is not built in (Debian, Ubuntu, UBI: /usr/lib/nginx/modules/ngx_stream_module.so); repeat
    /// for several.
    #[arg(long = "proxy-load-module", env = "BALANCER_PROXY_LOAD_MODULES", value_delimiter = ',', value_parser = module_path)]
    pub proxy_load_modules: Vec<String>,
    /// Image of the metrics sidecar in every proxy pod: balancer's own image, whose
    /// `proxy-metrics` command counts the proxy's sessions per backend (deploy/ sets it to the
    /// operator's image). Unset: proxy pods have no sidecar and nginx logs no sessions.
    #[arg(long, env = "BALANCER_PROXY_METRICS_IMAGE", value_parser = image_prefix)]
    pub proxy_metrics_image: Option<String>,
}

/// What the operator decides about every spec ([`SpecPolicy`]): declared once for `run`,
/// `render` and `check`, which must agree with the webhook.
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// Proxy pods of a Balancer that does not set spec.replicas: the mutating webhook writes it
    /// into new and changed Balancers, and the controller uses it for older ones.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=100))]
    pub proxy_replicas: i32,
    /// Image prefixes a Balancer's own spec.proxy.image may start with (e.g.
    /// registry.example.com/nginx/); repeat or separate with commas. None, the default, refuses
    /// every per-Balancer image: whoever may edit a Balancer could otherwise run any image in
    /// its proxy pods.
    #[arg(long = "allowed-proxy-images", value_delimiter = ',', value_parser = image_prefix)]
    pub allowed_proxy_images: Vec<String>,
    /// PriorityClasses a Balancer's spec.proxy.priorityClassName may name; repeat or separate
    /// with commas, or give an empty value to allow none. Unset, the default: any.
    #[arg(long, env = "BALANCER_ALLOWED_PRIORITY_CLASSES", value_delimiter = ',')]
    pub allowed_priority_classes: Option<Vec<String>>,
    /// Node label keys a Balancer's spec.proxy.nodeSelector and node affinity may use
    /// (metadata.name for a term's matchFields); repeat or separate with commas, or give an
    /// empty value to allow none. Unset, the default: any.
    #[arg(long, env = "BALANCER_ALLOWED_NODE_LABEL_KEYS", value_delimiter = ',')]
    pub allowed_node_label_keys: Option<Vec<String>>,
    /// Taint keys a Balancer's spec.proxy.tolerations may tolerate (* for a toleration without
    /// a key, which tolerates every taint); repeat or separate with commas, or give an empty
    /// value to allow none. Unset, the default: any.
    #[arg(long, env = "BALANCER_ALLOWED_TOLERATION_KEYS", value_delimiter = ',')]
    pub allowed_toleration_keys: Option<Vec<String>>,
    /// Prefixes a Balancer's spec.proxy.podAnnotations keys must start with (e.g.
    /// prometheus.io/); repeat or separate with commas, or give an empty value to allow none.
    /// Unset, the default: any.
    #[arg(long, env = "BALANCER_ALLOWED_POD_ANNOTATION_PREFIXES", value_delimiter = ',')]
    pub allowed_pod_annotation_prefixes: Option<Vec<String>>,
}

impl PolicyArgs {
    pub fn spec_policy(&self) -> SpecPolicy {
        // An empty value allows none.
        let listed = |values: &Option<Vec<String>>| {
            values.as_ref().map(|v| v.iter().filter(|s| !s.is_empty()).cloned().collect::<Vec<_>>())
        };
        SpecPolicy {
            replicas: self.proxy_replicas,
            allowed_images: self.allowed_proxy_images.clone(),
            scheduling: SchedulingPolicy {
                priority_classes: listed(&self.allowed_priority_classes),
                node_label_keys: listed(&self.allowed_node_label_keys),
                toleration_keys: listed(&self.allowed_toleration_keys),
                pod_annotation_prefixes: listed(&self.allowed_pod_annotation_prefixes),
            },
        }
    }
}

/// An image prefix: non-empty, printable, no spaces.
fn image_prefix(prefix: &str) -> Result<String, String> {
    if prefix.is_empty() || prefix.len() > 255 || !prefix.chars().all(|c| c.is_ascii_graphic()) {
        return Err("must be 1 to 255 printable characters without spaces, such as registry.example.com/nginx/".into());
    }
    Ok(prefix.to_string())
}

/// An absolute path of plain characters: it is written into every nginx.conf as it is.
fn module_path(path: &str) -> Result<String, String> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._+-".contains(c);
    if !path.starts_with('/') || path.len() > 256 || !path.chars().all(plain) {
        return Err("must be an absolute path of at most 256 letters, digits and / . _ + -".into());
    }
    Ok(path.to_string())
}

impl ProxyArgs {
    pub fn settings(&self) -> ProxySettings {
        ProxySettings {
            image: self.proxy_image.clone(),
            load_modules: self.proxy_load_modules.clone(),
            metrics_image: self.proxy_metrics_image.clone(),
            policy: self.policy.spec_policy(),
            signer: None,
        }
    }
}

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key into (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// DNS name or IP address the serving certificate is valid for; repeat for several.
    #[arg(long = "dns-name", required = true, num_args = 1..)]
    pub dns_names: Vec<String>,
    /// Validity of both certificates, in days.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u64).range(1..=3650))]
    pub validity_days: u64,
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// YAML file with Balancers (multi-document allowed); `-` reads standard input.
    pub file: PathBuf,
    /// Namespace for Balancers that do not name one.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub proxy: ProxyArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// YAML files (multi-document allowed); `-` reads standard input.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The operator's policy flags, to check as its webhook would.
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// What `balancer from-ingress-nginx` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MigrationTarget {
    /// One Balancer per Service.
    Balancer,
    /// One Gateway, and a route per entry.
    Gateway,
}

#[derive(Debug, Args)]
pub struct FromIngressNginxArgs {
    /// YAML with the ConfigMaps and the Services their entries name (`kubectl get -A
    /// configmaps,services -o yaml`); `-` reads standard input.
    pub file: PathBuf,
    /// The ConfigMap given to ingress-nginx's `--tcp-services-configmap`, as namespace/name.
    #[arg(long, default_value = "ingress-nginx/tcp-services")]
    pub tcp_services: String,
    /// The ConfigMap given to ingress-nginx's `--udp-services-configmap`, as namespace/name.
    #[arg(long, default_value = "ingress-nginx/udp-services")]
    pub udp_services: String,
    /// The type of each Balancer's front Service: clients reached ingress-nginx through its
    /// own Service, most often a LoadBalancer.
    #[arg(long, value_parser = ["ClusterIP", "NodePort", "LoadBalancer"], default_value = "LoadBalancer")]
    pub service_type: String,
    /// What to write: Balancers, or a Gateway (in the namespace of --tcp-services) with a
    /// TCPRoute or UDPRoute per entry.
    #[arg(long, value_enum, default_value = "balancer")]
    pub to: MigrationTarget,
    /// The Gateway's name, with --to gateway.
    #[arg(long, default_value = "tcp-udp-services")]
    pub gateway_name: String,
    /// The Gateway's class, with --to gateway: one whose controllerName is balancer's.
    #[arg(long, default_value = "balancer")]
    pub gateway_class: String,
}

#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The API version to write.
    #[arg(long, value_enum)]
    pub to: ApiVersionArg,
    /// YAML file with Balancers (multi-document allowed); `-` reads standard input.
    pub file: PathBuf,
}

/// A log format, as `--log-format` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormatArg {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(arg: LogFormatArg) -> LogFormat {
        match arg {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }
    }
}

/// A served Balancer API version, as `balancer convert --to` names it.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ApiVersionArg {
    V1alpha1,
    V1beta1,
}

impl From<ApiVersionArg> for Version {
    fn from(arg: ApiVersionArg) -> Version {
        match arg {
            ApiVersionArg::V1alpha1 => Version::V1alpha1,
            ApiVersionArg::V1beta1 => Version::V1beta1,
        }
    }
}

impl RunArgs {
    /// What `balancer run` is asked to do, in the manager's terms.
    pub fn config(&self) -> Config {
        let certificate = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Certificate::Files { cert: cert.clone(), key: key.clone() },
            _ => Certificate::Dev(self.dev_cert_dir.clone()),
        };
        Config {
            webhook_addr: self.webhook_addr,
            probe_addr: self.probe_addr,
            metrics_addr: self.metrics_addr,
            insecure_metrics: self.insecure_metrics,
            certificate,
            tls_reload_interval: self.tls_reload_interval,
            shutdown_delay: self.shutdown_delay,
            max_body_bytes: self.max_body_bytes,
            min_body_rate: self.min_body_rate,
            cluster: self.controller.cluster(),
        }
    }
}

impl ControllerArgs {
    fn cluster(&self) -> ClusterConfig {
        let scope = match &self.namespace {
            Some(ns) => Scope::Namespace(ns.clone()),
            None => Scope::All,
        };
        ClusterConfig {
            disabled: self.disable_controller,
            required: self.require_controller,
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            rate: Rate { qps: f64::from(self.api_qps), burst: self.api_burst },
            controller: controller::Options {
                scope,
                proxy: self.proxy.settings(),
                concurrency: self.max_concurrent_reconciles,
                gateway_api: false,
            },
            leader_election: self.leader_elect.then(|| LeaderElection {
                lease: self.leader_election_id.clone(),
                namespace: self.leader_election_namespace.clone(),
                duration: Duration::from_secs(self.lease_duration),
            }),
        }
    }
}

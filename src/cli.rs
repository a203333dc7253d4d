//! The command line (`balancer <command>`), with every flag also settable by environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::telemetry::LogFormat;

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
    Run(RunArgs),
    /// Generate a CA and a serving certificate (for clusters without cert-manager); prints the base64 caBundle.
    Certs(CertsArgs),
    /// Print the Balancer CustomResourceDefinition as YAML.
    Crd,
    /// Validate Balancer YAML files offline with exactly the webhook's rules.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Address of the HTTPS admission webhook server.
    #[arg(long, env = "BALANCER_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,
    /// Address of the plain-HTTP server for /healthz, /readyz and /metrics.
    #[arg(long, env = "BALANCER_PROBE_ADDR", default_value = "0.0.0.0:8080")]
    pub probe_addr: SocketAddr,
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
    #[arg(long, env = "BALANCER_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub tls_reload_interval: Duration,
    /// Largest AdmissionReview body accepted, in bytes.
    #[arg(long, env = "BALANCER_MAX_BODY_BYTES", default_value_t = 3 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Log format.
    #[arg(long, env = "BALANCER_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Log filter when RUST_LOG is unset (e.g. info, balancer=debug).
    #[arg(long, env = "BALANCER_LOG_LEVEL", default_value = "info,rustls=error")]
    pub log_level: String,
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
pub struct CheckArgs {
    /// YAML files (multi-document allowed); `-` reads standard input.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

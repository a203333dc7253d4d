//! What `balancer run` is asked to do, in the manager's terms: the CLI builds it from flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::controller;
use crate::runtime::throttle::Rate;

/// What `balancer run` serves and how it reaches the cluster (the CLI builds it from flags).
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the HTTPS webhooks listen.
    pub webhook_addr: SocketAddr,
    /// Where the health probes listen.
    pub probe_addr: SocketAddr,
    /// Where the protected metrics listen.
    pub metrics_addr: SocketAddr,
    /// Serve `/metrics` on the probe port, unauthenticated, instead of the protected port.
    pub insecure_metrics: bool,
    /// The serving certificate.
    pub certificate: Certificate,
    /// How often the certificate files are checked for rotation.
    pub tls_reload_interval: Duration,
    /// How long to keep serving, not ready, after SIGTERM.
    pub shutdown_delay: Duration,
    /// Largest AdmissionReview body accepted.
    pub max_body_bytes: usize,
    /// Slowest a review body may arrive after its first second, in bytes a second (0: no floor).
    pub min_body_rate: u64,
    /// Whether and how the controller runs.
    pub cluster: ClusterConfig,
}

/// The serving certificate.
#[derive(Debug, Clone)]
pub enum Certificate {
    /// These files, reloaded when they change.
    Files {
        /// The PEM certificate chain.
        cert: PathBuf,
        /// The PEM private key.
        key: PathBuf,
    },
    /// Dev certificates for localhost, created in (or reused from) this directory.
    Dev(PathBuf),
}

/// How the cluster is reached, and how the controller runs in it.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Webhooks only.
    pub disabled: bool,
    /// Fail at start when no cluster is reachable (else serve the webhooks only).
    pub required: bool,
    /// The kubeconfig to use, instead of the in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    pub context: Option<String>,
    /// The most requests the controller sends to the API server: a steady rate and a burst.
    pub rate: Rate,
    /// How the controller runs and what it builds.
    pub controller: controller::Options,
    /// Reconcile only while holding this Lease; `None` always reconciles.
    pub leader_election: Option<LeaderElection>,
}

/// The leader election Lease.
#[derive(Debug, Clone)]
pub struct LeaderElection {
    /// The Lease's name.
    pub lease: String,
    /// Default: POD_NAMESPACE, else the client's namespace.
    pub namespace: Option<String>,
    /// The Lease's duration.
    pub duration: Duration,
}

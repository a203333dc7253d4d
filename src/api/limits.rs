//! The bounds a Balancer's fields are held to, and the defaults they get.

/// Most ports one Balancer may expose.
pub const MAX_PORTS: usize = 32;
/// Most backends one Balancer may balance over.
pub const MAX_BACKENDS: usize = 64;
/// Most labels in one selector (`spec.selector` or a backend's).
pub const MAX_SELECTOR_LABELS: usize = 32;
/// Largest backend weight.
pub const MAX_WEIGHT: i32 = 100;
/// Weight given to a backend that does not set one.
pub const DEFAULT_WEIGHT: i32 = 1;
/// Most proxy pods one Balancer may ask for (`spec.replicas`, v1beta1).
pub const MAX_REPLICAS: i32 = 100;
/// Largest `spec.backends[].maxConnections` (per proxy pod).
pub const MAX_MAX_CONNECTIONS: i32 = 1_000_000;
/// Passive health checks and timeouts (v1beta1), as nginx writes durations.
pub const DEFAULT_MAX_FAILS: i32 = 1;
/// Largest `maxFails`.
pub const MAX_MAX_FAILS: i32 = 100;
/// `failTimeout` when unset.
pub const DEFAULT_FAIL_TIMEOUT: &str = "10s";
/// A port's `connectTimeout` when unset.
pub const DEFAULT_CONNECT_TIMEOUT: &str = "5s";
/// How long connections opened before a configuration change go on, unless
/// `spec.proxy.drainTimeout` says: an hour, so that a database session, a stream or a
/// websocket outlives every step of a canary.
pub const DEFAULT_DRAIN_TIMEOUT: &str = "1h";
/// A TCP port's `idleTimeout` when unset.
pub const DEFAULT_TCP_IDLE_TIMEOUT: &str = "10m";
/// UDP is treated as request/response (DNS-like): a silent session ends soon.
pub const DEFAULT_UDP_IDLE_TIMEOUT: &str = "10s";
/// Most CIDRs in `spec.service.loadBalancerSourceRanges`.
pub const MAX_SOURCE_RANGES: usize = 64;
/// Most annotations in `spec.service.annotations`, and the longest value (cloud providers'
/// load-balancer settings are short; a certificate ARN list is a few hundred characters).
pub const MAX_SERVICE_ANNOTATIONS: usize = 64;
/// Longest value of one of those annotations.
pub const MAX_ANNOTATION_VALUE_LEN: usize = 4096;
/// All of them together (keys and values), well within Kubernetes' 256 KiB for an object's
/// annotations, with room for the others a Service or pod gets.
pub const MAX_ANNOTATIONS_BYTES: usize = 64 * 1024;
/// `spec.proxy` (v1beta1): most tolerations and spread constraints, and most JSON values in
/// each of `resources`, `tolerations`, `affinity` and `topologySpreadConstraints` (a
/// Kubernetes type read from a client is counted as it is read: see `bounded::optional_capped`).
pub const MAX_TOLERATIONS: usize = 32;
/// Most topology spread constraints.
pub const MAX_SPREAD_CONSTRAINTS: usize = 8;
/// Most JSON values in each of those fields.
pub const MAX_PROXY_VALUES: usize = 512;
/// Longest string, and most items or entries, anywhere inside those Kubernetes types in the
/// CRD schema (the API server enforces them even without the webhook).
pub const MAX_NESTED_STRING_LEN: usize = 1024;
/// Most items or entries in one list or map inside them.
pub const MAX_NESTED_ITEMS: usize = 64;
/// Most steps one canary may take (`spec.canary.steps`).
pub const MAX_CANARY_STEPS: usize = 32;
/// Most gates one canary's analysis may judge (`spec.canary.analysis.gates`).
pub const MAX_CANARY_GATES: usize = 8;
/// Most sessions a canary step may wait for (`spec.canary.analysis.minSessions`).
pub const MAX_CANARY_MIN_SESSIONS: i32 = 1_000_000;
/// Most consecutive failed checks a canary may be allowed (`spec.canary.analysis.failureLimit`).
pub const MAX_CANARY_FAILURE_LIMIT: i32 = 100;

//! balancer: a Kubernetes operator for weighted TCP/UDP load balancers.
//!
//! One binary serves the admission webhooks for the `Balancer` resource over
//! TLS and runs the controller that turns Balancers into nginx proxies; see
//! the README for the user's guide.
//!
//! The layers, each importing only those before it:
//! - `util` and [`deploy`]: small helpers, and the facts `deploy/` must agree with;
//! - [`runtime`]: the operator's own small controller-runtime, which knows nothing of Balancers;
//! - [`api`]: the CRD's types and conversion;
//! - [`spec`]: what a spec means (read, default, validate), shared by webhook, controller, CLI;
//! - [`proxy`]: the pure builders of what a Balancer owns, nginx's config included;
//! - [`canary`]: a canary's pure decisions: its gates, its steps, its split;
//! - [`gateway`]: Gateway API's types, whether the cluster serves them, and its rules;
//! - [`exporter`]: the proxy pods' metrics sidecar (`balancer proxy-metrics`);
//! - [`webhook`] and [`controller`]: the two things `balancer run` serves;
//! - [`manager`]: the `run` wiring, the only place that knows every area;
//! - [`cli`]: the commands, the only place that knows flags.
//!
//! `tests/integration/architecture.rs` fails when a module imports a later layer.

pub mod api;
pub mod canary;
pub mod cli;
pub mod controller;
pub mod deploy;
pub mod exporter;
pub mod gateway;
pub mod manager;
pub mod proxy;
pub mod runtime;
pub mod spec;
pub(crate) mod util;
pub mod webhook;

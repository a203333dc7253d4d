//! balancer: a Kubernetes operator for weighted TCP/UDP load balancers.
//!
//! One binary serves the admission webhooks for the `Balancer` resource over
//! TLS; see the README for the user's guide.

pub mod admission;
pub mod api;
pub mod check;
pub mod cli;
pub mod defaulting;
pub mod run;
pub mod server;
pub mod telemetry;
pub mod tls;
pub mod validation;

//! balancer: a Kubernetes operator for weighted TCP/UDP load balancers.
//!
//! One binary serves the admission webhooks for the `Balancer` resource over
//! TLS and runs the controller that turns Balancers into nginx proxies; see
//! the README for the user's guide.

pub mod admission;
pub mod admit;
pub mod api;
pub mod bounded;
pub mod check;
pub mod children;
pub mod cli;
pub mod contact;
pub mod controller;
pub mod convert;
pub mod defaulting;
pub mod disruption;
pub mod echo;
pub mod events;
pub mod leader;
pub mod listener;
pub mod metrics_auth;
pub mod nginx;
pub mod render;
pub mod retry;
pub mod run;
pub mod server;
pub mod stored;
pub mod telemetry;
pub mod throttle;
pub mod tls;
pub mod validation;

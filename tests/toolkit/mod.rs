//! The toolkit the e2e and node suites share: the control plane they run against, `kubectl`,
//! the scenario runner, typed waits on Balancers, and HTTP load through a proxy.
//!
//! A module directory that each suite's `main.rs` includes once (`#[path]`), not a crate of its
//! own: it uses what Cargo gives an integration test only (the `balancer` library and binary,
//! `CARGO_MANIFEST_DIR`), and a crate would need a dev-dependency cycle back to `balancer` and
//! its own dependency list. Each suite uses a different part of it (the e2e suite sends no
//! traffic, the node suite plays no kubelet), so what one suite leaves unused is not a warning.
#![allow(dead_code)]

pub mod cluster;
pub mod kubectl;
pub mod load;
pub mod ports;
pub mod repo;
pub mod runner;
pub mod wait;

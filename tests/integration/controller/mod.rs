//! The controller against a mock API server that asserts every request: the shared `harness`,
//! then one module per subject of a reconcile, and the watches.

mod harness;

mod children;
mod failures;
mod scaling;
mod status;
mod takeover;
mod throttling;
mod watches;

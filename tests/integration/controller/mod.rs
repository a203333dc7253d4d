//! The controller against a mock API server that asserts every request.

mod reconcile;
mod watches;

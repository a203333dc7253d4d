//! deploy/ against the code: RBAC, names, the monitoring component.

mod manifests;
mod monitoring;

//! deploy/ against the code: RBAC, names, the monitoring component.

mod chart;
mod manifests;
mod monitoring;

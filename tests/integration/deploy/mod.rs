//! deploy/ against the code: RBAC, names, the monitoring component.

mod alerts;
mod chart;
mod manifests;
mod monitoring;

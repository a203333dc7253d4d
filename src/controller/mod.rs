//! The reconcile loop: every Balancer becomes its children (see [`crate::proxy`]) and a status.
//!
//! Level-based and cheap on the API server: desired objects are compared with
//! the watch caches of the children, and only what differs is written (with
//! server-side apply, one field manager, forced). A converged Balancer costs no
//! writes, status included.
//!
//! The modules follow the seams of a reconcile:
//! - orchestration: `reconcile`, which reads the clock once, and `runner`, which runs
//!   kube-runtime's `Controller` over the `watches`;
//! - pure decisions: `conditions` (the condition types, and how a new one keeps its transition
//!   time), `reasons` (every reason balancer writes, by its wire name), `status` (what was observed, which change deserves an event, when a
//!   status write waits), `backends` (each backend's endpoints and share), `plan`
//!   (whose a child is, what is obsolete), `ssa` (server-side apply bookkeeping), `migration`
//!   (taking over from the Go operator), `exposure` (addresses) and `probing` (when proxy pods
//!   are asked which configuration they serve, and what their answers count to);
//! - I/O: `apply` (writes and deletions), `report` (status writes and events), and `prober`
//!   with `programmed`, which ask the proxy pods outside the reconciles;
//! - the controller's own parts: the lenient `stored` Balancer, the compact child `cache`, and
//!   the backends' ready endpoints as their EndpointSlices tell them, `endpoint_slices`.

use std::time::Duration;

mod apply;
mod backends;
mod cache;
mod canary;
mod conditions;
mod context;
mod endpoint_slices;
mod error;
mod exposure;
mod gateways;
mod measuring;
pub(crate) mod metrics;
mod migration;
mod plan;
mod prober;
mod probing;
mod programmed;
mod reasons;
mod reconcile;
mod records;
mod report;
mod runner;
mod sidecar;
mod signals;
mod ssa;
mod status;
mod stored;
mod watches;

pub use cache::{Cached, ChildCaches, IdentityCaches};
pub use conditions::ConditionType;
pub use context::{Clients, Context, Options, Scope, error_policy};
pub use endpoint_slices::{ReadyEndpointSlices, ReadySlice};
pub use error::{Error, ErrorKind};
pub use metrics::{CanaryCount, ControllerMetrics};
pub use reasons::Reason;
pub use reconcile::reconcile;
pub use runner::run;
pub use status::READINESS_WRITE_INTERVAL;
pub use stored::StoredBalancer;

/// How often a converged Balancer is checked again for drift the watches could have missed.
pub const RESYNC: Duration = Duration::from_secs(300);

//! The `Balancer` custom resource (`exposer.hliangzhao.io`), in two versions.
//!
//! - [`v1alpha1`] is the Go project's API, served unchanged so its manifests apply as they are.
//! - [`v1beta1`] is the storage version and the hub every other part of the operator works
//!   on: the webhooks, the controller, `check` and `render` all read a [`BalancerSpec`]
//!   (v1beta1's), and [`conversion`] turns objects of either version into the other.
//!
//! The CRD schema carries the simple bounds (ranges, enums, list sizes) so the API server
//! enforces them even when the webhook is unreachable; the webhook ([`crate::spec::validation`])
//! is the complete rule set.

pub mod canary;
pub mod conversion;
mod crd;
mod fields;
pub mod formats;
mod limits;
mod names;
pub mod v1alpha1;
pub mod v1beta1;
mod values;

pub use crd::{STORAGE_VERSION, crd};
pub use fields::{BackendSpec, BalancerPort, duration_millis};
pub(crate) use fields::{
    duration_schema, read_annotations, read_backends, read_ports, read_selector, read_source_ranges, selector_schema,
    target_port_schema,
};
pub use limits::*;
pub use names::*;
pub use v1beta1::{BackendStatus, Balancer, BalancerSpec, BalancerStatus};
pub use values::{
    Algorithm, ConditionStatus, ExternalTrafficPolicy, Protocol, ServiceType, SessionAffinity, UpstreamKind,
};

//! The operator's own small controller-runtime. Nothing here knows what a Balancer is: the
//! hardened HTTP listener, TLS and the certificate watcher, metrics serving and token review,
//! probes, leader election, the API client's throttle and contact watch, the event recorder,
//! retry delays and logging, and the rule of a condition's transition time.

pub(crate) mod cached_kind;
pub mod conditions;
pub(crate) mod contact;
pub mod events;
pub(crate) mod http;
pub(crate) mod leader;
pub mod listener;
pub(crate) mod logging;
pub(crate) mod metrics;
pub mod metrics_auth;
pub(crate) mod probes;
pub(crate) mod retry;
pub(crate) mod signals;
pub mod throttle;
pub mod tls;

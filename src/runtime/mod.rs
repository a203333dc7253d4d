//! The operator's own small controller-runtime. Nothing here knows what a Balancer is: the
//! hardened HTTP listener, TLS and the certificate watcher, metrics serving and token review,
//! probes, leader election, the API client's throttle and contact watch, the event recorder,
//! retry delays and logging.

pub mod contact;
pub mod events;
pub mod http;
pub mod leader;
pub mod listener;
pub mod logging;
pub mod metrics;
pub mod metrics_auth;
pub mod probes;
pub mod retry;
pub mod throttle;
pub mod tls;

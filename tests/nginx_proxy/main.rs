//! The rendered `nginx.conf` under a real nginx, with real sockets on 127.0.0.0/8, one module
//! per subject: TCP and UDP splits (`tcp`, `udp`), `nginx -t` on every rendering
//! (`config_check`), session affinity, passive health, the metrics sidecar, the algorithms and
//! limits, pod upstreams, an IPv6 client, TLS passthrough by SNI, refused backends and live configuration; the shared parts are `process`
//! (finding and running it), `backends` and `wrr` (what its weighted round-robin promises).
//!
//! nginx is run from the `PATH` (`support::have_tool`): these tests skip loudly
//! outside CI when it (or its stream module) is missing and fail in CI. On
//! Debian the stream module is dynamic, so nginx reads a small wrapper config:
//! `load_module <stream module>; include <rendered file>;`.

#[path = "../support/mod.rs"]
mod support;

mod affinity;
mod algorithms;
mod backends;
mod canary_signals;
mod config_check;
mod ipv6;
mod live;
mod metrics_sidecar;
mod passive_health;
mod pod_upstreams;
mod process;
mod refused_backends;
mod tcp;
mod tls_passthrough;
mod udp;
mod wrr;

use std::net::Ipv4Addr;
use std::time::Duration;

/// Bound on every single network await.
pub(crate) const STEP: Duration = Duration::from_secs(5);
/// How long nginx may take to start, to check a config, or to stop.
pub(crate) const NGINX_DEADLINE: Duration = Duration::from_secs(10);
/// The loopback addresses standing in for the backends, in backend order.
pub(crate) const BACKEND_IPS: [Ipv4Addr; 3] =
    [Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3), Ipv4Addr::new(127, 0, 0, 4)];

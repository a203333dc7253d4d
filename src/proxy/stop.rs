//! How a proxy pod stops without refusing a connection: its `preStop` hook keeps nginx
//! listening while clients still arrive, then the kubelet's SIGTERM starts nginx's graceful quit
//! (see [`entrypoint`](super::nginx::entrypoint)).
//!
//! A terminating pod leaves the front Service's endpoints at once, but each node's kube-proxy
//! routes new connections to it until it has seen that. Normally that takes about a second. Right
//! after an API server outage it can take half a minute: kube-proxy's watch comes back only after
//! client-go's reflector backoff (up to 30 s between attempts), while the rollout that made the
//! change may already be stopping old pods. A fixed wait would refuse those connections once it
//! ran out; this one waits while they keep coming.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ExecAction, Lifecycle, LifecycleHandler};

use super::nginx::DRAIN_SECONDS;

/// How long a stopping proxy pod keeps accepting connections, in whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopWait {
    /// Always this long: the time kube-proxy normally needs to drop the pod.
    pub min: u32,
    /// Then until this many consecutive seconds each saw at most one new connection (the kubelet's
    /// readiness probe, which goes on during termination, opens one every five seconds). Every
    /// TCP connection the pod accepts counts: clients, but also scrapes of the metrics sidecar
    /// and the health checks of a load balancer that targets pods, which can keep a pod waiting
    /// up to `max`.
    pub quiet: u32,
    /// And never longer than this, so that a pod still stops while busy clients keep reaching it.
    pub max: u32,
}

/// The proxy pods' wait.
pub const PROXY_STOP_WAIT: StopWait = StopWait { min: 5, quiet: 3, max: 30 };

/// Where the kernel counts a network namespace's accepted TCP connections (`Tcp: PassiveOpens`).
/// A container sees its pod's namespace there.
pub const TCP_COUNTERS: &str = "/proc/net/snmp";

/// How long the metrics sidecar, stopped once nginx has exited, goes on serving its last count
/// at most (its `--drain`; see `exporter::udp`).
pub const SIDECAR_DRAIN: Duration = Duration::from_secs(10);

/// The pod's grace period: the longest stop wait, nginx's drain, the sidecar's stop, and a few
/// seconds to spare.
pub const TERMINATION_GRACE_SECONDS: i64 =
    PROXY_STOP_WAIT.max as i64 + DRAIN_SECONDS + SIDECAR_DRAIN.as_secs() as i64 + 5;

/// The `preStop` hook of the nginx container.
pub(super) fn graceful_stop() -> Lifecycle {
    let command = vec!["/bin/sh".to_string(), "-c".into(), pre_stop_script(TCP_COUNTERS, PROXY_STOP_WAIT)];
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            exec: Some(ExecAction { command: Some(command) }),
            ..LifecycleHandler::default()
        }),
        ..Lifecycle::default()
    }
}

/// The hook's script (POSIX `sh` and `sleep`): once a second it reads the count of accepted
/// TCP connections from `counters` (laid out as `/proc/net/snmp`) and returns as [`StopWait`]
/// says. A file it cannot read counts as quiet, so the wait is then `min` (or `quiet`, if
/// longer). UDP has no connection to count: a UDP-only proxy waits the same.
pub fn pre_stop_script(counters: &str, wait: StopWait) -> String {
    let StopWait { min, quiet, max } = wait;
    format!(
        r#"opens() {{
  [ -r {counters} ] && while read -r proto a b c d e f rest; do
    if [ "$proto" = Tcp: ] && [ "$f" != PassiveOpens ]; then echo "$f"; return; fi
  done < {counters}
  echo 0
}}
last=$(opens)
last=${{last:-0}} waited=0 still=0
while [ "$waited" -lt {max} ]; do
  sleep 1
  waited=$((waited + 1))
  now=$(opens)
  now=${{now:-0}}
  if [ $((now - last)) -le 1 ]; then still=$((still + 1)); else still=0; fi
  last=$now
  if [ "$waited" -ge {min} ] && [ "$still" -ge {quiet} ]; then exit 0; fi
done"#
    )
}

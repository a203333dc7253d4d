//! How a proxy pod stops without refusing a connection: its `preStop` hook keeps nginx
//! listening while clients still arrive, then the kubelet's SIGTERM starts nginx's graceful quit
//! (see [`ENTRYPOINT`](super::nginx::ENTRYPOINT)).
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
    let command = pre_stop_command(TCP_COUNTERS, PROXY_STOP_WAIT);
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            exec: Some(ExecAction { command: Some(command) }),
            ..LifecycleHandler::default()
        }),
        ..Lifecycle::default()
    }
}

/// The hook, the shell program `src/proxy/stop.sh` (POSIX `sh` and `sleep`): once a second it
/// reads the count of accepted TCP connections from its first argument (a file laid out as
/// `/proc/net/snmp`) and returns as [`StopWait`] says, given as the next three. A file it cannot
/// read counts as quiet, so the wait is then `min` (or `quiet`, if longer). UDP has no
/// connection to count: a UDP-only proxy waits the same.
pub const PRE_STOP: &str = include_str!("stop.sh");

/// The hook's command: [`PRE_STOP`] under `/bin/sh -c`, reading `counters` and waiting as `wait`
/// says.
pub fn pre_stop_command(counters: &str, wait: StopWait) -> Vec<String> {
    let StopWait { min, quiet, max } = wait;
    let arguments = [counters.to_string(), min.to_string(), quiet.to_string(), max.to_string()];
    ["/bin/sh", "-c", PRE_STOP, "pre-stop"].map(String::from).into_iter().chain(arguments).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hook's command gives the program its counters and the wait, in the order it reads them.
    #[test]
    fn the_hook_is_given_its_counters_and_wait_as_arguments() {
        let command = pre_stop_command(TCP_COUNTERS, StopWait { min: 5, quiet: 3, max: 30 });
        assert_eq!(command, ["/bin/sh", "-c", PRE_STOP, "pre-stop", "/proc/net/snmp", "5", "3", "30"]);
        assert!(PRE_STOP.contains("\ncounters=${1:?} min=${2:?} quiet=${3:?} max=${4:?}\n"), "{PRE_STOP}");
    }
}

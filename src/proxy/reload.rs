//! The proxy container's entrypoint for live configuration: a sidecar writes the newest
//! `nginx.conf` into a shared directory, and this script has nginx apply it with a graceful
//! reload (SIGHUP to the master) instead of rolling the pod.
//!
//! Beside [`nginx::ENTRYPOINT`](super::nginx::ENTRYPOINT), which stays for pods without the
//! sidecar. The readiness probe is the same for both:
//! [`nginx::running_readiness_command`](super::nginx::running_readiness_command) checks that
//! nginx wrote its pid file and accepts the running copy, and the script replaces that copy only
//! with a file `nginx -t` accepted, so it fits as it is when `running` and `pid_file` are the
//! ones of [`nginx::POD_FILES`](super::nginx::POD_FILES), as in [`LIVE_POD_FILES`].

use std::time::Duration;

use super::nginx::{config_hash, process_environment};

/// Where the live proxy container's files are.
#[derive(Debug, Clone, Copy)]
pub struct LiveFiles<'a> {
    /// Written by the sidecar, atomically (written elsewhere, then renamed into place), so a
    /// read never sees half a file.
    pub desired: &'a str,
    /// The copy nginx runs (`-c` points here); replaced only by a copy `nginx -t` accepted.
    pub running: &'a str,
    /// The scratch copy being checked. `<candidate>.ipv4` and `<candidate>.err` are scratch too.
    pub candidate: &'a str,
    /// nginx's pid file: removed first, so that a non-empty one means this nginx wrote it.
    pub pid_file: &'a str,
    /// Present when the kernel has IPv6 (`/proc/net/if_inet6`).
    pub ipv6_probe: &'a str,
    /// The id line of the configuration nginx serves, written atomically (`<served>.tmp`, then
    /// renamed), for the sidecar to report.
    pub served: &'a str,
    /// The id line of the last configuration `nginx -t` refused, then at most 4 KiB of its
    /// output; written atomically like `served`, and left in place once a later one is served.
    pub rejected: &'a str,
}

/// The shared emptyDir between the sidecar and the proxy container.
pub const LIVE_DIR: &str = "/run/balancer";

/// Where the files are in a live proxy pod: what the sidecar reads and writes in [`LIVE_DIR`],
/// the rest on the container's writable `/tmp`, as in
/// [`nginx::POD_FILES`](super::nginx::POD_FILES).
pub const LIVE_POD_FILES: LiveFiles<'static> = LiveFiles {
    desired: "/run/balancer/nginx.conf",
    running: "/tmp/nginx.conf",
    candidate: "/tmp/nginx.conf.next",
    pid_file: "/tmp/nginx.pid",
    ipv6_probe: "/proc/net/if_inet6",
    served: "/run/balancer/served",
    rejected: "/run/balancer/rejected",
};

/// Where the metrics sidecar says which configuration nginx serves: the first 16 hex digits of
/// the SHA-256 of its `nginx.conf` (the id of [`desired_file`]), and a newline. The controller
/// asks every proxy pod, to report how many serve the current one.
pub const CONFIG_PATH: &str = "/config";

/// The short form of a configuration's id (its hex SHA-256) that [`CONFIG_PATH`], the sidecar's
/// metrics and its logs give: the first 16 hex digits.
pub fn short_id(id: &str) -> &str {
    id.get(..16).unwrap_or(id)
}

/// Every desired file begins with this, then the configuration's id (hex SHA-256 of the rest),
/// then a newline. The script compares first lines only, so that polling stays cheap (one
/// `read` builtin, no process) and needs no `sha256sum` in the image.
pub const CONFIG_ID_PREFIX: &str = "# balancer-config ";

/// The desired file for a rendered `nginx.conf`: its id line, then the file. The line is an
/// nginx comment, so the file runs as it is.
pub fn desired_file(nginx_conf: &str) -> String {
    format!("{CONFIG_ID_PREFIX}{}\n{nginx_conf}", config_hash(nginx_conf))
}

/// How applying is paced and bounded.
#[derive(Debug, Clone, Copy)]
pub struct ReloadPolicy {
    /// How often the desired file's first line is read (at least 10 ms).
    pub poll: Duration,
    /// The least time between two reloads (and from nginx's start to the first). Each reload
    /// starts a new generation of workers while the old ones drain, so a ConfigMap changing in
    /// a loop must not fork workers in a loop: changes arriving faster are coalesced, and only
    /// the newest is applied.
    pub min_interval: Duration,
    /// The most workers left draining old configurations, counting the generation a reload
    /// retires. Before a reload that would exceed it, the oldest draining workers are stopped
    /// (SIGTERM), closing their connections.
    pub max_draining_workers: u32,
}

/// The policy of the proxy pods: a change is applied within about a poll (measured with nginx
/// 1.22: `served` names it 0.21 to 0.27 s after the write, and new connections reach it after
/// 0.30 to 0.34 s, nginx pausing 0.1 s before it retires the old workers), at most two reloads a
/// second, and at most 8 draining workers, i.e. 4 older generations of the rendered
/// `worker_processes 2`.
///
/// The memory this bounds, measured with nginx 1.22 (Debian 12, x86-64): a draining worker
/// holding 10 idle proxied TCP connections has a `VmRSS` of 5.5 MiB, of which 2.0 MiB are its
/// own (`Private_*` in `smaps_rollup`, the rest shared with the master and the other workers);
/// each connection adds 3 to 7 KiB. So the 8 draining workers cost at most about 17 MiB of
/// the container's memory beyond the serving ones (45 MiB summing their `VmRSS`), under the
/// proxy's default 128 MiB limit. Without the bound, generations holding a connection would pile
/// up for `worker_shutdown_timeout` (`spec.proxy.drainTimeout`, an hour by default) at two
/// reloads a second.
pub const RELOAD_POLICY: ReloadPolicy = ReloadPolicy {
    poll: Duration::from_millis(250),
    min_interval: Duration::from_millis(500),
    max_draining_workers: 8,
};

/// The live proxy container's entrypoint (`/bin/sh -c`, with nginx's arguments after it, as
/// [`nginx::nginx_args`](super::nginx::nginx_args) gives them), the shell program
/// `src/proxy/reload.sh`, which reads its files and pace from the environment that
/// [`live_environment`] gives:
/// - it waits for the sidecar's first file and starts nginx on it once `nginx -t` accepts it;
///   meanwhile the pod is unready (no pid file);
/// - every `poll` it reads the desired file's first line; a new id, at least `min_interval`
///   after the last reload, is copied, checked with `nginx -t`, moved to `running`, and applied
///   with SIGHUP: nginx starts new workers on it and the old ones finish their connections
///   (within `worker_shutdown_timeout`). The id is taken from the copy, so `served` always
///   names what was applied, and it is written once nginx started workers on it (newer start
///   times): a file `nginx -t` accepts can still fail to load (a port another process holds),
///   and nginx then keeps the previous one;
/// - a file `nginx -t` refuses, or that nginx fails to load, is reported in `rejected` and on
///   stderr, and nginx keeps serving the last good one; the same id is not tried again;
/// - before each reload it stops the oldest draining workers beyond
///   [`ReloadPolicy::max_draining_workers`] (see [`RELOAD_POLICY`] for the memory this bounds);
/// - as [`nginx::ENTRYPOINT`](super::nginx::ENTRYPOINT) does, it leaves the IPv6 `listen` lines
///   out on a node without IPv6, turns the kubelet's SIGTERM into nginx's graceful SIGQUIT, and
///   exits with nginx's status when nginx exits by itself.
///
/// The interval is counted in polls (each takes at least `poll`), as the images have no clock
/// finer than `date +%s`. Workers are told apart from other processes by their parent (this
/// nginx) and their title in `/proc/<pid>/cmdline`, and their age by their start time
/// (`/proc/<pid>/stat` field 22): pids wrap around, start times do not.
///
/// The shell acts on a SIGTERM once its current command ends: within a poll, or within the
/// 4 s a reload may take to start its workers.
///
/// Needs only `/bin/sh` (dash or busybox ash), `cp`, `mv`, `rm`, `grep`, `sort`, `head` (`-c`,
/// as GNU and busybox have it), `sleep` with fractions of a second and `kill`, as nginx images
/// have.
pub const LIVE_ENTRYPOINT: &str = include_str!("reload.sh");

/// The environment [`LIVE_ENTRYPOINT`] reads its files and pace from, in the order the
/// container lists them.
pub fn live_environment(files: &LiveFiles<'_>, policy: ReloadPolicy) -> Vec<(&'static str, String)> {
    let LiveFiles { desired, running, candidate, pid_file, ipv6_probe, served, rejected } = files;
    let poll = policy.poll.max(Duration::from_millis(10));
    let polls = policy.min_interval.as_millis().div_ceil(poll.as_millis());
    let mut environment = vec![
        ("BALANCER_DESIRED", desired.to_string()),
        ("BALANCER_CANDIDATE", candidate.to_string()),
        ("BALANCER_SERVED", served.to_string()),
        ("BALANCER_REJECTED", rejected.to_string()),
        ("BALANCER_POLL_SECONDS", format!("{}.{:03}", poll.as_secs(), poll.subsec_millis())),
        ("BALANCER_RELOAD_POLLS", polls.to_string()),
        ("BALANCER_MAX_DRAINING_WORKERS", policy.max_draining_workers.to_string()),
    ];
    environment.extend(process_environment(running, pid_file, ipv6_probe));
    environment
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::nginx::tests::{names, variables};
    use crate::proxy::nginx::{ENTRYPOINT, IPV6_LISTEN};

    /// The live entrypoint reads the variables it is given, and no other.
    #[test]
    fn the_live_entrypoint_reads_exactly_its_environment() {
        assert_eq!(variables(LIVE_ENTRYPOINT), names(&live_environment(&LIVE_POD_FILES, RELOAD_POLICY)));
    }

    /// What the program knows of the code's formats is the code's: how a desired file and an
    /// IPv6 `listen` begin.
    #[test]
    fn the_live_entrypoint_holds_the_formats_of_the_code() {
        assert!(LIVE_ENTRYPOINT.contains(&format!("\nprefix='{CONFIG_ID_PREFIX}'\n")), "{LIVE_ENTRYPOINT}");
        assert!(LIVE_ENTRYPOINT.contains(&format!("\nipv6_listen='{IPV6_LISTEN}'\n")), "{LIVE_ENTRYPOINT}");
    }

    /// Both entrypoints stop nginx the same way.
    #[test]
    fn both_entrypoints_turn_sigterm_into_the_same_graceful_quit() {
        let quit = |program: &'static str| program.lines().filter(|l| l.contains("kill -QUIT")).collect::<Vec<_>>();
        assert_eq!(quit(LIVE_ENTRYPOINT).len(), 1);
        assert_eq!(quit(LIVE_ENTRYPOINT), quit(ENTRYPOINT));
    }

    /// The pace, as the program reads it: the poll in seconds with milliseconds (at least 10 ms),
    /// and the least interval in polls, rounded up.
    #[test]
    fn the_pace_is_given_in_the_units_the_program_reads() {
        let value = |policy: ReloadPolicy, name: &str| {
            let environment = live_environment(&LIVE_POD_FILES, policy);
            environment.into_iter().find(|(n, _)| *n == name).map(|(_, v)| v).unwrap_or_default()
        };
        assert_eq!(value(RELOAD_POLICY, "BALANCER_POLL_SECONDS"), "0.250");
        assert_eq!(value(RELOAD_POLICY, "BALANCER_RELOAD_POLLS"), "2");
        let fast =
            ReloadPolicy { poll: Duration::from_millis(1), min_interval: Duration::from_millis(25), ..RELOAD_POLICY };
        assert_eq!(value(fast, "BALANCER_POLL_SECONDS"), "0.010");
        assert_eq!(value(fast, "BALANCER_RELOAD_POLLS"), "3");
        let slow = ReloadPolicy { poll: Duration::from_millis(1500), ..RELOAD_POLICY };
        assert_eq!(value(slow, "BALANCER_POLL_SECONDS"), "1.500");
        assert_eq!(value(slow, "BALANCER_RELOAD_POLLS"), "1");
    }
}

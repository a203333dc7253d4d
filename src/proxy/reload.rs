//! The proxy container's entrypoint for live configuration: a sidecar writes the newest
//! `nginx.conf` into a shared directory, and this script has nginx apply it with a graceful
//! reload (SIGHUP to the master) instead of rolling the pod.
//!
//! Beside [`nginx::entrypoint`](super::nginx::entrypoint), which stays for pods without the
//! sidecar. The readiness probe is the same for both:
//! [`nginx::running_readiness_command`](super::nginx::running_readiness_command) checks that
//! nginx wrote its pid file and accepts the running copy, and the script replaces that copy only
//! with a file `nginx -t` accepted, so it fits as it is when `running` and `pid_file` are the
//! ones of [`nginx::POD_FILES`](super::nginx::POD_FILES), as in [`LIVE_POD_FILES`].

use std::time::Duration;

use super::nginx::{IPV6_LISTEN, config_hash, quit_on_term};

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

/// The title nginx gives a worker that stopped accepting and is finishing its connections.
const DRAINING_TITLE: &str = "nginx: worker process is shutting down";

/// The title of every nginx worker, serving or draining.
const WORKER_TITLE: &str = "nginx: worker process";

/// The live proxy container's entrypoint (`/bin/sh -c`, with nginx's arguments after it, as
/// [`nginx::nginx_args`](super::nginx::nginx_args) gives them):
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
/// - as [`nginx::entrypoint`](super::nginx::entrypoint) does, it leaves the IPv6 `listen` lines
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
pub fn live_entrypoint(files: &LiveFiles<'_>, policy: ReloadPolicy) -> String {
    let LiveFiles { desired, running, candidate, pid_file, ipv6_probe, served, rejected } = files;
    let poll = policy.poll.max(Duration::from_millis(10));
    let sleep = format!("{}.{:03}", poll.as_secs(), poll.subsec_millis());
    let polls = policy.min_interval.as_millis().div_ceil(poll.as_millis());
    let max = policy.max_draining_workers;
    // How long a reload may take to start its workers, in checks 100 ms apart: nginx itself
    // tries a busy port 5 times, 500 ms apart, before it gives a reload up.
    let (confirm_seconds, confirm_tries) = (4, 40);
    let quit = quit_on_term();
    format!(
        r#"trap 'exit 143' TERM
rm -f {pid_file}
applied= refused= nginx=
# Whether the desired file's first line is an id other than the applied and the refused ones.
fresh() {{
  {{ IFS= read -r line < {desired}; }} 2>/dev/null || return 1
  case $line in "{CONFIG_ID_PREFIX}"?*) ;; *) return 1 ;; esac
  [ "$line" != "$applied" ] && [ "$line" != "$refused" ]
}}
# Copies the desired file to the candidate, without the IPv6 listens on a node without IPv6,
# and takes its id from the copy.
prepare() {{
  cp {desired} {candidate} 2>/dev/null || return 1
  if [ ! -e {ipv6_probe} ]; then
    [ -n "$told_ipv4" ] || echo "balancer: this node has no IPv6; nginx listens on IPv4 only" >&2
    told_ipv4=1
    grep -vF '{IPV6_LISTEN}' {candidate} > {candidate}.ipv4 && mv {candidate}.ipv4 {candidate} || return 1
  fi
  IFS= read -r id < {candidate} || return 1
  case $id in "{CONFIG_ID_PREFIX}"?*) ;; *) return 1 ;; esac
  [ "$id" != "$applied" ] && [ "$id" != "$refused" ]
}}
# nginx -t on the candidate; a refusal is written to {rejected} and logged.
checked() {{
  nginx -t -q -e stderr -g "pid {pid_file};" -c {candidate} 2> {candidate}.err && return 0
  refused=$id
  {{ printf '%s\n' "$id"; head -c 4096 {candidate}.err; }} > {rejected}.tmp && mv {rejected}.tmp {rejected}
  printf 'balancer: nginx -t refused configuration %s, still serving %s: %s\n' "${{id#"{CONFIG_ID_PREFIX}"}}" \
    "${{applied#"{CONFIG_ID_PREFIX}"}}" "$(head -n 1 {candidate}.err)" >&2
  return 1
}}
install() {{ mv {candidate} {running} && applied=$id; }}
report() {{ printf '%s\n' "$applied" > {served}.tmp && mv {served}.tmp {served}; }}
# "<start time> <pid>" of each process of this nginx among the /proc/<pid>/cmdline files given.
of_nginx() {{
  for file in "$@"; do
    pid=${{file#/proc/}}
    pid=${{pid%/cmdline}}
    {{ read -r stat < /proc/"$pid"/stat; }} 2>/dev/null && fields "$pid" ${{stat##*")"}}
  done
}}
# The pid, then the fields of /proc/<pid>/stat after the command's name, which may hold spaces:
# the parent is the 4th field, the start time the 22nd.
fields() {{ [ "$3" = "$nginx" ] && echo "${{21}} $1"; }}
# Stops the oldest draining workers, so that with the generation the reload retires at most
# {max} are left draining.
bound() {{
  workers=$(of_nginx $(grep -l -a -F '{WORKER_TITLE}' /proc/[0-9]*/cmdline 2>/dev/null) | grep -c .)
  excess=$((workers - {max}))
  [ "$excess" -gt 0 ] || return 0
  oldest=$(of_nginx $(grep -l -a -F '{DRAINING_TITLE}' /proc/[0-9]*/cmdline 2>/dev/null) | sort -n | head -n "$excess")
  [ -n "$oldest" ] || return 0
  stopped=0 sockets=0
  for pid in $(echo "$oldest" | while read -r start pid; do echo "$pid"; done); do
    for fd in /proc/"$pid"/fd/*; do [ -S "$fd" ] && sockets=$((sockets + 1)); done
    kill -TERM "$pid" 2>/dev/null && stopped=$((stopped + 1))
  done
  echo "balancer: stopped the oldest draining nginx workers, $stopped of them, closing their connections ($sockets open sockets: 2 per proxied connection, a few of nginx's own), so that at most {max} workers drain older configurations" >&2
}}
# The start time of this nginx's newest worker: a reload nginx applied starts new workers.
newest() {{
  of_nginx $(grep -l -a -F '{WORKER_TITLE}' /proc/[0-9]*/cmdline 2>/dev/null) | sort -rn | head -n 1 |
    {{ read -r start pid; echo "${{start:-0}}"; }}
}}
# After a SIGHUP: whether nginx started workers on the new file within {confirm_seconds} s. When
# it did not (a listen it could not bind, say), it still serves the previous one: that is
# reported as refused, and not tried again.
reloaded() {{
  tries=0
  while [ "$(newest)" = "$before" ]; do
    tries=$((tries + 1))
    [ "$tries" -le {confirm_tries} ] || break
    sleep 0.100
  done
  [ "$(newest)" != "$before" ] && return 0
  refused=$id applied=$previous
  {{ printf '%s\n' "$id"; echo "nginx accepted this configuration but did not apply it within {confirm_seconds} s; nginx's own log says why"; }} > {rejected}.tmp &&
    mv {rejected}.tmp {rejected}
  printf 'balancer: nginx did not apply configuration %s within {confirm_seconds} s, still serving %s\n' \
    "${{id#"{CONFIG_ID_PREFIX}"}}" "${{applied#"{CONFIG_ID_PREFIX}"}}" >&2
  return 1
}}
told=
until fresh && prepare && checked; do
  [ -n "$told" ] || echo "balancer: waiting for the sidecar to write {desired}" >&2
  told=1
  sleep {sleep}
done
install && report
nginx "$@" & nginx=$!
{quit}
polls=0
while kill -0 "$nginx" 2>/dev/null; do
  sleep {sleep}
  polls=$((polls + 1))
  [ "$polls" -ge {polls} ] && [ -s {pid_file} ] && fresh && prepare && checked || continue
  bound
  before=$(newest) previous=$applied
  install && kill -HUP "$nginx" && reloaded && report
  polls=0
done
wait "$nginx""#
    )
}

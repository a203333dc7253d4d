# shellcheck shell=sh
# The live proxy container's entrypoint (`LIVE_ENTRYPOINT` in reload.rs, which says what it
# does): `/bin/sh -c` with nginx's arguments after it. Its files and pace are in its environment
# (`live_environment`): BALANCER_DESIRED, BALANCER_RUNNING, BALANCER_CANDIDATE,
# BALANCER_PID_FILE, BALANCER_IPV6_PROBE, BALANCER_SERVED, BALANCER_REJECTED,
# BALANCER_POLL_SECONDS, BALANCER_RELOAD_POLLS, BALANCER_MAX_DRAINING_WORKERS and
# BALANCER_DRAIN_SECONDS.
trap 'exit 143' TERM
: "${BALANCER_DESIRED:?}" "${BALANCER_RUNNING:?}" "${BALANCER_CANDIDATE:?}" "${BALANCER_PID_FILE:?}"
: "${BALANCER_IPV6_PROBE:?}" "${BALANCER_SERVED:?}" "${BALANCER_REJECTED:?}" "${BALANCER_POLL_SECONDS:?}"
: "${BALANCER_RELOAD_POLLS:?}" "${BALANCER_MAX_DRAINING_WORKERS:?}" "${BALANCER_DRAIN_SECONDS:?}"
desired=$BALANCER_DESIRED running=$BALANCER_RUNNING candidate=$BALANCER_CANDIDATE
pid_file=$BALANCER_PID_FILE served=$BALANCER_SERVED rejected=$BALANCER_REJECTED
poll=$BALANCER_POLL_SECONDS max=$BALANCER_MAX_DRAINING_WORKERS
# How every desired file begins (CONFIG_ID_PREFIX in reload.rs), how an IPv6 `listen` begins
# (IPV6_LISTEN in nginx.rs), and the titles nginx gives its workers, serving or draining.
prefix='# balancer-config '
ipv6_listen='listen [::]:'
worker_title='nginx: worker process'
draining_title='nginx: worker process is shutting down'
# How long a reload may take to start its workers, in checks 100 ms apart: nginx itself tries a
# busy port 5 times, 500 ms apart, before it gives a reload up.
confirm_seconds=4 confirm_tries=40
rm -f "$pid_file"
applied='' refused='' nginx='' told_ipv4=''
# Whether the desired file's first line is an id other than the applied and the refused ones.
fresh() {
  { IFS= read -r line < "$desired"; } 2>/dev/null || return 1
  case $line in "$prefix"?*) ;; *) return 1 ;; esac
  [ "$line" != "$applied" ] && [ "$line" != "$refused" ]
}
# Copies the desired file to the candidate, without the IPv6 listens on a node without IPv6,
# and takes its id from the copy.
prepare() {
  cp "$desired" "$candidate" 2>/dev/null || return 1
  if [ ! -e "$BALANCER_IPV6_PROBE" ]; then
    [ -n "$told_ipv4" ] || echo "balancer: this node has no IPv6; nginx listens on IPv4 only" >&2
    told_ipv4=1
    grep -vF "$ipv6_listen" "$candidate" > "$candidate.ipv4" && mv "$candidate.ipv4" "$candidate" || return 1
  fi
  IFS= read -r id < "$candidate" || return 1
  case $id in "$prefix"?*) ;; *) return 1 ;; esac
  [ "$id" != "$applied" ] && [ "$id" != "$refused" ]
}
# nginx -t on the candidate; a refusal is written to the rejected file and logged.
checked() {
  nginx -t -q -e stderr -g "pid $pid_file;" -c "$candidate" 2> "$candidate.err" && return 0
  refused=$id
  { printf '%s\n' "$id"; head -c 4096 "$candidate.err"; } > "$rejected.tmp" && mv "$rejected.tmp" "$rejected"
  printf 'balancer: nginx -t refused configuration %s, still serving %s: %s\n' "${id#"$prefix"}" \
    "${applied#"$prefix"}" "$(head -n 1 "$candidate.err")" >&2
  return 1
}
install() { mv "$candidate" "$running" && applied=$id; }
report() { printf '%s\n' "$applied" > "$served.tmp" && mv "$served.tmp" "$served"; }
# "<start time> <pid>" of each process of this nginx whose title holds $1.
of_nginx() {
  grep -l -a -F "$1" /proc/[0-9]*/cmdline 2>/dev/null | while IFS= read -r file; do
    pid=${file#/proc/}
    pid=${pid%/cmdline}
    # shellcheck disable=SC2086 # split on purpose into fields: numbers and a one-letter state
    { read -r stat < /proc/"$pid"/stat; } 2>/dev/null && fields "$pid" ${stat##*")"}
  done
}
# The pid, then the fields of /proc/<pid>/stat after the command's name, which may hold spaces:
# the parent is the 4th field, the start time the 22nd.
fields() { [ "$3" = "$nginx" ] && echo "${21} $1"; }
# Stops the oldest draining workers, so that with the generation the reload retires at most
# $max are left draining.
bound() {
  workers=$(of_nginx "$worker_title" | grep -c .)
  excess=$((workers - max))
  [ "$excess" -gt 0 ] || return 0
  oldest=$(of_nginx "$draining_title" | sort -n | head -n "$excess")
  [ -n "$oldest" ] || return 0
  stopped=0 sockets=0
  for pid in $(echo "$oldest" | while read -r _ worker; do echo "$worker"; done); do
    for fd in /proc/"$pid"/fd/*; do [ -S "$fd" ] && sockets=$((sockets + 1)); done
    kill -TERM "$pid" 2>/dev/null && stopped=$((stopped + 1))
  done
  echo "balancer: stopped the oldest draining nginx workers, $stopped of them, closing their connections ($sockets open sockets: 2 per proxied connection, a few of nginx's own), so that at most $max workers drain older configurations" >&2
}
# The start time of this nginx's newest worker: a reload nginx applied starts new workers.
newest() {
  of_nginx "$worker_title" | sort -rn | head -n 1 | { read -r start _; echo "${start:-0}"; }
}
# After a SIGHUP: whether nginx started workers on the new file within $confirm_seconds s. When
# it did not (a listen it could not bind, say), it still serves the previous one: that is
# reported as refused, and not tried again.
reloaded() {
  tries=0
  while [ "$(newest)" = "$before" ]; do
    tries=$((tries + 1))
    [ "$tries" -le "$confirm_tries" ] || break
    sleep 0.100
  done
  [ "$(newest)" != "$before" ] && return 0
  refused=$id applied=$previous
  { printf '%s\n' "$id"; echo "nginx accepted this configuration but did not apply it within $confirm_seconds s; nginx's own log says why"; } > "$rejected.tmp" &&
    mv "$rejected.tmp" "$rejected"
  printf 'balancer: nginx did not apply configuration %s within %s s, still serving %s\n' \
    "${id#"$prefix"}" "$confirm_seconds" "${applied#"$prefix"}" >&2
  return 1
}
told=
until fresh && prepare && checked; do
  [ -n "$told" ] || echo "balancer: waiting for the sidecar to write $desired" >&2
  told=1
  sleep "$poll"
done
install && report
nginx "$@" & nginx=$!
trap 'kill -QUIT "$nginx"; { sleep "$BALANCER_DRAIN_SECONDS"; kill -TERM "$nginx"; } 2>/dev/null & wait "$nginx"; exit $?' TERM
polls=0
while kill -0 "$nginx" 2>/dev/null; do
  sleep "$poll"
  polls=$((polls + 1))
  if [ "$polls" -ge "$BALANCER_RELOAD_POLLS" ] && [ -s "$pid_file" ] && fresh && prepare && checked; then
    bound
    before=$(newest) previous=$applied
    install && kill -HUP "$nginx" && reloaded && report
    polls=0
  fi
done
wait "$nginx"

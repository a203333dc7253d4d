#!/usr/bin/env bash
# What the proxy's access log costs nginx per session: the CPU nginx's workers
# spend on a new TCP connection per request, with the nginx.conf balancer
# renders (its access log buffered to a file that the metrics sidecar reads),
# against the same file without the access log (the baseline).
#
#   benches/access-log.sh [rounds] [seconds-per-run]     (default 9 and 10)
#
# Environment:
#   BALANCER_BIN=path   use this binary instead of `cargo build --release`
#                       (the build honours CARGO_TARGET_DIR)
#   NGINX=path          nginx binary (default /usr/sbin/nginx, Debian's package)
#   STREAM_MODULE=path  the stream module to load (default Debian's dynamic one,
#                       /usr/lib/nginx/modules/ngx_stream_module.so; empty when
#                       nginx has it built in)
#
# What it does:
#   1. renders a one-port, one-backend Balancer with `balancer render` (the
#      metrics sidecar on, so the access log is in nginx.conf) and points it at
#      a local backend: 127.0.0.1:18080 proxies to an nginx answering on
#      127.0.0.1:18081;
#   2. in each round, in an order that alternates every round, starts a fresh
#      proxy with each of the two files ("log", as rendered, with
#      `balancer proxy-metrics` counting its access log; "none") and drives it
#      with `wrk -t1 -c8 -H 'Connection: close'` (a session per request);
#   3. reads the CPU time of the proxy's workers (and of the sidecar) from
#      /proc before and after each run, and checks the sidecar counted every
#      session wrk made, once nginx has stopped (and written what it held);
#   4. prints each run, then the medians: CPU per session for each file, and
#      the ratio of "log" to "none" taken within each round, with its range.
#
# Needs nginx (with the stream module), wrk and curl, and ports 18080, 18081
# and 19113 free on 127.0.0.1.
set -euo pipefail

ROUNDS=${1:-9}
SECONDS_PER_RUN=${2:-10}
NGINX=${NGINX:-/usr/sbin/nginx}
STREAM_MODULE=${STREAM_MODULE-/usr/lib/nginx/modules/ngx_stream_module.so}
HZ=$(getconf CLK_TCK)

if [[ -z ${BALANCER_BIN:-} ]]; then
    cargo build --release --quiet --bin balancer
    BALANCER_BIN=${CARGO_TARGET_DIR:-target}/release/balancer
fi
for tool in "$NGINX" wrk curl pgrep; do
    command -v "$tool" >/dev/null || { echo "access-log.sh: needs $tool" >&2; exit 1; }
done

repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=benches/lib.sh
. "$repo/benches/lib.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/balancer-access-log.XXXXXX")
sidecar_pid=""

die() {
    echo "access-log.sh: $*" >&2
    exit 1
}

# Stops the nginx whose prefix directory is $1: its master, then the workers it leaves.
stop_nginx() {
    [[ -s $1/nginx.pid ]] || return 0
    local master workers pid
    master=$(cat "$1/nginx.pid")
    workers=$(pgrep -P "$master" || true)
    stop "$master"
    for pid in $workers; do stop "$pid"; done
    rm -f "$1/nginx.pid"
}

# Runs on every exit: stops what the script started, shows the logs of a failure, removes $work.
cleanup() {
    local status=$? dir
    trap - EXIT INT TERM
    [[ -n $sidecar_pid ]] && stop "$sidecar_pid"
    for dir in "$work"/*/; do stop_nginx "${dir%/}"; done
    show_logs_on_failure "$status" "$work"/sidecar.log "$work"/*/error.log
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_nginx() { # $1: a prefix directory holding nginx.conf
    "$NGINX" -p "$1" -e "$1/error.log" -c "$1/nginx.conf" -g "pid $1/nginx.pid;" || die "nginx did not start in $1"
    for _ in $(seq 50); do [[ -s $1/nginx.pid ]] && return 0; sleep 0.1; done
    die "nginx wrote no pid file in $1"
}

# The backend: answers every request at once.
mkdir -p "$work/backend"
cat >"$work/backend/nginx.conf" <<'EOF'
worker_processes 1;
events { worker_connections 4096; }
http {
    access_log off;
    server { listen 127.0.0.1:18081; location / { return 200 "hello\n"; } }
}
EOF
start_nginx "$work/backend"

# The proxy, as balancer renders it, pointed at the backend.
load=()
[[ -n $STREAM_MODULE ]] && load=(--proxy-load-module "$STREAM_MODULE")
cat >"$work/balancer.yaml" <<'EOF'
apiVersion: exposer.hliangzhao.io/v1beta1
kind: Balancer
metadata:
  name: bench
spec:
  ports:
    - name: tcp
      port: 18080
      protocol: TCP
  backends:
    - name: local
      weight: 1
      selector:
        app: local
EOF
mkdir -p "$work/log" "$work/none"
"$BALANCER_BIN" render "$work/balancer.yaml" --proxy-metrics-image sidecar "${load[@]}" >"$work/rendered.yaml"
# The ConfigMap's key $1 (a literal block, indented 4), pointed at the local backend and log.
config_map_key() {
    awk -v key="  $1: " 'index($0, key) == 1 { inside = 1; next } inside && /^  [^ ]/ { inside = 0 }
        inside && /^[^ ]/ { inside = 0 } inside { sub(/^    /, ""); print }' "$work/rendered.yaml" |
        sed -e 's/bench-local-backend\.default\.svc:18080/127.0.0.1:18081/' \
            -e 's/listen 18080;/listen 127.0.0.1:18080;/' -e '/listen \[::\]:18080;/d' \
            -e "s|/var/log/balancer/access.log|$work/log/access.log|"
}
config_map_key nginx.conf >"$work/log/nginx.conf"
# The model beside it, which the sidecar reads the backends' addresses from.
config_map_key proxy.json >"$work/log/proxy.json"
grep -q '"address": "127.0.0.1:18081"' "$work/log/proxy.json" || die "the rendered model has no local server"
grep -q "access_log $work/log/access.log balancer buffer=" "$work/log/nginx.conf" ||
    die "the rendered nginx.conf has no access log for the sidecar, or it changed shape"
grep -v -e log_format -e access_log "$work/log/nginx.conf" >"$work/none/nginx.conf"

# The sidecar's count of sessions, from its /metrics.
sessions_counted() {
    local metrics
    metrics=$(curl -sf http://127.0.0.1:19113/metrics) || die "the sidecar's /metrics did not answer"
    awk '/^balancer_proxy_sessions_total/ { n += $NF } END { print n + 0 }' <<<"$metrics"
}

# One run of a file (log or none): sets SESSIONS, WORKER_TICKS, SIDECAR_TICKS and COUNTED.
run() {
    local dir=$work/$1 before after sidecar_before=0 workers
    SIDECAR_TICKS=0 COUNTED=0
    if [[ $1 == log ]]; then
        rm -f "$dir/access.log"
        "$BALANCER_BIN" proxy-metrics --config "$dir/nginx.conf" --listen 127.0.0.1:19113 \
            --log-file "$dir/access.log" --drain 1s >"$work/sidecar.log" 2>&1 &
        sidecar_pid=$!
        for _ in $(seq 50); do curl -sf -o /dev/null http://127.0.0.1:19113/metrics && break; sleep 0.1; done
        curl -sf -o /dev/null http://127.0.0.1:19113/metrics || die "the sidecar did not start"
    fi
    start_nginx "$dir"
    sleep 0.5
    mapfile -t workers < <(pgrep -P "$(cat "$dir/nginx.pid")")
    ((${#workers[@]} > 0)) || die "no nginx workers in $dir"
    before=$(process_ticks "${workers[@]}")
    [[ -n $sidecar_pid ]] && sidecar_before=$(process_ticks "$sidecar_pid")
    wrk -t1 -c8 -d"${SECONDS_PER_RUN}s" -H 'Connection: close' http://127.0.0.1:18080/ >"$work/wrk.out" ||
        die "wrk failed: $(cat "$work/wrk.out")"
    after=$(process_ticks "${workers[@]}")
    # nginx's workers write what they hold as they exit; the sidecar reads it within 0.2 s.
    stop_nginx "$dir"
    if [[ -n $sidecar_pid ]]; then
        sleep 0.5
        COUNTED=$(sessions_counted)
        SIDECAR_TICKS=$(($(process_ticks "$sidecar_pid") - sidecar_before))
        stop "$sidecar_pid"
        sidecar_pid=""
    fi
    if grep -q -e 'Socket errors' -e 'Non-2xx' "$work/wrk.out"; then
        die "wrk saw errors: $(grep -e 'Socket errors' -e 'Non-2xx' "$work/wrk.out")"
    fi
    SESSIONS=$(awk '/requests in/ { print $1 }' "$work/wrk.out")
    WORKER_TICKS=$((after - before))
}

printf '%-6s %-5s %9s %14s %15s\n' round file sessions 'µs/session' 'sidecar µs/s.'
results=$work/results
for round in $(seq 1 "$ROUNDS"); do
    case $((round % 2)) in
        1) order="log none" ;;
        0) order="none log" ;;
    esac
    for file in $order; do
        run "$file"
        if [[ $file == log ]] && ((COUNTED < SESSIONS)); then
            die "the sidecar counted $COUNTED of $SESSIONS sessions"
        fi
        us=$(awk -v t="$WORKER_TICKS" -v n="$SESSIONS" -v hz="$HZ" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
        sidecar_us=$(awk -v t="$SIDECAR_TICKS" -v n="$SESSIONS" -v hz="$HZ" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
        printf '%-6s %-5s %9s %14s %15s\n' "$round" "$file" "$SESSIONS" "$us" "$sidecar_us"
        echo "$round $file $us $sidecar_us" >>"$results"
    done
done

echo
echo "medians of $ROUNDS rounds (nginx $("$NGINX" -v 2>&1 | sed 's|.*/||'), $(nproc) CPUs):"
awk '
    { us[$2, $1] = $3; sidecar[$2, $1] = $4; rounds[$1] = 1 }
    # The middle value, or the mean of the two middle ones; sorts values[1..n].
    function median(values, n,   i, j, t) {
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (values[j] < values[i]) { t = values[i]; values[i] = values[j]; values[j] = t }
        return n % 2 ? values[(n + 1) / 2] : (values[n / 2] + values[n / 2 + 1]) / 2
    }
    END {
        split("none log", files, " ")
        for (f = 1; f <= 2; f++) {
            n = 0; for (r in rounds) values[++n] = us[files[f], r]
            printf "  %-5s %6.1f µs of nginx CPU per session\n", files[f], median(values, n)
        }
        n = 0; for (r in rounds) values[++n] = sidecar["log", r]
        printf "  the sidecar: %.1f µs per session\n", median(values, n)
        for (f = 2; f <= 2; f++) {
            n = 0; for (r in rounds) values[++n] = us[files[f], r] / us["none", r]
            m = median(values, n)
            printf "  %s ÷ none, within each round: %.3f× (%.2f–%.2f)\n", files[f], m, values[1], values[n]
        }
    }' "$results"

#!/usr/bin/env bash
# Throughput and latency of the webhook over TLS, as a ratio to nginx serving
# the same answer as a static body (the practical ceiling for this transport).
#
#   benches/load.sh [seconds-per-run]          (default 8)
#
# Environment:
#   BALANCER_BIN=path   use this binary instead of `cargo build --release`
#                       (the build honours CARGO_TARGET_DIR)
#   BALANCER_BASELINE=path
#                       also measure this build (e.g. main's) as "baseline", in the
#                       same interleaved rounds; its answers must be byte-identical
#   NGINX=path          nginx binary (default /usr/sbin/nginx, Debian's package)
#   NGINX_WORKERS=n     nginx worker_processes (default auto: one per core, as
#                       tokio's multi-thread runtime has one worker per core)
#   WRK_THREADS=n       wrk threads (default 2)
#   LOAD_MUTATE=1       also measure POST /mutate (a review answered with a
#                       3-operation JSON Patch) against nginx returning that answer
#   LOAD_ROUNDS=n       rounds per server and concurrency, best of n (default 2)
#   LOAD_QUIET_WAIT=s   before each run, wait up to s seconds (default 30) for
#                       other work on the machine to drop under 10% of the CPU
#
# What it does:
#   1. builds (or takes) the release binary and makes a CA and serving
#      certificate with `balancer certs`;
#   2. starts `balancer run` (webhooks only) on 127.0.0.1 with that certificate;
#   3. POSTs the sample AdmissionReview to /validate with curl and keeps the
#      answer, which must say "allowed":true;
#   4. starts nginx on 127.0.0.1 with the SAME certificate and key, answering
#      POST /validate with that answer byte for byte (`return 200 '...'`,
#      Content-Type application/json), and checks it does;
#   5. drives both with wrk (TLS, HTTP/1.1 keep-alive, the same POST): a short
#      checked warm-up in which every answer must equal the captured body, then
#      64 and 4 connections, two rounds, interleaved nginx, balancer, nginx,
#      balancer; any non-2xx answer or socket error fails the script;
#   6. prints every run with the CPU other work took during it (total busy CPU
#      minus wrk's and the server's own); a run disturbed by over 10% is run
#      once more, and flagged at the end if that one is disturbed too;
#   7. prints the best of two per server and concurrency (highest req/s,
#      lowest p50 and p99, each over the rounds) and the ratios to nginx:
#      throughput at 64 connections and p99 at 4.
# With BALANCER_BASELINE, that build runs too (its own process, the same
# certificate, flags and request), after balancer in every round, and gets its
# own ratios: a before/after taken in one run.
# All traffic stays on 127.0.0.1; every run is bounded by `timeout`; the trap
# stops both servers and removes the temporary directory, also on failure.
set -euo pipefail

duration="${1:-8}"
for number in "$duration" "${LOAD_ROUNDS:-2}" "${WRK_THREADS:-2}" "${LOAD_QUIET_WAIT:-30}"; do
  case "$number" in '' | *[!0-9]*) echo "usage: $0 [seconds-per-run]   (see the header for the environment)" >&2; exit 2 ;; esac
done
[ "$duration" -gt 0 ] || { echo "usage: $0 [seconds-per-run]" >&2; exit 2; }
high=64 # connections for the throughput figure
low=4   # connections for the latency figure
rounds="${LOAD_ROUNDS:-2}"
threads="${WRK_THREADS:-2}"
nginx_bin="${NGINX:-/usr/sbin/nginx}"
nginx_workers="${NGINX_WORKERS:-auto}"
quiet_max=10                            # % of the machine other work may use during a run
quiet_wait="${LOAD_QUIET_WAIT:-30}"     # s to wait before each run for other work to calm down
repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=benches/lib.sh
. "$repo/benches/lib.sh"
work="$(mktemp -d "${TMPDIR:-/tmp}/balancer-load.XXXXXX")"
balancer_pid=""
baseline_pid=""
balancer_port=""
baseline_port=""
servers="nginx balancer" # measured in this order in every round
nginx_pid=""
nginx_pids="" # master and workers
wrk_job=""    # the subshell running `timeout wrk` while a run is under way

die() {
  echo "load.sh: $*" >&2
  exit 1
}

# Runs on every exit: stops wrk, nginx (master and workers) and balancer, removes $work.
cleanup() {
  local status=$? workers="" pid
  trap - EXIT INT TERM
  if [ -n "$wrk_job" ]; then
    # `timeout` passes the TERM on to wrk.
    for pid in $(pgrep -P "$wrk_job" || true); do stop "$pid"; done
    stop "$wrk_job"
  fi
  if [ -n "$nginx_pid" ]; then
    workers="$(pgrep -P "$nginx_pid" || true)"
    stop "$nginx_pid"
    for pid in $workers; do stop "$pid"; done
  fi
  [ -n "$balancer_pid" ] && stop "$balancer_pid"
  [ -n "$baseline_pid" ] && stop "$baseline_pid"
  show_logs_on_failure "$status" "$work/balancer.log" "$work/baseline.log" "$work/nginx-error.log"
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Fails early when a tool is missing.
require_tools() {
  local tool
  for tool in wrk curl openssl pgrep timeout cmp awk; do
    command -v "$tool" >/dev/null || die "$tool is not installed (apt-get install -y wrk curl openssl procps)"
  done
  [ -x "$nginx_bin" ] || die "no nginx at $nginx_bin (apt-get install -y nginx, or NGINX=path)"
}

# Sets $balancer to the release binary: BALANCER_BIN, or a fresh `cargo build --release`.
build_balancer() {
  if [ -n "${BALANCER_BIN:-}" ]; then
    balancer="$BALANCER_BIN"
  else
    echo "building the release binary (cargo build --release)..." >&2
    cargo build --release --quiet --manifest-path "$repo/Cargo.toml"
    local target
    target="$(cargo metadata --format-version 1 --no-deps --manifest-path "$repo/Cargo.toml" |
      grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4)"
    balancer="$target/release/balancer"
  fi
  [ -x "$balancer" ] || die "no executable balancer at $balancer"
  # A private copy: a concurrent build into a shared CARGO_TARGET_DIR cannot swap it mid-run.
  cp "$balancer" "$work/balancer"
  balancer_origin="$balancer"
  balancer="$work/balancer"
  if [ -n "${BALANCER_BASELINE:-}" ]; then
    [ -x "$BALANCER_BASELINE" ] || die "no executable baseline at $BALANCER_BASELINE"
    cp "$BALANCER_BASELINE" "$work/baseline"
    servers="nginx balancer baseline"
  fi
}

# Prints a loopback TCP port nobody listens on (the bind itself is checked later).
free_port() {
  local port
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  die "no free port found"
}

# Waits (up to 10 s) until $2 answers curl with 2xx while process $1 is alive.
wait_ready() { # $1: pid, $2: url, $3: name
  for _ in $(seq 1 100); do
    kill -0 "$1" 2>/dev/null || die "$3 exited at start"
    curl -sf --max-time 1 --cacert "$work/certs/ca.crt" -o /dev/null "$2" 2>/dev/null && return 0
    sleep 0.1
  done
  die "$3 not ready after 10 s ($2)"
}

# Starts `balancer run` of binary $2 as server $1 (balancer|baseline), webhooks only, with
# the generated certificate; sets ${1}_port and ${1}_pid.
start_webhook() { # $1: name, $2: binary
  local port probe pid
  port="$(free_port)"
  probe="$(free_port)"
  (cd "$work" && exec "$2" run --disable-controller --insecure-metrics \
    --tls-cert "$work/certs/tls.crt" --tls-key "$work/certs/tls.key" \
    --webhook-addr "127.0.0.1:$port" --probe-addr "127.0.0.1:$probe" \
    --shutdown-delay 0s --log-level warn) >"$work/$1.log" 2>&1 &
  pid=$!
  printf -v "${1}_pid" '%s' "$pid"
  printf -v "${1}_port" '%s' "$port"
  wait_ready "$pid" "http://127.0.0.1:$probe/readyz" "$1"
}

# Makes the certificate, then starts balancer (and the baseline).
start_balancer() {
  "$balancer" certs --out "$work/certs" --dns-name localhost --dns-name 127.0.0.1 >/dev/null 2>&1 ||
    die "balancer certs failed"
  start_webhook balancer "$balancer"
  [ -z "${BALANCER_BASELINE:-}" ] || start_webhook baseline "$work/baseline"
}

# An AdmissionReview of a Balancer with the given ports (JSON), on one line.
review() { # $1: ports
  printf '%s\n' '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","kind":{"group":"exposer.hliangzhao.io","version":"v1alpha1","kind":"Balancer"},"resource":{"group":"exposer.hliangzhao.io","version":"v1alpha1","resource":"balancers"},"name":"example-balancer","namespace":"default","operation":"CREATE","userInfo":{"username":"kubernetes-admin"},"object":{"apiVersion":"exposer.hliangzhao.io/v1alpha1","kind":"Balancer","metadata":{"name":"example-balancer","namespace":"default"},"spec":{"ports":'"$1"',"selector":{"app":"test"},"backends":[{"name":"v1","weight":40,"selector":{"version":"v1"}},{"name":"v2","weight":20,"selector":{"version":"v2"}},{"name":"v3","weight":40,"selector":{"version":"v3"}}]}},"dryRun":false}}'
}

# POSTs $2.json to balancer's /$1 and keeps the answer in $1.answer; $3: text the answer must contain.
capture_answer() { # $1: path (validate|mutate), $2: request name, $3: expected fragment
  curl -sSf --max-time 5 --cacert "$work/certs/ca.crt" -H 'Content-Type: application/json' \
    --data-binary @"$work/$2.json" -D "$work/$1.balancer-headers" -o "$work/$1.answer" \
    "https://127.0.0.1:$balancer_port/$1" || die "balancer did not answer POST /$1"
  grep -qF "$3" "$work/$1.answer" || die "balancer's /$1 answer lacks $3: $(cat "$work/$1.answer")"
  # The answer goes into nginx.conf as a single-quoted string: no variables, escaped quotes.
  if grep -q '\$' "$work/$1.answer"; then die "the /$1 answer contains \$, which nginx's return would expand"; fi
}

# The baseline must answer the same request with exactly balancer's bytes.
check_baseline_answer() { # $1: path
  [ -n "$baseline_pid" ] || return 0
  curl -sSf --max-time 5 --cacert "$work/certs/ca.crt" -H 'Content-Type: application/json' \
    --data-binary @"$work/$1.json" -o "$work/$1.baseline-answer" \
    "https://127.0.0.1:$baseline_port/$1" || die "the baseline did not answer POST /$1"
  cmp -s "$work/$1.answer" "$work/$1.baseline-answer" || die "the baseline's /$1 answer differs from balancer's"
}

# The answer as an nginx single-quoted string (backslashes and quotes escaped).
nginx_string() { # $1: file
  printf "'%s'" "$(sed -e 's/\\/\\\\/g' -e "s/'/\\\\'/g" "$1")"
}

# Writes nginx.conf and starts nginx in the foreground (daemon off) in the background.
start_nginx() {
  nginx_port="$(free_port)"
  mkdir -p "$work/nginx/tmp"
  local user_line="" mutate_location=""
  # As root, workers drop to nobody (certificates and logs are opened by the master).
  [ "$(id -u)" -eq 0 ] && user_line="user nobody nogroup;"
  if [ -f "$work/mutate.answer" ]; then
    mutate_location="location = /mutate { return 200 $(nginx_string "$work/mutate.answer"); }"
  fi
  cat >"$work/nginx/nginx.conf" <<CONF
$user_line
daemon off;
master_process on;
worker_processes $nginx_workers;
pid $work/nginx/nginx.pid;
error_log $work/nginx-error.log warn;
events {
    worker_connections 1024;
}
http {
    access_log off;
    server_tokens off;
    client_body_temp_path $work/nginx/tmp/body;
    proxy_temp_path $work/nginx/tmp/proxy;
    fastcgi_temp_path $work/nginx/tmp/fastcgi;
    uwsgi_temp_path $work/nginx/tmp/uwsgi;
    scgi_temp_path $work/nginx/tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    client_body_buffer_size 64k;
    default_type application/json;
    server {
        # reuseport: one listening socket per worker, so the kernel spreads
        # connections over the workers instead of the first one to wake.
        listen 127.0.0.1:$nginx_port ssl reuseport;
        ssl_certificate $work/certs/tls.crt;
        ssl_certificate_key $work/certs/tls.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        # Like rustls' defaults: a server-side session cache, no ticket keys.
        ssl_session_cache shared:SSL:1m;
        ssl_session_tickets off;
        # return reads and discards the request body, then answers; keep-alive holds.
        location = /validate { return 200 $(nginx_string "$work/validate.answer"); }
        $mutate_location
        location / { return 404; }
    }
}
CONF
  "$nginx_bin" -t -q -p "$work/nginx" -e "$work/nginx-error.log" -c "$work/nginx/nginx.conf" ||
    die "nginx -t rejected the configuration"
  "$nginx_bin" -p "$work/nginx" -e "$work/nginx-error.log" -c "$work/nginx/nginx.conf" &
  nginx_pid=$!
  wait_ready "$nginx_pid" "https://127.0.0.1:$nginx_port/validate" nginx
  # The workers, for their CPU time (worker_processes auto = one per core).
  local want="$nginx_workers" workers=""
  [ "$want" = auto ] && want="$(nproc)"
  for _ in $(seq 1 50); do
    workers="$(pgrep -P "$nginx_pid" | tr '\n' ' ')"
    [ "$(wc -w <<<"$workers")" -ge "$want" ] && break
    sleep 0.1
  done
  nginx_pids="$nginx_pid $workers"
}

# nginx must answer the same request with exactly balancer's bytes.
check_nginx_answer() { # $1: path
  curl -sSf --max-time 5 --cacert "$work/certs/ca.crt" -H 'Content-Type: application/json' \
    --data-binary @"$work/$1.json" -D "$work/$1.nginx-headers" -o "$work/$1.nginx-answer" \
    "https://127.0.0.1:$nginx_port/$1" || die "nginx did not answer POST /$1"
  cmp -s "$work/$1.answer" "$work/$1.nginx-answer" || die "nginx's /$1 body differs from balancer's"
  grep -qi '^content-type: application/json' "$work/$1.nginx-headers" || die "nginx's /$1 is not application/json"
}

# A wrk script POSTing $1.json; with $2 = check, every answer must equal $1.answer.
lua() { # $1: path, $2: "" or check
  cat <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local function slurp(name)
  local f = assert(io.open(name, "rb"))
  local text = f:read("*a")
  f:close()
  return text
end
wrk.body = slurp("$work/$1.json")
LUA
  [ "${2:-}" = check ] || return 0
  cat <<LUA
local expected = slurp("$work/$1.answer")
local threads = {}
bad = 0
function setup(thread) table.insert(threads, thread) end
function response(status, headers, body)
  if status ~= 200 or body ~= expected then bad = bad + 1 end
end
function done(summary, latency, requests)
  local total = 0
  for _, t in ipairs(threads) do total = total + t:get("bad") end
  io.write(string.format("unexpected answers: %d\n", total))
end
LUA
}

# Latency as wrk prints it (850.00us, 1.20ms, 2.00s) -> milliseconds.
to_ms() {
  awk -v v="$1" 'BEGIN {
    n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
    if (u == "us") n /= 1000; else if (u == "s") n *= 1000; else if (u == "m") n *= 60000
    else if (u != "ms") { print "bad latency " v > "/dev/stderr"; exit 1 }
    printf "%.3f", n }'
}

# Busy and total CPU ticks of the whole machine (all cores), from /proc/stat.
machine_ticks() {
  awk '$1 == "cpu" { for (i = 2; i <= 9; i++) { t += $i; if (i != 5 && i != 6) b += $i }; print b, t }' /proc/stat
}

# Waits (up to $quiet_wait s) until other work uses at most $quiet_max % of the
# machine over a 1 s sample while both servers idle; prints the last sample.
wait_quiet() {
  local deadline=$((SECONDS + quiet_wait)) a b pct
  while :; do
    a="$(machine_ticks)"
    sleep 1
    b="$(machine_ticks)"
    pct="$(awk -v a="$a" -v b="$b" 'BEGIN { split(a, x); split(b, y)
      printf "%.0f", (y[2] > x[2] ? 100 * (y[1] - x[1]) / (y[2] - x[2]) : 0) }')"
    if [ "$pct" -le "$quiet_max" ] || [ "$SECONDS" -ge "$deadline" ]; then
      echo "$pct"
      return
    fi
  done
}

# One wrk run; fails on non-2xx answers, socket errors or no requests at all.
# Appends "path server connections round req/s p50 p99 other-cpu-%" to $work/runs,
# where other-cpu-% is the machine's CPU used during the run by anything but
# wrk and the server under test (other work on a shared machine), in % of all cores.
wrk_run() { # $1: server (nginx|balancer|baseline), $2: path, $3: connections, $4: seconds, $5: round or "check"
  local port pids script="$work/$2.lua" sampler=""
  case "$1" in
    nginx) port="$nginx_port" pids="$nginx_pids" ;;
    balancer) port="$balancer_port" pids="$balancer_pid" ;;
    baseline) port="$baseline_port" pids="$baseline_pid" ;;
  esac
  [ "$5" = check ] && script="$work/$2.check.lua"
  local machine0 server0 machine1 server1 TIMEFORMAT='%3U %3S'
  [ "$5" = check ] || wait_quiet >/dev/null
  if [ "$1" = nginx ] && [ "$5" != check ]; then
    # Halfway through, note how the connections are spread over nginx's workers.
    (sleep $(($4 / 2)) && nginx_spread >"$work/spread.$3") &
    sampler=$!
  fi
  machine0="$(machine_ticks)"
  # shellcheck disable=SC2086 # $pids is a list
  server0="$(process_ticks $pids)"
  # `time` reports wrk's own CPU (user and system seconds) into wrk.time. In
  # the background, so that a signal to this script is handled at once.
  { time timeout $(($4 + 30)) wrk -t"$threads" -c"$3" -d"${4}s" --timeout 5s --latency \
    -s "$script" "https://localhost:$port/$2" >"$work/wrk.out" 2>&1; } 2>"$work/wrk.time" &
  wrk_job=$!
  wait "$wrk_job" || { cat "$work/wrk.out" >&2; die "wrk failed against $1 /$2"; }
  wrk_job=""
  machine1="$(machine_ticks)"
  # shellcheck disable=SC2086
  server1="$(process_ticks $pids)"
  [ -z "$sampler" ] || wait "$sampler" || true
  local out
  out="$(cat "$work/wrk.out")"
  if grep -q -e 'Non-2xx' -e 'Socket errors' <<<"$out"; then
    echo "$out" >&2
    die "$1 /$2 at $3 connections: non-2xx answers or socket errors"
  fi
  if [ "$5" = check ]; then
    grep -q '^unexpected answers: 0$' <<<"$out" || { echo "$out" >&2; die "$1 /$2: answers differ from the captured body"; }
    return 0
  fi
  local rps p50 p99 other
  rps="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
  p50="$(to_ms "$(awk '$1 == "50%" {print $2}' <<<"$out")")"
  p99="$(to_ms "$(awk '$1 == "99%" {print $2}' <<<"$out")")"
  awk -v r="$rps" 'BEGIN { exit !(r > 0) }' || { echo "$out" >&2; die "$1 /$2: no requests completed"; }
  other="$(awk -v m0="$machine0" -v m1="$machine1" -v s="$((server1 - server0))" -v w="$(cat "$work/wrk.time")" \
    -v hz="$(getconf CLK_TCK)" 'BEGIN { split(m0, a); split(m1, b); split(w, t)
      o = (b[1] - a[1]) - s - (t[1] + t[2]) * hz
      printf "%.0f", (b[2] > a[2] && o > 0 ? 100 * o / (b[2] - a[2]) : 0) }')"
  printf '  round %s  %-8s /%-8s %3s conn  %8.0f req/s  p50 %6.3f ms  p99 %6.3f ms  other CPU %3s%%\n' \
    "$5" "$1" "$2" "$3" "$rps" "$p50" "$p99" "$other"
  echo "$2 $1 $3 $5 $rps $p50 $p99 $other" >>"$work/runs"
}

# How the established connections to nginx are spread over its workers (pids), for the record.
nginx_spread() {
  ss -Htnp state established "( sport = :$nginx_port )" 2>/dev/null |
    grep -o 'pid=[0-9]*' | sort | uniq -c | awk '{printf "%s%s", (NR > 1 ? ", " : ""), $1}'
}

# The negotiated protocol and cipher, as an OpenSSL client sees them.
tls_params() { # $1: port
  openssl s_client -connect "127.0.0.1:$1" -servername localhost </dev/null 2>/dev/null |
    awk '/^New, / {print $2, $5; exit}'
}

# All measured runs for one path: $rounds rounds of (high, low) x $servers.
measure() { # $1: path
  local round conns server attempt
  for server in $servers; do wrk_run "$server" "$1" "$high" 1 check; done
  for round in $(seq 1 "$rounds"); do
    for conns in "$high" "$low"; do
      for server in $servers; do
        # A run that other work disturbed is run once more.
        for attempt in 1 2; do
          wrk_run "$server" "$1" "$conns" "$duration" "$round"
          awk -v max="$quiet_max" 'END { exit !($8 > max) }' "$work/runs" || break
          [ "$attempt" -lt 2 ] || break
          echo "           ^ other work used over $quiet_max% of the CPU: run again"
          sed -i '$d' "$work/runs"
        done
      done
    done
  done
}

# Best of the rounds per path, server and connections (max req/s, min p50, min p99), then ratios.
report() { # $1: path
  local path="$1"
  printf '\nbest of %s, /%s:\n' "$rounds" "$path"
  printf '  %-9s %5s %12s  %9s  %9s\n' server conn "req/s" "p50 ms" "p99 ms"
  awk -v p="$path" -v high="$high" -v low="$low" -v max="$quiet_max" -v servers="$servers" '
    # Figures from a run that other work disturbed carry a "*".
    $1 == p {
      k = $2 " " $3; d = ($8 > max ? "*" : " ")
      if (!(k in rps) || $5 > rps[k]) { rps[k] = $5; rd[k] = d }
      if (!(k in p50) || $6 < p50[k]) { p50[k] = $6; pd[k] = d }
      if (!(k in p99) || $7 < p99[k]) { p99[k] = $7; qd[k] = d }
    }
    END {
      split(high " " low, cs, " ")
      n = split(servers, ss, " ")
      for (i = 1; i <= 2; i++) {
        for (j = 1; j <= n; j++) {
          k = ss[j] " " cs[i]
          printf "  %-9s %5s %12.0f%s %9.3f%s %9.3f%s\n", ss[j], cs[i], rps[k], rd[k], p50[k], pd[k], p99[k], qd[k]
        }
      }
      for (j = 2; j <= n; j++) {
        s = ss[j]
        t = rps[s " " high] / rps["nginx " high]
        l = p99[s " " low] / p99["nginx " low]
        printf "%s: /%s throughput at %s connections = %.2f x nginx   (goal >= 0.80: %s)\n", s, p, high, t, (t >= 0.8 ? "met" : "not met")
        printf "%s: /%s p99 at %s connections = %.2f x nginx   (goal <= 1.50: %s)\n", s, p, low, l, (l <= 1.5 ? "met" : "not met")
        printf "  (also: throughput at %s = %.2f x, p50 at %s = %.2f x, p99 at %s = %.2f x)\n", low,
          rps[s " " low] / rps["nginx " low], low, p50[s " " low] / p50["nginx " low],
          high, p99[s " " high] / p99["nginx " high]
      }
    }' "$work/runs"
}

main() {
  require_tools
  build_balancer
  start_balancer
  review '[{"name":"http","protocol":"TCP","port":80,"targetPort":5678}]' >"$work/validate.json"
  capture_answer validate validate '"allowed":true'
  local paths=validate
  if [ "${LOAD_MUTATE:-0}" = 1 ]; then
    review '[{"name":"http","port":80}]' >"$work/mutate.json"
    capture_answer mutate mutate '"patchType":"JSONPatch"'
    paths="validate mutate"
  fi
  start_nginx
  local path
  for path in $paths; do
    check_nginx_answer "$path"
    check_baseline_answer "$path"
    lua "$path" >"$work/$path.lua"
    lua "$path" check >"$work/$path.check.lua"
  done

  local cores workers
  cores="$(nproc)"
  workers=$(($(wc -w <<<"$nginx_pids") - 1))
  echo "load.sh: wrk, $threads threads, ${duration}s per run, $rounds rounds interleaved ($servers), best of $rounds"
  echo "  $cores cores shared by wrk and the server under test; https://localhost (127.0.0.1, SNI localhost), HTTP/1.1 keep-alive"
  echo "  load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "  order in every round: $servers"
  echo "  balancer: $balancer_origin"
  [ -z "${BALANCER_BASELINE:-}" ] || echo "  baseline: $BALANCER_BASELINE (measured after balancer in every round)"
  echo "  nginx:    $("$nginx_bin" -v 2>&1 | sed 's/^nginx version: //'), worker_processes $nginx_workers ($workers workers), listen reuseport, return 200 <static body>, access_log off,"
  echo "            TLSv1.2 TLSv1.3, ssl_session_cache shared:SSL:1m, ssl_session_tickets off, keepalive_requests 1000000"
  echo "  TLS:      same certificate and key for both; negotiated with an OpenSSL client: nginx $(tls_params "$nginx_port"), balancer $(tls_params "$balancer_port")"
  for path in $paths; do
    echo "  /$path: request $(wc -c <"$work/$path.json") bytes, answer $(wc -c <"$work/$path.answer") bytes (identical from both)," \
      "answer headers nginx $(wc -c <"$work/$path.nginx-headers") bytes, balancer $(wc -c <"$work/$path.balancer-headers") bytes"
  done
  echo
  : >"$work/runs"
  for path in $paths; do
    measure "$path"
  done
  echo "  (warm-up before each path: 1 s per server at $high connections, every answer byte-identical to the captured one)"
  echo "  nginx connections per worker, halfway through the last runs: $high connections: $(cat "$work/spread.$high"); $low connections: $(cat "$work/spread.$low")"
  echo "  load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
  for path in $paths; do
    report "$path"
  done
  awk -v max="$quiet_max" '$8 > max { busy++ } END { if (busy) printf "\nWARNING: in %d runs other work used over %d%% of the CPU; figures from them (*), and ratios of those, are unreliable\n", busy, max }' "$work/runs"
}

main

#!/usr/bin/env bash
# Load test of the real webhook server over TLS with keep-alive (wrk, from Debian's `wrk` package).
#
#   benches/load.sh [duration-seconds] [connections]
#
# Builds the release binary, starts `balancer run` on loopback with fresh dev
# certificates, then drives, each for the same duration and connection count:
#   1. baseline: GET /healthz over the same TLS listener (transport cost only)
#   2. POST /validate with the original sample as an AdmissionReview
#   3. POST /mutate with a sample missing its defaults (answered with a JSON Patch)
# and prints requests/s and p50/p99 latency for each, plus the ratio to the baseline.
# Traffic stays on 127.0.0.1, and wrk stops by itself after the duration.
set -euo pipefail

duration="${1:-10}"
connections="${2:-32}"
threads=2
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

command -v wrk >/dev/null || { echo "wrk is not installed: apt-get install -y wrk" >&2; exit 1; }
cargo build --release --quiet --manifest-path "$repo/Cargo.toml"

port=$((20000 + RANDOM % 20000))
probe=$((port + 1))
(cd "$work" && exec "$repo/target/release/balancer" run \
  --webhook-addr "127.0.0.1:$port" --probe-addr "127.0.0.1:$probe" --insecure-metrics --log-level warn) &
server_pid=$!
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$probe/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done

review() { # $1: JSON of the Balancer's ports
  cat <<JSON
{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","kind":{"group":"exposer.hliangzhao.io","version":"v1alpha1","kind":"Balancer"},"resource":{"group":"exposer.hliangzhao.io","version":"v1alpha1","resource":"balancers"},"name":"example-balancer","namespace":"default","operation":"CREATE","userInfo":{"username":"kubernetes-admin"},"object":{"apiVersion":"exposer.hliangzhao.io/v1alpha1","kind":"Balancer","metadata":{"name":"example-balancer","namespace":"default"},"spec":{"ports":$1,"selector":{"app":"test"},"backends":[{"name":"v1","weight":40,"selector":{"version":"v1"}},{"name":"v2","weight":20,"selector":{"version":"v2"}},{"name":"v3","weight":40,"selector":{"version":"v3"}}]}},"dryRun":false}}
JSON
}

lua() { # $1: body file -> a wrk script POSTing it
  cat <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open("$1", "r"))
wrk.body = f:read("*a")
f:close()
LUA
}

review '[{"name":"http","protocol":"TCP","port":80,"targetPort":5678}]' > "$work/validate.json"
review '[{"name":"http","port":80}]' > "$work/mutate.json"
lua "$work/validate.json" > "$work/validate.lua"
lua "$work/mutate.json" > "$work/mutate.lua"

# Sanity: the bodies really are answered as intended.
curl -sf --cacert "$work/certs/ca.crt" -H 'Content-Type: application/json' \
  --data-binary @"$work/validate.json" "https://127.0.0.1:$port/validate" | grep -q '"allowed":true'
curl -sf --cacert "$work/certs/ca.crt" -H 'Content-Type: application/json' \
  --data-binary @"$work/mutate.json" "https://127.0.0.1:$port/mutate" | grep -q '"patchType":"JSONPatch"'

run() { # $1: label, $2: path, $3: optional lua script
  local out
  out="$(wrk -t"$threads" -c"$connections" -d"${duration}s" --latency ${3:+-s "$3"} "https://localhost:$port$2")"
  if echo "$out" | grep -q "Non-2xx"; then echo "$out" >&2; echo "$1: non-2xx answers" >&2; exit 1; fi
  local rps p50 p99
  rps="$(echo "$out" | awk '/Requests\/sec/ {print $2}')"
  p50="$(echo "$out" | awk '$1 == "50%" {print $2}')"
  p99="$(echo "$out" | awk '$1 == "99%" {print $2}')"
  printf '%-34s %12s req/s   p50 %9s   p99 %9s\n' "$1" "$rps" "$p50" "$p99"
  echo "$rps" > "$work/$2.rps"
}

echo "wrk: ${duration}s per run, $connections connections, $threads threads, TLS keep-alive, $(nproc) cores"
run "baseline GET /healthz (TLS only)" /healthz
run "POST /validate (sample)" /validate "$work/validate.lua"
run "POST /mutate (3-op JSON Patch)" /mutate "$work/mutate.lua"
base="$(cat "$work/healthz.rps")"
for path in validate mutate; do
  awk -v b="$base" -v r="$(cat "$work/$path.rps")" -v p="$path" \
    'BEGIN { printf "%s throughput = %.2f x baseline\n", p, r / b }'
done

#!/usr/bin/env bash
# Builds Prometheus and promtool from the Go module proxy, and prints the directory that holds
# them. Cached by version outside the clone, so a warm run builds nothing.
#
#   prometheus.sh [--cached]
#
# - Prometheus 3.16.0 (github.com/prometheus/prometheus v0.316.0), its version stamped, with
#   Kubernetes service discovery only (`remove_all_sd,enable_kubernetes_sd`, the project's own
#   build tags) and without the web UI's assets (the API is all the tests use).
#   Debian 12's Prometheus 2.42 is built without Kubernetes service discovery, which the node
#   suite's scrape of the shipped monitors needs.
# - promtool from the same release, for the alerts' unit tests.
#
# --cached only prints the directory if it is already built, and fails otherwise.
# Cache: ~/.cache/balancer/prometheus/PROMETHEUS_VERSION (BALANCER_PROMETHEUS_CACHE overrides
# the parent), stamped. Cold on 2 cores: about 2 minutes.
set -euo pipefail
# shellcheck source=tests/kubernetes/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build.sh"
script=prometheus.sh

prometheus_version=3.16.0
module_version=v0.316.0
cached_flag "$@"

log() { echo "prometheus $prometheus_version: $*" >&2; }

commands=(prometheus promtool)
cache="${BALANCER_PROMETHEUS_CACHE:-${HOME:-/tmp}/.cache/balancer/prometheus}/$prometheus_version"
stamp="prometheus $prometheus_version kubernetes-sd"
holds() {
  local name
  [ "$(cat "$cache/.stamp" 2>/dev/null)" = "$stamp" ] || return 1
  for name in "${commands[@]}"; do [ -x "$cache/$name" ] || return 1; done
}
use_cache_if_built
start_go_build

log "building ${commands[*]}"
wrapper_module prometheus
module=github.com/prometheus/prometheus
packages=("${commands[@]/#/$module/cmd/}")
go_get "${packages[@]/%/@$module_version}"
go build -trimpath -tags remove_all_sd,enable_kubernetes_sd \
  -ldflags "-s -w -X github.com/prometheus/common/version.Version=$prometheus_version" \
  -o "$work/out/" "${packages[@]}"
"$work/out/prometheus" --version 2>&1 | grep -q "version $prometheus_version" ||
  { echo "prometheus.sh: the built prometheus does not say version $prometheus_version" >&2; exit 1; }

install_cache
log "ready in $cache"
echo "$cache"

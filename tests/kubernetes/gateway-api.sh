#!/usr/bin/env bash
# Fetches Gateway API's standard-channel CRDs from the Go module proxy (the module
# sigs.k8s.io/gateway-api carries them), and prints the directory that holds them. Cached by
# version outside the clone, so a warm run fetches nothing.
#
#   gateway-api.sh [--cached]
#
# - Gateway API v1.7.0: GatewayClass, Gateway, the routes (TCPRoute, UDPRoute and TLSRoute at
#   v1 among them), ReferenceGrant, BackendTLSPolicy and ListenerSet, one YAML file each, as
#   the release's standard-install.yaml holds them (its ValidatingAdmissionPolicy left out).
# - The module declares go 1.27; GOTOOLCHAIN has the go command fetch 1.27.4 from the proxy.
#
# --cached only prints the directory if it is already there, and fails otherwise.
# Cache: ~/.cache/balancer/gateway-api/VERSION (BALANCER_GATEWAY_API_CACHE overrides the
# parent), stamped.
set -euo pipefail
# shellcheck source=tests/kubernetes/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build.sh"
script=gateway-api.sh

version=v1.7.0
cached_flag "$@"

cache="${BALANCER_GATEWAY_API_CACHE:-${HOME:-/tmp}/.cache/balancer/gateway-api}/$version"
stamp="gateway-api $version standard CRDs"
holds() {
  [ "$(cat "$cache/.stamp" 2>/dev/null)" = "$stamp" ] && [ -s "$cache/gateway.networking.k8s.io_tcproutes.yaml" ]
}
use_cache_if_built
start_go_build

echo "gateway-api $version: fetching the module" >&2
module="$(GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.4}" go mod download -json "sigs.k8s.io/gateway-api@$version")"
dir="$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$module")"
[ -d "$dir/config/crd/standard" ] || { echo "$script: no CRDs in the module: $module" >&2; exit 1; }
for crd in "$dir"/config/crd/standard/gateway.networking.k8s.io_*.yaml; do
  case "$crd" in *_vap_*) continue ;; esac
  cp "$crd" "$work/out/"
done
install_cache
echo "$cache"

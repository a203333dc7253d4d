#!/usr/bin/env bash
# Fills the chart's gateway-api/ with Gateway API's standard-channel CRDs, which
# gatewayAPI.crds.install renders (templates/gateway-api-crds.yaml). They are Gateway API's
# files, not this repository's: gateway-api/ is git-ignored, and filled from what
# tests/kubernetes/gateway-api.sh fetches from the Go module proxy (and caches), so that the
# version is that script's alone. Run it from a checkout, before `helm install` or
# `helm package` with the value on, and again after a change of version: it replaces the CRDs
# it finds.
#
#   charts/balancer/gateway-api-crds.sh [--cached] [DIR]
#
# --cached: only from gateway-api.sh's cache (no Go, no network); fails when it is empty.
# DIR: fills DIR instead of the chart's gateway-api/ (the tests fill a copy of the chart).
set -euo pipefail
script=gateway-api-crds.sh
chart="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fetch="$chart/../../tests/kubernetes/gateway-api.sh"

usage() {
  echo "usage: $script [--cached] [DIR]" >&2
  exit 2
}
fetch_args=()
if [ "${1:-}" = --cached ]; then
  fetch_args=(--cached)
  shift
fi
[ $# -le 1 ] || usage
case "${1:-}" in -*) usage ;; esac
into="${1:-$chart/gateway-api}"
[ -f "$fetch" ] || { echo "$script: needs the repository's checkout around the chart ($fetch)" >&2; exit 1; }

crds="$(bash "$fetch" "${fetch_args[@]}")"
shopt -s nullglob
fetched=("$crds"/gateway.networking.k8s.io_*.yaml)
[ ${#fetched[@]} -gt 0 ] || { echo "$script: no CRDs in $crds" >&2; exit 1; }
mkdir -p "$into"
rm -f "$into"/gateway.networking.k8s.io_*.yaml
cp "${fetched[@]}" "$into/"
# The cache's files are read-only; the copies are the user's.
chmod 0644 "$into"/gateway.networking.k8s.io_*.yaml
echo "$script: ${#fetched[@]} CRDs of Gateway API $(basename "$crds") in $into" >&2

#!/usr/bin/env bash
# Builds Gateway API's conformance suite at v1.7.0 from the Go module proxy, with balancer's
# harness (tests/conformance/balancer_test.go), and the echo server its tests deploy; prints
# the directory that holds them. Cached by version outside the clone.
#
#   conformance.sh [--cached]
#
# - conformance.test: `go test -c` of a wrapper module that requires
#   sigs.k8s.io/gateway-api/conformance v1.7.0 (Go 1.27, which GOTOOLCHAIN fetches).
#   That release imports sigs.k8s.io/gateway-api-conformance-images, which the module proxy
#   does not serve: the wrapper replaces it with a local module assembled at build time from
#   the same packages (echo-basic/tcpserver, udpechoserver, grpcechoserver) of
#   sigs.k8s.io/gateway-api/conformance v1.6.3, the last release that carried them.
# - echo-basic: the suite's echo server, built from conformance v1.6.3's echo-basic, which
#   answers TCP (TCP_ECHO_SERVER) and UDP (UDP_ECHO_SERVER) as its tests ask.
#
# Cache: ~/.cache/balancer/conformance/VERSION (BALANCER_CONFORMANCE_CACHE overrides the
# parent), stamped with the hash of the harness and this script, so a change builds again.
set -euo pipefail
# shellcheck source=tests/kubernetes/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build.sh"
script=conformance.sh

version=v1.7.0
images_from=v1.6.3
harness="$(cd "$(dirname "${BASH_SOURCE[0]}")/../conformance" && pwd)/balancer_test.go"
cached_flag "$@"

cache="${BALANCER_CONFORMANCE_CACHE:-${HOME:-/tmp}/.cache/balancer/conformance}/$version"
stamp="gateway-api conformance $version, echo-basic $images_from, $(cat "$harness" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)"
holds() {
  [ "$(cat "$cache/.stamp" 2>/dev/null)" = "$stamp" ] && [ -x "$cache/conformance.test" ] && [ -x "$cache/echo-basic" ]
}
use_cache_if_built
start_go_build
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.4}"
log() { echo "conformance $version: $*" >&2; }

module_dir() { sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$(go mod download -json "$1")"; }
old="$(module_dir "sigs.k8s.io/gateway-api/conformance@$images_from")"
[ -d "$old/echo-basic/tcpserver" ] || { echo "$script: no echo-basic in conformance $images_from" >&2; exit 1; }

log "assembling sigs.k8s.io/gateway-api-conformance-images from conformance $images_from"
images="$work/conformance-images"
mkdir -p "$images/echo-basic"
for package in tcpserver udpechoserver grpcechoserver; do
  cp -r "$old/echo-basic/$package" "$images/echo-basic/"
done
chmod -R u+w "$images"
find "$images" -name '*_test.go' -delete
# Taken as they are: no package imports another by its old path (the one mention, in
# grpcecho.pb.go's descriptor, is its go_package option, length-prefixed, left alone).
(
  cd "$images"
  go mod init sigs.k8s.io/gateway-api-conformance-images >/dev/null 2>&1
  go mod tidy >/dev/null 2>&1 || go mod tidy
)

log "building the suite with balancer's harness"
wrapper_module suite
cp "$harness" .
go mod edit -replace "sigs.k8s.io/gateway-api-conformance-images=$images"
go_get "sigs.k8s.io/gateway-api/conformance@$version" "sigs.k8s.io/gateway-api@$version"
go mod tidy >/dev/null 2>&1 || go mod tidy
go test -c -o "$work/out/conformance.test" .

log "building echo-basic from conformance $images_from"
wrapper_module echo
go_get "sigs.k8s.io/gateway-api/conformance@$images_from" "sigs.k8s.io/gateway-api@$images_from"
go build -o "$work/out/echo-basic" sigs.k8s.io/gateway-api/conformance/echo-basic
install_cache
echo "$cache"

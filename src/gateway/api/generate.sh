#!/usr/bin/env bash
# Regenerates the Gateway API types in this folder from the standard-channel CRDs of one
# release (default v1.7.0), as kube-rs's gateway-api crate generates its own: kopium, one file
# per resource, at the version the CRD stores (v1). The CRDs come from the Go module proxy and
# are not kept. Needs kopium (`cargo install kopium --locked`) and Go; GOTOOLCHAIN fetches the
# toolchain the module asks for.
set -euo pipefail
version="${1:-v1.7.0}"
cd "$(dirname "$0")"
module="$(GOFLAGS=-mod=mod GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.4}" go mod download -json "sigs.k8s.io/gateway-api@$version")"
dir="$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$module")"
[ -d "$dir/config/crd/standard" ] || { echo "no CRDs in the module: $module" >&2; exit 1; }
for resource in gatewayclasses gateways tcproutes udproutes tlsroutes referencegrants; do
  # No schema: balancer reads these resources and never installs its own copy of the CRDs.
  kopium --api-version v1 --schema=disabled --derive=Default --derive=PartialEq --docs \
    -f "$dir/config/crd/standard/gateway.networking.k8s.io_$resource.yaml" >"$resource.rs"
  # The module cache's path is this machine's: the header names the module instead.
  sed -i -e "1i // Gateway API $version, standard channel: src/gateway/api/generate.sh $version" \
    -e "s|$dir/|sigs.k8s.io/gateway-api@$version/|" "$resource.rs"
done
rustfmt --edition 2024 ./*.rs

#!/usr/bin/env bash
# Builds the node suite's container images with no registry and prints the
# directory that holds them as OCI archives, ready for `ctr images import`.
#
#   images.sh ASSETS BALANCER_BINARY [CERT_MANAGER [CONFORMANCE]]
#
# - localhost/balancer-test-base:1 — Debian bookworm's essential set (mmdebstrap)
#   plus nginx-light, libnginx-mod-stream, python3-minimal and haproxy: the proxy (its
#   stream module is dynamic, as in Debian, Ubuntu and UBI), the HTTP backends,
#   the UDP echo, and HAProxy in the proxy's place for the data-plane benchmark.
#   The root filesystem is built once and cached in ~/.cache/balancer/node
#   (override with BALANCER_NODE_CACHE).
# - localhost/pause:3.4.1 — the static pause binary from tests/kubernetes/build.sh --node.
# - localhost/balancer:test — the base plus the operator binary, with the
#   Dockerfile's runtime contract: non-root (65532), `balancer run`.
# - with CERT_MANAGER (the directory tests/kubernetes/cert-manager.sh prints):
#   localhost/cert-manager-{controller,cainjector,webhook}:VERSION — each static
#   binary alone, non-root (1000), as the chart's securityContext requires.
# - with CONFORMANCE (the directory tests/kubernetes/conformance.sh prints):
#   registry.k8s.io/gateway-api/conformance/echo-basic:{v0.1.0,v0.2.0} — the suite's echo
#   server alone, under the names its manifests use (nothing is pulled).
#
# Needs root for apt-get and mmdebstrap. About 2 minutes the first time.
set -euo pipefail

assets="$1"
binary="$2"
cert_manager="${3:-}"
conformance="${4:-}"
log() { echo "images: $*" >&2; }

cache="${BALANCER_NODE_CACHE:-${HOME:-/tmp}/.cache/balancer/node}"
packages="nginx-light,libnginx-mod-stream,python3-minimal,haproxy"
rootfs="$cache/rootfs-bookworm-$(echo "$packages" | sha256sum | cut -c1-12).tar"
out="$cache/images"
mkdir -p "$cache" "$out"

if [ ! -s "$rootfs" ]; then
  command -v mmdebstrap >/dev/null || apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
  log "building the base root filesystem (about 90 s)"
  # The machine's own apt sources, so the image comes from the same archive.
  mmdebstrap --quiet --format=tar --variant=essential --include="$packages" bookworm "$rootfs.part" \
    /etc/apt/sources.list.d/*.sources </dev/null >&2
  mv "$rootfs.part" "$rootfs"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# oci_archive OUT REF CONFIG LAYER...: a single-manifest OCI image layout, as a tar.
# CONFIG is the image config's "config" object; layers are uncompressed tars.
oci_archive() {
  local archive="$1" ref="$2" config="$3"
  shift 3
  local dir="$work/oci" diff_ids="" layers="" layer digest size
  rm -rf "$dir" && mkdir -p "$dir/blobs/sha256"
  for layer in "$@"; do
    digest="$(sha256sum "$layer" | cut -d' ' -f1)"
    size="$(stat -c %s "$layer")"
    cp "$layer" "$dir/blobs/sha256/$digest"
    diff_ids+="${diff_ids:+,}\"sha256:$digest\""
    layers+="${layers:+,}{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$digest\",\"size\":$size}"
  done
  blob() { # writes stdin as a blob, prints "digest size"
    local tmp="$dir/blob.tmp" d
    cat >"$tmp"
    d="$(sha256sum "$tmp" | cut -d' ' -f1)"
    mv "$tmp" "$dir/blobs/sha256/$d"
    echo "$d $(stat -c %s "$dir/blobs/sha256/$d")"
  }
  local config_blob manifest_blob config_digest config_size manifest_digest manifest_size
  config_blob="$(printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":[%s]}}' \
    "$config" "$diff_ids" | blob)"
  read -r config_digest config_size <<<"$config_blob"
  manifest_blob="$(printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[%s]}' \
    "$config_digest" "$config_size" "$layers" | blob)"
  read -r manifest_digest manifest_size <<<"$manifest_blob"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$dir/oci-layout"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest_digest" "$manifest_size" "$ref" "${ref##*:}" >"$dir/index.json"
  tar -C "$dir" -cf "$archive" oci-layout index.json blobs
}

path_env='"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]'

# pause: one static binary.
mkdir -p "$work/pause"
cp "$assets/pause" "$work/pause/pause"
tar -C "$work/pause" --owner=0 --group=0 --numeric-owner -cf "$work/pause.tar" pause
oci_archive "$out/pause.tar" localhost/pause:3.4.1 "{$path_env,\"Entrypoint\":[\"/pause\"]}" "$work/pause.tar"

if [ ! -s "$out/base.tar" ] || [ "$out/base.tar" -ot "$rootfs" ]; then
  oci_archive "$out/base.tar" localhost/balancer-test-base:1 "{$path_env,\"Cmd\":[\"/bin/sh\"]}" "$rootfs"
fi

# The operator: stripped, so the layer is small and quick to import.
mkdir -p "$work/operator"
strip -o "$work/operator/balancer" "$binary"
tar -C "$work/operator" --owner=0 --group=0 --numeric-owner -cf "$work/operator.tar" balancer
oci_archive "$out/balancer.tar" localhost/balancer:test \
  "{$path_env,\"User\":\"65532:65532\",\"Entrypoint\":[\"/balancer\",\"run\"]}" "$rootfs" "$work/operator.tar"

if [ -n "$cert_manager" ]; then
  version="$(sed -n 's/^appVersion: //p' "$cert_manager/chart/Chart.yaml")"
  for command in controller cainjector webhook; do
    # Made once per build of the binary: they are large and do not change between runs.
    [ -s "$out/cert-manager-$command.tar" ] && [ "$out/cert-manager-$command.tar" -nt "$cert_manager/$command" ] &&
      continue
    mkdir -p "$work/$command"
    cp "$cert_manager/$command" "$work/$command/$command"
    tar -C "$work/$command" --owner=0 --group=0 --numeric-owner -cf "$work/$command.tar" "$command"
    oci_archive "$out/cert-manager-$command.tar" "localhost/cert-manager-$command:$version" \
      "{$path_env,\"User\":\"1000:1000\",\"Entrypoint\":[\"/$command\"]}" "$work/$command.tar"
  done
fi

# Gateway API's conformance echo server, under the names the suite's manifests ask for (v0.2.0
# is the UDP echo's; the same binary serves both, as its environment says).
if [ -n "$conformance" ]; then
  for tag in v0.1.0 v0.2.0; do
    archive="$out/echo-basic-$tag.tar"
    [ -s "$archive" ] && [ "$archive" -nt "$conformance/echo-basic" ] && continue
    mkdir -p "$work/echo-basic"
    cp "$conformance/echo-basic" "$work/echo-basic/echo-basic"
    tar -C "$work/echo-basic" --owner=0 --group=0 --numeric-owner -cf "$work/echo-basic.tar" echo-basic
    oci_archive "$archive" "registry.k8s.io/gateway-api/conformance/echo-basic:$tag" \
      "{$path_env,\"Entrypoint\":[\"/echo-basic\"]}" "$work/echo-basic.tar"
  done
fi

log "ready in $out"
echo "$out"

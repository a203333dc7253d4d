#!/usr/bin/env bash
# Builds the Kubernetes release the suites run, from the Go module proxy, and prints
# the directory that holds it. Cached by version outside the clone, so a warm run
# builds nothing.
#
#   build.sh [--version vX.Y.Z] [--node] [--cached]
#
# --cached only prints the directory if the build is already there, and fails otherwise.
# Without --node: kube-apiserver, kube-controller-manager, kubectl and etcd (what the
# e2e suite needs). With --node, also kube-scheduler, kubelet, kube-proxy, pause, and
# containerd 2 with ctr and its runc shim (the host's runc runs the containers).
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every k8s.io staging
# module with a ./staging path that the module zip leaves out. So a throwaway wrapper
# module requires it and replaces each staging module with its published version
# (kubernetes/kubernetes#79384), read from the release's own go.mod. etcd's server
# module has relative replaces too and gets a wrapper of its own.
#
# Cache: ~/.cache/balancer/kubernetes/VERSION (BALANCER_KUBERNETES_CACHE overrides the
# parent), stamped with the etcd and containerd versions. Cold on 2 cores: about 8 minutes
# for v1.35's three commands and etcd, then about 6 for v1.37 with --node (Go's caches
# share what the two releases have in common).
set -euo pipefail
# shellcheck source=tests/kubernetes/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build.sh"
script=build.sh

version=v1.37.2
node=false
cached_only=false
while [ $# -gt 0 ]; do
  case "$1" in
    --version) version="$2"; shift 2 ;;
    --node) node=true; shift ;;
    --cached) cached_only=true; shift ;;
    *) echo "usage: build.sh [--version vX.Y.Z] [--node] [--cached]" >&2; exit 2 ;;
  esac
done

log() { echo "kubernetes $version: $*" >&2; }

# The etcd each release expects (kubeadm's SupportedEtcdVersion table).
case "$version" in
  v1.37.*) etcd_version=v3.7.3 ;;
  v1.35.* | v1.36.*) etcd_version=v3.6.16 ;;
  *) echo "build.sh: no etcd version known for $version" >&2; exit 2 ;;
esac
containerd_version=v2.4.2

commands=(kube-apiserver kube-controller-manager kubectl)
$node && commands+=(kube-scheduler kubelet kube-proxy)
files=("${commands[@]}" etcd)
$node && files+=(pause containerd ctr containerd-shim-runc-v2)

cache="${BALANCER_KUBERNETES_CACHE:-${HOME:-/tmp}/.cache/balancer/kubernetes}/$version"
# What else went into the cache: another etcd or containerd version rebuilds it.
stamp="etcd $etcd_version containerd $containerd_version"
holds() {
  local name
  [ "$(cat "$cache/.stamp" 2>/dev/null)" = "$stamp" ] || return 1
  for name in "${files[@]}"; do [ -x "$cache/$name" ] || return 1; done
}
use_cache_if_built
start_go_build
$node && ! command -v gcc >/dev/null && { echo "build.sh: --node needs gcc (and libc6-dev) for pause" >&2; exit 1; }

# --- Kubernetes: a wrapper module with the staging modules at their published versions.
log "resolving k8s.io/kubernetes and its staging modules"
wrapper_module kubernetes
upstream_mod="$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
staging="v0.${version#v1.}"
{
  # The release's godebug settings keep its runtime defaults under this wrapper's go line.
  sed -n '/^godebug (/,/^)/p; /^godebug [^(]/p' "$upstream_mod"
  echo "replace ("
  sed -n 's#^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/k8s\.io/.*#\t\1 => \1 '"$staging"'#p' "$upstream_mod"
  echo ")"
} >>go.mod
# Each package at the release's version: without it `go get` would move to the newest release.
packages=("${commands[@]/#/k8s.io/kubernetes/cmd/}")
go_get "${packages[@]/%/@$version}"

# Version stamping as hack/lib/version.sh does, so `kubectl version` and the operator's
# discovery see the real release rather than v0.0.0-master.
minor="${version#v1.}"
minor="${minor%%.*}"
ldflags="-s -w"
for package in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $package.gitVersion=$version -X $package.gitMajor=1 -X $package.gitMinor=$minor"
  ldflags+=" -X $package.gitTreeState=clean -X $package.buildDate=1970-01-01T00:00:00Z"
done
log "building ${commands[*]} (several minutes cold)"
go build -trimpath -ldflags "$ldflags" -o "$work/out/" "${packages[@]}"

if $node; then
  log "building the static pause binary"
  source_dir="$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
  gcc -Os -static -DVERSION="$version" -o "$work/out/pause" "$source_dir/build/pause/linux/pause.c"
fi

# --- etcd: its server module's relative replaces are ignored in a wrapper, so its
# requirements resolve to the published api, client and pkg modules of the same tag.
log "building etcd $etcd_version"
wrapper_module etcd
go_get "go.etcd.io/etcd/server/v3@$etcd_version"
go build -trimpath -ldflags "-s -w" -o "$work/out/etcd" go.etcd.io/etcd/server/v3

if $node; then
  log "building containerd $containerd_version"
  wrapper_module containerd
  module=github.com/containerd/containerd/v2
  containerd_commands=(containerd ctr containerd-shim-runc-v2)
  # Each command's package at the release (a version after the list would name the last only).
  containerd_packages=("${containerd_commands[@]/#/$module/cmd/}")
  go_get "${containerd_packages[@]/%/@$containerd_version}"
  # Its Makefile's tags for a static build with no cgo storage drivers.
  go build -trimpath -tags "no_btrfs no_devmapper no_zfs urfave_cli_no_docs" \
    -ldflags "-s -w -X $module/version.Version=$containerd_version" \
    -o "$work/out/" "${containerd_packages[@]}"
fi

# Staged beside the cache, then renamed into place: a binary still running from an
# earlier build is replaced without "Text file busy".
rm -rf "$cache/.staging" # what an interrupted run left half-copied
mkdir -p "$cache/.staging"
for file in "${files[@]}"; do cp "$work/out/$file" "$cache/.staging/"; done
for file in "${files[@]}"; do mv -f "$cache/.staging/$file" "$cache/"; done
rmdir "$cache/.staging"
echo "$stamp" >"$cache/.stamp"
log "ready in $cache"
echo "$cache"

#!/usr/bin/env bash
# Makes the Kubernetes binaries available for the e2e and node tests and prints
# the directory that holds them (envtest convention).
#
# 1. $KUBEBUILDER_ASSETS, if it holds kube-apiserver and etcd (what setup-envtest
#    installs; any recent version). kube-controller-manager is optional there:
#    without it the tests that need garbage collection or Deployment status say so.
#    With --node, it must also hold kube-scheduler, kubelet, kube-proxy and pause.
# 2. Otherwise Kubernetes v1.20.2 built from Debian bookworm's own `kubernetes`
#    source package (which vendors every dependency, so it builds offline): the
#    five Go commands in one `make`, a static `pause` from the same tree, and etcd
#    from Debian's `etcd-server`, cached in ~/.cache/balancer/envtest/v1.20.2
#    (override with BALANCER_ENVTEST_CACHE) and reused on later runs.
#
# Needs root for apt-get in case 2. Takes 12-20 minutes on 2 cores the first time.
set -euo pipefail

log() { echo "control-plane: $*" >&2; }

plane=(kube-apiserver etcd)
node=(kube-controller-manager kube-scheduler kubelet kube-proxy pause)
holds() { # DIR NAME...: every NAME is an executable in DIR
  local dir="$1" name
  shift
  for name in "$@"; do [ -x "$dir/$name" ] || return 1; done
}
wanted=("${plane[@]}")
[ "${1:-}" = "--node" ] && wanted+=("${node[@]}")

if [ -n "${KUBEBUILDER_ASSETS:-}" ] && holds "$KUBEBUILDER_ASSETS" "${wanted[@]}"; then
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

version=v1.20.2
cache="${BALANCER_ENVTEST_CACHE:-${HOME:-/tmp}/.cache/balancer/envtest/$version}"
if holds "$cache" "${plane[@]}" "${node[@]}"; then
  echo "$cache"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export DEBIAN_FRONTEND=noninteractive

log "installing the Go toolchain and build tools from Debian"
apt-get install -y -qq --no-install-recommends golang-go rsync make dpkg-dev gcc libc6-dev \
  golang-github-modern-go-reflect2-dev >/dev/null

# Source packages through a private list derived from the system's own
# sources, so the machine's apt configuration stays untouched.
log "fetching the kubernetes and etcd-server packages"
mkdir -p "$work/sources.list.d" "$work/lists/partial"
for f in /etc/apt/sources.list.d/*.sources; do
  sed 's/^Types: deb$/Types: deb-src/' "$f" > "$work/sources.list.d/$(basename "$f")"
done
apt_src=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/sources.list.d" -o "Dir::State::Lists=$work/lists")
apt-get "${apt_src[@]}" update -qq >/dev/null
(cd "$work" && apt-get "${apt_src[@]}" source --download-only kubernetes >/dev/null)
(cd "$work" && dpkg-source -x --no-check kubernetes_*.dsc src >/dev/null)
(cd "$work" && apt-get download etcd-server >/dev/null && dpkg -x etcd-server_*.deb etcd)

# The vendored modern-go/reflect2 1.0.1 breaks on Go >= 1.18; Debian's 1.0.2 works.
rm -rf "$work/src/vendor/github.com/modern-go/reflect2"
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$work/src/vendor/github.com/modern-go/reflect2"

commands=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
log "building ${commands[*]} $version in one make (10-20 minutes)"
(cd "$work/src" && GOPROXY=off GOFLAGS= CGO_ENABLED=0 GO111MODULE=on \
  make WHAT="${commands[*]/#/cmd/}" \
  KUBE_GIT_VERSION="$version" KUBE_GIT_TREE_STATE=clean >"$work/build.log" 2>&1) || {
  tail -40 "$work/build.log" >&2
  exit 1
}
log "building the static pause binary"
gcc -Os -static -DVERSION=v3.4.1 -o "$work/pause" "$work/src/build/pause/linux/pause.c"

# Staged beside the cache, then renamed into place: a binary still running from an
# earlier build is replaced without "Text file busy".
mkdir -p "$cache/.staging"
for command in "${commands[@]}"; do cp "$work/src/_output/bin/$command" "$cache/.staging/"; done
cp "$work/pause" "$work/etcd/usr/bin/etcd" "$cache/.staging/"
for file in "$cache/.staging"/*; do mv -f "$file" "$cache/"; done
rmdir "$cache/.staging"
log "ready in $cache"
echo "$cache"

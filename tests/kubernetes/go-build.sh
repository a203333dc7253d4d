# shellcheck shell=bash
# Sourced by build.sh, cert-manager.sh and prometheus.sh, which build commands from the Go
# module proxy into a cache outside the clone. They set `script` (their name, for messages),
# `cache` (the directory), `cached_only` (true for --cached; `cached_flag` sets it for a script
# with no other argument) and define `holds` (whether the cache has the whole build) before
# calling these.
# shellcheck disable=SC2154 # script, cache and stamp are the sourcing script's, as said above

# Sets `cached_only` from the one optional argument, `--cached`, of a script without others.
cached_flag() {
  cached_only=false
  case "${1:-}" in
    --cached) cached_only=true ;;
    "") ;;
    *) echo "usage: $script [--cached]" >&2; exit 2 ;;
  esac
}

# Prints the cache and exits when it already has the build; with --cached, fails when not.
use_cache_if_built() {
  if holds; then
    echo "$cache"
    exit 0
  fi
  if $cached_only; then
    echo "$script: not built yet in $cache" >&2
    exit 1
  fi
}

# Checks for Go, and makes `work`, a scratch directory removed on exit, with `work/out` for
# what is built. Builds are static and resolve modules from the proxy.
start_go_build() {
  command -v go >/dev/null || { echo "$script: needs Go (1.26 or newer) on the PATH" >&2; exit 1; }
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  export CGO_ENABLED=0 GOFLAGS=-mod=mod
  mkdir -p "$work/out"
}

# Makes `work/NAME` a throwaway module `balancer.test/NAME` and the current directory: a
# wrapper that requires what is to be built.
wrapper_module() {
  mkdir "$work/$1"
  cd "$work/$1" || exit 1
  go mod init "balancer.test/$1" >/dev/null 2>&1
}

# `go get`, quiet when it works; when it fails, once more with its error shown.
go_get() {
  go get "$@" >/dev/null 2>&1 || go get "$@"
}

# Puts `work/out` in place as the cache, stamped with `stamp`: staged beside it, then renamed,
# so that an interrupted run never leaves a half-copied cache that `holds`.
install_cache() {
  rm -rf "$cache.staging"
  mkdir -p "$(dirname "$cache")"
  cp -r "$work/out" "$cache.staging"
  rm -rf "$cache"
  mv "$cache.staging" "$cache"
  echo "$stamp" >"$cache/.stamp"
}

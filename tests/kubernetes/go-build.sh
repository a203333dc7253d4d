# Sourced by build.sh and cert-manager.sh, which build commands from the Go module proxy into
# a cache outside the clone. They set `script` (their name, for messages), `cache` (the
# directory), `cached_only` (true for --cached) and define `holds` (whether the cache has the
# whole build) before calling these.

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
  cd "$work/$1"
  go mod init "balancer.test/$1" >/dev/null 2>&1
}

# `go get`, quiet when it works; when it fails, once more with its error shown.
go_get() {
  go get "$@" >/dev/null 2>&1 || go get "$@"
}

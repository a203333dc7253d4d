#!/usr/bin/env bash
# Builds what the node suite installs cert-manager with, from the Go module proxy, and prints
# the directory that holds it. Cached by version outside the clone, so a warm run builds
# nothing.
#
#   cert-manager.sh [--cached]
#
# - helm: Helm v4.3.1 (helm.sh/helm/v4/cmd/helm), its version stamped;
# - controller, cainjector, webhook: cert-manager v1.11.5's commands, static. From v1.12 on
#   they are modules of their own that import the root module's internal packages, which the
#   module proxy cannot serve; up to v1.11 they are packages of the root module;
# - chart/: cert-manager's own chart from the same module zip, made installable as its release
#   tooling makes it: Chart.yaml from Chart.template.yaml with the version set, and the CRDs
#   (plain files under deploy/crds, with Helm directives in their labels) as a template behind
#   the chart's `installCRDs` value. Nothing of it is copied into this repository.
#
# --cached only prints the directory if it is already built, and fails otherwise.
# Cache: ~/.cache/balancer/cert-manager/CERT_MANAGER_VERSION (BALANCER_CERT_MANAGER_CACHE
# overrides the parent), stamped with both versions. Cold on 2 cores: about 5 minutes.
set -euo pipefail
# shellcheck source=tests/kubernetes/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build.sh"
script=cert-manager.sh

cert_manager_version=v1.11.5
helm_version=v4.3.1
cached_flag "$@"

log() { echo "cert-manager $cert_manager_version: $*" >&2; }

commands=(controller cainjector webhook)
cache="${BALANCER_CERT_MANAGER_CACHE:-${HOME:-/tmp}/.cache/balancer/cert-manager}/$cert_manager_version"
stamp="cert-manager $cert_manager_version helm $helm_version"
holds() {
  local name
  [ "$(cat "$cache/.stamp" 2>/dev/null)" = "$stamp" ] || return 1
  for name in helm "${commands[@]}"; do [ -x "$cache/$name" ] || return 1; done
  [ -s "$cache/chart/Chart.yaml" ] && [ -s "$cache/chart/templates/crds.yaml" ]
}
use_cache_if_built
start_go_build

log "building helm $helm_version"
wrapper_module helm
go_get "helm.sh/helm/v4/cmd/helm@$helm_version"
go build -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version" \
  -o "$work/out/helm" helm.sh/helm/v4/cmd/helm

log "building ${commands[*]}"
wrapper_module cert-manager
module=github.com/cert-manager/cert-manager
packages=("${commands[@]/#/$module/cmd/}")
go_get "${packages[@]/%/@$cert_manager_version}"
go build -trimpath -ldflags "-s -w -X $module/pkg/util.AppVersion=$cert_manager_version" \
  -o "$work/out/" "${packages[@]}"

log "preparing its chart"
source_dir="$(go list -m -f '{{.Dir}}' "$module")"
cp -r "$source_dir/deploy/charts/cert-manager" "$work/out/chart"
chmod -R u+w "$work/out/chart"
sed -e "s/^version: v0\.1\.0$/version: $cert_manager_version/" \
  -e "s/^appVersion: v0\.1\.0$/appVersion: $cert_manager_version/" \
  -e 's/{{IS_PRERELEASE}}/false/' \
  "$work/out/chart/Chart.template.yaml" >"$work/out/chart/Chart.yaml"
rm "$work/out/chart/Chart.template.yaml" "$work/out/chart/README.template.md"
{
  echo '{{- if .Values.installCRDs }}'
  for crd in "$source_dir"/deploy/crds/crd-*.yaml; do
    echo '---'
    cat "$crd"
  done
  echo '{{- end }}'
} >"$work/out/chart/templates/crds.yaml"
# images.sh tags the images with appVersion, which the node suite installs the chart with.
if ! grep -q "^version: $cert_manager_version$" "$work/out/chart/Chart.yaml" ||
  ! grep -q "^appVersion: $cert_manager_version$" "$work/out/chart/Chart.yaml"; then
  echo "cert-manager.sh: Chart.template.yaml has no version or appVersion line to set" >&2
  exit 1
fi

install_cache
log "ready in $cache"
echo "$cache"

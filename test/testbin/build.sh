#!/usr/bin/env bash
# Builds the control-plane binaries that the tests run (kube-apiserver and etcd) from the
# Go module proxy and caches them outside the repository, keyed by version. A second run
# finds them and builds nothing. Prints the directory that holds them on its last line.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
CACHE="${FLOTILLA_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flotilla/testbin}"
OUT="$CACHE/kubernetes-$K8S_VERSION"

log() { printf 'testbin: %s\n' "$*" >&2; }

if [[ -x "$OUT/kube-apiserver" && -x "$OUT/etcd" ]]; then
  log "using cached kube-apiserver and etcd for $K8S_VERSION in $OUT"
  echo "$OUT"
  exit 0
fi

staging_version="v0.${K8S_VERSION#v1.}"
major=1
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT"

log "resolving k8s.io/kubernetes@$K8S_VERSION from the module proxy"
gomod="$(cd "$work" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
[[ -f "$gomod" ]] || { log "could not download go.mod of k8s.io/kubernetes@$K8S_VERSION"; exit 1; }

# Kubernetes replaces each staging module with a relative path; the published copies
# carry the v0.<minor>.<patch> version instead.
mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9.-]*\) => ./staging/.*#\1#p' "$gomod" | sort -u)
etcd_version="$(sed -n 's#^[[:space:]]*go.etcd.io/etcd/server/v3 \(v[^ ]*\).*#\1#p' "$gomod" | head -n1)"
[[ ${#staging[@]} -gt 0 ]] || { log "no staging modules found in $gomod"; exit 1; }
[[ -n "$etcd_version" ]] || { log "no go.etcd.io/etcd/server/v3 pin in $gomod"; exit 1; }

{
  echo "module flotilla.dev/testbin"
  echo
  echo "go 1.26"
  echo
  echo "require ("
  echo "  k8s.io/kubernetes $K8S_VERSION"
  echo "  go.etcd.io/etcd/server/v3 $etcd_version"
  echo ")"
  echo
  for m in "${staging[@]}"; do echo "replace $m => $m $staging_version"; done
} >"$work/go.mod"
cat >"$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
GO

cd "$work"
log "resolving dependencies (${#staging[@]} staging modules at $staging_version, etcd $etcd_version)"
GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>"$work/tidy.log" || { cat "$work/tidy.log" >&2; exit 1; }

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
log "building etcd $etcd_version (a few minutes cold)"
go build -trimpath -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3
mv "$OUT/etcd.tmp" "$OUT/etcd"
log "building kube-apiserver $K8S_VERSION (about 11 minutes cold on 2 cores)"
go build -trimpath -ldflags "$ldflags" -o "$OUT/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
mv "$OUT/kube-apiserver.tmp" "$OUT/kube-apiserver"
log "done: $("$OUT/kube-apiserver" --version), etcd $etcd_version"
echo "$OUT"

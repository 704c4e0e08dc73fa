#!/usr/bin/env bash
# Builds kubectl (k8s.io/kubernetes/cmd/kubectl) at the Kubernetes release of the test control
# planes (build.sh's K8S_VERSION), for the tests that run a README's kubectl commands as a user
# would (test/install), and caches it beside that release's kube-apiserver and etcd, which it
# leaves alone. A second run finds it and builds nothing. Prints the directory that holds it on
# its last line.
#
# The module is built.sh's, with the same flags: the packages kubectl shares with
# kube-apiserver come from the build cache when the control plane was built before (about a
# minute then; a few minutes cold on 2 cores).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
CACHE="${FLOTILLA_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flotilla/testbin}"
OUT="$CACHE/kubernetes-$K8S_VERSION"

log() { printf 'testbin: %s\n' "$*" >&2; }

if [[ -x "$OUT/kubectl" ]]; then
  log "using cached kubectl $K8S_VERSION in $OUT"
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
mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9.-]*\) => ./staging/.*#\1#p' "$gomod" | sort -u)
[[ ${#staging[@]} -gt 0 ]] || { log "no staging modules found in $gomod"; exit 1; }

{
  echo "module flotilla.dev/testbin"
  echo
  echo "go 1.26"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  for m in "${staging[@]}"; do echo "replace $m => $m $staging_version"; done
} >"$work/go.mod"
cat >"$work/tools.go" <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kubectl"
GO

cd "$work"
log "resolving dependencies (${#staging[@]} staging modules at $staging_version)"
GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>"$work/tidy.log" || { cat "$work/tidy.log" >&2; exit 1; }

# kubectl reports the same version variables as the server (component-base/version).
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
log "building kubectl $K8S_VERSION"
go build -trimpath -ldflags "$ldflags" -o "$OUT/kubectl.tmp" k8s.io/kubernetes/cmd/kubectl
mv "$OUT/kubectl.tmp" "$OUT/kubectl"
log "done: $("$OUT/kubectl" version --client | head -n1)"
echo "$OUT"

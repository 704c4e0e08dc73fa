#!/usr/bin/env bash
# Builds the helm command line (helm.sh/helm/v4/cmd/helm) at the version the project's go.mod
# requires, for the tests that run a README's helm commands as a user would (test/install), and
# caches it outside the repository beside kube-apiserver (see build.sh). A second run finds it
# and builds nothing. Prints the directory that holds it on its last line.
#
# The command does not build inside the project's module: it needs modules the project's
# go.sum does not list (plugin installers). It is built in a throwaway module that starts from
# the project's own requirements, so that every module the two share is at the project's
# version and the packages the tests already compiled are reused from the build cache (about a
# minute warm, three or four cold on 2 cores).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
module=helm.sh/helm/v4
version="$(sed -n "s#^[[:space:]]*${module//./\\.} \(v[^ ]*\).*#\1#p" "$root/go.mod" | head -n1)"
CACHE="${FLOTILLA_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flotilla/testbin}"

log() { printf 'testbin: %s\n' "$*" >&2; }

[[ -n "$version" ]] || { log "no $module requirement in $root/go.mod"; exit 1; }
OUT="$CACHE/helm-$version"

if [[ -x "$OUT/helm" ]]; then
  log "using cached helm $version in $OUT"
  echo "$OUT"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT"

# The project's requirements under another module path; its replace directives, if it ever has
# any, would name paths relative to the repository, so none are carried over.
sed -e 's#^module .*#module flotilla.dev/testbin/helm#' -e '/^replace /d' "$root/go.mod" >"$work/go.mod"
cat >"$work/tools.go" <<'GO'
//go:build tools

package tools

import _ "helm.sh/helm/v4/cmd/helm"
GO

cd "$work"
log "resolving helm $version's dependencies beside the project's"
GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>"$work/tidy.log" || { cat "$work/tidy.log" >&2; exit 1; }
got="$(go list -m -f '{{.Version}}' "$module")"
[[ "$got" == "$version" ]] || { log "resolved $module $got, not the $version go.mod requires"; exit 1; }

# Helm reports internal/version.version; without it, `helm version` says v4.3.
ldflags="-X $module/internal/version.version=$version -X $module/internal/version.gitTreeState=clean"
log "building helm $version"
go build -ldflags "$ldflags" -o "$OUT/helm.tmp" "$module/cmd/helm"
mv "$OUT/helm.tmp" "$OUT/helm"
log "done: $("$OUT/helm" version --short)"
echo "$OUT"

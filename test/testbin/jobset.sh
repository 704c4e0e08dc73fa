#!/usr/bin/env bash
# Builds JobSet's manager (the main package at the root of sigs.k8s.io/jobset), which the tests
# run behind the JobSet chart's Deployment, from the Go module proxy and caches it outside the
# repository beside kube-apiserver and kueue (see build.sh, kueue.sh), keyed by version. A second
# run finds it and builds nothing. Prints the directory that holds the binary on its last line.
#
# The version is the one the project's go.mod requires, so that one bump moves the Go types the
# tests compile against, the chart `make generate` packages and the manager they run. The build
# happens in a throwaway module: in a module of its own JobSet keeps the k8s.io versions it was
# released with.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
JOBSET_VERSION="${JOBSET_VERSION:-$(sed -n 's#^[[:space:]]*sigs.k8s.io/jobset \(v[^ ]*\).*#\1#p' "$root/go.mod" | head -n1)}"
CACHE="${FLOTILLA_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flotilla/testbin}"

log() { printf 'testbin: %s\n' "$*" >&2; }

[[ -n "$JOBSET_VERSION" ]] || { log "no sigs.k8s.io/jobset requirement in $root/go.mod"; exit 1; }
OUT="$CACHE/jobset-$JOBSET_VERSION"

if [[ -x "$OUT/jobset" ]]; then
  log "using cached jobset $JOBSET_VERSION in $OUT"
  echo "$OUT"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT"

log "resolving sigs.k8s.io/jobset@$JOBSET_VERSION from the module proxy"
info="$(cd "$work" && go mod download -json "sigs.k8s.io/jobset@$JOBSET_VERSION")"
gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' <<<"$info")"
[[ -f "$gomod" ]] || { log "could not download go.mod of sigs.k8s.io/jobset@$JOBSET_VERSION"; exit 1; }
# A module's replace directives do not apply when it is a dependency: a JobSet release that
# needs one would build here with other code than it was released with.
if grep -q '^[[:space:]]*replace\b\|=>' "$gomod"; then
  log "sigs.k8s.io/jobset@$JOBSET_VERSION has replace directives; this script does not carry them over"
  exit 1
fi
# The commit the proxy records for the tag, when it records one, so that the manager logs it.
commit="$(sed -n 's/^[[:space:]]*"Hash": "\([0-9a-f]*\)",\{0,1\}$/\1/p' <<<"$info" | head -n1)"

{
  echo "module flotilla.dev/testbin/jobset"
  echo
  echo "go 1.26"
  echo
  echo "require sigs.k8s.io/jobset $JOBSET_VERSION"
} >"$work/go.mod"
# The manager is the module's root package (main.go at the top of sigs.k8s.io/jobset).
cat >"$work/tools.go" <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/jobset"
GO

cd "$work"
log "resolving dependencies"
GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>"$work/tidy.log" || { cat "$work/tidy.log" >&2; exit 1; }

ldflags="-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$JOBSET_VERSION"
[[ -z "$commit" ]] || ldflags+=" -X sigs.k8s.io/jobset/pkg/version.GitCommit=$commit"
log "building jobset $JOBSET_VERSION (about 4 minutes cold on 2 cores)"
go build -trimpath -ldflags "$ldflags" -o "$OUT/jobset.tmp" sigs.k8s.io/jobset
mv "$OUT/jobset.tmp" "$OUT/jobset"
log "done: jobset $JOBSET_VERSION in $OUT"
echo "$OUT"

#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue/cmd/kueue), which the tests run against their
# control planes, from the Go module proxy and caches it outside the repository beside
# kube-apiserver (see build.sh), keyed by version. A second run finds it and builds nothing.
# Prints the directory that holds the binary on its last line.
#
# The version is the one the project's go.mod requires, so that one bump moves the Go types the
# tests compile against and the manager they run. The build happens in a throwaway module:
# Kueue's controllers do not compile against the project's newer k8s.io modules, and in a module
# of its own Kueue keeps the versions it was released with.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KUEUE_VERSION="${KUEUE_VERSION:-$(sed -n 's#^[[:space:]]*sigs.k8s.io/kueue \(v[^ ]*\).*#\1#p' "$root/go.mod" | head -n1)}"
CACHE="${FLOTILLA_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flotilla/testbin}"

log() { printf 'testbin: %s\n' "$*" >&2; }

[[ -n "$KUEUE_VERSION" ]] || { log "no sigs.k8s.io/kueue requirement in $root/go.mod"; exit 1; }
OUT="$CACHE/kueue-$KUEUE_VERSION"

if [[ -x "$OUT/kueue" ]]; then
  log "using cached kueue $KUEUE_VERSION in $OUT"
  echo "$OUT"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT"

log "resolving sigs.k8s.io/kueue@$KUEUE_VERSION from the module proxy"
info="$(cd "$work" && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION")"
gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' <<<"$info")"
[[ -f "$gomod" ]] || { log "could not download go.mod of sigs.k8s.io/kueue@$KUEUE_VERSION"; exit 1; }
# A module's replace directives do not apply when it is a dependency: a Kueue release that
# needs one would build here with other code than it was released with.
if grep -q '^[[:space:]]*replace\b\|=>' "$gomod"; then
  log "sigs.k8s.io/kueue@$KUEUE_VERSION has replace directives; this script does not carry them over"
  exit 1
fi
# The commit the proxy records for the tag, when it records one, so that the manager logs it.
commit="$(sed -n 's/^[[:space:]]*"Hash": "\([0-9a-f]*\)",\{0,1\}$/\1/p' <<<"$info" | head -n1)"

{
  echo "module flotilla.dev/testbin/kueue"
  echo
  echo "go 1.26"
  echo
  echo "require sigs.k8s.io/kueue $KUEUE_VERSION"
} >"$work/go.mod"
cat >"$work/tools.go" <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
GO

cd "$work"
log "resolving dependencies"
GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>"$work/tidy.log" || { cat "$work/tidy.log" >&2; exit 1; }

ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
[[ -z "$commit" ]] || ldflags+=" -X sigs.k8s.io/kueue/pkg/version.GitCommit=$commit"
log "building kueue $KUEUE_VERSION (about 6 minutes cold on 2 cores)"
go build -trimpath -ldflags "$ldflags" -o "$OUT/kueue.tmp" sigs.k8s.io/kueue/cmd/kueue
mv "$OUT/kueue.tmp" "$OUT/kueue"
log "done: kueue $KUEUE_VERSION in $OUT"
echo "$OUT"

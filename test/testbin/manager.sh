#!/usr/bin/env bash
# Builds the manager of a Kubernetes controller that the tests run against their control
# planes, from the Go module proxy, and caches it outside the repository beside kube-apiserver
# (see build.sh), keyed by name and version. A second run finds it and builds nothing. Prints
# the directory that holds the binary on its last line.
#
#   manager.sh NAME MODULE PACKAGE     e.g. manager.sh kueue sigs.k8s.io/kueue sigs.k8s.io/kueue/cmd/kueue
#
# The version is the one the project's go.mod requires, so that one bump moves the Go types the
# tests compile against and the manager they run. The build happens in a throwaway module: the
# managers do not compile against the project's newer k8s.io modules, and in a module of its own
# each keeps the versions it was released with. kueue.sh and jobset.sh call this.
set -euo pipefail

[[ $# -eq 3 ]] || { echo "usage: $0 NAME MODULE PACKAGE" >&2; exit 2; }
name="$1" module="$2" pkg="$3"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
version="$(sed -n "s#^[[:space:]]*${module//./\\.} \(v[^ ]*\).*#\1#p" "$root/go.mod" | head -n1)"
CACHE="${FLOTILLA_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flotilla/testbin}"

log() { printf 'testbin: %s\n' "$*" >&2; }

[[ -n "$version" ]] || { log "no $module requirement in $root/go.mod"; exit 1; }
OUT="$CACHE/$name-$version"

if [[ -x "$OUT/$name" ]]; then
  log "using cached $name $version in $OUT"
  echo "$OUT"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT"

log "resolving $module@$version from the module proxy"
info="$(cd "$work" && go mod download -json "$module@$version")"
gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' <<<"$info")"
[[ -f "$gomod" ]] || { log "could not download go.mod of $module@$version"; exit 1; }
# A module's replace directives do not apply when it is a dependency: a release that needs one
# would build here with other code than it was released with.
if grep -q '^[[:space:]]*replace\b\|=>' "$gomod"; then
  log "$module@$version has replace directives; this script does not carry them over"
  exit 1
fi
# The commit the proxy records for the tag, when it records one, so that the manager logs it.
commit="$(sed -n 's/^[[:space:]]*"Hash": "\([0-9a-f]*\)",\{0,1\}$/\1/p' <<<"$info" | head -n1)"

{
  echo "module flotilla.dev/testbin/$name"
  echo
  echo "go 1.26"
  echo
  echo "require $module $version"
} >"$work/go.mod"
cat >"$work/tools.go" <<GO
//go:build tools

package tools

import _ "$pkg"
GO

cd "$work"
log "resolving dependencies"
GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>"$work/tidy.log" || { cat "$work/tidy.log" >&2; exit 1; }

# Both Kueue and JobSet keep their version in pkg/version.
ldflags="-s -w -X $module/pkg/version.GitVersion=$version"
[[ -z "$commit" ]] || ldflags+=" -X $module/pkg/version.GitCommit=$commit"
log "building $name $version (minutes, cold on 2 cores)"
go build -trimpath -ldflags "$ldflags" -o "$OUT/$name.tmp" "$pkg"
mv "$OUT/$name.tmp" "$OUT/$name"
log "done: $name $version in $OUT"
echo "$OUT"

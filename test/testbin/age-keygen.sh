#!/usr/bin/env bash
# Builds age-keygen (filippo.io/age/cmd/age-keygen) at the version of filippo.io/age the
# project's go.mod requires, for the tests that run a README's commands as a user would
# (test/install), and caches it outside the repository beside kube-apiserver (see build.sh).
# It builds inside the project's module in seconds. Prints the directory that holds it on its
# last line.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
module=filippo.io/age
version="$(sed -n "s#^[[:space:]]*${module//./\\.} \(v[^ ]*\).*#\1#p" "$root/go.mod" | head -n1)"
CACHE="${FLOTILLA_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flotilla/testbin}"

log() { printf 'testbin: %s\n' "$*" >&2; }

[[ -n "$version" ]] || { log "no $module requirement in $root/go.mod"; exit 1; }
OUT="$CACHE/age-$version"

if [[ -x "$OUT/age-keygen" ]]; then
  log "using cached age-keygen $version in $OUT"
  echo "$OUT"
  exit 0
fi
mkdir -p "$OUT"
log "building age-keygen $version"
# age reports the module's version from the build information when its main package is
# built from the module cache, as here.
(cd "$root" && go build -o "$OUT/age-keygen.tmp" "$module/cmd/age-keygen")
mv "$OUT/age-keygen.tmp" "$OUT/age-keygen"
log "done: age-keygen $("$OUT/age-keygen" --version)"
echo "$OUT"

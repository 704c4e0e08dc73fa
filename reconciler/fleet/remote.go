package fleet

import (
	"strings"
	"unicode"
)

// remoteReason says why kustomize could read ref as something other than a path in its
// file system, or "" when it cannot.
//
// Kustomize decides from the string alone, before it looks at any file, and a local
// directory of the same name does not change its mind:
//
//   - its loader fetches a resource, patch or replacement file over HTTP when url.Parse
//     finds the scheme http or https (api/internal/loader.IsRemoteFile), and
//   - it clones a resource or component with the git program into a new kustomize-*
//     temporary directory when git.NewRepoSpecFromURL accepts ref
//     (api/internal/git/repospec.go): an optional, case-insensitive git:: prefix, then
//     the scheme ssh://, https://, http:// or file://, or else a user@ (scp-like
//     user@host:path) or a path starting with github.com/ or github.com:, and any of
//     ?ref=, ?version=, ?timeout=, ?submodules= after it.
//
// A URL scheme needs a colon, a git user an @, and the only form with neither starts
// with github.com/. Refusing those three is therefore enough for both; the rest of what
// is refused here (a query, "//", which kustomize reads as the boundary between a
// repository and a directory in it, backslashes, control characters, github.com
// anywhere in the path) is a margin against a future kustomize that reads more forms,
// at no cost to a fleet, whose paths need none of them.
func remoteReason(ref string) string {
	switch {
	case strings.IndexFunc(ref, unicode.IsControl) >= 0:
		return "it contains control characters"
	case strings.Contains(ref, ":"):
		return "kustomize reads a colon as a URL scheme (https:, ssh:, file:, git::) or a git host (host:path) and would fetch or clone it"
	case strings.Contains(ref, "@"):
		return "kustomize reads user@host as a git repository, and would clone it"
	case hasGitHubSegment(ref):
		return "kustomize reads a path starting with github.com/ as a GitHub repository, and would clone it"
	case strings.Contains(ref, "?"):
		return "kustomize reads a query such as ?ref=, ?version= or ?timeout= as the version of a git repository"
	case strings.Contains(ref, "//"):
		return "kustomize reads // as the boundary between a git repository and a directory in it"
	case strings.Contains(ref, `\`):
		return "a backslash is no path separator in a fleet repository"
	}
	return ""
}

// hasGitHubSegment reports whether a segment of ref is github.com in any case: kustomize
// lower-cases ref before it compares.
func hasGitHubSegment(ref string) bool {
	for seg := range strings.SplitSeq(ref, "/") {
		if strings.EqualFold(seg, "github.com") || strings.ToLower(seg) == "github.com" {
			return true
		}
	}
	return false
}

package main

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
)

// gitIgnore tells which paths of a checkout git leaves out, by the checkout's
// .git/info/exclude and .gitignore files, as go-git's gitignore.ReadPatterns reads
// them. Only the top directory's are read at first; a walk of the checkout from the top
// reads each directory's own when it enters it (walked), before it asks about what the
// directory holds. Reading them all beforehand walked the checkout once more: a third
// of what `flotilla validate` took on a fleet of 10,000 clusters.
type gitIgnore struct {
	dir      string
	patterns []gitignore.Pattern
}

// readGitIgnore reads the patterns of the checkout dir's top directory.
func readGitIgnore(dir string) *gitIgnore {
	g := &gitIgnore{dir: dir}
	g.read(nil, filepath.Join(".git", "info", "exclude"))
	g.enter(nil)
	return g
}

// enter reads the .gitignore of the directory at path, which the walk entered. Its
// patterns come after those read before, so that they weigh more than those of the
// directories above, and apply only below path.
func (g *gitIgnore) enter(path []string) {
	g.read(path, ".gitignore")
}

// read adds the patterns of file in the directory at path. A file that cannot be read
// adds none, as with ReadPatterns: the scan then reads more, not less.
func (g *gitIgnore) read(path []string, file string) {
	data, err := os.ReadFile(filepath.Join(g.dir, filepath.Join(path...), file))
	if err != nil {
		return
	}
	lines := bufio.NewScanner(bytes.NewReader(data))
	for lines.Scan() {
		if s := lines.Text(); !strings.HasPrefix(s, "#") && strings.TrimSpace(s) != "" {
			g.patterns = append(g.patterns, gitignore.ParsePattern(s, path))
		}
	}
}

// walked reports whether git ignores the path p (slash-separated) of a walk from the
// top, which asks it of a directory before what the directory holds; of a directory it
// does not ignore, it reads the .gitignore, as the walk goes into it next.
func (g *gitIgnore) walked(p string, isDir bool) bool {
	elems := strings.Split(p, "/")
	if g.match(elems, isDir) {
		return true
	}
	if isDir {
		g.enter(elems)
	}
	return false
}

// match reports whether git ignores path, once the walk entered every directory above
// it.
func (g *gitIgnore) match(path []string, isDir bool) bool {
	return gitignore.NewMatcher(g.patterns).Match(path, isDir)
}

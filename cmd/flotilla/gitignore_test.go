package main

import (
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// The scan for tokens reads each directory's .gitignore as it walks down into it, and
// leaves out what git itself leaves out: git's own list of the files it would track is
// the reference. The checkout has a .git/info/exclude, patterns for files and for
// directories, a subdirectory's .gitignore that ignores more below it, one that brings
// back what the top one ignores, and one whose patterns stop at its own directory.
func TestTheScanLeavesOutWhatGitIgnores(t *testing.T) {
	dir := t.TempDir()
	// Git reads only the checkout's files: no one's global or system excludes.
	home := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	git("init", "-q")
	fleetgen.WriteInto(t, dir, fstest.MapFS{
		".git/info/exclude":          {Data: []byte("*.secret\n")},
		".gitignore":                 {Data: []byte("# local files\n*.local.yaml\nbuild/\n!keep.local.yaml\n")},
		"build/out.txt":              {},
		"values.gpu-a.local.yaml":    {},
		"keep.local.yaml":            {},
		"clusters/a/cluster.yaml":    {},
		"clusters/a/notes.secret":    {},
		"docs/.gitignore":            {Data: []byte("drafts/\n*.tmp\n!important.tmp\n")},
		"docs/drafts/plan.md":        {},
		"docs/scratch.tmp":           {},
		"docs/important.tmp":         {},
		"docs/runbook.md":            {},
		"docs/sub/.gitignore":        {Data: []byte("!*.local.yaml\n")},
		"docs/sub/values.local.yaml": {},
		"other/.gitignore":           {Data: []byte("*.md\n")},
		"other/readme.md":            {},
		"other/keep.txt":             {},
		"readme.md":                  {},
	})
	want := strings.Fields(git("ls-files", "--others", "--exclude-standard"))
	slices.Sort(want)

	ignored := readGitIgnore(dir)
	var got []string
	err := fs.WalkDir(os.DirFS(dir), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "." {
			return err
		}
		if p == ".git" || ignored.walked(p, d.IsDir()) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if !d.IsDir() {
			got = append(got, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("the scan reads\n  %q\ngit tracks\n  %q", got, want)
	}
}

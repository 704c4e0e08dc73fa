package gitserver_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

// template writes a small fleet-like directory: nested files, an executable script, a
// symlink, a .gitignore that would hide a file, and a .git directory that must be skipped.
func template(t *testing.T) string {
	dir := t.TempDir()
	files := map[string]string{
		"README.md":              "fleet\n",
		"clusters/a/kueue.yaml":  "kind: ClusterQueue\n",
		"clusters/b/jobset.yaml": "kind: JobSet\n",
		"hack/render.sh":         "#!/bin/sh\necho render\n",
		".gitignore":             "*.local\n",
		"settings.local":         "kept although ignored\n",
		".git/HEAD":              "not a repository\n",
	}
	for p, content := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "hack", "render.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("README.md", filepath.Join(dir, "LINK")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// clone clones url into memory and returns the commit at branch.
func clone(t *testing.T, url, branch string) *object.Commit {
	t.Helper()
	repo, err := git.Clone(memory.NewStorage(), nil, &git.CloneOptions{
		URL:           url,
		ReferenceName: plumbing.NewBranchReferenceName(branch),
		SingleBranch:  true,
	})
	if err != nil {
		t.Fatalf("cloning %s at %s: %v", url, branch, err)
	}
	ref, err := repo.Head()
	if err != nil {
		t.Fatal(err)
	}
	c, err := repo.CommitObject(ref.Hash())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tree returns the files of c with their contents and modes.
func tree(t *testing.T, c *object.Commit) map[string]file {
	t.Helper()
	tr, err := c.Tree()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]file{}
	err = tr.Files().ForEach(func(f *object.File) error {
		s, err := f.Contents()
		out[f.Name] = file{s, f.Mode}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type file struct {
	content string
	mode    filemode.FileMode
}

func TestNewRepoHoldsTemplate(t *testing.T) {
	srv := gitserver.Start(t)
	repo := srv.NewRepo(t, "fleet", template(t))

	c := clone(t, repo.URL(), "main")
	if c.Hash.String() != repo.Head("main") {
		t.Errorf("clone is at %s, Head(main) says %s", c.Hash, repo.Head("main"))
	}
	if len(c.ParentHashes) != 0 {
		t.Errorf("first commit has parents %v", c.ParentHashes)
	}
	want := map[string]file{
		"README.md":              {"fleet\n", filemode.Regular},
		"clusters/a/kueue.yaml":  {"kind: ClusterQueue\n", filemode.Regular},
		"clusters/b/jobset.yaml": {"kind: JobSet\n", filemode.Regular},
		"hack/render.sh":         {"#!/bin/sh\necho render\n", filemode.Executable},
		".gitignore":             {"*.local\n", filemode.Regular},
		"settings.local":         {"kept although ignored\n", filemode.Regular},
		"LINK":                   {"README.md", filemode.Symlink},
	}
	assertTree(t, tree(t, c), want)

	// The default branch of the server's repository is main, as a plain clone shows.
	r, err := git.Clone(memory.NewStorage(), nil, &git.CloneOptions{URL: repo.URL()})
	if err != nil {
		t.Fatal(err)
	}
	head, err := r.Head()
	if err != nil {
		t.Fatal(err)
	}
	if head.Name() != plumbing.Main {
		t.Errorf("default branch is %s, want main", head.Name())
	}
}

func TestCommitBranchMerge(t *testing.T) {
	srv := gitserver.Start(t)
	repo := srv.NewRepo(t, "org/fleet", template(t))
	initial := repo.Head("main")

	// A commit on a branch that does not exist yet starts it from main.
	feature := repo.Commit("feature", "add cluster c, drop b", map[string][]byte{
		"clusters/c/kueue.yaml":  []byte("kind: LocalQueue\n"),
		"clusters/b/jobset.yaml": nil,
		"hack/render.sh":         []byte("#!/bin/sh\necho render v2\n"),
	})
	fc := clone(t, repo.URL(), "feature")
	if fc.Hash.String() != feature || len(fc.ParentHashes) != 1 || fc.ParentHashes[0].String() != initial {
		t.Fatalf("feature is %s with parents %v, want %s on top of %s", fc.Hash, fc.ParentHashes, feature, initial)
	}
	ft := tree(t, fc)
	if _, ok := ft["clusters/b/jobset.yaml"]; ok {
		t.Error("deleted file clusters/b/jobset.yaml is still on feature")
	}
	if got := ft["hack/render.sh"]; got != (file{"#!/bin/sh\necho render v2\n", filemode.Executable}) {
		t.Errorf("rewritten script: got %+v, want new content and still executable", got)
	}
	if got := ft["clusters/c/kueue.yaml"]; got.content != "kind: LocalQueue\n" {
		t.Errorf("added file: got %+v", got)
	}

	// Meanwhile main moves on, on a file the feature does not touch.
	branchPoint := repo.Branch("main", "release")
	if branchPoint != initial {
		t.Errorf("Branch returned %s, want main's head %s", branchPoint, initial)
	}
	mainTip := repo.Commit("main", "touch readme", map[string][]byte{"README.md": []byte("fleet v2\n")})
	if repo.Head("release") != initial {
		t.Errorf("release moved with main")
	}

	merge := repo.Merge("main", "feature", "Merge feature")
	mc := clone(t, repo.URL(), "main")
	if mc.Hash.String() != merge || repo.Head("main") != merge {
		t.Fatalf("main is at %s, want the merge %s", mc.Hash, merge)
	}
	if len(mc.ParentHashes) != 2 || mc.ParentHashes[0].String() != mainTip || mc.ParentHashes[1].String() != feature {
		t.Fatalf("merge parents are %v, want [%s %s]", mc.ParentHashes, mainTip, feature)
	}
	if mc.Message != "Merge feature" {
		t.Errorf("merge message %q", mc.Message)
	}
	if !mc.Committer.When.After(fc.Committer.When) || !fc.Committer.When.After(clone(t, repo.URL(), "release").Committer.When) {
		t.Errorf("commit times are not increasing")
	}
	mt := tree(t, mc)
	want := map[string]file{
		"README.md":             {"fleet v2\n", filemode.Regular},
		"clusters/a/kueue.yaml": {"kind: ClusterQueue\n", filemode.Regular},
		"clusters/c/kueue.yaml": {"kind: LocalQueue\n", filemode.Regular},
		"hack/render.sh":        {"#!/bin/sh\necho render v2\n", filemode.Executable},
		".gitignore":            {"*.local\n", filemode.Regular},
		"settings.local":        {"kept although ignored\n", filemode.Regular},
		"LINK":                  {"README.md", filemode.Symlink},
	}
	assertTree(t, mt, want)

	// The real git binary sees the branches over HTTP too.
	out, err := exec.CommandContext(t.Context(), "git", "ls-remote", repo.URL()).CombinedOutput()
	if err != nil {
		t.Fatalf("git ls-remote: %v: %s", err, out)
	}
	for ref, sha := range map[string]string{
		"HEAD":               merge,
		"refs/heads/main":    merge,
		"refs/heads/feature": feature,
		"refs/heads/release": initial,
	} {
		if !strings.Contains(string(out), sha+"\t"+ref+"\n") {
			t.Errorf("git ls-remote does not show %s at %s:\n%s", ref, sha, out)
		}
	}
}

// Two repositories made by the same steps have the same hashes: the clock is per repository
// and fixed, so tests can compare runs.
func TestHashesAreDeterministic(t *testing.T) {
	srv := gitserver.Start(t)
	dir := template(t)
	var heads []string
	for _, name := range []string{"one", "two"} {
		r := srv.NewRepo(t, name, dir)
		r.Commit("main", "change", map[string][]byte{"x": []byte("x\n")})
		heads = append(heads, r.Head("main"))
	}
	if heads[0] != heads[1] {
		t.Errorf("heads differ: %v", heads)
	}
}

func TestCommitBuildsOnOthersPushes(t *testing.T) {
	srv := gitserver.Start(t)
	repo := srv.NewRepo(t, "fleet", "")
	first := repo.Commit("main", "first", map[string][]byte{"a": []byte("a\n")})

	// Someone else (the code under test) pushes to main through its own clone.
	work := t.TempDir()
	for _, args := range [][]string{
		{"clone", "-q", repo.URL(), work},
		{"-C", work, "-c", "user.name=other", "-c", "user.email=other@example.com", "commit", "-q", "--allow-empty", "-m", "other"},
		{"-C", work, "push", "-q", "origin", "main"},
	} {
		if out, err := exec.CommandContext(t.Context(), "git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	other := repo.Head("main")
	if other == first {
		t.Fatal("the other push did not land")
	}
	next := repo.Commit("main", "next", map[string][]byte{"a": nil})
	c := clone(t, repo.URL(), "main")
	if c.Hash.String() != next || c.ParentHashes[0].String() != other {
		t.Errorf("main is %s with parents %v, want %s on top of %s", c.Hash, c.ParentHashes, next, other)
	}
	if files := tree(t, c); len(files) != 0 {
		t.Errorf("files left after deleting the only one: %v", files)
	}
}

func assertTree(t *testing.T, got, want map[string]file) {
	t.Helper()
	for p, w := range want {
		if g, ok := got[p]; !ok {
			t.Errorf("%s is missing", p)
		} else if g != w {
			t.Errorf("%s: got %q mode %v, want %q mode %v", p, g.content, g.mode, w.content, w.mode)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected file %s", p)
		}
	}
}

// recorder is a testing.TB whose Fatalf records the failure and ends the goroutine, so that a
// test can check that a helper fails.
type recorder struct {
	testing.TB
	failure string
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failure = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run runs f on a goroutine of its own, which Fatalf may end, and returns what f failed with.
func (r *recorder) run(f func()) string {
	r.failure = ""
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
	return r.failure
}

func TestMergeRefusesConflictsAndNoOps(t *testing.T) {
	srv := gitserver.Start(t)
	// The Repo reports through the TB it was made with: the recorder.
	rec := &recorder{TB: t}
	var repo *gitserver.Repo
	if msg := rec.run(func() { repo = srv.NewRepo(rec, "fleet", "") }); msg != "" {
		t.Fatal(msg)
	}
	repo.Commit("main", "base", map[string][]byte{"f": []byte("base\n")})
	repo.Commit("topic", "theirs", map[string][]byte{"f": []byte("theirs\n")})

	if msg := rec.run(func() { repo.Merge("topic", "main", "nothing to merge") }); !strings.Contains(msg, "already contains") {
		t.Errorf("merging an ancestor: got failure %q", msg)
	}

	ours := repo.Commit("main", "ours", map[string][]byte{"f": []byte("ours\n")})
	if msg := rec.run(func() { repo.Merge("main", "topic", "conflict") }); !strings.Contains(msg, "conflicts in f") {
		t.Errorf("conflicting merge: got failure %q", msg)
	}
	if repo.Head("main") != ours {
		t.Error("a failed merge moved main")
	}
	if msg := rec.run(func() { repo.Head("missing") }); !strings.Contains(msg, "no such branch") {
		t.Errorf("Head of a missing branch: got failure %q", msg)
	}
	if msg := rec.run(func() { repo.Commit("main", "escape", map[string][]byte{"../x": nil}) }); !strings.Contains(msg, "invalid path") {
		t.Errorf("committing outside the repository: got failure %q", msg)
	}
	if msg := rec.run(func() { repo.Commit("main", "gone", map[string][]byte{"nope": nil}) }); !strings.Contains(msg, "deleting nope") {
		t.Errorf("deleting a missing file: got failure %q", msg)
	}
	// After failures the Repo still works from the server's state.
	after := repo.Commit("main", "fine", map[string][]byte{"g": []byte("g\n")})
	if c := clone(t, repo.URL(), "main"); c.ParentHashes[0].String() != ours || c.Hash.String() != after {
		t.Errorf("main is %s on %v, want %s on %s", c.Hash, c.ParentHashes, after, ours)
	}
}

func TestFetchTimeCountsFetchesNotPushes(t *testing.T) {
	srv := gitserver.Start(t)
	repo := srv.NewRepo(t, "fleet", "")
	repo.Commit("main", "first", map[string][]byte{"a": []byte("a\n")})
	git := func(args ...string) {
		t.Helper()
		if out, err := exec.CommandContext(t.Context(), "git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	work := filepath.Join(t.TempDir(), "work")
	git("clone", "-q", repo.URL(), work)
	cloned := srv.FetchTime()
	if cloned <= 0 {
		t.Fatalf("FetchTime after a clone: %v", cloned)
	}
	git("-C", work, "-c", "user.name=other", "-c", "user.email=other@example.com", "commit", "-q", "--allow-empty", "-m", "other")
	git("-C", work, "push", "-q", "origin", "main")
	if pushed := srv.FetchTime(); pushed != cloned {
		t.Errorf("a push moved FetchTime from %v to %v", cloned, pushed)
	}
	git("clone", "-q", "--bare", srv.BackendURL(t, "fleet"), filepath.Join(t.TempDir(), "backend"))
	if backend := srv.FetchTime(); backend <= cloned {
		t.Errorf("a clone through BackendURL left FetchTime at %v", backend)
	}
}

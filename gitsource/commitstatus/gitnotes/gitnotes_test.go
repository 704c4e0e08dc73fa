package gitnotes_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitnotes"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/statussuite"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newBackend(t *testing.T, url string) *gitnotes.Backend {
	t.Helper()
	b, err := gitnotes.New(gitnotes.Options{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSuite(t *testing.T) {
	srv := gitserver.Start(t)
	n := 0
	statussuite.Run(t, func(t *testing.T) statussuite.Target {
		n++
		repo := srv.NewRepo(t, fmt.Sprintf("fleet-%d", n), "")
		b := newBackend(t, repo.URL())
		commits := 0
		return statussuite.Target{
			Backend: b,
			NewCommit: func(t *testing.T) string {
				commits++
				return repo.Commit("main", fmt.Sprintf("change %d", commits), map[string][]byte{"f": fmt.Appendf(nil, "%d", commits)})
			},
			Count: func(t *testing.T, commit, context string) int {
				// A fresh reader, so the count is what the repository holds.
				note, err := newBackend(t, repo.URL()).Read(ctxT(t), commit)
				if err != nil {
					t.Fatal(err)
				}
				return note.Statuses[context].Count
			},
		}
	})
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(cmd.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t.invalid", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t.invalid")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestGitReadsTheNotes(t *testing.T) {
	srv := gitserver.Start(t)
	repo := srv.NewRepo(t, "fleet", "")
	c := repo.Commit("main", "add a cluster", map[string][]byte{"clusters/a/cluster.yaml": []byte("name: a\n")})
	p := commitstatus.NewPublisher(newBackend(t, repo.URL()), commitstatus.PublisherOptions{})
	if _, err := p.Publish(ctxT(t), c, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready · 8× H100 80GB on 1 node"}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	git(t, dir, "init", "-q")
	git(t, dir, "fetch", "-q", repo.URL(), "main", "refs/notes/flotilla:refs/notes/flotilla")
	note := git(t, dir, "notes", "--ref", "flotilla", "show", c)
	for _, want := range []string{`"flotilla/a"`, `"state": "success"`, "8× H100 80GB"} {
		if !strings.Contains(note, want) {
			t.Errorf("git notes show prints\n%s\nwithout %s", note, want)
		}
	}
}

// A notes tree that git has fanned out into ab/cdef... directories is read, and
// written back in place, where git looks for it.
func TestFannedOutNotes(t *testing.T) {
	repo, c, dir := repoWithAClone(t)
	note := `{"statuses":{"flotilla/a":{"state":"pending","description":"waiting","updated":"2026-01-01T00:00:00Z","count":1}}}`
	blob := gitIn(t, dir, note, "hash-object", "-w", "--stdin")
	inner := gitIn(t, dir, fmt.Sprintf("100644 blob %s\t%s\n", blob, c[4:]), "mktree")
	mid := gitIn(t, dir, fmt.Sprintf("040000 tree %s\t%s\n", inner, c[2:4]), "mktree")
	root := gitIn(t, dir, fmt.Sprintf("040000 tree %s\t%s\n", mid, c[:2]), "mktree")
	notes := git(t, dir, "commit-tree", root, "-m", "fanned out")
	git(t, dir, "push", "-q", repo.URL(), notes+":refs/notes/flotilla")

	b := newBackend(t, repo.URL())
	got, err := b.Latest(ctxT(t), c)
	if err != nil {
		t.Fatal(err)
	}
	if got["flotilla/a"].Description != "waiting" {
		t.Fatalf("Latest = %v, want the fanned-out note's status", got)
	}
	if err := b.Set(ctxT(t), c, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready"}); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "fetch", "-q", repo.URL(), "+refs/notes/flotilla:refs/notes/flotilla")
	if shown := git(t, dir, "notes", "--ref", "flotilla", "show", c); !strings.Contains(shown, `"state": "success"`) {
		t.Fatalf("git reads\n%s\nafter the update, want the success", shown)
	}
	if paths := git(t, dir, "ls-tree", "-r", "--name-only", "refs/notes/flotilla"); paths != c[:2]+"/"+c[2:4]+"/"+c[4:] {
		t.Fatalf("notes tree holds %q, want the note left at its fanned-out path", paths)
	}
}

// repoWithAClone is a repository of one commit, c, and a git repository in dir that
// fetched it, to write notes with git itself.
func repoWithAClone(t *testing.T) (repo *gitserver.Repo, c, dir string) {
	t.Helper()
	repo = gitserver.Start(t).NewRepo(t, "fleet", "")
	c = repo.Commit("main", "add a cluster", map[string][]byte{"clusters/a/cluster.yaml": []byte("name: a\n")})
	dir = t.TempDir()
	git(t, dir, "init", "-q")
	git(t, dir, "fetch", "-q", repo.URL(), "main")
	return repo, c, dir
}

func gitIn(t *testing.T, dir, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// Two hubs writing notes at once (say, during a leader hand-over) lose nothing: the
// one whose push is refused redoes its change on top of the other's.
func TestConcurrentWritersLoseNothing(t *testing.T) {
	srv := gitserver.Start(t)
	repo := srv.NewRepo(t, "fleet", "")
	c := repo.Commit("main", "add clusters", map[string][]byte{"f": []byte("x")})
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w := range 2 {
		b := newBackend(t, repo.URL())
		wg.Go(func() {
			for i := range 5 {
				st := commitstatus.Status{Context: fmt.Sprintf("flotilla/w%d-%d", w, i), State: commitstatus.Pending, Description: "waiting"}
				if err := b.Set(context.Background(), c, st); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, err := newBackend(t, repo.URL()).Latest(ctxT(t), c)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 10 {
		t.Fatalf("the note holds %d contexts, want all 10 written by both writers", len(got))
	}
}

func TestRefusedCredentials(t *testing.T) {
	const password = "s3cret-password-for-notes"
	srv := gitserver.StartWithAuth(t, "hub", password)
	repo := srv.NewRepo(t, "fleet", "")
	c := repo.Commit("main", "x", map[string][]byte{"f": []byte("x")})
	tests := []struct {
		name string
		opts gitnotes.Options
	}{
		{"wrong password", gitnotes.Options{URL: repo.URL(), Auth: gitsource.HTTPAuth("hub", password+"-wrong")}},
		{"no credentials", gitnotes.Options{URL: repo.URL()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := gitnotes.New(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			err = b.Set(ctxT(t), c, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending})
			if !errors.Is(err, commitstatus.ErrUnauthorized) {
				t.Fatalf("Set = %v, want ErrUnauthorized", err)
			}
			if strings.Contains(err.Error(), password) {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
	b, err := gitnotes.New(gitnotes.Options{URL: repo.URL(), Auth: gitsource.HTTPAuth("hub", password)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Set(ctxT(t), c, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending}); err != nil {
		t.Fatalf("Set with the right password: %v", err)
	}
}

// A hub that posts for weeks holds the newest notes, not every version of them: each
// status set writes a new note, notes tree and commit, and another writer's are fetched.
// What it holds stays bounded, nothing set is lost, and git reads the notes.
func TestAWriterHoldsOnlyTheNewestNotes(t *testing.T) {
	srv := gitserver.Start(t)
	repo := srv.NewRepo(t, "fleet", "")
	var commits []string
	for i := range 3 {
		commits = append(commits, repo.Commit("main", fmt.Sprintf("change %d", i), map[string][]byte{"f": fmt.Appendf(nil, "%d", i)}))
	}
	hub, other := newBackend(t, repo.URL()), newBackend(t, repo.URL())
	const sets = 150
	most := 0
	for i := range sets {
		c, st := commits[i%len(commits)], commitstatus.Status{Context: fmt.Sprintf("flotilla/c%d", i%7), State: commitstatus.Pending, Description: fmt.Sprintf("set %d", i)}
		if err := hub.Set(ctxT(t), c, st); err != nil {
			t.Fatal(err)
		}
		// Now and then another writer, as during a leader hand-over: the hub fetches
		// its notes on top of what it holds.
		if i%10 == 0 {
			if err := other.Set(ctxT(t), c, commitstatus.Status{Context: "flotilla/other", State: commitstatus.Success}); err != nil {
				t.Fatal(err)
			}
		}
		most = max(most, hub.Held())
	}
	// The newest notes are a commit, the notes tree and a note per commit: the hub's
	// store holds the commit and the tree, the notes beside it.
	if limit := 2; most > limit {
		t.Fatalf("after %d statuses set, the hub held up to %d objects, more than %d", sets, most, limit)
	}

	reader := newBackend(t, repo.URL())
	for i, c := range commits {
		note, err := reader.Read(ctxT(t), c)
		if err != nil {
			t.Fatal(err)
		}
		counts := 0
		for name, e := range note.Statuses {
			if name != "flotilla/other" {
				counts += e.Count
			}
		}
		if want := (sets - i + len(commits) - 1) / len(commits); counts != want {
			t.Errorf("commit %d holds %d statuses set, want %d: %v", i, counts, want, note.Statuses)
		}
	}
	dir := t.TempDir()
	git(t, dir, "init", "-q")
	git(t, dir, "fetch", "-q", repo.URL(), "+refs/notes/flotilla:refs/notes/flotilla", "main")
	if shown := git(t, dir, "notes", "--ref", "flotilla", "show", commits[0]); !strings.Contains(shown, `"flotilla/other"`) {
		t.Fatalf("git reads\n%s", shown)
	}
	if n := git(t, dir, "rev-list", "--count", "refs/notes/flotilla"); n != fmt.Sprint(sets+sets/10) {
		t.Fatalf("the notes' history holds %s commits, want one per status set, %d", n, sets+sets/10)
	}
}

// A notes tree that grows fans out as git's does: once a level holds 256 entries, a new
// note goes one level down, so that setting a status does not write a tree of every
// commit ever noted. Git reads the notes at either level.
func TestAFullNotesTreeFansOutNewNotes(t *testing.T) {
	repo, c, dir := repoWithAClone(t)
	note := `{"statuses":{"flotilla/a":{"state":"pending","description":"older","updated":"2026-01-01T00:00:00Z","count":1}}}`
	blob := gitIn(t, dir, note, "hash-object", "-w", "--stdin")
	var flat strings.Builder
	for i := range 256 {
		fmt.Fprintf(&flat, "100644 blob %s\t%040x\n", blob, i+1)
	}
	root := gitIn(t, dir, flat.String(), "mktree")
	git(t, dir, "push", "-q", repo.URL(), git(t, dir, "commit-tree", root, "-m", "256 notes")+":refs/notes/flotilla")

	if err := newBackend(t, repo.URL()).Set(ctxT(t), c, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready"}); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "fetch", "-q", repo.URL(), "+refs/notes/flotilla:refs/notes/flotilla")
	paths := strings.Split(git(t, dir, "ls-tree", "-r", "--name-only", "refs/notes/flotilla"), "\n")
	if len(paths) != 257 || !slices.Contains(paths, c[:2]+"/"+c[2:]) || !slices.Contains(paths, fmt.Sprintf("%040x", 1)) {
		t.Fatalf("the notes tree holds %d notes, want the 256 left where they were and the new one at %s/%s", len(paths), c[:2], c[2:])
	}
	if shown := git(t, dir, "notes", "--ref", "flotilla", "show", c); !strings.Contains(shown, `"state": "success"`) {
		t.Fatalf("git reads\n%s\nfor the fanned-out note", shown)
	}
	if listed := strings.Split(git(t, dir, "notes", "--ref", "flotilla", "list"), "\n"); len(listed) != 257 {
		t.Fatalf("git lists %d notes, want 257", len(listed))
	}
	got, err := newBackend(t, repo.URL()).Latest(ctxT(t), c)
	if err != nil || got["flotilla/a"].State != commitstatus.Success {
		t.Fatalf("Latest = %v, %v", got, err)
	}
}

// What a hub holds of the notes is bounded by what it keeps, not by what it wrote or
// fetched: the newest notes commit and its trees, which say where each note is, and up
// to HeldNotes notes; an older note is fetched again when it is read, by itself from a
// server that allows it, else with the newest notes, of which it alone is kept.
func TestAWriterHoldsTheNotesTreesNotEveryNote(t *testing.T) {
	tests := []struct {
		name string
		// alone lets clients ask for any object the refs reach, as forges that serve
		// partial clones do.
		alone bool
	}{
		{"the note fetched with the newest notes", false},
		{"the note fetched alone", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := gitserver.Start(t)
			repo := srv.NewRepo(t, "fleet", "")
			repo.Commit("main", "add a cluster", map[string][]byte{"clusters/a/cluster.yaml": []byte("name: a\n")})
			if tt.alone {
				git(t, srv.Path("fleet"), "config", "uploadpack.allowReachableSHA1InWant", "true")
			}
			// Older notes than a hub holds, written by git: a note each on seeded
			// commits, all in the notes' root tree.
			const seeded = 300
			dir := t.TempDir()
			git(t, dir, "init", "-q")
			var paths, tree strings.Builder
			for i := range seeded {
				p := filepath.Join(dir, fmt.Sprintf("note-%d.json", i))
				note := fmt.Sprintf(`{"statuses":{"flotilla/a":{"state":"pending","description":"seeded %d","updated":"2026-01-01T00:00:00Z","count":1}}}`, i)
				if err := os.WriteFile(p, []byte(note), 0o644); err != nil {
					t.Fatal(err)
				}
				fmt.Fprintln(&paths, p)
			}
			for i, blob := range strings.Split(gitIn(t, dir, paths.String(), "hash-object", "-w", "--stdin-paths"), "\n") {
				fmt.Fprintf(&tree, "100644 blob %s\t%s\n", blob, seededCommit(i))
			}
			notes := git(t, dir, "commit-tree", gitIn(t, dir, tree.String(), "mktree"), "-m", "seeded notes")
			git(t, dir, "push", "-q", repo.URL(), notes+":refs/notes/flotilla")

			hub := newBackend(t, repo.URL())
			const sets = 40
			for i := range sets {
				// New commits' notes, which fan out below the full root tree, and now and
				// then an older note set again, which the hub no longer holds.
				if err := hub.Set(ctxT(t), fmt.Sprintf("%040x", 1_000_000+i), commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: fmt.Sprintf("set %d", i)}); err != nil {
					t.Fatal(err)
				}
				if i%4 == 0 {
					if err := hub.Set(ctxT(t), seededCommit(i*7), commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "set again"}); err != nil {
						t.Fatal(err)
					}
				}
				if commits, _, blobs, notes := hub.HeldObjects(); commits != 1 || blobs != 0 || notes > gitnotes.HeldNotes {
					t.Fatalf("after %d statuses set on %d notes, the hub holds %d notes commits, %d notes in its store and %d beside, want 1, 0 and at most %d",
						i+1+i/4, seeded+i+1, commits, blobs, notes, gitnotes.HeldNotes)
				}
			}
			git(t, dir, "fetch", "-q", repo.URL(), "+refs/notes/flotilla:refs/notes/flotilla")
			treesOnServer := 1 + len(strings.Fields(git(t, dir, "ls-tree", "-r", "-d", "--name-only", "refs/notes/flotilla")))
			if _, trees, _, _ := hub.HeldObjects(); trees != treesOnServer {
				t.Fatalf("the hub holds %d trees of the notes, want the %d of the newest notes", trees, treesOnServer)
			}

			// The notes the hub no longer holds read as they are, fetched again.
			for _, want := range []struct {
				commit string
				state  commitstatus.State
				count  int
			}{
				{seededCommit(0), commitstatus.Success, 2},
				{seededCommit(1), commitstatus.Pending, 1},
				{seededCommit(seeded - 1), commitstatus.Pending, 1},
				{fmt.Sprintf("%040x", 1_000_000), commitstatus.Pending, 1},
			} {
				note, err := hub.Read(ctxT(t), want.commit)
				if err != nil {
					t.Fatal(err)
				}
				if e := note.Statuses["flotilla/a"]; e.State != want.state || e.Count != want.count {
					t.Errorf("the note of %.8s reads %s set %d times, want %s set %d times", want.commit, e.State, e.Count, want.state, want.count)
				}
			}
			if shown := git(t, dir, "notes", "--ref", "flotilla", "show", seededCommit(28)); !strings.Contains(shown, `"count": 2`) {
				t.Fatalf("git reads\n%s\nfor a note set again", shown)
			}
		})
	}
}

// seededCommit names the commit of the ith note TestAWriterHoldsTheNotesTreesNotEveryNote
// seeds.
func seededCommit(i int) string { return fmt.Sprintf("%040x", i+1) }

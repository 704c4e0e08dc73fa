package gitsource_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

// randomFile is content that neither compresses nor deltas against another's.
func randomFile(seed uint64, n int) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

// storeBound is what either copy may hold in these tests at any time: the few payloads
// its heads hold and the fleet template, with room for the garbage a copy collects
// between two prunings. Without pruning, the copies would hold 48 and 30 MiB.
const storeBound = 10 << 20

// A hub runs for weeks: every push and every pull request brings new objects, and the
// copies in memory must let go of those no head needs any more, while still comparing
// each head with the last one correctly.
func TestBranchCopyStaysBoundedOverManyPushes(t *testing.T) {
	srv := gitserver.Start(t)
	repo := srv.NewRepo(t, "fleet", template)
	s := newSource(t, repo.URL())
	work := cliClone(t, srv)
	snap, _, err := s.Update(t.Context(), plumbing.ZeroHash)
	if err != nil {
		t.Fatal(err)
	}
	const pushes, size = 128, 384 << 10
	clusters := []string{"gpu-a", "gpu-b"}
	var prev *gitsource.Snapshot
	var prevData []byte
	maxBytes := int64(0)
	for i := range pushes {
		name := clusters[i%2]
		data := randomFile(uint64(i), size)
		head := commitFile(t, work, "clusters/"+name+"/payload.bin", data)
		gitCLI(t, work, "push", "-q", "origin", "main")

		// A caller still reads the head before while the next one is fetched and
		// the copy pruned under it.
		read := make(chan error, 1)
		go func() { read <- readsAs(prev, clusters[(i+1)%2], prevData) }()
		next, ch, err := s.Update(t.Context(), snap.Commit)
		if err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
		if err := <-read; err != nil {
			t.Fatalf("push %d: the head before, read during the fetch: %v", i, err)
		}
		if next.Commit.String() != head || ch.All || !slices.Equal(affected(ch).Clusters, []string{name}) {
			t.Fatalf("push %d: head %s with changes %+v, want %s changing %s", i, next.Commit, ch, head, name)
		}
		if err := readsAs(next, name, data); err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
		maxBytes = max(maxBytes, s.Memory().Branch.Bytes)
		snap, prev, prevData = next, next, data
	}
	if maxBytes > storeBound {
		t.Fatalf("after %d pushes of %d KiB the branch's copy held up to %d MiB, want at most %d MiB",
			pushes, size>>10, maxBytes>>20, storeBound>>20)
	}
	t.Logf("the branch's copy held at most %.1f MiB over %d pushes of %d KiB", float64(maxBytes)/(1<<20), pushes, size>>10)
}

func TestPullRequestCopyStaysBoundedOverManyPullRequests(t *testing.T) {
	srv := gitserver.Start(t)
	repo := srv.NewRepo(t, "fleet", template)
	s := newSource(t, repo.URL())
	work := cliClone(t, srv)
	const prs, size = 40, 768 << 10
	maxBytes := int64(0)
	for n := 1; n <= prs; n++ {
		name := fmt.Sprintf("gpu-%d", n)
		gitCLI(t, work, "checkout", "-q", "-B", "pr", "origin/main")
		commitFile(t, work, "clusters/"+name+"/payload.bin", randomFile(uint64(n), size))
		gitCLI(t, work, "push", "-q", "origin", fmt.Sprintf("HEAD:refs/pull/%d/head", n))
		if n%10 == 0 {
			// The branch moves on too, so the pull requests' history does.
			gitCLI(t, work, "checkout", "-q", "-B", "main", "origin/main")
			commitFile(t, work, "README.md", fmt.Appendf(nil, "%d\n", n))
			gitCLI(t, work, "push", "-q", "origin", "main")
		}
		// Two open at a time: the one before is closed now, its ref stays.
		got, err := s.PullRequests(t.Context(), func(i int) bool { return i == n || i == n-1 })
		if err != nil {
			t.Fatalf("#%d: %v", n, err)
		}
		if len(got) == 0 || got[len(got)-1].Number != n || got[len(got)-1].Err != nil ||
			!slices.Equal(affected(got[len(got)-1].Changes).Clusters, []string{name}) {
			t.Fatalf("#%d: read %+v, want it to change %s", n, got, name)
		}
		if err := readsAs(&prFS{got[len(got)-1]}, name, randomFile(uint64(n), size)); err != nil {
			t.Fatalf("#%d: %v", n, err)
		}
		maxBytes = max(maxBytes, s.Memory().PullRequests.Bytes)
	}
	if maxBytes > storeBound {
		t.Fatalf("after %d pull requests of %d KiB the pull requests' copy held up to %d MiB, want at most %d MiB",
			prs, size>>10, maxBytes>>20, storeBound>>20)
	}
	t.Logf("the pull requests' copy held at most %.1f MiB over %d pull requests of %d KiB", float64(maxBytes)/(1<<20), prs, size>>10)
}

// cliClone clones the server's fleet repository with the git command line, whose
// commits and pushes are a few times faster than the server's own helper; the source
// reads what it pushes over HTTP all the same.
func cliClone(t *testing.T, srv *gitserver.Server) string {
	t.Helper()
	work := filepath.Join(t.TempDir(), "work")
	gitCLI(t, "", "clone", "-q", srv.Path("fleet"), work)
	return work
}

// commitFile writes one file in a clone and commits it, returning the commit.
func commitFile(t *testing.T, work, name string, data []byte) string {
	t.Helper()
	file := filepath.Join(work, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	gitCLI(t, work, "add", file)
	gitCLI(t, work, "commit", "-q", "-m", "change "+name)
	return gitCLI(t, work, "rev-parse", "HEAD")
}

type prFS struct{ pr *gitsource.PullRequest }

func (p *prFS) FS() fs.FS { return p.pr.FS() }

// readsAs checks that a head (nil: none) holds data in its cluster's payload.
func readsAs(head interface{ FS() fs.FS }, cluster string, data []byte) error {
	if head == nil || data == nil {
		return nil
	}
	got, err := fs.ReadFile(head.FS(), "clusters/"+cluster+"/payload.bin")
	if err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("clusters/%s/payload.bin reads %d different bytes", cluster, len(got))
	}
	return nil
}

package gitsource_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/gittree"
)

// BenchmarkFetchOneChange is the hub's work after a merge that changes one cluster:
// check the remote head, fetch, and compute the changed set; once through go-git as
// the hub does it, once through the git command line, over the same server (git's own
// http-backend), in fleets of 1 and 10,000 clusters. ms-server/op is the server's part
// of it: what grows with the fleet there grows for every client of a git server.
func BenchmarkFetchOneChange(b *testing.B) {
	for _, n := range []int{1, 10_000} {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) { benchmarkFetchOneChange(b, n) })
	}
}

func benchmarkFetchOneChange(b *testing.B, n int) {
	srv := gitserver.Start(b)
	work := fleetgen.WriteDir(b, fleetgen.Fleet(n, fleetgen.Options{}))
	// The git command line builds the 10,000-directory history in seconds.
	gitCLI(b, work, "init", "-q", "-b", "main")
	gitCLI(b, work, "add", "-A")
	gitCLI(b, work, "commit", "-q", "-m", fmt.Sprintf("%d clusters", n))
	// A forge keeps a pushed fleet in a pack, not as 30,000 loose objects: upload-pack
	// reads every tree of a shallow client's last commit, and loose ones cost it 0.2 s.
	gitCLI(b, work, "repack", "-adq")
	gitCLI(b, work, "clone", "-q", "--bare", work, srv.Path("fleet"))
	gitCLI(b, work, "remote", "add", "origin", srv.Path("fleet"))
	url := srv.BackendURL(b, "fleet")
	changed := fleetgen.ClusterName(n / 2)
	file := filepath.Join(work, "clusters", changed, "notes.txt")
	change := 0
	commit := func() string {
		change++
		if err := os.WriteFile(file, fmt.Appendf(nil, "change %d\n", change), 0o644); err != nil {
			b.Fatal(err)
		}
		gitCLI(b, work, "add", file)
		gitCLI(b, work, "commit", "-q", "-m", "change one cluster")
		gitCLI(b, work, "push", "-q", "origin", "main")
		return gitCLI(b, work, "rev-parse", "HEAD")
	}
	// The pushes go to the repository's directory: what the server spends answering
	// from the first timed fetch on is the fetches' share.
	var since time.Duration
	reportServer := func(b *testing.B) {
		b.ReportMetric(float64((srv.FetchTime()-since).Microseconds())/1000/float64(b.N), "ms-server/op")
	}

	b.Run("go-git", func(b *testing.B) {
		s, err := gitsource.New(gitsource.Options{URL: url, Branch: "main"})
		if err != nil {
			b.Fatal(err)
		}
		snap, _, err := s.Update(context.Background(), plumbing.ZeroHash)
		if err != nil {
			b.Fatal(err)
		}
		last := snap.Commit
		since = srv.FetchTime()
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			head := commit()
			b.StartTimer()
			snap, ch, err := s.Update(context.Background(), last)
			if err != nil || snap.Commit.String() != head || !slices.Equal(ch.Paths, []string{"clusters/" + changed}) {
				b.Fatalf("update: %v, %+v", err, ch)
			}
			last = snap.Commit
		}
		b.StopTimer()
		reportServer(b)
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		// What the followed branch keeps in memory, all its clusters included.
		b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "MiB-heap")
		runtime.KeepAlive(s)
	})

	b.Run("git-cli", func(b *testing.B) {
		clone := filepath.Join(b.TempDir(), "clone.git")
		gitCLI(b, "", "clone", "-q", "--bare", "--depth", "1", "--single-branch", "--no-tags", url, clone)
		last := gitCLI(b, clone, "rev-parse", "HEAD")
		var maxRSS int64
		since = srv.FetchTime()
		for b.Loop() {
			b.StopTimer()
			head := commit()
			b.StartTimer()
			_, fetchRSS := gitCLIRSS(b, clone, "fetch", "-q", "--depth", "1", "--no-tags", "origin", "+refs/heads/main:refs/heads/main")
			names, diffRSS := gitCLIRSS(b, clone, "diff-tree", "-r", "--name-only", last, "main")
			if !strings.Contains(names, "clusters/"+changed+"/") {
				b.Fatalf("changed files %q", names)
			}
			if got := gitCLI(b, clone, "rev-parse", "main"); got != head {
				b.Fatalf("fetched %s, want %s", got, head)
			}
			last = head
			maxRSS = max(maxRSS, fetchRSS, diffRSS)
		}
		b.StopTimer()
		reportServer(b)
		b.ReportMetric(float64(maxRSS)/(1<<10), "MiB-maxrss")
	})
}

func gitCLI(tb testing.TB, dir string, args ...string) string {
	tb.Helper()
	out, _ := gitCLIRSS(tb, dir, args...)
	return out
}

// gitCLIRSS runs git and returns its output and its peak resident size in KiB.
func gitCLIRSS(tb testing.TB, dir string, args ...string) (string, int64) {
	tb.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=bench", "GIT_AUTHOR_EMAIL=bench@flotilla.invalid",
		"GIT_COMMITTER_NAME=bench", "GIT_COMMITTER_EMAIL=bench@flotilla.invalid", "GIT_TERMINAL_PROMPT=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	var rss int64
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rss = ru.Maxrss
	}
	return strings.TrimSpace(string(out)), rss
}

// BenchmarkReadOneClusterOf10k is what reading one changed cluster's directory from a
// new commit costs the hub in a 10,000-cluster fleet: the clusters/ directory is
// decoded anew for every commit, and must cost allocations that do not grow with it.
func BenchmarkReadOneClusterOf10k(b *testing.B) {
	objects, tree := gittree.New(b, gittree.FromMapFS(fleetgen.Fleet(10_000, fleetgen.Options{})))
	name := "clusters/" + fleetgen.ClusterName(4321) + "/cluster.yaml"
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fs.ReadFile(gitsource.NewTreeFS(objects, tree), name); err != nil {
			b.Fatal(err)
		}
	}
}

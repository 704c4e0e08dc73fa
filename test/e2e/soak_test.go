package e2e

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitea"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/github"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitlab"
	"github.com/flotilla-gitops/flotilla/test/forge/giteatest"
	"github.com/flotilla-gitops/flotilla/test/forge/githubtest"
	"github.com/flotilla-gitops/flotilla/test/forge/gitlabtest"
)

// The soak's size: make test pushes soakPushes through one status backend; make soak
// sets FLOTILLA_SOAK_PUSHES (5,000) and FLOTILLA_SOAK_BACKENDS=all (or a list of them:
// notes,github,gitea,gitlab).
const (
	soakPushes = 300
	// soakRemembered is the hub's RememberedCommits in the soak, so that every cache
	// with a cap (the commits remembered by the status book and the publisher, the
	// commit pages) is full after soakWarmUp pushes, before the baseline is taken.
	soakRemembered = 32
	soakWarmUp     = soakRemembered + 16
	// soakFileSize is the file each push rewrites in one cluster directory: the head
	// stays the same size.
	soakFileSize = 540 << 10
	// soakHeapBound is how far the live heap after GC may end above the baseline. The
	// leak this soak was written for held about 0.7 MiB a push: 300 pushes of it would
	// be 50 times the bound.
	soakHeapBound = 4 << 20
	// soakForgotten is how many pushes after its own a commit is forgotten by the
	// forge's test server, with its statuses and the log of requests: the server keeps
	// every post, as a forge does, and would otherwise outgrow the hub it serves in the
	// soak's measure of the process. Well past soakRemembered, so that the hub never
	// posts on a commit the server forgot.
	soakForgotten = 4 * soakRemembered
	// soakLog is how much of the hub's log the soak keeps, the end a failure shows.
	soakLog = 64 << 10
	// soakGoroutineSlack are goroutines that may still be finishing their work when the
	// count is read (a publisher's delivery, an informer's resync).
	soakGoroutineSlack = 4
)

// A hub that follows a busy fleet repository for weeks stays flat: pushes of constant
// size through the real hub, git server and status backend leave its goroutines at their
// level and its live heap within soakHeapBound of where it was once every cache with a
// cap was full.
func TestSoakPushesLeaveTheHubFlat(t *testing.T) {
	pushes := soakPushes
	if v := os.Getenv("FLOTILLA_SOAK_PUSHES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("FLOTILLA_SOAK_PUSHES=%q is not a number of pushes", v)
		}
		pushes = n
	}
	kinds := []string{"notes"}
	switch v := os.Getenv("FLOTILLA_SOAK_BACKENDS"); v {
	case "":
	case "all":
		kinds = []string{"notes", "github", "gitea", "gitlab"}
	default:
		kinds = strings.Split(v, ",")
	}
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) { soak(t, kind, pushes) })
	}
}

// soakBackend makes the status backend of kind, on its forge's test server when it is
// one, and returns how to make a commit of the git server known to that forge, and how
// to have the forge forget one with every request served so far.
func soakBackend(t *testing.T, kind string) (func(*fleetRepo), func(sha string), func(sha string)) {
	var (
		b      commitstatus.Backend
		add    = func(string) {}
		forget = func(string) {}
		err    error
	)
	switch kind {
	case "notes":
		return func(*fleetRepo) {}, add, forget
	case "github":
		srv := githubtest.Start(t)
		// GitHub's 5,000 requests an hour would have the publisher wait for the next
		// hour long before 5,000 pushes: pacing is tested with the publisher, the soak
		// measures memory. Zero would restore GitHub's own 5,000, whose answers say one
		// request remains once they are spent, and the publisher waits for the hour: a
		// budget the soak cannot spend instead.
		srv.SetRateLimit(math.MaxInt32, time.Hour)
		b, err = github.New(github.Options{BaseURL: srv.URL, Owner: srv.Owner, Repo: srv.Repo, Token: srv.Token})
		add = srv.AddCommit
		forget = func(sha string) { srv.Store.Forget(sha); srv.Store.ForgetRequests() }
	case "gitea":
		srv := giteatest.Start(t)
		b, err = gitea.New(t.Context(), gitea.Options{URL: srv.URL, Owner: srv.Owner, Repo: srv.Repo, Token: srv.Token})
		add = srv.AddCommit
		forget = func(sha string) { srv.Store.Forget(sha); srv.Store.ForgetRequests() }
	case "gitlab":
		srv := gitlabtest.Start(t)
		b, err = gitlab.New(gitlab.Options{URL: srv.URL, Project: srv.Project, Token: srv.Token})
		add = srv.Store.AddCommit
		forget = func(sha string) { srv.Forget(sha); srv.Store.ForgetRequests() }
	default:
		t.Fatalf("FLOTILLA_SOAK_BACKENDS: %q is none of notes, github, gitea, gitlab", kind)
	}
	if err != nil {
		t.Fatal(err)
	}
	return func(f *fleetRepo) { f.statuses = b }, add, forget
}

func soak(t *testing.T, kind string, pushes int) {
	withBackend, known, forget := soakBackend(t, kind)
	f := newFleetRepo(t, "soak-"+kind, withBackend, func(f *fleetRepo) {
		f.remembered = soakRemembered
		// The hub's log is the test's, in memory: a line or two a push would grow it
		// all along, which a hub writing to its stderr does not.
		f.tunnel.log.Max = soakLog
	})
	// The test's own clone of the fleet would otherwise take in every push's trees
	// until its cache is full, thousands of pushes after the baseline.
	f.repo.SetCache(0)
	_, added := f.addCluster("main", "gpu-a")
	known(added)
	f.src.Trigger()
	f.waitStatus(added, "flotilla/gpu-a", commitstatus.Pending, "")

	file := bytes.Repeat([]byte("#"), soakFileSize)
	var pushed []string
	push := func(i int) {
		// The same size every time, other bytes: a new blob, a new tree, a new commit.
		copy(file, fmt.Sprintf("# push %09d\n", i))
		c := f.repo.Commit("main", fmt.Sprintf("push %d", i), map[string][]byte{"clusters/gpu-a/notes.txt": file})
		known(c)
		f.src.Trigger()
		f.waitStatus(c, "flotilla/gpu-a", commitstatus.Pending, "")
		if pushed = append(pushed, c); len(pushed) > soakForgotten {
			forget(pushed[0])
			pushed = pushed[1:]
		}
	}
	for i := range soakWarmUp {
		push(i)
	}
	base := soakFigures()
	t.Logf("%s, after %d pushes to fill the caches: %s", kind, soakWarmUp, base)
	every := min(500, pushes)
	for i := range pushes {
		push(soakWarmUp + i)
		if (i+1)%every == 0 {
			t.Logf("%s, push %d: %s", kind, i+1, soakFigures())
		}
	}
	var end figures
	eventually(t, "the hub's goroutines back at their level", func() (bool, string) {
		end = soakFigures()
		return end.goroutines <= base.goroutines+soakGoroutineSlack, fmt.Sprintf("%d goroutines, %d before %d pushes", end.goroutines, base.goroutines, pushes)
	})
	if grew := int64(end.heap) - int64(base.heap); grew > soakHeapBound {
		t.Fatalf("%d pushes left the live heap %d KiB above where it was (%s, then %s); the bound is %d KiB",
			pushes, grew>>10, base, end, soakHeapBound>>10)
	}
	t.Logf("%s, after %d pushes: %s", kind, pushes, end)
}

// figures are what an operator reads of a hub that soaks: its resident memory, its live
// heap after a collection, and its goroutines.
type figures struct {
	rss, heap  uint64
	goroutines int
}

func (f figures) String() string {
	return fmt.Sprintf("RSS %d MiB, live heap %.1f MiB, %d goroutines", f.rss>>20, float64(f.heap)/(1<<20), f.goroutines)
}

func soakFigures() figures {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return figures{rss: residentBytes(), heap: ms.HeapAlloc, goroutines: runtime.NumGoroutine()}
}

// residentBytes is the process's resident set, from /proc; zero where there is none.
func residentBytes() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Package statussuite is the one behavioural test suite every commit-status backend
// passes: GitHub, Gitea and GitLab against their in-repo test servers, git notes
// against the real git server. It drives a backend through commitstatus.Publisher, the way
// the hub does, and checks what a reader of the forge would see.
package statussuite

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/test/forge"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// Target is one backend under test with the means to look behind it.
type Target struct {
	Backend commitstatus.Backend
	// NewCommit returns a commit hash, new to the backend, that it accepts statuses on.
	NewCommit func(t *testing.T) string
	// Count is how many statuses the backend holds for commit and context, history
	// included: what tells a post from no post.
	Count func(t *testing.T, commit, context string) int
	// DescriptionLimit is the forge's documented limit in characters, 0 for none.
	DescriptionLimit int
	// Forge is the test server's store, nil for a backend with no forge (git notes):
	// it adds the cases that need injected faults and a prepared history.
	Forge *forge.Store
	// ForgeState is the forge's name for a flotilla state, used to prepare history.
	ForgeState func(commitstatus.State) string
	// Cap is set when the forge itself refuses statuses beyond commitstatus.MaxPerContext
	// per commit and context, as GitHub documents.
	Cap bool
	// SetPullRequest records pull request number into branch base, open or closed, on
	// the forge; set exactly when the backend is a commitstatus.PullRequestLister. Nil for a
	// backend whose store keeps no pull requests (git notes).
	SetPullRequest func(t *testing.T, number int, base string, open bool)
	// SetRateLimit makes the forge accept limit requests per window and refuse the
	// others, as it does (or, for Gitea, as a proxy in front of it does); nil for a
	// backend with no forge.
	SetRateLimit func(limit int, window time.Duration)
	// SetWriteLimit makes the forge refuse statuses created beyond n per per, as
	// GitHub's secondary limits on creating content do; the backend is told WriteLimit
	// per RateWindow. Nil for a forge without such limits.
	SetWriteLimit func(n int, per time.Duration)
	// NewBackend returns another backend on the target's forge with the same
	// credentials, as a second source posting with the same token has, told of the
	// forge's limits on creating content (nil for none; a forge without such limits
	// ignores them). Nil for a backend with no forge.
	NewBackend func(t *testing.T, writes []commitstatus.Rate) commitstatus.Backend
	// StatesBudget is set when the forge states its budget on the answers it accepts
	// (GitHub); the others state it when they refuse (GitLab) or never (Gitea), so
	// their publisher is told the rate to keep within, as an operator would.
	StatesBudget bool
}

// RateWindow is the window of every rate limit the suite sets (Target.SetRateLimit):
// a second, in which a test sees several of them pass. A backend that takes its forge's
// window as known, as GitHub's does an hour, is told this one instead.
const RateWindow = time.Second

// WriteLimit is how many statuses a forge with limits on creating content lets a
// credential create per RateWindow in the suite (Target.SetWriteLimit).
const WriteLimit = 5

// fastBackoff keeps retries quick where the forge does not ask for a wait.
var fastBackoff = wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Steps: 5}

func publisher(tg Target) *commitstatus.Publisher {
	return commitstatus.NewPublisher(tg.Backend, commitstatus.PublisherOptions{Backoff: fastBackoff})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// Run runs the suite; newTarget is called once per case, so cases do not share commits.
func Run(t *testing.T, newTarget func(t *testing.T) Target) {
	t.Run("a commit without statuses reads as none", func(t *testing.T) {
		tg := newTarget(t)
		got, err := tg.Backend.Latest(ctxT(t), tg.NewCommit(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 0 {
			t.Fatalf("Latest = %v, want none", got)
		}
	})

	t.Run("the newest status of each context is read back", func(t *testing.T) {
		tg := newTarget(t)
		ctx, c, p := ctxT(t), tg.NewCommit(t), publisher(tg)
		publish(t, p, c, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: "waiting for the agent to register"})
		publish(t, p, c, commitstatus.Status{Context: "flotilla/b", State: commitstatus.Failure, Description: "clusters/b/cluster.yaml:3: unknown preset"})
		publish(t, p, c, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready · 8× H100 80GB on 1 node", TargetURL: "https://hub.example/clusters/a"})
		got, err := tg.Backend.Latest(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]commitstatus.Status{
			"flotilla/a": tg.Backend.Canonical(commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready · 8× H100 80GB on 1 node", TargetURL: "https://hub.example/clusters/a"}),
			"flotilla/b": tg.Backend.Canonical(commitstatus.Status{Context: "flotilla/b", State: commitstatus.Failure, Description: "clusters/b/cluster.yaml:3: unknown preset"}),
		}
		if !equal(got, want) {
			t.Fatalf("Latest =\n%v\nwant\n%v", got, want)
		}
	})

	t.Run("every state is read back as the backend canonicalizes it", func(t *testing.T) {
		tg := newTarget(t)
		ctx, c, p := ctxT(t), tg.NewCommit(t), publisher(tg)
		for _, s := range []commitstatus.State{commitstatus.Pending, commitstatus.Success, commitstatus.Failure, commitstatus.Error} {
			st := commitstatus.Status{Context: "flotilla/" + string(s), State: s, Description: string(s)}
			publish(t, p, c, st)
		}
		got, err := tg.Backend.Latest(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []commitstatus.State{commitstatus.Pending, commitstatus.Success, commitstatus.Failure, commitstatus.Error} {
			want := tg.Backend.Canonical(commitstatus.Status{Context: "flotilla/" + string(s), State: s, Description: string(s)})
			if got[want.Context] != want {
				t.Errorf("%s read back as %+v, want %+v", s, got[want.Context], want)
			}
			if want.State != s && want.State != commitstatus.Failure {
				t.Errorf("%s canonicalizes to %s: only error may fold, and only onto failure", s, want.State)
			}
		}
	})

	t.Run("an unchanged status is not posted again", func(t *testing.T) {
		tg := newTarget(t)
		c, p := tg.NewCommit(t), publisher(tg)
		st := commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: "waiting for the agent to connect"}
		for range 3 {
			publish(t, p, c, st)
		}
		if n := tg.Count(t, c, st.Context); n != 1 {
			t.Fatalf("the backend holds %d statuses after three identical publishes, want 1", n)
		}
		st.Description = "waiting for the agent to apply generation 2"
		posted, err := p.Publish(ctxT(t), c, st)
		if err != nil || !posted {
			t.Fatalf("Publish of a changed description = %v, %v; want it posted", posted, err)
		}
		got, err := tg.Backend.Latest(ctxT(t), c)
		if err != nil {
			t.Fatal(err)
		}
		if got[st.Context] != tg.Backend.Canonical(st) {
			t.Fatalf("Latest = %+v after a changed description, want %+v", got[st.Context], st)
		}
	})

	t.Run("a restarted hub does not post what the backend already holds", func(t *testing.T) {
		tg := newTarget(t)
		ctx, c := ctxT(t), tg.NewCommit(t)
		long := strings.Repeat("the agent reported an error while applying the desired state; ", 8)
		sts := []commitstatus.Status{
			{Context: "flotilla/a", State: commitstatus.Success, Description: "ready · 64× H100 80GB on 8 nodes"},
			{Context: "flotilla/b", State: commitstatus.Error, Description: long},
		}
		for _, st := range sts {
			publish(t, publisher(tg), c, st)
		}
		restarted := publisher(tg)
		for _, st := range sts {
			posted, err := restarted.Publish(ctx, c, st)
			if err != nil {
				t.Fatal(err)
			}
			if posted {
				t.Errorf("%s was posted again after a restart", st.Context)
			}
			if n := tg.Count(t, c, st.Context); n != 1 {
				t.Errorf("%s: the backend holds %d statuses, want 1", st.Context, n)
			}
		}
	})

	t.Run("a long description is cut at the forge's limit with an ellipsis", func(t *testing.T) {
		tg := newTarget(t)
		ctx, c := ctxT(t), tg.NewCommit(t)
		desc := "refuse to adopt existing object not owned by this WorkerCluster: " + strings.Repeat("ClusterQueue/team-ä ", 20)
		publish(t, publisher(tg), c, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Failure, Description: desc})
		got, err := tg.Backend.Latest(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		d := got["flotilla/a"].Description
		if tg.DescriptionLimit == 0 {
			// Whole, as the forge stores it (Gitea trims surrounding blanks).
			if d != tg.Backend.Canonical(commitstatus.Status{Context: "flotilla/a", State: commitstatus.Failure, Description: desc}).Description {
				t.Fatalf("description = %q, want it whole: the backend has no limit", d)
			}
			return
		}
		if n := utf8.RuneCountInString(d); n != tg.DescriptionLimit || !strings.HasSuffix(d, commitstatus.Ellipsis) {
			t.Fatalf("description of %d characters %q, want %d ending in %q", n, d, tg.DescriptionLimit, commitstatus.Ellipsis)
		}
		if !strings.HasPrefix(desc, strings.TrimSuffix(d, commitstatus.Ellipsis)) {
			t.Fatalf("description %q is not a prefix of what was published", d)
		}
	})

	t.Run("every context is read, however many pages it takes", func(t *testing.T) {
		tg := newTarget(t)
		ctx, c, p := ctxT(t), tg.NewCommit(t), publisher(tg)
		const n = 110 // above every forge's largest page
		for i := range n {
			publish(t, p, c, commitstatus.Status{Context: fmt.Sprintf("flotilla/w%03d", i), State: commitstatus.Success, Description: "ready"})
		}
		got, err := tg.Backend.Latest(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != n {
			t.Fatalf("Latest read %d contexts, want %d", len(got), n)
		}
	})

	t.Run("concurrent publishes of one status post it once", func(t *testing.T) {
		tg := newTarget(t)
		ctx, c, p := ctxT(t), tg.NewCommit(t), publisher(tg)
		st := commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: "waiting"}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() {
				if _, err := p.Publish(ctx, c, st); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if n := tg.Count(t, c, st.Context); n != 1 {
			t.Fatalf("the backend holds %d statuses, want 1", n)
		}
	})

	probe := newTarget(t)
	runPullRequests(t, newTarget, probe)
	if probe.Forge == nil {
		return
	}
	runForge(t, newTarget, probe.Cap)
}

// runPullRequests checks what a hub plans from: the numbers of the open pull requests
// into its branch, and no others, however many pages the forge lists them on.
func runPullRequests(t *testing.T, newTarget func(t *testing.T) Target, probe Target) {
	_, lists := probe.Backend.(commitstatus.PullRequestLister)
	t.Run("the backend lists pull requests exactly when the target can record them", func(t *testing.T) {
		if lists != (probe.SetPullRequest != nil) {
			t.Fatalf("the backend lists pull requests: %v; the target records them: %v", lists, probe.SetPullRequest != nil)
		}
	})
	if !lists || probe.SetPullRequest == nil {
		return
	}

	t.Run("the open pull requests into the branch are listed, however many pages it takes", func(t *testing.T) {
		tg := newTarget(t)
		want := map[int]bool{}
		// 230 pull requests are more than two pages on every forge. Every seventh is
		// closed; every fifth goes into release and every eleventh into main-next, a
		// branch whose name starts with the followed one's.
		for n := 1; n <= 230; n++ {
			base, open := "main", n%7 != 0
			switch {
			case n%5 == 0:
				base = "release"
			case n%11 == 0:
				base = "main-next"
			}
			tg.SetPullRequest(t, n, base, open)
			if open && base == "main" {
				want[n] = true
			}
		}
		got, err := tg.Backend.(commitstatus.PullRequestLister).OpenPullRequests(ctxT(t), "main")
		if err != nil {
			t.Fatal(err)
		}
		for n := range got {
			if !want[n] {
				t.Errorf("#%d is listed but is closed or into another branch", n)
			}
		}
		for n := range want {
			if !got[n] {
				t.Errorf("#%d is open into main but not listed", n)
			}
		}
	})

	t.Run("a branch without open pull requests lists none", func(t *testing.T) {
		tg := newTarget(t)
		tg.SetPullRequest(t, 1, "main", false)
		tg.SetPullRequest(t, 2, "release", true)
		got, err := tg.Backend.(commitstatus.PullRequestLister).OpenPullRequests(ctxT(t), "main")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 0 {
			t.Fatalf("OpenPullRequests = %v, want none", got)
		}
	})
}

func runForge(t *testing.T, newTarget func(t *testing.T) Target, capped bool) {
	t.Run("the newest status of a long history is the one read", func(t *testing.T) {
		tg := newTarget(t)
		c := tg.NewCommit(t)
		tg.Forge.Fill(c, "flotilla/a", tg.ForgeState(commitstatus.Pending), 250)
		publish(t, publisher(tg), c, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready"})
		got, err := tg.Backend.Latest(ctxT(t), c)
		if err != nil {
			t.Fatal(err)
		}
		if got["flotilla/a"].State != commitstatus.Success {
			t.Fatalf("Latest = %+v, want the success posted after 250 pending", got["flotilla/a"])
		}
	})

	t.Run("server errors are retried", func(t *testing.T) {
		tg := newTarget(t)
		c := tg.NewCommit(t)
		tg.Forge.FailNext(2, forge.Fault{Code: 502})
		publish(t, publisher(tg), c, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: "waiting"})
		if n := tg.Count(t, c, "flotilla/a"); n != 1 {
			t.Fatalf("the backend holds %d statuses, want 1", n)
		}
	})

	t.Run("a rate limit is waited out as long as Retry-After says", func(t *testing.T) {
		tg := newTarget(t)
		c := tg.NewCommit(t)
		tg.Forge.FailNext(1, forge.Fault{Code: 429, RetryAfter: time.Second})
		publish(t, publisher(tg), c, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: "waiting"})
		reqs := tg.Forge.Requests()
		for i, r := range reqs {
			if r.Fault == 0 {
				continue
			}
			if i+1 >= len(reqs) {
				t.Fatal("no request after the rate-limited one")
			}
			if gap := reqs[i+1].Time.Sub(r.Time); gap < time.Second {
				t.Fatalf("retried %s after a Retry-After of 1s", gap)
			}
		}
		if n := tg.Count(t, c, "flotilla/a"); n != 1 {
			t.Fatalf("the backend holds %d statuses, want 1", n)
		}
	})

	runRateLimits(t, newTarget)

	if !capped {
		// The forge keeps any number; the Publisher's own count is pinned by its unit tests.
		return
	}
	t.Run("no status beyond the forge's cap per commit and context", func(t *testing.T) {
		tg := newTarget(t)
		ctx, c, p := ctxT(t), tg.NewCommit(t), publisher(tg)
		tg.Forge.Fill(c, "flotilla/a", tg.ForgeState(commitstatus.Pending), commitstatus.MaxPerContext)
		_, err := p.Publish(ctx, c, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready"})
		if !errors.Is(err, commitstatus.ErrCapReached) {
			t.Fatalf("Publish at the cap = %v, want ErrCapReached", err)
		}
		before := len(tg.Forge.Requests())
		_, err = p.Publish(ctx, c, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Failure, Description: "again"})
		if !errors.Is(err, commitstatus.ErrCapReached) {
			t.Fatalf("second Publish at the cap = %v, want ErrCapReached", err)
		}
		if after := len(tg.Forge.Requests()); after != before {
			t.Fatalf("the publisher asked the forge again (%d requests) after it reported the cap", after-before)
		}
		if n := tg.Count(t, c, "flotilla/a"); n != commitstatus.MaxPerContext {
			t.Fatalf("the forge holds %d statuses, want %d", n, commitstatus.MaxPerContext)
		}
		publish(t, p, c, commitstatus.Status{Context: "flotilla/b", State: commitstatus.Success, Description: "ready"})
	})
}

func publish(t *testing.T, p *commitstatus.Publisher, commit string, st commitstatus.Status) {
	t.Helper()
	if _, err := p.Publish(ctxT(t), commit, st); err != nil {
		t.Fatalf("publishing %s: %v", st.Context, err)
	}
}

func equal(a, b map[string]commitstatus.Status) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// runRateLimits checks that the Publisher keeps within the forge's rate limit: queued
// statuses are spread over the budget, a refusal is waited out, and a single change's
// status goes ahead of a wave's.
func runRateLimits(t *testing.T, newTarget func(t *testing.T) Target) {
	// A budget small enough that a test spans several windows of it.
	const limit, window = 10, RateWindow
	paced := func(tg Target, opts commitstatus.PublisherOptions) *commitstatus.Publisher {
		opts.Backoff = fastBackoff
		if !tg.StatesBudget && opts.Rate == 0 {
			// Four fifths of the limit: the forge counts arrivals, which the network
			// bunches.
			opts.Rate = 0.8 * limit / window.Seconds()
		}
		return commitstatus.NewPublisher(tg.Backend, opts)
	}

	t.Run("queued statuses are spread within the forge's budget and none is refused", func(t *testing.T) {
		tg := newTarget(t)
		c := tg.NewCommit(t)
		tg.SetRateLimit(limit, window)
		p := paced(tg, commitstatus.PublisherOptions{})
		const n = 3 * limit
		submitWave(t, p, c, n, commitstatus.Bulk)
		began := time.Now()
		stop := run(t, p)
		waitPosted(t, tg, c, n)
		stop()
		took := time.Since(began)
		if r := tg.Forge.Refused(); r != 0 {
			t.Fatalf("the forge refused %d of %d requests", r, len(tg.Forge.Requests()))
		}
		// n posts and a read of the commit at limit per window take two full windows
		// at least.
		if min := time.Duration(n/limit-1) * window; took < min {
			t.Fatalf("%d posts took %s, faster than the budget of %d per %s allows", n, took, limit, window)
		}
		t.Logf("%d statuses posted in %s with %d requests, none refused", n, took.Round(time.Millisecond), len(tg.Forge.Requests()))
	})

	t.Run("a refusal is waited out and the rest paced, no status lost", func(t *testing.T) {
		tg := newTarget(t)
		c := tg.NewCommit(t)
		tg.SetRateLimit(limit, window)
		// Told nothing: a forge that states no budget is learned from its refusals.
		p := commitstatus.NewPublisher(tg.Backend, commitstatus.PublisherOptions{Backoff: fastBackoff})
		const n = 4 * limit
		submitWave(t, p, c, n, commitstatus.Bulk)
		stop := run(t, p)
		waitPosted(t, tg, c, n)
		stop()
		refused := tg.Forge.Refused()
		if tg.StatesBudget && refused != 0 {
			t.Fatalf("the forge stated its budget, and still refused %d requests", refused)
		}
		// Each refusal at least halves the rate, or teaches the limit outright.
		if refused > 6 {
			t.Fatalf("the forge refused %d requests: the publisher did not learn its limit", refused)
		}
		t.Logf("%d statuses posted with %d requests, %d refused", n, len(tg.Forge.Requests()), refused)
	})

	t.Run("a read of many pages keeps within the forge's budget", func(t *testing.T) {
		tg := newTarget(t)
		c := tg.NewCommit(t)
		// Twelve pages of the largest any forge serves, GitHub's and GitLab's hundred.
		const contexts = 1200
		for i := range contexts {
			tg.Forge.Add(c, forge.Record{Context: fmt.Sprintf("flotilla/w%04d", i), State: tg.ForgeState(commitstatus.Pending)})
		}
		tg.SetRateLimit(limit, window)
		p := paced(tg, commitstatus.PublisherOptions{})
		got, err := p.Latest(ctxT(t), c)
		checkRead(t, tg, "contexts", contexts, len(got), err)
	})

	t.Run("a list of many pages of pull requests sent through the publisher keeps within the forge's budget", func(t *testing.T) {
		tg := newTarget(t)
		// Every forge keeps pull requests; runPullRequests pins that the backend lists
		// them exactly when the target records them.
		lister, ok := tg.Backend.(commitstatus.PullRequestLister)
		if !ok || tg.SetPullRequest == nil {
			t.Fatal("a forge's backend lists no pull requests, or its target records none")
		}
		// Twelve pages of a hundred.
		const open = 1200
		for n := 1; n <= open; n++ {
			tg.SetPullRequest(t, n, "main", true)
		}
		tg.SetRateLimit(limit, window)
		p := paced(tg, commitstatus.PublisherOptions{})
		var got map[int]bool
		err := p.Send(ctxT(t), func(ctx context.Context) error {
			var err error
			got, err = lister.OpenPullRequests(ctx, "main")
			return err
		})
		checkRead(t, tg, "open pull requests", open, len(got), err)
	})

	t.Run("statuses that replace pending ones keep within the forge's budget, however many requests each takes", func(t *testing.T) {
		// GitLab cannot make a pending job pending again: a new description of a
		// pending status costs a refused post, a cancel and a new post.
		tg := newTarget(t)
		c := tg.NewCommit(t)
		// Three requests each, unpaced, would pass the limit threefold.
		const n = limit
		// Posted through a backend of their own: the one under test first hears of the
		// forge's budget once the limit is set, as a backend does of a forge's real one.
		first := publisher(Target{Backend: tg.NewBackend(t, nil)})
		for i := range n {
			publish(t, first, c, commitstatus.Status{Context: fmt.Sprintf("flotilla/w%04d", i), State: commitstatus.Pending, Description: "waiting for the agent"})
		}
		tg.SetRateLimit(limit, window)
		before := len(tg.Forge.Requests())
		p := paced(tg, commitstatus.PublisherOptions{})
		submitWave(t, p, c, n, commitstatus.Bulk)
		stop := run(t, p)
		poll.Until(t, "the new descriptions posted", func() (bool, string) {
			done := 0
			for _, r := range tg.Forge.Latest(c) {
				if r.Description == "waiting for the agent to apply" {
					done++
				}
			}
			return done == n, fmt.Sprintf("%d of %d posted, %d refused", done, n, tg.Forge.Refused())
		})
		stop()
		if r := tg.Forge.Refused(); r != 0 {
			t.Fatalf("the forge refused %d of %d requests", r, len(tg.Forge.Requests())-before)
		}
		t.Logf("%d pending statuses replaced with %d requests, none refused", n, len(tg.Forge.Requests())-before)
	})

	t.Run("publishers posting with one credential share its budget and none is refused", func(t *testing.T) {
		// Two sources, on two repositories or two branches, with one token: the forge
		// counts their requests together.
		tg := newTarget(t)
		c1, c2 := tg.NewCommit(t), tg.NewCommit(t)
		tg.SetRateLimit(limit, window)
		if tg.SetWriteLimit != nil {
			tg.SetWriteLimit(WriteLimit, RateWindow)
		}
		budget := commitstatus.NewBudget()
		writes := []commitstatus.Rate{{N: WriteLimit, Per: RateWindow}}
		p1 := paced(Target{Backend: tg.NewBackend(t, writes), StatesBudget: tg.StatesBudget}, commitstatus.PublisherOptions{Budget: budget})
		p2 := paced(Target{Backend: tg.NewBackend(t, writes), StatesBudget: tg.StatesBudget}, commitstatus.PublisherOptions{Budget: budget})
		const n = limit / 2
		submitWave(t, p1, c1, n, commitstatus.Bulk)
		submitWave(t, p2, c2, n, commitstatus.Bulk)
		run(t, p1)
		run(t, p2)
		// Apart, each would go at the whole rate (Gitea, GitLab), or create content at
		// the whole rate GitHub allows a credential, and the forge would refuse.
		waitPosted(t, tg, c1, n)
		waitPosted(t, tg, c2, n)
		if r := tg.Forge.Refused(); r != 0 {
			t.Fatalf("the forge refused %d of %d requests", r, len(tg.Forge.Requests()))
		}
		t.Logf("%d statuses posted by two publishers with %d requests, none refused", 2*n, len(tg.Forge.Requests()))
	})

	t.Run("a single change's status goes before the rest of a running wave", func(t *testing.T) {
		tg := newTarget(t)
		wave, single := tg.NewCommit(t), tg.NewCommit(t)
		tg.SetRateLimit(2*limit, window)
		p := paced(tg, commitstatus.PublisherOptions{Rate: 0.8 * 2 * limit / window.Seconds()})
		const n = 1000
		submitWave(t, p, wave, n, commitstatus.Bulk)
		stop := run(t, p)
		defer stop()
		poll.Until(t, "the wave under way", func() (bool, string) {
			got := len(tg.Forge.Latest(wave))
			return got >= limit, fmt.Sprintf("%d of %d posted", got, n)
		})
		submitted := len(tg.Forge.Requests())
		if err := p.Submit(single, commitstatus.Status{Context: "flotilla/single", State: commitstatus.Success, Description: "ready"}, commitstatus.Submission{Lane: commitstatus.Urgent}); err != nil {
			t.Fatal(err)
		}
		waitPosted(t, tg, single, 1)
		reqs := tg.Forge.Requests()
		before := 0
		for _, r := range reqs[submitted:] {
			if r.Method == http.MethodPost && strings.Contains(strings.ToLower(r.Path), single) {
				break
			}
			if r.Method == http.MethodPost && strings.Contains(strings.ToLower(r.Path), wave) {
				before++
			}
		}
		// The wave's posts already waiting for their turn may go first; no more.
		if before > 3 {
			t.Fatalf("%d posts of the wave went before the single change's status", before)
		}
		if r := tg.Forge.Refused(); r != 0 {
			t.Fatalf("the forge refused %d requests", r)
		}
		t.Logf("the single change's status was posted after %d more of the wave's, with %d of %d of the wave posted", before, len(tg.Forge.Latest(wave)), n)
	})
}

// checkRead checks a read of many pages: it succeeded, found all want items and had
// none of its requests refused.
func checkRead(t *testing.T, tg Target, what string, want, got int, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("read %d %s, want %d", got, what, want)
	}
	if r := tg.Forge.Refused(); r != 0 {
		t.Fatalf("the forge refused %d of the %d requests of one read", r, len(tg.Forge.Requests()))
	}
	t.Logf("%d %s read with %d requests, none refused", want, what, len(tg.Forge.Requests()))
}

// submitWave queues n statuses of distinct contexts on commit.
func submitWave(t *testing.T, p *commitstatus.Publisher, commit string, n int, lane commitstatus.Lane) {
	t.Helper()
	for i := range n {
		st := commitstatus.Status{Context: fmt.Sprintf("flotilla/w%04d", i), State: commitstatus.Pending, Description: "waiting for the agent to apply"}
		if err := p.Submit(commit, st, commitstatus.Submission{Lane: lane}); err != nil {
			t.Fatal(err)
		}
	}
}

// run runs p's workers until the returned stop is called or the test ends.
func run(t *testing.T, p *commitstatus.Publisher) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// waitPosted waits until the forge holds n contexts on commit.
func waitPosted(t *testing.T, tg Target, commit string, n int) {
	t.Helper()
	poll.Until(t, "the statuses posted", func() (bool, string) {
		got := len(tg.Forge.Latest(commit))
		return got >= n, fmt.Sprintf("%d of %d posted, %d refused", got, n, tg.Forge.Refused())
	})
}

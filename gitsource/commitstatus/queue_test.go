package commitstatus_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// run runs p's workers until the test ends.
func run(t *testing.T, p *commitstatus.Publisher) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (m *memory) count(commit, context string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sets[commit+"/"+context]
}

func (m *memory) latestOf(commit, context string) commitstatus.Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.latest[commit][context]
}

func settle(t *testing.T, p *commitstatus.Publisher) {
	t.Helper()
	poll.Until(t, "the queue drained", func() (bool, string) { return p.Pending() == 0, fmt.Sprintf("%d to post", p.Pending()) })
}

// Of the statuses of one context queued before a worker gets to them, only the newest
// is posted: a cluster that went pending, configured and ready while the forge was slow
// costs one request.
func TestQueuedStatusesOfOneContextArePostedOnceAsTheNewest(t *testing.T) {
	m := newMemory(0)
	p := commitstatus.NewPublisher(m, quick)
	for i, st := range []commitstatus.State{commitstatus.Pending, commitstatus.Pending, commitstatus.Success} {
		if err := p.Submit(commit, commitstatus.Status{Context: "flotilla/a", State: st, Description: fmt.Sprint(i)}, commitstatus.Submission{Lane: commitstatus.Bulk}); err != nil {
			t.Fatal(err)
		}
	}
	if n := p.Pending(); n != 1 {
		t.Fatalf("%d statuses queued, want 1", n)
	}
	run(t, p)
	settle(t, p)
	if n, got := m.count(commit, "flotilla/a"), m.latestOf(commit, "flotilla/a"); n != 1 || got.State != commitstatus.Success {
		t.Fatalf("posted %d times, newest %+v; want once, the success", n, got)
	}
}

// A summarized change posts a cluster's status only when it fails, and from then on
// keeps it current, so that a recovered cluster does not stay red on the commit.
func TestFailuresOnlyPostsFailuresAndKeepsThemCurrent(t *testing.T) {
	m := newMemory(0)
	p := commitstatus.NewPublisher(m, quick)
	run(t, p)
	sub := commitstatus.Submission{Lane: commitstatus.Bulk, FailuresOnly: true}
	steps := []struct {
		state  commitstatus.State
		posted int
	}{
		{commitstatus.Pending, 0},
		{commitstatus.Success, 0},
		{commitstatus.Failure, 1},
		{commitstatus.Pending, 2},
		{commitstatus.Success, 3},
	}
	for _, s := range steps {
		if err := p.Submit(commit, commitstatus.Status{Context: "flotilla/a", State: s.state}, sub); err != nil {
			t.Fatal(err)
		}
		settle(t, p)
		if n := m.count(commit, "flotilla/a"); n != s.posted {
			t.Fatalf("after %s: %d posts, want %d", s.state, n, s.posted)
		}
	}
}

// A summary whose count moves while its state stays is posted at most once per Every,
// as its newest form; a change of state goes at once.
func TestASummaryThatKeepsItsStateWaitsItsTurn(t *testing.T) {
	m := newMemory(0)
	clock := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	opts := quick
	opts.Clock = clock
	p := commitstatus.NewPublisher(m, opts)
	run(t, p)
	sub := commitstatus.Submission{Lane: commitstatus.Urgent, Every: 10 * time.Second}
	summary := func(st commitstatus.State, ready int) {
		t.Helper()
		if err := p.Submit(commit, commitstatus.Status{Context: "flotilla/fleet", State: st, Description: fmt.Sprintf("%d of 3 clusters ready", ready)}, sub); err != nil {
			t.Fatal(err)
		}
	}
	summary(commitstatus.Pending, 0)
	settle(t, p)
	summary(commitstatus.Pending, 1)
	summary(commitstatus.Pending, 2)
	poll.Until(t, "the count held back", func() (bool, string) {
		return clock.HasWaiters() && p.Pending() == 1, fmt.Sprintf("%d to post", p.Pending())
	})
	if n := m.count(commit, "flotilla/fleet"); n != 1 {
		t.Fatalf("the count was posted %d times within Every, want once", n)
	}
	clock.Step(10 * time.Second)
	settle(t, p)
	if got := m.latestOf(commit, "flotilla/fleet"); m.count(commit, "flotilla/fleet") != 2 || got.Description != "2 of 3 clusters ready" {
		t.Fatalf("after Every: %d posts, newest %q; want 2, the newest count", m.count(commit, "flotilla/fleet"), got.Description)
	}
	summary(commitstatus.Success, 3)
	settle(t, p)
	if got := m.latestOf(commit, "flotilla/fleet"); got.State != commitstatus.Success {
		t.Fatalf("a change of state waited: the summary is %s", got.State)
	}
}

// pacedPublisher is a Publisher, running until the test ends, that lets one request a
// second go on a fake clock, and the forge it posts to. tune, if any, changes its
// options first; they hold the clock.
func pacedPublisher(t *testing.T, tune ...func(*commitstatus.PublisherOptions)) (*memory, *clocktesting.FakeClock, *commitstatus.Publisher) {
	m := newMemory(0)
	clock := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	opts := quick
	opts.Clock, opts.Rate = clock, 1
	for _, f := range tune {
		f(&opts)
	}
	p := commitstatus.NewPublisher(m, opts)
	run(t, p)
	return m, clock, p
}

// postBulk submits a pending status of flotilla/a saying desc, in the Bulk lane.
func postBulk(t *testing.T, p *commitstatus.Publisher, desc string) {
	t.Helper()
	if err := p.Submit(commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: desc}, commitstatus.Submission{Lane: commitstatus.Bulk}); err != nil {
		t.Fatal(err)
	}
}

// waiting waits until a request waits on clock.
func waiting(t *testing.T, clock *clocktesting.FakeClock, what string) {
	t.Helper()
	poll.Until(t, what, func() (bool, string) { return clock.HasWaiters(), "no request waits" })
}

// drain steps clock a minute at a time until p has posted all it holds.
func drain(t *testing.T, clock *clocktesting.FakeClock, p *commitstatus.Publisher) {
	t.Helper()
	poll.Until(t, "the queue drained", func() (bool, string) {
		n := p.Pending()
		if n == 0 {
			return true, ""
		}
		clock.Step(time.Minute)
		return false, fmt.Sprintf("%d to post at %s", n, clock.Now().Format(time.TimeOnly))
	})
}

// budget is a forge's budget as it stated it once, and never again.
type budget commitstatus.Limits

func (b budget) Limits() commitstatus.Limits { return commitstatus.Limits(b) }

// A newer status of a context submitted in the Urgent lane while a wave's status of that
// context waits its Bulk turn, which a wave that spends the budget but for the Urgent
// lane's reserve puts half an hour away, goes in the Urgent lane's turn: the older one
// gives its turn up, whether it waited to read its commit or to post, and is not posted
// over the newer one when that turn comes.
func TestAnUrgentStatusDoesNotWaitTheBulkTurnOfAnOlderOneOfItsContext(t *testing.T) {
	const another = "89abcdef0123456789abcdef0123456789abcdef"
	tests := []struct {
		name string
		// busy has a request go just before the wave, so that the Bulk lane's next
		// turn, the wave's read of its commit, is half an hour away too.
		busy bool
	}{
		{name: "waiting to post"},
		{name: "waiting to read its commit", busy: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// 8 of 100 an hour left, 5 of them the Urgent lane's reserve: the Bulk lane
			// spreads the 3 others over the hour, and the Urgent lane goes at once.
			m, clock, p := pacedPublisher(t, func(opts *commitstatus.PublisherOptions) {
				opts.Limits = budget{Stated: true, Quota: commitstatus.Quota{Limit: 100, Remaining: 8, Reset: opts.Clock.Now().Add(time.Hour), Window: time.Hour}}
			})
			if tt.busy {
				if _, err := p.Latest(t.Context(), another); err != nil {
					t.Fatal(err)
				}
			}
			submit := func(context string, st commitstatus.State, desc string, lane commitstatus.Lane) {
				t.Helper()
				if err := p.Submit(commit, commitstatus.Status{Context: context, State: st, Description: desc}, commitstatus.Submission{Lane: lane}); err != nil {
					t.Fatal(err)
				}
			}
			const wave = 5
			for i := range wave {
				submit(fmt.Sprintf("flotilla/c%d", i), commitstatus.Pending, "rolling out", commitstatus.Bulk)
			}
			// The Bulk workers took the first of the wave, flotilla/c0, before any wait.
			waiting(t, clock, "the wave waiting its Bulk turn")
			submit("flotilla/c0", commitstatus.Failure, "crash-looping", commitstatus.Urgent)
			// The clock stands still: the Urgent lane's turn is now.
			poll.Until(t, "the newer status posted in the Urgent lane's turn", func() (bool, string) {
				got := m.latestOf(commit, "flotilla/c0")
				return got.Description == "crash-looping", fmt.Sprintf("the forge shows %q %q", got.State, got.Description)
			})
			drain(t, clock, p)
			if n, got := m.count(commit, "flotilla/c0"), m.latestOf(commit, "flotilla/c0"); n != 1 || got.State != commitstatus.Failure {
				t.Fatalf("flotilla/c0 was posted %d times and shows %+v; want once, the newer status", n, got)
			}
			for i := 1; i < wave; i++ {
				if n := m.count(commit, fmt.Sprintf("flotilla/c%d", i)); n != 1 {
					t.Errorf("flotilla/c%d was posted %d times, want once", i, n)
				}
			}
		})
	}
}

// holding is a forge whose post of one description waits until the test lets it end.
type holding struct {
	*memory
	desc             string
	entered, release chan struct{}
}

func (h *holding) Set(ctx context.Context, commit string, st commitstatus.Status) error {
	if st.Description == h.desc {
		close(h.entered)
		select {
		case <-h.release:
		case <-ctx.Done():
		}
		// A forge's client gives up a request whose context ends.
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return h.memory.Set(ctx, commit, st)
}

// An Urgent status submitted while a Bulk post of its context is under way follows that
// post, neither cutting it short nor racing it: the forge takes both, the newer last.
func TestAnUrgentStatusFollowsABulkPostOfItsContextUnderWay(t *testing.T) {
	h := &holding{memory: newMemory(0), desc: "outdated", entered: make(chan struct{}), release: make(chan struct{})}
	p := commitstatus.NewPublisher(h, quick)
	run(t, p)
	postBulk(t, p, "outdated")
	poll.Until(t, "the Bulk post under way", func() (bool, string) {
		select {
		case <-h.entered:
			return true, ""
		default:
			return false, "not sent yet"
		}
	})
	if err := p.Submit(commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Failure, Description: "newest"}, commitstatus.Submission{Lane: commitstatus.Urgent}); err != nil {
		t.Fatal(err)
	}
	close(h.release)
	settle(t, p)
	if n, got := h.count(commit, "flotilla/a"), h.latestOf(commit, "flotilla/a"); n != 2 || got.Description != "newest" {
		t.Fatalf("%d posts, the forge shows %q; want both posted, the newest last", n, got.Description)
	}
}

// A status superseded while it waits its turn within the forge's limits is not posted:
// the newer one goes instead, in that turn, and the forge sees one post, not an outdated
// one first.
func TestAStatusSupersededWhileItWaitsItsTurnGoesAsTheNewerOneInThatTurn(t *testing.T) {
	m, clock, p := pacedPublisher(t)
	// The commit's statuses are read at once; the post waits a second.
	postBulk(t, p, "outdated")
	waiting(t, clock, "the first post waiting its turn")
	postBulk(t, p, "newest")
	clock.Step(time.Second)
	settle(t, p)
	if n, got := m.count(commit, "flotilla/a"), m.latestOf(commit, "flotilla/a"); n != 1 || got.Description != "newest" {
		t.Fatalf("%d posts, the newest %q; want one, the newest status", n, got.Description)
	}
}

// A newer status handed over to a post that then fails goes back to the queue and is
// posted after all: it was the newest, and would have waited there had it not been
// handed over.
func TestAStatusHandedOverToAPostThatFailsIsPostedAfterAll(t *testing.T) {
	m, clock, p := pacedPublisher(t)
	postBulk(t, p, "outdated")
	waiting(t, clock, "the first post waiting its turn")
	postBulk(t, p, "newest")
	// The newest goes in the first one's turn, and the forge refuses it for good.
	m.mu.Lock()
	m.fail = []error{errors.New("the forge is down")}
	m.mu.Unlock()
	clock.Step(time.Second)
	waiting(t, clock, "the newest waiting its turn again")
	clock.Step(time.Second)
	settle(t, p)
	if got := m.latestOf(commit, "flotilla/a"); got.Description != "newest" {
		t.Fatalf("the forge shows %q, want the newest status", got.Description)
	}
}

// A status submitted again faster than the forge's limits let it go, as the fleet's
// summary is at every agent's report in a large fleet, goes at each turn as its newest
// form: by the time its turn comes it has always been submitted again, and it must not
// be dropped for that.
func TestAStatusSubmittedAgainFasterThanItsTurnsComeGoesAtEachTurn(t *testing.T) {
	m, clock, p := pacedPublisher(t)
	const reports = 50 // five seconds of a report every 100 ms
	for i := 1; i <= reports; i++ {
		st := commitstatus.Status{Context: "flotilla/fleet", State: commitstatus.Pending, Description: fmt.Sprintf("%d of 10,000 clusters ready", i)}
		if err := p.Submit(commit, st, commitstatus.Submission{Lane: commitstatus.Urgent}); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, "the summary waiting its turn or posted", func() (bool, string) {
			return clock.HasWaiters() || p.Pending() == 0, fmt.Sprintf("%d to post", p.Pending())
		})
		clock.Step(100 * time.Millisecond)
	}
	// One read and a post a second, over five seconds.
	if n := m.count(commit, "flotilla/fleet"); n < 4 {
		t.Fatalf("the summary was posted %d times in five seconds at one request a second; want at least 4", n)
	}
	clock.Step(time.Second)
	settle(t, p)
	if got := m.latestOf(commit, "flotilla/fleet"); got.Description != fmt.Sprintf("%d of 10,000 clusters ready", reports) {
		t.Fatalf("the forge shows %q, not the newest summary", got.Description)
	}
}

// A full queue drops its oldest Bulk status, never an Urgent one while Bulk ones wait.
func TestAFullQueueDropsItsOldestBulkStatus(t *testing.T) {
	m := newMemory(0)
	opts := quick
	opts.MaxQueued = 3
	p := commitstatus.NewPublisher(m, opts)
	submit := func(context string, lane commitstatus.Lane) {
		if err := p.Submit(commit, commitstatus.Status{Context: context, State: commitstatus.Pending}, commitstatus.Submission{Lane: lane}); err != nil {
			t.Fatal(err)
		}
	}
	submit("flotilla/urgent", commitstatus.Urgent)
	submit("flotilla/b1", commitstatus.Bulk)
	submit("flotilla/b2", commitstatus.Bulk)
	submit("flotilla/b3", commitstatus.Bulk)
	if n := p.Dropped(); n != 1 {
		t.Errorf("Dropped() = %d, want 1", n)
	}
	run(t, p)
	settle(t, p)
	for context, want := range map[string]int{"flotilla/urgent": 1, "flotilla/b1": 0, "flotilla/b2": 1, "flotilla/b3": 1} {
		if n := m.count(commit, context); n != want {
			t.Errorf("%s posted %d times, want %d", context, n, want)
		}
	}
}

func TestSubmitRefusesInvalidStatuses(t *testing.T) {
	p := commitstatus.NewPublisher(newMemory(0), quick)
	for _, st := range []commitstatus.Status{{Context: "c", State: "running"}, {State: commitstatus.Pending}} {
		if err := p.Submit(commit, st, commitstatus.Submission{}); err == nil {
			t.Errorf("Submit(%+v) = nil, want an error", st)
		}
	}
}

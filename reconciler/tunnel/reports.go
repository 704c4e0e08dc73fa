package tunnel

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
)

// ReportBudget bounds, per tunnel, the agent's messages that make the hub write: its
// apply reports and its inventories, each a status patch of its WorkerCluster and a
// refresh of its commit statuses, on the request rate every tenant's clusters share. An
// agent sends one of each per desired state it applies; one that alternates two reports
// would otherwise flip WorkerConfigured as fast as its link carries them. Heartbeats
// are not counted (they write status.lastSeen at most once per LastSeenEvery), nor
// credential confirmations (each answers one rotation the hub started).
//
// Reports over the budget are not lost but coalesced: the newest of each kind waits
// and is recorded, in one write, when the budget has room again. An agent that keeps
// sending more than twice its budget runs out of Patience and is disconnected; its
// WorkerCluster says so (Connected False, TooManyReports).
type ReportBudget struct {
	// PerMinute is the sustained rate of reports recorded as they come. Default 60.
	PerMinute float64
	// Burst is how many may come at once. Default 60.
	Burst int
	// Patience is how many reports over the budget an agent may send, net of what the
	// budget's own rate forgives, before it is disconnected. Default 600.
	Patience int
}

func (b ReportBudget) withDefaults() ReportBudget {
	if b.PerMinute <= 0 {
		b.PerMinute = 60
	}
	if b.Burst <= 0 {
		b.Burst = 60
	}
	if b.Patience <= 0 {
		b.Patience = 600
	}
	return b
}

func (b ReportBudget) String() string {
	return fmt.Sprintf("%g reports a minute, %d at once", b.PerMinute, b.Burst)
}

// reports is a session's budget and the reports waiting for it.
type reports struct {
	budget ReportBudget
	// allowed refills at the budget's rate; patience at the same rate, and takes a
	// token for each report over the budget.
	allowed, patience *rate.Limiter

	mu sync.Mutex
	// waiting are the newest report of each kind over the budget, by kind.
	waiting map[string]conditions.Fact
	timer   *time.Timer
	flooded bool
}

func newReports(b ReportBudget, now time.Time) *reports {
	b = b.withDefaults()
	every := rate.Limit(b.PerMinute / 60)
	r := &reports{budget: b, allowed: rate.NewLimiter(every, b.Burst), patience: rate.NewLimiter(every, b.Patience), waiting: map[string]conditions.Fact{}}
	// Limiters start full at their first use; anchoring them at the session's start
	// keeps an injected clock's time, not the wall clock's, for every later call.
	r.allowed.AllowN(now, 0)
	r.patience.AllowN(now, 0)
	return r
}

// report records f, a report of kind, when the budget allows, with the newest waiting
// report of every other kind; otherwise it keeps f as the newest of its kind, and
// disconnects the agent when its patience ran out.
func (s *session) report(ctx context.Context, kind string, f conditions.Fact) error {
	r := s.reports
	now := s.srv.opts.Now()
	r.mu.Lock()
	if r.allowed.AllowN(now, 1) {
		facts := r.take(kind)
		r.mu.Unlock()
		return s.record(ctx, append(facts, f)...)
	}
	r.waiting[kind] = f
	if r.timer == nil {
		r.timer = time.AfterFunc(r.wait(now), func() { s.flushReports(ctx) })
	}
	flood := !r.patience.AllowN(now, 1) && !r.flooded
	if flood {
		r.flooded = true
	}
	r.mu.Unlock()
	if flood {
		s.log.Warn("disconnecting the agent: it keeps sending reports over its budget", "budget", r.budget.String(), "patience", r.budget.Patience)
		_ = s.tunnel.Close()
	}
	return nil
}

// flushReports records the waiting reports once the budget has room for one write.
func (s *session) flushReports(ctx context.Context) {
	r := s.reports
	now := s.srv.opts.Now()
	r.mu.Lock()
	r.timer = nil
	if len(r.waiting) == 0 || r.flooded {
		r.mu.Unlock()
		return
	}
	if !r.allowed.AllowN(now, 1) {
		r.timer = time.AfterFunc(r.wait(now), func() { s.flushReports(ctx) })
		r.mu.Unlock()
		return
	}
	facts := r.take("")
	r.mu.Unlock()
	if err := s.record(ctx, facts...); err != nil {
		s.log.Error("recording the agent's reports", "error", err)
	}
}

// take empties the waiting reports but the one of kind, which a newer one replaces.
// Call with r.mu held.
func (r *reports) take(kind string) []conditions.Fact {
	var facts []conditions.Fact
	for _, k := range slices.Sorted(maps.Keys(r.waiting)) {
		if k != kind {
			facts = append(facts, r.waiting[k])
		}
	}
	clear(r.waiting)
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	return facts
}

// wait is how long until the budget has room for one report. Call with r.mu held.
func (r *reports) wait(now time.Time) time.Duration {
	res := r.allowed.ReserveN(now, 1)
	d := res.DelayFrom(now)
	res.CancelAt(now)
	return max(d, time.Millisecond)
}

// drain is what waits when the tunnel ends: the newest reports of an agent that was
// disconnected for flooding, or that hung up before the budget had room for them,
// go with the record of its disconnection.
func (r *reports) drain() []conditions.Fact {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.take("")
}

// wasFlooded reports whether the hub closed the tunnel for reports over the budget.
func (r *reports) wasFlooded() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.flooded
}

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
// WorkerCluster says so (Connected False, TooManyReports). The budget is the
// identity's, kept across its tunnels, and its redials are refused until it has a tenth
// of its Patience back: a loop of redials and floods writes nothing. An agent that
// redeems a new enrollment token starts afresh.
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

// reportLimiters are an identity's budget, kept across its tunnels: an agent
// disconnected for its reports does not get its budget back by redialling. allowed
// refills at the budget's rate; patience at the same rate, and takes a token for each
// report over the budget.
type reportLimiters struct {
	allowed, patience *rate.Limiter
}

func newReportLimiters(b ReportBudget, now time.Time) *reportLimiters {
	every := rate.Limit(b.PerMinute / 60)
	l := &reportLimiters{allowed: rate.NewLimiter(every, b.Burst), patience: rate.NewLimiter(every, b.Patience)}
	// Limiters start full at their first use; anchoring them now keeps an injected
	// clock's time, not the wall clock's, for every later call.
	l.allowed.AllowN(now, 0)
	l.patience.AllowN(now, 0)
	return l
}

// reportLimiters is the identity's budget; a fresh one when fresh is set (an agent
// that redeemed a new enrollment token is a new agent).
func (s *Server) reportLimiters(identity string, fresh bool) *reportLimiters {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.reportBudgets[identity]
	if l == nil || fresh {
		l = newReportLimiters(s.opts.Reports, s.opts.Now())
		s.reportBudgets[identity] = l
	}
	return l
}

// cooling reports whether the identity's agent was disconnected for its reports and
// has yet to earn back a tenth of its patience: until then its redials are refused, so
// that a loop of redials and floods costs the hub cluster no write.
func (s *Server) cooling(identity string) bool {
	s.mu.Lock()
	l := s.reportBudgets[identity]
	s.mu.Unlock()
	if l == nil {
		return false
	}
	return l.patience.TokensAt(s.opts.Now()) < max(float64(s.opts.Reports.Patience)/10, 1)
}

// reports is a session's budget and the reports waiting for it.
type reports struct {
	budget ReportBudget
	*reportLimiters

	mu sync.Mutex
	// waiting are the newest report of each kind over the budget, by kind.
	waiting map[string]conditions.Fact
	timer   *time.Timer
	flooded bool
}

func newReports(b ReportBudget, l *reportLimiters) *reports {
	return &reports{budget: b, reportLimiters: l, waiting: map[string]conditions.Fact{}}
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

package commitstatus

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/utils/clock"
)

// Lane is how urgent a status is. The Publisher posts every Urgent one it may before
// any Bulk one, and keeps a reserve of the forge's budget that only Urgent ones spend,
// so that a fleet-wide wave of statuses never delays the status of a single change.
type Lane int

const (
	// Urgent is for the statuses of a change that touches few clusters, the fleet's
	// summary and pull requests' plans: few at a time, and waited for by a person.
	Urgent Lane = iota
	// Bulk is for the per-cluster statuses of a change that touches many.
	Bulk
)

func (l Lane) String() string {
	if l == Bulk {
		return "bulk"
	}
	return "urgent"
}

// resetMargin is how long after a stated reset the budget is taken as renewed: the
// forge's clock and the hub's differ, and a request sent a moment early is refused.
const resetMargin = time.Second

// ErrHeld is returned when the forge's limits hold a request longer than its caller
// waits.
var ErrHeld = errors.New("status: the forge's rate limits hold requests")

// minRate is the slowest a refused forge is ever asked at: one request a minute.
const minRate = 1.0 / 60

// pacer decides when the next request to the forge may go.
//
// With a stated budget (GitHub on every answer; GitLab once it refused a request), the
// Bulk lane spreads what is left beyond the reserve evenly over the time until the reset,
// so that a long wave neither exhausts the budget early nor is refused; the Urgent lane
// goes at once while the budget lasts beyond the reserve, and spreads the reserve
// otherwise. Requests started since the answer that stated the budget are counted off
// it, since the forge may not have counted them yet.
//
// Without one, requests go at the configured rate (none: as fast as the forge answers)
// until the forge refuses one. A refusal pauses every lane until the time the forge
// named; if it stated its limit, requests go at that rate from then on, and if it did
// not (a proxy in front of Gitea), at half the rate that was refused. A limit nobody
// stated may have been a moment's (a proxy's burst allowance, a forge under load), so
// that rate doubles every recoverAfter without a refusal, back to the configured one;
// with none configured, the limit is lifted once the rate passes the one refused.
//
// Write limits (GitHub's secondary limits on content creation) are token buckets that
// every status post takes from.
type pacer struct {
	clock   clock.Clock
	reserve float64 // share of a stated limit kept for the Urgent lane

	mu      sync.Mutex
	limits  Limits
	spent   int // requests started since the budget was stated
	running int // requests started and not finished
	last    time.Time
	paused  time.Time
	rate    float64 // requests per second without a stated budget; 0 for no limit
	// taught is the rate the last refusal that stated no limit left, 0 for none; it
	// holds from taughtFrom, the end of the pause that refusal asked for, doubling every
	// recoverAfter.
	taught     float64
	taughtFrom time.Time
	// renewed is when the stated budget is taken as renewed (see renewal).
	renewed time.Time
	writes  []*rate.Limiter
	// urgent counts the Urgent requests waiting: Bulk ones wait behind them.
	urgent int
	// changed is closed, and replaced, whenever a waiter's answer may have changed.
	changed chan struct{}
	// recent are the times of the last requests sent, oldest first, and since the time
	// of the last refusal: what was sent since measures the rate a refusal refused,
	// without the quiet before a burst.
	recent []time.Time
	since  time.Time
}

// recentRequests is how many of the last requests measure the rate a forge refused.
const recentRequests = 32

// recoverAfter is how long a rate taught by a refusal that stated no limit holds before
// it doubles.
const recoverAfter = 5 * time.Minute

// rateAt is the rate requests go at without a stated budget, at now; 0 for no limit.
// The caller holds p.mu.
func (p *pacer) rateAt(now time.Time) float64 {
	if p.taught == 0 {
		return p.rate
	}
	doublings := min(max(now.Sub(p.taughtFrom)/recoverAfter, 0), 32)
	r := p.taught * math.Pow(2, float64(doublings))
	switch {
	case p.rate > 0 && r >= p.rate:
		return p.rate
	case p.rate == 0 && doublings >= 2:
		// Twice the taught rate is the one refused; past it, the limit is gone.
		return 0
	}
	return r
}

func newPacer(c clock.Clock, reserve, r float64) *pacer {
	return &pacer{clock: c, reserve: reserve, rate: r, changed: make(chan struct{})}
}

// signal wakes every waiter to look again. The caller holds p.mu.
func (p *pacer) signal() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// reserveOf is the part of a stated limit only the Urgent lane spends: at least one.
func (p *pacer) reserveOf(limit int) int {
	return max(1, int(math.Ceil(float64(limit)*p.reserve)))
}

// renewal is when q's budget, stated at now, is taken as renewed on this machine's
// clock: resetMargin after the reset, and never more than a window after now. The
// forge's reset is never further than that on its own clock; a later one is this clock
// lagging the forge's, and a wait longer than the window could pass a caller's bound and
// give its status up.
func renewal(q Quota, now time.Time) time.Time {
	r := q.Reset.Add(resetMargin)
	if q.Window > 0 && r.After(now.Add(q.Window)) {
		return now.Add(q.Window)
	}
	return r
}

// delay is how long a request of lane must wait at now; blocked means it waits for the
// Urgent requests ahead of it, however long they take. The caller holds p.mu.
func (p *pacer) delay(lane Lane, write bool, now time.Time) (d time.Duration, blocked bool) {
	after := func(t time.Time) {
		if w := t.Sub(now); w > d {
			d = w
		}
	}
	after(p.paused)
	q := p.limits.Quota
	if reset := p.renewed; p.limits.Stated && now.Before(reset) {
		remaining := q.Remaining - p.spent
		reserve := p.reserveOf(q.Limit)
		usable := remaining
		if lane == Bulk {
			usable -= reserve
		}
		switch {
		case usable <= 0:
			after(reset)
		case lane == Bulk || remaining <= reserve:
			after(p.last.Add(reset.Sub(now) / time.Duration(usable)))
		}
	} else if r := p.rateAt(now); r > 0 {
		after(p.last.Add(time.Duration(float64(time.Second) / r)))
	}
	if write {
		for _, l := range p.writes {
			if tokens := l.TokensAt(now); tokens < 1 {
				after(now.Add(time.Duration((1 - tokens) / float64(l.Limit()) * float64(time.Second))))
			}
		}
	}
	return d, lane == Bulk && p.urgent > 0
}

// wait blocks until a request of lane may go, counts it as started and returns when;
// done must follow. A wait the forge's limits make longer than limit fails at once
// instead, and one that overtaken ends before the request may go fails with
// errOvertaken.
func (p *pacer) wait(ctx context.Context, lane Lane, write bool, limit time.Duration, overtaken <-chan struct{}) (time.Time, error) {
	queued := false
	defer func() {
		if queued {
			p.mu.Lock()
			p.urgent--
			p.signal()
			p.mu.Unlock()
		}
	}()
	for {
		p.mu.Lock()
		now := p.clock.Now()
		d, blocked := p.delay(lane, write, now)
		if !blocked && d <= 0 {
			p.start(write, now)
			p.mu.Unlock()
			return now, nil
		}
		select {
		case <-overtaken:
			p.mu.Unlock()
			return time.Time{}, errOvertaken
		default:
		}
		if !blocked && d > limit {
			p.mu.Unlock()
			return time.Time{}, fmt.Errorf("%w: %s, more than %s", ErrHeld, d.Round(time.Second), limit)
		}
		if lane == Urgent && !queued {
			queued = true
			p.urgent++
			p.signal()
		}
		changed := p.changed
		p.mu.Unlock()

		if blocked {
			d = -1
		}
		waitFor(ctx, p.clock, d, changed, overtaken)
		if err := ctx.Err(); err != nil {
			return time.Time{}, err
		}
	}
}

// start counts a request as sent. The caller holds p.mu.
func (p *pacer) start(write bool, now time.Time) {
	p.spent++
	p.running++
	if len(p.recent) == recentRequests {
		p.recent = append(p.recent[:0], p.recent[1:]...)
	}
	p.recent = append(p.recent, now)
	p.last = now
	if write {
		for _, l := range p.writes {
			l.AllowN(now, 1)
		}
	}
	p.signal()
}

// done records the end of a request that wait let go, with what the backend knows of
// the forge's limits since.
func (p *pacer) done(l Limits) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running--
	p.learn(l)
	p.signal()
}

// learn takes in a backend's limits. The caller holds p.mu.
func (p *pacer) learn(l Limits) {
	if l.Stated && (!p.limits.Stated || newer(l.Quota, p.limits.Quota)) {
		// The requests still under way may not be in the stated remainder.
		p.limits.Quota, p.limits.Stated, p.spent = l.Quota, true, p.running
		p.renewed = renewal(l.Quota, p.clock.Now())
		if q := l.Quota; q.Window > 0 {
			// What the forge is known to accept once this window is over; it replaces
			// whatever a refusal taught.
			p.rate = float64(q.Limit-p.reserveOf(q.Limit)) / q.Window.Seconds()
			p.taught = 0
		}
	}
	if len(l.Writes) != len(p.writes) {
		p.writes = p.writes[:0]
		for _, w := range l.Writes {
			if w.N > 0 && w.Per > 0 {
				// A bucket lets its depth go at once and then its rate; a depth of a
				// tenth of N and a rate of the rest per Per keep every window of Per
				// within N, burst included.
				burst := max(1, w.N/10)
				p.writes = append(p.writes, rate.NewLimiter(rate.Limit(float64(w.N-burst)/w.Per.Seconds()), burst))
			}
		}
	}
}

// newer reports whether q states the budget after cur did. Answers to Publishers
// sharing a Budget arrive through backends of their own, each with the newest it read:
// within one window (the same reset) the smaller remainder is the newer, and a later
// reset is a new window.
func newer(q, cur Quota) bool {
	if !q.Reset.Equal(cur.Reset) {
		return q.Reset.After(cur.Reset)
	}
	return q.Remaining < cur.Remaining
}

// refused records that the forge refused a request sent at sent for a rate limit and
// asked to wait for after: every lane pauses until then.
func (p *pacer) refused(after time.Duration, l Limits, sent time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	if until := now.Add(after); until.After(p.paused) {
		p.paused = until
	}
	stated := l.Stated && l.Quota.Window > 0
	p.learn(l)
	if sent.Before(p.since) {
		// Sent before the last refusal was learned, at the rate already halved for it.
		p.signal()
		return
	}
	if !stated {
		// A limit nobody stated: halve the rate that was refused, that of the requests
		// sent since the last refusal, up to the last recentRequests of them.
		sentSince := p.recent
		for len(sentSince) > 0 && sentSince[0].Before(p.since) {
			sentSince = sentSince[1:]
		}
		r := 0.0
		if len(sentSince) > 0 {
			r = float64(len(sentSince)) / max(now.Sub(sentSince[0]).Seconds(), 1)
		}
		if cur := p.rateAt(now); cur > 0 {
			r = min(r, cur)
		}
		p.taught = max(r/2, minRate)
		// The pause is no time at the taught rate.
		p.taughtFrom = p.paused
	}
	p.since = now
	p.signal()
}

// setLimits primes the pacer with a backend's limits before any request.
func (p *pacer) setLimits(l Limits) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.learn(l)
}

// waitFor returns when ctx ends, changed or overtaken is closed, or d has passed on c;
// a negative d waits for the others alone.
func waitFor(ctx context.Context, c clock.Clock, d time.Duration, changed, overtaken <-chan struct{}) {
	var fire <-chan time.Time
	if d >= 0 {
		t := c.NewTimer(d)
		defer t.Stop()
		fire = t.C()
	}
	select {
	case <-ctx.Done():
	case <-changed:
	case <-overtaken:
	case <-fire:
	}
}

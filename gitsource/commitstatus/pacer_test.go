package commitstatus

import (
	"net/http"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// The pacer's decisions at one instant, given what the forge stated.
func TestThePacerSpreadsTheBudgetAndKeepsAReserve(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	reset := now.Add(50 * time.Second)
	// The reset is taken with resetMargin: 51s from now.
	window := reset.Add(resetMargin).Sub(now)
	stated := func(limit, remaining int) Limits {
		return Limits{Stated: true, Quota: Quota{Limit: limit, Remaining: remaining, Reset: reset, Window: time.Hour}}
	}
	tests := []struct {
		name    string
		limits  Limits
		prime   func(p *pacer)
		lane    Lane
		write   bool
		want    time.Duration
		blocked bool
	}{
		{name: "the bulk lane spreads what is left beyond the reserve until the reset", limits: stated(100, 51), lane: Bulk,
			// A reserve of 5 of 100: 46 requests over 51 seconds.
			want: window / 46},
		{name: "the urgent lane goes at once while the budget lasts beyond the reserve", limits: stated(100, 51), lane: Urgent},
		{name: "the urgent lane spreads the reserve once only the reserve is left", limits: stated(100, 4), lane: Urgent, want: window / 4},
		{name: "the bulk lane waits for the reset once only the reserve is left", limits: stated(100, 5), lane: Bulk, want: window},
		{name: "requests sent since the forge stated its budget are counted off it", limits: stated(100, 10), lane: Bulk,
			prime: func(p *pacer) { p.spent = 5 }, want: window},
		{name: "a refusal pauses every lane for as long as the forge asked", limits: stated(100, 51), lane: Urgent,
			prime: func(p *pacer) { p.paused = now.Add(30 * time.Second) }, want: 30 * time.Second},
		{name: "past the reset, requests go at the rate the forge stated", limits: Limits{Stated: true, Quota: Quota{Limit: 600, Remaining: 0, Reset: now.Add(-time.Minute), Window: time.Minute}},
			lane: Bulk, want: time.Second * 60 / 570},
		{name: "a reset further than a window away is this clock lagging the forge's: a window's wait at most",
			limits: Limits{Stated: true, Quota: Quota{Limit: 100, Remaining: 0, Reset: now.Add(90 * time.Minute), Window: time.Hour}},
			lane:   Urgent, want: time.Hour},
		{name: "a forge that states nothing is asked at the configured rate", limits: Limits{}, lane: Bulk,
			prime: func(p *pacer) { p.rate = 4 }, want: 250 * time.Millisecond},
		{name: "the bulk lane waits behind an urgent request that waits", limits: stated(100, 51), lane: Bulk,
			prime: func(p *pacer) { p.urgent = 1 }, want: window / 46, blocked: true},
		// 11 per 100s: a burst of one, then one every 10s, never more than 11 in 100s.
		{name: "posts beyond a write limit's burst wait for it", limits: Limits{Writes: []Rate{{N: 11, Per: 100 * time.Second}}}, lane: Urgent, write: true,
			prime: func(p *pacer) { p.start(true, now) }, want: 10 * time.Second},
		{name: "reads are not held by a write limit", limits: Limits{Writes: []Rate{{N: 11, Per: 100 * time.Second}}}, lane: Urgent,
			prime: func(p *pacer) { p.start(true, now) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPacer(clocktesting.NewFakeClock(now), 0.05, 0)
			p.setLimits(tt.limits)
			if tt.prime != nil {
				tt.prime(p)
			}
			// The previous request went just now.
			p.last = now
			got, blocked := p.delay(tt.lane, tt.write, now)
			if got != tt.want || blocked != tt.blocked {
				t.Fatalf("delay = %s (blocked %v), want %s (blocked %v)", got, blocked, tt.want, tt.blocked)
			}
		})
	}
}

// A limit nobody stated (a proxy's 429 with Retry-After alone) halves the rate that was
// refused; a stated one is taken as it is.
func TestARefusalTeachesThePacerARate(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := clocktesting.NewFakeClock(now)
	p := newPacer(clock, 0.05, 0)
	for range 20 {
		p.start(false, now)
		p.done(Limits{})
	}
	clock.Step(2 * time.Second)
	p.refused(time.Second, Limits{}, now)
	if r := p.rateAt(clock.Now()); r != 5 {
		t.Fatalf("after 20 requests in 2s were refused, the rate is %v a second, want 5", r)
	}
	if d, _ := p.delay(Bulk, false, clock.Now()); d != time.Second {
		t.Fatalf("the refusal holds requests for %s, want the 1s asked", d)
	}
	// Another request sent before that refusal, refused too, says nothing new.
	p.refused(time.Second, Limits{}, now)
	if r := p.rateAt(clock.Now()); r != 5 {
		t.Fatalf("a refusal of a request sent before the last one halved the rate again, to %v", r)
	}
	clock.Step(time.Second)
	p.refused(time.Second, Limits{Stated: true, Quota: Quota{Limit: 120, Remaining: 0, Reset: clock.Now().Add(time.Minute), Window: time.Minute}}, clock.Now())
	if r := p.rateAt(clock.Now()); r != 114.0/60 {
		t.Fatalf("after a refusal stating 120 a minute, the rate is %v a second, want %v", r, 114.0/60)
	}
	clock.Step(time.Hour)
	if r := p.rateAt(clock.Now()); r != 114.0/60 {
		t.Fatalf("an hour after a refusal stating 120 a minute, the rate is %v a second, want it kept at %v", r, 114.0/60)
	}
}

// A rate a refusal taught without a stated limit may have been a moment's: it doubles
// every recoverAfter without another refusal, counted from the end of the pause the
// refusal asked for, back to the configured rate, or, with none, to no limit once past
// the rate refused. A wave that met a proxy's burst limit once does not go at half speed
// for good, and a long pause does not stand for time at the taught rate.
func TestARateARefusalTaughtRecovers(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	// refuse has n requests go, ten a second, and the forge refuse the last, asking
	// for pause: 10 a second, or the configured rate if lower, was too fast.
	refuse := func(p *pacer, clock *clocktesting.FakeClock, n int, pause time.Duration) {
		for range n {
			p.start(false, clock.Now())
			p.done(Limits{})
			clock.Step(100 * time.Millisecond)
		}
		p.refused(pause, Limits{}, clock.Now())
	}
	tests := []struct {
		name       string
		configured float64
		pause      time.Duration
		// want is the rate at the end of the pause and every recoverAfter after it.
		want []float64
	}{
		{name: "back to the configured rate", configured: 8, pause: time.Second, want: []float64{4, 8, 8}},
		{name: "with none configured, no limit once past the rate refused", pause: time.Second, want: []float64{5, 10, 0, 0}},
		{name: "a pause longer than recoverAfter is no time at the taught rate", pause: 2 * recoverAfter, want: []float64{5, 10, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := clocktesting.NewFakeClock(now)
			p := newPacer(clock, 0.05, tt.configured)
			refuse(p, clock, 20, tt.pause)
			clock.Step(tt.pause)
			for i, want := range tt.want {
				if got := p.rateAt(clock.Now()); got != want {
					t.Fatalf("%s after the pause, the rate is %v a second, want %v", time.Duration(i)*recoverAfter, got, want)
				}
				clock.Step(recoverAfter)
			}
		})
	}

	t.Run("a refusal while recovering halves the rate reached", func(t *testing.T) {
		clock := clocktesting.NewFakeClock(now)
		p := newPacer(clock, 0.05, 0)
		refuse(p, clock, 20, time.Second)
		clock.Step(time.Second + recoverAfter)
		// At 10 a second again, 40 requests in 4 seconds are refused.
		refuse(p, clock, 40, time.Second)
		clock.Step(time.Second)
		if got := p.rateAt(clock.Now()); got != 5 {
			t.Fatalf("after a refusal at 10 a second, the rate is %v, want 5", got)
		}
		clock.Step(recoverAfter)
		if got := p.rateAt(clock.Now()); got != 10 {
			t.Fatalf("%s after that refusal's pause, the rate is %v, want 10", recoverAfter, got)
		}
	})
}

// With this machine's clock two hours behind the forge's, the reset the forge names is
// three hours away here, though it is at most the forge's window (an hour) away. The
// wait ends a window after the budget was stated, not a window after every look at it:
// a cap that moved with the clock would hold every status for the three hours.
func TestALaggingClockWaitsAWindowAtMost(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := clocktesting.NewFakeClock(now)
	p := newPacer(clock, 0.05, 0)
	p.setLimits(Limits{Stated: true, Quota: Quota{Limit: 5000, Remaining: 0, Reset: now.Add(3 * time.Hour), Window: time.Hour}})
	for _, at := range []time.Duration{0, 30 * time.Minute, time.Hour} {
		if d, _ := p.delay(Urgent, false, now.Add(at)); d != time.Hour-at {
			t.Fatalf("%s after the budget was stated, a request waits %s, want %s", at, d, time.Hour-at)
		}
	}
}

func TestTheQuotaTrackerReadsTheForgesHeaders(t *testing.T) {
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	tests := []struct {
		name    string
		tracker *QuotaTracker
		answers []http.Header
		want    Quota
		stated  bool
	}{
		{"GitHub's budget on an answer", &QuotaTracker{Prefix: "X-RateLimit-", Window: time.Hour, Resource: "core"},
			[]http.Header{h("X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "4990", "X-RateLimit-Reset", "1800000000", "X-RateLimit-Resource", "core")},
			Quota{Limit: 5000, Remaining: 4990, Reset: time.Unix(1800000000, 0), Window: time.Hour}, true},
		{"another resource's budget is not the statuses'", &QuotaTracker{Prefix: "X-RateLimit-", Resource: "core"},
			[]http.Header{h("X-RateLimit-Limit", "30", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1800000000", "X-RateLimit-Resource", "search")},
			Quota{}, false},
		{"answers out of order: the smaller remainder of a window is the newer", &QuotaTracker{Prefix: "RateLimit-", Window: time.Minute},
			[]http.Header{
				h("RateLimit-Limit", "600", "RateLimit-Remaining", "3", "RateLimit-Reset", "1800000000"),
				h("RateLimit-Limit", "600", "RateLimit-Remaining", "7", "RateLimit-Reset", "1800000000"),
			},
			Quota{Limit: 600, Remaining: 3, Reset: time.Unix(1800000000, 0), Window: time.Minute}, true},
		{"a later reset is a new window", &QuotaTracker{Prefix: "RateLimit-"},
			[]http.Header{
				h("RateLimit-Limit", "600", "RateLimit-Remaining", "0", "RateLimit-Reset", "1800000000"),
				h("RateLimit-Limit", "600", "RateLimit-Remaining", "599", "RateLimit-Reset", "1800000060"),
			},
			Quota{Limit: 600, Remaining: 599, Reset: time.Unix(1800000060, 0)}, true},
		{"an answer without the headers states nothing", &QuotaTracker{Prefix: "RateLimit-"}, []http.Header{h("Retry-After", "30")}, Quota{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, a := range tt.answers {
				tt.tracker.Observe(a)
			}
			got, stated := tt.tracker.Quota()
			if got != tt.want || stated != tt.stated {
				t.Fatalf("Quota = %+v, %v; want %+v, %v", got, stated, tt.want, tt.stated)
			}
		})
	}
}

// Publishers sharing a Budget report what their own backends read: an older answer
// through one must not give back what a newer one through the other counted off.
func TestAnOlderStatementOfTheBudgetIsNotTakenBack(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	reset := now.Add(time.Hour)
	p := newPacer(clocktesting.NewFakeClock(now), 0.05, 0)
	steps := []struct {
		name          string
		remaining     int
		reset         time.Time
		wantRemaining int
	}{
		{"the first statement", 100, reset, 100},
		{"a newer one, with less left", 40, reset, 40},
		{"an older one, through the other backend", 90, reset, 40},
		{"a new window", 5000, reset.Add(time.Hour), 5000},
		{"the old window's, late", 10, reset, 5000},
	}
	for _, s := range steps {
		p.setLimits(Limits{Stated: true, Quota: Quota{Limit: 5000, Remaining: s.remaining, Reset: s.reset, Window: time.Hour}})
		if got := p.limits.Quota.Remaining; got != s.wantRemaining {
			t.Fatalf("after %s, the pacer takes %d as left, want %d", s.name, got, s.wantRemaining)
		}
	}
}

package commitstatus

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// A forge that states no budget (a proxy in front of Gitea) refuses a burst after the
// hub was quiet for an hour. The rate that was refused is the burst's, a hundred a
// second, and the pacer goes on at half of what it measures of it. Averaged since the
// first request, the quiet hour included, it would be one a minute (minRate), for good:
// a wave of a thousand statuses would take a thousand minutes.
func TestARefusalAfterAQuietHourHalvesTheBurstsRate(t *testing.T) {
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := clocktesting.NewFakeClock(start)
	p := newPacer(clock, 0.05, 0)
	// One status at start, then nothing for an hour.
	p.start(true, clock.Now())
	p.done(Limits{})
	clock.Step(time.Hour)
	// A wave: 100 requests within a second, the last refused.
	var sent time.Time
	for i := range 100 {
		sent = clock.Now()
		p.start(true, sent)
		p.done(Limits{})
		if i%10 == 9 {
			clock.Step(100 * time.Millisecond)
		}
	}
	p.refused(time.Second, Limits{}, sent)
	if r := p.rateAt(clock.Now()); r < 10 {
		t.Fatalf("after a burst of 100 requests a second was refused, the pacer goes on at %.4f requests a second (one every %s), want at least 10",
			r, time.Duration(float64(time.Second)/r).Round(time.Second))
	}
}

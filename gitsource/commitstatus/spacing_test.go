package commitstatus

import (
	"testing"
	"time"
)

// A summary on a head that stays, whose count moves every second and whose state flips
// every minute (clusters whose agents come and go), is kept current for days before the
// forge's cap on a context's statuses ends its posts; on a fresh commit its count goes
// every Every and a change of state at once.
func TestASummaryOnAHeadThatStaysOutlastsTheForgesCap(t *testing.T) {
	const every = 10 * time.Second
	if d := spacing(every, 1, true); d != every {
		t.Errorf("the second count of a commit waits %s, want Every (%s)", d, every)
	}
	if d := spacing(every, 1, false); d != 0 {
		t.Errorf("the first change of state of a commit waits %s, want none", d)
	}

	var now, last time.Duration
	n, state := 0, false
	for n < MaxPerContext {
		now += time.Second
		changed := now%time.Minute == 0
		if changed {
			state = !state
		}
		// The newest form waits for its turn; a flip back and forth meanwhile leaves
		// its state as the one shown.
		if n == 0 || now >= last+spacing(every, n, !changed) {
			n, last = n+1, now
		}
		if now > 30*24*time.Hour {
			break
		}
	}
	if now < 7*24*time.Hour {
		t.Errorf("the summary reached the forge's cap of %d after %s, want a week at least", MaxPerContext, now)
	}
	t.Logf("the cap of %d reached after %s", MaxPerContext, now.Round(time.Hour))
}

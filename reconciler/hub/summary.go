package hub

import (
	"context"
	"sync"
	"time"
)

// The fleet's summary is derived from every cluster's state (publishFleet), which costs
// time in proportion to the fleet. During a fleet-wide wave every agent's report
// refreshes its cluster; deriving the summary at each would cost the square of the
// fleet. A refresh asks for the summary instead, and one goroutine per source derives
// and posts it: at once when it was idle, then at most once per summaryCoalesce with
// the newest states, however many refreshes asked meanwhile.
//
// That goroutine is the only place the summary is derived: a sync that set a new head,
// a cluster's refresh, a decommission and dispatch all ask (publishFleetSoon), as a
// controller adds a key to its work queue. A request made while a derivation runs
// makes another one run after it, from the states as they are then; so the states a
// request follows are always derived, and what is derived last is posted last. Two
// derivations at once could not promise that: one that read the states before a
// cluster's last change could post its count after the one that read them after, and
// the commit would show the older count until the next change, which may never come.
// Every poll asks too, whether or not the head moved: a summary the forge refused is
// posted again within a poll.

// summaryCoalesce is the least time between two derivations of the fleet's summary.
const summaryCoalesce = 100 * time.Millisecond

// summaryWake holds at most one request for the fleet's summary; its zero value is
// ready for use.
type summaryWake struct {
	once sync.Once
	ch   chan struct{}
}

func (w *summaryWake) c() chan struct{} {
	w.once.Do(func() { w.ch = make(chan struct{}, 1) })
	return w.ch
}

// publishFleetSoon asks for the fleet's summary to be derived and posted; requests
// coalesce, and one made during a derivation is followed by another.
func (s *Source) publishFleetSoon() {
	select {
	case s.summary.c() <- struct{}{}:
	default:
	}
}

// runSummary derives and posts the fleet's summary whenever asked, one derivation at a
// time, until ctx ends.
func (s *Source) runSummary(ctx context.Context) {
	pause := time.NewTimer(summaryCoalesce)
	pause.Stop()
	defer pause.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.summary.c():
		}
		s.publishFleet(ctx)
		pause.Reset(summaryCoalesce)
		select {
		case <-ctx.Done():
			return
		case <-pause.C:
		}
	}
}

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
// coalesce.
func (s *Source) publishFleetSoon() {
	select {
	case s.summary.c() <- struct{}{}:
	default:
	}
}

// runSummary derives and posts the fleet's summary whenever asked, until ctx ends.
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

package agent

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// retrier runs the agent's one loop that applies and reports a desired state again
// while its components converge (Options.ComponentsRetry). Every desired state the hub
// sends takes the place of the loop, the same state again as much as a newer one: the
// hub sends its state again every five minutes and on every reconnect, and a loop
// started beside one still running would apply as often again with every resync, and
// one of an older state would report it after the newer. Only the tunnel's receive
// loop starts and stops it, one tunnel after the other: it needs no lock.
type retrier struct {
	// clock paces the loop; nil is the real clock.
	clock clock.Clock

	cancel context.CancelFunc // of the loop last started; nil when none was
	done   chan struct{}      // closed when that loop has returned
}

// start replaces the running loop with one that calls attempt once a period, until
// attempt says there is nothing more to wait for or ctx ends.
func (r *retrier) start(ctx context.Context, period time.Duration, attempt func(context.Context) (again bool)) {
	r.stop()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	r.cancel, r.done = cancel, done
	clk := r.clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	go func() {
		defer close(done)
		defer cancel()
		for {
			t := clk.NewTimer(period)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C():
			}
			// A stop that came as the timer fired wins: the state is being replaced.
			if ctx.Err() != nil || !attempt(ctx) {
				return
			}
		}
	}()
}

// stop ends the running loop and waits until it has returned, so that an attempt under
// way is reported before what replaces it is applied. The attempt's apply is not cut
// short: it runs to its end as every apply does.
func (r *retrier) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	<-r.done
	r.cancel, r.done = nil, nil
}

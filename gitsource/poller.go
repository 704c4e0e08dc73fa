package gitsource

import (
	"context"
	"math/rand/v2"
	"time"
)

// Poller runs a sync at an interval with jitter, and at once when triggered. Triggers
// that arrive while a sync runs coalesce into one more sync, so a burst of webhooks
// costs two fetches, not one per delivery.
type Poller struct {
	interval time.Duration
	jitter   float64
	sync     func(context.Context)
	trigger  chan struct{}
}

// NewPoller polls every interval, each wait stretched by up to jitter (0.1 = 10%) so
// that many hubs, or many fleet sources of one hub, do not fetch in step.
func NewPoller(interval time.Duration, jitter float64, sync func(context.Context)) *Poller {
	return &Poller{interval: interval, jitter: jitter, sync: sync, trigger: make(chan struct{}, 1)}
}

// Trigger asks for a sync as soon as possible. It never blocks.
func (p *Poller) Trigger() {
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

// Run syncs once at start and then until ctx ends.
func (p *Poller) Run(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-p.trigger:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
		p.sync(ctx)
		timer.Reset(p.wait())
	}
}

func (p *Poller) wait() time.Duration {
	return p.interval + time.Duration(rand.Float64()*p.jitter*float64(p.interval))
}

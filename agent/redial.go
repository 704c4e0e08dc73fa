package agent

import (
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// DefaultBackoff paces an agent's dials when Options.Backoff is unset: 1 s doubling to
// 5 minutes, each wait lengthened at random by up to half of it, so that the agents of
// a hub that restarted do not all come back in the same second.
func DefaultBackoff() wait.Backoff {
	return wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.5, Steps: 1 << 30, Cap: 5 * time.Minute}
}

// Redial paces the dials of one agent through a backoff. It is exported so that a
// simulation of thousands of agents redials exactly as they would.
type Redial struct {
	base, next wait.Backoff
}

// NewRedial paces dials with b.
func NewRedial(b wait.Backoff) *Redial { return &Redial{base: b, next: b} }

// After is the wait before the next dial, once a tunnel (or a dial that failed) ended
// after lived. A tunnel that lived longer than the backoff's cap, or five minutes,
// starts the backoff afresh: a hub that restarts once a day finds its agents back
// within seconds, not at the longest wait.
func (r *Redial) After(lived time.Duration) time.Duration {
	if lived > r.base.Cap || lived > 5*time.Minute {
		r.next = r.base
	}
	return r.next.Step()
}

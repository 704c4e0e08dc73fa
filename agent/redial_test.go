package agent_test

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/flotilla-gitops/flotilla/agent"
)

func TestRedialWaitsLongerAfterEachShortTunnelAndAfreshAfterALongOne(t *testing.T) {
	// Without jitter the waits are exact.
	b := agent.DefaultBackoff()
	b.Jitter = 0
	r := agent.NewRedial(b)
	for _, step := range []struct {
		lived time.Duration
		want  time.Duration
	}{
		{0, time.Second},
		{time.Second, 2 * time.Second},
		{time.Minute, 4 * time.Second},
		{time.Minute, 8 * time.Second},
		{6 * time.Minute, time.Second},
		{0, 2 * time.Second},
	} {
		if got := r.After(step.lived); got != step.want {
			t.Fatalf("after a tunnel of %s: wait %s, want %s", step.lived, got, step.want)
		}
	}
	for range 20 {
		r.After(0)
	}
	if got := r.After(0); got != 5*time.Minute {
		t.Fatalf("after many short tunnels: wait %s, want the cap, 5m0s", got)
	}
}

func TestRedialJittersUpToHalfAgain(t *testing.T) {
	// Agents dropped together by a hub that restarted must not come back together.
	seen := map[time.Duration]bool{}
	for range 100 {
		d := agent.NewRedial(agent.DefaultBackoff()).After(0)
		if d < time.Second || d > 1500*time.Millisecond {
			t.Fatalf("first wait %s, want between 1s and 1.5s", d)
		}
		seen[d] = true
	}
	if len(seen) < 50 {
		t.Fatalf("100 agents' first waits took only %d values", len(seen))
	}
}

func TestRedialOfACustomBackoffResetsAfterItsCap(t *testing.T) {
	r := agent.NewRedial(wait.Backoff{Duration: time.Second, Factor: 2, Steps: 10, Cap: 30 * time.Second})
	r.After(0)
	r.After(0)
	if got := r.After(31 * time.Second); got != time.Second {
		t.Fatalf("after a tunnel longer than the cap: wait %s, want 1s", got)
	}
}

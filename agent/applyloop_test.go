package agent_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/flotilla-gitops/flotilla/agent"
	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// kueueComingUp is an applier whose Kueue never answers, as while its webhooks come up;
// it records the hashes it applied.
type kueueComingUp struct {
	mu      sync.Mutex
	applied []string
}

func (c *kueueComingUp) Apply(_ context.Context, st protocol.DesiredState) protocol.Applied {
	c.mu.Lock()
	c.applied = append(c.applied, st.Hash)
	c.mu.Unlock()
	return protocol.Applied{Generation: st.Generation, Hash: st.Hash, Results: []protocol.ObjectResult{}, Components: []components.Status{
		{Component: components.Kueue, Version: "v0.17.0", Action: components.ActionInstalled, Message: "waiting for kueue v0.17.0 to answer: its webhook does not answer"},
		{Component: components.JobSet, Version: "v0.11.1", Action: components.ActionInstalled, Ready: true},
	}}
}

func (c *kueueComingUp) applies() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.applied)
}

// reports follows the agent's reports of applied states, as the hub reads them.
type reports struct {
	mu          sync.Mutex
	hashes      []string
	generations []int64
}

func (r *reports) follow(ht *hubTunnel) {
	go func() {
		for m := range ht.msgs {
			if a, ok := m.(*protocol.Applied); ok {
				r.mu.Lock()
				r.hashes = append(r.hashes, a.Hash)
				r.generations = append(r.generations, a.Generation)
				r.mu.Unlock()
			}
		}
	}()
}

// lastGeneration is the generation of the last report, 0 before any: states of one
// hash sent again are told apart by it.
func (r *reports) lastGeneration() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.generations) == 0 {
		return 0
	}
	return r.generations[len(r.generations)-1]
}

func (r *reports) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.hashes) == 0 {
		return ""
	}
	return r.hashes[len(r.hashes)-1]
}

// The hub sends its whole state again every five minutes and on every reconnect. While
// Kueue or JobSet are coming up, the agent applies and reports the state the hub sent
// last once every retry period, however many states the hub sent: one loop retries, not
// one per state.
func TestOneLoopRetriesTheLatestStateWhileComponentsConverge(t *testing.T) {
	const every = 30 * time.Second
	tests := []struct {
		name string
		sent []string // the hashes of the states the hub sends, in turn
	}{
		{"a state sent once", []string{"sha256:a"}},
		{"the same state sent again at each resync", []string{"sha256:a", "sha256:a", "sha256:a"}},
		{"a newer state", []string{"sha256:a", "sha256:b"}},
		{"a state sent again after a newer one", []string{"sha256:a", "sha256:b", "sha256:a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := startHub(t, storedCredential)
			w := newWorker(t, storedCredential, expiry)
			applier := &kueueComingUp{}
			clk := clocktesting.NewFakeClock(expiry.Add(-24 * time.Hour))
			runAgent(t, h, w, clk.Now(), "", &logtest.Buffer{}, func(o *agent.Options) {
				o.Applier, o.Clock, o.ComponentsRetry = applier, clk, every
			})
			ht := h.next(t)
			var got reports
			got.follow(ht)

			for i, hash := range tt.sent {
				if err := ht.conn.Send(protocol.TypeDesired, &protocol.DesiredState{Generation: int64(i + 1), Hash: hash, Components: &components.Spec{Managed: true}}); err != nil {
					t.Fatal(err)
				}
			}
			last := tt.sent[len(tt.sent)-1]
			// The agent may skip a state a newer one replaced before its turn: what
			// counts is that the last is reported, and one loop waits to retry it. The
			// generation tells the last sent from an earlier one of the same hash.
			poll.Until(t, "the last state reported and one retry loop waiting", func() (bool, string) {
				return got.last() == last && got.lastGeneration() == int64(len(tt.sent)) && clk.Waiters() == 1,
					fmt.Sprintf("last report %q of generation %d, %d retry loops wait", got.last(), got.lastGeneration(), clk.Waiters())
			})
			settled := len(applier.applies())
			for round := 1; round <= 3; round++ {
				clk.Step(every)
				want := settled + round
				// The loop waits again once its attempt is reported: then nothing is under way.
				poll.Until(t, fmt.Sprintf("retry %d applied and waiting again", round), func() (bool, string) {
					n := len(applier.applies())
					return n == want && clk.Waiters() == 1, fmt.Sprintf("%d applies of %d, %d retry loops wait", n, want, clk.Waiters())
				})
			}
			if retried := applier.applies()[settled:]; !slices.Equal(retried, []string{last, last, last}) {
				t.Errorf("applied %v after the hub sent %v and three retry periods passed; want %s three times", retried, tt.sent, last)
			}
		})
	}
}

// heldApply is an applier whose applies wait until released, as against a worker API
// server that is slow to answer.
type heldApply struct {
	started chan string
	release chan struct{}
}

func (h *heldApply) Apply(ctx context.Context, st protocol.DesiredState) protocol.Applied {
	h.started <- st.Hash
	<-h.release
	return protocol.Applied{Generation: st.Generation, Hash: st.Hash, Results: []protocol.ObjectResult{}}
}

// An apply can take minutes (Options.ApplyTimeout): meanwhile the agent still reads what
// the hub sends, and answers a rotation of its credential, rather than leave the hub's
// writes to fill the tunnel's window and time out.
func TestTheAgentAnswersTheHubWhileAnApplyIsUnderWay(t *testing.T) {
	h := startHub(t, storedCredential)
	w := newWorker(t, storedCredential, expiry)
	applier := &heldApply{started: make(chan string, 4), release: make(chan struct{})}
	runAgent(t, h, w, expiry.Add(-24*time.Hour), "", &logtest.Buffer{}, func(o *agent.Options) { o.Applier = applier })
	ht := h.next(t)
	if err := ht.conn.Send(protocol.TypeDesired, &protocol.DesiredState{Generation: 1, Hash: "sha256:a"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-applier.started:
	case <-time.After(poll.Deadline):
		t.Fatal("the agent did not start applying the desired state")
	}
	defer close(applier.release)

	if err := ht.conn.Send(protocol.TypeRotateCredential, &protocol.RotateCredential{Credential: rotatedCredential, ExpiresAt: expiry.Add(90 * 24 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if m, ok := ht.answer(t).(*protocol.CredentialStored); !ok {
		t.Errorf("the agent answered the rotation with %T, want CredentialStored", m)
	}
}

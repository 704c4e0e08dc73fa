package agent

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
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
	return append([]string(nil), c.applied...)
}

// The hub sends its whole state again every five minutes and on every reconnect. While
// Kueue or JobSet are coming up, each state it sends takes the place of the loop that
// retries the last one: one loop retries, whatever the hub sent before, and it retries
// the state the hub sent last.
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
			applier := &kueueComingUp{}
			a, err := New(Options{
				HubURL: "wss://hub.example", Identity: "4-acme-gpu-a", Client: fake.NewClientBuilder().Build(), Applier: applier,
				CredentialSecret: types.NamespacedName{Namespace: "flotilla-system", Name: "flotilla-agent-credential"}, ComponentsRetry: every,
			})
			if err != nil {
				t.Fatal(err)
			}
			clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			a.retry.clock = clk
			t.Cleanup(a.retry.stop)
			// The reports go nowhere: what counts here is what is applied.
			conn := protocol.NewConn(struct {
				io.Reader
				io.Writer
			}{strings.NewReader(""), io.Discard})

			for i, hash := range tt.sent {
				if err := a.handle(t.Context(), conn, &protocol.DesiredState{Generation: int64(i + 1), Hash: hash, Components: &components.Spec{Managed: true}}); err != nil {
					t.Fatal(err)
				}
			}
			poll.Until(t, "one retry loop waiting", func() (bool, string) {
				return clk.Waiters() == 1, fmt.Sprintf("%d retry loops wait", clk.Waiters())
			})
			for round := 1; round <= 3; round++ {
				clk.Step(every)
				want := len(tt.sent) + round
				// The loop waits again once its attempt is reported: then nothing is under way.
				poll.Until(t, fmt.Sprintf("retry %d applied and waiting again", round), func() (bool, string) {
					return len(applier.applies()) == want && clk.Waiters() == 1, fmt.Sprintf("%d applies, %d retry loops wait", len(applier.applies()), clk.Waiters())
				})
			}
			got := applier.applies()
			retried := got[len(tt.sent):]
			last := tt.sent[len(tt.sent)-1]
			if !slices.Equal(retried, []string{last, last, last}) {
				t.Errorf("applied %v after the hub sent %v and three retry periods passed; want %s three times", retried, tt.sent, last)
			}
		})
	}
}

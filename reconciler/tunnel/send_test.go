package tunnel_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
)

// bigState is a desired state of about size bytes, well over a stream's window.
func bigState(generation int64, size int) *protocol.DesiredState {
	obj := json.RawMessage(fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"filler"},"data":{"x":%q}}`, strings.Repeat("x", 8<<10)))
	ds := &protocol.DesiredState{Generation: generation, Hash: fmt.Sprintf("sha256:%064d", generation)}
	for range size / len(obj) {
		ds.Objects = append(ds.Objects, obj)
	}
	return ds
}

// applier is a protocol-level agent that applies nothing and acknowledges every state
// whole, recording the generations it received in order.
type applier struct {
	mu          sync.Mutex
	generations []int64
}

func (a *applier) run(p *peer) {
	for {
		_, body, err := p.conn.Receive()
		if err != nil {
			if protocol.Recoverable(err) {
				continue
			}
			return
		}
		if ds, ok := body.(*protocol.DesiredState); ok {
			a.mu.Lock()
			a.generations = append(a.generations, ds.Generation)
			a.mu.Unlock()
			if err := p.conn.Send(protocol.TypeApplied, &protocol.Applied{Generation: ds.Generation, Hash: ds.Hash}); err != nil {
				return
			}
		}
	}
}

func (a *applier) received() []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]int64(nil), a.generations...)
}

func TestAnAgentThatStopsReadingIsDisconnectedWithoutHoldingUpTheOthers(t *testing.T) {
	h := startHub(t, nil, func(o *tunnel.Options) { o.WriteTimeout = 5 * time.Second })
	good := []*cluster{newCluster(t, "good-a"), newCluster(t, "good-b")}
	stuck := newCluster(t, "stuck")
	all := append([]*cluster{stuck}, good...)
	for _, c := range all {
		h.srv.Push(c.key(), c.identity, bigState(1, 1<<10))
	}
	appliers := map[string]*applier{}
	for _, c := range good {
		a := &applier{}
		appliers[c.identity] = a
		go a.run(h.enroll(t, c))
	}
	// The stuck agent says hello and never reads again: its stream's window fills with
	// the first large state, and nothing it is sent after that can be written.
	h.enroll(t, stuck)
	for _, c := range good {
		eventually(t, c.identity+" applied generation 1", func() (bool, string) {
			wc := c.wc(t)
			return wc.Status.AppliedHash == bigState(1, 0).Hash, "applied " + wc.Status.AppliedHash
		})
	}

	const last = 6
	pushed := make(chan error, 1)
	go func() {
		for gen := int64(2); gen <= last; gen++ {
			for _, c := range all {
				// The stuck agent first: a Push that waited for it would hold up the rest.
				if ok := h.srv.Push(c.key(), c.identity, bigState(gen, 512<<10)); !ok && c != stuck {
					pushed <- fmt.Errorf("Push(%s) of generation %d found no agent", c.identity, gen)
					return
				}
			}
		}
		// Every Push returned long before the write timeout could end the stuck
		// agent's tunnel: none of them waited for it.
		if !h.srv.Connected(stuck.identity) {
			pushed <- errors.New("the pushes returned only after the stuck agent was disconnected")
			return
		}
		pushed <- nil
	}()
	eventually(t, "every Push returned", func() (bool, string) {
		select {
		case err := <-pushed:
			if err != nil {
				t.Fatal(err)
			}
			return true, ""
		default:
			return false, "a Push is still waiting"
		}
	})

	for _, c := range good {
		a := appliers[c.identity]
		eventually(t, c.identity+" applied the last generation", func() (bool, string) {
			got := a.received()
			wc := c.wc(t)
			return len(got) > 0 && got[len(got)-1] == last && wc.Status.AppliedHash == bigState(last, 0).Hash,
				fmt.Sprintf("received %v, the hub has %s applied", got, wc.Status.AppliedHash)
		})
		// Newer states may replace ones not yet sent, but never arrive before them.
		got := a.received()
		for i := 1; i < len(got); i++ {
			if got[i] <= got[i-1] {
				t.Fatalf("%s received generations %v: not in order", c.identity, got)
			}
		}
	}

	eventually(t, "the stuck agent disconnected and recorded as such", func() (bool, string) {
		cond := condition(stuck.wc(t), v1alpha1.ConditionConnected)
		if cond == nil {
			return false, "no Connected condition"
		}
		return cond.Status == metav1.ConditionFalse && cond.Reason == v1alpha1.ReasonSendTimeout && !h.srv.Connected(stuck.identity),
			fmt.Sprintf("%s %s: %s", cond.Status, cond.Reason, cond.Message)
	})
	if msg := condition(stuck.wc(t), v1alpha1.ConditionConnected).Message; !strings.Contains(msg, "took nothing the hub sent for 5s") {
		t.Fatalf("the condition says %q, not why the agent was disconnected", msg)
	}
	if !strings.Contains(h.log.String(), "disconnecting the agent: it took nothing the hub sent") {
		t.Fatalf("the hub's log does not say why it disconnected the agent:\n%s", h.log.String())
	}
	for _, c := range good {
		if !h.srv.Connected(c.identity) {
			t.Fatalf("%s was disconnected too", c.identity)
		}
		if cond := condition(c.wc(t), v1alpha1.ConditionConnected); cond == nil || cond.Status != metav1.ConditionTrue {
			t.Fatalf("%s is recorded as %+v", c.identity, cond)
		}
	}
}

func TestAFirstMessageLargerThanAHelloClosesTheTunnel(t *testing.T) {
	// The hub waits long for a hello: the tunnel closing within the test's patience is
	// the size cap at work, not the handshake timeout.
	h := startHub(t, nil, func(o *tunnel.Options) { o.HandshakeTimeout = 10 * time.Minute })
	c := newCluster(t, "big-hello")
	enrolled := h.enroll(t, c)
	_ = enrolled.tunnel.Close()
	eventually(t, "the first tunnel gone", func() (bool, string) { return !h.srv.Connected(c.identity), "" })

	p := h.connect(t, request{identity: c.identity, kind: protocol.AuthCredential, secret: enrolled.credential}, false)
	frame := make([]byte, 4+1024)
	binary.BigEndian.PutUint32(frame, protocol.MaxHelloSize+1)
	// The hub may close the tunnel before this side learns that its write went out.
	_, _ = p.stream.Write(frame)
	closed := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, p.stream); closed <- err }()
	eventually(t, "the hub closed the tunnel", func() (bool, string) {
		select {
		case err := <-closed:
			closed <- err
			return true, ""
		default:
			return false, "still open"
		}
	})
	if err := <-closed; err != nil && !errors.Is(err, io.EOF) {
		t.Logf("the stream ended with %v", err)
	}
	if !strings.Contains(h.log.String(), "larger than a hello may be") {
		t.Fatalf("the hub's log does not say why it closed the tunnel:\n%s", h.log.String())
	}
	if h.srv.Connected(c.identity) {
		t.Fatal("the tunnel that sent no hello counts as connected")
	}
}

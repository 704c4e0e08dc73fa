package tunnel_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
)

// statusWrites counts the writes of each WorkerCluster's status, by name, that pass
// through its client.
type statusWrites struct {
	mu     sync.Mutex
	byName map[string]int
}

func (w *statusWrites) of(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.byName[name]
}

func countingStatusWrites(t *testing.T) (client.Client, *statusWrites) {
	t.Helper()
	w := &statusWrites{byName: map[string]int{}}
	cfg := rest.CopyConfig(planes[0].Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			parts := strings.Split(r.URL.Path, "/")
			if n := len(parts); (r.Method == http.MethodPatch || r.Method == http.MethodPut) && n > 3 && parts[n-1] == "status" && parts[n-3] == "workerclusters" {
				w.mu.Lock()
				w.byName[parts[n-2]]++
				w.mu.Unlock()
			}
			return rt.RoundTrip(r)
		})
	})
	c, err := client.New(cfg, client.Options{Scheme: admin().Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c, w
}

// An agent that alternates two reports, each of which flips WorkerConfigured, costs
// the hub cluster a bounded number of writes and is disconnected with a reason the
// operator sees; another agent's reports meanwhile are all recorded.
func TestAFloodingAgentCausesBoundedWritesAndIsDisconnected(t *testing.T) {
	c, writes := countingStatusWrites(t)
	budget := tunnel.ReportBudget{PerMinute: 0.001, Burst: 5, Patience: 20}
	h := startHub(t, nil, func(o *tunnel.Options) { o.Client, o.Reports = c, budget })
	flooder, quiet := newCluster(t, "flooder"), newCluster(t, "quiet")
	fp, qp := h.enroll(t, flooder), h.enroll(t, quiet)
	eventually(t, "both connections recorded", func() (bool, string) {
		for _, cl := range []*cluster{flooder, quiet} {
			if cond := condition(cl.wc(t), v1alpha1.ConditionConnected); cond == nil || cond.Status != metav1.ConditionTrue {
				return false, fmt.Sprintf("%s: Connected %+v", cl.name, cond)
			}
		}
		return true, ""
	})
	before := writes.of(flooder.name)

	// Each report is followed by a message the hub answers, in order, once it handled
	// the report: an agent that floods at the pace of the hub's writes, so that no
	// write takes in the next report.
	const flood = 200
	sent := make(chan int, 1)
	go func() {
		n := 0
		for i := range flood {
			report := &protocol.Applied{Generation: 1, Hash: "sha256:one"}
			if i%2 == 1 {
				report.Error = "the worker's API server is unreachable"
			}
			if fp.conn.Send(protocol.TypeApplied, report) != nil || fp.conn.Send("ping", nil) != nil {
				break // disconnected
			}
			if !answered(fp) {
				break
			}
			n++
		}
		sent <- n
	}()
	for _, hash := range []string{"sha256:a", "sha256:b", "sha256:c"} {
		if err := qp.conn.Send(protocol.TypeApplied, &protocol.Applied{Generation: 1, Hash: hash}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the quiet agent's report "+hash+" recorded", func() (bool, string) {
			got := quiet.wc(t).Status.AppliedHash
			return got == hash, "applied " + got
		})
	}
	eventually(t, "the flooder disconnected for its reports", func() (bool, string) {
		cond := condition(flooder.wc(t), v1alpha1.ConditionConnected)
		return cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == v1alpha1.ReasonTooManyReports, fmt.Sprintf("Connected %+v", cond)
	})
	n := <-sent
	t.Logf("%d alternating reports taken before the disconnection, %d writes of the flooder's status", n, writes.of(flooder.name)-before)
	if n > budget.Burst+budget.Patience+1 {
		t.Fatalf("the hub took %d reports over a budget of %d and a patience of %d", n, budget.Burst, budget.Patience)
	}
	// The budget's five, then the newest waiting report with the disconnection.
	if got := writes.of(flooder.name) - before; got > budget.Burst+1 {
		t.Fatalf("%d alternating reports cost %d writes of the flooder's status, want at most %d", n, got, budget.Burst+1)
	}
	if !strings.Contains(h.log.String(), "reports over its budget") {
		t.Fatalf("the hub's log does not say why it disconnected the flooder:\n%s", h.log.Last(2000))
	}
	// Redialling does not bring the budget back: the flooder is refused until it earned
	// some of its patience back, before anything is written.
	flooded := writes.of(flooder.name)
	ws, resp, err := h.dial(t.Context(), request{identity: flooder.identity, kind: protocol.AuthCredential, secret: fp.credential})
	if ws != nil {
		_ = ws.Close()
	}
	if resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the flooder's redial: %v (%v), want 429", resp, err)
	}
	if got := writes.of(flooder.name); got != flooded {
		t.Fatalf("the refused redial cost %d writes", got-flooded)
	}
	if h.srv.Connected(quiet.identity) != true {
		t.Fatal("the quiet agent was disconnected too")
	}
}

// Reports over the budget are coalesced, not lost: the newest is recorded once the
// budget has room again, and the agent stays connected.
func TestTheNewestReportOverTheBudgetIsRecordedWhenItHasRoom(t *testing.T) {
	h := startHub(t, nil, func(o *tunnel.Options) { o.Reports = tunnel.ReportBudget{PerMinute: 600, Burst: 1} })
	c := newCluster(t, "coalesced")
	p := h.enroll(t, c)
	for _, hash := range []string{"sha256:a", "sha256:b", "sha256:c", "sha256:d"} {
		if err := p.conn.Send(protocol.TypeApplied, &protocol.Applied{Generation: 1, Hash: hash}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the newest report recorded", func() (bool, string) {
		got := c.wc(t).Status.AppliedHash
		return got == "sha256:d", "applied " + got
	})
	if !h.srv.Connected(c.identity) {
		t.Fatal("an agent a little over its budget was disconnected")
	}
}

// answered waits for the hub's answer to a message of a type no agent sends; false when
// the tunnel ended first.
func answered(p *peer) bool {
	for {
		env, _, err := p.conn.Receive()
		if err != nil {
			return false
		}
		if env.Type == protocol.TypeError {
			return true
		}
	}
}

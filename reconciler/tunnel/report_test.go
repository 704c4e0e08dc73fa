package tunnel_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/test/heldpatch"
)

// A report the hub cluster refused once is recorded again, though the agent sends
// nothing more: a connection recorded only at hello would otherwise leave the cluster
// waiting for its agent, connected all along, until the agent reconnects.
func TestAReportTheHubClusterRefusedIsRecordedAgain(t *testing.T) {
	c := newCluster(t, "refused-once")
	plain, err := client.NewWithWatch(planes[0].Config, client.Options{Scheme: admin().Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Bool
	flaky := heldpatch.Refuse(plain, func(obj client.Object) error {
		wc, ok := obj.(*v1alpha1.WorkerCluster)
		if ok && wc.Name == c.name && condition(wc, v1alpha1.ConditionConnected) != nil && refused.CompareAndSwap(false, true) {
			return apierrors.NewServiceUnavailable("the hub cluster is restarting")
		}
		return nil
	})
	h := startHub(t, nil, func(o *tunnel.Options) { o.Client = flaky })
	h.enroll(t, c)
	eventually(t, "the hello's record refused", func() (bool, string) { return refused.Load(), "not yet" })
	eventually(t, "the connection recorded", func() (bool, string) {
		cond := condition(c.wc(t), v1alpha1.ConditionConnected)
		return cond != nil && cond.Status == metav1.ConditionTrue, fmt.Sprintf("Connected %+v", cond)
	})
}

// What an agent chose to send reaches the hub's log clipped: an agent must not write the
// hub's log at the rate of its link.
func TestAnAgentsTextReachesTheLogClipped(t *testing.T) {
	k := newCounted(t)
	h := startHub(t, k, nil)
	c := newCluster(t, "verbose")
	k.sees(t, c)
	p := h.enroll(t, c)
	long := strings.Repeat("x", 1<<20)
	before := len(h.log.String())
	for range 5 {
		if err := p.conn.Send(long, nil); err != nil {
			t.Fatal(err)
		}
		if err := p.conn.Send(protocol.TypeError, &protocol.Error{Code: long, Message: long}); err != nil {
			t.Fatal(err)
		}
		if err := p.conn.Send(protocol.TypeCredentialStored, &protocol.CredentialStored{Fingerprint: long}); err != nil {
			t.Fatal(err)
		}
	}
	// The hub answers each message of an unknown type, in order: the last answer comes
	// after it handled everything before.
	for answered := 0; answered < 5; {
		env, _, err := p.conn.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if env.Type == protocol.TypeError {
			answered++
		}
	}
	if grew := len(h.log.String()) - before; grew > 64<<10 {
		t.Fatalf("15 messages of 1 MiB of the agent's text wrote %d KiB to the hub's log", grew>>10)
	}
}

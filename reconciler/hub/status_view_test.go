package hub

import (
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/heldpatch"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// A cluster's commit status follows its agent's reports as they arrive, not once the
// hub cluster stored them: in a fleet-wide change the writes of ten thousand
// acknowledgements queue behind the hub's request budget for minutes, and the commit
// would stay pending all that while for clusters long configured.
func TestAnAcknowledgementIsPostedWhileItsWriteIsUnderWay(t *testing.T) {
	ctx := t.Context()
	plain, err := client.NewWithWatch(planes[0].Config, client.Options{Scheme: planes[0].Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	held := heldpatch.Wrap(plain)
	w := startWaveHubWriting(t, 1, DefaultSummaryThreshold, held)
	head := w.repo.Head("main")
	name := fleetgen.ClusterName(0)
	key := client.ObjectKey{Namespace: w.ns, Name: name}
	posted := func() (state, description string) {
		for _, r := range w.forge.Store.Latest(head) {
			if r.Context == "flotilla/"+name {
				return r.State, r.Description
			}
		}
		return "", ""
	}
	w.desiredRecorded(key)
	// What the tunnel records of an agent that redeemed its token and connected.
	wc := w.stored(key)
	now := time.Now()
	if _, err := w.status.Record(ctx, key,
		conditions.Redeemed{TokenHash: wc.Spec.EnrollmentTokenHash, At: now, Credential: "sha256:credential", ExpiresAt: now.Add(90 * 24 * time.Hour)},
		conditions.Connected{At: now, AgentVersion: "test", KubernetesVersion: "v1.37.0", Protocol: protocol.ProtocolVersion}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the cluster pending on its agent's apply", func() (bool, string) {
		state, desc := posted()
		return state == "pending" && strings.Contains(desc, "waiting for the agent to apply"), state + ": " + desc
	})

	release := held.Next(key)
	defer release()
	ack := conditions.Applied{Report: &protocol.Applied{Hash: wc.Status.DesiredHash, Generation: wc.Generation}, Sent: wc.Status.DesiredHash}
	recorded := make(chan error, 1)
	go func() {
		_, err := w.status.Record(ctx, key, ack)
		recorded <- err
	}()
	held.WaitStarted(t)
	poll.Until(t, "the cluster's status success while its write is held", func() (bool, string) {
		state, desc := posted()
		return state == "success", state + ": " + desc
	})
	if got := w.stored(key); got.Status.AppliedHash != "" {
		t.Fatalf("the held write was stored: applied %q", got.Status.AppliedHash)
	}
	release()
	if err := <-recorded; err != nil {
		t.Fatal(err)
	}
	if got := w.stored(key); got.Status.AppliedHash != wc.Status.DesiredHash {
		t.Errorf("once released, the stored status shows applied %q, want %q", got.Status.AppliedHash, wc.Status.DesiredHash)
	}
}

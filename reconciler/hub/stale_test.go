package hub

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/heldpatch"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// A restarted hub looks once for the agents a previous hub left connected and that did
// not come back, and shows them disconnected. The hub cluster refusing that write once
// must not leave the cluster connected, to an agent long gone, for good.
func TestAnAgentNotBackAfterARestartIsShownDisconnectedThoughTheWriteWasRefused(t *testing.T) {
	first, key := stoppedWithAnAgentConnected(t)

	plain, err := client.NewWithWatch(planes[0].Config, client.Options{Scheme: planes[0].Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Bool
	flaky := heldpatch.Refuse(plain, func(obj client.Object) error {
		if wc, ok := obj.(*v1alpha1.WorkerCluster); ok {
			c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionConnected)
			if c != nil && c.Status == metav1.ConditionFalse && refused.CompareAndSwap(false, true) {
				return apierrors.NewServiceUnavailable("the hub cluster is restarting")
			}
		}
		return nil
	})
	startWave(t, waveOptions{threshold: DefaultSummaryThreshold, writes: flaky, staleAfter: time.Second, restarts: first})
	poll.Until(t, "the restarted hub's record of the agent not back refused", func() (bool, string) {
		return refused.Load(), "not yet"
	})
	shownNotBack(t, first, key)
}

// The look for agents that did not come back lists the WorkerClusters once; a list the
// hub cluster refuses is tried again, or a restarted hub would show those clusters
// connected, to agents long gone, for good.
func TestAnAgentNotBackAfterARestartIsShownDisconnectedThoughTheListWasRefused(t *testing.T) {
	first, key := stoppedWithAnAgentConnected(t)
	// The first two lists of WorkerClusters are refused: the look's and the first
	// sync's, in whichever order they come.
	var refused atomic.Int32
	startWave(t, waveOptions{threshold: DefaultSummaryThreshold, staleAfter: time.Second, restarts: first, calls: &interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*v1alpha1.WorkerClusterList); ok && refused.Add(1) <= 2 {
				return apierrors.NewServiceUnavailable("the hub cluster is restarting")
			}
			return c.List(ctx, list, opts...)
		}}})
	poll.Until(t, "both lists refused", func() (bool, string) {
		return refused.Load() >= 2, fmt.Sprintf("%d refused", refused.Load())
	})
	shownNotBack(t, first, key)
}

// stoppedWithAnAgentConnected is a stopped hub of one cluster, whose WorkerCluster says
// its agent was connected, as the hub's tunnel records it.
func stoppedWithAnAgentConnected(t *testing.T) (*waveHub, client.ObjectKey) {
	t.Helper()
	first := startWaveHub(t, 1, DefaultSummaryThreshold)
	key := client.ObjectKey{Namespace: first.ns, Name: fleetgen.ClusterName(0)}
	first.desiredRecorded(key)
	if _, err := first.status.Record(t.Context(), key, conditions.Connected{At: time.Now().Add(-time.Minute), AgentVersion: "test",
		KubernetesVersion: "v1.37.0", Protocol: protocol.ProtocolVersion}); err != nil {
		t.Fatal(err)
	}
	first.stop()
	return first, key
}

// shownNotBack waits until the cluster key of w is shown disconnected, its agent not back
// since the hub restarted.
func shownNotBack(t *testing.T, w *waveHub, key client.ObjectKey) {
	t.Helper()
	poll.Until(t, "the cluster shown disconnected", func() (bool, string) {
		c := meta.FindStatusCondition(w.stored(key).Status.Conditions, v1alpha1.ConditionConnected)
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "has not connected since the hub restarted"),
			fmt.Sprintf("Connected %+v", c)
	})
}

// The look for agents that did not come back waits for nothing in the repository: a
// restarted hub whose first head it refuses shows them disconnected all the same.
func TestAnAgentNotBackAfterARestartIsShownDisconnectedThoughTheHeadIsRefused(t *testing.T) {
	first, key := stoppedWithAnAgentConnected(t)
	refused := first.commit("main", "another tenant's fleet", map[string][]byte{fleet.FleetFile: first.edit(fleet.FleetFile, "tenant: example", "tenant: someone-else")})

	startWave(t, waveOptions{threshold: DefaultSummaryThreshold, staleAfter: time.Second, restarts: first})
	poll.Until(t, "the head refused", func() (bool, string) {
		for _, r := range first.forge.Store.Latest(refused) {
			if r.Context == "flotilla/fleet" {
				return r.State == "failure", r.Description
			}
		}
		return false, "no summary yet"
	})
	shownNotBack(t, first, key)
}

// A repository that stops answering in the middle of a fetch fails that sync after
// FetchTimeout, and the next one applies the head: it does not hold the source's
// branch for good.
func TestABranchFetchThatHangsFailsItsSyncAndTheNextApplies(t *testing.T) {
	var hang atomic.Bool
	hang.Store(true)
	w := startWave(t, waveOptions{clusters: 1, threshold: DefaultSummaryThreshold, fetchTimeout: 2 * time.Second,
		stall: func([]byte) bool { return hang.Load() }})
	poll.Until(t, "the first fetch stalled", func() (bool, string) {
		return w.stalling.Stalls() > 0, "not yet"
	})
	hang.Store(false)
	key := client.ObjectKey{Namespace: w.ns, Name: fleetgen.ClusterName(0)}
	poll.Until(t, "the head applied", func() (bool, string) {
		// As a webhook would, until a sync runs that the stalled one no longer holds.
		w.src.Trigger()
		var wc v1alpha1.WorkerCluster
		if err := planes[0].Client.Get(t.Context(), key, &wc); err != nil {
			return false, err.Error()
		}
		return wc.Status.DesiredHash != "", "no desired state recorded"
	})
}

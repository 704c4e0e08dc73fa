package hub

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// A removed cluster whose agent stays away is decommissioned StaleAfter after its
// removal, however often the fleet changes meanwhile: every fleet-wide sync comes back
// to the removal, and must not start its wait over, or a fleet that changes more often
// than StaleAfter would keep the cluster, and its agent's credential, for good.
func TestARemovalIsDecommissionedInTimeWhileTheFleetKeepsChanging(t *testing.T) {
	const staleAfter = 2 * time.Second
	w := startWave(t, waveOptions{clusters: 2, threshold: DefaultSummaryThreshold, staleAfter: staleAfter})
	key := client.ObjectKey{Namespace: w.ns, Name: fleetgen.ClusterName(0)}
	w.desiredRecorded(key)

	removal := map[string][]byte{}
	for p := range w.files {
		if strings.HasPrefix(p, fleet.ClustersDir+"/"+key.Name+"/") {
			removal[p] = nil
		}
	}
	commits := []string{w.commit("main", "remove "+key.Name, removal)}
	w.src.Trigger()
	poll.Until(t, "the decommission begun", func() (bool, string) {
		a := w.stored(key).Annotations
		return a[v1alpha1.DecommissionAnnotation] != "", fmt.Sprintf("annotations %v", a)
	})

	// A fleet-wide change four times a StaleAfter, for five StaleAfters at most.
	tick := time.NewTicker(staleAfter / 4)
	defer tick.Stop()
	deadline := time.Now().Add(5 * staleAfter)
	for i := 0; ; i++ {
		var wc v1alpha1.WorkerCluster
		err := planes[0].Client.Get(t.Context(), key, &wc)
		if apierrors.IsNotFound(err) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the removed cluster is still there %s after its decommission began, %d fleet-wide changes later", 5*staleAfter, i)
		}
		commits = append(commits, w.commit("main", fmt.Sprintf("fleet-wide change %d", i), map[string][]byte{
			fleet.FleetFile: append(slices.Clone(w.files[fleet.FleetFile]), fmt.Sprintf("# change %d\n", i)...)}))
		w.src.Trigger()
		<-tick.C
	}
	// On the commit the sync that last came to the removal attributed it to.
	poll.Until(t, "the removal's status", func() (bool, string) {
		for _, c := range slices.Backward(commits) {
			for _, r := range w.forge.Store.Latest(c) {
				if r.Context == "flotilla/"+key.Name {
					return r.State == string(commitstatus.Success) && strings.Contains(r.Description, "the agent did not connect"), r.State + " " + r.Description
				}
			}
		}
		return false, "no status yet"
	})
}

// A report of a cluster read just before its decommission deleted it (an agent's last
// heartbeat, from a cache that has not seen the deletion yet) neither counts the cluster
// in the fleet's summary again nor posts over the status that says it was decommissioned.
func TestAReportReadBeforeADecommissionDoesNotBringTheClusterBack(t *testing.T) {
	w := startWave(t, waveOptions{clusters: 2, threshold: DefaultSummaryThreshold})
	key := client.ObjectKey{Namespace: w.ns, Name: fleetgen.ClusterName(0)}
	w.desiredRecorded(key)
	read := w.stored(key)

	changes := map[string][]byte{fleet.FleetFile: w.edit(fleet.FleetFile, "decommission: Prune", "decommission: Keep")}
	for p := range w.files {
		if strings.HasPrefix(p, fleet.ClustersDir+"/"+key.Name+"/") {
			changes[p] = nil
		}
	}
	removed := w.commit("main", "remove "+key.Name+", keeping what its worker holds", changes)
	w.src.Trigger()
	poll.Until(t, "the WorkerCluster deleted", func() (bool, string) {
		err := planes[0].Client.Get(t.Context(), key, &v1alpha1.WorkerCluster{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})

	// The refresh that read the cluster before its deletion comes to publish it.
	unlock := w.src.refreshLocks.lock(key.Name)
	w.src.publish(t.Context(), read)
	unlock()
	w.src.mu.Lock()
	_, counted := w.src.states[key.Name]
	w.src.mu.Unlock()
	if counted {
		t.Fatal("the decommissioned cluster is counted in the fleet's summary again")
	}
	// No agent runs here: the cluster left is pending, and the summary counts it alone.
	got := w.settled(removed, func(st commitstatus.Status) bool { return strings.Contains(st.Description, "0 of 1 clusters ready") })
	if r := got["flotilla/"+key.Name]; r.State != string(commitstatus.Success) || !strings.Contains(r.Description, "decommissioned") {
		t.Fatalf("the removal's commit shows %s %q for the cluster, want its decommission", r.State, r.Description)
	}
}

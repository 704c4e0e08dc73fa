package hub

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

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
	// On the removal's commit, which the fleet-wide changes since did not take over.
	poll.Until(t, "the removal's status", func() (bool, string) {
		for _, r := range w.forge.Store.Latest(commits[0]) {
			if r.Context == "flotilla/"+key.Name {
				return r.State == string(commitstatus.Success) && strings.Contains(r.Description, "the agent did not connect"), r.State + " " + r.Description
			}
		}
		return false, "no status yet"
	})
	for _, c := range commits[1:] {
		for _, r := range w.forge.Store.Latest(c) {
			if r.Context == "flotilla/"+key.Name {
				t.Errorf("the fleet-wide change %s shows %s %q for the removed cluster", c[:12], r.State, r.Description)
			}
		}
	}
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
	unlock := w.src.refreshLocks.Lock(key.Name)
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

// A decommission finishes under its cluster's lock, across the hub cluster's answers to
// the revocation and the deletion. Another cluster's status waits for none of that,
// whatever their names: here two whose names a lock of 64 shards picked by FNV-1a would
// put together.
func TestAClustersStatusDoesNotWaitForAnotherClustersDecommission(t *testing.T) {
	const clusters = 32
	a, b := sharingAShard(t, clusters)
	deleting, release := make(chan struct{}), make(chan struct{})
	w := startWave(t, waveOptions{clusters: clusters, threshold: DefaultSummaryThreshold, staleAfter: time.Second, calls: &interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if _, ok := obj.(*v1alpha1.WorkerCluster); ok && obj.GetName() == a {
				close(deleting)
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return c.Delete(ctx, obj, opts...)
		}}})
	t.Cleanup(sync.OnceFunc(func() { close(release) }))
	for _, name := range []string{a, b} {
		w.desiredRecorded(client.ObjectKey{Namespace: w.ns, Name: name})
	}

	// a's agent never came: StaleAfter after its removal, its decommission finishes
	// without it, and its deletion is held.
	removal := map[string][]byte{}
	for p := range w.files {
		if strings.HasPrefix(p, fleet.ClustersDir+"/"+a+"/") {
			removal[p] = nil
		}
	}
	w.commit("main", "remove "+a, removal)
	w.src.Trigger()
	select {
	case <-deleting:
	case <-time.After(poll.Deadline):
		t.Fatalf("the decommission of %s never deleted its WorkerCluster", a)
	}

	file := fleet.ClustersDir + "/" + b + "/" + fleet.ClusterFile
	cordoned := w.commit("main", "cordon "+b, map[string][]byte{file: w.edit(file, "cordoned: false", "cordoned: true")})
	w.src.Trigger()
	poll.Until(t, b+"'s status on its commit, while "+a+"'s deletion is held", func() (bool, string) {
		for _, r := range w.forge.Store.Latest(cordoned) {
			if r.Context == "flotilla/"+b {
				return true, ""
			}
		}
		return false, "not posted"
	})
}

// sharingAShard names two clusters of a fleet of n whose names share a shard of 64 by
// FNV-1a.
func sharingAShard(t *testing.T, n int) (string, string) {
	t.Helper()
	seen := map[uint32]string{}
	for i := range n {
		name := fleetgen.ClusterName(i)
		h := fnv.New32a()
		h.Write([]byte(name))
		if other, ok := seen[h.Sum32()%64]; ok {
			return other, name
		}
		seen[h.Sum32()%64] = name
	}
	t.Fatalf("no two of %d clusters share a shard", n)
	return "", ""
}

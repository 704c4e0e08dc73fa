package hub

import (
	"context"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// The record of a cluster's redeemed tokens is read from the hub cluster, past the
// cache, before its WorkerCluster first takes a token: a cluster added back with a token
// it redeemed before fails on its commit. A fleet-wide change reads none for clusters
// whose WorkerCluster holds its token already, registered or not: only their own agent
// can have redeemed it since, which their status shows. Thousands of clusters waiting
// for their agents would otherwise cost thousands of reads of each such change.
func TestAFleetWideChangeReadsNoRecordOfRedeemedTokensCheckedBefore(t *testing.T) {
	const clusters = 3
	var mu sync.Mutex
	var read []string
	w := startWave(t, waveOptions{clusters: clusters, threshold: DefaultSummaryThreshold, calls: &interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*corev1.Secret); ok {
				mu.Lock()
				read = append(read, key.Name)
				mu.Unlock()
			}
			return c.Get(ctx, key, obj, opts...)
		}}})
	records := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for i := range clusters {
			if slices.Contains(read, tunnel.RecordSecretName(fleetgen.ClusterName(i))) {
				n++
			}
		}
		read = nil
		return n
	}
	for i := range clusters {
		w.desiredRecorded(client.ObjectKey{Namespace: w.ns, Name: fleetgen.ClusterName(i)})
	}
	if n := records(); n != clusters {
		t.Fatalf("the first sync read the record of %d clusters' redeemed tokens, want each of the %d", n, clusters)
	}

	wide := w.commit("main", "a comment in fleet.yaml", map[string][]byte{fleet.FleetFile: append(slices.Clone(w.files[fleet.FleetFile]), "# every cluster\n"...)})
	w.src.Trigger()
	// No agent runs here: every cluster waits for its own.
	w.settled(wide, func(st commitstatus.Status) bool { return st.State == commitstatus.Pending && st.Description != "" })
	if n := records(); n != 0 {
		t.Fatalf("the fleet-wide change read the record of %d clusters' redeemed tokens again", n)
	}
}

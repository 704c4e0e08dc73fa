package scale

import (
	"strings"
	"testing"
	"time"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/forge"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// quiet is the realistic hub with status.lastSeen left alone for the test's length,
// so that every request counted is one a commit caused.
var quiet = hubProfile{QPS: realistic.QPS, Burst: realistic.Burst, AsServiceAccount: true, LastSeenEvery: time.Hour, MaxInFlight: realistic.MaxInFlight}

// What a commit costs the hub cluster is what it changed: nothing for a commit that
// changes no cluster's state (however much the hub re-reads and re-renders), and for
// each changed cluster one write of its status, which records the new desired state
// and its agent's acknowledgement together, after an update of its WorkerCluster when
// its spec changed. Nothing is read from the API server: the hub lists
// and reads from its cache. And no enrollment file is decrypted again: a hub decrypts
// each file's content once.
func TestACommitCostsTheHubClusterWhatItChangesAndNoMore(t *testing.T) {
	const clusters = 12
	w := newWorld(t, clusters, quiet)
	// The hub was started afresh on the fleet (newWorld's last step): the WorkerClusters
	// name the enrollment files their token hashes came from, so it decrypted none.
	if n := w.hub.dec.Decryptions(); n != 0 {
		t.Errorf("a hub started afresh on %d clusters it enrolled before decrypted %d enrollment files", clusters, n)
	}
	fleetFile := w.file(fleet.FleetFile)
	cordoned := fleetgen.ClusterName(3)
	clusterFile := fleet.ClustersDir + "/" + cordoned + "/" + fleet.ClusterFile
	presetFile := fleet.PresetsDir + "/gpu/queues.yaml"

	for _, tc := range []struct {
		name    string
		changes map[string][]byte
		// waitFor is the cluster whose status turns green on the commit, empty to
		// wait for the sync alone; all waits for every cluster to acknowledge.
		waitFor string
		all     bool
		writes  map[string]int
	}{
		{name: "a commit outside the clusters' inputs", changes: map[string][]byte{"README.md": []byte("nothing the hub reads\n")}},
		{name: "a fleet-wide commit that changes no cluster's state", changes: map[string][]byte{
			fleet.FleetFile: []byte(fleetFile + "# a comment re-reads and re-renders every cluster\n")}},
		{name: "a comment in a preset, which changes no cluster's state", changes: map[string][]byte{
			presetFile: []byte(w.file(presetFile) + "# a comment re-renders every cluster of the preset\n")}},
		// Its WorkerCluster's spec, and its status: the state sent, acknowledged.
		{name: "a commit that changes one cluster", waitFor: cordoned, writes: map[string]int{"update": 1, "patch": 1}, changes: map[string][]byte{
			clusterFile: []byte(strings.Replace(w.file(clusterFile), "cordoned: false", "cordoned: true", 1))}},
		// Each cluster's status alone: nothing of the WorkerClusters changed in Git.
		{name: "a fleet-wide commit that changes every cluster", all: true, writes: map[string]int{"patch": clusters}, changes: map[string][]byte{
			fleet.FleetFile: []byte(strings.Replace(fleetFile, "    - ml-training\n", "    - ml-training\n    - ml-serving\n", 1))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.hub.requests.waitQuiet(t, time.Second)
			before, decrypted, syncs := w.hub.requests.snapshot(), w.hub.dec.Decryptions(), w.hub.syncCount()
			desired := map[string]string{}
			for name, wc := range w.watch.snapshot() {
				desired[name] = wc.Status.DesiredHash
			}
			sha := w.commit(tc.name, tc.changes)
			w.hub.waitSync(t, syncs)
			if tc.waitFor != "" {
				waitStatus(t, w, sha, "flotilla/"+tc.waitFor, "success")
			}
			if tc.all {
				w.watch.waitAll(t, "every cluster configured at its new desired state", time.Minute, func(wc *v1alpha1.WorkerCluster) bool {
					return ready(wc) && wc.Status.DesiredHash != desired[wc.Name]
				})
			}
			got := w.hub.requests.snapshot().minus(before)
			for _, k := range []string{"get", "list", "create", "update", "patch", "delete"} {
				if got.by[k] != tc.writes[k] {
					t.Errorf("%d %s requests, want %d: %s", got.by[k], k, tc.writes[k], got)
				}
			}
			if t.Failed() {
				t.Logf("the latest requests:\n%s", w.hub.requests.recent())
			}
			if got.refused != 0 {
				t.Errorf("the hub cluster refused %d requests", got.refused)
			}
			if n := w.hub.dec.Decryptions() - decrypted; n != 0 {
				t.Errorf("%d enrollment files decrypted again", n)
			}
		})
	}
}

// waitStatus waits until the forge shows state for context on commit.
func waitStatus(t testing.TB, w *world, commit, context, state string) forge.Record {
	t.Helper()
	var got forge.Record
	poll.Until(t, context+" "+state+" on "+commit[:8], func() (bool, string) {
		for _, r := range w.forge.Store.Latest(commit) {
			if r.Context == context {
				got = r
				return r.State == state, r.State + ": " + r.Description
			}
		}
		return false, "no status"
	})
	return got
}

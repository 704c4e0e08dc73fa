package hub

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
)

// A draining worker holds every ClusterQueue and keeps every other object as it was:
// its running work goes on, and nothing new is admitted there.
func TestADrainHoldsEveryClusterQueueAndChangesNothingElse(t *testing.T) {
	ds := &protocol.DesiredState{Generation: 3, Hash: "sha256:live", Objects: []json.RawMessage{
		json.RawMessage(`{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"ml"}}`),
		json.RawMessage(`{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"ClusterQueue","metadata":{"name":"cq"},"spec":{"namespaceSelector":{}}}`),
		json.RawMessage(`{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"ClusterQueue","metadata":{"name":"other"}}`),
		json.RawMessage(`{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"LocalQueue","metadata":{"name":"eu","namespace":"ml"},"spec":{"clusterQueue":"cq"}}`),
	}, Dispatch: &protocol.Dispatch{Origin: "flotilla-hub", Namespaces: []string{"ml"}}}
	got := holding(ds)
	if got == nil || got.Hash == ds.Hash || got.Generation != ds.Generation || len(got.Objects) != len(ds.Objects) {
		t.Fatalf("held state %+v", got)
	}
	// The hub's Kueue follows the work already placed there to its end.
	if !got.Dispatch.Equal(ds.Dispatch) {
		t.Errorf("the held state lets the hub's Kueue reach %+v, want %+v", got.Dispatch, ds.Dispatch)
	}
	for i, raw := range got.Objects {
		s := string(raw)
		if strings.Contains(s, `"ClusterQueue"`) != strings.Contains(s, `"stopPolicy":"Hold"`) {
			t.Errorf("object %d: %s", i, s)
		}
		if !strings.Contains(s, `"ClusterQueue"`) && s != string(ds.Objects[i]) {
			t.Errorf("object %d changed: %s", i, s)
		}
	}
	if again := holding(ds); again.Hash != got.Hash {
		t.Error("holding the same state twice gives two hashes")
	}
	if holding(nil) != nil || holding(&protocol.DesiredState{Decommission: true}) != nil {
		t.Error("held a state that is not there")
	}
}

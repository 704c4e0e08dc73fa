package conditions

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// configuredWorker is a registered, connected worker that applied the current state,
// speaking the given protocol.
func configuredWorker(protocolVersion int32) *v1alpha1.WorkerCluster {
	wc := hashes("h1", "h1")(enrolled(worker("Connected=True/TunnelUp", "WorkerConfigured=True/Applied")))
	wc.Status.Agent = &v1alpha1.AgentInfo{Version: "v1", ProtocolVersion: protocolVersion}
	return wc
}

func placed(p v1alpha1.DispatchPlacement, active *v1alpha1.KueueCondition) func(*v1alpha1.WorkerCluster) *v1alpha1.WorkerCluster {
	return func(wc *v1alpha1.WorkerCluster) *v1alpha1.WorkerCluster {
		Placed{Pool: "eu", Placement: p, Withdrawn: wc.Spec.Cordoned}.record(wc)
		KueueJudged{Active: active}.record(wc)
		return wc
	}
}

func cordoned(wc *v1alpha1.WorkerCluster) *v1alpha1.WorkerCluster {
	wc.Spec.Cordoned = true
	return wc
}

// notWithdrawn is a cordon the hub's Kueue does not yet reflect.
func notWithdrawn(wc *v1alpha1.WorkerCluster) *v1alpha1.WorkerCluster {
	wc.Status.Dispatch.Withdrawn = false
	return wc
}

var (
	activeTrue  = &v1alpha1.KueueCondition{Status: metav1.ConditionTrue, Reason: "Active", Message: "Connected"}
	activeFalse = &v1alpha1.KueueCondition{Status: metav1.ConditionFalse, Reason: "ClientConnectionFailed", Message: "no matches for kind \"JobSet\""}
)

// TestDispatchReady pins when the hub's Kueue may send work to a cluster, and when the
// cluster's commit says it is as Git declares it.
func TestDispatchReady(t *testing.T) {
	tests := []struct {
		name string
		wc   *v1alpha1.WorkerCluster
		// dispatch is DispatchReady's status/reason; state the commit status's.
		dispatch string
		state    commitstatus.State
		says     string
	}{
		{"a hub without its proxy does not claim dispatch, and Ready is enough", configuredWorker(2),
			"Unknown/MultiKueueNotConfigured", commitstatus.Success, "ready"},
		{"a member that Kueue judges Active is dispatchable", placed(v1alpha1.PlacementMember, activeTrue)(configuredWorker(2)),
			"True/Dispatchable", commitstatus.Success, "dispatchable"},
		{"a member Kueue has not judged waits for it", placed(v1alpha1.PlacementMember, nil)(configuredWorker(2)),
			"False/AwaitingKueue", commitstatus.Pending, "waiting for the hub's Kueue"},
		{"Kueue's reason and message are carried through", placed(v1alpha1.PlacementMember, activeFalse)(configuredWorker(2)),
			"False/ClientConnectionFailed", commitstatus.Pending, `no matches for kind "JobSet"`},
		{"a cordoned cluster that holds is done, and not dispatchable", placed(v1alpha1.PlacementMember, activeTrue)(cordoned(configuredWorker(2))),
			"False/Cordoned", commitstatus.Success, "cordoned"},
		{"a cordon the hub still counts the quota of is not done", notWithdrawn(placed(v1alpha1.PlacementMember, activeTrue)(cordoned(configuredWorker(2)))),
			"False/Cordoned", commitstatus.Pending, "waiting for the hub's Kueue to stop counting its quota"},
		{"a cordon not yet applied is not done", reportOf(1)(placed(v1alpha1.PlacementMember, activeTrue)(cordoned(configuredWorker(2)))),
			"False/OutdatedGeneration", commitstatus.Pending, "waiting for the agent to apply generation 2"},
		{"a cluster over its pool's limit says how to declare pools", placed(v1alpha1.PlacementPoolFull, nil)(configuredWorker(2)),
			"False/PoolFull", commitstatus.Pending, "spec.dispatch.pools"},
		{"a fleet without dispatch is done when configured", placed(v1alpha1.PlacementDisabled, nil)(configuredWorker(2)),
			"False/DispatchDisabled", commitstatus.Success, "ready"},
		{"an agent without the API proxy is told to upgrade, and stays connected", placed(v1alpha1.PlacementMember, nil)(configuredWorker(1)),
			"False/AgentTooOld", commitstatus.Pending, "upgrade the agent"},
		{"a disconnected member waits for its agent", placed(v1alpha1.PlacementMember, activeTrue)(hashes("h1", "h1")(enrolled(worker("Connected=False/TunnelDown", "WorkerConfigured=True/Applied")))),
			"False/TunnelDown", commitstatus.Pending, ""},
		{"a draining cluster takes no new work", placed(v1alpha1.PlacementDraining, activeTrue)(configuredWorker(2)),
			"False/Draining", commitstatus.Pending, "waiting for the work placed on it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			Derive(tt.wc, at)
			c := meta.FindStatusCondition(tt.wc.Status.Conditions, v1alpha1.ConditionDispatchReady)
			if got := string(c.Status) + "/" + c.Reason; got != tt.dispatch {
				t.Errorf("DispatchReady %s (%s), want %s", got, c.Message, tt.dispatch)
			}
			st := CommitStatus("flotilla/gpu-a", tt.wc)
			if st.State != tt.state || !strings.Contains(st.Description, tt.says) {
				t.Errorf("commit status %s %q, want %s saying %q", st.State, st.Description, tt.state, tt.says)
			}
		})
	}
}

func TestPlacementElsewhereDropsKueuesJudgement(t *testing.T) {
	wc := placed(v1alpha1.PlacementMember, activeTrue)(configuredWorker(2))
	Placed{Pool: "eu", Placement: v1alpha1.PlacementPoolFull}.record(wc)
	if wc.Status.Dispatch.Active != nil {
		t.Fatal("a cluster out of its pool keeps the judgement of a MultiKueueCluster it no longer has")
	}
}

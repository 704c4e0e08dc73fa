package dispatch

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// Kueue is asked to try a worker again at once only when the agent connected after
// Kueue found the worker unreachable: then what Kueue failed on is gone.
func TestKueueTriesAgainOnlyForAnAgentBackSinceItsJudgement(t *testing.T) {
	judged, before, after := metav1.NewTime(t0), metav1.NewTime(t0.Add(-time.Minute)), metav1.NewTime(t0.Add(time.Minute))
	unreachable := &v1alpha1.KueueCondition{Status: metav1.ConditionFalse, Reason: "ClientConnectionFailed", LastTransitionTime: judged}
	worker := func(placement v1alpha1.DispatchPlacement, active *v1alpha1.KueueCondition, connected metav1.ConditionStatus, since metav1.Time) *v1alpha1.WorkerCluster {
		wc := &v1alpha1.WorkerCluster{}
		wc.Status.Dispatch = &v1alpha1.DispatchStatus{Pool: "eu", Placement: placement, Active: active}
		if connected != "" {
			wc.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionConnected, Status: connected, LastTransitionTime: since}}
		}
		return wc
	}
	for _, tc := range []struct {
		name string
		wc   *v1alpha1.WorkerCluster
		want string
	}{
		{"an agent back after Kueue found its worker unreachable", worker(v1alpha1.PlacementMember, unreachable, metav1.ConditionTrue, after), after.UTC().Format(time.RFC3339)},
		{"an agent back in the second Kueue judged", worker(v1alpha1.PlacementMember, unreachable, metav1.ConditionTrue, judged), judged.UTC().Format(time.RFC3339)},
		{"a draining cluster's agent back", worker(v1alpha1.PlacementDraining, unreachable, metav1.ConditionTrue, after), after.UTC().Format(time.RFC3339)},
		{"an agent connected before Kueue's judgement: not what Kueue failed on", worker(v1alpha1.PlacementMember, unreachable, metav1.ConditionTrue, before), ""},
		{"an agent still away", worker(v1alpha1.PlacementMember, unreachable, metav1.ConditionFalse, after), ""},
		{"no word of the agent yet", worker(v1alpha1.PlacementMember, unreachable, "", metav1.Time{}), ""},
		{"Kueue reaches the worker", worker(v1alpha1.PlacementMember, &v1alpha1.KueueCondition{Status: metav1.ConditionTrue, LastTransitionTime: judged}, metav1.ConditionTrue, after), ""},
		{"Kueue has not judged yet", worker(v1alpha1.PlacementMember, nil, metav1.ConditionTrue, after), ""},
		{"a judgement with no time, as an older hub recorded it", worker(v1alpha1.PlacementMember, &v1alpha1.KueueCondition{Status: metav1.ConditionFalse}, metav1.ConditionTrue, after), ""},
		{"a cluster no pool holds", worker(v1alpha1.PlacementPoolFull, unreachable, metav1.ConditionTrue, after), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := redialFor(tc.wc)
			if ok != (tc.want != "") || got != tc.want {
				t.Errorf("redialFor = %q, %t; want %q", got, ok, tc.want)
			}
		})
	}
}

package conditions

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// CommitStatus is what the cluster's context says on its source commit: failure when
// its directory does not validate or the worker refused or failed the desired state;
// success when the cluster is as Git declares it: Ready and, where the hub dispatches,
// dispatchable, or cordoned with its worker holding; pending otherwise, saying what
// it waits for.
func CommitStatus(context string, wc *v1alpha1.WorkerCluster) commitstatus.Status {
	st := commitstatus.Status{Context: context}
	ready := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionReady)
	configured := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionWorkerConfigured)
	dispatch := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionDispatchReady)
	isReady := ready != nil && ready.Status == metav1.ConditionTrue
	dispatches := wc.Status.Dispatch != nil && wc.Status.Dispatch.Placement != v1alpha1.PlacementDisabled
	switch {
	case wc.Annotations[v1alpha1.InvalidAnnotation] != "":
		st.State, st.Description = commitstatus.Failure, wc.Annotations[v1alpha1.InvalidAnnotation]
	case isReady && !dispatches:
		st.State, st.Description = commitstatus.Success, ready.Message
	case isReady && dispatch != nil && dispatch.Status == metav1.ConditionTrue:
		st.State, st.Description = commitstatus.Success, ready.Message+" · dispatchable"
	case isReady && dispatch != nil && dispatch.Reason == v1alpha1.ReasonCordoned && wc.Status.Dispatch.Withdrawn:
		// Configured at the current generation, so its ClusterQueue holds, and the hub
		// no longer counts its quota: what the cordon asked for is done.
		st.State, st.Description = commitstatus.Success, "cordoned · "+ready.Message
	case isReady && dispatch != nil:
		st.State, st.Description = commitstatus.Pending, dispatch.Message
	case configured != nil && configured.Status == metav1.ConditionFalse && configured.Reason != v1alpha1.ReasonOutdated && configured.Reason != v1alpha1.ReasonComponentsConverging:
		st.State, st.Description = commitstatus.Failure, configured.Message
	case ready != nil:
		st.State, st.Description = commitstatus.Pending, ready.Message
	default:
		st.State, st.Description = commitstatus.Pending, "waiting for the hub"
	}
	return st
}

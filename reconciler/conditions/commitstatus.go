package conditions

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// CommitStatus is what the cluster's context says on its source commit: failure when
// its directory does not validate or the worker refused or failed the desired state,
// success when it is Ready, pending otherwise.
func CommitStatus(context string, wc *v1alpha1.WorkerCluster) commitstatus.Status {
	st := commitstatus.Status{Context: context}
	ready := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionReady)
	configured := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionWorkerConfigured)
	switch {
	case wc.Annotations[v1alpha1.InvalidAnnotation] != "":
		st.State, st.Description = commitstatus.Failure, wc.Annotations[v1alpha1.InvalidAnnotation]
	case ready != nil && ready.Status == metav1.ConditionTrue:
		st.State, st.Description = commitstatus.Success, ready.Message
	case configured != nil && configured.Status == metav1.ConditionFalse && configured.Reason != v1alpha1.ReasonOutdated:
		st.State, st.Description = commitstatus.Failure, configured.Message
	case ready != nil:
		st.State, st.Description = commitstatus.Pending, ready.Message
	default:
		st.State, st.Description = commitstatus.Pending, "waiting for the hub"
	}
	return st
}

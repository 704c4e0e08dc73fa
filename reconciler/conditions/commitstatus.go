package conditions

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// CommitStatus is what the cluster's context says on its source commit: failure when
// its directory does not validate, the worker refused or failed the desired state, or
// the agent's credential expired; success when the cluster is as Git declares it:
// Ready and, where the hub dispatches, dispatchable, or cordoned with its worker
// holding; pending otherwise, saying what it waits for.
//
// A credential in the last third of its lifetime (CredentialCurrent False, its
// rotations failing) leads the description, whatever the state: a cluster that still
// takes work stays green, since failing it would mark a commit that broke nothing and
// count a working cluster as down in the fleet's summary, but the warning is the first
// thing anyone reading the commit sees, weeks before the agent is locked out. Once the
// credential expired the status fails: only a new enrollment token brings the agent
// back.
func CommitStatus(context string, wc *v1alpha1.WorkerCluster) commitstatus.Status {
	st := commitStatus(context, wc)
	if w := credentialWarning(wc); w != "" {
		st.Description = w + " · " + st.Description
	}
	return st
}

func commitStatus(context string, wc *v1alpha1.WorkerCluster) commitstatus.Status {
	st := commitstatus.Status{Context: context}
	ready := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionReady)
	configured := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionWorkerConfigured)
	dispatch := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionDispatchReady)
	isReady := ready != nil && ready.Status == metav1.ConditionTrue
	dispatches := wc.Status.Dispatch != nil && wc.Status.Dispatch.Placement != v1alpha1.PlacementDisabled
	switch {
	case wc.Annotations[v1alpha1.InvalidAnnotation] != "":
		st.State, st.Description = commitstatus.Failure, wc.Annotations[v1alpha1.InvalidAnnotation]
	case ready != nil && ready.Reason == v1alpha1.ReasonCredentialExpired:
		st.State, st.Description = commitstatus.Failure, ready.Message
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

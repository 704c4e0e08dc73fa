package componenttest

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The reasons the deployment controller gives its conditions (pkg/controller/deployment/util).
const (
	reasonNewRSAvailable     = "NewReplicaSetAvailable"
	reasonRSUpdated          = "ReplicaSetUpdated"
	reasonMinimumAvailable   = "MinimumReplicasAvailable"
	reasonMinimumUnavailable = "MinimumReplicasUnavailable"
)

// podCounts is what the Kubelet runs for a Deployment: a process of the current pod template
// (ready or not) and of an earlier one (ready), each at most one.
type podCounts struct {
	updated, updatedReady, old bool
	// hash is the current pod template's; message says why its process is not ready, when it
	// is not.
	hash, message string
}

// deploymentStatus is the status the deployment controller would write for the counts. The one
// process plays every replica of its template, so each count is spec.replicas or zero.
func deploymentStatus(dep *appsv1.Deployment, n podCounts) appsv1.DeploymentStatus {
	want := int32(1)
	if dep.Spec.Replicas != nil {
		want = *dep.Spec.Replicas
	}
	count := func(b bool) int32 {
		if b {
			return want
		}
		return 0
	}
	ready := count(n.updatedReady) + count(n.old)
	st := appsv1.DeploymentStatus{
		ObservedGeneration:  dep.Generation,
		Replicas:            count(n.updated) + count(n.old),
		UpdatedReplicas:     count(n.updated),
		ReadyReplicas:       ready,
		AvailableReplicas:   ready,
		UnavailableReplicas: max(0, want-ready),
	}
	now := metav1.Now()
	available, availableReason, availableMessage := corev1.ConditionTrue, reasonMinimumAvailable, "Deployment has minimum availability."
	if ready < want {
		available, availableReason, availableMessage = corev1.ConditionFalse, reasonMinimumUnavailable, "Deployment does not have minimum availability."
	}
	progressReason := reasonNewRSAvailable
	progressMessage := fmt.Sprintf("the manager of pod template %s is ready", n.hash)
	if want > 0 && (!n.updatedReady || n.old) {
		progressReason, progressMessage = reasonRSUpdated, fmt.Sprintf("rolling out pod template %s: %s", n.hash, n.message)
	}
	st.Conditions = []appsv1.DeploymentCondition{
		{Type: appsv1.DeploymentAvailable, Status: available, Reason: availableReason, Message: availableMessage, LastUpdateTime: now, LastTransitionTime: now},
		{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: progressReason, Message: progressMessage, LastUpdateTime: now, LastTransitionTime: now},
	}
	// Times move only when a condition does, as the deployment controller keeps them; an
	// unchanged status is then not written again.
	for i, c := range st.Conditions {
		for _, old := range dep.Status.Conditions {
			if old.Type == c.Type && old.Status == c.Status {
				st.Conditions[i].LastTransitionTime = old.LastTransitionTime
				if old.Reason == c.Reason && old.Message == c.Message {
					st.Conditions[i].LastUpdateTime = old.LastUpdateTime
				}
			}
		}
	}
	return st
}

// writeStatus writes the Deployment's status unless it already reads so.
func writeStatus(ctx context.Context, cs kubernetes.Interface, dep *appsv1.Deployment, n podCounts) error {
	st := deploymentStatus(dep, n)
	if equality.Semantic.DeepEqual(st, dep.Status) {
		return nil
	}
	dep = dep.DeepCopy()
	dep.Status = st
	_, err := cs.AppsV1().Deployments(dep.Namespace).UpdateStatus(ctx, dep, metav1.UpdateOptions{FieldManager: fieldManager})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Gone, or changed since it was read: the change brings the Deployment back to the
		// Kubelet, which writes the status again.
		return nil
	}
	if err != nil {
		return fmt.Errorf("writing the status of deployment %s/%s: %w", dep.Namespace, dep.Name, err)
	}
	return nil
}

package podrunner

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// The reasons the deployment controller gives its conditions (pkg/controller/deployment/util).
const (
	reasonNewRSAvailable     = "NewReplicaSetAvailable"
	reasonRSUpdated          = "ReplicaSetUpdated"
	reasonMinimumAvailable   = "MinimumReplicasAvailable"
	reasonMinimumUnavailable = "MinimumReplicasUnavailable"
)

// deploymentStatus is the status the deployment controller would write for a Deployment
// whose Pods of the current template are current and of earlier templates old.
func deploymentStatus(dep *appsv1.Deployment, hash string, current, old []*pod) appsv1.DeploymentStatus {
	want := ptr.Deref(dep.Spec.Replicas, 1)
	updatedReady := int32(readyCount(current))
	ready := updatedReady + int32(readyCount(old))
	st := appsv1.DeploymentStatus{
		ObservedGeneration:  dep.Generation,
		Replicas:            int32(len(current) + len(old)),
		UpdatedReplicas:     int32(len(current)),
		ReadyReplicas:       ready,
		AvailableReplicas:   ready,
		UnavailableReplicas: max(0, want-ready),
	}
	now := metav1.Now()
	available, availableReason, availableMessage := corev1.ConditionTrue, reasonMinimumAvailable, "Deployment has minimum availability."
	if ready < want-maxUnavailable(dep, want) {
		available, availableReason, availableMessage = corev1.ConditionFalse, reasonMinimumUnavailable, "Deployment does not have minimum availability."
	}
	progressReason, progressMessage := reasonNewRSAvailable, fmt.Sprintf("pod template %s has successfully progressed", hash)
	if updatedReady < want || len(old) > 0 {
		progressReason, progressMessage = reasonRSUpdated, fmt.Sprintf("%d of %d pods of the current template are ready", updatedReady, want)
	}
	st.Conditions = []appsv1.DeploymentCondition{
		{Type: appsv1.DeploymentAvailable, Status: available, Reason: availableReason, Message: availableMessage, LastUpdateTime: now, LastTransitionTime: now},
		{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: progressReason, Message: progressMessage, LastUpdateTime: now, LastTransitionTime: now},
	}
	// Times move only when a condition does, as the deployment controller keeps them; an
	// unchanged status is then not written again.
	for i, c := range st.Conditions {
		for _, o := range dep.Status.Conditions {
			if o.Type == c.Type && o.Status == c.Status {
				st.Conditions[i].LastTransitionTime = o.LastTransitionTime
				if o.Reason == c.Reason && o.Message == c.Message {
					st.Conditions[i].LastUpdateTime = o.LastUpdateTime
				}
			}
		}
	}
	return st
}

// maxUnavailable is how many Pods the Deployment's rolling update may have unavailable;
// zero for Recreate, whose Deployment is available only with all its Pods.
func maxUnavailable(dep *appsv1.Deployment, want int32) int32 {
	ru := dep.Spec.Strategy.RollingUpdate
	if dep.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType || ru == nil || ru.MaxUnavailable == nil {
		return 0
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, int(want), false)
	if err != nil {
		return 0
	}
	return int32(n)
}

// writeStatus writes the Deployment's status unless it already reads so.
func (r *Runner) writeStatus(ctx context.Context, dep *appsv1.Deployment, hash string, current, old []*pod) error {
	st := deploymentStatus(dep, hash, current, old)
	if equality.Semantic.DeepEqual(st, dep.Status) {
		return nil
	}
	dep = dep.DeepCopy()
	dep.Status = st
	_, err := r.cs.AppsV1().Deployments(dep.Namespace).UpdateStatus(ctx, dep, metav1.UpdateOptions{FieldManager: fieldManager})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Gone, or changed since it was read: the change brings the Deployment back to the
		// Runner, which writes the status again.
		return nil
	}
	if err != nil {
		return fmt.Errorf("writing the status of deployment %s/%s: %w", dep.Namespace, dep.Name, err)
	}
	return nil
}

package dispatchtest

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// StartJob writes the status the Job controller writes once the job's pod runs: a start
// time and one active, ready pod. No kubelet and no Job controller run on a test plane;
// the caller plays them.
func StartJob(ctx context.Context, c client.Client, job *batchv1.Job) error {
	return updateStatus(ctx, c, job, func(j *batchv1.Job) {
		now := metav1.Now()
		if j.Status.StartTime == nil {
			j.Status.StartTime = &now
		}
		j.Status.Active, j.Status.Ready = 1, ptr.To[int32](1)
	})
}

// CompleteJob writes the status the Job controller writes once the job's pod
// succeeded: SuccessCriteriaMet and Complete, with completion time and one succeeded
// pod. No kubelet and no Job controller run on a test plane; the caller plays them.
func CompleteJob(ctx context.Context, c client.Client, job *batchv1.Job) error {
	return updateStatus(ctx, c, job, func(j *batchv1.Job) {
		now := metav1.Now()
		if j.Status.StartTime == nil {
			j.Status.StartTime = &now
		}
		j.Status.Active, j.Status.Ready, j.Status.Succeeded = 0, ptr.To[int32](0), 1
		j.Status.CompletionTime = &now
		for _, typ := range []batchv1.JobConditionType{batchv1.JobSuccessCriteriaMet, batchv1.JobComplete} {
			j.Status.Conditions = append(j.Status.Conditions, batchv1.JobCondition{Type: typ, Status: corev1.ConditionTrue,
				Reason: batchv1.JobReasonCompletionsReached, Message: "Reached expected number of succeeded pods",
				LastProbeTime: now, LastTransitionTime: now})
		}
	})
}

func updateStatus(ctx context.Context, c client.Client, job *batchv1.Job, edit func(*batchv1.Job)) error {
	if err := c.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
		return fmt.Errorf("reading Job %s/%s: %w", job.Namespace, job.Name, err)
	}
	edit(job)
	if err := c.Status().Update(ctx, job); err != nil {
		return fmt.Errorf("writing the status of Job %s/%s: %w", job.Namespace, job.Name, err)
	}
	return nil
}

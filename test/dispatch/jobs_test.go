package dispatch

import (
	"context"
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/test/dispatchtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// queueLabel names the LocalQueue a job is submitted to.
const queueLabel = "kueue.x-k8s.io/queue-name"

// newJob is a batch Job for the hub's LocalQueue pool, as a user writes it.
func (w *world) newJob(name, pool string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.workloads, Name: name, Labels: map[string]string{queueLabel: pool}},
		Spec: batchv1.JobSpec{
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name:  "train",
					Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")}},
				}},
			}},
		},
	}
}

// submit creates a job for pool on the hub and removes it, here and on the workers,
// when the test ends.
func (w *world) submit(tb testing.TB, name, pool string) *batchv1.Job {
	tb.Helper()
	j := w.newJob(name, pool)
	if err := w.hub.Client.Create(tb.Context(), j); err != nil {
		tb.Fatalf("submitting Job %s/%s on the hub: %v", j.Namespace, j.Name, err)
	}
	tb.Cleanup(func() { w.deleteJob(j.Name) })
	return j
}

// deleteJob deletes the named job on the hub, and whatever is left of it on the
// workers (Kueue deletes the remote copies; a stopped test may not wait for it).
func (w *world) deleteJob(name string) {
	// The test's context has ended by the time its cleanups run.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bg := client.PropagationPolicy(metav1.DeletePropagationBackground)
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: w.workloads, Name: name}}
	_ = w.hub.Client.Delete(ctx, j, bg)
	for _, wk := range w.workers {
		_ = wk.plane.Client.Delete(ctx, j.DeepCopy(), bg)
	}
}

// hubWorkload is the Workload Kueue made on the hub for j, if any.
func (w *world) hubWorkload(tb testing.TB, j *batchv1.Job) (*kueue.Workload, bool) {
	tb.Helper()
	var list kueue.WorkloadList
	if err := w.hub.Client.List(tb.Context(), &list, client.InNamespace(j.Namespace), client.MatchingLabels{"kueue.x-k8s.io/job-uid": string(j.UID)}); err != nil {
		tb.Fatalf("listing the workloads of Job %s/%s: %v", j.Namespace, j.Name, err)
	}
	if len(list.Items) != 1 {
		return nil, false
	}
	return &list.Items[0], true
}

// workerJob reads the worker's copy of the hub's job j; false when there is none.
func workerJob(tb testing.TB, wk *worker, j *batchv1.Job) (*batchv1.Job, bool) {
	tb.Helper()
	var got batchv1.Job
	err := wk.plane.Client.Get(tb.Context(), client.ObjectKeyFromObject(j), &got)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		tb.Fatalf("reading Job %s/%s on %s: %v", j.Namespace, j.Name, wk.name, err)
	}
	return &got, true
}

// placedOn waits until the hub admits j's workload on wk and wk runs its copy
// (created by MultiKueue through the tunnel, unsuspended by the worker's Kueue), while
// no other worker ever has one. It returns the worker's copy.
func (w *world) placedOn(tb testing.TB, j *batchv1.Job, wk *worker) *batchv1.Job {
	tb.Helper()
	var remote *batchv1.Job
	poll.Until(tb, fmt.Sprintf("job %s admitted on the hub and running on %s", j.Name, wk.name), func() (bool, string) {
		w.nowhereElse(tb, j, wk)
		wl, ok := w.hubWorkload(tb, j)
		if !ok {
			return false, "no workload on the hub yet"
		}
		admitted := apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted)
		cluster := ptr.Deref(wl.Status.ClusterName, "")
		if !admitted || cluster != wk.identity {
			return false, fmt.Sprintf("hub workload: admitted %t, clusterName %q; %s", admitted, cluster, conditionOf(wl, kueue.WorkloadAdmitted))
		}
		got, ok := workerJob(tb, wk, j)
		if !ok {
			return false, "no job on " + wk.name + " yet"
		}
		remote = got
		return !ptr.Deref(got.Spec.Suspend, true), fmt.Sprintf("the job on %s is suspended", wk.name)
	})
	if got := remote.Labels[kueue.MultiKueueOriginLabel]; got != dispatch.Origin {
		tb.Errorf("the job on %s has multikueue-origin %q, want %q: it was not created by the hub's Kueue", wk.name, got, dispatch.Origin)
	}
	w.nowhereElse(tb, j, wk)
	return remote
}

// nowhereElse fails the test if a worker other than wk has a copy of j.
func (w *world) nowhereElse(tb testing.TB, j *batchv1.Job, wk *worker) {
	tb.Helper()
	for _, other := range w.workers {
		if other == wk {
			continue
		}
		if _, ok := workerJob(tb, other, j); ok {
			tb.Fatalf("job %s for pool %s landed on %s (residency %s)", j.Name, j.Labels[queueLabel], other.name, other.residency)
		}
	}
}

// complete plays the worker's nodes: no kubelet runs here, so the test writes the
// status the Job controller writes once the job's pod succeeded.
func complete(tb testing.TB, wk *worker, remote *batchv1.Job) {
	tb.Helper()
	if err := dispatchtest.CompleteJob(tb.Context(), wk.plane.Client, remote); err != nil {
		tb.Fatal(err)
	}
}

// start plays the worker's nodes: no kubelet runs here, so the test writes the status
// the Job controller writes once the job's pod runs.
func start(tb testing.TB, wk *worker, remote *batchv1.Job) {
	tb.Helper()
	if err := dispatchtest.StartJob(tb.Context(), wk.plane.Client, remote); err != nil {
		tb.Fatal(err)
	}
}

// finishedOnHub waits until the hub's job reports Complete, copied back from the worker.
func (w *world) finishedOnHub(tb testing.TB, j *batchv1.Job) {
	tb.Helper()
	poll.Until(tb, fmt.Sprintf("job %s complete on the hub", j.Name), func() (bool, string) {
		var got batchv1.Job
		if err := w.hub.Client.Get(tb.Context(), client.ObjectKeyFromObject(j), &got); err != nil {
			return false, err.Error()
		}
		for _, c := range got.Status.Conditions {
			if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("hub job status: succeeded %d, conditions %v", got.Status.Succeeded, got.Status.Conditions)
	})
}

func conditionOf(wl *kueue.Workload, typ string) string {
	if c := apimeta.FindStatusCondition(wl.Status.Conditions, typ); c != nil {
		return fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message)
	}
	return typ + " unset"
}

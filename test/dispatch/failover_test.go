package dispatch

import (
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/test/kueuetest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// takeover is how long no replica leads during a failover: the Lease moving to a
// standby after the leader released it on its way out. Its length is the point of the
// wait, not readiness: Kueue's calls to the workers fail all that time.
const takeover = 3 * time.Second

// jobsPerWorker run on each worker across the failovers.
const jobsPerWorker = 3

// A leader change keeps running work: jobs admitted longer ago than the hub Kueue's
// workerLostTimeout, running on both workers, stay admitted, on the same worker, with
// the same UID there, through two failovers, and no commit status is posted for them
// since no cluster's state changed.
//
// Kueue's proxy Service selects every ready replica. In the first failover Kueue's
// watches are held by the leader that goes: they end, and Kueue dials again at once,
// reaching a standby that is not the new leader and answers before any replica leads.
// In the second they are held by that standby, and the leader goes under them: they
// never end. Kueue counts no worker as lost in either.
func TestAHubFailoverKeepsRunningWork(t *testing.T) {
	// One pool of both workers: Kueue v0.17.0 evicts a job whose worker it is
	// reconnecting to only while another worker of its pool is connected; with none
	// connected it waits (kueue#11559).
	w := newWorld(t, worldOptions{tenant: "relay", workloads: "relay-ml", onePool: true, relay: true})
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// What the hub's Kueue did about its workers, which its last output may have
		// scrolled past.
		for _, l := range strings.Split(w.hubKueueLog.Last(256<<10), "\n") {
			for _, s := range []string{"emote lost", "client config", "Watch ended", "evict", "Evict", "Retry"} {
				if strings.Contains(l, s) {
					t.Log(l[:min(len(l), 600)])
					break
				}
			}
		}
	})
	w.allDispatchable(t)
	a := w.replicas[0]
	b, c := w.startReplica("hub-1"), w.startReplica("hub-2")
	w.proxySvc.Route(b.proxyL.Addr().String())

	type running struct {
		job    *batchv1.Job
		wk     *worker
		remote *batchv1.Job
	}
	var jobs []running
	pool := w.workers[0].residency
	for i := range jobsPerWorker * len(w.workers) {
		j := w.submit(t, fmt.Sprintf("outlives-failovers-%d", i), pool)
		wk, remote := w.placedInPool(t, j)
		start(t, wk, remote)
		jobs = append(jobs, running{j, wk, remote})
	}
	// Kueue v0.17.0 requeues a job admitted longer ago than workerLostTimeout when its
	// watch to the worker ends (kueue#12999): the jobs must be that old first. Nothing
	// signals age, so waiting out the clock is the point here, not readiness.
	wl, _ := w.hubWorkload(t, jobs[len(jobs)-1].job)
	admitted := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadAdmitted).LastTransitionTime.Time
	if wait := time.Until(admitted.Add(workerLostTimeout + 2*time.Second)); wait > 0 {
		t.Logf("waiting %s for the jobs to be older than the hub's workerLostTimeout (%s)", wait.Round(time.Second), workerLostTimeout)
		time.Sleep(wait)
	}
	posted, postedTotal := w.posts.count(), w.posts.total()

	// Kueue's judgement of each worker before: a failover it never counted as a lost
	// worker leaves it as it was. And the kubeconfig it reads: a new leader that issued
	// a new token would make Kueue rebuild its client, and restart every watch.
	before := map[string]metav1.Condition{}
	kubeconfigs := map[string]string{}
	for _, wk := range w.workers {
		before[wk.name] = w.activeCondition(t, wk)
		kubeconfigs[wk.name] = w.kubeConfigVersion(t, wk)
	}
	// 1. The leader, which holds Kueue's watches, goes; hub-2 takes over.
	w.failover(t, a, c)
	// 2. The new leader goes from under the watches hub-1 holds; hub-1 takes over.
	w.failover(t, c, b)
	for _, wk := range w.workers {
		was := before[wk.name]
		if after := w.activeCondition(t, wk); after.Status != metav1.ConditionTrue || !after.LastTransitionTime.Equal(&was.LastTransitionTime) {
			t.Errorf("Kueue counted %s as lost in a failover: Active went from %s (since %s) to %s %s: %s (since %s)", wk.name,
				was.Status, was.LastTransitionTime.Format(time.RFC3339), after.Status, after.Reason, after.Message, after.LastTransitionTime.Format(time.RFC3339))
		}
	}

	for _, wk := range w.workers {
		if got := w.kubeConfigVersion(t, wk); got != kubeconfigs[wk.name] {
			t.Errorf("the kubeconfig Kueue reads for %s was written in a failover (resourceVersion %s, was %s)", wk.name, got, kubeconfigs[wk.name])
		}
	}

	// What Kueue did to the running jobs, counted before they finish.
	var evicted, requeued, replaced int
	for _, r := range jobs {
		wl, ok := w.hubWorkload(t, r.job)
		if !ok {
			t.Fatalf("no workload on the hub for job %s", r.job.Name)
		}
		counted := 0
		if s := wl.Status.SchedulingStats; s != nil {
			for _, e := range s.Evictions {
				counted += int(e.Count)
			}
		}
		if counted == 0 && apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted) != nil {
			counted = 1
		}
		evicted += counted
		if wl.Status.RequeueState != nil || ptr.Deref(wl.Status.ClusterName, "") != r.wk.identity {
			requeued++
		}
		if got, ok := workerJob(t, r.wk, r.job); !ok || got.UID != r.remote.UID {
			replaced++
		}
	}
	t.Logf("two failovers under %d running jobs: %d evictions, %d workloads requeued or moved, %d worker jobs replaced",
		len(jobs), evicted, requeued, replaced)
	if evicted+requeued+replaced > 0 {
		t.Errorf("the failovers disturbed running work: %d evictions, %d requeued or moved, %d replaced", evicted, requeued, replaced)
	}
	// The jobs finish where they ran, and their completion reaches the hub through the
	// last leader. Evictions are counted before: once a job completes, Kueue v0.17.0
	// may find its worker's Workload gone before it saw it finished, and requeue a
	// finished job (seen once in many runs on a loaded machine), which no failover
	// causes.
	for _, r := range jobs {
		if got, ok := workerJob(t, r.wk, r.job); ok {
			complete(t, r.wk, got)
		}
	}
	for _, r := range jobs {
		w.finishedOnHub(t, r.job)
	}
	failoverPosts := map[string]int{}
	for k, n := range w.posts.count() {
		if n -= posted[k]; n > 0 {
			failoverPosts[k] = n
		}
	}
	t.Logf("commit statuses posted from the first failover until the jobs finished: %v", failoverPosts)
	if len(failoverPosts) > 0 {
		t.Errorf("commit statuses posted though no cluster's state changed: %v\n%s", failoverPosts, strings.Join(w.posts.since(postedTotal), "\n"))
	}
}

// failover stops the leader from, leaves the hub without a leader for the takeover,
// then makes to lead, and waits until both workers are dispatchable through it.
func (w *world) failover(t *testing.T, from, to *replica) {
	t.Helper()
	gone := time.Now()
	from.stop()
	time.Sleep(takeover)
	to.lead()
	for _, wk := range w.workers {
		w.dispatchReady(t, wk, metav1.ConditionTrue, v1alpha1.ReasonDispatchable)
	}
	poll.Until(t, "Kueue reaches both workers through "+to.name, func() (bool, string) {
		for _, wk := range w.workers {
			if c := w.activeCondition(t, wk); c.Status != metav1.ConditionTrue {
				return false, fmt.Sprintf("%s: Active=%s %s: %s", wk.name, c.Status, c.Reason, c.Message)
			}
		}
		return true, ""
	})
	t.Logf("%s took over from %s; both workers dispatchable %s after %s went", to.name, from.name, time.Since(gone).Round(100*time.Millisecond), from.name)
}

// placedInPool waits until the hub admits j's workload on a worker of its pool and that
// worker runs its copy, and returns both.
func (w *world) placedInPool(t *testing.T, j *batchv1.Job) (*worker, *batchv1.Job) {
	t.Helper()
	var wk *worker
	var remote *batchv1.Job
	poll.Until(t, fmt.Sprintf("job %s admitted on the hub and running on a worker", j.Name), func() (bool, string) {
		wl, ok := w.hubWorkload(t, j)
		if !ok {
			return false, "no workload on the hub yet"
		}
		cluster := ptr.Deref(wl.Status.ClusterName, "")
		if !apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted) || cluster == "" {
			return false, fmt.Sprintf("hub workload: clusterName %q; %s", cluster, conditionOf(wl, kueue.WorkloadAdmitted))
		}
		for _, c := range w.workers {
			if c.identity == cluster {
				wk = c
			}
		}
		if wk == nil {
			return false, "placed on " + cluster + ", no worker of the world"
		}
		got, ok := workerJob(t, wk, j)
		if !ok {
			return false, "no job on " + wk.name + " yet"
		}
		remote = got
		return !ptr.Deref(got.Spec.Suspend, true), fmt.Sprintf("the job on %s is suspended", wk.name)
	})
	return wk, remote
}

// kubeConfigVersion is the resourceVersion of the kubeconfig Secret Kueue reads for wk.
func (w *world) kubeConfigVersion(t *testing.T, wk *worker) string {
	t.Helper()
	var sec corev1.Secret
	key := client.ObjectKey{Namespace: kueuetest.Namespace, Name: dispatch.KubeConfigSecretName(wk.identity)}
	if err := w.hub.Client.Get(t.Context(), key, &sec); err != nil {
		t.Fatalf("reading the kubeconfig Secret %s: %v", key, err)
	}
	return sec.ResourceVersion
}

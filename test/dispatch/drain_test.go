package dispatch

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// drainStaleAfter is the drain world's hub StaleAfter: how long a hub gives an agent
// to prune before it revokes it. Short, so that a drain outliving it by far proves
// that the wait for work to finish, not this window, decides when the agent goes.
const drainStaleAfter = 3 * time.Second

// drainGrace is fleet.yaml's drainGracePeriod in the case whose job never finishes.
const drainGrace = 20 * time.Second

// TestRemovalDrainsFirst removes clusters from Git while a job placed on them through
// the hub runs. It has a world of its own: removing a cluster ends it for every later
// test. Its subtests run in order, each removing one of the two clusters.
func TestRemovalDrainsFirst(t *testing.T) {
	w := newWorld(t, worldOptions{tenant: "drain", workloads: "ml-drain", staleAfter: drainStaleAfter})
	w.allDispatchable(t)
	t.Run("a removed cluster keeps running its job and is decommissioned once the job finished", w.testDrainWaitsForRunningWork)
	t.Run("a cluster put back while it drains takes work again and stays", w.testPutBackDuringTheDrain)
	t.Run("a job that never finishes holds the decommission for the grace period only", w.testDrainEndsAfterTheGracePeriod)
}

func (w *world) testDrainWaitsForRunningWork(t *testing.T) {
	eu := w.worker("gpu-eu")
	j := w.submit(t, "runs-through-the-removal", "eu")
	remote := w.placedOn(t, j, eu)
	start(t, eu, remote)
	rec := w.recordDrain(t, eu)

	removal := w.removeCluster(t, eu, nil)
	removed := time.Now()
	w.dispatchReady(t, eu, metav1.ConditionFalse, v1alpha1.ReasonDraining)
	// Posted by a drain check that counted the job, the first of which comes
	// drainCheckEvery (10 s) after the drain began: well past the hub's StaleAfter.
	st := w.commitStatusOn(t, eu, removal, commitstatus.Pending, "1 job placed on the cluster still runs")
	t.Logf("%s: %s: %s", eu.name, st.State, st.Description)
	if waited := time.Since(removed); waited < 2*drainStaleAfter {
		t.Fatalf("the drain was checked %s after the removal, before the hub's StaleAfter (%s) had passed twice: the test proves nothing about the agent's revocation", waited, drainStaleAfter)
	}
	w.stillDraining(t, eu, j, remote)

	// The job finishes on the worker (the test plays its node): the drain is over.
	complete(t, eu, remote)
	w.finishedOnHub(t, j)
	st = w.commitStatusOn(t, eu, removal, commitstatus.Success, "decommissioned: the agent pruned what it owned")
	t.Logf("%s: %s: %s", eu.name, st.State, st.Description)
	w.decommissioned(t, eu, false)
	since, drained := rec.times(t)
	t.Logf("the drain took %s", drained.Sub(since))
	if drained.Sub(since) >= time.Hour {
		t.Errorf("the drain ended %s after it began, with the default grace period of an hour: not because the job finished", drained.Sub(since))
	}
	w.neverEvicted(t, j, eu)
}

func (w *world) testPutBackDuringTheDrain(t *testing.T) {
	us := w.worker("gpu-us")
	j := w.submit(t, "runs-through-a-put-back", "us")
	remote := w.placedOn(t, j, us)
	start(t, us, remote)

	w.removeCluster(t, us, nil)
	w.dispatchReady(t, us, metav1.ConditionFalse, v1alpha1.ReasonDraining)
	back := w.restoreCluster(t, us)
	w.dispatchReady(t, us, metav1.ConditionTrue, v1alpha1.ReasonDispatchable)
	st := w.commitStatusOn(t, us, back, commitstatus.Success, "")
	t.Logf("%s: %s: %s", us.name, st.State, st.Description)
	// Left on it, the drain would go on: its next check, once the job is done,
	// decommissions the cluster that is back in the repository.
	wc := w.workerCluster(t, us)
	for _, a := range []string{v1alpha1.DrainingSinceAnnotation, v1alpha1.DrainedAnnotation, v1alpha1.DecommissionAnnotation} {
		if v, ok := wc.Annotations[a]; ok {
			t.Errorf("the cluster put back keeps %s=%s", a, v)
		}
	}
	poll.Until(t, us.name+": the worker's ClusterQueue takes work again", func() (bool, string) {
		var cq kueue.ClusterQueue
		if err := us.plane.Client.Get(t.Context(), client.ObjectKey{Name: "cluster-queue"}, &cq); err != nil {
			return false, err.Error()
		}
		got := ptr.Deref(cq.Spec.StopPolicy, kueue.None)
		return got == kueue.None, fmt.Sprintf("stopPolicy %s", got)
	})
	if got, ok := workerJob(t, us, j); !ok || got.UID != remote.UID {
		t.Errorf("the job on %s was replaced or removed (found %t, UID %v, was %s)", us.name, ok, uidOf(got), remote.UID)
	}
	w.neverEvicted(t, j, us)

	complete(t, us, remote)
	w.finishedOnHub(t, j)
}

func (w *world) testDrainEndsAfterTheGracePeriod(t *testing.T) {
	us := w.worker("gpu-us")
	j := w.submit(t, "never-finishes", "us")
	remote := w.placedOn(t, j, us)
	start(t, us, remote)
	rec := w.recordDrain(t, us)

	fleetYAML := fmt.Sprintf("%s  dispatch:\n    drainGracePeriod: %s\n", w.fleetYAML, drainGrace)
	removal := w.removeCluster(t, us, []byte(fleetYAML))
	w.dispatchReady(t, us, metav1.ConditionFalse, v1alpha1.ReasonDraining)
	wc := w.workerCluster(t, us)
	since, err := time.Parse(time.RFC3339, wc.Annotations[v1alpha1.DrainingSinceAnnotation])
	if err != nil {
		t.Fatalf("the draining WorkerCluster's %s annotation: %v", v1alpha1.DrainingSinceAnnotation, err)
	}
	latest := since.Add(drainGrace).UTC().Format(time.RFC3339)
	st := w.commitStatusOn(t, us, removal, commitstatus.Pending, "the decommission begins by "+latest+" at the latest")
	t.Logf("%s: %s: %s", us.name, st.State, st.Description)
	if time.Now().Before(since.Add(drainGrace)) {
		w.stillDraining(t, us, j, remote)
	}

	st = w.commitStatusOn(t, us, removal, commitstatus.Success, "decommissioned: the agent pruned what it owned")
	t.Logf("%s: %s: %s", us.name, st.State, st.Description)
	w.decommissioned(t, us, true)
	since, drained := rec.times(t)
	t.Logf("the drain took %s; the grace period is %s", drained.Sub(since), drainGrace)
	if drained.Before(since.Add(drainGrace)) {
		t.Errorf("the drain ended %s after it began, before the grace period of %s was over, while its job ran", drained.Sub(since), drainGrace)
	}
	// The grace period is over and the job is left where it ran: the hub no longer
	// reaches that worker, and what becomes of the job there is the worker's.
	if got, ok := workerJob(t, us, j); !ok || got.UID != remote.UID {
		t.Errorf("the job on %s was replaced or removed by the decommission (found %t, UID %v, was %s)", us.name, ok, uidOf(got), remote.UID)
	}
}

// stillDraining fails the test unless the removed cluster drains as a user expects
// while its job j runs there (remote is the worker's copy): it takes no new work (its
// ClusterQueue holds) but keeps its place in the hub's Kueue (MultiKueueCluster and
// MultiKueueConfig), the job runs on untouched, and the agent keeps its credential and
// its tunnel.
func (w *world) stillDraining(t *testing.T, wk *worker, j, remote *batchv1.Job) {
	t.Helper()
	ctx, hc := t.Context(), w.hub.Client
	wc := w.workerCluster(t, wk)
	if c := apimeta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionDispatchReady); c == nil || c.Reason != v1alpha1.ReasonDraining {
		t.Errorf("DispatchReady of the draining cluster: %+v, want reason %s", c, v1alpha1.ReasonDraining)
	}
	if v := wc.Annotations[v1alpha1.DecommissionAnnotation]; v != "" {
		t.Errorf("the draining cluster is being decommissioned (%s=%s) while its job runs", v1alpha1.DecommissionAnnotation, v)
	}

	var mc kueue.MultiKueueCluster
	if err := hc.Get(ctx, client.ObjectKey{Name: wk.identity}, &mc); err != nil {
		t.Errorf("the draining cluster's MultiKueueCluster: %v", err)
	}
	pool := dispatch.PoolNamesOf(w.tenant, wk.residency).Config
	var cfg kueue.MultiKueueConfig
	if err := hc.Get(ctx, client.ObjectKey{Name: pool}, &cfg); err != nil {
		t.Errorf("the pool's MultiKueueConfig %s: %v", pool, err)
	} else if !slices.Contains(cfg.Spec.Clusters, wk.identity) {
		t.Errorf("MultiKueueConfig %s holds %v without the draining %s: Kueue would requeue its running job", pool, cfg.Spec.Clusters, wk.identity)
	}

	poll.Until(t, wk.name+": the worker's ClusterQueue holds", func() (bool, string) {
		var cq kueue.ClusterQueue
		if err := wk.plane.Client.Get(ctx, client.ObjectKey{Name: "cluster-queue"}, &cq); err != nil {
			return false, err.Error()
		}
		got := ptr.Deref(cq.Spec.StopPolicy, kueue.None)
		return got == kueue.Hold, fmt.Sprintf("stopPolicy %s", got)
	})

	got, ok := workerJob(t, wk, j)
	switch {
	case !ok:
		t.Errorf("the running job is gone from %s during the drain", wk.name)
	case got.UID != remote.UID:
		t.Errorf("the running job on %s was replaced (UID %s, was %s) during the drain", wk.name, got.UID, remote.UID)
	case ptr.Deref(got.Spec.Suspend, false):
		t.Errorf("the running job on %s was suspended by the drain", wk.name)
	}
	w.neverEvicted(t, j, wk)

	var cred corev1.Secret
	if err := hc.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: tunnel.CredentialSecretName(wk.name)}, &cred); err != nil {
		t.Errorf("the draining cluster's agent credential: %v: the agent was revoked before the drain ended", err)
	}
	if !w.tun.Connected(wk.identity) {
		t.Errorf("the draining cluster's agent is not connected")
	}
}

// decommissioned waits until the removed cluster is gone as a user expects once its
// drain is over: its MultiKueueCluster is deleted, the agent pruned what it applied on
// the worker, the agent is revoked and the WorkerCluster is deleted. With jobLeft, a
// job admitted on the worker still runs there: the worker's Kueue keeps the
// ClusterQueue that admitted it, and its ResourceFlavor, behind its finalizers until
// the job ends, so those may still be terminating.
func (w *world) decommissioned(t *testing.T, wk *worker, jobLeft bool) {
	t.Helper()
	ctx, hc := t.Context(), w.hub.Client
	gone := func(what string, c client.Client, obj client.Object) {
		t.Helper()
		poll.Until(t, fmt.Sprintf("%s: %s deleted", wk.name, what), func() (bool, string) {
			err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
			if err == nil {
				return false, "still there"
			}
			return apierrors.IsNotFound(err), err.Error()
		})
	}
	gone("WorkerCluster", hc, &v1alpha1.WorkerCluster{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: wk.name}})
	gone("agent credential", hc, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: tunnel.CredentialSecretName(wk.name)}})
	gone("MultiKueueCluster", hc, &kueue.MultiKueueCluster{ObjectMeta: metav1.ObjectMeta{Name: wk.identity}})
	var terminating []string
	poll.Until(t, wk.name+": the agent pruned what it applied", func() (bool, string) {
		var live []string
		live, terminating = w.ownedOnWorker(t, wk)
		if !jobLeft {
			live = append(live, terminating...)
		}
		return len(live) == 0, fmt.Sprintf("left: %v", live)
	})
	if len(terminating) > 0 {
		t.Logf("%s: held by the worker's Kueue for the job still running there: %v", wk.name, terminating)
	}
}

// ownedOnWorker lists what the worker still holds of its agent's applied objects,
// workload namespaces aside (never pruned): live ones, and those being deleted.
func (w *world) ownedOnWorker(t *testing.T, wk *worker) (live, terminating []string) {
	t.Helper()
	for _, gvk := range apply.PruneKinds() {
		if gvk.Kind == "Namespace" {
			continue
		}
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := wk.plane.Client.List(t.Context(), &list, client.MatchingLabels{v1alpha1.WorkerClusterLabel: wk.identity}); err != nil {
			if apimeta.IsNoMatchError(err) {
				continue
			}
			t.Fatalf("listing %s on %s: %v", gvk.Kind, wk.name, err)
		}
		for _, o := range list.Items {
			name := gvk.Kind + " " + client.ObjectKeyFromObject(&o).String()
			if o.GetDeletionTimestamp() != nil {
				terminating = append(terminating, name)
			} else {
				live = append(live, name)
			}
		}
	}
	return live, terminating
}

// drainRecord keeps the drain annotations of a WorkerCluster as the hub wrote them:
// the WorkerCluster is deleted moments after its drain ends, too soon to be read then.
type drainRecord struct {
	mu             sync.Mutex
	since, drained string
}

// recordDrain watches the cluster's WorkerCluster on the hub until the test ends.
func (w *world) recordDrain(t *testing.T, wk *worker) *drainRecord {
	t.Helper()
	wc, err := client.NewWithWatch(w.hub.Config, client.Options{Scheme: w.hub.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	events, err := wc.Watch(t.Context(), &v1alpha1.WorkerClusterList{}, client.InNamespace(w.ns), client.MatchingFields{"metadata.name": wk.name})
	if err != nil {
		t.Fatalf("watching WorkerCluster %s/%s: %v", w.ns, wk.name, err)
	}
	rec := &drainRecord{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range events.ResultChan() {
			got, ok := ev.Object.(*v1alpha1.WorkerCluster)
			if !ok || ev.Type == watch.Error {
				continue
			}
			rec.mu.Lock()
			if v := got.Annotations[v1alpha1.DrainingSinceAnnotation]; v != "" {
				rec.since = v
			}
			if v := got.Annotations[v1alpha1.DrainedAnnotation]; v != "" {
				rec.drained = v
			}
			rec.mu.Unlock()
		}
	}()
	t.Cleanup(func() { events.Stop(); <-done })
	return rec
}

// times are when the drain began and ended, as the hub recorded them: it waits for the
// watch to have delivered both.
func (r *drainRecord) times(t *testing.T) (since, drained time.Time) {
	t.Helper()
	poll.Until(t, "the drain's annotations seen", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.since != "" && r.drained != "", fmt.Sprintf("since %q, drained %q", r.since, r.drained)
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	since, err := time.Parse(time.RFC3339, r.since)
	if err != nil {
		t.Fatalf("the WorkerCluster's %s annotation %q: %v", v1alpha1.DrainingSinceAnnotation, r.since, err)
	}
	drained, err = time.Parse(time.RFC3339, r.drained)
	if err != nil {
		t.Fatalf("the WorkerCluster's %s annotation %q: %v", v1alpha1.DrainedAnnotation, r.drained, err)
	}
	return since, drained
}

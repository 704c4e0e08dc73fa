package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
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

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// TestDispatchThroughTheTunnel runs one hub, two workers and their Kueue managers for
// all of its subtests, which run in order and each leave both clusters dispatchable.
func TestDispatchThroughTheTunnel(t *testing.T) {
	w := newWorld(t, worldOptions{tenant: "acme", workloads: "ml"})
	for _, tc := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"both clusters turn dispatch-ready and the hub keeps their Kueue objects", w.testReady},
		{"a job runs on its pool's worker only and its completion reaches the hub", w.testJobsStayInTheirPool},
		{"the proxy refuses what MultiKueue does not need and any token but the worker's", w.testProxyRefuses},
		{"another tenant's job never reaches this tenant's workers", w.testTenantsStayApart},
		{"a cordon keeps the running job and holds the next one on the hub", w.testCordonKeepsRunningWork},
		{"a judgement of Kueue's that the hub cluster refused to store is stored by the retry", w.testARefusedJudgementIsRetried},
		{"a MultiKueueCluster read before Kueue's newest judgement does not go over it", w.testAnOlderJudgementIsPassedOver},
		{"a tunnel blip within the resume window keeps a job admitted before workerLostTimeout", w.testTunnelBlipIsInvisible},
		{"an agent back after an outage past the resume window is dispatched to at once, not at Kueue's next try", w.testAnAgentBackAfterAnOutageIsDispatchedToAtOnce},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.allDispatchable(t)
			tc.run(t)
		})
	}
}

// testTenantsStayApart submits, from a namespace of another tenant on the hub, a job to
// a LocalQueue of its own that names this tenant's pool ClusterQueue: the ClusterQueue
// admits only from the tenant's namespaces, so Kueue holds the job and no worker of
// this tenant ever gets it.
func (w *world) testTenantsStayApart(t *testing.T) {
	ctx, hc := t.Context(), w.hub.Client
	ns := "intruder-" + w.tenant
	if err := hc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{v1alpha1.TenantLabel: "intruder"}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = hc.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	lq := &kueue.LocalQueue{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "eu"}, Spec: kueue.LocalQueueSpec{ClusterQueue: kueue.ClusterQueueReference(dispatch.PoolNamesOf(w.tenant, "eu").Queue)}}
	if err := hc.Create(ctx, lq); err != nil {
		t.Fatal(err)
	}
	j := w.newJob("intruder", "eu")
	j.Namespace = ns
	if err := hc.Create(ctx, j); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = hc.Delete(context.Background(), j, client.PropagationPolicy(metav1.DeletePropagationBackground))
	})
	// Kueue's verdict, not a quiet moment: the workload is held for the namespace.
	poll.Until(t, "Kueue refuses the other tenant's workload", func() (bool, string) {
		var list kueue.WorkloadList
		if err := hc.List(ctx, &list, client.InNamespace(ns)); err != nil || len(list.Items) == 0 {
			return false, fmt.Sprint("no workload yet ", err)
		}
		c := apimeta.FindStatusCondition(list.Items[0].Status.Conditions, kueue.WorkloadQuotaReserved)
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "namespace doesn't match ClusterQueue selector"), fmt.Sprintf("%+v", c)
	})
	for _, wk := range w.workers {
		var jobs batchv1.JobList
		if err := wk.plane.Client.List(ctx, &jobs, client.InNamespace(ns)); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if len(jobs.Items) > 0 {
			t.Fatalf("the other tenant's job reached %s", wk.name)
		}
	}
	var hubJob batchv1.Job
	if err := hc.Get(ctx, client.ObjectKeyFromObject(j), &hubJob); err != nil || hubJob.Spec.Suspend == nil || !*hubJob.Spec.Suspend {
		t.Fatalf("the other tenant's job is not held suspended on the hub: %v %v", hubJob.Spec.Suspend, err)
	}
}

func (w *world) testReady(t *testing.T) {
	for _, wk := range w.workers {
		t.Run(wk.name, func(t *testing.T) {
			ctx, hc := t.Context(), w.hub.Client
			w.dispatchReady(t, wk, metav1.ConditionTrue, v1alpha1.ReasonDispatchable)
			st := w.commitStatus(t, wk, commitstatus.Success, "dispatchable")
			t.Logf("%s: %s: %s", wk.name, st.State, st.Description)

			mc := &kueue.MultiKueueCluster{}
			poll.Until(t, "the hub's MultiKueueCluster is Active", func() (bool, string) {
				if err := hc.Get(ctx, client.ObjectKey{Name: wk.identity}, mc); err != nil {
					return false, err.Error()
				}
				c := apimeta.FindStatusCondition(mc.Status.Conditions, kueue.MultiKueueClusterActive)
				if c == nil {
					return false, "no Active condition"
				}
				return c.Status == metav1.ConditionTrue, fmt.Sprintf("Active=%s %s: %s", c.Status, c.Reason, c.Message)
			})

			pool := dispatch.PoolNamesOf(w.tenant, wk.residency)
			var cfg kueue.MultiKueueConfig
			if err := hc.Get(ctx, client.ObjectKey{Name: pool.Config}, &cfg); err != nil {
				t.Fatalf("the pool's MultiKueueConfig: %v", err)
			}
			if !slices.Equal(cfg.Spec.Clusters, []string{wk.identity}) {
				t.Errorf("MultiKueueConfig %s holds %v, want just %s", pool.Config, cfg.Spec.Clusters, wk.identity)
			}

			var hubCQ, workerCQ kueue.ClusterQueue
			if err := hc.Get(ctx, client.ObjectKey{Name: pool.Queue}, &hubCQ); err != nil {
				t.Fatalf("the pool's ClusterQueue on the hub: %v", err)
			}
			if err := wk.plane.Client.Get(ctx, client.ObjectKey{Name: "cluster-queue"}, &workerCQ); err != nil {
				t.Fatalf("the preset's ClusterQueue on %s: %v", wk.name, err)
			}
			hubQuota, workerQuota := dispatch.NominalQuota(&hubCQ), dispatch.NominalQuota(&workerCQ)
			if !sameQuota(hubQuota, workerQuota) {
				t.Errorf("hub ClusterQueue %s offers %v; the worker's offers %v", pool.Queue, hubQuota, workerQuota)
			}
			for r, q := range wk.quota {
				if got := workerQuota[corev1.ResourceName(r)]; got.Cmp(resource.MustParse(q)) != 0 {
					t.Errorf("the worker's ClusterQueue offers %s %s, cluster.yaml declares %s", r, got.String(), q)
				}
			}
		})
	}
}

func (w *world) testJobsStayInTheirPool(t *testing.T) {
	for _, tc := range []struct {
		pool, runsOn string
	}{
		{pool: "eu", runsOn: "gpu-eu"},
		{pool: "us", runsOn: "gpu-us"},
	} {
		t.Run(tc.pool, func(t *testing.T) {
			wk := w.worker(tc.runsOn)
			j := w.submit(t, "train-"+tc.pool, tc.pool)
			remote := w.placedOn(t, j, wk)
			start(t, wk, remote)
			complete(t, wk, remote)
			w.finishedOnHub(t, j)
			w.nowhereElse(t, j, wk)
		})
	}
}

func (w *world) testCordonKeepsRunningWork(t *testing.T) {
	eu := w.worker("gpu-eu")
	running := w.submit(t, "running-before-cordon", "eu")
	remote := w.placedOn(t, running, eu)
	start(t, eu, remote)

	w.commitCluster(t, eu, true)
	t.Cleanup(func() {
		w.commitCluster(t, eu, false)
		w.dispatchReady(t, eu, metav1.ConditionTrue, v1alpha1.ReasonDispatchable)
	})
	w.dispatchReady(t, eu, metav1.ConditionFalse, v1alpha1.ReasonCordoned)
	st := w.commitStatus(t, eu, commitstatus.Success, "cordoned")
	t.Logf("%s: %s: %s", eu.name, st.State, st.Description)
	var held kueue.ClusterQueue
	if err := eu.plane.Client.Get(t.Context(), client.ObjectKey{Name: "cluster-queue"}, &held); err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(held.Spec.StopPolicy, kueue.None); got != kueue.Hold {
		t.Errorf("the cordoned worker's ClusterQueue has stopPolicy %s, want %s: it would admit new work", got, kueue.Hold)
	}

	// The next eu job waits on the hub: the pool's only cluster takes no new work, and
	// no other pool's cluster may take it. Depending on whether the hub's ClusterQueue
	// had dropped the cordoned cluster's quota when the job came, Kueue either finds no
	// quota for it, or reserves quota and waits on the MultiKueue check, which the
	// held worker never satisfies: either way the job stays suspended on the hub and no
	// worker runs it.
	next := w.submit(t, "submitted-after-cordon", "eu")
	check := kueue.AdmissionCheckReference(dispatch.PoolNamesOf(w.tenant, "eu").Queue)
	var pending string
	poll.Until(t, "the hub's Kueue keeps the next eu job pending", func() (bool, string) {
		w.nowhereElse(t, next, nil)
		wl, ok := w.hubWorkload(t, next)
		if !ok {
			return false, "no workload on the hub yet"
		}
		if apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted) {
			t.Fatalf("the hub admitted the next eu job while its pool's only cluster is cordoned: %s", conditionOf(wl, kueue.WorkloadAdmitted))
		}
		reserved := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadQuotaReserved)
		noQuota := reserved != nil && reserved.Status == metav1.ConditionFalse && reserved.Reason == "Pending"
		waitsOnCheck := reserved != nil && reserved.Status == metav1.ConditionTrue &&
			slices.ContainsFunc(wl.Status.AdmissionChecks, func(c kueue.AdmissionCheckState) bool { return c.Name == check && c.State == kueue.CheckStatePending })
		pending = fmt.Sprintf("%s; admission checks %+v", conditionOf(wl, kueue.WorkloadQuotaReserved), wl.Status.AdmissionChecks)
		return noQuota || waitsOnCheck, pending
	})
	t.Logf("the next eu job waits on the hub: %s", pending)

	// The running job is as it was: same object on the worker, running, admitted on
	// the hub, never evicted.
	got, ok := workerJob(t, eu, running)
	switch {
	case !ok:
		t.Fatalf("the running job is gone from %s after the cordon", eu.name)
	case got.UID != remote.UID:
		t.Errorf("the running job on %s was replaced (UID %s, was %s): it was requeued", eu.name, got.UID, remote.UID)
	case ptr.Deref(got.Spec.Suspend, false):
		t.Errorf("the running job on %s was suspended by the cordon", eu.name)
	}
	w.neverEvicted(t, running, eu)
	w.nowhereElse(t, next, nil)
	var hubNext batchv1.Job
	if err := w.hub.Client.Get(t.Context(), client.ObjectKeyFromObject(next), &hubNext); err != nil {
		t.Fatal(err)
	}
	if !ptr.Deref(hubNext.Spec.Suspend, false) {
		t.Errorf("the next eu job runs on the hub's say-so (unsuspended) while its pool is cordoned")
	}
}

// blip is how long the tunnel-blip test keeps the agent away.
const blip = 5 * time.Second

func (w *world) testTunnelBlipIsInvisible(t *testing.T) {
	eu := w.worker("gpu-eu")
	j := w.submit(t, "outlives-a-blip", "eu")
	remote := w.placedOn(t, j, eu)
	start(t, eu, remote)
	wl, _ := w.hubWorkload(t, j)
	admitted := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadAdmitted).LastTransitionTime.Time

	// Kueue v0.17.0 requeues a job admitted longer ago than workerLostTimeout when its
	// watch to the worker ends (kueue#12999): the job must be that old before the cut.
	// Nothing signals age, so waiting out the clock is the point here, not readiness.
	if wait := time.Until(admitted.Add(workerLostTimeout + 2*time.Second)); wait > 0 {
		t.Logf("waiting %s for the job to be older than the hub's workerLostTimeout (%s)", wait.Round(time.Second), workerLostTimeout)
		time.Sleep(wait)
	}

	// What Kueue judges of the worker before the cut: a blip it never saw leaves its
	// Active condition as it was.
	before := w.activeCondition(t, eu)
	w.cutAgent(eu)
	poll.Until(t, "the hub notices the cut", func() (bool, string) {
		c := apimeta.FindStatusCondition(w.workerCluster(t, eu).Status.Conditions, v1alpha1.ConditionDispatchReady)
		return c != nil && c.Status != metav1.ConditionTrue, fmt.Sprintf("%v", c)
	})
	// A blip as a network cut or an agent pod's restart makes: seconds, well inside
	// the proxy's resume window, long enough for Kueue's calls to the worker to fail
	// meanwhile. The length of the cut is the point of this wait, not readiness.
	time.Sleep(blip)
	cut := time.Now()
	w.startAgent(eu)
	w.dispatchReady(t, eu, metav1.ConditionTrue, v1alpha1.ReasonDispatchable)
	t.Logf("the agent was away %s; the proxy's resume window is %s", (blip + time.Since(cut)).Round(100*time.Millisecond), resumeWindow)

	// The job finishes where it ran: its completion still reaches the hub over the
	// redialled tunnel, and it was never evicted or recreated on the way.
	got, ok := workerJob(t, eu, j)
	if !ok || got.UID != remote.UID {
		t.Fatalf("the job on %s was replaced or removed by the blip (found %t, UID %v, was %s)", eu.name, ok, uidOf(got), remote.UID)
	}
	complete(t, eu, got)
	w.finishedOnHub(t, j)
	w.neverEvicted(t, j, eu)
	if after := w.activeCondition(t, eu); after.Status != metav1.ConditionTrue || !after.LastTransitionTime.Equal(&before.LastTransitionTime) {
		t.Errorf("Kueue saw the blip: its MultiKueueCluster went from Active=%s (since %s) to Active=%s %s: %s (since %s)",
			before.Status, before.LastTransitionTime.Format(time.RFC3339), after.Status, after.Reason, after.Message, after.LastTransitionTime.Format(time.RFC3339))
	}
}

// testARefusedJudgementIsRetried hands the dispatcher a judgement whose first write the
// hub cluster refuses. Kueue says a judgement once, when it changes, so only the
// dispatcher's retry can bring the WorkerCluster to it. The judgement is the test's
// own (the worker unreachable), and Kueue's real one is handed back afterwards, as
// Kueue has no reason to say it again.
func (w *world) testARefusedJudgementIsRetried(t *testing.T) {
	ctx := t.Context()
	eu := w.worker("gpu-eu")
	judged := w.kueuesJudgement(t, eu)
	const message = "the test says the worker's API is unreachable"
	apimeta.SetStatusCondition(&judged.Status.Conditions, metav1.Condition{Type: kueue.MultiKueueClusterActive, Status: metav1.ConditionFalse,
		Reason: "ClientConnectionFailed", Message: message})
	var refused atomic.Int32
	refuse := func(obj client.Object) error {
		wc, ok := obj.(*v1alpha1.WorkerCluster)
		if !ok || wc.Name != eu.name || wc.Status.Dispatch == nil || wc.Status.Dispatch.Active == nil || wc.Status.Dispatch.Active.Message != message {
			return nil
		}
		if refused.Add(1) > 1 {
			return nil
		}
		return apierrors.NewServiceUnavailable("the hub cluster is restarting")
	}
	w.refusing.Store(&refuse)
	t.Cleanup(func() { w.refusing.Store(nil) })

	if err := w.dispatcher.Judged(ctx, judged); !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("the judgement's first write: %v, want it refused", err)
	}
	wc := w.dispatchReady(t, eu, metav1.ConditionFalse, "ClientConnectionFailed")
	if c := apimeta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionDispatchReady); !strings.Contains(c.Message, message) {
		t.Errorf("DispatchReady says %q, not Kueue's judgement", c.Message)
	}
}

// testAnOlderJudgementIsPassedOver hands the dispatcher, after Kueue's judgement of the
// worker, the MultiKueueCluster as a read from before that judgement returned it: no
// Active condition, an older resourceVersion. The hub's Sync reads the
// MultiKueueClusters it has no judgement of, and that read can reach the dispatcher
// after the watch brought Kueue's judgement. Kueue says a judgement once, so the cluster
// would wait for the hub's Kueue until the hub's next resync.
func (w *world) testAnOlderJudgementIsPassedOver(t *testing.T) {
	eu := w.worker("gpu-eu")
	before := w.kueuesJudgement(t, eu)
	// Older than any version Kueue's judgement can have: the first one there is.
	before.ResourceVersion = "1"
	before.Status.Conditions = nil
	if err := w.dispatcher.Judged(t.Context(), before); err != nil {
		t.Fatal(err)
	}
	// Judged records before it returns: what it recorded is stored now.
	wc := w.workerCluster(t, eu)
	if c := apimeta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionDispatchReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("after an older read of its MultiKueueCluster, %s's DispatchReady is %+v, want True as Kueue judged", eu.name, c)
	}
}

// testAnAgentBackAfterAnOutageIsDispatchedToAtOnce keeps the agent away past the
// proxy's resume window, until Kueue, which tries a worker it cannot reach again after a
// wait that doubles each time, waits 80 s for its next try. The agent then comes back,
// and the cluster must take work again before that try, as the hub has Kueue try at
// once: a cluster that was away for minutes would otherwise wait up to five more.
func (w *world) testAnAgentBackAfterAnOutageIsDispatchedToAtOnce(t *testing.T) {
	eu := w.worker("gpu-eu")
	w.cutAgent(eu)
	back := false
	t.Cleanup(func() {
		if !back {
			w.startAgent(eu)
		}
	})
	poll.Until(t, "Kueue finds the worker unreachable once the proxy's resume window is over", func() (bool, string) {
		c := w.activeCondition(t, eu)
		return c.Status == metav1.ConditionFalse, fmt.Sprintf("Active=%s %s: %s", c.Status, c.Reason, c.Message)
	})
	// Kueue's own word on its next try, from its log. Its waits double from 5 s, so the
	// fifth failure in a row waits 80 s, up to 75 s after the first: longer than
	// poll.Deadline.
	var nextTry time.Time
	poll.Within(t, 3*time.Minute, "Kueue waits 80s for its next try", func() (bool, string) {
		at, after, ok := lastRetry(w.hubKueueLog.String(), eu.identity)
		if !ok {
			return false, "no failed try in Kueue's log"
		}
		nextTry = at.Add(after)
		return after >= 80*time.Second, fmt.Sprintf("its last failed try waits %s", after)
	})
	back = true
	w.startAgent(eu)
	w.dispatchReady(t, eu, metav1.ConditionTrue, v1alpha1.ReasonDispatchable)
	if now := time.Now(); !now.Before(nextTry) {
		t.Errorf("%s took work again at %s, after Kueue's own next try at %s: the agent's return did not make Kueue try at once",
			eu.name, now.Format(time.RFC3339), nextTry.Format(time.RFC3339))
	}
}

// lastRetry finds, in the output of Kueue's manager, its latest failed try to reach the
// worker identity: when it was, and how long Kueue waits before the next.
func lastRetry(log, identity string) (at time.Time, after time.Duration, ok bool) {
	for line := range strings.Lines(log) {
		// Decoded only when it may be one: the log is read again every poll.
		if !strings.Contains(line, `"setting client config"`) || !strings.Contains(line, identity) {
			continue
		}
		var e struct {
			TS         string   `json:"ts"`
			Msg        string   `json:"msg"`
			Name       string   `json:"name"`
			RetryAfter *float64 `json:"retryAfter"` // seconds
		}
		if json.Unmarshal([]byte(line), &e) != nil || e.Msg != "setting client config" || e.Name != identity || e.RetryAfter == nil {
			continue
		}
		ts, err := time.Parse(time.RFC3339Nano, e.TS)
		if err != nil {
			continue
		}
		at, after, ok = ts, time.Duration(*e.RetryAfter*float64(time.Second)), true
	}
	return at, after, ok
}

// kueuesJudgement is Kueue's judgement of the worker, its MultiKueueCluster, for a
// test to change and hand the dispatcher as its own. Kueue's is handed back when the
// test ends, as Kueue has no reason to say it again.
func (w *world) kueuesJudgement(t *testing.T, wk *worker) *kueue.MultiKueueCluster {
	t.Helper()
	var real kueue.MultiKueueCluster
	if err := w.hub.Client.Get(t.Context(), client.ObjectKey{Name: wk.identity}, &real); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.dispatcher.Judged(context.WithoutCancel(t.Context()), &real); err != nil {
			t.Errorf("handing Kueue's own judgement back: %v", err)
		}
		w.dispatchReady(t, wk, metav1.ConditionTrue, v1alpha1.ReasonDispatchable)
	})
	return real.DeepCopy()
}

// activeCondition is the Active condition of the worker's MultiKueueCluster on the hub.
func (w *world) activeCondition(t *testing.T, wk *worker) metav1.Condition {
	t.Helper()
	var mc kueue.MultiKueueCluster
	if err := w.hub.Client.Get(t.Context(), client.ObjectKey{Name: wk.identity}, &mc); err != nil {
		t.Fatalf("reading MultiKueueCluster %s: %v", wk.identity, err)
	}
	c := apimeta.FindStatusCondition(mc.Status.Conditions, kueue.MultiKueueClusterActive)
	if c == nil {
		t.Fatalf("MultiKueueCluster %s has no Active condition", wk.identity)
	}
	return *c
}

// neverEvicted fails the test if the hub's Kueue ever evicted j's workload or moved it
// off wk.
func (w *world) neverEvicted(t *testing.T, j *batchv1.Job, wk *worker) {
	t.Helper()
	wl, ok := w.hubWorkload(t, j)
	if !ok {
		t.Fatalf("no workload on the hub for job %s", j.Name)
	}
	if c := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted); c != nil {
		t.Errorf("job %s's workload was evicted: %s", j.Name, conditionOf(wl, kueue.WorkloadEvicted))
	}
	if s := wl.Status.SchedulingStats; s != nil && len(s.Evictions) > 0 {
		t.Errorf("job %s's workload counts evictions: %+v", j.Name, s.Evictions)
	}
	if got := ptr.Deref(wl.Status.ClusterName, ""); got != wk.identity {
		t.Errorf("job %s's workload is placed on %q, want %s", j.Name, got, wk.identity)
	}
}

func uidOf(j *batchv1.Job) any {
	if j == nil {
		return nil
	}
	return j.UID
}

func sameQuota(a, b corev1.ResourceList) bool {
	return slices.Equal(slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(b))) &&
		!slices.ContainsFunc(slices.Collect(maps.Keys(a)), func(r corev1.ResourceName) bool { q := a[r]; return q.Cmp(b[r]) != 0 })
}

package components

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/components/charts"
	"github.com/flotilla-gitops/flotilla/agent/components/installer"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/test/componenttest"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/dispatchtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// The CRDs whose UIDs must survive everything: deleting one deletes every object of it.
var keptCRDs = []string{"clusterqueues.kueue.x-k8s.io", "workloads.kueue.x-k8s.io", "localqueues.kueue.x-k8s.io", "jobsets.jobset.x-k8s.io"}

func TestAFreshWorkerGetsKueueAndJobSetAndKeepsItsWorkThroughAnUpgrade(t *testing.T) {
	worker := planes[1]
	kueueImage := components.Repository(components.Kueue, "") + ":v0.17.0"
	w := newWorld(t, "fresh", worker, kueueImage)

	t.Run("the cluster turns green only once Kueue answers and reports its ClusterQueue Active", func(t *testing.T) {
		// Kueue's image is held back: JobSet and the charts are installed, and Kueue does
		// not answer. The agent says so within its readiness wait, rather than hanging.
		wc := w.waitCondition(v1alpha1.ConditionWorkerConfigured, metav1.ConditionFalse, v1alpha1.ReasonComponentsConverging, longTimeout)
		c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionWorkerConfigured)
		if !strings.Contains(c.Message, "kueue v0.17.0: waiting for kueue v0.17.0 to answer") || !strings.Contains(c.Message, "admit no new work") {
			t.Errorf("WorkerConfigured says %q; want it to name Kueue v0.17.0 and what it waits for", c.Message)
		}
		if r := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionReady); r == nil || r.Status == metav1.ConditionTrue {
			t.Errorf("Ready = %+v while Kueue does not answer", r)
		}
		cq := &kueue.ClusterQueue{}
		if err := worker.Client.Get(t.Context(), client.ObjectKey{Name: clusterQ}, cq); !apierrors.IsNotFound(err) {
			t.Errorf("the ClusterQueue was applied before Kueue answered: %v", err)
		}

		held := time.Now()
		w.images.release(kueueImage)
		wc = w.waitCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReady, longTimeout)
		t.Logf("first connection to green: %v, of which Kueue's image was held back %v", time.Since(w.connectedAt).Round(time.Millisecond), held.Sub(w.connectedAt).Round(time.Millisecond))
		if err := worker.Client.Get(t.Context(), client.ObjectKey{Name: clusterQ}, cq); err != nil {
			t.Fatal(err)
		}
		if !meta.IsStatusConditionTrue(cq.Status.Conditions, kueue.ClusterQueueActive) {
			t.Errorf("the cluster is green and its ClusterQueue is not Active: %+v", cq.Status.Conditions)
		}
		for _, want := range []struct {
			c     componenttest.Component
			image string
		}{{componenttest.Kueue, kueueImage}, {componenttest.JobSet, "registry.k8s.io/jobset/jobset:v0.11.1"}} {
			p, ok := w.kubelet.Running(want.c)
			if !ok || p.Image != want.image {
				t.Errorf("%s runs %q (running %t), want the release image %s", want.c, p.Image, ok, want.image)
			}
		}
		for _, s := range wc.Status.Components {
			if !s.Ready || !s.Managed {
				t.Errorf("status.components: %+v, want ready and managed", s)
			}
		}
		if len(wc.Status.Components) != 2 {
			t.Errorf("status.components = %+v, want kueue and jobset", wc.Status.Components)
		}
	})

	var work *running
	t.Run("an upgrade in place holds the ClusterQueue and keeps the running work", func(t *testing.T) {
		work = startWork(t, worker)
		crds := crdUIDs(t, worker)
		cqUID := w.clusterQueue(t).UID

		// The next chart version, as a new release of the component brings it, and a
		// registry mirror: Helm upgrades the release, and Kueue's pod template changes.
		w.installer.use(&installer.Installer{Config: worker.Config, Log: w.log.Logger().With("side", "installer"), Images: allowed,
			Chart: func(c components.Component, version string) ([]byte, error) {
				if c == components.Kueue {
					return componenttest.BumpedChart(t, c, version, "0.17.1-flotilla.1"), nil
				}
				return charts.Archive(c, version)
			}})
		mirrored := components.Repository(components.Kueue, "mirror.example.test") + ":v0.17.0"
		w.images.hold(mirrored)
		w.change(func(s *components.Spec) { s.Registry = "mirror.example.test" })

		wc := w.waitCondition(v1alpha1.ConditionWorkerConfigured, metav1.ConditionFalse, v1alpha1.ReasonComponentsConverging, longTimeout)
		t.Logf("while the new Kueue is held back: %s", meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionWorkerConfigured).Message)
		if cq := w.clusterQueue(t); cq.Spec.StopPolicy == nil || *cq.Spec.StopPolicy != kueue.Hold {
			t.Errorf("the ClusterQueue's stopPolicy is %v while Kueue is being replaced, want Hold", cq.Spec.StopPolicy)
		}
		work.wantKept(t, worker)

		w.images.release(mirrored)
		w.waitCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReady, longTimeout)
		cq := w.clusterQueue(t)
		if cq.Spec.StopPolicy != nil && *cq.Spec.StopPolicy != kueue.None {
			t.Errorf("the ClusterQueue is still stopped (%s) after the upgrade", *cq.Spec.StopPolicy)
		}
		if cq.UID != cqUID {
			t.Errorf("the ClusterQueue was replaced: uid %s, was %s", cq.UID, cqUID)
		}
		if got := crdUIDs(t, worker); !mapsEqual(got, crds) {
			t.Errorf("CRDs replaced by the upgrade: %v, were %v", got, crds)
		}
		work.wantKept(t, worker)
		p, _ := w.kubelet.Running(componenttest.Kueue)
		if p.Image != mirrored || p.Rollouts < 2 {
			t.Errorf("Kueue runs %s after %d rollouts, want %s after an upgrade", p.Image, p.Rollouts, mirrored)
		}
		dep := &appsv1.Deployment{}
		if err := worker.Client.Get(t.Context(), client.ObjectKey{Namespace: "kueue-system", Name: "kueue-controller-manager"}, dep); err != nil {
			t.Fatal(err)
		}
		if got := dep.Labels["helm.sh/chart"]; got != "kueue-0.17.1-flotilla.1" {
			t.Errorf("Kueue's Deployment is of chart %q, want the bumped kueue-0.17.1-flotilla.1", got)
		}
	})

	t.Run("reset --dry-run lists exactly what reset removes, and neither touches the work or the CRDs", func(t *testing.T) {
		if work == nil {
			t.Fatal("no work was started")
		}
		w.stopAgent()
		// The customer's job finished, as work does before a cluster is handed back: a
		// ClusterQueue with admitted work waits for it before it goes, and reset keeps
		// Kueue until then.
		work.finish(t, worker)
		crds := crdUIDs(t, worker)
		kc := filepath.Join(t.TempDir(), "worker.kubeconfig")
		if err := os.WriteFile(kc, worker.KubeConfig, 0o600); err != nil {
			t.Fatal(err)
		}
		reset := func(args ...string) string {
			cmd := exec.CommandContext(t.Context(), binary(t, "flotilla-agent"), append([]string{"reset", "--components",
				"--kubeconfig", kc, "--identity", w.identity, "--namespace", agentNamespace,
				"--components-binary", binary(t, components.BinaryName)}, args...)...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("reset %v: %v\n%s", args, err, out.String())
			}
			return out.String()
		}
		plan := reset("--dry-run")
		if got := crdUIDs(t, worker); !mapsEqual(got, crds) {
			t.Fatalf("the dry run changed CRDs")
		}
		if _, err := w.clusterQueueErr(t); err != nil {
			t.Fatalf("the dry run removed the ClusterQueue: %v\n%s", err, plan)
		}
		planned := items(plan, "Will remove")
		done := reset()
		removed := items(done, "Removed")
		slices.Sort(planned)
		slices.Sort(removed)
		if !slices.Equal(planned, removed) || len(planned) == 0 {
			t.Errorf("the dry run planned\n  %s\nand reset removed\n  %s\n\nplan:\n%s\nreset:\n%s",
				strings.Join(planned, "\n  "), strings.Join(removed, "\n  "), plan, done)
		}
		for _, line := range removed {
			if strings.Contains(line, "CustomResourceDefinition") || strings.Contains(line, "Namespace ") {
				t.Errorf("reset removed %s", line)
			}
		}
		if got := crdUIDs(t, worker); !mapsEqual(got, crds) {
			t.Errorf("reset changed the CRDs: %v, were %v", got, crds)
		}
		work.wantStill(t, worker)
		if !strings.Contains(done, "NEW enrollment token") {
			t.Errorf("reset does not say that enrolling again needs a new token:\n%s", done)
		}
	})
}

func TestAKueueInstalledByHandIsRefusedUntilTheClusterHandsItOver(t *testing.T) {
	worker := planes[2]
	ctx := t.Context()
	// Kueue's CRDs as `kubectl apply` of its release manifests leaves them: not Helm's.
	handCRDs := installKueueCRDsByHand(t, worker)
	for _, ns := range []string{"kueue-system"} {
		if err := worker.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	w := newWorld(t, "brownfield", worker)

	wc := w.waitCondition(v1alpha1.ConditionWorkerConfigured, metav1.ConditionFalse, v1alpha1.ReasonComponentRefused, longTimeout)
	msg := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionWorkerConfigured).Message
	for _, want := range []string{"kueue v0.17.0", "adopt: true", "managed: false"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal %q does not say %q", msg, want)
		}
	}
	if got := crdUIDsOf(t, worker, handCRDs); !mapsEqual(got, handCRDs) {
		t.Errorf("the refusal changed the hand-installed CRDs")
	}
	if releases := helmReleases(t, worker, "kueue-system"); len(releases) > 0 {
		t.Errorf("a refused Kueue got a Helm release: %v", releases)
	}

	// cluster.yaml says `components: {adopt: true}`.
	w.change(func(s *components.Spec) { s.Adopt = true })
	w.waitCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReady, longTimeout)
	if got := crdUIDsOf(t, worker, handCRDs); !mapsEqual(got, handCRDs) {
		t.Errorf("adoption replaced CRDs: %v, were %v", got, handCRDs)
	}
	if releases := helmReleases(t, worker, "kueue-system"); len(releases) == 0 {
		t.Error("the adopted Kueue has no Helm release")
	}
	if _, err := w.kubelet.WaitRunning(ctx, componenttest.Kueue); err != nil {
		t.Error(err)
	}
}

// installKueueCRDsByHand applies Kueue's CRDs from its module, as `kubectl apply` of its
// release manifests would, and returns their UIDs by name.
func installKueueCRDsByHand(t *testing.T, worker *controlplane.ControlPlane) map[string]types.UID {
	t.Helper()
	dir, err := controlplane.ModuleDir(t.Context(), "sigs.k8s.io/kueue")
	if err != nil {
		t.Fatal(err)
	}
	crds, err := envtest.InstallCRDs(worker.Config, envtest.CRDInstallOptions{Paths: []string{filepath.Join(dir, "config", "components", "crd", "bases")}, ErrorIfPathMissing: true})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]types.UID{}
	for _, crd := range crds {
		out[crd.Name] = ""
	}
	return crdUIDsOf(t, worker, out)
}

func (w *world) clusterQueue(t *testing.T) *kueue.ClusterQueue {
	t.Helper()
	cq, err := w.clusterQueueErr(t)
	if err != nil {
		t.Fatal(err)
	}
	return cq
}

func (w *world) clusterQueueErr(t *testing.T) (*kueue.ClusterQueue, error) {
	cq := &kueue.ClusterQueue{}
	return cq, w.worker.Client.Get(t.Context(), client.ObjectKey{Name: clusterQ}, cq)
}

// running is a customer's work on the worker: a Job whose pod runs and a JobSet, each
// admitted by Kueue.
type running struct {
	job       *batchv1.Job
	jobSet    *jobset.JobSet
	workloads map[types.UID]kueue.WorkloadStatus // by owner UID
	uids      map[string]types.UID
}

func startWork(t *testing.T, worker *controlplane.ControlPlane) *running {
	t.Helper()
	ctx := t.Context()
	c := worker.Client
	queued := map[string]string{"kueue.x-k8s.io/queue-name": localQueue}
	podSpec := corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
		Name: "train", Image: "registry.k8s.io/pause:3.10",
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}},
	}}}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: workloads, Name: "train", Labels: queued},
		Spec:       batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: podSpec}},
	}
	js := &jobset.JobSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: workloads, Name: "sweep", Labels: queued},
		Spec: jobset.JobSetSpec{Suspend: ptr.To(true), ReplicatedJobs: []jobset.ReplicatedJob{{
			Name: "workers", Replicas: 1,
			Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: podSpec}}},
		}}},
	}
	for _, o := range []client.Object{job, js} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	r := &running{job: job, jobSet: js, workloads: map[types.UID]kueue.WorkloadStatus{}, uids: map[string]types.UID{}}
	poll.Until(t, "Kueue admits the Job and the JobSet", func() (bool, string) {
		wls := admitted(t, worker)
		if len(wls) < 2 {
			return false, "admitted: " + strings.Join(slices.Collect(func(yield func(string) bool) {
				for _, wl := range wls {
					yield(wl.Name)
				}
			}), ", ")
		}
		for _, wl := range wls {
			r.workloads[wl.OwnerReferences[0].UID] = wl.Status
			r.uids["Workload "+wl.Name] = wl.UID
		}
		return true, ""
	})
	// Admitted, the Job is unsuspended by Kueue; its pod runs, as the nodes would say.
	poll.Until(t, "Kueue starts the Job", func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return false, err.Error()
		}
		return !ptr.Deref(job.Spec.Suspend, true), "still suspended"
	})
	if err := dispatchtest.StartJob(ctx, c, job); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(js), js); err != nil {
		t.Fatal(err)
	}
	r.uids["Job train"], r.uids["JobSet sweep"] = job.UID, js.UID
	return r
}

// admitted lists the Workloads of the workload namespace that Kueue admitted.
func admitted(t *testing.T, worker *controlplane.ControlPlane) []kueue.Workload {
	t.Helper()
	list := &kueue.WorkloadList{}
	if err := worker.Client.List(t.Context(), list, client.InNamespace(workloads)); err != nil {
		t.Fatal(err)
	}
	var out []kueue.Workload
	for _, wl := range list.Items {
		if meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted) && len(wl.OwnerReferences) > 0 {
			out = append(out, wl)
		}
	}
	return out
}

// wantKept checks that the work is as it was: the same objects (UIDs), still admitted
// with the same admission, and the Job's pod still running.
func (r *running) wantKept(t *testing.T, worker *controlplane.ControlPlane) {
	t.Helper()
	r.wantStill(t, worker)
	wls := admitted(t, worker)
	if len(wls) != len(r.workloads) {
		t.Errorf("%d workloads admitted, want %d", len(wls), len(r.workloads))
	}
	for _, wl := range wls {
		before, ok := r.workloads[wl.OwnerReferences[0].UID]
		if !ok || !equalAdmission(before.Admission, wl.Status.Admission) {
			t.Errorf("Workload %s's admission changed: %+v, was %+v", wl.Name, wl.Status.Admission, before.Admission)
		}
	}
	job := &batchv1.Job{}
	if err := worker.Client.Get(t.Context(), client.ObjectKeyFromObject(r.job), job); err != nil {
		t.Fatal(err)
	}
	if job.Status.Active != 1 || !job.Status.StartTime.Equal(r.job.Status.StartTime) || ptr.Deref(job.Spec.Suspend, false) {
		t.Errorf("the running Job was disturbed: suspend %v, status %+v", job.Spec.Suspend, job.Status)
	}
}

// wantStill checks that the work's objects are the same ones.
func (r *running) wantStill(t *testing.T, worker *controlplane.ControlPlane) {
	t.Helper()
	for name, uid := range r.uids {
		kind, n, _ := strings.Cut(name, " ")
		var obj client.Object
		switch kind {
		case "Job":
			obj = &batchv1.Job{}
		case "JobSet":
			obj = &jobset.JobSet{}
		case "Workload":
			obj = &kueue.Workload{}
		}
		if err := worker.Client.Get(t.Context(), client.ObjectKey{Namespace: workloads, Name: n}, obj); err != nil {
			t.Errorf("%s: %v", name, err)
		} else if obj.GetUID() != uid {
			t.Errorf("%s was replaced: uid %s, was %s", name, obj.GetUID(), uid)
		}
	}
}

// finish ends the work: the pods of the Job and of the JobSet's Job succeeded, as the
// nodes would say. Kueue then lets go of the ClusterQueue.
func (r *running) finish(t *testing.T, worker *controlplane.ControlPlane) {
	t.Helper()
	ctx := t.Context()
	jobs := &batchv1.JobList{}
	if err := worker.Client.List(ctx, jobs, client.InNamespace(workloads), client.MatchingLabels{jobset.JobSetNameKey: r.jobSet.Name}); err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items) == 0 {
		t.Fatal("JobSet's manager made no Job for the JobSet")
	}
	for _, j := range append(jobs.Items, *r.job) {
		if err := dispatchtest.CompleteJob(ctx, worker.Client, &j); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, "Kueue releases the ClusterQueue", func() (bool, string) {
		cq := &kueue.ClusterQueue{}
		if err := worker.Client.Get(ctx, client.ObjectKey{Name: clusterQ}, cq); err != nil {
			return false, err.Error()
		}
		return cq.Status.AdmittedWorkloads == 0, "admitted workloads remain"
	})
}

func equalAdmission(a, b *kueue.Admission) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.ClusterQueue == b.ClusterQueue && len(a.PodSetAssignments) == len(b.PodSetAssignments)
}

func crdUIDs(t *testing.T, worker *controlplane.ControlPlane) map[string]types.UID {
	t.Helper()
	want := map[string]types.UID{}
	for _, n := range keptCRDs {
		want[n] = ""
	}
	return crdUIDsOf(t, worker, want)
}

// crdUIDsOf reads the UIDs of the CRDs names names.
func crdUIDsOf(t *testing.T, worker *controlplane.ControlPlane, names map[string]types.UID) map[string]types.UID {
	t.Helper()
	out := map[string]types.UID{}
	for n := range names {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := worker.Client.Get(t.Context(), client.ObjectKey{Name: n}, crd); err != nil {
			t.Fatalf("CRD %s: %v", n, err)
		}
		out[n] = crd.UID
	}
	return out
}

func mapsEqual(a, b map[string]types.UID) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// helmReleases are the names of the Helm release records in namespace.
func helmReleases(t *testing.T, worker *controlplane.ControlPlane, namespace string) []string {
	t.Helper()
	list := &corev1.SecretList{}
	if err := worker.Client.List(t.Context(), list, client.InNamespace(namespace), client.MatchingLabels{"owner": "helm"}); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range list.Items {
		out = append(out, s.Name)
	}
	return out
}

// items are the "  - " lines of the sections of out whose heading starts with heading.
func items(out, heading string) []string {
	var list []string
	in := false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "  - "):
			if in {
				item := strings.TrimPrefix(line, "  - ")
				// The plan says why an object is listed; the result names it only.
				if i := strings.Index(item, " ("); i > 0 {
					item = item[:i]
				}
				list = append(list, item)
			}
		case line != "":
			in = strings.HasPrefix(line, heading)
		}
	}
	return list
}

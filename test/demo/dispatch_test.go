//go:build demo

package demo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/agent/proxy"
	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/dispatchtest"
	"github.com/flotilla-gitops/flotilla/test/kueuetest"
)

const (
	// pool is the dispatch pool both demo clusters are in: fleet.yaml declares none, so
	// each residency is one, and both clusters are in residency us.
	pool = "us"
	// workloadNamespace is the template fleet.yaml's workload namespace: on the hub it
	// holds the pool's LocalQueue, on the workers the jobs the hub sends them.
	workloadNamespace = "ml-training"
	// jobUIDLabel is how Kueue ties a Workload to its Job.
	jobUIDLabel = "kueue.x-k8s.io/job-uid"
)

// jobManifest is what a user submits to the hub: a batch Job for the pool's LocalQueue.
// generateName lets the same file be created again and again.
var jobManifest = fmt.Sprintf(`# A one-GPU job for the hub. It goes to the LocalQueue of dispatch pool %[1]q in the
# workload namespace %[2]s; the hub's Kueue admits it against the pool's quota (the sum
# of its clusters') and MultiKueue runs it on one cluster of the pool.
apiVersion: batch/v1
kind: Job
metadata:
  generateName: train-
  namespace: %[2]s
  labels:
    kueue.x-k8s.io/queue-name: %[1]s
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: train
          image: nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04
          command: ["nvidia-smi"]
          resources:
            requests: {nvidia.com/gpu: 1}
            limits: {nvidia.com/gpu: 1}
`, pool, workloadNamespace)

// kueueManager is the Kueue manager of one plane, its output in logs/kueue-<name>.log.
type kueueManager struct {
	name, log string
	m         *kueuetest.Manager
}

// startKueue runs the real Kueue manager on every plane at once: on the hub as the
// MultiKueue manager with the configuration dispatch needs (reconciler/dispatch, the
// default workerLostTimeout), on each worker with the integrations the hub sends there.
func (d *demo) startKueue() {
	done := d.step("Starting the real Kueue manager on each plane: the hub's is the MultiKueue manager (origin %s, workerLostTimeout %s)",
		dispatch.Origin, dispatch.DefaultWorkerLostTimeout)
	type kueuePlane struct {
		name  string
		plane *controlplane.ControlPlane
		cfg   *configapi.Configuration
	}
	planes := []kueuePlane{{"hub", d.hubPlane, dispatch.HubKueueConfiguration(dispatch.DefaultWorkerLostTimeout)}}
	for _, w := range d.workers {
		planes = append(planes, kueuePlane{w.name, w.plane, dispatch.WorkerKueueConfiguration()})
	}
	logs := make([]*os.File, len(planes))
	for i, p := range planes {
		f, err := os.OpenFile(filepath.Join(d.logs, "kueue-"+p.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			d.fail("%v", err)
		}
		d.t.Cleanup(func() { _ = f.Close() })
		logs[i] = f
	}
	managers := make([]*kueueManager, len(planes))
	var g errgroup.Group
	for i, p := range planes {
		g.Go(func() error {
			m, err := kueuetest.Start(d.run, p.plane, kueuetest.Options{Config: p.cfg, Output: logs[i]})
			if err != nil {
				return fmt.Errorf("the Kueue manager of %s: %w", p.name, err)
			}
			managers[i] = &kueueManager{name: "kueue " + p.name, log: logs[i].Name(), m: m}
			return nil
		})
	}
	err := g.Wait()
	// Registered after the planes' stop, so they stop first, while their API servers
	// still answer the removal of their webhooks.
	for _, k := range managers {
		if k == nil {
			continue
		}
		d.kueue = append(d.kueue, k)
		d.t.Cleanup(func() {
			if err := k.m.Stop(); err != nil {
				d.t.Errorf("stopping %s: %v", k.name, err)
			}
		})
	}
	if err != nil {
		d.fail("%v", err)
	}
	for _, k := range d.kueue {
		d.say("    %s: ready in %s, webhooks installed (log: logs/%s)", k.name, k.m.StartDuration.Round(100*time.Millisecond), filepath.Base(k.log))
	}
	done()
}

// installDispatchRBAC creates on the worker what the agent chart's dispatch.yaml
// creates: the ServiceAccount flotilla-dispatch, bound to exactly what MultiKueue
// calls, which the agent impersonates for every request the hub's Kueue sends.
func (d *demo) installDispatchRBAC(w *worker) {
	if _, err := dispatchtest.InstallAgentRBAC(d.run, w.plane.Client, w.plane.Config, agentNamespace, nil); err != nil {
		d.fail("installing the dispatch RBAC on %s: %v", w.name, err)
	}
	d.say("    the agent chart's dispatch RBAC on %s: ServiceAccount %s/%s may %s in the workload namespaces (bound there by the agent) and %s across them, by the hub's origin; the agent may impersonate it and no one else",
		w.name, agentNamespace, proxy.DefaultServiceAccount,
		rulesSummary(proxy.NamespacedPolicyRules(proxy.Allowlist(proxy.DefaultIntegrations()))),
		rulesSummary(proxy.ClusterPolicyRules(proxy.Allowlist(proxy.DefaultIntegrations()))))
}

// rulesSummary is what rules let flotilla-dispatch do, in a line.
func rulesSummary(rules []rbacv1.PolicyRule) string {
	var parts []string
	for _, r := range rules {
		parts = append(parts, strings.Join(r.Verbs, ",")+" "+strings.Join(r.Resources, ","))
	}
	return strings.Join(parts, "; ")
}

// dispatchJob submits a job to the hub and follows it: admitted on the hub, created
// on a worker through the tunnel, run by the worker's nodes (played by the demo), and
// finished on the hub with the worker's status copied back.
func (d *demo) dispatchJob() {
	began := time.Now()
	job := d.submitJob()
	wl, w := d.admittedOnHub(job)
	remote := d.createdOnWorker(job, w)
	d.playNodes(job, remote, w)
	d.finishedOnHub(job, wl, w)
	d.say("\nThe job went from the hub to %s and back in %s (%s after the control planes started).",
		w.name, time.Since(began).Round(100*time.Millisecond), time.Since(d.began).Round(100*time.Millisecond))
}

// submitJob writes the job's manifest to jobs/train.yaml and creates it on the hub,
// as `kubectl create -f` would.
func (d *demo) submitJob() *batchv1.Job {
	done := d.step("Submitting a GPU job to the hub: jobs/train.yaml, to the LocalQueue %q (dispatch pool of residency us) in %s", pool, workloadNamespace)
	file := filepath.Join(d.root, "jobs", "train.yaml")
	if err := os.WriteFile(file, []byte(jobManifest), 0o644); err != nil {
		d.fail("%v", err)
	}
	job := &batchv1.Job{}
	if err := yaml.UnmarshalStrict([]byte(jobManifest), job); err != nil {
		d.fail("reading %s: %v", file, err)
	}
	d.say("    $ kubectl --kubeconfig kubeconfigs/hub.yaml create -f jobs/train.yaml   (the demo does the same with client-go)")
	if err := d.hubPlane.Client.Create(d.run, job); err != nil {
		d.fail("creating the job of jobs/train.yaml on the hub: %v", err)
	}
	d.say("    job.batch/%s created in %s on the hub; the hub's Kueue suspends it until it is admitted", job.Name, job.Namespace)
	done()
	return job
}

// admittedOnHub waits until the hub's Kueue admits the job's workload: quota reserved
// in the pool's ClusterQueue, and MultiKueue's admission check Ready once a worker of
// the pool reserved quota for it. It returns the workload and that worker.
func (d *demo) admittedOnHub(job *batchv1.Job) (*kueue.Workload, *worker) {
	done := d.step("Waiting for the hub's Kueue to admit the job")
	var (
		wl     *kueue.Workload
		placed *worker
		seen   = map[string]bool{} // what was said already
	)
	d.wait("the job admitted on the hub", 200*time.Millisecond, func() (bool, string) {
		got, why := d.hubWorkload(d.run, job)
		if got == nil {
			return false, why
		}
		wl = got
		if c := meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadQuotaReserved); c != nil && c.Status == metav1.ConditionTrue && !seen["reserved"] {
			seen["reserved"] = true
			cq := "-"
			if a := wl.Status.Admission; a != nil {
				cq = string(a.ClusterQueue)
			}
			d.say("    workload %s/%s: quota reserved in the hub's ClusterQueue %s (the pool's clusters' quotas summed)", wl.Namespace, wl.Name, cq)
		}
		admitted := meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted)
		cluster := ptr.Deref(wl.Status.ClusterName, "")
		if !admitted || cluster == "" {
			return false, fmt.Sprintf("workload %s: %s; admission checks: %s", wl.Name, conditionLine(wl.Status.Conditions, kueue.WorkloadAdmitted), checksLine(wl))
		}
		if placed = d.workerByIdentity(cluster); placed == nil {
			d.fail("the hub's Kueue placed job %s on %q, which is none of the demo's clusters", job.Name, cluster)
		}
		return true, ""
	})
	for _, s := range wl.Status.AdmissionChecks {
		d.say("    admission check %s (MultiKueue): %s: %s", s.Name, s.State, s.Message)
	}
	d.say("    admitted on the hub and placed on %s (MultiKueueCluster %s)", placed.name, ptr.Deref(wl.Status.ClusterName, ""))
	done()
	return wl, placed
}

// createdOnWorker waits until the worker has the job, created by the hub's Kueue
// through the hub's API proxy and the worker's tunnel, and its own Kueue has admitted
// and unsuspended it. No other worker may have a copy.
func (d *demo) createdOnWorker(job *batchv1.Job, w *worker) *batchv1.Job {
	done := d.step("The job on %s, created by the hub's Kueue through the tunnel", w.name)
	server, err := d.proxyServer(w)
	if err != nil {
		d.fail("%v", err)
	}
	d.say("    the hub's Kueue reaches %s at %s (kubeconfig Secret %s/%s): the hub's API proxy, which carries",
		w.name, server, kueuetest.Namespace, dispatch.KubeConfigSecretName(fleet.Identity(tenant, w.name)))
	d.say("    each request over %s's tunnel to its agent, which forwards it as %s/%s", w.name, agentNamespace, proxy.DefaultServiceAccount)
	var remote batchv1.Job
	d.wait(fmt.Sprintf("job %s running on %s", job.Name, w.name), 200*time.Millisecond, func() (bool, string) {
		for _, other := range d.workers {
			if other == w {
				continue
			}
			if _, ok, _ := workerJob(d.run, other, job); ok {
				d.fail("job %s is on %s too: the hub placed it on %s", job.Name, other.name, w.name)
			}
		}
		got, ok, err := workerJob(d.run, w, job)
		switch {
		case err != nil:
			return false, err.Error()
		case !ok:
			return false, "no job on " + w.name + " yet"
		}
		remote = *got
		return !ptr.Deref(remote.Spec.Suspend, true), fmt.Sprintf("the job on %s is suspended: its Kueue has not admitted it yet", w.name)
	})
	origin := remote.Labels[kueue.MultiKueueOriginLabel]
	if origin != dispatch.Origin {
		d.fail("the job on %s has %s=%q, want %q: the hub's Kueue did not create it", w.name, kueue.MultiKueueOriginLabel, origin, dispatch.Origin)
	}
	d.say("    job.batch/%s in %s on %s: %s=%s; admitted by %s's own Kueue (LocalQueue %s) and unsuspended",
		remote.Name, remote.Namespace, w.name, kueue.MultiKueueOriginLabel, origin, w.name, remote.Labels["kueue.x-k8s.io/queue-name"])
	var others []string
	for _, other := range d.workers {
		if other != w {
			others = append(others, other.name)
		}
	}
	d.say("    %s has no copy: a job runs on one cluster of its pool", strings.Join(others, ", "))
	done()
	return &remote
}

// playNodes plays the worker's nodes, which cannot run here, and shows the running
// state reaching the hub.
func (d *demo) playNodes(job, remote *batchv1.Job, w *worker) {
	done := d.step("Playing %s's nodes: no kubelet runs on these machines, so the demo writes the Job status that %s's job controller would", w.name, w.name)
	if err := dispatchtest.StartJob(d.run, w.plane.Client, remote); err != nil {
		d.fail("%v", err)
	}
	d.say("    %s: job %s started (1 active pod), as its nodes would report it", w.name, remote.Name)
	d.wait(fmt.Sprintf("the hub's job %s showing its pod running on %s", job.Name, w.name), 200*time.Millisecond, func() (bool, string) {
		got, err := d.hubJob(job)
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Active == 1, fmt.Sprintf("hub job status: active %d", got.Status.Active)
	})
	d.say("    hub: job %s shows 1 active pod, copied back from %s by the hub's Kueue", job.Name, w.name)
	if err := dispatchtest.CompleteJob(d.run, w.plane.Client, remote); err != nil {
		d.fail("%v", err)
	}
	d.say("    %s: job %s succeeded (1 pod), as its nodes would report it", w.name, remote.Name)
	done()
}

// finishedOnHub waits until the hub's job is Complete with the worker's status, and
// its workload finished.
func (d *demo) finishedOnHub(job *batchv1.Job, wl *kueue.Workload, w *worker) {
	done := d.step("Waiting for the job to finish on the hub")
	var got *batchv1.Job
	d.wait(fmt.Sprintf("job %s complete on the hub", job.Name), 200*time.Millisecond, func() (bool, string) {
		var err error
		if got, err = d.hubJob(job); err != nil {
			return false, err.Error()
		}
		for _, c := range got.Status.Conditions {
			if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("hub job status: active %d, succeeded %d", got.Status.Active, got.Status.Succeeded)
	})
	completed := "-"
	if t := got.Status.CompletionTime; t != nil {
		completed = t.UTC().Format(time.RFC3339)
	}
	d.say("    hub: job %s Complete, succeeded %d, completed at %s: the status %s's job controller would write, copied back",
		job.Name, got.Status.Succeeded, completed, w.name)
	d.wait(fmt.Sprintf("workload %s finished on the hub", wl.Name), 200*time.Millisecond, func() (bool, string) {
		var cur kueue.Workload
		if err := d.hubPlane.Client.Get(d.run, client.ObjectKeyFromObject(wl), &cur); err != nil {
			return false, err.Error()
		}
		return meta.IsStatusConditionTrue(cur.Status.Conditions, kueue.WorkloadFinished), conditionLine(cur.Status.Conditions, kueue.WorkloadFinished)
	})
	d.say("    hub: workload %s Finished; its quota in the pool is free again", wl.Name)
	done()
}

// hubWorkload is the Workload the hub's Kueue made for job, or why there is none yet.
func (d *demo) hubWorkload(ctx context.Context, job *batchv1.Job) (*kueue.Workload, string) {
	var list kueue.WorkloadList
	if err := d.hubPlane.Client.List(ctx, &list, client.InNamespace(job.Namespace), client.MatchingLabels{jobUIDLabel: string(job.UID)}); err != nil {
		return nil, fmt.Sprintf("listing the workloads of job %s on the hub: %v", job.Name, err)
	}
	if len(list.Items) != 1 {
		return nil, fmt.Sprintf("%d workloads of job %s on the hub", len(list.Items), job.Name)
	}
	return &list.Items[0], ""
}

func (d *demo) hubJob(job *batchv1.Job) (*batchv1.Job, error) {
	var got batchv1.Job
	if err := d.hubPlane.Client.Get(d.run, client.ObjectKeyFromObject(job), &got); err != nil {
		return nil, fmt.Errorf("reading job %s/%s on the hub: %w", job.Namespace, job.Name, err)
	}
	return &got, nil
}

// workerJob reads w's copy of the hub's job; false when there is none.
func workerJob(ctx context.Context, w *worker, job *batchv1.Job) (*batchv1.Job, bool, error) {
	var got batchv1.Job
	err := w.plane.Client.Get(ctx, client.ObjectKeyFromObject(job), &got)
	switch {
	case apierrors.IsNotFound(err):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("reading job %s/%s on %s: %w", job.Namespace, job.Name, w.name, err)
	}
	return &got, true, nil
}

func (d *demo) workerByIdentity(identity string) *worker {
	for _, w := range d.workers {
		if fleet.Identity(tenant, w.name) == identity {
			return w
		}
	}
	return nil
}

// proxyServer is the server of the kubeconfig the hub wrote for w's MultiKueueCluster.
// Only the server is read out: the Secret also holds the worker's proxy token.
func (d *demo) proxyServer(w *worker) (string, error) {
	name := dispatch.KubeConfigSecretName(fleet.Identity(tenant, w.name))
	var sec corev1.Secret
	if err := d.hubPlane.Client.Get(d.run, client.ObjectKey{Namespace: kueuetest.Namespace, Name: name}, &sec); err != nil {
		return "", fmt.Errorf("reading the kubeconfig Secret %s/%s of %s on the hub: %w", kueuetest.Namespace, name, w.name, err)
	}
	cfg, err := clientcmd.Load(sec.Data[dispatch.KubeConfigKey])
	if err != nil {
		return "", fmt.Errorf("the kubeconfig Secret %s/%s of %s: %w", kueuetest.Namespace, name, w.name, err)
	}
	for _, c := range cfg.Clusters {
		return c.Server, nil
	}
	return "", fmt.Errorf("the kubeconfig Secret %s/%s of %s names no cluster", kueuetest.Namespace, name, w.name)
}

// conditionLine is a condition as the demo prints it.
func conditionLine(conds []metav1.Condition, typ string) string {
	if c := meta.FindStatusCondition(conds, typ); c != nil {
		return fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message)
	}
	return typ + " not yet set"
}

// checksLine is the state of a workload's admission checks.
func checksLine(wl *kueue.Workload) string {
	if len(wl.Status.AdmissionChecks) == 0 {
		return "none yet"
	}
	parts := make([]string, len(wl.Status.AdmissionChecks))
	for i, s := range wl.Status.AdmissionChecks {
		parts[i] = fmt.Sprintf("%s %s: %s", s.Name, s.State, s.Message)
	}
	return strings.Join(parts, "; ")
}

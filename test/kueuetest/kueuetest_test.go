package kueuetest_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/kueuetest"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// planes[0] runs one manager at a time for the single-cluster tests; planes[1] is a MultiKueue
// hub and planes[2] its worker.
var planes []*controlplane.ControlPlane

// orphanEnv switches the test binary into the helper process of
// TestManagerDiesWithTheTestProcess: it runs no tests, only one plane and one manager, until it
// is killed.
const orphanEnv = "FLOTILLA_KUEUETEST_ORPHAN"

func TestMain(m *testing.M) {
	if os.Getenv(orphanEnv) != "" {
		os.Exit(runOrphan())
	}
	controlplane.Main(m, 3, &planes, controlplane.Options{})
}

// runOrphan starts a plane and a manager, prints the manager's pid and waits to be killed.
func runOrphan() int {
	ctx := context.Background()
	ps, err := controlplane.Start(ctx, 1, controlplane.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	m, err := kueuetest.Start(ctx, ps[0], kueuetest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, errors.Join(err, controlplane.StopAll(ps)))
		return 1
	}
	fmt.Printf("KUEUE %d\n", m.Pid())
	// The parent kills this process; the deadline only bounds a broken parent.
	time.Sleep(3 * time.Minute)
	return 1
}

const (
	queueLabel     = "kueue.x-k8s.io/queue-name"
	jobUIDLabel    = "kueue.x-k8s.io/job-uid"
	mutatingName   = "kueue-mutating-webhook-configuration"
	validatingName = "kueue-validating-webhook-configuration"
)

// start runs a manager against plane for the rest of the test.
func start(t *testing.T, plane *controlplane.ControlPlane, cfg *configapi.Configuration) *kueuetest.Manager {
	t.Helper()
	out := &logtest.Buffer{}
	m, err := kueuetest.Start(t.Context(), plane, kueuetest.Options{
		Config: cfg,
		Output: out,
		Log:    slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("last output of the kueue manager on %s:\n%s", plane.Name, out.Last(32<<10))
		}
	})
	return m
}

// queue creates, on plane, a namespace for the test, a ResourceFlavor, a ClusterQueue with cpu
// quota and a LocalQueue, all named after the test, and returns the namespace and the
// LocalQueue's name. checks are admission checks the ClusterQueue requires.
func queue(t *testing.T, plane *controlplane.ControlPlane, name, cpu string, checks ...string) (namespace, localQueue string) {
	t.Helper()
	ctx := t.Context()
	c := plane.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	rf := &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: name}}
	cq := &kueue.ClusterQueue{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: kueue.ClusterQueueSpec{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": name}},
			ResourceGroups: []kueue.ResourceGroup{{
				CoveredResources: []corev1.ResourceName{corev1.ResourceCPU},
				Flavors: []kueue.FlavorQuotas{{
					Name:      kueue.ResourceFlavorReference(name),
					Resources: []kueue.ResourceQuota{{Name: corev1.ResourceCPU, NominalQuota: resource.MustParse(cpu)}},
				}},
			}},
		},
	}
	if len(checks) > 0 {
		cq.Spec.AdmissionChecksStrategy = &kueue.AdmissionChecksStrategy{}
		for _, ac := range checks {
			cq.Spec.AdmissionChecksStrategy.AdmissionChecks = append(cq.Spec.AdmissionChecksStrategy.AdmissionChecks,
				kueue.AdmissionCheckStrategyRule{Name: kueue.AdmissionCheckReference(ac)})
		}
	}
	lq := &kueue.LocalQueue{
		ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "queue"},
		Spec:       kueue.LocalQueueSpec{ClusterQueue: kueue.ClusterQueueReference(name)},
	}
	for _, obj := range []client.Object{ns, rf, cq, lq} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T %s on %s: %v", obj, obj.GetName(), plane.Name, err)
		}
	}
	return name, lq.Name
}

// job is a batch Job asking for cpu, labelled for the LocalQueue (none when empty), created
// unsuspended as a user would write it.
func job(namespace, name, localQueue, cpu string) *batchv1.Job {
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: batchv1.JobSpec{
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name:      "main",
					Image:     "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}},
				}},
			}},
		},
	}
	if localQueue != "" {
		j.Labels = map[string]string{queueLabel: localQueue}
	}
	return j
}

// workloadOf returns the Workload Kueue made for j, if any.
func workloadOf(t *testing.T, c client.Client, j *batchv1.Job) (*kueue.Workload, bool) {
	t.Helper()
	var list kueue.WorkloadList
	if err := c.List(t.Context(), &list, client.InNamespace(j.Namespace), client.MatchingLabels{jobUIDLabel: string(j.UID)}); err != nil {
		t.Fatalf("listing workloads of job %s/%s: %v", j.Namespace, j.Name, err)
	}
	if len(list.Items) != 1 {
		return nil, false
	}
	return &list.Items[0], true
}

func condition(wl *kueue.Workload, typ string) string {
	if c := apimeta.FindStatusCondition(wl.Status.Conditions, typ); c != nil {
		return fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message)
	}
	return typ + " unset"
}

func get(t *testing.T, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(obj), obj); err != nil {
		t.Fatalf("reading %T %s/%s: %v", obj, obj.GetNamespace(), obj.GetName(), err)
	}
}

func TestManagerAdmitsJobsWithinTheClusterQueueQuotaAndHoldsTheRest(t *testing.T) {
	plane := planes[0]
	start(t, plane, nil)
	ns, lq := queue(t, plane, "admission", "2")

	tests := []struct {
		name         string
		cpu          string
		wantAdmitted bool
	}{
		{name: "fits", cpu: "1", wantAdmitted: true},
		{name: "exceeds-quota", cpu: "3", wantAdmitted: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := plane.Client
			j := job(ns, tt.name, lq, tt.cpu)
			if err := c.Create(t.Context(), j); err != nil {
				t.Fatalf("creating job: %v", err)
			}
			if !ptr.Deref(j.Spec.Suspend, false) {
				t.Errorf("job %s was stored unsuspended; Kueue's webhook suspends a queued job on creation", j.Name)
			}
			poll.Until(t, "Kueue decides on the job's workload", func() (bool, string) {
				wl, ok := workloadOf(t, c, j)
				if !ok {
					return false, "no workload yet"
				}
				reserved := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadQuotaReserved)
				if tt.wantAdmitted {
					return apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted), condition(wl, kueue.WorkloadAdmitted)
				}
				// A workload that does not fit is marked Pending: not reserved, with the reason.
				return reserved != nil && reserved.Status == metav1.ConditionFalse && reserved.Reason == "Pending", condition(wl, kueue.WorkloadQuotaReserved)
			})
			if tt.wantAdmitted {
				poll.Until(t, "the admitted job is unsuspended", func() (bool, string) {
					get(t, c, j)
					return !ptr.Deref(j.Spec.Suspend, true), fmt.Sprintf("suspend=%v", ptr.Deref(j.Spec.Suspend, false))
				})
				return
			}
			get(t, c, j)
			if !ptr.Deref(j.Spec.Suspend, false) {
				t.Errorf("job %s over quota was unsuspended", j.Name)
			}
		})
	}
}

func TestWebhooksRunWhileTheManagerRuns(t *testing.T) {
	plane := planes[0]
	c := plane.Client
	ns, lq := queue(t, plane, "webhooks", "1")
	invalidQueue := job(ns, "invalid-queue-name", "Not_A_Queue", "1")
	badFlavor := &kueue.ResourceFlavor{
		ObjectMeta: metav1.ObjectMeta{Name: "bad-node-label"},
		Spec:       kueue.ResourceFlavorSpec{NodeLabels: map[string]string{"not a label key": "x"}},
	}

	m := start(t, plane, nil)
	tests := []struct {
		name string
		obj  client.Object
		// refusedBy is the webhook that refuses obj; empty when obj is stored.
		refusedBy string
		// check is what the stored object must show of Kueue's defaulting.
		check func(client.Object) error
	}{
		{
			name:      "job with a queue name that is not a valid object name",
			obj:       invalidQueue.DeepCopy(),
			refusedBy: "vjob.kb.io",
		},
		{
			name:      "resource flavor with an invalid node label",
			obj:       badFlavor.DeepCopy(),
			refusedBy: "vresourceflavor.kb.io",
		},
		{
			name: "queued job is suspended on creation",
			obj:  job(ns, "queued", lq, "5"),
			check: func(o client.Object) error {
				if !ptr.Deref(o.(*batchv1.Job).Spec.Suspend, false) {
					return errors.New("stored unsuspended")
				}
				return nil
			},
		},
		{
			name: "job without a queue name is left alone",
			obj:  job(ns, "unqueued", "", "1"),
			check: func(o client.Object) error {
				if ptr.Deref(o.(*batchv1.Job).Spec.Suspend, false) {
					return errors.New("stored suspended")
				}
				return nil
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.Create(t.Context(), tt.obj)
			if tt.refusedBy != "" {
				want := fmt.Sprintf("admission webhook %q denied the request", tt.refusedBy)
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("creating %s: got error %v, want one containing %q", tt.obj.GetName(), err, want)
				}
				return
			}
			if err != nil {
				t.Fatalf("creating %s: %v", tt.obj.GetName(), err)
			}
			if err := tt.check(tt.obj); err != nil {
				t.Errorf("%s: %v", tt.obj.GetName(), err)
			}
		})
	}

	// Once the manager is gone, nothing calls its webhooks: the plane stores what Kueue would
	// have refused rather than failing every request for a webhook nobody serves.
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{mutatingName, validatingName} {
		var obj client.Object = &admissionv1.MutatingWebhookConfiguration{}
		if name == validatingName {
			obj = &admissionv1.ValidatingWebhookConfiguration{}
		}
		if err := c.Get(t.Context(), client.ObjectKey{Name: name}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%s after Stop: got %v, want NotFound", name, err)
		}
	}
	for _, obj := range []client.Object{invalidQueue.DeepCopy(), badFlavor.DeepCopy()} {
		if err := c.Create(t.Context(), obj, client.DryRunAll); err != nil {
			t.Errorf("creating %s with no manager running: %v", obj.GetName(), err)
		}
	}
}

func TestStartRefusesASecondManagerOnOnePlane(t *testing.T) {
	plane := planes[0]
	start(t, plane, nil)
	_, err := kueuetest.Start(t.Context(), plane, kueuetest.Options{})
	if err == nil || !strings.Contains(err.Error(), "another kueue manager runs there") {
		t.Fatalf("second Start on %s: got %v, want a refusal naming the running manager", plane.Name, err)
	}
}

func TestManagerThatDiesTakesItsWebhooksWithIt(t *testing.T) {
	plane := planes[0]
	c := plane.Client
	out := &logtest.Buffer{}
	m, err := kueuetest.Start(t.Context(), plane, kueuetest.Options{Output: out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = m.Stop()
		if t.Failed() {
			t.Logf("last output of the kueue manager on %s:\n%s", plane.Name, out.Last(32<<10))
		}
	})
	if err := syscall.Kill(m.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Done():
	case <-time.After(poll.Deadline):
		t.Fatal("the killed manager's process was not reaped")
	}
	// A job that Kueue's webhook would refuse is stored once the plane has dropped the
	// webhooks; until then the API server fails the request for want of the webhook.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dead-manager"}}
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the plane accepts jobs again", func() (bool, string) {
		err := c.Create(t.Context(), job(ns.Name, "after-death", "Not_A_Queue", "1"), client.DryRunAll)
		return err == nil, fmt.Sprint(err)
	})
	err = m.Stop()
	if err == nil || !strings.Contains(err.Error(), "exited on its own") {
		t.Errorf("Stop after the process died: got %v, want an error saying it exited on its own", err)
	}
}

func TestMultiKueueHubConnectsToWorkerAndDispatchesAJob(t *testing.T) {
	hubPlane, workerPlane := planes[1], planes[2]
	frameworks := &configapi.Integrations{Frameworks: []string{"batch/job", "jobset.x-k8s.io/jobset"}}
	start(t, workerPlane, &configapi.Configuration{Integrations: frameworks})
	hub := start(t, hubPlane, &configapi.Configuration{
		Integrations: frameworks,
		MultiKueue: &configapi.MultiKueue{
			Origin:            ptr.To("kueuetest"),
			WorkerLostTimeout: &metav1.Duration{Duration: 10 * time.Minute},
		},
	})
	ctx, hc, wc := t.Context(), hubPlane.Client, workerPlane.Client

	kubeconfig, err := kueuetest.TokenKubeConfig(ctx, workerPlane, "multikueue")
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: *hub.Config.Namespace, Name: "worker"},
		Data:       map[string][]byte{kueuetest.KubeConfigKey: kubeconfig},
	}
	cluster := &kueue.MultiKueueCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "worker"},
		Spec: kueue.MultiKueueClusterSpec{ClusterSource: kueue.ClusterSource{
			KubeConfig: &kueue.KubeConfig{LocationType: kueue.SecretLocationType, Location: secret.Name},
		}},
	}
	for _, obj := range []client.Object{secret, cluster} {
		if err := hc.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T %s on the hub: %v", obj, obj.GetName(), err)
		}
	}
	poll.Until(t, "the hub's MultiKueueCluster turns Active", func() (bool, string) {
		get(t, hc, cluster)
		c := apimeta.FindStatusCondition(cluster.Status.Conditions, kueue.MultiKueueClusterActive)
		if c == nil {
			return false, "no Active condition"
		}
		return c.Status == metav1.ConditionTrue, fmt.Sprintf("Active=%s %s: %s", c.Status, c.Reason, c.Message)
	})

	// A job queued on the hub is admitted there through the MultiKueue admission check and
	// created on the worker, where the worker's Kueue admits it.
	const check = "multikueue"
	config := &kueue.MultiKueueConfig{ObjectMeta: metav1.ObjectMeta{Name: "kueuetest"}, Spec: kueue.MultiKueueConfigSpec{Clusters: []string{cluster.Name}}}
	ac := &kueue.AdmissionCheck{
		ObjectMeta: metav1.ObjectMeta{Name: check},
		Spec: kueue.AdmissionCheckSpec{
			ControllerName: kueue.MultiKueueControllerName,
			Parameters:     &kueue.AdmissionCheckParametersReference{APIGroup: kueue.GroupVersion.Group, Kind: "MultiKueueConfig", Name: config.Name},
		},
	}
	for _, obj := range []client.Object{config, ac} {
		if err := hc.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T %s on the hub: %v", obj, obj.GetName(), err)
		}
	}
	ns, lq := queue(t, hubPlane, "dispatch", "4", check)
	queue(t, workerPlane, "dispatch", "4")

	j := job(ns, "dispatched", lq, "1")
	if err := hc.Create(ctx, j); err != nil {
		t.Fatalf("creating job on the hub: %v", err)
	}
	if got := ptr.Deref(j.Spec.ManagedBy, ""); got != kueue.MultiKueueControllerName {
		t.Errorf("hub job's managedBy = %q, want %q set by Kueue's webhook", got, kueue.MultiKueueControllerName)
	}
	poll.Until(t, "the hub places the job's workload on the worker", func() (bool, string) {
		wl, ok := workloadOf(t, hc, j)
		if !ok {
			return false, "no workload yet"
		}
		placed := ptr.Deref(wl.Status.ClusterName, "")
		return placed == cluster.Name && apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted),
			fmt.Sprintf("clusterName=%q, %s", placed, condition(wl, kueue.WorkloadAdmitted))
	})
	remote := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: j.Name}}
	poll.Until(t, "the worker runs the job", func() (bool, string) {
		if err := wc.Get(ctx, client.ObjectKeyFromObject(remote), remote); err != nil {
			return false, err.Error()
		}
		return !ptr.Deref(remote.Spec.Suspend, true), fmt.Sprintf("suspend=%v", ptr.Deref(remote.Spec.Suspend, false))
	})
}

// TestManagerDiesWithTheTestProcess kills a test process that runs a manager with SIGKILL, so that
// no deferred function or cleanup runs, and checks that the manager dies with it.
func TestManagerDiesWithTheTestProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	tmp := t.TempDir()
	cmd.Env = append(os.Environ(), orphanEnv+"=1", "TMPDIR="+tmp)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting helper process: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	pid := make(chan int, 1)
	go func() {
		defer close(pid)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "KUEUE "); ok {
				if n, err := strconv.Atoi(rest); err == nil {
					pid <- n
				}
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var manager int
	select {
	case n, ok := <-pid:
		if !ok {
			t.Fatal("helper process ended without reporting its manager")
		}
		manager = n
	case <-ctx.Done():
		t.Fatal("helper process did not report its manager in time")
	}
	before, ok := procStart(manager)
	if !ok {
		t.Fatalf("manager %d is not running before the kill", manager)
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	poll.Until(t, "the manager dies with the test process", func() (bool, string) {
		start, ok := procStart(manager)
		return !ok || start != before, fmt.Sprintf("pid %d still runs", manager)
	})
	// The helper's plane dies with it too, a moment later; its files then go.
	poll.Until(t, "the helper's files can be removed", func() (bool, string) {
		err := os.RemoveAll(tmp)
		return err == nil, fmt.Sprint(err)
	})
}

// procStart returns the start time of a live process (a zombie has died), which tells it from a
// later process that reuses its pid.
func procStart(pid int) (string, bool) {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", false
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return "", false
	}
	// Fields after the name: state(0) ppid(1) ... starttime(19).
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 20 || f[0] == "Z" {
		return "", false
	}
	return f[19], true
}

// BenchmarkStart measures what one manager costs: the time from running the binary to ready
// (start-s), with the webhooks installed and called (ns/op includes Stop), and its resident
// memory once ready (MiB-resident).
func BenchmarkStart(b *testing.B) {
	var ready time.Duration
	var rss int64
	for b.Loop() {
		m, err := kueuetest.Start(b.Context(), planes[0], kueuetest.Options{})
		if err != nil {
			b.Fatal(err)
		}
		ready += m.StartDuration
		n, err := m.ResidentMemory()
		if err != nil {
			b.Fatal(err)
		}
		rss += n
		if err := m.Stop(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(ready.Seconds()/float64(b.N), "start-s")
	b.ReportMetric(float64(rss)/float64(b.N)/(1<<20), "MiB-resident")
}

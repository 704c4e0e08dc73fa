package componenttest_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/test/componenttest"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// Each test gets a plane of its own, since the charts' releases and webhooks are cluster-wide:
// planes[0] the install test, planes[1] the upgrade test, planes[2] the image pull test.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	// Fresh workers: Kueue's and JobSet's CRDs come with their charts, as on a cluster the
	// agent installs them on.
	controlplane.Main(m, 3, &planes, controlplane.Options{WithoutComponentCRDs: true})
}

// waitTimeout bounds a wait for a manager: starting one takes seconds, but several processes
// share a small machine.
const waitTimeout = 3 * time.Minute

// startKubelet plays the charts' Deployments on plane for the rest of the test.
func startKubelet(t *testing.T, plane *controlplane.ControlPlane, opts componenttest.Options) *componenttest.Kubelet {
	t.Helper()
	out := &logtest.Buffer{Max: 1 << 20}
	opts.Output = out
	opts.Log = slog.New(slog.NewTextHandler(t.Output(), nil))
	k, err := componenttest.Start(t.Context(), plane, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("last output of the managers on %s:\n%s", plane.Name, out.Last(32<<10))
		}
	})
	return k
}

// installBoth installs JobSet's chart, then Kueue's, as the agent does, and waits for both
// managers.
func installBoth(t *testing.T, plane *controlplane.ControlPlane, k *componenttest.Kubelet) map[componenttest.Component]componenttest.Process {
	t.Helper()
	procs := map[componenttest.Component]componenttest.Process{}
	for _, c := range []componenttest.Component{componenttest.JobSet, componenttest.Kueue} {
		install(t, plane, c, values(c, 50))
	}
	for _, c := range []componenttest.Component{componenttest.JobSet, componenttest.Kueue} {
		procs[c] = waitRunning(t, k, c)
	}
	return procs
}

func waitRunning(t *testing.T, k *componenttest.Kubelet, c componenttest.Component) componenttest.Process {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	p, err := k.WaitRunning(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestKubeletRunsTheChartsManagers(t *testing.T) {
	plane := planes[0]
	k := startKubelet(t, plane, componenttest.Options{})
	began := time.Now()
	procs := installBoth(t, plane, k)
	t.Logf("both charts installed and their managers answering after %v", time.Since(began).Round(time.Millisecond))

	for _, tc := range []struct {
		component      componenttest.Component
		serviceAccount string
	}{
		{componenttest.Kueue, "kueue-system/kueue-controller-manager"},
		{componenttest.JobSet, "jobset-system/jobset-controller"},
	} {
		t.Run(string(tc.component)+" runs as its deployment's pod", func(t *testing.T) {
			p := procs[tc.component]
			if p.Image != image(tc.component) {
				t.Errorf("image = %q, want the release image %q", p.Image, image(tc.component))
			}
			if p.ServiceAccount != tc.serviceAccount {
				t.Errorf("service account = %q, want %q", p.ServiceAccount, tc.serviceAccount)
			}
			if p.Rollouts != 1 || p.Restarts != 0 {
				t.Errorf("rollouts = %d, restarts = %d; want 1 and 0", p.Rollouts, p.Restarts)
			}
			if !alive(p.Pid) {
				t.Errorf("manager %d does not run", p.Pid)
			}
			dep := &appsv1.Deployment{}
			if err := plane.Client.Get(t.Context(), p.Deployment, dep); err != nil {
				t.Fatal(err)
			}
			if why := notRolledOut(dep); why != "" {
				t.Errorf("deployment %s: %s", p.Deployment, why)
			}
		})
	}

	t.Run("kueue's webhooks answer", func(t *testing.T) {
		ctx := t.Context()
		rf := &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: "probe-flavor"}}
		if err := plane.Client.Create(ctx, rf, client.DryRunAll); err != nil {
			t.Fatalf("dry-run ResourceFlavor: %v", err)
		}
		cq := &kueue.ClusterQueue{ObjectMeta: metav1.ObjectMeta{Name: "probe-queue"}}
		if err := plane.Client.Create(ctx, cq, client.DryRunAll); err != nil {
			t.Fatalf("dry-run ClusterQueue: %v", err)
		}
		if !slices.Contains(cq.Finalizers, kueue.ResourceInUseFinalizerName) {
			t.Errorf("dry-run ClusterQueue has finalizers %v, want kueue's %s from its mutating webhook", cq.Finalizers, kueue.ResourceInUseFinalizerName)
		}
		bad := &kueue.ResourceFlavor{
			ObjectMeta: metav1.ObjectMeta{Name: "bad-flavor"},
			Spec:       kueue.ResourceFlavorSpec{NodeLabels: map[string]string{"not a label key": "x"}},
		}
		err := plane.Client.Create(ctx, bad, client.DryRunAll)
		if err == nil || !strings.Contains(err.Error(), `admission webhook "vresourceflavor.kb.io" denied the request`) {
			t.Errorf("dry-run ResourceFlavor with an invalid node label: %v, want kueue's validating webhook to deny it", err)
		}
	})

	t.Run("a ClusterQueue turns active", func(t *testing.T) {
		ctx := t.Context()
		rf := &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: "default-flavor"}}
		cq := &kueue.ClusterQueue{
			ObjectMeta: metav1.ObjectMeta{Name: "cluster-queue"},
			Spec: kueue.ClusterQueueSpec{
				NamespaceSelector: &metav1.LabelSelector{},
				ResourceGroups: []kueue.ResourceGroup{{
					CoveredResources: []corev1.ResourceName{corev1.ResourceCPU},
					Flavors: []kueue.FlavorQuotas{{
						Name:      "default-flavor",
						Resources: []kueue.ResourceQuota{{Name: corev1.ResourceCPU, NominalQuota: resource.MustParse("8")}},
					}},
				}},
			},
		}
		for _, obj := range []client.Object{rf, cq} {
			if err := plane.Client.Create(ctx, obj); err != nil {
				t.Fatal(err)
			}
		}
		poll.Until(t, "ClusterQueue cluster-queue is Active", func() (bool, string) {
			got := &kueue.ClusterQueue{}
			if err := plane.Client.Get(ctx, client.ObjectKeyFromObject(cq), got); err != nil {
				return false, err.Error()
			}
			c := apimeta.FindStatusCondition(got.Status.Conditions, kueue.ClusterQueueActive)
			return c != nil && c.Status == metav1.ConditionTrue, fmt.Sprintf("%+v", c)
		})
	})

	t.Run("jobset's webhooks answer", func(t *testing.T) {
		ctx := t.Context()
		js := componenttest.ProbeJobSet("default")
		if err := plane.Client.Create(ctx, js, client.DryRunAll); err != nil {
			t.Fatalf("dry-run JobSet: %v", err)
		}
		if js.Spec.Network == nil || js.Spec.Network.EnableDNSHostnames == nil || !*js.Spec.Network.EnableDNSHostnames {
			t.Errorf("dry-run JobSet has network %+v, want jobset's default enableDNSHostnames: true from its mutating webhook", js.Spec.Network)
		}
		bad := componenttest.ProbeJobSet("default")
		bad.Spec.ReplicatedJobs[0].DependsOn = []jobset.DependsOn{{Name: "workers", Status: jobset.DependencyReady}}
		err := plane.Client.Create(ctx, bad, client.DryRunAll)
		if err == nil || !strings.Contains(err.Error(), "DependsOn can't be set for the first ReplicatedJob") {
			t.Errorf("dry-run JobSet whose first replicated job depends on another: %v, want jobset's validating webhook to deny it", err)
		}
	})

	t.Run("a manager that dies is restarted", func(t *testing.T) {
		before := procs[componenttest.JobSet]
		if err := syscall.Kill(before.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, "the kubelet notices the killed manager", func() (bool, string) {
			p, ok := k.Running(componenttest.JobSet)
			return !ok || p.Pid != before.Pid, fmt.Sprintf("pid %d still current", before.Pid)
		})
		after := waitRunning(t, k, componenttest.JobSet)
		if after.Pid == before.Pid || after.Restarts != 1 || after.Rollouts != 1 {
			t.Errorf("after the kill: pid %d (before %d), restarts %d, rollouts %d; want a new pid, 1 restart, 1 rollout",
				after.Pid, before.Pid, after.Restarts, after.Rollouts)
		}
		if after.PodTemplateHash != before.PodTemplateHash {
			t.Errorf("pod template %s after the restart, want the same %s", after.PodTemplateHash, before.PodTemplateHash)
		}
		procs[componenttest.JobSet] = after
	})

	t.Run("uninstalling a release stops its manager", func(t *testing.T) {
		p := procs[componenttest.JobSet]
		uninstall(t, plane, componenttest.JobSet)
		poll.Until(t, "the jobset manager stops", func() (bool, string) {
			_, running := k.Running(componenttest.JobSet)
			return !running && !alive(p.Pid), fmt.Sprintf("kubelet runs it: %t, pid %d alive: %t", running, p.Pid, alive(p.Pid))
		})
		delete(procs, componenttest.JobSet)
	})

	t.Run("stopping leaves no process", func(t *testing.T) {
		if err := k.Stop(); err != nil {
			t.Fatal(err)
		}
		for c, p := range procs {
			if alive(p.Pid) {
				t.Errorf("%s manager %d still runs after Stop", c, p.Pid)
			}
		}
		if left := managerDirs(t, plane); len(left) > 0 {
			t.Errorf("the managers' files are still there after Stop: %v", left)
		}
	})
}

func TestKueueConfigurationUpgradeRestartsKueueAndKeepsItsWebhooksAnswered(t *testing.T) {
	plane := planes[1]
	k := startKubelet(t, plane, componenttest.Options{})
	procs := installBoth(t, plane, k)
	before := procs[componenttest.Kueue]

	// A ClusterQueue dry run every few milliseconds through the upgrade, counting refusals.
	probes := startProbing(t, plane)
	began := time.Now()
	upgrade(t, plane, componenttest.Kueue, values(componenttest.Kueue, 60))
	after := waitRunning(t, k, componenttest.Kueue)
	stats := probes.stop()
	t.Logf("upgrade to the new kueue manager answering: %v; %d of %d dry runs refused meanwhile, the longest refusal %v",
		time.Since(began).Round(time.Millisecond), stats.failed, stats.total, stats.longest.Round(time.Millisecond))

	t.Run("the upgrade rolls out a new kueue manager with the new configuration", func(t *testing.T) {
		if after.Pid == before.Pid || after.PodTemplateHash == before.PodTemplateHash {
			t.Errorf("manager pid %d template %s after the upgrade, %d %s before: want both changed", after.Pid, after.PodTemplateHash, before.Pid, before.PodTemplateHash)
		}
		if after.Rollouts != 2 || after.Restarts != 0 {
			t.Errorf("rollouts = %d, restarts = %d; want 2 and 0", after.Rollouts, after.Restarts)
		}
		if !bytes.Contains(after.Config, []byte("qps: 60")) || bytes.Contains(before.Config, []byte("qps: 60")) {
			t.Errorf("configuration before:\n%s\nafter:\n%s\nwant qps 60 only after", before.Config, after.Config)
		}
		poll.Until(t, "the previous kueue manager exits", func() (bool, string) {
			return !alive(before.Pid), fmt.Sprintf("pid %d runs", before.Pid)
		})
		if js, ok := k.Running(componenttest.JobSet); !ok || js.Pid != procs[componenttest.JobSet].Pid {
			t.Errorf("jobset manager %+v after kueue's upgrade, want pid %d untouched", js, procs[componenttest.JobSet].Pid)
		}
	})

	t.Run("kueue's webhooks point at the new manager and answer", func(t *testing.T) {
		assertPointed(t, plane, "kueue-system", after.WebhookAddr)
		cq := &kueue.ClusterQueue{ObjectMeta: metav1.ObjectMeta{Name: "after-upgrade"}}
		if err := plane.Client.Create(t.Context(), cq, client.DryRunAll); err != nil {
			t.Fatalf("dry-run ClusterQueue after the upgrade: %v", err)
		}
	})

	t.Run("an upgrade that changes nothing keeps the manager and re-points the webhooks helm rewrote", func(t *testing.T) {
		// Helm applies every object of the release on an upgrade, the webhook configurations
		// with their Service among them; JobSet's chart is the smaller one to upgrade.
		before := procs[componenttest.JobSet]
		cfg := &admissionv1.ValidatingWebhookConfiguration{}
		key := client.ObjectKey{Name: "jobset-validating-webhook-configuration"}
		if err := plane.Client.Get(t.Context(), key, cfg); err != nil {
			t.Fatal(err)
		}
		upgrade(t, plane, componenttest.JobSet, values(componenttest.JobSet, 0))
		again := waitRunning(t, k, componenttest.JobSet)
		if again.Pid != before.Pid || again.Rollouts != 1 || again.Generation != before.Generation {
			t.Errorf("manager pid %d, rollouts %d, generation %d after an upgrade that changes nothing; want %d, 1, %d",
				again.Pid, again.Rollouts, again.Generation, before.Pid, before.Generation)
		}
		after := &admissionv1.ValidatingWebhookConfiguration{}
		if err := plane.Client.Get(t.Context(), key, after); err != nil {
			t.Fatal(err)
		}
		if after.ResourceVersion == cfg.ResourceVersion {
			t.Errorf("%s was not written by the upgrade (resourceVersion %s)", key.Name, cfg.ResourceVersion)
		}
		assertPointed(t, plane, "jobset-system", again.WebhookAddr)
	})
}

func TestAnImageThatCannotBePulledLeavesTheDeploymentUnavailableWithTheReason(t *testing.T) {
	plane := planes[2]
	k := startKubelet(t, plane, componenttest.Options{
		Pull: func(_ context.Context, _ componenttest.Component, image string) error {
			return fmt.Errorf("%s: manifest unknown", image)
		},
	})
	install(t, plane, componenttest.JobSet, values(componenttest.JobSet, 0))
	key := client.ObjectKey{Namespace: "jobset-system", Name: "jobset-controller"}
	want := "pulling image " + image(componenttest.JobSet) + ": " + image(componenttest.JobSet) + ": manifest unknown"

	poll.Until(t, "the deployment says why it is unavailable", func() (bool, string) {
		dep := &appsv1.Deployment{}
		if err := plane.Client.Get(t.Context(), key, dep); err != nil {
			return false, err.Error()
		}
		var available, progressing string
		for _, c := range dep.Status.Conditions {
			switch c.Type {
			case appsv1.DeploymentAvailable:
				available = string(c.Status)
			case appsv1.DeploymentProgressing:
				progressing = c.Message
			}
		}
		return available == "False" && strings.Contains(progressing, want) && notRolledOut(dep) != "",
			fmt.Sprintf("Available %q, Progressing %q", available, progressing)
	})
	if p, ok := k.Running(componenttest.JobSet); ok {
		t.Errorf("a manager runs for an image that cannot be pulled: %+v", p)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if _, err := k.WaitRunning(ctx, componenttest.JobSet); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("WaitRunning: %v, want an error that says %q", err, want)
	}
}

// assertPointed checks that no webhook names a Service in namespace any more and that those that
// did point at addr.
func assertPointed(t *testing.T, plane *controlplane.ControlPlane, namespace, addr string) {
	t.Helper()
	var ccs []admissionv1.WebhookClientConfig
	mutating := &admissionv1.MutatingWebhookConfigurationList{}
	validating := &admissionv1.ValidatingWebhookConfigurationList{}
	if err := plane.Client.List(t.Context(), mutating); err != nil {
		t.Fatal(err)
	}
	if err := plane.Client.List(t.Context(), validating); err != nil {
		t.Fatal(err)
	}
	for _, c := range mutating.Items {
		for _, h := range c.Webhooks {
			ccs = append(ccs, h.ClientConfig)
		}
	}
	for _, c := range validating.Items {
		for _, h := range c.Webhooks {
			ccs = append(ccs, h.ClientConfig)
		}
	}
	pointed := 0
	for _, cc := range ccs {
		switch {
		case cc.Service != nil && cc.Service.Namespace == namespace:
			t.Errorf("a webhook still names Service %s/%s", cc.Service.Namespace, cc.Service.Name)
		case cc.URL != nil && strings.HasPrefix(*cc.URL, "https://"+addr+"/"):
			pointed++
		}
	}
	if pointed == 0 {
		t.Errorf("no webhook points at %s", addr)
	}
}

// notRolledOut says why kubectl would not call the Deployment rolled out, "" when it would.
func notRolledOut(dep *appsv1.Deployment) string {
	st := dep.Status
	want := int32(1)
	if dep.Spec.Replicas != nil {
		want = *dep.Spec.Replicas
	}
	switch {
	case st.ObservedGeneration < dep.Generation:
		return fmt.Sprintf("observedGeneration %d < generation %d", st.ObservedGeneration, dep.Generation)
	case st.UpdatedReplicas < want || st.Replicas > st.UpdatedReplicas || st.AvailableReplicas < st.UpdatedReplicas || st.ReadyReplicas < want:
		return fmt.Sprintf("status %+v", st)
	}
	for _, c := range st.Conditions {
		if c.Type == appsv1.DeploymentAvailable && c.Status == corev1.ConditionTrue {
			return ""
		}
	}
	return "condition Available is not True"
}

// alive reports whether pid is a running process (not a zombie).
func alive(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	f := strings.Fields(string(stat[i+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// managerDirs lists the managers' directories left in the plane's directory.
func managerDirs(t *testing.T, plane *controlplane.ControlPlane) []string {
	t.Helper()
	var left []string
	for _, pattern := range []string{"kueue-*", "jobset-*"} {
		m, err := filepath.Glob(filepath.Join(plane.Dir(), pattern))
		if err != nil {
			t.Fatal(err)
		}
		left = append(left, m...)
	}
	return left
}

// prober dry-runs a ClusterQueue again and again and counts the refusals.
type prober struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stats  probeStats
}

type probeStats struct {
	total, failed int
	longest       time.Duration
}

func startProbing(t *testing.T, plane *controlplane.ControlPlane) *prober {
	ctx, cancel := context.WithCancel(t.Context())
	p := &prober{cancel: cancel}
	p.wg.Go(func() {
		var since time.Time
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			cq := &kueue.ClusterQueue{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"}}
			err := plane.Client.Create(ctx, cq, client.DryRunAll)
			if ctx.Err() != nil {
				return
			}
			p.stats.total++
			switch {
			case err != nil && since.IsZero():
				since = time.Now()
				p.stats.failed++
			case err != nil:
				p.stats.failed++
				p.stats.longest = max(p.stats.longest, time.Since(since))
			case !since.IsZero():
				p.stats.longest = max(p.stats.longest, time.Since(since))
				since = time.Time{}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return p
}

func (p *prober) stop() probeStats {
	p.cancel()
	p.wg.Wait()
	return p.stats
}

package converge_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/components/installer"
	"github.com/flotilla-gitops/flotilla/agent/converge"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// One plane with Kueue's and JobSet's CRDs applied as manifests, not by Helm: a worker
// whose team installed them by hand. No Kueue manager runs: nothing here waits for one.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	controlplane.Main(m, 1, &planes, controlplane.Options{})
}

const identity = "4-acme-gpu-a"

// state is a desired state of one ResourceFlavor and one ClusterQueue with comps.
func state(t *testing.T, generation int64, comps *components.Spec) protocol.DesiredState {
	t.Helper()
	labels := map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.WorkerClusterLabel: identity}
	objs := []client.Object{
		&kueue.ResourceFlavor{TypeMeta: metav1.TypeMeta{APIVersion: kueue.GroupVersion.String(), Kind: "ResourceFlavor"},
			ObjectMeta: metav1.ObjectMeta{Name: "default-flavor", Labels: labels}},
		&kueue.ClusterQueue{TypeMeta: metav1.TypeMeta{APIVersion: kueue.GroupVersion.String(), Kind: "ClusterQueue"},
			ObjectMeta: metav1.ObjectMeta{Name: "cluster-queue", Labels: labels},
			Spec:       kueue.ClusterQueueSpec{NamespaceSelector: &metav1.LabelSelector{}}},
	}
	ds := protocol.DesiredState{Generation: generation, Hash: "sha256:" + strings.Repeat("a", 63) + string(rune('0'+generation)), Components: comps}
	for _, o := range objs {
		raw, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		ds.Objects = append(ds.Objects, raw)
	}
	return ds
}

func newConverger(t *testing.T, in converge.Installer, without string) *converge.Converger {
	t.Helper()
	a, err := apply.New(apply.Options{Client: planes[0].Client, Identity: identity})
	if err != nil {
		t.Fatal(err)
	}
	c, err := converge.New(converge.Options{Client: planes[0].Client, Applier: a, Installer: in, WithoutInstaller: without,
		ReadyTimeout: time.Second, PollInterval: 100 * time.Millisecond, ProbeNamespace: "default"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func spec(managed bool) *components.Spec {
	return &components.Spec{Managed: managed, Kueue: components.Release{Version: "v0.17.0"}, JobSet: components.Release{Version: "v0.11.1"}}
}

func statusOf(t *testing.T, res protocol.Applied, c components.Component) components.Status {
	t.Helper()
	for _, s := range res.Components {
		if s.Component == c {
			return s
		}
	}
	t.Fatalf("no status of %s in %+v", c, res.Components)
	return components.Status{}
}

func clusterQueue(t *testing.T) *kueue.ClusterQueue {
	t.Helper()
	cq := &kueue.ClusterQueue{}
	if err := planes[0].Client.Get(t.Context(), client.ObjectKey{Name: "cluster-queue"}, cq); err != nil {
		t.Fatal(err)
	}
	return cq
}

// The three ways a worker's components can be other than flotilla's to change, run in
// turn on one worker: its team runs them; then the fleet takes them over, but the agent
// has no installer; then it has one, and the Kueue it finds is not Helm's.
func TestComponentsFlotillaDoesNotInstall(t *testing.T) {
	ctx := t.Context()
	c := planes[0].Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kueue-system"}}); err != nil {
		t.Fatal(err)
	}
	// The team's Kueue, one release behind the fleet's.
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kueue-system", Name: "kueue-controller-manager"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "kueue"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "kueue"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{
					{Name: "manager", Image: "registry.k8s.io/kueue/kueue:v0.16.2"},
					{Name: "kube-rbac-proxy", Image: "quay.io/brancz/kube-rbac-proxy:v0.18.0"},
				}},
			},
		},
	}
	if err := c.Create(ctx, dep); err != nil {
		t.Fatal(err)
	}

	t.Run("a team's own Kueue is left alone, and a version other than the fleet's is reported", func(t *testing.T) {
		res := newConverger(t, nil, "").Apply(ctx, state(t, 1, spec(false)))
		if !res.Complete() {
			t.Fatalf("the state was not applied whole: %+v", res)
		}
		k := statusOf(t, res, components.Kueue)
		if k.Running != "v0.16.2" || !k.Ready || k.Action != components.ActionChecked || !strings.Contains(k.Message, "runs v0.16.2, and fleet.yaml names v0.17.0") {
			t.Errorf("Kueue's status: %+v", k)
		}
		j := statusOf(t, res, components.JobSet)
		if j.Running != "" || !j.Ready || !strings.Contains(j.Message, "jobset-system/jobset-controller: not found") {
			t.Errorf("JobSet's status: %+v", j)
		}
		if p := clusterQueue(t).Spec.StopPolicy; p != nil && *p != kueue.None {
			t.Errorf("an unmanaged worker's ClusterQueue is stopped: %s", *p)
		}
	})

	t.Run("an agent without its installer says why and changes nothing", func(t *testing.T) {
		const why = "the agent was installed with components.install: false"
		before := clusterQueue(t)
		res := newConverger(t, nil, why).Apply(ctx, state(t, 2, spec(true)))
		for _, comp := range components.All() {
			if s := statusOf(t, res, comp); s.Action != components.ActionFailed || s.Ready || s.Message != why {
				t.Errorf("%s: %+v, want failed with the reason", comp, s)
			}
		}
		after := clusterQueue(t)
		if after.ResourceVersion != before.ResourceVersion {
			t.Errorf("the ClusterQueue was written (held and released?): stopPolicy %v", after.Spec.StopPolicy)
		}
	})

	t.Run("a Kueue that is not Helm's is refused, and the ClusterQueue keeps admitting", func(t *testing.T) {
		in := &installer.Installer{Config: planes[0].Config}
		res := newConverger(t, in, "").Apply(ctx, state(t, 3, spec(true)))
		k := statusOf(t, res, components.Kueue)
		if k.Action != components.ActionRefused || k.Ready || !strings.Contains(k.Message, "adopt: true") {
			t.Errorf("Kueue's status: %+v, want refused with how to hand it over", k)
		}
		if res.Complete() {
			t.Error("a refused component reported complete")
		}
		// The queue was held while the installer ran, and released once it refused: a
		// worker flotilla does not manage yet keeps working as before.
		if p := clusterQueue(t).Spec.StopPolicy; p != nil && *p != kueue.None {
			t.Errorf("the ClusterQueue stays stopped (%s) after the refusal", *p)
		}
		if d := (&appsv1.Deployment{}); c.Get(ctx, client.ObjectKeyFromObject(dep), d) == nil && d.UID != dep.UID {
			t.Error("the team's Kueue Deployment was replaced")
		}
	})
}

func TestHoldStopsOnlyClusterQueuesThatAreNotDrainingAlready(t *testing.T) {
	cq := func(policy *kueue.StopPolicy) json.RawMessage {
		b, err := json.Marshal(&kueue.ClusterQueue{TypeMeta: metav1.TypeMeta{APIVersion: kueue.GroupVersion.String(), Kind: "ClusterQueue"},
			ObjectMeta: metav1.ObjectMeta{Name: "q"}, Spec: kueue.ClusterQueueSpec{StopPolicy: policy}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	lq, _ := json.Marshal(&kueue.LocalQueue{TypeMeta: metav1.TypeMeta{APIVersion: kueue.GroupVersion.String(), Kind: "LocalQueue"}, ObjectMeta: metav1.ObjectMeta{Name: "q", Namespace: "ns"}})
	tests := []struct {
		name string
		in   json.RawMessage
		want string // the stopPolicy after, "" for the object unchanged
	}{
		{"a running ClusterQueue is held", cq(nil), "Hold"},
		{"a ClusterQueue running explicitly is held", cq(ptr.To(kueue.None)), "Hold"},
		{"a held one stays held", cq(ptr.To(kueue.Hold)), "Hold"},
		{"a draining one keeps draining", cq(ptr.To(kueue.HoldAndDrain)), "HoldAndDrain"},
		{"a LocalQueue is not touched", lq, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := converge.HoldQueue(tt.in)
			if tt.want == "" {
				if string(out) != string(tt.in) {
					t.Errorf("changed: %s", out)
				}
				return
			}
			var got kueue.ClusterQueue
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			if got.Spec.StopPolicy == nil || string(*got.Spec.StopPolicy) != tt.want {
				t.Errorf("stopPolicy %v, want %s", got.Spec.StopPolicy, tt.want)
			}
		})
	}
}

// counting is an installer that counts its runs before handing them to the real one.
type counting struct {
	converge.Installer
	runs int
}

func (c *counting) Apply(ctx context.Context, spec components.Spec) (components.Report, error) {
	c.runs++
	return c.Installer.Apply(ctx, spec)
}

// A state whose images the worker does not allow changes nothing on it: the installer
// does not run, the ClusterQueues are neither held nor applied, and every component is
// refused with the policy's reason and what to change.
func TestAStateOutsideTheWorkersImagePolicyChangesNothing(t *testing.T) {
	ctx := t.Context()
	queue := func() string {
		cq := &kueue.ClusterQueue{}
		switch err := planes[0].Client.Get(ctx, client.ObjectKey{Name: "cluster-queue"}, cq); {
		case apierrors.IsNotFound(err):
			return "none"
		case err != nil:
			t.Fatal(err)
		}
		return cq.ResourceVersion
	}
	mirrored := spec(true)
	mirrored.Registry = "mirror.example"
	digested := spec(true)
	tests := []struct {
		name   string
		policy components.ImagePolicy
		spec   *components.Spec
		reason string
		says   string
	}{
		{"a registry not allowed", components.ImagePolicy{}, mirrored, components.ReasonRegistryNotAllowed,
			`registry "mirror.example" is not among the registries this worker allows (components.allowedRegistries in the agent's Helm values: registry.k8s.io); its administrator adds it there`},
		{"a digest required and missing", components.ImagePolicy{RequiredDigests: map[string]string{"kueue/kueue:v0.17.0": "sha256:" + strings.Repeat("a1", 32)}}, digested, components.ReasonDigestNotAllowed,
			"kueue's image registry.k8s.io/kueue/kueue:v0.17.0 carries no digest"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := &counting{Installer: &installer.Installer{Config: planes[0].Config, Images: tt.policy}}
			a, err := apply.New(apply.Options{Client: planes[0].Client, Identity: identity})
			if err != nil {
				t.Fatal(err)
			}
			c, err := converge.New(converge.Options{Client: planes[0].Client, Applier: a, Installer: in, Images: tt.policy,
				ReadyTimeout: time.Second, PollInterval: 100 * time.Millisecond, ProbeNamespace: "default"})
			if err != nil {
				t.Fatal(err)
			}
			before := queue()
			res := c.Apply(ctx, state(t, int64(10+i), tt.spec))
			for _, comp := range components.All() {
				s := statusOf(t, res, comp)
				if s.Action != components.ActionRefused || s.Reason != tt.reason || s.Ready || !strings.HasPrefix(s.Message, tt.says) {
					t.Errorf("%s: %+v, want refused for %s saying %q", comp, s, tt.reason, tt.says)
				}
			}
			if in.runs != 0 {
				t.Errorf("the installer ran %d times", in.runs)
			}
			if res.Complete() || len(res.Results) != 0 {
				t.Errorf("objects were applied: %+v", res.Results)
			}
			if after := queue(); after != before {
				t.Errorf("the ClusterQueue was written: resourceVersion %s, was %s", after, before)
			}
		})
	}
}

package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) { controlplane.Main(m, 1, &planes, controlplane.Options{}) }

const fieldOwner = client.FieldOwner("flotilla-agent")

// TestRenderedObjectsAreAcceptedByKueue applies everything each preset renders with
// server-side apply and dryRun=All, so Kueue v0.17's own schema judges it.
func TestRenderedObjectsAreAcceptedByKueue(t *testing.T) {
	c := planes[0].Client
	for _, v := range fleetgen.Variants() {
		t.Run(v.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			f := fleet.Load(v.FS)
			if errs := f.AllErrors(); len(errs) > 0 {
				t.Fatal(errs)
			}
			res, err := render.New().Render(f, fleetgen.ExampleCluster)
			if err != nil {
				t.Fatal(err)
			}
			for _, obj := range res.Objects {
				if obj.GetKind() == "Namespace" {
					// A dry run creates nothing, and the LocalQueues need their namespace.
					ensureNamespace(ctx, t, c, obj.GetName())
					continue
				}
				applied := obj.DeepCopy()
				if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(applied), client.DryRunAll, fieldOwner, client.ForceOwnership); err != nil {
					t.Errorf("Kueue's schema refuses %s %s: %v", obj.GetKind(), obj.GetName(), err)
					continue
				}
				checkKept(t, obj, applied)
			}
		})
	}
}

// checkKept fails when the API server dropped what flotilla rendered: a field the schema
// prunes silently would never reach the worker.
func checkKept(t *testing.T, want, got *unstructured.Unstructured) {
	t.Helper()
	if want.GetKind() != "ClusterQueue" {
		return
	}
	for _, field := range [][]string{{"spec", "stopPolicy"}, {"spec", "queueingStrategy"}} {
		w, _, _ := unstructured.NestedString(want.Object, field...)
		g, _, _ := unstructured.NestedString(got.Object, field...)
		if w != "" && w != g {
			t.Errorf("ClusterQueue %s: %s is %q after apply, rendered %q", want.GetName(), strings.Join(field, "."), g, w)
		}
	}
	wantGroups, _, _ := unstructured.NestedSlice(want.Object, "spec", "resourceGroups")
	gotGroups, _, _ := unstructured.NestedSlice(got.Object, "spec", "resourceGroups")
	if len(wantGroups) != len(gotGroups) {
		t.Errorf("ClusterQueue %s: %d resource groups after apply, rendered %d", want.GetName(), len(gotGroups), len(wantGroups))
	}
}

// TestSchemaCheckRejectsWhatKueueDoesNot proves the dry run above can fail: an object
// that Kueue's CRD does not accept is refused.
func TestSchemaCheckRejectsWhatKueueDoesNot(t *testing.T) {
	c := planes[0].Client
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	f := fleet.Load(fleetgen.Template())
	res, err := render.New().Render(f, fleetgen.ExampleCluster)
	if err != nil {
		t.Fatal(err)
	}
	var cq *unstructured.Unstructured
	for _, o := range res.Objects {
		if o.GetKind() == "ClusterQueue" {
			cq = o.DeepCopy()
		}
	}
	if cq == nil {
		t.Fatal("no ClusterQueue rendered")
	}
	cases := []struct {
		name   string
		mutate func(*unstructured.Unstructured)
		msg    string
	}{
		{"an unknown field", func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "yes", "spec", "cordonned")
		}, ".spec.cordonned: field not declared in schema"},
		{"an invalid stopPolicy", func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "Pause", "spec", "stopPolicy")
		}, "spec.stopPolicy"},
		{"the old v1beta1 admissionChecks list", func(u *unstructured.Unstructured) {
			unstructured.RemoveNestedField(u.Object, "spec", "admissionChecksStrategy")
			_ = unstructured.SetNestedStringSlice(u.Object, []string{"dws-prov"}, "spec", "admissionChecks")
		}, ".spec.admissionChecks: field not declared in schema"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := cq.DeepCopy()
			tc.mutate(u)
			err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.DryRunAll, fieldOwner, client.ForceOwnership)
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("apply of a ClusterQueue with %s: err = %v, want the API server to refuse it naming %q", tc.name, err, tc.msg)
			}
		})
	}
}

func ensureNamespace(ctx context.Context, t *testing.T, c client.Client, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
}

// TestWorkerClusterCRDAcceptsLoadedClusters stores what the loader read from cluster.yaml
// as the hub will, and checks that the CRD's validation agrees with the loader's.
func TestWorkerClusterCRDAcceptsLoadedClusters(t *testing.T) {
	c := planes[0].Client
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ensureNamespace(ctx, t, c, "tenant-example")
	f := fleet.Load(fleetgen.Fleet(4, fleetgen.Options{CordonEvery: 2}))
	if errs := f.AllErrors(); len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, name := range f.ClusterNames() {
		wc := f.Clusters[name].Object.DeepCopy()
		wc.Namespace = "tenant-example"
		if err := c.Create(ctx, wc, client.DryRunAll); err != nil {
			t.Errorf("WorkerCluster %s refused: %v", name, err)
		}
	}
	bad := f.Clusters[fleetgen.ClusterName(0)].Object.DeepCopy()
	bad.Namespace = "tenant-example"
	bad.Spec.Preset = "Not_A_Label"
	if err := c.Create(ctx, bad, client.DryRunAll); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.preset") {
		t.Errorf("WorkerCluster with preset %q: err = %v, want Invalid naming spec.preset", bad.Spec.Preset, err)
	}
}

package apply_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	controlplane.Main(m, 1, &planes, controlplane.Options{})
}

// agentUser is who the Applier runs as in the tests: bound to the ClusterRole of
// RBAC.md and nothing else, so that the documented RBAC is exactly what the code needs.
const agentUser = "system:serviceaccount:flotilla-system:flotilla-agent"

func admin() client.Client { return planes[0].Client }

// agentClient returns a client that acts as agentUser, once the API server's authorizer
// grants it RBAC.md's ClusterRole.
func agentClient(t *testing.T) client.Client {
	t.Helper()
	ctx := t.Context()
	role := documentedRole(t)
	if err := admin().Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating ClusterRole %s: %v", role.Name, err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "flotilla-system", Name: "flotilla-agent"}},
	}
	if err := admin().Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating ClusterRoleBinding %s: %v", binding.Name, err)
	}
	// The RBAC authorizer sees new roles and bindings through its informers, a moment
	// after they are stored.
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               agentUser,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Group: "kueue.x-k8s.io", Resource: "localqueues", Verb: "delete"},
		}}
		if err := admin().Create(ctx, review); err != nil {
			return false, err
		}
		return review.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s to be granted ClusterRole %s: %v", agentUser, role.Name, err)
	}
	cfg := rest.CopyConfig(planes[0].Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: agentUser}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatalf("client for %s: %v", agentUser, err)
	}
	return c
}

// documentedRole is the ClusterRole in RBAC.md's YAML block.
func documentedRole(t *testing.T) *rbacv1.ClusterRole {
	t.Helper()
	role, err := apply.DocumentedRole()
	if err != nil {
		t.Fatal(err)
	}
	return role
}

// worker is one test's worker cluster: its own tenant, hence identity, workload
// namespaces and cluster-scoped object names, so that tests share the control plane
// without touching each other's objects.
type worker struct {
	t        *testing.T
	tenant   string
	identity string
	applier  *apply.Applier
}

func newWorker(t *testing.T, tenant string) *worker {
	t.Helper()
	identity := fleet.Identity(tenant, fleetgen.ExampleCluster)
	a, err := apply.New(apply.Options{Client: agentClient(t), Identity: identity, Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return &worker{t: t, tenant: tenant, identity: identity, applier: a}
}

// fleetEdit changes the fleet template for one render.
type fleetEdit struct {
	// fsys is the fleet to start from; nil is the template as shipped.
	fsys fstest.MapFS
	// namespaces are the workload namespaces, each prefixed with the tenant; nil is
	// one, "<tenant>-ml".
	namespaces []string
	preset     string
	gpus       int
	cordoned   bool
	// keepNames leaves the cluster-scoped objects' names as the presets have them.
	keepNames bool
}

// render renders the example cluster of the edited fleet for the worker's tenant.
func (w *worker) render(e fleetEdit) []*unstructured.Unstructured {
	w.t.Helper()
	fsys := e.fsys
	if fsys == nil {
		fsys = fleetgen.Template()
	}
	nss := e.namespaces
	if nss == nil {
		nss = []string{"ml"}
	}
	list := ""
	for _, ns := range nss {
		list += "\n    - " + w.tenant + "-" + ns
	}
	replace(w.t, fsys, "fleet.yaml", "tenant: example", "tenant: "+w.tenant)
	replace(w.t, fsys, "fleet.yaml", "workloadNamespaces:\n    - ml-training", "workloadNamespaces:"+list)
	clusterFile := path.Join("clusters", fleetgen.ExampleCluster, "cluster.yaml")
	if e.preset != "" {
		replace(w.t, fsys, clusterFile, "preset: gke-dws", "preset: "+e.preset)
	}
	if e.gpus != 0 {
		replace(w.t, fsys, clusterFile, "nvidia.com/gpu: 64", fmt.Sprintf("nvidia.com/gpu: %d", e.gpus))
	}
	if e.cordoned {
		replace(w.t, fsys, clusterFile, "cordoned: false", "cordoned: true")
	}
	res, err := render.New().Render(fleet.Load(fsys), fleetgen.ExampleCluster)
	if err != nil {
		w.t.Fatalf("rendering: %v", err)
	}
	if res.Identity != w.identity {
		w.t.Fatalf("rendered for identity %q, want %q", res.Identity, w.identity)
	}
	if !e.keepNames {
		suffixNames(res.Objects, w.tenant)
	}
	return res.Objects
}

func replace(t *testing.T, fsys fstest.MapFS, file, old, new string) {
	t.Helper()
	f := fsys[file]
	if f == nil || !strings.Contains(string(f.Data), old) {
		t.Fatalf("%s has no %q", file, old)
	}
	fsys[file] = &fstest.MapFile{Data: []byte(strings.Replace(string(f.Data), old, new, 1)), Mode: f.Mode}
}

// suffixNames appends "-<suffix>" to the name of every cluster-scoped Kueue object and
// to the references between them that the template's presets use.
func suffixNames(objs []*unstructured.Unstructured, suffix string) {
	s := func(name string) string { return name + "-" + suffix }
	renameIn := func(obj map[string]any, fields ...string) {
		if v, ok, _ := unstructured.NestedString(obj, fields...); ok {
			_ = unstructured.SetNestedField(obj, s(v), fields...)
		}
	}
	renameEach := func(obj map[string]any, field string, list ...string) {
		items, _, _ := unstructured.NestedSlice(obj, list...)
		for _, it := range items {
			if m, ok := it.(map[string]any); ok {
				renameIn(m, field)
			}
		}
		if items != nil {
			_ = unstructured.SetNestedSlice(obj, items, list...)
		}
	}
	for _, u := range objs {
		switch u.GetKind() {
		case "Namespace":
			continue
		case "LocalQueue":
			renameIn(u.Object, "spec", "clusterQueue")
			continue
		case "ClusterQueue":
			renameIn(u.Object, "spec", "cohortName")
			renameEach(u.Object, "name", "spec", "admissionChecksStrategy", "admissionChecks")
			groups, _, _ := unstructured.NestedSlice(u.Object, "spec", "resourceGroups")
			for _, g := range groups {
				if m, ok := g.(map[string]any); ok {
					renameEach(m, "name", "flavors")
				}
			}
			if groups != nil {
				_ = unstructured.SetNestedSlice(u.Object, groups, "spec", "resourceGroups")
			}
		case "AdmissionCheck":
			renameIn(u.Object, "spec", "parameters", "name")
		}
		u.SetName(s(u.GetName()))
	}
}

// state is the desired state of objs, as the hub sends it.
func state(t *testing.T, objs []*unstructured.Unstructured) protocol.DesiredState {
	t.Helper()
	st := protocol.DesiredState{Generation: 1}
	for _, u := range objs {
		data, err := json.Marshal(u.Object)
		if err != nil {
			t.Fatal(err)
		}
		st.Objects = append(st.Objects, data)
	}
	hash, err := render.Hash(objs, components.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	st.Hash = hash
	return st
}

func (w *worker) apply(objs []*unstructured.Unstructured) protocol.Applied {
	w.t.Helper()
	st := state(w.t, objs)
	applied := w.applier.Apply(w.t.Context(), st)
	if applied.Hash != st.Hash || applied.Generation != st.Generation {
		w.t.Errorf("applied reports generation %d hash %s, want %d %s", applied.Generation, applied.Hash, st.Generation, st.Hash)
	}
	return applied
}

// wantComplete fails the test unless every object was applied or left alone by design.
func wantComplete(t *testing.T, a protocol.Applied) {
	t.Helper()
	if !a.Complete() {
		t.Fatalf("applied is not complete:\n%s", describe(a))
	}
}

func describe(a protocol.Applied) string {
	var b strings.Builder
	if a.Error != "" {
		fmt.Fprintf(&b, "error: %s\n", a.Error)
	}
	for _, r := range a.Results {
		fmt.Fprintf(&b, "  %s %s/%s/%s uid=%s: %s\n", r.Action, r.Kind, r.Namespace, r.Name, r.UID, r.Message)
	}
	return b.String()
}

// result finds the result for one object.
func result(t *testing.T, a protocol.Applied, kind, namespace, name string) protocol.ObjectResult {
	t.Helper()
	for _, r := range a.Results {
		if r.Kind == kind && r.Namespace == namespace && r.Name == name {
			return r
		}
	}
	t.Fatalf("no result for %s %s/%s in:\n%s", kind, namespace, name, describe(a))
	return protocol.ObjectResult{}
}

// live reads an object as the admin; nil when it does not exist.
func live(t *testing.T, gvk schema.GroupVersionKind, namespace, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	err := admin().Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, u)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("reading %s %s/%s: %v", gvk.Kind, namespace, name, err)
	}
	return u
}

func liveOf(t *testing.T, u *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	return live(t, u.GroupVersionKind(), u.GetNamespace(), u.GetName())
}

// find returns the rendered object of kind, and fails when there is none.
func find(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() == kind {
			return u
		}
	}
	t.Fatalf("nothing of kind %s rendered", kind)
	return nil
}

func without(objs []*unstructured.Unstructured, kinds ...string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, u := range objs {
		drop := false
		for _, k := range kinds {
			drop = drop || u.GetKind() == k
		}
		if !drop {
			out = append(out, u)
		}
	}
	return out
}

func ownerLabels(identity string) map[string]string {
	return map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.WorkerClusterLabel: identity}
}

// create stores obj as the admin, as an operator or another tool would.
func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := admin().Create(t.Context(), obj); err != nil {
		t.Fatalf("creating %s %s: %v", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

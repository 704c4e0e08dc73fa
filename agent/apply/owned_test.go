package apply_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// TestOwnedListsExactlyWhatADecommissionPrunes pins the plan an operator reads before a
// reset to what the decommission then does: the same objects, the same verdicts, in the
// same order, and listing changes nothing.
func TestOwnedListsExactlyWhatADecommissionPrunes(t *testing.T) {
	t.Parallel()
	w := newWorker(t, "owned")
	objs := w.render(fleetEdit{fsys: overlayFleet(), namespaces: []string{"a", "b"}})
	wantComplete(t, w.apply(objs))

	labeled := func(name string, labels, annotations map[string]string) *unstructured.Unstructured {
		u := flavorObject(name)
		u.SetLabels(labels)
		u.SetAnnotations(annotations)
		create(t, u)
		return u
	}
	kept := labeled("owned-kept", ownerLabels(w.identity), map[string]string{v1alpha1.PruneAnnotation: v1alpha1.PruneDisabled})
	others := []*unstructured.Unstructured{
		labeled("owned-unlabeled", nil, nil),
		labeled("owned-other-worker", ownerLabels("9-another-example-us-central1"), nil),
		labeled("owned-identity-only", map[string]string{v1alpha1.WorkerClusterLabel: w.identity}, nil),
	}
	// An owned object already being deleted, held by a finalizer that nothing here removes.
	held := flavorObject("owned-held")
	held.SetLabels(ownerLabels(w.identity))
	held.SetFinalizers([]string{"example.com/in-use"})
	create(t, held)
	t.Cleanup(func() {
		// The test's context is over by now.
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		if err := admin().Patch(context.Background(), held, client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Errorf("removing the finalizer: %v", err)
		}
	})
	if err := admin().Delete(t.Context(), held); err != nil {
		t.Fatal(err)
	}

	plan, err := w.applier.Owned(t.Context())
	if err != nil {
		t.Fatalf("Owned: %v", err)
	}
	want := map[string]protocol.Action{
		"ResourceFlavor//owned-kept": protocol.ActionSkipped,
		"ResourceFlavor//owned-held": protocol.ActionPruned,
	}
	for _, u := range objs {
		if u.GetKind() != "Namespace" {
			want[u.GetKind()+"/"+u.GetNamespace()+"/"+u.GetName()] = protocol.ActionPruned
		}
	}
	got := map[string]protocol.Action{}
	for _, r := range plan {
		got[r.Kind+"/"+r.Namespace+"/"+r.Name] = r.Action
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Owned lists\n  %v\nwant\n  %v", got, want)
	}
	for _, r := range plan {
		switch r.Name {
		case kept.GetName():
			if !strings.Contains(r.Message, v1alpha1.PruneAnnotation) {
				t.Errorf("the kept flavor's message %q does not name %s", r.Message, v1alpha1.PruneAnnotation)
			}
		case held.GetName():
			if r.Message != "deletion pending on finalizers [example.com/in-use]" {
				t.Errorf("the held flavor's message is %q", r.Message)
			}
		}
	}
	for _, u := range objs {
		if got := liveOf(t, u); got == nil || got.GetDeletionTimestamp() != nil {
			t.Errorf("listing what is owned deleted %s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
		}
	}

	d := w.applier.Apply(t.Context(), protocol.DesiredState{Generation: 2, Hash: "decommission", Decommission: true})
	wantComplete(t, d)
	if len(d.Results) != len(plan) {
		t.Fatalf("the decommission did %d things, the plan listed %d:\n%s", len(d.Results), len(plan), describe(d))
	}
	for i, r := range d.Results {
		p := plan[i]
		p.Message, r.Message = "", ""
		if r != p {
			t.Errorf("step %d: the decommission did %+v, the plan said %+v", i, r, p)
		}
	}
	for _, u := range append(others, kept) {
		if got := liveOf(t, u); got == nil || got.GetDeletionTimestamp() != nil {
			t.Errorf("%s %s with labels %v was deleted", u.GetKind(), u.GetName(), u.GetLabels())
		}
	}

	// What the decommission kept, or could not finish, is what is owned afterwards.
	after, err := w.applier.Owned(t.Context())
	if err != nil {
		t.Fatalf("Owned after the decommission: %v", err)
	}
	var names []string
	for _, r := range after {
		names = append(names, r.Name+":"+string(r.Action))
	}
	if got, want := strings.Join(names, " "), "owned-held:pruned owned-kept:skipped"; got != want {
		t.Errorf("owned after the decommission: %s, want %s", got, want)
	}
}

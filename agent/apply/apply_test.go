package apply_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

var (
	resourceFlavorGVK = kueue.GroupVersion.WithKind("ResourceFlavor")
	clusterQueueGVK   = kueue.GroupVersion.WithKind("ClusterQueue")
	localQueueGVK     = kueue.GroupVersion.WithKind("LocalQueue")
	workloadGVK       = kueue.GroupVersion.WithKind("Workload")
)

func TestApplyCreatesEveryRenderedObjectThenChangesNothing(t *testing.T) {
	t.Parallel()
	for i, v := range fleetgen.Variants() {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			w := newWorker(t, fmt.Sprintf("same%d", i))
			objs := w.render(fleetEdit{fsys: v.FS})

			first := w.apply(objs)
			wantComplete(t, first)
			if len(first.Results) != len(objs) {
				t.Fatalf("%d results for %d objects:\n%s", len(first.Results), len(objs), describe(first))
			}
			versions := map[string]string{}
			for i, u := range objs {
				// The renderer's order is already the apply order, so results follow it.
				r := first.Results[i]
				if r.Kind != u.GetKind() || r.Namespace != u.GetNamespace() || r.Name != u.GetName() {
					t.Errorf("result %d is for %s %s/%s, want %s %s/%s", i, r.Kind, r.Namespace, r.Name, u.GetKind(), u.GetNamespace(), u.GetName())
				}
				if r.Action != protocol.ActionCreated {
					t.Errorf("%s %s: %s (%s), want created", u.GetKind(), u.GetName(), r.Action, r.Message)
				}
				got := liveOf(t, u)
				if got == nil {
					t.Fatalf("%s %s/%s does not exist after Apply", u.GetKind(), u.GetNamespace(), u.GetName())
				}
				if r.UID == "" || r.UID != string(got.GetUID()) {
					t.Errorf("%s %s: result UID %q, live UID %q", u.GetKind(), u.GetName(), r.UID, got.GetUID())
				}
				for k, v := range ownerLabels(w.identity) {
					if got.GetLabels()[k] != v {
						t.Errorf("%s %s: label %s is %q, want %q", u.GetKind(), u.GetName(), k, got.GetLabels()[k], v)
					}
				}
				versions[r.UID] = got.GetResourceVersion()
			}

			second := w.apply(objs)
			wantComplete(t, second)
			if len(second.Results) != len(objs) {
				t.Fatalf("%d results for %d objects:\n%s", len(second.Results), len(objs), describe(second))
			}
			for _, u := range objs {
				r := result(t, second, u.GetKind(), u.GetNamespace(), u.GetName())
				want := protocol.ActionUnchanged
				if u.GetKind() == "Namespace" {
					want = protocol.ActionSkipped // create-only
				}
				if r.Action != want {
					t.Errorf("second apply: %s %s: %s (%s), want %s", u.GetKind(), u.GetName(), r.Action, r.Message, want)
				}
				got := liveOf(t, u)
				if rv, ok := versions[string(got.GetUID())]; !ok || rv != got.GetResourceVersion() {
					t.Errorf("second apply wrote %s %s: resourceVersion %s, was %s (uid %s)", u.GetKind(), u.GetName(), got.GetResourceVersion(), rv, got.GetUID())
				}
			}
		})
	}
}

func TestApplyUpdatesInPlace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		edit  fleetEdit
		field []string
		want  any
	}{
		{"quota", fleetEdit{gpus: 128}, []string{"spec", "resourceGroups"}, "128"},
		{"cordon", fleetEdit{cordoned: true}, []string{"spec", "stopPolicy"}, string(kueue.Hold)},
		{"overlay", fleetEdit{fsys: overlayFleet()}, []string{"spec", "queueingStrategy"}, string(kueue.StrictFIFO)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorker(t, "upd-"+tc.name)
			objs := w.render(fleetEdit{})
			wantComplete(t, w.apply(objs))
			cq := find(t, objs, "ClusterQueue")
			before := liveOf(t, cq)

			changed := w.render(tc.edit)
			a := w.apply(changed)
			wantComplete(t, a)
			r := result(t, a, "ClusterQueue", "", cq.GetName())
			if r.Action != protocol.ActionConfigured {
				t.Errorf("ClusterQueue: %s (%s), want configured", r.Action, r.Message)
			}
			after := liveOf(t, cq)
			if after.GetUID() != before.GetUID() || r.UID != string(before.GetUID()) {
				t.Errorf("ClusterQueue UID %s (result %s), was %s: not updated in place", after.GetUID(), r.UID, before.GetUID())
			}
			if got := gpuQuotaOr(after, tc.field); got != tc.want {
				t.Errorf("ClusterQueue %v is %v, want %v", tc.field, got, tc.want)
			}
			for _, u := range changed {
				if u.GetKind() == "ClusterQueue" || u.GetKind() == "Namespace" {
					continue
				}
				r := result(t, a, u.GetKind(), u.GetNamespace(), u.GetName())
				want := protocol.ActionUnchanged
				if isNew(u, objs) {
					want = protocol.ActionCreated
				}
				if r.Action != want {
					t.Errorf("%s %s: %s (%s), want %s", u.GetKind(), u.GetName(), r.Action, r.Message, want)
				}
			}
		})
	}
}

// overlayFleet is the template with its example cluster's overlay, which patches the
// ClusterQueue and adds a WorkloadPriorityClass.
func overlayFleet() fstest.MapFS {
	for _, v := range fleetgen.Variants() {
		if v.Name == "gke-dws-overlay" {
			return v.FS
		}
	}
	panic("fleetgen has no gke-dws-overlay variant")
}

// isNew reports whether u is not among the objects of before.
func isNew(u *unstructured.Unstructured, before []*unstructured.Unstructured) bool {
	return !slices.ContainsFunc(before, func(b *unstructured.Unstructured) bool {
		return b.GetKind() == u.GetKind() && b.GetNamespace() == u.GetNamespace() && b.GetName() == u.GetName()
	})
}

// gpuQuotaOr is the nvidia.com/gpu nominal quota of the first flavor when field is
// spec.resourceGroups, else the string at field.
func gpuQuotaOr(cq *unstructured.Unstructured, field []string) any {
	if !slices.Equal(field, []string{"spec", "resourceGroups"}) {
		v, _, _ := unstructured.NestedString(cq.Object, field...)
		return v
	}
	groups, _, _ := unstructured.NestedSlice(cq.Object, field...)
	for _, g := range groups {
		flavors, _, _ := unstructured.NestedSlice(g.(map[string]any), "flavors")
		for _, f := range flavors {
			res, _, _ := unstructured.NestedSlice(f.(map[string]any), "resources")
			for _, r := range res {
				if m := r.(map[string]any); m["name"] == "nvidia.com/gpu" {
					return fmt.Sprint(m["nominalQuota"])
				}
			}
		}
	}
	return nil
}

func TestApplyRevertsHandEditsOfItsFields(t *testing.T) {
	t.Parallel()
	w := newWorker(t, "handedit")
	objs := w.render(fleetEdit{})
	wantComplete(t, w.apply(objs))
	cq := find(t, objs, "ClusterQueue")
	before := liveOf(t, cq)

	// kubectl edit of a field the agent applies: another field manager takes it over.
	edited := before.DeepCopy()
	groups, _, _ := unstructured.NestedSlice(edited.Object, "spec", "resourceGroups")
	flavor := groups[0].(map[string]any)["flavors"].([]any)[0].(map[string]any)
	for _, r := range flavor["resources"].([]any) {
		if m := r.(map[string]any); m["name"] == "nvidia.com/gpu" {
			m["nominalQuota"] = "1"
		}
	}
	_ = unstructured.SetNestedSlice(edited.Object, groups, "spec", "resourceGroups")
	if err := admin().Update(t.Context(), edited, client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}

	a := w.apply(objs)
	wantComplete(t, a)
	if r := result(t, a, "ClusterQueue", "", cq.GetName()); r.Action != protocol.ActionConfigured {
		t.Errorf("ClusterQueue: %s (%s), want configured", r.Action, r.Message)
	}
	after := liveOf(t, cq)
	if got := gpuQuotaOr(after, []string{"spec", "resourceGroups"}); got != "64" {
		t.Errorf("GPU quota is %v after Apply, want the rendered 64", got)
	}
	if after.GetUID() != before.GetUID() {
		t.Errorf("ClusterQueue recreated: UID %s, was %s", after.GetUID(), before.GetUID())
	}
}

func TestApplyPrunesOnlyOwnedObjectsAndNeverNamespaces(t *testing.T) {
	t.Parallel()
	w := newWorker(t, "prune")

	flavor := func(name string, labels, annotations map[string]string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(resourceFlavorGVK)
		u.SetName(name)
		u.SetLabels(labels)
		u.SetAnnotations(annotations)
		return u
	}
	untouchable := []*unstructured.Unstructured{
		flavor("prune-unlabeled", nil, nil),
		flavor("prune-no-identity", map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue}, nil),
		flavor("prune-identity-only", map[string]string{v1alpha1.WorkerClusterLabel: w.identity}, nil),
		flavor("prune-other-worker", ownerLabels("9-another-example-us-central1"), nil),
	}
	kept := flavor("prune-disabled", ownerLabels(w.identity), map[string]string{v1alpha1.PruneAnnotation: v1alpha1.PruneDisabled})
	stale := flavor("prune-stale", ownerLabels(w.identity), nil)
	for _, u := range append(slices.Clone(untouchable), kept, stale) {
		create(t, u)
	}

	first := w.render(fleetEdit{namespaces: []string{"a", "b"}})
	a := w.apply(first)
	wantComplete(t, a)
	staleUID := string(stale.GetUID())
	if r := result(t, a, "ResourceFlavor", "", "prune-stale"); r.Action != protocol.ActionPruned || r.UID != staleUID {
		t.Errorf("owned, undesired ResourceFlavor: %s uid %s (%s), want pruned uid %s", r.Action, r.UID, r.Message, staleUID)
	}
	if liveOf(t, stale) != nil {
		t.Error("the pruned ResourceFlavor still exists")
	}
	if r := result(t, a, "ResourceFlavor", "", "prune-disabled"); r.Action != protocol.ActionSkipped || !strings.Contains(r.Message, v1alpha1.PruneAnnotation) {
		t.Errorf("ResourceFlavor with prune disabled: %s (%s), want skipped naming %s", r.Action, r.Message, v1alpha1.PruneAnnotation)
	}

	// Something a user made by hand in a workload namespace, of a kind that is pruned.
	manual := &unstructured.Unstructured{}
	manual.SetGroupVersionKind(localQueueGVK)
	manual.SetNamespace(w.tenant + "-b")
	manual.SetName("manual")
	_ = unstructured.SetNestedField(manual.Object, "somewhere", "spec", "clusterQueue")
	create(t, manual)
	untouchable = append(untouchable, manual)

	// Namespace b leaves the fleet, and the preset without admission checks replaces
	// the one with them.
	second := w.render(fleetEdit{namespaces: []string{"a"}, preset: "gpu"})
	b := w.apply(second)
	wantComplete(t, b)
	for _, u := range first {
		if slices.ContainsFunc(second, func(s *unstructured.Unstructured) bool {
			return s.GetKind() == u.GetKind() && s.GetNamespace() == u.GetNamespace() && s.GetName() == u.GetName()
		}) {
			continue
		}
		if u.GetKind() == "Namespace" {
			if got := liveOf(t, u); got == nil || got.GetDeletionTimestamp() != nil {
				t.Errorf("namespace %s left the desired state and was deleted", u.GetName())
			}
			continue
		}
		r := result(t, b, u.GetKind(), u.GetNamespace(), u.GetName())
		if r.Action != protocol.ActionPruned || r.UID == "" {
			t.Errorf("%s %s/%s: %s uid %q (%s), want pruned with its UID", u.GetKind(), u.GetNamespace(), u.GetName(), r.Action, r.UID, r.Message)
		}
		if liveOf(t, u) != nil {
			t.Errorf("%s %s/%s was reported pruned but exists", u.GetKind(), u.GetNamespace(), u.GetName())
		}
	}
	for _, r := range b.Results {
		if r.Kind == "Namespace" && r.Action != protocol.ActionSkipped {
			t.Errorf("namespace %s: %s", r.Name, r.Action)
		}
	}
	// The ClusterQueue of the new preset has no admission checks: fields the agent no
	// longer applies are removed.
	cq := liveOf(t, find(t, second, "ClusterQueue"))
	if _, found, _ := unstructured.NestedFieldNoCopy(cq.Object, "spec", "admissionChecksStrategy"); found {
		t.Error("the ClusterQueue kept spec.admissionChecksStrategy after the preset dropped it")
	}

	for _, u := range append(untouchable, kept) {
		got := liveOf(t, u)
		if got == nil || got.GetUID() != u.GetUID() || got.GetDeletionTimestamp() != nil {
			t.Errorf("%s %s/%s with labels %v was deleted", u.GetKind(), u.GetNamespace(), u.GetName(), u.GetLabels())
		}
	}
}

func TestApplyRefusesABrownfieldClusterQueueUntilItIsHandedOver(t *testing.T) {
	t.Parallel()
	w := newWorker(t, "brown")
	ctx := t.Context()
	// The presets' own names: the cluster already runs Kueue with a queue of that name.
	objs := w.render(fleetEdit{keepNames: true})

	running := &kueue.ClusterQueue{
		ObjectMeta: metav1.ObjectMeta{Name: "cluster-queue", Labels: map[string]string{"team": "ml-platform"}},
		Spec: kueue.ClusterQueueSpec{
			NamespaceSelector: &metav1.LabelSelector{},
			ResourceGroups: []kueue.ResourceGroup{{
				CoveredResources: []corev1.ResourceName{corev1.ResourceCPU},
				Flavors: []kueue.FlavorQuotas{{
					Name:      "default-flavor",
					Resources: []kueue.ResourceQuota{{Name: corev1.ResourceCPU, NominalQuota: resource.MustParse("96")}},
				}},
			}},
		},
	}
	create(t, running)
	running.Status = kueue.ClusterQueueStatus{
		AdmittedWorkloads:  3,
		ReservingWorkloads: 3,
		PendingWorkloads:   2,
		FlavorsUsage: []kueue.FlavorUsage{{Name: "default-flavor", Resources: []kueue.ResourceUsage{
			{Name: corev1.ResourceCPU, Total: resource.MustParse("48")},
		}}},
		Conditions: []metav1.Condition{{
			Type: kueue.ClusterQueueActive, Status: metav1.ConditionTrue, Reason: "Ready",
			Message: "Can admit new workloads", LastTransitionTime: metav1.Now(),
		}},
	}
	if err := admin().Status().Update(ctx, running); err != nil {
		t.Fatalf("setting the running ClusterQueue's status: %v", err)
	}
	before := live(t, clusterQueueGVK, "", "cluster-queue")
	beforeJSON := mustJSON(t, before.Object)
	uid := string(before.GetUID())

	for attempt := range 2 {
		a := w.apply(objs)
		r := result(t, a, "ClusterQueue", "", "cluster-queue")
		if r.Action != protocol.ActionRefused {
			t.Fatalf("apply %d: brownfield ClusterQueue: %s (%s), want refused", attempt, r.Action, r.Message)
		}
		if !strings.HasPrefix(r.Message, apply.RefusePrefix) ||
			!strings.Contains(r.Message, "ClusterQueue/cluster-queue") || !strings.Contains(r.Message, uid) {
			t.Errorf("refusal %q does not start with %q and name ClusterQueue/cluster-queue and uid %s", r.Message, apply.RefusePrefix, uid)
		}
		if r.UID != uid {
			t.Errorf("refusal UID %q, want %s", r.UID, uid)
		}
		if a.Complete() {
			t.Error("an Applied with a refusal is complete")
		}
		for _, other := range a.Results {
			if other.Kind != "ClusterQueue" && other.Action != protocol.ActionCreated && other.Action != protocol.ActionUnchanged && other.Action != protocol.ActionSkipped {
				t.Errorf("apply %d: %s %s: %s (%s): the refusal stopped others", attempt, other.Kind, other.Name, other.Action, other.Message)
			}
		}
		if after := mustJSON(t, live(t, clusterQueueGVK, "", "cluster-queue").Object); !bytes.Equal(after, beforeJSON) {
			t.Fatalf("apply %d changed the refused ClusterQueue:\nbefore %s\nafter  %s", attempt, beforeJSON, after)
		}
	}

	// The operator hands it over.
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, v1alpha1.WorkerClusterLabel, w.identity)
	if err := admin().Patch(ctx, before, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	a := w.apply(objs)
	wantComplete(t, a)
	r := result(t, a, "ClusterQueue", "", "cluster-queue")
	if r.Action != protocol.ActionConfigured || r.UID != uid {
		t.Errorf("handed-over ClusterQueue: %s uid %s (%s), want configured with uid %s", r.Action, r.UID, r.Message, uid)
	}
	adopted := &kueue.ClusterQueue{}
	if err := admin().Get(ctx, client.ObjectKey{Name: "cluster-queue"}, adopted); err != nil {
		t.Fatal(err)
	}
	if string(adopted.UID) != uid {
		t.Errorf("adopted ClusterQueue has UID %s, want %s", adopted.UID, uid)
	}
	for k, v := range ownerLabels(w.identity) {
		if adopted.Labels[k] != v {
			t.Errorf("adopted ClusterQueue: label %s=%q, want %q", k, adopted.Labels[k], v)
		}
	}
	if got := adopted.Spec.ResourceGroups[0].CoveredResources; !slices.Contains(got, "nvidia.com/gpu") {
		t.Errorf("adopted ClusterQueue covers %v, not the rendered resources", got)
	}
	if adopted.Status.AdmittedWorkloads != 3 || adopted.Status.PendingWorkloads != 2 {
		t.Errorf("adopting changed the status: admitted %d, pending %d", adopted.Status.AdmittedWorkloads, adopted.Status.PendingWorkloads)
	}
}

func TestApplyCordonKeepsAdmittedWorkloads(t *testing.T) {
	t.Parallel()
	w := newWorker(t, "cordon")
	ctx := t.Context()
	objs := w.render(fleetEdit{})
	wantComplete(t, w.apply(objs))
	cqName := find(t, objs, "ClusterQueue").GetName()
	flavorName := find(t, objs, "ResourceFlavor").GetName()
	lq := find(t, objs, "LocalQueue")

	// A job's Workload that Kueue admitted, as Kueue leaves it.
	wl := &kueue.Workload{
		ObjectMeta: metav1.ObjectMeta{Namespace: lq.GetNamespace(), Name: "train-llm"},
		Spec: kueue.WorkloadSpec{
			QueueName: kueue.LocalQueueName(lq.GetName()),
			PodSets: []kueue.PodSet{{
				Name:  "main",
				Count: 1,
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers: []corev1.Container{{
						Name: "trainer", Image: "registry.example/trainer:1",
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}},
					}},
				}},
			}},
		},
	}
	create(t, wl)
	now := metav1.Now()
	wl.Status = kueue.WorkloadStatus{
		Admission: &kueue.Admission{
			ClusterQueue: kueue.ClusterQueueReference(cqName),
			PodSetAssignments: []kueue.PodSetAssignment{{
				Name:          "main",
				Flavors:       map[corev1.ResourceName]kueue.ResourceFlavorReference{corev1.ResourceCPU: kueue.ResourceFlavorReference(flavorName)},
				ResourceUsage: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")},
				Count:         new(int32(1)),
			}},
		},
		Conditions: []metav1.Condition{
			{Type: kueue.WorkloadQuotaReserved, Status: metav1.ConditionTrue, Reason: "QuotaReserved", Message: "Quota reserved in ClusterQueue " + cqName, LastTransitionTime: now},
			{Type: kueue.WorkloadAdmitted, Status: metav1.ConditionTrue, Reason: "Admitted", Message: "The workload is admitted", LastTransitionTime: now},
		},
	}
	if err := admin().Status().Update(ctx, wl); err != nil {
		t.Fatalf("admitting the Workload: %v", err)
	}
	cq := &kueue.ClusterQueue{}
	if err := admin().Get(ctx, client.ObjectKey{Name: cqName}, cq); err != nil {
		t.Fatal(err)
	}
	cq.Status.AdmittedWorkloads, cq.Status.ReservingWorkloads = 1, 1
	if err := admin().Status().Update(ctx, cq); err != nil {
		t.Fatal(err)
	}
	wlBefore := mustJSON(t, live(t, workloadGVK, wl.Namespace, wl.Name).Object)

	a := w.apply(w.render(fleetEdit{cordoned: true}))
	wantComplete(t, a)
	r := result(t, a, "ClusterQueue", "", cqName)
	if r.Action != protocol.ActionConfigured || r.UID != string(cq.UID) {
		t.Errorf("cordoned ClusterQueue: %s uid %s (%s), want configured uid %s", r.Action, r.UID, r.Message, cq.UID)
	}
	if got := result(t, a, "LocalQueue", lq.GetNamespace(), lq.GetName()); got.Action != protocol.ActionUnchanged {
		t.Errorf("LocalQueue: %s (%s), want unchanged", got.Action, got.Message)
	}
	after := &kueue.ClusterQueue{}
	if err := admin().Get(ctx, client.ObjectKey{Name: cqName}, after); err != nil {
		t.Fatal(err)
	}
	if after.Spec.StopPolicy == nil || *after.Spec.StopPolicy != kueue.Hold {
		t.Errorf("cordoned ClusterQueue has stopPolicy %v, want Hold", after.Spec.StopPolicy)
	}
	if after.UID != cq.UID || after.Status.AdmittedWorkloads != 1 {
		t.Errorf("cordoned ClusterQueue: UID %s (was %s), admitted %d (was 1)", after.UID, cq.UID, after.Status.AdmittedWorkloads)
	}
	if wlAfter := mustJSON(t, live(t, workloadGVK, wl.Namespace, wl.Name).Object); !bytes.Equal(wlAfter, wlBefore) {
		t.Errorf("cordoning changed the admitted Workload:\nbefore %s\nafter  %s", wlBefore, wlAfter)
	}
}

func TestApplyRefusesAndNeverPrunesObjectsOfAnotherWorker(t *testing.T) {
	t.Parallel()
	w := newWorker(t, "mine")
	const other = "6-theirs-example-us-central1"
	objs := w.render(fleetEdit{})
	cq := find(t, objs, "ClusterQueue")

	theirs := cq.DeepCopy()
	theirs.SetLabels(ownerLabels(other))
	create(t, theirs)
	theirFlavor := &unstructured.Unstructured{}
	theirFlavor.SetGroupVersionKind(resourceFlavorGVK)
	theirFlavor.SetName("mine-theirs-only")
	theirFlavor.SetLabels(ownerLabels(other))
	create(t, theirFlavor)
	before := mustJSON(t, liveOf(t, theirs).Object)

	a := w.apply(objs)
	r := result(t, a, "ClusterQueue", "", cq.GetName())
	if r.Action != protocol.ActionRefused || r.UID != string(theirs.GetUID()) ||
		!strings.HasPrefix(r.Message, apply.RefusePrefix) || !strings.Contains(r.Message, fmt.Sprintf("WorkerCluster %q", other)) {
		t.Errorf("another worker's ClusterQueue: %s uid %s (%s), want refused naming %q and uid %s", r.Action, r.UID, r.Message, other, theirs.GetUID())
	}
	for _, u := range objs {
		if u.GetKind() != "ClusterQueue" {
			if r := result(t, a, u.GetKind(), u.GetNamespace(), u.GetName()); r.Action != protocol.ActionCreated {
				t.Errorf("%s %s: %s (%s), want created", u.GetKind(), u.GetName(), r.Action, r.Message)
			}
		}
	}
	if after := mustJSON(t, liveOf(t, theirs).Object); !bytes.Equal(after, before) {
		t.Errorf("the refused ClusterQueue changed:\nbefore %s\nafter  %s", before, after)
	}

	// Neither wanted any more nor, as another worker's, ever pruned.
	d := w.applier.Apply(t.Context(), protocol.DesiredState{Generation: 2, Hash: "decommission", Decommission: true})
	wantComplete(t, d)
	for _, u := range []*unstructured.Unstructured{theirs, theirFlavor} {
		if got := liveOf(t, u); got == nil || got.GetUID() != u.GetUID() {
			t.Errorf("another worker's %s %s was deleted", u.GetKind(), u.GetName())
		}
	}
}

func TestDecommissionPrunesOwnedObjectsAndKeepsNamespaces(t *testing.T) {
	t.Parallel()
	w := newWorker(t, "decom")
	objs := w.render(fleetEdit{fsys: overlayFleet(), namespaces: []string{"a", "b"}})
	wantComplete(t, w.apply(objs))
	unlabeled := &unstructured.Unstructured{}
	unlabeled.SetGroupVersionKind(resourceFlavorGVK)
	unlabeled.SetName("decom-unlabeled")
	create(t, unlabeled)

	// A decommission carries no objects, and any it carries are not applied.
	extra := &unstructured.Unstructured{}
	extra.SetGroupVersionKind(resourceFlavorGVK)
	extra.SetName("decom-extra")
	extra.SetLabels(ownerLabels(w.identity))
	st := state(t, []*unstructured.Unstructured{extra})
	st.Decommission = true
	a := w.applier.Apply(t.Context(), st)
	wantComplete(t, a)
	pruned := 0
	for _, u := range objs {
		if u.GetKind() == "Namespace" {
			if got := liveOf(t, u); got == nil || got.GetDeletionTimestamp() != nil {
				t.Errorf("decommission deleted namespace %s", u.GetName())
			}
			continue
		}
		pruned++
		if r := result(t, a, u.GetKind(), u.GetNamespace(), u.GetName()); r.Action != protocol.ActionPruned {
			t.Errorf("%s %s/%s: %s (%s), want pruned", u.GetKind(), u.GetNamespace(), u.GetName(), r.Action, r.Message)
		}
		if liveOf(t, u) != nil {
			t.Errorf("%s %s/%s survived the decommission", u.GetKind(), u.GetNamespace(), u.GetName())
		}
	}
	if len(a.Results) != pruned {
		t.Errorf("%d results, want the %d pruned objects:\n%s", len(a.Results), pruned, describe(a))
	}
	if liveOf(t, extra) != nil {
		t.Error("a decommission applied an object")
	}
	if liveOf(t, unlabeled) == nil {
		t.Error("a decommission deleted an unlabeled object")
	}

	again := w.applier.Apply(t.Context(), protocol.DesiredState{Generation: 3, Hash: "decommission", Decommission: true})
	wantComplete(t, again)
	if len(again.Results) != 0 {
		t.Errorf("a second decommission did something:\n%s", describe(again))
	}
}

func TestApplyFailsOneObjectAndAppliesTheOthers(t *testing.T) {
	t.Parallel()
	for i, tc := range []struct {
		name string
		bad  func(w *worker) *unstructured.Unstructured
		// message must be in the failed object's message, besides its name.
		message string
		// errorWant is in Applied.Error; empty means no error.
		errorWant string
	}{
		{
			name: "an object not labeled for this worker",
			bad: func(w *worker) *unstructured.Unstructured {
				u := flavorObject("bad-unlabeled")
				u.SetLabels(map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue})
				return u
			},
			message: "not applied",
		},
		{
			name: "an object labeled for another worker",
			bad: func(w *worker) *unstructured.Unstructured {
				u := flavorObject("bad-theirs")
				u.SetLabels(ownerLabels("6-theirs-example-us-central1"))
				return u
			},
			message: "6-theirs-example-us-central1",
		},
		{
			name: "a kind the API server does not serve",
			bad: func(w *worker) *unstructured.Unstructured {
				u := &unstructured.Unstructured{}
				u.SetAPIVersion("widgets.example.com/v1")
				u.SetKind("Widget")
				u.SetName("bad-widget")
				u.SetLabels(ownerLabels(w.identity))
				return u
			},
			message: "no matches for kind",
		},
		{
			name: "a LocalQueue in a namespace that does not exist",
			bad: func(w *worker) *unstructured.Unstructured {
				u := &unstructured.Unstructured{}
				u.SetGroupVersionKind(localQueueGVK)
				u.SetNamespace(w.tenant + "-nowhere")
				u.SetName("bad-queue")
				u.SetLabels(ownerLabels(w.identity))
				_ = unstructured.SetNestedField(u.Object, "cluster-queue", "spec", "clusterQueue")
				return u
			},
			message: "not found",
		},
		{
			name: "a spec the schema rejects",
			bad: func(w *worker) *unstructured.Unstructured {
				u := &unstructured.Unstructured{}
				u.SetGroupVersionKind(clusterQueueGVK)
				u.SetName(w.tenant + "-bad-queue")
				u.SetLabels(ownerLabels(w.identity))
				_ = unstructured.SetNestedField(u.Object, "Random", "spec", "queueingStrategy")
				return u
			},
			message: "Invalid",
		},
		{
			name: "a kind the agent's RBAC does not allow",
			bad: func(w *worker) *unstructured.Unstructured {
				u := &unstructured.Unstructured{}
				u.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
				u.SetNamespace(w.tenant + "-ml")
				u.SetName("bad-config")
				u.SetLabels(ownerLabels(w.identity))
				return u
			},
			message: "forbidden",
			// The desired state's kinds are listed for pruning, which RBAC forbids too.
			errorWant: "ConfigMap",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorker(t, fmt.Sprintf("fail%d", i))
			objs := w.render(fleetEdit{})
			bad := tc.bad(w)
			a := w.apply(append(slices.Clone(objs), bad))
			r := result(t, a, bad.GetKind(), bad.GetNamespace(), bad.GetName())
			if r.Action != protocol.ActionFailed || !strings.Contains(r.Message, bad.GetName()) || !strings.Contains(r.Message, tc.message) {
				t.Errorf("bad object: %s (%s), want failed naming %s with %q", r.Action, r.Message, bad.GetName(), tc.message)
			}
			if a.Complete() {
				t.Error("an Applied with a failure is complete")
			}
			for _, u := range objs {
				if r := result(t, a, u.GetKind(), u.GetNamespace(), u.GetName()); r.Action != protocol.ActionCreated {
					t.Errorf("%s %s: %s (%s), want created despite the bad object", u.GetKind(), u.GetName(), r.Action, r.Message)
				}
			}
			switch {
			case tc.errorWant == "" && a.Error != "":
				t.Errorf("Applied.Error %q, want none", a.Error)
			case !strings.Contains(a.Error, tc.errorWant):
				t.Errorf("Applied.Error %q, want it to mention %q", a.Error, tc.errorWant)
			}
		})
	}
}

func flavorObject(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(resourceFlavorGVK)
	u.SetName(name)
	return u
}

func TestApplySkipsPruningWhenAnObjectCannotBeDecoded(t *testing.T) {
	t.Parallel()
	w := newWorker(t, "garbled")
	objs := w.render(fleetEdit{})
	wantComplete(t, w.apply(objs))

	st := state(t, without(objs, "LocalQueue"))
	garbled := len(st.Objects)
	st.Objects = append(st.Objects, json.RawMessage(`{"apiVersion":"kueue.x-k8s.io/v1beta2","metadata":{"name":"user-queue"}}`))
	a := w.applier.Apply(t.Context(), st)
	if !strings.Contains(a.Error, "pruning skipped") {
		t.Errorf("Applied.Error %q, want pruning skipped", a.Error)
	}
	failed := 0
	for _, r := range a.Results {
		if r.Action == protocol.ActionFailed && strings.Contains(r.Message, fmt.Sprintf("object %d of the desired state", garbled)) {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("want one failure naming object %d:\n%s", garbled, describe(a))
	}
	// Perhaps the undecodable object was the LocalQueue: it is not pruned.
	if liveOf(t, find(t, objs, "LocalQueue")) == nil {
		t.Error("the LocalQueue was pruned although an undecodable object could have been it")
	}
}

// A desired state the tunnel carries yields a report the tunnel carries, however many of
// its objects fail and however long what they say: the report lists the first failures,
// clipped, and says how many there were.
func TestApplyReportsAnyDesiredStateWithinTheTunnelsMessageCap(t *testing.T) {
	t.Parallel()
	const many = 40000
	objects := func(n int, object func(i int) string) []json.RawMessage {
		out := make([]json.RawMessage, n)
		for i := range out {
			out[i] = json.RawMessage(object(i))
		}
		return out
	}
	for i, tc := range []struct {
		name    string
		objects []json.RawMessage
		// listed is how many failures the report lists; errorWant is in Applied.Error.
		listed    int
		errorWant []string
	}{
		{
			// The decoder's error repeats each object whole.
			name: "tens of thousands of objects that cannot be decoded",
			objects: objects(many, func(i int) string {
				return fmt.Sprintf(`{"apiVersion":"kueue.x-k8s.io/v1beta2","metadata":{"name":"flavor-%05d","labels":{"team":"research"}},"spec":{"nodeLabels":{"gpu":"h100"}}}`, i)
			}),
			listed:    100,
			errorWant: []string{fmt.Sprintf("%d objects of the desired state could not be decoded", many), fmt.Sprintf("%d objects failed or were refused; the report lists the first 100", many)},
		},
		{
			name: "tens of thousands of objects not labeled for this worker",
			objects: objects(many, func(i int) string {
				return fmt.Sprintf(`{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"ResourceFlavor","metadata":{"name":"flavor-%05d"}}`, i)
			}),
			listed:    100,
			errorWant: []string{fmt.Sprintf("%d objects failed or were refused; the report lists the first 100", many)},
		},
		{
			// Reported as its name, and again in its message.
			name: "an object named with megabytes",
			objects: objects(1, func(int) string {
				return `{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"ResourceFlavor","metadata":{"name":"` + strings.Repeat("f", 6<<20) + `"}}`
			}),
			listed: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorker(t, fmt.Sprintf("toolarge%d", i))
			st := protocol.DesiredState{Generation: 1, Hash: "sha256:" + strings.Repeat("0", 64), Objects: tc.objects}
			if err := protocol.NewConn(&bytes.Buffer{}).Send(protocol.TypeDesired, &st); err != nil {
				t.Fatalf("the desired state itself does not fit the tunnel: %v", err)
			}
			a := w.applier.Apply(t.Context(), st)
			if err := protocol.NewConn(&bytes.Buffer{}).Send(protocol.TypeApplied, &a); err != nil {
				t.Errorf("the report does not fit the tunnel: %v", err)
			}
			failed := 0
			for _, r := range a.Results {
				if r.Action == protocol.ActionFailed {
					failed++
				}
			}
			if failed != tc.listed || len(a.Results) != tc.listed {
				t.Errorf("the report lists %d results, %d of them failed; want %d failed", len(a.Results), failed, tc.listed)
			}
			if len(tc.errorWant) == 0 && a.Error != "" {
				t.Errorf("Applied.Error %q, want none", protocol.ClipTo(a.Error, 1<<10))
			}
			for _, want := range tc.errorWant {
				if !strings.Contains(a.Error, want) {
					t.Errorf("Applied.Error %q, want it to say %q", protocol.ClipTo(a.Error, 1<<10), want)
				}
			}
			if a.Complete() {
				t.Error("a report of failures is complete")
			}
		})
	}
}

func TestApplyReportsImmutableChangesWithoutRecreating(t *testing.T) {
	t.Parallel()
	w := newWorker(t, "immutable")
	objs := w.render(fleetEdit{})
	wantComplete(t, w.apply(objs))
	lq := find(t, objs, "LocalQueue")
	before := liveOf(t, lq)

	changed := w.render(fleetEdit{})
	moved := find(t, changed, "LocalQueue")
	_ = unstructured.SetNestedField(moved.Object, "another-queue", "spec", "clusterQueue")
	a := w.apply(changed)
	r := result(t, a, "LocalQueue", lq.GetNamespace(), lq.GetName())
	if r.Action != protocol.ActionFailed || !strings.Contains(r.Message, "immutable") || r.UID != string(before.GetUID()) {
		t.Errorf("LocalQueue moved to another ClusterQueue: %s uid %s (%s), want failed as immutable with uid %s", r.Action, r.UID, r.Message, before.GetUID())
	}
	after := liveOf(t, lq)
	if after == nil || after.GetUID() != before.GetUID() || after.GetResourceVersion() != before.GetResourceVersion() {
		t.Errorf("the LocalQueue was recreated or changed: %v", after)
	}
}

func TestPruneKindsCoverEveryRenderedKind(t *testing.T) {
	t.Parallel()
	kinds := apply.PruneKinds()
	for _, v := range fleetgen.Variants() {
		w := &worker{t: t, tenant: "example", identity: "7-example-" + fleetgen.ExampleCluster}
		for _, u := range w.render(fleetEdit{fsys: v.FS, keepNames: true}) {
			if u.GetKind() == "Namespace" {
				continue
			}
			if !slices.Contains(kinds, u.GroupVersionKind()) {
				t.Errorf("%s renders %s, which is not listed for pruning", v.Name, u.GroupVersionKind())
			}
		}
	}
}

func TestNewRefusesIncompleteOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts apply.Options
		want string
	}{
		{"no client", apply.Options{Identity: "7-example-a"}, "client"},
		{"no identity", apply.Options{Client: admin()}, "identity"},
		{"an identity that is no label value", apply.Options{Client: admin(), Identity: "not a label"}, "label value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := apply.New(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want an error about %s", err, tc.want)
			}
		})
	}
}

func TestPruneReportsADeletionHeldByFinalizers(t *testing.T) {
	t.Parallel()
	w := newWorker(t, "finalizer")
	held := flavorObject("finalizer-held")
	held.SetLabels(ownerLabels(w.identity))
	held.SetFinalizers([]string{"example.com/in-use"})
	create(t, held)
	t.Cleanup(func() {
		// Nothing here removes finalizers; without this the flavor would stay. The
		// test's context is over by now.
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		if err := admin().Patch(context.Background(), held, client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Errorf("removing the finalizer: %v", err)
		}
	})
	objs := w.render(fleetEdit{})

	for attempt, message := range []string{"", "deletion pending on finalizers [example.com/in-use]"} {
		a := w.apply(objs)
		wantComplete(t, a)
		r := result(t, a, "ResourceFlavor", "", held.GetName())
		if r.Action != protocol.ActionPruned || r.Message != message {
			t.Errorf("apply %d: %s (%q), want pruned (%q)", attempt, r.Action, r.Message, message)
		}
		if got := liveOf(t, held); got == nil || got.GetDeletionTimestamp() == nil {
			t.Errorf("apply %d: the flavor is %v, want it terminating", attempt, got)
		}
	}
}

package render

import (
	"cmp"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
)

// DefaultLocalQueue is the LocalQueue a preset with a single ClusterQueue and no
// LocalQueue of its own gets in every workload namespace.
const DefaultLocalQueue = "user-queue"

// kinds is what a preset or overlay may render, in apply order.
var kinds = v1alpha1.WorkerKinds()

var kindOrder = func() map[schema.GroupKind]int {
	m := map[schema.GroupKind]int{}
	for i, k := range kinds {
		m[k.GroupKind()] = i
	}
	return m
}()

// poolQueue is the LocalQueue named after the cluster's dispatch pool, when the fleet
// dispatches and the preset has none of that name: MultiKueue creates a job on the
// worker under the name of the hub's LocalQueue it was submitted to, which is the
// pool's. It feeds the ClusterQueue of the preset's first LocalQueue.
func poolQueue(f *fleet.Fleet, c *fleet.Cluster, queues []*unstructured.Unstructured) *unstructured.Unstructured {
	if !f.Spec.Spec.DispatchEnabled() || len(queues) == 0 {
		return nil
	}
	pool, err := fleet.PoolOf(&f.Spec.Spec, c.Name, c.Object.Spec.Residency)
	if err != nil || slices.ContainsFunc(queues, func(q *unstructured.Unstructured) bool { return q.GetName() == pool }) {
		return nil
	}
	cq, _, _ := unstructured.NestedString(queues[0].Object, "spec", "clusterQueue")
	return localQueue(pool, cq)
}

// localQueue is a LocalQueue without namespace that feeds clusterQueue. It and
// namespace are written as the maps that the setters of unstructured would make, without
// the copies these make of every value they set.
func localQueue(name, clusterQueue string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": localQueueAPIVersion,
		"kind":       "LocalQueue",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{"clusterQueue": clusterQueue},
	}}
}

var (
	localQueueAPIVersion = kueue.GroupVersion.String()
	namespaceAPIVersion  = corev1.SchemeGroupVersion.String()
)

// namespace is a workload namespace. Workload namespaces belong to the people who run
// jobs in them once they exist: created when missing, never updated, never pruned.
func namespace(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": namespaceAPIVersion,
		"kind":       "Namespace",
		"metadata": map[string]any{
			"name": name,
			"annotations": map[string]any{
				v1alpha1.ApplyAnnotation: v1alpha1.ApplyIfNotPresent,
				v1alpha1.PruneAnnotation: v1alpha1.PruneDisabled,
			},
		},
	}}
}

// transform applies what flotilla adds to kustomize's output. objs is owned by the
// caller and modified in place.
func transform(f *fleet.Fleet, c *fleet.Cluster, hasOverlay bool, identity string, objs []map[string]any) ([]*unstructured.Unstructured, fleet.ErrorList) {
	spec := c.Object.Spec
	origin := path.Join(fleet.PresetsDir, spec.Preset, fleet.KustomizationFile)
	if hasOverlay {
		origin = path.Join(c.Dir, fleet.KustomizationFile)
	}
	var errs fleet.ErrorList
	fail := func(file, format string, args ...any) {
		errs = append(errs, fleet.Error{File: file, Cluster: c.Name, Message: fmt.Sprintf(format, args...)})
	}

	var out, queues, clusterQueues []*unstructured.Unstructured
	for _, obj := range objs {
		u := &unstructured.Unstructured{Object: obj}
		gvk := u.GroupVersionKind()
		// Only an object that fails needs describing.
		desc := func() string { return fmt.Sprintf("%s %q", gvk.Kind, u.GetName()) }
		i, known := kindOrder[gvk.GroupKind()]
		switch {
		case !known || gvk.Kind == "Namespace":
			fail(origin, "%s (%s) cannot be rendered for a worker: presets and overlays hold Kueue objects and PriorityClasses only", desc(), gvk.GroupVersion())
			continue
		case gvk.Version != kinds[i].Version:
			fail(origin, "%s uses %s; Kueue v0.17 objects are written as %s", desc(), gvk.GroupVersion(), kinds[i].GroupVersion())
			continue
		case u.GetNamespace() != "":
			fail(origin, "%s sets metadata.namespace %q; flotilla places LocalQueues in the fleet's workload namespaces and everything else is cluster-scoped", desc(), u.GetNamespace())
			continue
		}
		switch gvk.Kind {
		case "LocalQueue":
			// Only ever copied: Render hands over LocalQueues of its caches (deepCopy).
			queues = append(queues, u)
			continue
		case "ClusterQueue":
			clusterQueues = append(clusterQueues, u)
			if spec.Cordoned {
				// Hold keeps admitted workloads running and admits nothing new.
				if err := unstructured.SetNestedField(u.Object, string(kueue.Hold), "spec", "stopPolicy"); err != nil {
					fail(origin, "%s: %v", desc(), err)
				}
			}
		}
		out = append(out, u)
	}

	clusterFile := path.Join(c.Dir, fleet.ClusterFile)
	for _, res := range slices.Sorted(maps.Keys(spec.Quota)) {
		q := spec.Quota[res]
		if n := setQuota(clusterQueues, string(res), q.String()); n == 0 {
			fail(clusterFile, "quota for %s: no ClusterQueue of preset %q covers %s; quota can only be set for a resource in a ClusterQueue's coveredResources", res, spec.Preset, res)
		}
	}

	// The LocalQueues from objs may be a cache's; those made here are the render's own.
	fromObjs := len(queues)
	if len(queues) == 0 {
		switch len(clusterQueues) {
		case 0:
			fail(origin, "preset %q renders no ClusterQueue; jobs would have nowhere to go", spec.Preset)
		case 1:
			queues = append(queues, localQueue(DefaultLocalQueue, clusterQueues[0].GetName()))
		default:
			fail(origin, "preset %q has several ClusterQueues and no LocalQueue; add a LocalQueue without namespace for each queue users submit to", spec.Preset)
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	if lq := poolQueue(f, c, queues); lq != nil {
		queues = append(queues, lq)
	}

	out = slices.Grow(out, len(f.Spec.Spec.WorkloadNamespaces)*(1+len(queues)))
	for i, ns := range f.Spec.Spec.WorkloadNamespaces {
		out = append(out, namespace(ns))
		// The last namespace takes the LocalQueues made here instead of a copy.
		last := i == len(f.Spec.Spec.WorkloadNamespaces)-1
		for j, q := range queues {
			lq := q
			if !last || j < fromObjs {
				lq = q.DeepCopy()
			}
			lq.SetNamespace(ns)
			out = append(out, lq)
		}
	}

	// The values are made interface values once, not once for every object.
	labels := map[string]any{}
	for k, v := range Labels(identity) {
		labels[k] = v
	}
	for _, u := range out {
		addLabels(u.Object, labels)
	}
	slices.SortFunc(out, func(a, b *unstructured.Unstructured) int {
		return cmp.Or(
			cmp.Compare(kindOrder[a.GroupVersionKind().GroupKind()], kindOrder[b.GroupVersionKind().GroupKind()]),
			strings.Compare(a.GetNamespace(), b.GetNamespace()),
			strings.Compare(a.GetName(), b.GetName()))
	})
	for i := 1; i < len(out); i++ {
		a, b := out[i-1], out[i]
		if a.GroupVersionKind() == b.GroupVersionKind() && a.GetNamespace() == b.GetNamespace() && a.GetName() == b.GetName() {
			return nil, fleet.ErrorList{{File: origin, Cluster: c.Name, Message: fmt.Sprintf("%s %q is rendered twice", a.GetKind(), a.GetName())}}
		}
	}
	return out, nil
}

// addLabels adds labels to the object's own, in place: the object is the caller's copy,
// and GetLabels and SetLabels would copy the labels three times for every object of
// every cluster. The outcome is theirs: labels that are not all strings are replaced, and
// metadata that is not a mapping is left alone.
func addLabels(obj map[string]any, labels map[string]any) {
	v, ok := obj["metadata"]
	if !ok {
		v = map[string]any{}
		obj["metadata"] = v
	}
	meta, ok := v.(map[string]any)
	if !ok {
		return
	}
	l, ok := meta["labels"].(map[string]any)
	for _, v := range l {
		if _, isString := v.(string); !isString {
			ok = false
			break
		}
	}
	if !ok {
		l = make(map[string]any, len(labels))
		meta["labels"] = l
	}
	for k, v := range labels {
		l[k] = v
	}
}

// setQuota sets the nominal quota of resource in every flavor of every ClusterQueue
// resource group that covers it, and returns how many groups it found. The objects are
// the caller's own copies, so they are changed where they are: copying resourceGroups
// in and out for every resource of every cluster was most of what a render allocated.
// What is odd in them is kept or replaced exactly as unstructured's NestedSlice and
// NestedStringSlice would have: a group's flavors or a flavor's resources that are no
// list become one.
func setQuota(clusterQueues []*unstructured.Unstructured, resource, quantity string) int {
	found := 0
	for _, cq := range clusterQueues {
		v, _, _ := unstructured.NestedFieldNoCopy(cq.Object, "spec", "resourceGroups")
		groups, _ := v.([]any)
		for _, g := range groups {
			group, ok := g.(map[string]any)
			if !ok || !covers(group["coveredResources"], resource) {
				continue
			}
			found++
			flavors, _ := group["flavors"].([]any)
			for _, fl := range flavors {
				flavor, ok := fl.(map[string]any)
				if !ok {
					continue
				}
				resources, _ := flavor["resources"].([]any)
				set := false
				for _, r := range resources {
					if rm, ok := r.(map[string]any); ok && rm["name"] == resource {
						rm["nominalQuota"] = quantity
						set = true
					}
				}
				if !set {
					resources = append(resources, map[string]any{"name": resource, "nominalQuota": quantity})
				}
				flavor["resources"] = resources
			}
			group["flavors"] = flavors
		}
	}
	return found
}

// covers reports whether coveredResources, a list of strings, names resource. A list
// with anything but strings in it covers nothing.
func covers(coveredResources any, resource string) bool {
	list, _ := coveredResources.([]any)
	hit := false
	for _, r := range list {
		s, ok := r.(string)
		if !ok {
			return false
		}
		hit = hit || s == resource
	}
	return hit
}

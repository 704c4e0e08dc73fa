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
	lq := &unstructured.Unstructured{}
	lq.SetGroupVersionKind(kueue.GroupVersion.WithKind("LocalQueue"))
	lq.SetName(pool)
	_ = unstructured.SetNestedField(lq.Object, cq, "spec", "clusterQueue")
	return lq
}

// transform applies what flotilla adds to kustomize's output. objs is owned by the
// caller and modified in place.
func transform(f *fleet.Fleet, c *fleet.Cluster, identity string, objs []map[string]any) ([]*unstructured.Unstructured, fleet.ErrorList) {
	spec := c.Object.Spec
	origin := path.Join(fleet.PresetsDir, spec.Preset, fleet.KustomizationFile)
	if c.Overlay() != nil {
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
		desc := fmt.Sprintf("%s %q", gvk.Kind, u.GetName())
		i, known := kindOrder[gvk.GroupKind()]
		switch {
		case !known || gvk.Kind == "Namespace":
			fail(origin, "%s (%s) cannot be rendered for a worker: presets and overlays hold Kueue objects and PriorityClasses only", desc, gvk.GroupVersion())
			continue
		case gvk.Version != kinds[i].Version:
			fail(origin, "%s uses %s; Kueue v0.17 objects are written as %s", desc, gvk.GroupVersion(), kinds[i].GroupVersion())
			continue
		case u.GetNamespace() != "":
			fail(origin, "%s sets metadata.namespace %q; flotilla places LocalQueues in the fleet's workload namespaces and everything else is cluster-scoped", desc, u.GetNamespace())
			continue
		}
		switch gvk.Kind {
		case "LocalQueue":
			queues = append(queues, u)
			continue
		case "ClusterQueue":
			clusterQueues = append(clusterQueues, u)
			if spec.Cordoned {
				// Hold keeps admitted workloads running and admits nothing new.
				if err := unstructured.SetNestedField(u.Object, string(kueue.Hold), "spec", "stopPolicy"); err != nil {
					fail(origin, "%s: %v", desc, err)
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

	if len(queues) == 0 {
		switch len(clusterQueues) {
		case 0:
			fail(origin, "preset %q renders no ClusterQueue; jobs would have nowhere to go", spec.Preset)
		case 1:
			lq := &unstructured.Unstructured{}
			lq.SetGroupVersionKind(kueue.GroupVersion.WithKind("LocalQueue"))
			lq.SetName(DefaultLocalQueue)
			_ = unstructured.SetNestedField(lq.Object, clusterQueues[0].GetName(), "spec", "clusterQueue")
			queues = append(queues, lq)
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

	for _, ns := range f.Spec.Spec.WorkloadNamespaces {
		n := &unstructured.Unstructured{}
		n.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
		n.SetName(ns)
		// Workload namespaces belong to the people who run jobs in them once they exist:
		// created when missing, never updated, never pruned.
		n.SetAnnotations(map[string]string{
			v1alpha1.ApplyAnnotation: v1alpha1.ApplyIfNotPresent,
			v1alpha1.PruneAnnotation: v1alpha1.PruneDisabled,
		})
		out = append(out, n)
		for _, q := range queues {
			lq := q.DeepCopy()
			lq.SetNamespace(ns)
			out = append(out, lq)
		}
	}

	labels := Labels(identity)
	for _, u := range out {
		l := u.GetLabels()
		if l == nil {
			l = map[string]string{}
		}
		maps.Copy(l, labels)
		u.SetLabels(l)
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

// setQuota sets the nominal quota of resource in every flavor of every ClusterQueue
// resource group that covers it, and returns how many groups it found.
func setQuota(clusterQueues []*unstructured.Unstructured, resource, quantity string) int {
	found := 0
	for _, cq := range clusterQueues {
		groups, _, _ := unstructured.NestedSlice(cq.Object, "spec", "resourceGroups")
		for gi, g := range groups {
			group, ok := g.(map[string]any)
			if !ok {
				continue
			}
			covered, _, _ := unstructured.NestedStringSlice(group, "coveredResources")
			if !slices.Contains(covered, resource) {
				continue
			}
			found++
			flavors, _, _ := unstructured.NestedSlice(group, "flavors")
			for fi, fl := range flavors {
				flavor, ok := fl.(map[string]any)
				if !ok {
					continue
				}
				resources, _, _ := unstructured.NestedSlice(flavor, "resources")
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
				flavors[fi] = flavor
			}
			group["flavors"] = flavors
			groups[gi] = group
		}
		if len(groups) > 0 {
			_ = unstructured.SetNestedSlice(cq.Object, groups, "spec", "resourceGroups")
		}
	}
	return found
}

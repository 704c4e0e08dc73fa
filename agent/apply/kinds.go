package apply

import (
	"cmp"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

var namespaceKind = corev1.SchemeGroupVersion.WithKind("Namespace").GroupKind()

// pruneKindList holds the kinds the agent may ever apply besides namespaces (the first of
// WorkerKinds), in apply order: what the renderer lets a preset or overlay render. They are listed for pruning on
// every Apply, also when the desired state no longer holds any object of a kind, so that
// the last one is pruned too. Kinds whose CRD is not installed are left out silently.
// RBAC.md grants exactly these.
var pruneKindList = v1alpha1.WorkerKinds()[1:]

// PruneKinds returns the kinds the agent may ever apply besides namespaces, in apply
// order, which it lists for pruning on every Apply.
func PruneKinds() []schema.GroupVersionKind { return slices.Clone(pruneKindList) }

// rank is a kind's place in the apply order: namespaces first, then pruneKindList, then
// every other kind.
func rank(gk schema.GroupKind) int {
	if gk == namespaceKind {
		return 0
	}
	if i := slices.IndexFunc(pruneKindList, func(k schema.GroupVersionKind) bool { return k.GroupKind() == gk }); i >= 0 {
		return 1 + i
	}
	return 1 + len(pruneKindList)
}

// sortForApply orders objects for applying; within a kind the hub's order is kept.
func sortForApply(objs []*unstructured.Unstructured) {
	slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int {
		return cmp.Compare(rank(a.GroupVersionKind().GroupKind()), rank(b.GroupVersionKind().GroupKind()))
	})
}

// pruneKinds returns the kinds to list for pruning, in delete order (the reverse of the
// apply order): pruneKindList and the kinds of the desired state, one version per kind, the
// desired state's when it has one. Namespaces are never pruned, so never listed.
func pruneKinds(desired []*unstructured.Unstructured, extra []schema.GroupVersionKind) []schema.GroupVersionKind {
	version := map[schema.GroupKind]string{}
	for _, k := range append(slices.Clone(pruneKindList), extra...) {
		version[k.GroupKind()] = k.Version
	}
	for _, u := range desired {
		gvk := u.GroupVersionKind()
		version[gvk.GroupKind()] = gvk.Version
	}
	delete(version, namespaceKind)
	out := make([]schema.GroupVersionKind, 0, len(version))
	for gk, v := range version {
		out = append(out, gk.WithVersion(v))
	}
	slices.SortFunc(out, func(a, b schema.GroupVersionKind) int {
		return cmp.Or(
			cmp.Compare(rank(b.GroupKind()), rank(a.GroupKind())),
			cmp.Compare(a.Group, b.Group),
			cmp.Compare(a.Kind, b.Kind))
	})
	return out
}

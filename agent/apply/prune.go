package apply

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// deleteAttempts bounds how often one object is read again and deleted when it changed
// between listing and deleting, e.g. because its controller updated its status.
const deleteAttempts = 3

// prune deletes the objects of kinds that this identity owns and keep does not name.
// Kinds the API server does not serve are skipped; a kind that cannot be listed is an
// error, and the other kinds are still pruned.
func (a *Applier) prune(ctx context.Context, kinds []schema.GroupVersionKind, keep map[objectKey]bool, report func(protocol.ObjectResult)) error {
	owned, listErrs := a.listAllOwned(ctx, kinds)
	var errs []error
	for i, gvk := range kinds {
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, fmt.Errorf("pruning stopped before %s: %w", gvk.Kind, err))...)
		}
		items, err := owned[i], listErrs[i]
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, item := range items {
			if keep[keyOf(gvk, item.GetNamespace(), item.GetName())] {
				continue
			}
			report(a.pruneOne(ctx, gvk, item))
		}
	}
	return errors.Join(errs...)
}

// listAllOwned lists the objects of every kind that this identity owns, by kind. The lists
// go out together: an API server answers the first list of a custom resource only once
// its watch cache is ready (a second, on a fresh one), and waiting for each kind in turn
// would add those seconds up.
func (a *Applier) listAllOwned(ctx context.Context, kinds []schema.GroupVersionKind) ([][]metav1.PartialObjectMetadata, []error) {
	owned := make([][]metav1.PartialObjectMetadata, len(kinds))
	errs := make([]error, len(kinds))
	var wg sync.WaitGroup
	for i, gvk := range kinds {
		wg.Go(func() { owned[i], errs[i] = a.listOwned(ctx, gvk) })
	}
	wg.Wait()
	return owned, errs
}

// listOwned lists the metadata of the objects of gvk that this identity owns, sorted by
// namespace and name. A kind the API server does not serve has none.
func (a *Applier) listOwned(ctx context.Context, gvk schema.GroupVersionKind) ([]metav1.PartialObjectMetadata, error) {
	if _, err := a.client.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
		if meta.IsNoMatchError(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("pruning %s: %w", gvk.Kind, err)
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	opts := []client.ListOption{client.MatchingLabels(a.ownerLabels())}
	if ns, ok := a.pruneIn[gvk.GroupKind()]; ok {
		opts = append(opts, client.InNamespace(ns))
	}
	err := a.client.List(ctx, list, opts...)
	switch {
	case meta.IsNoMatchError(err), apierrors.IsNotFound(err):
		// The CRD went away after the RESTMapper saw it.
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("pruning %s: listing the objects of %s: %w", gvk.Kind, a.identity, err)
	}
	slices.SortFunc(list.Items, func(x, y metav1.PartialObjectMetadata) int {
		return cmp.Or(cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.Name, y.Name))
	})
	return list.Items, nil
}

// pruneOne deletes one owned object that is no longer desired, unless it must be kept.
// The delete is conditional on the UID and resourceVersion that were checked, so that
// an object that lost its label or was replaced in between is not deleted.
func (a *Applier) pruneOne(ctx context.Context, gvk schema.GroupVersionKind, item metav1.PartialObjectMetadata) protocol.ObjectResult {
	res := protocol.ObjectResult{
		APIVersion: gvk.GroupVersion().String(),
		Kind:       gvk.Kind,
		Namespace:  item.Namespace,
		Name:       item.Name,
		UID:        string(item.UID),
	}
	name := gvk.Kind + "/" + item.Name
	if item.Namespace != "" {
		name = gvk.Kind + "/" + item.Namespace + "/" + item.Name
	}
	obj := &item
	obj.SetGroupVersionKind(gvk)
	for attempt := 1; ; attempt++ {
		// What Owned plans is what is done: the same verdict, on what was read last.
		if v := a.verdict(gvk, *obj); v.Action == protocol.ActionSkipped || v.Message != "" {
			if v.Action == protocol.ActionSkipped {
				v.Message = "no longer desired; " + v.Message
			}
			return v
		}
		err := a.client.Delete(ctx, obj,
			client.Preconditions{UID: &obj.UID, ResourceVersion: &obj.ResourceVersion},
			client.PropagationPolicy(metav1.DeletePropagationBackground))
		switch {
		case err == nil, apierrors.IsNotFound(err):
			res.Action = protocol.ActionPruned
			return res
		case !apierrors.IsConflict(err) || attempt == deleteAttempts:
			res.Action = protocol.ActionFailed
			res.Message = fmt.Sprintf("%s: pruning: %v", name, err)
			return res
		}
		fresh := &metav1.PartialObjectMetadata{}
		fresh.SetGroupVersionKind(gvk)
		err = a.client.Get(ctx, client.ObjectKeyFromObject(obj), fresh)
		switch {
		case apierrors.IsNotFound(err):
			res.Action = protocol.ActionPruned
			return res
		case err != nil:
			res.Action = protocol.ActionFailed
			res.Message = fmt.Sprintf("%s: pruning: reading it again after a conflict: %v", name, err)
			return res
		case fresh.UID != item.UID:
			// Deleted and created again under the same name by someone else: not the
			// object that was listed.
			res.Action = protocol.ActionSkipped
			res.Message = fmt.Sprintf("replaced (now uid %s) while pruning; left for the next apply", fresh.UID)
			return res
		}
		obj = fresh
	}
}

func (a *Applier) ownerLabels() map[string]string {
	return map[string]string{
		v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue,
		a.ownerLabel:            a.identity,
	}
}

// owns reports whether obj carries both ownership labels of this identity.
func (a *Applier) owns(obj metav1.Object) bool {
	l := obj.GetLabels()
	return l[v1alpha1.ManagedByLabel] == v1alpha1.ManagedByValue && l[a.ownerLabel] == a.identity
}

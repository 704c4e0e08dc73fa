package apply

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// Owned lists what this identity owns on the worker, as a decommission (an Apply of a
// DesiredState with Decommission set) would find it, in the order it would delete it,
// and changes nothing: a plan that an operator reads before the decommission runs.
//
// Each result says what the decommission would do: ActionPruned for an object it would
// delete (Message says when a deletion is already pending on finalizers), ActionSkipped
// for one it would keep, and why. Namespaces are never pruned, so never listed. A kind
// the API server does not serve has nothing; a kind that cannot be listed is an error,
// and the results then hold the other kinds.
func (a *Applier) Owned(ctx context.Context) ([]protocol.ObjectResult, error) {
	// Under the apply lock: a listing taken in the middle of an apply would show a
	// state that is neither the one before nor the one after it.
	a.mu.Lock()
	defer a.mu.Unlock()

	kinds := pruneKinds(nil, a.extraKinds)
	owned, errs := a.listAllOwned(ctx, kinds)
	out := []protocol.ObjectResult{}
	for i, gvk := range kinds {
		for _, item := range owned[i] {
			out = append(out, a.verdict(gvk, item))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("listing what %s owns: %w", a.identity, err)
	}
	return out, nil
}

// verdict is what pruning would do to an owned object that is no longer desired, as
// pruneOne decides it before deleting.
func (a *Applier) verdict(gvk schema.GroupVersionKind, item metav1.PartialObjectMetadata) protocol.ObjectResult {
	res := protocol.ObjectResult{
		APIVersion: gvk.GroupVersion().String(),
		Kind:       gvk.Kind,
		Namespace:  item.Namespace,
		Name:       item.Name,
		UID:        string(item.UID),
		Action:     protocol.ActionPruned,
	}
	switch {
	case !a.owns(&item):
		// Listed by the owner labels, so only a label selector that differs from owns
		// gets here; pruning would not delete it either.
		res.Action = protocol.ActionSkipped
		res.Message = fmt.Sprintf("not labeled %s=%s; not pruned", a.ownerLabel, a.identity)
	case item.GetAnnotations()[v1alpha1.PruneAnnotation] == v1alpha1.PruneDisabled:
		res.Action = protocol.ActionSkipped
		res.Message = fmt.Sprintf("kept because of %s: %s", v1alpha1.PruneAnnotation, v1alpha1.PruneDisabled)
	case item.GetDeletionTimestamp() != nil:
		res.Message = fmt.Sprintf("deletion pending on finalizers %v", item.GetFinalizers())
	}
	return res
}

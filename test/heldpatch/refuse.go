package heldpatch

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// Refuse is c with the status patches for which refuse returns an error answered with
// that error instead of being sent: a hub cluster that turns writes away, as one that
// restarts or is overloaded does. refuse sees the object as the patch would leave it.
func Refuse(c client.WithWatch, refuse func(obj client.Object) error) client.WithWatch {
	return interceptor.NewClient(c, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if err := refuse(obj); err != nil {
				return err
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
}

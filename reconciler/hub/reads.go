package hub

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// Where the hub reads its WorkerClusters, and which writes it leaves out.
//
// A sync lists the WorkerClusters from Options.Reader, the informer cache
// cmd/flotilla-hub starts, so listing them costs the hub cluster nothing however large
// the fleet. A cluster's reconcile reads its WorkerCluster through the status writer
// (conditions.Writer.Get), which knows every write of it the hub made, and so tells a
// cache that caught up from one still behind the hub's own last write: a copy behind
// it would have the hub skip the write that a revert needs. A WorkerCluster whose
// labels, annotations and spec are already what Git says is not written at all; every
// write the hub makes is handed to the writer (Observe), and a write that conflicts is
// retried on the API server's copy.

// writeRetries bounds the attempts at one WorkerCluster write that conflicts.
const writeRetries = 5

// sameMeta reports whether a write of want over have would change nothing the hub
// writes.
func sameMeta(have, want *v1alpha1.WorkerCluster) bool {
	return equality.Semantic.DeepEqual(have.Labels, want.Labels) &&
		equality.Semantic.DeepEqual(have.Annotations, want.Annotations) &&
		equality.Semantic.DeepEqual(have.Spec, want.Spec)
}

// current is the WorkerCluster name as last stored; nil when there is none.
func (s *Source) current(ctx context.Context, name string) (*v1alpha1.WorkerCluster, error) {
	wc, err := s.hub.opts.Status.Get(ctx, client.ObjectKey{Namespace: s.opts.Namespace, Name: name})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading WorkerCluster %s/%s: %w", s.opts.Namespace, name, err)
	}
	return wc, nil
}

// readLive reads the WorkerCluster name from the API server; nil when there is none.
func (s *Source) readLive(ctx context.Context, name string) (*v1alpha1.WorkerCluster, error) {
	key := client.ObjectKey{Namespace: s.opts.Namespace, Name: name}
	wc := new(v1alpha1.WorkerCluster)
	err := s.hub.opts.Client.Get(ctx, key, wc)
	switch {
	case apierrors.IsNotFound(err):
		s.hub.opts.Status.Forget(key)
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading WorkerCluster %s: %w", key, err)
	}
	s.hub.opts.Status.Observe(wc)
	return wc, nil
}

// writeWorkerCluster makes the WorkerCluster name what set makes of it, starting from
// wc (current, nil when there is none): created, updated when set changed its labels,
// annotations or spec, and otherwise not written at all. It returns the WorkerCluster
// as stored.
func (s *Source) writeWorkerCluster(ctx context.Context, name string, wc *v1alpha1.WorkerCluster, set func(*v1alpha1.WorkerCluster)) (*v1alpha1.WorkerCluster, error) {
	for attempt := 1; ; attempt++ {
		var want *v1alpha1.WorkerCluster
		var err error
		switch {
		case wc == nil:
			want = &v1alpha1.WorkerCluster{ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: name}}
			set(want)
			err = s.hub.opts.Client.Create(ctx, want)
		default:
			want = wc.DeepCopy()
			set(want)
			if sameMeta(wc, want) {
				return want, nil
			}
			// The status goes along unchanged: the status subresource ignores it.
			err = s.hub.opts.Client.Update(ctx, want)
		}
		if err == nil {
			s.hub.opts.Status.Observe(want)
			return want, nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) || attempt == writeRetries {
			return nil, fmt.Errorf("writing WorkerCluster %s/%s: %w", s.opts.Namespace, name, err)
		}
		// The copy was behind (the agents' reports write the status meanwhile).
		if wc, err = s.readLive(ctx, name); err != nil {
			return nil, err
		}
	}
}

// patchWorkerCluster patches wc, as the caller changed it from before, and hands what
// the API server stored to the status writer.
func (s *Source) patchWorkerCluster(ctx context.Context, wc *v1alpha1.WorkerCluster, patch client.Patch) error {
	if err := s.hub.opts.Client.Patch(ctx, wc, patch); err != nil {
		return fmt.Errorf("patching WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	s.hub.opts.Status.Observe(wc)
	return nil
}

package conditions

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// Writer writes WorkerClusters' status: it records facts, derives the conditions and
// patches the status subresource, and tells those who asked which statuses changed.
// It is safe for concurrent use.
type Writer struct {
	client client.Client
	now    func() time.Time

	mu      sync.Mutex
	changed []func(client.ObjectKey)
}

// WriterOptions configure a Writer.
type WriterOptions struct {
	// Now is the time conditions are judged at: a credential's lifetime runs out by it.
	// Defaults to time.Now.
	Now func() time.Time
}

// NewWriter writes through c.
func NewWriter(c client.Client) *Writer { return NewWriterWith(c, WriterOptions{}) }

// NewWriterWith writes through c with opts.
func NewWriterWith(c client.Client, opts WriterOptions) *Writer {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Writer{client: c, now: opts.Now}
}

// OnChange has f called, synchronously, with the key of each WorkerCluster whose status
// the Writer changed: f should hand the work on rather than do it.
func (w *Writer) OnChange(f func(client.ObjectKey)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.changed = append(w.changed, f)
}

// Record records facts on the WorkerCluster's current status and derives the rest,
// retrying on conflicts with other writes of the WorkerCluster; with no facts it only
// derives, for a spec that moved on or a credential whose lifetime moved into its last
// third or past its end. Nothing is written when nothing changed. It returns the
// WorkerCluster as stored afterwards.
func (w *Writer) Record(ctx context.Context, key client.ObjectKey, facts ...Fact) (*v1alpha1.WorkerCluster, error) {
	var wc *v1alpha1.WorkerCluster
	changed := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		wc = new(v1alpha1.WorkerCluster)
		if err := w.client.Get(ctx, key, wc); err != nil {
			return err
		}
		var err error
		changed, err = w.write(ctx, wc, facts)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("recording the status of WorkerCluster %s: %w", key, err)
	}
	if changed {
		w.notify(key)
	}
	return wc, nil
}

// Claim records facts on wc exactly as the caller read it, and fails with a conflict if
// the stored WorkerCluster has moved on: a redemption claims a one-shot token this way,
// so that of two racing only one succeeds. On success wc is the stored WorkerCluster;
// on failure it is left as it was.
func (w *Writer) Claim(ctx context.Context, wc *v1alpha1.WorkerCluster, facts ...Fact) error {
	next := wc.DeepCopy()
	changed, err := w.write(ctx, next, facts)
	if err != nil {
		return err
	}
	*wc = *next
	if changed {
		w.notify(client.ObjectKeyFromObject(wc))
	}
	return nil
}

// write records facts on wc, derives, and patches the status when it changed, with an
// optimistic lock on wc's resourceVersion.
func (w *Writer) write(ctx context.Context, wc *v1alpha1.WorkerCluster, facts []Fact) (bool, error) {
	before := wc.DeepCopy()
	for _, f := range facts {
		f.record(wc)
	}
	Derive(wc, w.now())
	// Resync acknowledgements and inventories mostly repeat what is stored; with
	// thousands of agents, writing them anyway would be a steady load for nothing.
	if equality.Semantic.DeepEqual(before.Status, wc.Status) {
		return false, nil
	}
	patch := client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
	return true, w.client.Status().Patch(ctx, wc, patch)
}

func (w *Writer) notify(key client.ObjectKey) {
	w.mu.Lock()
	fs := w.changed
	w.mu.Unlock()
	for _, f := range fs {
		f(key)
	}
}

package scale

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
)

// laggingCache is an informer cache that stopped catching up: it answers with the
// WorkerClusters as they were when last copied in, as a real one does for the moment
// between a write and its watch event.
type laggingCache struct {
	mu   sync.Mutex
	objs map[client.ObjectKey]*v1alpha1.WorkerCluster
}

func (l *laggingCache) catchUp(t *testing.T, key client.ObjectKey) {
	t.Helper()
	wc := new(v1alpha1.WorkerCluster)
	if err := admin().Get(t.Context(), key, wc); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.objs[key] = wc
}

func (l *laggingCache) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	wc, ok := l.objs[key]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "workerclusters"}, key.Name)
	}
	wc.DeepCopyInto(obj.(*v1alpha1.WorkerCluster))
	return nil
}

func (l *laggingCache) List(context.Context, client.ObjectList, ...client.ListOption) error {
	panic("the status writer lists nothing")
}

// aWorkerClusterOfItsOwn creates a WorkerCluster in a namespace of its own.
func aWorkerClusterOfItsOwn(t *testing.T) client.ObjectKey {
	t.Helper()
	ns := fmt.Sprintf("tenant-lagging-cache-%d", worlds.Add(1))
	if err := admin().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	wc := &v1alpha1.WorkerCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpu-a"},
		Spec: v1alpha1.WorkerClusterSpec{Region: "us-east1", Residency: "us", Preset: "gpu"}}
	if err := admin().Create(t.Context(), wc); err != nil {
		t.Fatal(err)
	}
	return client.ObjectKeyFromObject(wc)
}

// The status writer reads the hub's cache, which may not yet show the writer's own last
// write. A record that puts back what that stale copy shows must still be written: the
// API server holds something else by then. And a record that changes nothing costs no
// request at all once the cache caught up.
func TestARevertIsWrittenThoughTheCacheShowsItAlready(t *testing.T) {
	ctx := t.Context()
	key := aWorkerClusterOfItsOwn(t)
	counter := &requestCounter{}
	cfg := countingConfig(counter)
	c, err := client.New(cfg, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	cache := &laggingCache{objs: map[client.ObjectKey]*v1alpha1.WorkerCluster{}}
	w := conditions.NewWriterWith(c, conditions.WriterOptions{Reader: cache})
	record := func(hash string) {
		t.Helper()
		if _, err := w.Record(ctx, key, conditions.Desired{Hash: hash}); err != nil {
			t.Fatal(err)
		}
	}
	stored := func() string {
		t.Helper()
		var got v1alpha1.WorkerCluster
		if err := admin().Get(ctx, key, &got); err != nil {
			t.Fatal(err)
		}
		return got.Status.DesiredHash
	}

	record("sha256:a")
	cache.catchUp(t, key)
	record("sha256:b")
	// The cache still shows a; the API server holds b.
	record("sha256:a")
	if got := stored(); got != "sha256:a" {
		t.Fatalf("the desired hash stored is %s after a revert to sha256:a: the writer took the stale cache's word that nothing changed", got)
	}

	cache.catchUp(t, key)
	before := counter.snapshot()
	for range 3 {
		record("sha256:a")
	}
	if got := counter.snapshot().minus(before); got.total() != 0 {
		t.Fatalf("records that change nothing, with the cache caught up, made %s", got)
	}
}

// A record tells whoever waits on the status as its write leaves. A View in answer
// can find the cache showing that write already, before the API server's answer reached
// the writer: it reads the cache, with the record's facts on top, and not the API
// server, which in a fleet-wide change would be one read for each cluster.
func TestAViewWhileItsRecordIsAnsweredReadsTheCache(t *testing.T) {
	ctx := t.Context()
	key := aWorkerClusterOfItsOwn(t)
	counter := &requestCounter{}
	plain, err := client.NewWithWatch(countingConfig(counter), client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	cache := &laggingCache{objs: map[client.ObjectKey]*v1alpha1.WorkerCluster{}}
	var w *conditions.Writer
	var answering atomic.Bool
	var view *v1alpha1.WorkerCluster
	var made requests
	c := interceptor.NewClient(plain, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if err := c.SubResource(sub).Patch(ctx, obj, patch, opts...); err != nil || !answering.Load() {
				return err
			}
			// The watch event is here before the answer reaches the writer.
			cache.catchUp(t, key)
			before := counter.snapshot()
			var err error
			if view, err = w.View(ctx, key); err != nil {
				t.Error(err)
			}
			made = counter.snapshot().minus(before)
			return nil
		}})
	w = conditions.NewWriterWith(c, conditions.WriterOptions{Reader: cache})

	if _, err := w.Record(ctx, key, conditions.Desired{Hash: "sha256:a"}); err != nil {
		t.Fatal(err)
	}
	cache.catchUp(t, key)
	if _, err := w.View(ctx, key); err != nil {
		t.Fatal(err)
	}
	answering.Store(true)
	if _, err := w.Record(ctx, key, conditions.Desired{Hash: "sha256:b"}); err != nil {
		t.Fatal(err)
	}
	if view == nil || view.Status.DesiredHash != "sha256:b" {
		t.Fatalf("the View during the record shows %+v, want the record's desired hash", view)
	}
	if made.total() != 0 {
		t.Fatalf("the View during the record made %s", made)
	}
}

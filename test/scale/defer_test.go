package scale

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/test/heldpatch"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// The hub defers the desired state it sends a connected agent: the agent's
// acknowledgement records it in the same write, and without one it is written on its
// own once the wait is over. Meanwhile the writer shows it to its own readers, and a
// hub that stopped takes its deferred facts with it.
func TestDeferredFactsGoWithTheNextWriteOrOnTheirOwn(t *testing.T) {
	ctx := t.Context()
	ns := fmt.Sprintf("tenant-deferred-%d", worlds.Add(1))
	if err := admin().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	counter := &requestCounter{}
	c, err := client.New(countingConfig(counter), client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	w := conditions.NewWriter(c)
	newCluster := func(t *testing.T, name string) client.ObjectKey {
		t.Helper()
		wc := &v1alpha1.WorkerCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.WorkerClusterSpec{Region: "us-east1", Residency: "us", Preset: "gpu"}}
		if err := admin().Create(ctx, wc); err != nil {
			t.Fatal(err)
		}
		return client.ObjectKeyFromObject(wc)
	}
	stored := func(t *testing.T, key client.ObjectKey) *v1alpha1.WorkerCluster {
		t.Helper()
		var got v1alpha1.WorkerCluster
		if err := admin().Get(ctx, key, &got); err != nil {
			t.Fatal(err)
		}
		return &got
	}
	sent := []conditions.Fact{conditions.Desired{Hash: "sha256:b"}, conditions.Sourced{Commit: "c0ffee", InputsDigest: "d1"}}

	t.Run("the acknowledgement writes them in one patch", func(t *testing.T) {
		key := newCluster(t, "acknowledged")
		if _, err := w.Record(ctx, key, conditions.Desired{Hash: "sha256:a"}); err != nil {
			t.Fatal(err)
		}
		before := counter.snapshot()
		changed, err := w.Defer(ctx, key, time.Hour, sent...)
		if err != nil || !changed {
			t.Fatalf("Defer = %v, %v; want a change", changed, err)
		}
		if got := stored(t, key); got.Status.DesiredHash != "sha256:a" || got.Status.Source != nil {
			t.Fatalf("deferred facts were written at once: %+v", got.Status)
		}
		if got, err := w.Get(ctx, key); err != nil || got.SourceCommit() != "c0ffee" || got.Status.DesiredHash != "sha256:b" {
			t.Fatalf("the writer's Get does not show the deferred facts: %v, %v", got, err)
		}
		ack := conditions.Applied{Report: &protocol.Applied{Hash: "sha256:b", Generation: 1}, Sent: "sha256:b"}
		if _, err := w.Record(ctx, key, ack); err != nil {
			t.Fatal(err)
		}
		got := stored(t, key)
		if got.Status.AppliedHash != "sha256:b" || got.Status.DesiredHash != "sha256:b" || got.SourceCommit() != "c0ffee" || got.Status.Source.InputsDigest != "d1" {
			t.Errorf("after the acknowledgement the status is %+v, want the state sent, acknowledged, from commit c0ffee", got.Status)
		}
		if n := counter.snapshot().minus(before); n.writes() != 1 {
			t.Errorf("the deferred facts and the acknowledgement made %s, want one patch", n)
		}
	})

	t.Run("without another write they are written when the wait is over", func(t *testing.T) {
		key := newCluster(t, "silent")
		before := counter.snapshot()
		if changed, err := w.Defer(ctx, key, 200*time.Millisecond, sent...); err != nil || !changed {
			t.Fatalf("Defer = %v, %v; want a change", changed, err)
		}
		poll.Until(t, "the deferred facts written", func() (bool, string) {
			got := stored(t, key)
			return got.SourceCommit() == "c0ffee" && got.Status.DesiredHash == "sha256:b", fmt.Sprintf("%+v", got.Status)
		})
		if n := counter.snapshot().minus(before); n.writes() != 1 {
			t.Errorf("writing deferred facts made %s, want one patch", n)
		}
	})

	t.Run("facts that change nothing are not deferred", func(t *testing.T) {
		key := newCluster(t, "unchanged")
		if _, err := w.Record(ctx, key, sent...); err != nil {
			t.Fatal(err)
		}
		if changed, err := w.Defer(ctx, key, time.Hour, sent...); err != nil || changed {
			t.Fatalf("Defer of what is stored = %v, %v; want no change", changed, err)
		}
	})

	// The status writer's own writes race with its reads and with the deferred facts'
	// timers. A status patch held by the hub cluster opens the window in which either
	// race would show: had the writer not kept one WorkerCluster's record, flush and
	// read apart, what is checked below would go wrong while the patch is held.
	plain, err := client.NewWithWatch(planes[0].Config, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	held := heldpatch.Wrap(plain)
	gated := conditions.NewWriter(held)

	t.Run("a read while a write takes the deferred facts still shows them", func(t *testing.T) {
		key := newCluster(t, "read-during-write")
		if changed, err := gated.Defer(ctx, key, time.Hour, sent...); err != nil || !changed {
			t.Fatalf("Defer = %v, %v; want a change", changed, err)
		}
		release := held.Next(key)
		ack := conditions.Applied{Report: &protocol.Applied{Hash: "sha256:b", Generation: 1}, Sent: "sha256:b"}
		recorded := start(func() (*v1alpha1.WorkerCluster, error) { return gated.Record(ctx, key, ack) })
		held.WaitStarted(t)
		read := start(func() (*v1alpha1.WorkerCluster, error) { return gated.Get(ctx, key) })
		read.window()
		release()
		if _, err := recorded.wait(); err != nil {
			t.Fatal(err)
		}
		got, err := read.wait()
		if err != nil {
			t.Fatal(err)
		}
		if got.SourceCommit() != "c0ffee" || got.Status.DesiredHash != "sha256:b" {
			t.Errorf("a read while the acknowledgement's write was under way showed source %q, desired %q: the deferred facts it took were missing",
				got.SourceCommit(), got.Status.DesiredHash)
		}
	})

	t.Run("deferred facts written on their own never go over facts recorded later", func(t *testing.T) {
		key := newCluster(t, "flush-then-record")
		if _, err := gated.Record(ctx, key, conditions.Desired{Hash: "sha256:a"}); err != nil {
			t.Fatal(err)
		}
		release := held.Next(key)
		// Their wait is over at once: the write of them on their own is the held one.
		if changed, err := gated.Defer(ctx, key, time.Millisecond, conditions.Desired{Hash: "sha256:b"}); err != nil || !changed {
			t.Fatalf("Defer = %v, %v; want a change", changed, err)
		}
		held.WaitStarted(t)
		recorded := start(func() (*v1alpha1.WorkerCluster, error) {
			return gated.Record(ctx, key, conditions.Desired{Hash: "sha256:c"})
		})
		recorded.window()
		release()
		if err := held.Result(t); apierrors.IsConflict(err) {
			t.Errorf("the write of the deferred facts conflicted with a write made while it was under way; its retry puts them over the later ones")
		} else if err != nil {
			t.Fatal(err)
		}
		if _, err := recorded.wait(); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, "the later desired state stored", func() (bool, string) {
			got := stored(t, key)
			return got.Status.DesiredHash == "sha256:c", "desired " + got.Status.DesiredHash
		})
	})

	// The hub posts a cluster's commit status from View, told by OnChange: an agent's
	// acknowledgement must reach the commit as it comes, not once a hub cluster that a
	// fleet-wide change keeps busy for minutes has stored it.
	viewed := conditions.NewWriter(held)
	told := make(chan client.ObjectKey, 16)
	viewed.OnChange(func(key client.ObjectKey) {
		select {
		case told <- key:
		default:
		}
	})
	waitTold := func(t *testing.T, key client.ObjectKey, when string) {
		t.Helper()
		deadline := time.After(poll.Deadline)
		for {
			select {
			case k := <-told:
				if k == key {
					return
				}
			case <-deadline:
				t.Fatalf("OnChange was not told of %s %s", key.Name, when)
			}
		}
	}
	ack := conditions.Applied{Report: &protocol.Applied{Hash: "sha256:b", Generation: 1}, Sent: "sha256:b"}
	acknowledged := func(wc *v1alpha1.WorkerCluster) bool {
		return wc.Status.AppliedHash == "sha256:b" && wc.Status.DesiredHash == "sha256:b" && wc.SourceCommit() == "c0ffee"
	}
	// sentAndHeld is a new WorkerCluster to which the desired state was sent, deferred
	// as the hub defers it, whose next status patch is held until released.
	sentAndHeld := func(t *testing.T, name string) (client.ObjectKey, func()) {
		t.Helper()
		key := newCluster(t, name)
		if changed, err := viewed.Defer(ctx, key, time.Hour, sent...); err != nil || !changed {
			t.Fatalf("Defer = %v, %v; want a change", changed, err)
		}
		release := held.Next(key)
		t.Cleanup(release)
		return key, release
	}

	t.Run("a record under way is shown and told of before it is stored", func(t *testing.T) {
		key, release := sentAndHeld(t, "shown-under-way")
		recorded := start(func() (*v1alpha1.WorkerCluster, error) { return viewed.Record(ctx, key, ack) })
		held.WaitStarted(t)
		waitTold(t, key, "while its acknowledgement's write was held")
		// The patch is held until released: a View that waited for it would never return.
		view := start(func() (*v1alpha1.WorkerCluster, error) { return viewed.View(ctx, key) })
		view.within(t, "View, while the write is held")
		got, err := view.wait()
		if err != nil {
			t.Fatal(err)
		}
		if !acknowledged(got) {
			t.Errorf("while the write was held View showed applied %q, desired %q, source %q; want the acknowledgement of sha256:b from c0ffee",
				got.Status.AppliedHash, got.Status.DesiredHash, got.SourceCommit())
		}
		if s := stored(t, key); s.Status.AppliedHash != "" {
			t.Fatalf("the held write was stored: applied %q", s.Status.AppliedHash)
		}
		release()
		if _, err := recorded.wait(); err != nil {
			t.Fatal(err)
		}
		waitTold(t, key, "once its acknowledgement was stored")
		if s := stored(t, key); !acknowledged(s) {
			t.Errorf("after the write the stored status is %+v; want the acknowledgement", s.Status)
		}
	})

	t.Run("a record waiting behind another write is shown and told of at once", func(t *testing.T) {
		// In a fleet-wide change, deferred facts whose wait ran out may hold a cluster
		// for a minute in the request budget's queue when its agent's acknowledgement
		// comes.
		key, release := sentAndHeld(t, "queued-behind-a-write")
		flushed := start(func() (*v1alpha1.WorkerCluster, error) { return viewed.Record(ctx, key) })
		held.WaitStarted(t)
		waitTold(t, key, "while the deferred facts' write was held")
		recorded := start(func() (*v1alpha1.WorkerCluster, error) { return viewed.Record(ctx, key, ack) })
		waitTold(t, key, "while its acknowledgement waited behind the held write")
		got, err := viewed.View(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !acknowledged(got) {
			t.Errorf("while the acknowledgement waited View showed applied %q, desired %q, source %q; want the acknowledgement of sha256:b from c0ffee",
				got.Status.AppliedHash, got.Status.DesiredHash, got.SourceCommit())
		}
		release()
		for _, c := range []*call[*v1alpha1.WorkerCluster]{flushed, recorded} {
			if _, err := c.wait(); err != nil {
				t.Fatal(err)
			}
		}
		if s := stored(t, key); !acknowledged(s) {
			t.Errorf("once released the stored status is %+v, want the acknowledgement", s.Status)
		}
	})

	t.Run("a derivation asked for while a write is under way leaves it to the write", func(t *testing.T) {
		key := newCluster(t, "derive-while-held")
		release := held.Next(key)
		defer release()
		recorded := start(func() (*v1alpha1.WorkerCluster, error) {
			return viewed.Record(ctx, key, conditions.Desired{Hash: "sha256:d"})
		})
		held.WaitStarted(t)
		// A hub's refresh derives this way: it must not wait for a write that waits for
		// the request budget.
		idle := start(func() (struct{}, error) { return struct{}{}, viewed.RecordIfIdle(ctx, key) })
		idle.within(t, "RecordIfIdle, while the write is held")
		if _, err := idle.wait(); err != nil {
			t.Fatal(err)
		}
		release()
		if _, err := recorded.wait(); err != nil {
			t.Fatal(err)
		}
		waitTold(t, key, "once the write it found under way ended")
	})

	t.Run("a record that failed is no longer shown, and told of", func(t *testing.T) {
		key, _ := sentAndHeld(t, "shown-then-failed")
		recordCtx, cancel := context.WithCancel(ctx)
		recorded := start(func() (*v1alpha1.WorkerCluster, error) { return viewed.Record(recordCtx, key, ack) })
		held.WaitStarted(t)
		waitTold(t, key, "while its acknowledgement's write was held")
		// The write fails: its request is cancelled.
		cancel()
		if _, err := recorded.wait(); err == nil {
			t.Fatal("the cancelled record succeeded")
		}
		waitTold(t, key, "once its acknowledgement's write failed")
		got, err := viewed.View(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.AppliedHash != "" {
			t.Errorf("after the write failed View shows applied %q; want nothing applied", got.Status.AppliedHash)
		}
		if got.Status.DesiredHash != "sha256:b" || got.SourceCommit() != "c0ffee" {
			t.Errorf("after the write failed View lost the deferred facts it took: desired %q, source %q", got.Status.DesiredHash, got.SourceCommit())
		}
	})

	// Facts the hub learns once (an agent's report, Kueue's judgement of a worker, a
	// connection a previous hub left open) must reach the status though the hub cluster
	// refused their first write.
	unavailable := apierrors.NewServiceUnavailable("the hub cluster is restarting")
	// refusing writes the status patches of WorkerClusters through plain, but for those
	// refuse answers with an error.
	refusing := func(refuse func(key client.ObjectKey) error) *conditions.Writer {
		return conditions.NewWriter(heldpatch.Refuse(plain, func(obj client.Object) error {
			if _, ok := obj.(*v1alpha1.WorkerCluster); !ok {
				return nil
			}
			return refuse(client.ObjectKeyFromObject(obj))
		}))
	}
	once := func(key client.ObjectKey) func(client.ObjectKey) error {
		var refused atomic.Bool
		return func(k client.ObjectKey) error {
			if k == key && refused.CompareAndSwap(false, true) {
				return unavailable
			}
			return nil
		}
	}
	connected := conditions.Connected{At: time.Now(), AgentVersion: "test", KubernetesVersion: "v1.37.0", Protocol: protocol.ProtocolVersion}
	isConnected := func(wc *v1alpha1.WorkerCluster) bool {
		c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionConnected)
		return c != nil && c.Status == metav1.ConditionTrue
	}

	t.Run("a fact the hub cluster refused is shown and stored by a retry", func(t *testing.T) {
		key := newCluster(t, "refused-once")
		rw := refusing(once(key))
		if _, err := rw.RecordOrRetry(ctx, ctx, key, 100*time.Millisecond, connected); !apierrors.IsServiceUnavailable(err) {
			t.Fatalf("RecordOrRetry = %v; want the hub cluster's refusal", err)
		}
		got, err := rw.View(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !isConnected(got) {
			t.Fatalf("View after the refusal shows Connected %+v; want the refused connection shown",
				meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionConnected))
		}
		poll.Until(t, "the refused connection stored", func() (bool, string) {
			got := stored(t, key)
			return isConnected(got), fmt.Sprintf("%+v", got.Status.Conditions)
		})
	})

	t.Run("a refused fact goes under facts recorded after it", func(t *testing.T) {
		key := newCluster(t, "refused-then-later")
		rw := refusing(once(key))
		if _, err := rw.RecordOrRetry(ctx, ctx, key, time.Hour, connected); err == nil {
			t.Fatal("the refused record succeeded")
		}
		gone := conditions.Disconnected{At: time.Now(), Cause: conditions.HungUp}
		if _, err := rw.RecordOrRetry(ctx, ctx, key, time.Hour, gone); err != nil {
			t.Fatal(err)
		}
		if got := stored(t, key); isConnected(got) || got.Status.Agent == nil {
			t.Errorf("after a refused connection and a later hang-up the status is connected %v, agent %+v; want the agent known and disconnected",
				isConnected(got), got.Status.Agent)
		}
	})

	t.Run("a refused fact goes under facts recorded while its write was under way", func(t *testing.T) {
		key := newCluster(t, "refused-under-way")
		release := held.Next(key)
		defer release()
		hw := conditions.NewWriter(held)
		recordCtx, cancel := context.WithCancel(ctx)
		refused := start(func() (*v1alpha1.WorkerCluster, error) {
			return hw.RecordOrRetry(recordCtx, ctx, key, 50*time.Millisecond, connected)
		})
		held.WaitStarted(t)
		later := start(func() (*v1alpha1.WorkerCluster, error) {
			return hw.Record(ctx, key, conditions.Disconnected{At: time.Now(), Cause: conditions.HungUp})
		})
		later.window()
		// The connection's write fails while the hang-up waits for it.
		cancel()
		if _, err := refused.wait(); err == nil {
			t.Fatal("the cancelled record succeeded")
		}
		if _, err := later.wait(); err != nil {
			t.Fatal(err)
		}
		if got := stored(t, key); isConnected(got) || got.Status.Agent == nil {
			t.Errorf("after a refused connection and a hang-up recorded while it was under way, the stored status is connected %v, agent %+v; want the agent known and disconnected",
				isConnected(got), got.Status.Agent)
		}
		got, err := hw.View(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if isConnected(got) {
			t.Errorf("View shows the refused connection over the later hang-up: it is still to be written on its own")
		}
	})

	t.Run("a fact whose reads the hub cluster refused is kept too", func(t *testing.T) {
		key := newCluster(t, "read-refused")
		// The record's read, and the next: a hub cluster that is down refuses reads too.
		var reads atomic.Int32
		rw := conditions.NewWriter(interceptor.NewClient(plain, interceptor.Funcs{
			Get: func(ctx context.Context, cl client.WithWatch, k client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if k == key && reads.Add(1) <= 2 {
					return apierrors.NewServiceUnavailable("the hub cluster is restarting")
				}
				return cl.Get(ctx, k, obj, opts...)
			},
		}))
		if _, err := rw.RecordOrRetry(ctx, ctx, key, 50*time.Millisecond, connected); !apierrors.IsServiceUnavailable(err) {
			t.Fatalf("RecordOrRetry = %v; want the hub cluster's refusal", err)
		}
		poll.Until(t, "the connection stored after its reads were refused", func() (bool, string) {
			got := stored(t, key)
			return isConnected(got), fmt.Sprintf("%+v", got.Status.Conditions)
		})
	})

	t.Run("a fact the hub cluster finds invalid is not kept", func(t *testing.T) {
		key := newCluster(t, "invalid")
		var refusals atomic.Int32
		rw := refusing(func(k client.ObjectKey) error {
			if k != key {
				return nil
			}
			refusals.Add(1)
			return apierrors.NewInvalid(v1alpha1.GroupVersion.WithKind("WorkerCluster").GroupKind(), key.Name, nil)
		})
		if _, err := rw.RecordOrRetry(ctx, ctx, key, time.Millisecond, connected); !apierrors.IsInvalid(err) {
			t.Fatalf("RecordOrRetry = %v; want the hub cluster's refusal", err)
		}
		// Kept, it would go with every later write of the cluster, and fail it too.
		got, err := rw.View(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if isConnected(got) || refusals.Load() != 1 {
			t.Errorf("after the refusal View shows connected %v, after %d refusals; want the invalid fact dropped, not kept for another try", isConnected(got), refusals.Load())
		}
	})

	t.Run("a hub cluster that keeps refusing is tried until it takes them", func(t *testing.T) {
		key := newCluster(t, "refused-thrice")
		var refusals atomic.Int32
		rw := refusing(func(k client.ObjectKey) error {
			if k == key && refusals.Add(1) <= 3 {
				return unavailable
			}
			return nil
		})
		if _, err := rw.RecordOrRetry(ctx, ctx, key, 50*time.Millisecond, connected); err == nil {
			t.Fatal("the refused record succeeded")
		}
		poll.Until(t, "the connection stored after three refusals", func() (bool, string) {
			got := stored(t, key)
			return isConnected(got), fmt.Sprintf("%d refusals, %+v", refusals.Load(), got.Status.Conditions)
		})
	})

	t.Run("a hub that stopped takes them with it", func(t *testing.T) {
		key := newCluster(t, "stopped")
		hubCtx, stop := context.WithCancel(ctx)
		if changed, err := w.Defer(hubCtx, key, 50*time.Millisecond, sent...); err != nil || !changed {
			t.Fatalf("Defer = %v, %v; want a change", changed, err)
		}
		stop()
		poll.Until(t, "the deferred facts' wait over", func() (bool, string) {
			got, err := w.Get(ctx, key)
			if err != nil {
				return false, err.Error()
			}
			return got.SourceCommit() == "", "still shown: " + got.SourceCommit()
		})
		if got := stored(t, key); got.Status.Source != nil {
			t.Errorf("facts deferred by a hub that stopped were written: %+v", got.Status.Source)
		}
	})
}

// raceWindow is how long a test holding a status patch gives a racing call to show
// itself: a call the writer keeps apart waits for the patch, however long it is held,
// and one it did not keep apart is done within microseconds.
const raceWindow = 200 * time.Millisecond

// call is a call under way in a goroutine of its own.
type call[T any] struct {
	done chan struct{}
	val  T
	err  error
}

func start[T any](f func() (T, error)) *call[T] {
	c := &call[T]{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		c.val, c.err = f()
	}()
	return c
}

// window gives the call raceWindow to return, and no longer.
func (c *call[T]) window() {
	select {
	case <-c.done:
	case <-time.After(raceWindow):
	}
}

// within fails the test unless the call returns within poll.Deadline: for a call that
// must not wait for what the test holds.
func (c *call[T]) within(t *testing.T, what string) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(poll.Deadline):
		t.Fatalf("%s waited for the write under way", what)
	}
}

// wait waits for the call to return.
func (c *call[T]) wait() (T, error) {
	<-c.done
	return c.val, c.err
}

package scale

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
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

// Package heldpatch is a Kubernetes client whose status patches a test holds or
// refuses: the next patch of a chosen object waits until the test releases it, the
// window in which a write is under way, for tests of what readers see, and hear,
// meanwhile (Wrap); or patches the test picks are refused, as by a hub cluster that
// restarts (Refuse).
package heldpatch

import (
	"context"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/flotilla-gitops/flotilla/test/poll"
)

// Client holds status patches of the object a test names, one at a time; all else
// goes straight through.
type Client struct {
	client.Client

	mu   sync.Mutex
	key  client.ObjectKey
	gate chan struct{}
	// started is closed when the held patch starts, done told of its outcome.
	started chan struct{}
	done    chan error
}

// Wrap is c with status patches that a test can hold.
func Wrap(c client.WithWatch) *Client {
	h := &Client{}
	h.Client = interceptor.NewClient(c, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			h.mu.Lock()
			gate, started, done := h.gate, h.started, h.done
			hold := gate != nil && client.ObjectKeyFromObject(obj) == h.key
			if hold {
				h.gate = nil
			}
			h.mu.Unlock()
			if !hold {
				return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			}
			close(started)
			select {
			case <-gate:
			case <-ctx.Done():
			}
			err := c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			done <- err
			return err
		},
	})
	return h
}

// Next holds the next status patch of the object named key, until release is called
// or the patch's context ends.
func (h *Client) Next(key client.ObjectKey) (release func()) {
	gate := make(chan struct{})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.key, h.gate, h.started, h.done = key, gate, make(chan struct{}), make(chan error, 1)
	return sync.OnceFunc(func() { close(gate) })
}

// WaitStarted waits until the patch to hold was made.
func (h *Client) WaitStarted(t testing.TB) {
	t.Helper()
	h.mu.Lock()
	started := h.started
	h.mu.Unlock()
	select {
	case <-started:
	case <-time.After(poll.Deadline):
		t.Fatal("the status patch to hold was never made")
	}
}

// Result is the held patch's outcome, once it ended.
func (h *Client) Result(t testing.TB) error {
	t.Helper()
	h.mu.Lock()
	done := h.done
	h.mu.Unlock()
	select {
	case err := <-done:
		return err
	case <-time.After(poll.Deadline):
		t.Fatal("the held status patch never ended")
		return nil
	}
}

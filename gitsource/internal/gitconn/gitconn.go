// Package gitconn opens sessions with a git server that are given up when their context
// ends, for whatever in the hub talks to the fleet repository: the source that follows it
// and the backend that keeps commit statuses in it as notes.
//
// Over SSH, go-git connects, shakes hands and starts upload-pack or receive-pack with
// neither a deadline nor a context: a server that accepts the connection and never
// answers would hold whoever waits on it, and every lock it holds, for good. Here the
// wait ends with the context. A connection given up on is left to end on its own, and
// closed when it does; until then the next of its kind (a Hangs) fails at once with
// ErrHanging for HangRetry, and at most MaxHanging of a kind hang at once, so that a
// server that never answers costs a few connections, not one per try. The session's
// later calls take a context of their own (AdvertisedReferencesContext, UploadPack,
// ReceivePack).
package gitconn

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"time"

	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/sideband"
	"github.com/go-git/go-git/v5/plumbing/transport"
)

// ErrHanging is the error of a connection tried while those of its kind given up on
// have not ended.
var ErrHanging = errors.New("the server has not answered the last connections yet")

const (
	// MaxHanging is how many connections of a kind may hang at once: a server that
	// never answers costs at most this many.
	MaxHanging = 4
	// HangRetry is how long after a connection was given up the next is tried while it
	// still hangs: one that hangs for good does not refuse every later one.
	HangRetry = 5 * time.Minute
)

// Hangs counts the connections of one kind given up on that have not ended, and when
// the newest was given up. Kinds that must not hold each other up (a source's branch
// and its pull requests) count theirs apart. The zero Hangs is ready.
type Hangs struct {
	n    atomic.Int32
	last atomic.Int64 // Unix nanoseconds
}

// UploadPack starts an upload-pack session (a fetch, or a listing of refs) with the
// server at ep, given up when ctx ends.
func (h *Hangs) UploadPack(ctx context.Context, cl transport.Transport, ep *transport.Endpoint, auth transport.AuthMethod) (transport.UploadPackSession, error) {
	return connect(ctx, h, func() (transport.UploadPackSession, error) { return cl.NewUploadPackSession(ep, auth) })
}

// ReceivePack starts a receive-pack session (a push) with the server at ep, given up
// when ctx ends.
func (h *Hangs) ReceivePack(ctx context.Context, cl transport.Transport, ep *transport.Endpoint, auth transport.AuthMethod) (transport.ReceivePackSession, error) {
	return connect(ctx, h, func() (transport.ReceivePackSession, error) { return cl.NewReceivePackSession(ep, auth) })
}

func connect[S io.Closer](ctx context.Context, h *Hangs, open func() (S, error)) (S, error) {
	var none S
	if err := ctx.Err(); err != nil {
		return none, err
	}
	if n := h.n.Load(); n >= MaxHanging || n > 0 && time.Since(time.Unix(0, h.last.Load())) < HangRetry {
		return none, ErrHanging
	}
	type result struct {
		s   S
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := open()
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-ctx.Done():
		h.n.Add(1)
		h.last.Store(time.Now().UnixNano())
		go func() {
			if r := <-done; r.err == nil {
				r.s.Close()
			}
			h.n.Add(-1)
		}()
		return none, ctx.Err()
	}
}

// Pack is the packfile in resp, an upload-pack answer to a request with caps: demuxed
// from the progress and errors the server interleaves when the request asked for a
// side band.
func Pack(resp io.Reader, caps *capability.List) io.Reader {
	switch {
	case caps.Supports(capability.Sideband64k):
		return sideband.NewDemuxer(sideband.Sideband64k, resp)
	case caps.Supports(capability.Sideband):
		return sideband.NewDemuxer(sideband.Sideband, resp)
	}
	return resp
}

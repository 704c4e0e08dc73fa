package gitsource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/sideband"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/client"
)

// session is one conversation with the remote: the refs it advertised, and at most
// one fetch (over SSH, the server's upload-pack ends after one).
type session struct {
	transport.UploadPackSession
	adv  *packp.AdvRefs
	refs storer.ReferenceStorer
}

// open starts a session and reads the remote's refs; h counts the connections of its
// kind (the branch's or the pull requests') given up on.
func (s *Source) open(ctx context.Context, h *hangs) (*session, error) {
	ep, err := transport.NewEndpoint(s.opts.URL)
	if err != nil {
		return nil, s.wrap("reading the URL of", err)
	}
	cl, err := client.NewClient(ep)
	if err != nil {
		return nil, s.wrap("connecting to", err)
	}
	up, err := s.connect(ctx, cl, ep, h)
	if err != nil {
		return nil, s.wrap("connecting to", err)
	}
	adv, err := up.AdvertisedReferencesContext(ctx)
	if err != nil {
		up.Close()
		return nil, s.wrap("listing refs", err)
	}
	refs, err := adv.AllReferences()
	if err != nil {
		up.Close()
		return nil, s.wrap("listing refs", err)
	}
	return &session{UploadPackSession: up, adv: adv, refs: refs}, nil
}

// errHanging is the error of a connection tried while those given up on have not ended.
var errHanging = errors.New("the server has not answered the last connections yet")

// hangs counts the connections of one kind given up on that have not ended, and when the
// newest was given up. The branch and the pull requests count theirs apart, so that
// neither holds the other up.
type hangs struct {
	n    atomic.Int32
	last atomic.Int64 // Unix nanoseconds
}

const (
	// maxHanging is how many connections of a kind may hang at once: a server that
	// never answers costs at most this many.
	maxHanging = 4
	// hangRetry is how long after a connection was given up the next is tried while it
	// still hangs: one that hangs for good does not refuse every later one.
	hangRetry = 5 * time.Minute
)

// connect starts an upload-pack session with the remote, given up when ctx ends. Over
// SSH, go-git connects, shakes hands and starts upload-pack with neither a deadline nor
// a context: a server that accepts the connection and never answers would hold the
// source's lock, and with it the branch or the pull requests, for good. A connection
// given up on is left to end on its own, and closed when it does; until then the next
// of its kind fails at once for hangRetry, so that a server that never answers costs a
// few connections, not one per try.
func (s *Source) connect(ctx context.Context, cl transport.Transport, ep *transport.Endpoint, h *hangs) (transport.UploadPackSession, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if n := h.n.Load(); n >= maxHanging || n > 0 && time.Since(time.Unix(0, h.last.Load())) < hangRetry {
		return nil, errHanging
	}
	type result struct {
		up  transport.UploadPackSession
		err error
	}
	done := make(chan result, 1)
	go func() {
		up, err := cl.NewUploadPackSession(ep, s.opts.Auth)
		done <- result{up, err}
	}()
	select {
	case r := <-done:
		return r.up, r.err
	case <-ctx.Done():
		h.n.Add(1)
		h.last.Store(time.Now().UnixNano())
		go func() {
			if r := <-done; r.err == nil {
				r.up.Close()
			}
			h.n.Add(-1)
		}()
		return nil, ctx.Err()
	}
}

// ref is what the remote's ref name points at, or the zero hash.
func (ss *session) ref(name plumbing.ReferenceName) plumbing.Hash {
	r, err := ss.refs.Reference(name)
	if err != nil || r.Type() != plumbing.HashReference {
		return plumbing.ZeroHash
	}
	return r.Hash()
}

// fetch brings want with depth commits of history into st, within b. What st holds
// is offered to the server (every ref as a have, its shallow boundary), so that only
// what is new comes.
//
// The request asks for a thin pack, whose deltas may build on objects st has, although
// go-git removes thin-pack from what every server advertises
// (transport.UnsupportedCapabilities): without it, a server answering a shallow fetch
// sends the whole tree again, every time (some 20,000 objects for a change to one
// cluster of 10,000). git's own servers and the forges built on them offer thin packs,
// and readPack resolves them.
func (ss *session) fetch(ctx context.Context, st *store, want plumbing.Hash, depth int, b budget) error {
	if st.have(want) {
		return nil
	}
	return ss.deepen(ctx, st, want, depth, b)
}

// deepen fetches want with depth commits of history into st as fetch does, st holding
// want already or not: the server sends the history below st's shallow boundary that
// the new depth takes in.
func (ss *session) deepen(ctx context.Context, st *store, want plumbing.Hash, depth int, b budget) error {
	req := packp.NewUploadPackRequestFromCapabilities(ss.adv.Capabilities)
	for _, c := range []capability.Capability{capability.ThinPack, capability.Shallow} {
		if err := req.Capabilities.Set(c); err != nil {
			return err
		}
	}
	if ss.adv.Capabilities.Supports(capability.NoProgress) {
		if err := req.Capabilities.Set(capability.NoProgress); err != nil {
			return err
		}
	}
	req.Wants = []plumbing.Hash{want}
	req.Depth = packp.DepthCommits(depth)
	req.Shallows = append([]plumbing.Hash(nil), st.shallow...)
	for _, h := range st.refs {
		if st.have(h) {
			req.Haves = append(req.Haves, h)
		}
	}
	resp, err := ss.UploadPack(ctx, req)
	if err != nil {
		return err
	}
	defer resp.Close()
	var pack io.Reader = resp
	switch {
	case req.Capabilities.Supports(capability.Sideband64k):
		pack = sideband.NewDemuxer(sideband.Sideband64k, resp)
	case req.Capabilities.Supports(capability.Sideband):
		pack = sideband.NewDemuxer(sideband.Sideband, resp)
	}
	objs, err := readPack(pack, st, b)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	st.add(objs)
	st.setShallow(resp.Shallows, resp.Unshallows)
	if !st.have(want) {
		return fmt.Errorf("the server did not send %s", want)
	}
	return nil
}

package gitsource

import (
	"context"
	"fmt"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/client"

	"github.com/flotilla-gitops/flotilla/gitsource/internal/gitconn"
)

// session is one conversation with the remote: the refs it advertised, and at most
// one fetch (over SSH, the server's upload-pack ends after one).
type session struct {
	transport.UploadPackSession
	adv  *packp.AdvRefs
	refs storer.ReferenceStorer
}

// open starts a session and reads the remote's refs. The session is given up when ctx
// ends, even over SSH, whose connection go-git starts with no context: a server that
// accepts and never answers would hold the source's lock, and with it the branch or the
// pull requests, for good. h counts the connections of its kind (the branch's or the
// pull requests') given up on, so that neither holds the other up.
func (s *Source) open(ctx context.Context, h *gitconn.Hangs) (*session, error) {
	ep, err := transport.NewEndpoint(s.opts.URL)
	if err != nil {
		return nil, s.wrap("reading the URL of", err)
	}
	cl, err := client.NewClient(ep)
	if err != nil {
		return nil, s.wrap("connecting to", err)
	}
	up, err := h.UploadPack(ctx, cl, ep, s.opts.Auth)
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
//
// It returns the objects st did not hold before, even with an error: they stay in st
// until it is pruned, and whoever bounds what st holds counts them.
func (ss *session) fetch(ctx context.Context, st *store, want plumbing.Hash, depth int, b budget) ([]*storedObject, error) {
	if st.have(want) {
		return nil, nil
	}
	return ss.deepen(ctx, st, want, depth, b)
}

// deepen fetches want with depth commits of history into st as fetch does, st holding
// want already or not: the server sends the history below st's shallow boundary that
// the new depth takes in.
func (ss *session) deepen(ctx context.Context, st *store, want plumbing.Hash, depth int, b budget) ([]*storedObject, error) {
	req := packp.NewUploadPackRequestFromCapabilities(ss.adv.Capabilities)
	for _, c := range []capability.Capability{capability.ThinPack, capability.Shallow} {
		if err := req.Capabilities.Set(c); err != nil {
			return nil, err
		}
	}
	if ss.adv.Capabilities.Supports(capability.NoProgress) {
		if err := req.Capabilities.Set(capability.NoProgress); err != nil {
			return nil, err
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
		return nil, err
	}
	defer resp.Close()
	objs, err := readPack(gitconn.Pack(resp, req.Capabilities), st, b)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	brought := st.add(objs)
	st.setShallow(resp.Shallows, resp.Unshallows)
	if !st.have(want) {
		return brought, fmt.Errorf("the server did not send %s", want)
	}
	return brought, nil
}

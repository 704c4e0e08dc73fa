package gitnotes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/client"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/flotilla-gitops/flotilla/gitsource/internal/gitconn"
)

// The backend talks to the server through go-git's transport sessions, not its Remote:
// Remote starts each connection itself, and over SSH with no context, so a server that
// never answers would hold the backend, and every post waiting for it, for good. Each
// session here is started through gitconn, given up when the call's context ends.

// errMoved is a push refused before it was sent: the notes ref is no longer where the
// change was made on.
var errMoved = errors.New("the notes ref moved")

// packWindow is how many objects the encoder tries as a delta's base, git's default.
const packWindow = 10

// listNotes starts an upload-pack session and reads where the remote's notes ref is:
// the zero hash when it has none. The caller closes the session.
func (b *Backend) listNotes(ctx context.Context) (transport.UploadPackSession, *packp.AdvRefs, plumbing.Hash, error) {
	cl, err := client.NewClient(b.ep)
	if err != nil {
		return nil, nil, plumbing.ZeroHash, b.wrap("connecting to", err)
	}
	up, err := b.hangs.UploadPack(ctx, cl, b.ep, b.opts.Auth)
	if err != nil {
		return nil, nil, plumbing.ZeroHash, b.wrap("connecting to", err)
	}
	adv, err := up.AdvertisedReferencesContext(ctx)
	if errors.Is(err, transport.ErrEmptyRemoteRepository) {
		return up, nil, plumbing.ZeroHash, nil
	}
	if err != nil {
		up.Close()
		return nil, nil, plumbing.ZeroHash, b.wrap("listing refs", err)
	}
	return up, adv, adv.References[b.opts.Ref], nil
}

// moved reports whether the remote notes ref is no longer at head.
func (b *Backend) moved(ctx context.Context, head plumbing.Hash) (bool, error) {
	up, _, remote, err := b.listNotes(ctx)
	if err != nil {
		return false, err
	}
	up.Close()
	return remote != head, nil
}

// fetch brings the remote notes ref in and returns its commit, the zero hash when the
// repository has no notes yet.
func (b *Backend) fetch(ctx context.Context) (plumbing.Hash, error) {
	up, adv, remote, err := b.listNotes(ctx)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	defer up.Close()
	if remote.IsZero() {
		return plumbing.ZeroHash, nil
	}
	if _, err := b.repo.CommitObject(remote); err == nil {
		return remote, nil
	}
	if err := b.fetchPack(ctx, up, adv, remote); err != nil {
		return plumbing.ZeroHash, b.wrap("fetching notes", err)
	}
	if err := b.store.SetReference(plumbing.NewHashReference(plumbing.ReferenceName(b.opts.Ref), remote)); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("gitnotes: %s at %s: %w", b.opts.Ref, remote, err)
	}
	return remote, b.keepNewest(remote)
}

// fetchPack brings the notes commit want and its tree into the store, in the session
// up that advertised adv.
func (b *Backend) fetchPack(ctx context.Context, up transport.UploadPackSession, adv *packp.AdvRefs, want plumbing.Hash) error {
	req, err := b.newUploadRequest(adv, want, true)
	if err != nil {
		return err
	}
	shallow, err := b.store.Shallow()
	if err != nil {
		return err
	}
	req.Shallows = shallow
	// What the store holds of the notes is not sent again.
	if ref, err := b.store.Reference(plumbing.ReferenceName(b.opts.Ref)); err == nil {
		if _, err := b.repo.CommitObject(ref.Hash()); err == nil {
			req.Haves = []plumbing.Hash{ref.Hash()}
		}
	}
	resp, err := up.UploadPack(ctx, req)
	if err != nil {
		return err
	}
	defer resp.Close()
	if err := packfile.UpdateObjectStorage(b.store, gitconn.Pack(resp, req.Capabilities)); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	for _, h := range resp.Shallows {
		if !slices.Contains(shallow, h) {
			shallow = append(shallow, h)
		}
	}
	return b.store.SetShallow(shallow)
}

// newUploadRequest asks for want, only the newest commit of it when newest. The pack
// asked for is whole: a thin one may name as the base of a delta a note the store no
// longer holds.
func (b *Backend) newUploadRequest(adv *packp.AdvRefs, want plumbing.Hash, newest bool) (*packp.UploadPackRequest, error) {
	req := packp.NewUploadPackRequestFromCapabilities(adv.Capabilities)
	req.Capabilities.Delete(capability.ThinPack)
	req.Wants = []plumbing.Hash{want}
	if newest {
		// Only the newest notes are read: the history below them, which grows with every
		// status set, is not fetched.
		req.Depth = packp.DepthCommits(1)
		if err := req.Capabilities.Set(capability.Shallow); err != nil {
			return nil, err
		}
	}
	if adv.Capabilities.Supports(capability.NoProgress) {
		if err := req.Capabilities.Set(capability.NoProgress); err != nil {
			return nil, err
		}
	}
	return req, nil
}

// fetchBlob fetches the note h, of the notes whose trees the store holds without their
// notes. A server that lets a client ask for any object its refs reach
// (allow-reachable-sha1-in-want, which forges that serve partial clones allow) sends the
// note alone; another sends the newest notes whole, of which the note alone is kept. It
// fails with errMoved when the note is no longer in the server's newest notes.
func (b *Backend) fetchBlob(ctx context.Context, h plumbing.Hash) (plumbing.EncodedObject, error) {
	up, adv, remote, err := b.listNotes(ctx)
	if err != nil {
		return nil, err
	}
	defer up.Close()
	if remote.IsZero() {
		return nil, errMoved
	}
	alone := adv.Capabilities.Supports(capability.AllowReachableSHA1InWant)
	want := remote
	if alone {
		want = h
	}
	req, err := b.newUploadRequest(adv, want, !alone)
	if err != nil {
		return nil, b.wrap("fetching a note", err)
	}
	resp, err := up.UploadPack(ctx, req)
	if err != nil {
		return nil, b.wrap("fetching a note", err)
	}
	defer resp.Close()
	st := memory.NewStorage()
	if err := packfile.UpdateObjectStorage(st, gitconn.Pack(resp, req.Capabilities)); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, b.wrap("fetching a note", err)
	}
	o, err := st.EncodedObject(plumbing.BlobObject, h)
	if err != nil {
		// Another writer changed the note since head: the newest notes have it.
		return nil, errMoved
	}
	return o, nil
}

// push moves the remote notes ref from head (zero: the remote has none) to next,
// sending objs, what next adds to head. It fails with errMoved, sending nothing, when the
// ref is no longer at head.
func (b *Backend) push(ctx context.Context, head, next plumbing.Hash, objs []plumbing.Hash) error {
	// go-git's HTTP receive-pack reads the server's report and never closes the
	// response: the connection would wait for its body to be read for as long as ctx
	// lives, with two goroutines, on every push. Ending the push's own context ends the
	// request, and net/http closes the connection then.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cl, err := client.NewClient(b.ep)
	if err != nil {
		return err
	}
	rp, err := b.hangs.ReceivePack(ctx, cl, b.ep, b.opts.Auth)
	if err != nil {
		return err
	}
	defer rp.Close()
	adv, err := rp.AdvertisedReferencesContext(ctx)
	if err != nil {
		return err
	}
	if adv.References[b.opts.Ref] != head {
		return errMoved
	}
	var pack bytes.Buffer
	if _, err := packfile.NewEncoder(&pack, b.store, !adv.Capabilities.Supports(capability.OFSDelta)).Encode(objs, packWindow); err != nil {
		return fmt.Errorf("packing %s: %w", next, err)
	}
	req := packp.NewReferenceUpdateRequestFromCapabilities(adv.Capabilities)
	req.Commands = []*packp.Command{{Name: plumbing.ReferenceName(b.opts.Ref), Old: head, New: next}}
	req.Packfile = io.NopCloser(&pack)
	rs, err := rp.ReceivePack(ctx, req)
	if err != nil {
		return err
	}
	if rs != nil {
		if err := rs.Error(); err != nil {
			return err
		}
	}
	// The next fetch offers what the remote now holds.
	return b.store.SetReference(plumbing.NewHashReference(plumbing.ReferenceName(b.opts.Ref), next))
}

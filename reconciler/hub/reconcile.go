package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// inputsDigest changes whenever the cluster's directory, fleet.yaml's spec or what the
// cluster renders to (rendered, its hash; empty when it does not render) does. The
// presets count by what they make of the cluster, not by their files: a comment in a
// preset, or a change to a preset the cluster does not use, is no change to it, and
// costs no write and no status of it.
func inputsDigest(f *fleet.Fleet, c *fleet.Cluster, rendered string) string {
	h := sha256.New()
	h.Write([]byte(c.Digest))
	spec, _ := json.Marshal(f.Spec)
	h.Write(spec)
	h.Write([]byte("\x00rendered\x00" + rendered))
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// filesDigest is the digest hubs recorded before inputsDigest, which every preset's
// files changed. A cluster recorded with it keeps it, and its commit, until one of the
// inputs it names changes: the upgrade to inputsDigest moves no cluster's status to the
// head.
func filesDigest(f *fleet.Fleet, c *fleet.Cluster) string {
	h := sha256.New()
	h.Write([]byte(c.Digest))
	spec, _ := json.Marshal(f.Spec)
	h.Write(spec)
	for _, name := range f.PresetNames() {
		h.Write([]byte(name + "\x00" + f.Presets[name].Digest))
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// noteQuota keeps what the cluster offers its dispatch pool, for the pool's quota on
// the hub.
func (s *Source) noteQuota(f *fleet.Fleet, c *fleet.Cluster, objects []*unstructured.Unstructured) {
	pool, err := fleet.PoolOf(&f.Spec.Spec, c.Name, c.Object.Spec.Residency)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil || !f.Spec.Spec.DispatchEnabled() {
		delete(s.quotas, c.Name)
		return
	}
	s.quotas[c.Name] = dispatch.QuotaOf(objects, pool)
}

// prepared is the part of a cluster's reconcile that is the CPU's alone: its directory
// validated, rendered, and its enrollment file verified. A fleet-wide change prepares
// its clusters on every core, apart from the writes, which wait on the hub cluster.
type prepared struct {
	res *render.Result
	tok secrets.Hash
	// blob names the enrollment file's content that tok was verified from.
	blob string
	// invalid says why the cluster fails alone; err is a fault of the hub's (a KMS that
	// did not answer), nothing wrong with the cluster.
	invalid string
	err     error
	// took is how long preparing took.
	took time.Duration
}

// prepare validates and renders c, and verifies its enrollment file: decrypted only
// when the hub has not verified that content before, so an unchanged file costs no key
// service call, whatever changed around it. The hub remembers what it verified twice
// over: secrets.Decryptor keeps the token hash per content in memory, and wc, the
// cluster's WorkerCluster as last stored (nil when there is none), names the content
// its token hash came from, for a hub that starts afresh.
func (s *Source) prepare(ctx context.Context, f *fleet.Fleet, c *fleet.Cluster, wc *v1alpha1.WorkerCluster) (p prepared) {
	began := time.Now()
	defer func() { p.took = time.Since(began) }()
	if !c.Valid() {
		return prepared{invalid: c.Errors[0].Error()}
	}
	res, err := s.hub.renderer.Render(f, c.Name)
	if err != nil {
		var list fleet.ErrorList
		if errors.As(err, &list) && len(list) > 0 {
			return prepared{invalid: list[0].Error()}
		}
		return prepared{invalid: err.Error()}
	}
	s.noteQuota(f, c, res.Objects)
	blob := secrets.BlobHash(c.Enrollment())
	if wc != nil && wc.Annotations[v1alpha1.EnrollmentBlobAnnotation] == blob {
		if tok, err := secrets.ParseHash(wc.Spec.EnrollmentTokenHash); err == nil {
			return prepared{res: res, tok: tok, blob: blob}
		}
	}
	tok, err := s.hub.opts.Decryptor.TokenHash(ctx, path.Join(c.Dir, fleet.EnrollmentFile), c.Enrollment())
	if errors.Is(err, secrets.ErrKeyUnavailable) {
		// The KMS did not answer or refused the hub: nothing is wrong with the file.
		return prepared{err: err}
	}
	if err != nil {
		return prepared{invalid: err.Error()}
	}
	return prepared{res: res, tok: tok, blob: blob}
}

// reconcileCluster enrolls or updates one prepared cluster of the head. Nothing is
// written that would change nothing: a WorkerCluster as Git has it is not updated, a
// status as recorded is not patched, and a desired state the agent holds is not sent
// again.
func (s *Source) reconcileCluster(ctx context.Context, f *fleet.Fleet, c *fleet.Cluster, head string, p prepared) error {
	identity := fleet.Identity(s.opts.Tenant, c.Name)
	var rendered string
	if p.res != nil {
		rendered = p.res.Hash
	}
	digest := inputsDigest(f, c, rendered)
	// The list the sync started from may be behind the hub's own last write of it.
	wc, err := s.current(ctx, c.Name)
	if err != nil {
		return err
	}
	fail := func(why string) error {
		// Fails alone: the WorkerCluster and the worker keep their last good state.
		s.mu.Lock()
		s.invalid[c.Name] = why
		s.mu.Unlock()
		s.post(ctx, head, commitstatus.Status{Context: s.context(c.Name), State: commitstatus.Failure, Description: why})
		if wc == nil {
			return nil
		}
		if _, err := s.hub.opts.Status.Record(ctx, client.ObjectKeyFromObject(wc), conditions.Sourced{Commit: head, InputsDigest: digest}); err != nil {
			return err
		}
		return s.annotate(ctx, wc, map[string]string{v1alpha1.InvalidAnnotation: why})
	}
	if p.err != nil {
		return p.err
	}
	if p.invalid != "" {
		return fail(p.invalid)
	}
	// A lower count would let the credentials it revoked in again.
	if wc != nil && c.Object.Spec.Revocation < wc.Spec.Revocation {
		return fail(fmt.Sprintf("%s: spec.revocation is %d, lower than the %d in force: a revocation cannot be undone; raise it with flotilla cluster rotate-token --revoke %s",
			path.Join(c.Dir, fleet.ClusterFile), c.Object.Spec.Revocation, wc.Spec.Revocation, c.Name))
	}
	res, tok := p.res, p.tok
	// A token this cluster's agent redeemed before (the cluster was removed and added
	// back with the same enrollment file) is refused by the tunnel, which tells the
	// caller nothing: the commit says what to do. A WorkerCluster that holds the token
	// already was checked when it took it, and since then only its own agent can have
	// redeemed it, which its status shows: each fleet-wide change would otherwise read
	// the record of every cluster still waiting for its agent.
	if wc == nil || (wc.Spec.EnrollmentTokenHash != tok.String() && (wc.Status.Enrollment == nil || wc.Status.Enrollment.TokenHash != tok.String())) {
		redeemed, err := s.hub.opts.Tunnel.Redeemed(ctx, client.ObjectKey{Namespace: s.opts.Namespace, Name: c.Name}, tok)
		if err != nil {
			return err
		}
		if redeemed {
			return fail(fmt.Sprintf("%s: this enrollment token was redeemed before; issue a new one with flotilla cluster rotate-token %s", path.Join(c.Dir, fleet.EnrollmentFile), c.Name))
		}
	}
	s.mu.Lock()
	delete(s.invalid, c.Name)
	s.mu.Unlock()

	commit := head
	if src := sourceOf(wc); src.Commit != "" {
		// Nothing of it changed.
		switch src.InputsDigest {
		case digest:
			commit = src.Commit
		case filesDigest(f, c):
			commit, digest = src.Commit, src.InputsDigest
		}
	}
	key := client.ObjectKey{Namespace: s.opts.Namespace, Name: c.Name}
	want, err := s.writeWorkerCluster(ctx, c.Name, wc, func(want *v1alpha1.WorkerCluster) {
		want.Labels = mergeMaps(want.Labels, map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.WorkerClusterLabel: identity})
		want.Annotations = mergeMaps(want.Annotations, map[string]string{v1alpha1.EnrollmentBlobAnnotation: p.blob})
		delete(want.Annotations, v1alpha1.InvalidAnnotation)
		// Back in the repository while it drained or waited for its prune: it stays.
		delete(want.Annotations, v1alpha1.DecommissionAnnotation)
		delete(want.Annotations, v1alpha1.DecommissionSinceAnnotation)
		delete(want.Annotations, v1alpha1.DrainingSinceAnnotation)
		delete(want.Annotations, v1alpha1.DrainedAnnotation)
		delete(want.Annotations, v1alpha1.HubErrorAnnotation)
		delete(want.Annotations, v1alpha1.LegacySourceCommitAnnotation)
		delete(want.Annotations, v1alpha1.LegacySourceDigestAnnotation)
		want.Spec = *c.Object.Spec.DeepCopy()
		want.Spec.EnrollmentTokenHash = tok.String()
		// The tunnel issues the agent's credentials for this long: the cluster's own
		// lifetime, else the fleet's (unset: the tunnel's default).
		want.Spec.CredentialLifetime = fleet.CredentialLifetime(f, c)
	})
	if err != nil {
		return err
	}
	s.stopPruneTimer(c.Name)
	// A revocation cuts the agent off at the merge; the cluster keeps everything else.
	if s.hub.opts.Tunnel.EnforceRevocation(want) {
		s.log.Info("disconnected the agent of a cluster whose credential Git revoked", "cluster", c.Name, "revocation", want.Spec.Revocation)
	}

	facts := []conditions.Fact{conditions.Desired{Hash: res.Hash}, conditions.Sourced{Commit: commit, InputsDigest: digest}}
	// The tunnel holds the state it was pushed and sends it on every connect and
	// resync: the same state again would only be sent again.
	scope := s.dispatchScope(f)
	d := s.hub.opts.Tunnel.Desired(identity)
	if d != nil && !d.Decommission && d.Hash == res.Hash && d.Generation == want.Generation && d.Dispatch.Equal(scope) {
		if _, err := s.hub.opts.Status.Record(ctx, key, facts...); err != nil {
			return err
		}
		return s.refresh(ctx, c.Name)
	}
	comps := res.Components
	ds := &protocol.DesiredState{Generation: want.Generation, Hash: res.Hash, Components: &comps, Dispatch: scope}
	for _, o := range res.Objects {
		raw, err := json.Marshal(o.Object)
		if err != nil {
			return err
		}
		ds.Objects = append(ds.Objects, raw)
	}
	if s.hub.opts.AckWait > 0 && s.hub.opts.Tunnel.Connected(identity) {
		// The agent's acknowledgement records the new state with it, in one write, and
		// has the cluster refreshed.
		changed, err := s.hub.opts.Status.Defer(ctx, key, s.hub.opts.AckWait, facts...)
		if err != nil {
			return err
		}
		if !changed {
			s.hub.opts.Tunnel.Push(key, identity, ds)
			return s.refresh(ctx, c.Name)
		}
		// Published before the push, so that the refresh the acknowledgement brings
		// comes after.
		if err := s.publishDeferred(ctx, c.Name); err != nil {
			return err
		}
		s.hub.opts.Tunnel.Push(key, identity, ds)
		return nil
	}
	if _, err := s.hub.opts.Status.Record(ctx, key, facts...); err != nil {
		return err
	}
	s.hub.opts.Tunnel.Push(key, identity, ds)
	return s.refresh(ctx, c.Name)
}

// sourceOf is where wc's desired state comes from; empty when the hub has not
// recorded it, or wc is nil.
func sourceOf(wc *v1alpha1.WorkerCluster) v1alpha1.SourceStatus {
	if wc == nil {
		return v1alpha1.SourceStatus{}
	}
	return wc.Source()
}

// annotate sets annotations of wc, unless it has them already, and refreshes it.
func (s *Source) annotate(ctx context.Context, wc *v1alpha1.WorkerCluster, ann map[string]string) error {
	next := wc.DeepCopy()
	next.Annotations = mergeMaps(next.Annotations, ann)
	if !sameMeta(wc, next) {
		if err := s.patchWorkerCluster(ctx, next, client.MergeFrom(wc)); err != nil {
			return fmt.Errorf("annotating: %w", err)
		}
	}
	return s.refresh(ctx, wc.Name)
}

package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// inputsDigest changes whenever the cluster's directory or a fleet-wide input does.
func inputsDigest(f *fleet.Fleet, c *fleet.Cluster) string {
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

// reconcileCluster validates, renders and enrolls one cluster of the head.
func (s *Source) reconcileCluster(ctx context.Context, f *fleet.Fleet, c *fleet.Cluster, wc *v1alpha1.WorkerCluster, head string) error {
	identity := fleet.Identity(s.opts.Tenant, c.Name)
	digest := inputsDigest(f, c)
	fail := func(why string) error {
		// Fails alone: the WorkerCluster and the worker keep their last good state.
		s.mu.Lock()
		s.invalid[c.Name] = why
		s.mu.Unlock()
		s.post(ctx, head, commitstatus.Status{Context: s.context(c.Name), State: commitstatus.Failure, Description: why})
		if wc == nil {
			return nil
		}
		return s.annotate(ctx, wc, map[string]string{v1alpha1.InvalidAnnotation: why, v1alpha1.SourceCommitAnnotation: head, v1alpha1.SourceDigestAnnotation: digest})
	}
	if !c.Valid() {
		return fail(c.Errors[0].Error())
	}
	res, err := s.hub.renderer.Render(f, c.Name)
	if err == nil {
		s.noteQuota(f, c, res.Objects)
	}
	if err != nil {
		var list fleet.ErrorList
		if errors.As(err, &list) && len(list) > 0 {
			return fail(list[0].Error())
		}
		return fail(err.Error())
	}
	tok, err := s.hub.opts.Decryptor.TokenHash(ctx, path.Join(c.Dir, fleet.EnrollmentFile), c.Enrollment())
	if errors.Is(err, secrets.ErrKeyUnavailable) {
		// The KMS did not answer or refused the hub: nothing is wrong with the file.
		return err
	}
	if err != nil {
		return fail(err.Error())
	}
	// A token this cluster's agent redeemed before (the cluster was removed and added
	// back with the same enrollment file) is refused by the tunnel, which tells the
	// caller nothing: the commit says what to do.
	if wc == nil || wc.Status.Enrollment == nil || wc.Status.Enrollment.TokenHash != tok.String() {
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
	if wc != nil && wc.Annotations[v1alpha1.SourceDigestAnnotation] == digest && wc.Annotations[v1alpha1.SourceCommitAnnotation] != "" {
		commit = wc.Annotations[v1alpha1.SourceCommitAnnotation] // nothing of it changed
	}
	key := client.ObjectKey{Namespace: s.opts.Namespace, Name: c.Name}
	want := &v1alpha1.WorkerCluster{}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		// The agent's reports write the status meanwhile: start from what is stored.
		exists := true
		if err := s.hub.opts.Client.Get(ctx, key, want); apierrors.IsNotFound(err) {
			exists, want = false, &v1alpha1.WorkerCluster{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
		} else if err != nil {
			return err
		}
		want.Labels = mergeMaps(want.Labels, map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.WorkerClusterLabel: identity})
		want.Annotations = mergeMaps(want.Annotations, map[string]string{v1alpha1.SourceCommitAnnotation: commit, v1alpha1.SourceDigestAnnotation: digest})
		delete(want.Annotations, v1alpha1.InvalidAnnotation)
		delete(want.Annotations, v1alpha1.DecommissionAnnotation)
		delete(want.Annotations, v1alpha1.HubErrorAnnotation)
		want.Spec = *c.Object.Spec.DeepCopy()
		want.Spec.EnrollmentTokenHash = tok.String()
		// The tunnel issues the agent's credentials for this long: the cluster's own
		// lifetime, else the fleet's (unset: the tunnel's default).
		want.Spec.CredentialLifetime = fleet.CredentialLifetime(f, c)
		if !exists {
			return s.hub.opts.Client.Create(ctx, want)
		}
		return s.hub.opts.Client.Update(ctx, want)
	})
	if err != nil {
		return fmt.Errorf("writing WorkerCluster %s/%s: %w", key.Namespace, key.Name, err)
	}

	comps := res.Components
	ds := &protocol.DesiredState{Generation: want.Generation, Hash: res.Hash, Components: &comps}
	for _, o := range res.Objects {
		raw, err := json.Marshal(o.Object)
		if err != nil {
			return err
		}
		ds.Objects = append(ds.Objects, raw)
	}
	if _, err := s.hub.opts.Status.Record(ctx, key, conditions.Desired{Hash: res.Hash}); err != nil {
		return err
	}
	s.hub.opts.Tunnel.Push(key, identity, ds)
	return s.refresh(ctx, c.Name)
}

func (s *Source) annotate(ctx context.Context, wc *v1alpha1.WorkerCluster, ann map[string]string) error {
	patch := client.MergeFrom(wc.DeepCopy())
	wc.Annotations = mergeMaps(wc.Annotations, ann)
	if err := s.hub.opts.Client.Patch(ctx, wc, patch); err != nil {
		return fmt.Errorf("annotating WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	return s.refresh(ctx, wc.Name)
}

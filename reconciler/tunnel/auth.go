package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// Keys of the credential Secret. It holds hashes only: the hub never keeps a secret it
// could leak.
const (
	credentialHashKey = "hash"
	// pendingHashKey is a rotated credential the agent has not yet confirmed storing;
	// both are accepted until it does.
	pendingHashKey = "pendingHash"
)

// CredentialSecretName is the Secret, in the WorkerCluster's namespace, that holds the
// hash of its agent's credential.
func CredentialSecretName(workerCluster string) string { return workerCluster + "-agent-credential" }

// refusal is an authentication failure: Reason goes to the operator's log, never to the
// caller, who only learns "unauthorized".
type refusal struct {
	Reason      string
	Fingerprint string
}

func (r *refusal) Error() string { return r.Reason }

func refuse(reason, fingerprint string) error {
	return &refusal{Reason: reason, Fingerprint: fingerprint}
}

// fingerprintOf names a presented secret in logs without revealing it; for something
// that is not even token-shaped there is nothing worth naming.
func fingerprintOf(presented string) string {
	if t, err := secrets.ParseToken(presented); err == nil {
		return t.Hash().Fingerprint()
	}
	return ""
}

// admitted is the result of a successful authentication.
type admitted struct {
	wc *v1alpha1.WorkerCluster
	// credential is set when the request redeemed an enrollment token: the agent's new
	// credential, returned once in the upgrade answer.
	credential secrets.Token
	// fingerprint of what was presented, for the log.
	fingerprint string
}

// authenticate checks the upgrade request's secret for the identity it names.
func (s *Server) authenticate(ctx context.Context, r *http.Request) (*admitted, error) {
	identity := r.Header.Get(protocol.HeaderIdentity)
	presented, ok := bearer(r)
	fp := fingerprintOf(presented)
	if !ok {
		return nil, refuse("no bearer secret", "")
	}
	if identity == "" || len(validation.IsValidLabelValue(identity)) > 0 {
		return nil, refuse("no valid identity", fp)
	}
	wc, err := s.lookup(ctx, identity, fp)
	if err != nil {
		return nil, err
	}
	switch r.Header.Get(protocol.HeaderAuth) {
	case protocol.AuthEnrollment:
		return s.redeem(ctx, wc, presented, fp)
	case protocol.AuthCredential:
		return s.checkCredential(ctx, wc, presented, fp)
	}
	return nil, refuse(fmt.Sprintf("unknown %s %q", protocol.HeaderAuth, r.Header.Get(protocol.HeaderAuth)), fp)
}

func bearer(r *http.Request) (string, bool) {
	const prefix = "Bearer "
	h := r.Header.Get("Authorization")
	if len(h) <= len(prefix) || h[:len(prefix)] != prefix {
		return "", false
	}
	return h[len(prefix):], true
}

// lookup finds the one WorkerCluster with the identity, in whatever tenant namespace.
func (s *Server) lookup(ctx context.Context, identity, fp string) (*v1alpha1.WorkerCluster, error) {
	if s.opts.Resolve != nil {
		if key, ok := s.opts.Resolve(identity); ok {
			wc := new(v1alpha1.WorkerCluster)
			err := s.opts.Client.Get(ctx, key, wc)
			switch {
			case apierrors.IsNotFound(err):
				return nil, refuse("no WorkerCluster has this identity", fp)
			case err != nil:
				return nil, fmt.Errorf("reading WorkerCluster %s of identity %s: %w", key, identity, err)
			case wc.Labels[v1alpha1.WorkerClusterLabel] != identity:
				return nil, refuse(fmt.Sprintf("WorkerCluster %s no longer has this identity", key), fp)
			}
			return wc, nil
		}
	}
	var list v1alpha1.WorkerClusterList
	if err := s.opts.Client.List(ctx, &list, client.MatchingLabels{v1alpha1.WorkerClusterLabel: identity}); err != nil {
		return nil, fmt.Errorf("listing WorkerClusters of identity %s: %w", identity, err)
	}
	switch len(list.Items) {
	case 0:
		return nil, refuse("no WorkerCluster has this identity", fp)
	case 1:
		return &list.Items[0], nil
	}
	return nil, refuse(fmt.Sprintf("%d WorkerClusters claim this identity", len(list.Items)), fp)
}

// redeem consumes the enrollment token: the redemption is recorded with an optimistic
// lock on the WorkerCluster's status, so of two agents racing with one token exactly
// one gets in, and a token seen once is refused ever after.
func (s *Server) redeem(ctx context.Context, wc *v1alpha1.WorkerCluster, presented, fp string) (*admitted, error) {
	if wc.Spec.EnrollmentTokenHash == "" {
		return nil, refuse("the WorkerCluster has no enrollment token", fp)
	}
	want, err := secrets.ParseHash(wc.Spec.EnrollmentTokenHash)
	if err != nil {
		return nil, refuse("the WorkerCluster's enrollment token hash is malformed", fp)
	}
	if err := secrets.Verify(presented, want); err != nil {
		return nil, refuse(err.Error(), fp)
	}
	if e := wc.Status.Enrollment; e != nil && e.TokenHash == wc.Spec.EnrollmentTokenHash {
		return nil, refuse(fmt.Sprintf("the enrollment token was already redeemed at %s", e.RedeemedAt.UTC().Format(time.RFC3339)), fp)
	}
	cred, err := secrets.NewToken()
	if err != nil {
		return nil, err
	}
	now := metav1.NewTime(s.opts.Now())
	before := wc.DeepCopy()
	patch := client.MergeFromWithOptions(wc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	wc.Status.Enrollment = &v1alpha1.Enrollment{
		TokenHash:             wc.Spec.EnrollmentTokenHash,
		RedeemedAt:            now,
		CredentialFingerprint: cred.Hash().Fingerprint(),
		CredentialIssuedAt:    &now,
	}
	if err := s.opts.Client.Status().Patch(ctx, wc, patch); err != nil {
		if apierrors.IsConflict(err) {
			return nil, refuse("another connection redeemed the enrollment token first", fp)
		}
		return nil, fmt.Errorf("recording the redemption on WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	if err := s.writeCredential(ctx, wc, cred.Hash(), secrets.Hash{}); err != nil {
		// Without a stored credential hash the agent could never connect again: give the
		// token back so that its next attempt can redeem it.
		undo := client.MergeFromWithOptions(wc.DeepCopy(), client.MergeFromWithOptimisticLock{})
		wc.Status.Enrollment = before.Status.Enrollment
		if uerr := s.opts.Client.Status().Patch(ctx, wc, undo); uerr != nil {
			s.opts.Log.Error("undoing a redemption whose credential could not be stored", "identity", wc.Labels[v1alpha1.WorkerClusterLabel], "fingerprint", fp, "error", uerr)
		}
		return nil, err
	}
	return &admitted{wc: wc, credential: cred, fingerprint: fp}, nil
}

func (s *Server) checkCredential(ctx context.Context, wc *v1alpha1.WorkerCluster, presented, fp string) (*admitted, error) {
	var sec corev1.Secret
	err := s.opts.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: CredentialSecretName(wc.Name)}, &sec)
	if apierrors.IsNotFound(err) {
		return nil, refuse("no credential was issued (revoked, or never enrolled)", fp)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the credential of WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	current, _ := secrets.ParseHash(string(sec.Data[credentialHashKey]))
	pending, _ := secrets.ParseHash(string(sec.Data[pendingHashKey]))
	if !current.IsZero() && secrets.Verify(presented, current) == nil {
		return &admitted{wc: wc, fingerprint: fp}, nil
	}
	if !pending.IsZero() && secrets.Verify(presented, pending) == nil {
		// The agent stored the rotated credential, and the confirmation was lost.
		if err := s.writeCredential(ctx, wc, pending, secrets.Hash{}); err != nil {
			return nil, err
		}
		return &admitted{wc: wc, fingerprint: fp}, nil
	}
	if err := secrets.Verify(presented, current); errors.Is(err, secrets.ErrTokenMismatch) || current.IsZero() {
		return nil, refuse("the credential does not match the one issued", fp)
	} else {
		return nil, refuse(err.Error(), fp)
	}
}

// writeCredential makes the credential Secret hold current and, when not zero, pending.
func (s *Server) writeCredential(ctx context.Context, wc *v1alpha1.WorkerCluster, current, pending secrets.Hash) error {
	data := map[string][]byte{credentialHashKey: []byte(current.String())}
	if !pending.IsZero() {
		data[pendingHashKey] = []byte(pending.String())
	}
	sec := corev1ac.Secret(CredentialSecretName(wc.Name), wc.Namespace).
		WithLabels(map[string]string{v1alpha1.WorkerClusterLabel: wc.Labels[v1alpha1.WorkerClusterLabel]}).
		WithType(corev1.SecretTypeOpaque).
		WithData(data)
	// Apply replaces what this manager owns whole: a pending hash not named here is dropped.
	if err := s.opts.Client.Apply(ctx, sec, client.FieldOwner(fieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("writing the credential of WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	return nil
}

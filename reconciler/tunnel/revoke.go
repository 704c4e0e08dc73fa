package tunnel

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// The record of redeemed enrollment tokens: one small Secret per WorkerCluster name,
// beside the credential Secret, which outlives the WorkerCluster and its credential.
// The WorkerCluster's status is the record while it lives; once it is removed (a
// decommission, or a hand that deleted it) and added back from the same directory of
// the fleet repository, only this Secret remembers that its token was spent.
//
// One Secret per cluster rather than one for the fleet: a hash is 72 bytes, and ten
// thousand clusters would bring a single Secret near the 1 MiB an object may hold;
// per cluster, the list grows by one per rotated-and-redeemed token and is capped.
const (
	// redeemedTokensKey holds the hashes of the tokens redeemed under the name, one per
	// line, oldest first.
	redeemedTokensKey = "redeemedTokens"
	// maxRecordedTokens bounds the record: a token older than this many rotations of
	// one cluster would have to be re-added by hand to matter.
	maxRecordedTokens = 256
)

// RecordSecretName is the Secret, in the WorkerCluster's namespace, that records the
// enrollment tokens redeemed under the name; it stays when the cluster is removed.
func RecordSecretName(workerCluster string) string { return workerCluster + "-redeemed-tokens" }

// Revoke ends the agent of wc for good: its credential Secret is deleted, and the
// enrollment token it redeemed stays recorded beyond the WorkerCluster, so that adding
// the cluster back with the same enrollment file does not make that token work again.
// A live tunnel of the identity is closed, and what the hub pushed for it forgotten.
// The hub calls it when a cluster leaves the fleet, before deleting the WorkerCluster.
// Errors name the Secret concerned; the caller names the WorkerCluster.
func (s *Server) Revoke(ctx context.Context, wc *v1alpha1.WorkerCluster) error {
	if err := revoke(ctx, s.opts.Client, wc); err != nil {
		return err
	}
	identity := wc.Labels[v1alpha1.WorkerClusterLabel]
	s.Forget(identity)
	s.Disconnect(identity)
	return nil
}

func revoke(ctx context.Context, c client.Client, wc *v1alpha1.WorkerCluster) error {
	// The status may have moved on from the caller's copy (a redemption meanwhile).
	cur := new(v1alpha1.WorkerCluster)
	switch err := c.Get(ctx, client.ObjectKeyFromObject(wc), cur); {
	case apierrors.IsNotFound(err):
		cur = wc
	case err != nil:
		return fmt.Errorf("reading the WorkerCluster's enrollment: %w", err)
	}
	if e := cur.Status.Enrollment; e != nil {
		if h, err := secrets.ParseHash(e.TokenHash); err == nil {
			if err := recordRedeemed(ctx, c, cur, h); err != nil {
				return err
			}
		}
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: wc.Namespace, Name: CredentialSecretName(wc.Name)}}
	if err := c.Delete(ctx, sec); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting the credential Secret %s/%s: %w", sec.Namespace, sec.Name, err)
	}
	return nil
}

// recordRedeemed adds token to the record of wc's name.
func recordRedeemed(ctx context.Context, c client.Client, wc *v1alpha1.WorkerCluster, token secrets.Hash) error {
	key := client.ObjectKey{Namespace: wc.Namespace, Name: RecordSecretName(wc.Name)}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sec := new(corev1.Secret)
		err := c.Get(ctx, key, sec)
		if apierrors.IsNotFound(err) {
			sec = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
				Type:       corev1.SecretTypeOpaque,
			}
		} else if err != nil {
			return err
		}
		tokens := recordedTokens(sec)
		if slices.Contains(tokens, token.String()) {
			return nil
		}
		tokens = append(tokens, token.String())
		if len(tokens) > maxRecordedTokens {
			tokens = tokens[len(tokens)-maxRecordedTokens:]
		}
		if sec.Labels == nil {
			sec.Labels = map[string]string{}
		}
		// The label puts the record in the hub's cache of the tunnel's Secrets.
		sec.Labels[v1alpha1.WorkerClusterLabel] = wc.Labels[v1alpha1.WorkerClusterLabel]
		if sec.Data == nil {
			sec.Data = map[string][]byte{}
		}
		sec.Data[redeemedTokensKey] = []byte(strings.Join(tokens, "\n") + "\n")
		if sec.ResourceVersion == "" {
			err := c.Create(ctx, sec)
			if apierrors.IsAlreadyExists(err) {
				// Created meanwhile: read it and add to it, like any other conflict.
				return apierrors.NewConflict(corev1.Resource("secrets"), key.Name, err)
			}
			return err
		}
		return c.Update(ctx, sec)
	})
	if err != nil {
		return fmt.Errorf("recording the redeemed enrollment token in Secret %s: %w", key, err)
	}
	return nil
}

func recordedTokens(sec *corev1.Secret) []string {
	return strings.Fields(string(sec.Data[redeemedTokensKey]))
}

// redeemedBefore reports whether the record of wc's name holds token.
func (s *Server) redeemedBefore(ctx context.Context, wc *v1alpha1.WorkerCluster, token secrets.Hash) (bool, error) {
	return redeemed(ctx, s.opts.Reader, client.ObjectKeyFromObject(wc), token)
}

// Redeemed reports whether the record of redeemed tokens of the WorkerCluster named by
// key holds token, which the tunnel will refuse: the hub says so on the commit before
// an agent tries. It reads the hub cluster, not the cache: a cluster added back must
// not slip through in the moment before the cache learns of its record.
func (s *Server) Redeemed(ctx context.Context, key client.ObjectKey, token secrets.Hash) (bool, error) {
	return redeemed(ctx, s.opts.Client, key, token)
}

func redeemed(ctx context.Context, r client.Reader, key client.ObjectKey, token secrets.Hash) (bool, error) {
	var sec corev1.Secret
	err := r.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: RecordSecretName(key.Name)}, &sec)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading the record of redeemed tokens of WorkerCluster %s: %w", key, err)
	}
	return slices.Contains(recordedTokens(&sec), token.String()), nil
}

// EnforceRevocation closes the live tunnel of wc's identity when wc's spec.revocation
// revokes the credential it was opened with, and reports whether it did; its redial with
// that credential is refused. The hub calls it with each WorkerCluster it writes from
// Git: the merge of `flotilla cluster rotate-token --revoke` cuts a leaked credential off
// at once, not at the next rotation. Nothing else of the cluster changes: its desired
// state, its dispatch and its worker's objects stay as they are.
func (s *Server) EnforceRevocation(wc *v1alpha1.WorkerCluster) bool {
	sess := s.session(wc.Labels[v1alpha1.WorkerClusterLabel])
	if sess == nil {
		return false
	}
	cur := sess.credentialInForce()
	if !cur.revokedBy(wc) {
		return false
	}
	sess.closeRevoked(cur, wc)
	return true
}

// credentialInForce is the credential the session's agent holds as far as the session
// knows: the one it settled at hello, or the one it was admitted with until then.
func (s *session) credentialInForce() issuedCredential {
	s.cred.mu.Lock()
	defer s.cred.mu.Unlock()
	if !s.cred.current.hash.IsZero() {
		return s.cred.current
	}
	return s.admittedWith.current
}

// closeRevoked closes the tunnel of an agent whose credential cur wc revoked; stop
// records why.
func (s *session) closeRevoked(cur issuedCredential, wc *v1alpha1.WorkerCluster) {
	if s.revoked.CompareAndSwap(false, true) {
		s.log.Warn("disconnecting the agent: its credential was revoked", "credential", cur.hash.Fingerprint(), "issuedUnder", cur.revocation, "revocation", wc.Spec.Revocation)
		_ = s.tunnel.Close()
	}
}

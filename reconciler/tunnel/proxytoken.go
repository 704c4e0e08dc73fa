package tunnel

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// proxyTokenHashKey is the hash, in the credential Secret, of the bearer token that
// opens the identity's worker through the API proxy. The token itself is only in the
// kubeconfig Secret that Kueue reads.
const proxyTokenHashKey = "proxyTokenHash"

// proxyFieldManager owns the proxy token's hash in the credential Secret, apart from
// the agent credential's keys, so that neither write drops the other's.
const proxyFieldManager = "flotilla-hub-proxy"

// IssueProxyToken draws a new bearer token for the API proxy to wc's worker and keeps
// its hash, replacing the one before: the old token stops working at once. The caller
// writes the token into the kubeconfig Secret Kueue reads and nowhere else.
func (s *Server) IssueProxyToken(ctx context.Context, wc *v1alpha1.WorkerCluster) (secrets.Token, error) {
	tok, err := secrets.NewToken()
	if err != nil {
		return secrets.Token{}, err
	}
	identity := wc.Labels[v1alpha1.WorkerClusterLabel]
	sec := corev1ac.Secret(CredentialSecretName(wc.Name), wc.Namespace).
		WithLabels(map[string]string{v1alpha1.WorkerClusterLabel: identity}).
		WithType(corev1.SecretTypeOpaque).
		WithData(map[string][]byte{proxyTokenHashKey: []byte(tok.Hash().String())})
	if err := s.opts.Client.Apply(ctx, sec, client.FieldOwner(proxyFieldManager), client.ForceOwnership); err != nil {
		return secrets.Token{}, fmt.Errorf("keeping the proxy token's hash of WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	s.mu.Lock()
	s.proxyTokens[identity] = tok.Hash()
	s.mu.Unlock()
	return tok, nil
}

// ProxyTokenValid reports whether token opens wc's worker through the proxy: the hub
// keeps a kubeconfig Secret that still works, and issues a new token otherwise.
func (s *Server) ProxyTokenValid(ctx context.Context, wc *v1alpha1.WorkerCluster, token string) (bool, error) {
	t, err := secrets.ParseToken(token)
	if err != nil {
		return false, nil
	}
	// Any cluster: a hub that just took over asks before it pushed anything, and a token
	// it took for invalid then would be issued anew, and Kueue's client rebuilt.
	want, err := s.proxyTokenHash(ctx, wc.Labels[v1alpha1.WorkerClusterLabel], true)
	if err != nil || want.IsZero() {
		return false, err
	}
	return t.Hash().Equal(want), nil
}

// proxyTokenHash is the hash of the identity's proxy token; zero when it has none. It
// reads memory, or the informer cache after a restart, never the API server: a flood
// of requests with made-up tokens costs the hub cluster nothing. A replica that pushed
// nothing to the identity (a standby, which relays) finds its cluster as the tunnel's
// authentication does when anyCluster is set; otherwise an identity the hub pushed
// nothing to has no token.
func (s *Server) proxyTokenHash(ctx context.Context, identity string, anyCluster bool) (secrets.Hash, error) {
	s.mu.Lock()
	h, ok := s.proxyTokens[identity]
	p, known := s.desired[identity]
	s.mu.Unlock()
	if ok {
		return h, nil
	}
	key := p.key
	if !known {
		if !anyCluster {
			return secrets.Hash{}, nil
		}
		wc, err := s.lookup(ctx, identity, "")
		var refused *refusal
		if errors.As(err, &refused) {
			return secrets.Hash{}, nil
		}
		if err != nil {
			return secrets.Hash{}, err
		}
		key = client.ObjectKeyFromObject(wc)
	}
	var sec corev1.Secret
	if err := s.opts.Reader.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: CredentialSecretName(key.Name)}, &sec); err != nil {
		return secrets.Hash{}, client.IgnoreNotFound(err)
	}
	h, err := secrets.ParseHash(string(sec.Data[proxyTokenHashKey]))
	if err != nil {
		return secrets.Hash{}, nil
	}
	// Kept only for an identity this replica pushed to, whose token it forgets when
	// the cluster leaves; a standby reads the cache each time.
	s.mu.Lock()
	if _, still := s.desired[identity]; still {
		s.proxyTokens[identity] = h
	}
	s.mu.Unlock()
	return h, nil
}

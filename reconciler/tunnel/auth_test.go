package tunnel_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
)

func TestRefusedRequestsCostTheHubClusterNothing(t *testing.T) {
	k := newCounted(t)
	h := startHub(t, k, nil)
	c := newCluster(t, "known")
	k.sees(t, c)
	key, err := protocol.NewRedemptionKey()
	if err != nil {
		t.Fatal(err)
	}
	// Enrolled with a redemption key, so that a repeated redemption is a case too.
	p := h.connect(t, request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal(), key: key.Reveal()}, false)
	cred := p.credential
	_ = p.tunnel.Close()
	eventually(t, "the credential in the hub's cache", func() (bool, string) {
		return k.cache.Get(t.Context(), client.ObjectKey{Namespace: c.ns, Name: tunnel.CredentialSecretName(c.name)}, new(corev1.Secret)) == nil, "not yet"
	})

	other, _ := secrets.NewToken()
	otherKey, _ := protocol.NewRedemptionKey()
	mistyped := []byte(other.Reveal())
	mistyped[10] ^= 1 // a typing error the checksum catches
	tests := []struct {
		name string
		req  request
	}{
		{"no bearer secret", request{identity: c.identity, kind: protocol.AuthCredential}},
		{"a secret that is no token", request{identity: c.identity, kind: protocol.AuthCredential, secret: "hunter2"}},
		{"a token with a wrong checksum", request{identity: c.identity, kind: protocol.AuthCredential, secret: string(mistyped)}},
		{"a truncated token", request{identity: c.identity, kind: protocol.AuthCredential, secret: cred[:40]}},
		{"an identity that is no label value", request{identity: "../../" + strings.Repeat("x", 80), kind: protocol.AuthCredential, secret: other.Reveal()}},
		{"an unknown kind of secret", request{identity: c.identity, kind: "password", secret: cred}},
		{"a well-formed credential for an unknown identity", request{identity: "99-nobody-gpu", kind: protocol.AuthCredential, secret: other.Reveal()}},
		{"a well-formed token for an unknown identity", request{identity: "99-nobody-gpu", kind: protocol.AuthEnrollment, secret: other.Reveal()}},
		{"a wrong credential for a known identity", request{identity: c.identity, kind: protocol.AuthCredential, secret: other.Reveal()}},
		{"a wrong token for a known identity", request{identity: c.identity, kind: protocol.AuthEnrollment, secret: other.Reveal()}},
		{"the redeemed token again", request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal()}},
		{"the redeemed token with another redemption key", request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal(), key: otherKey.Reveal()}},
		{"a malformed redemption key", request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal(), key: "short"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := k.requests.Load()
			h.refused(t, tt.req)
			if n := k.requests.Load() - before; n != 0 {
				t.Fatalf("refusing it sent %d requests to the hub cluster, want none", n)
			}
		})
	}
	noSecretIn(t, "the hub's log", h.log.String(), c.token.Reveal(), cred, other.Reveal(), key.Reveal(), otherKey.Reveal())

	t.Run("an agent with a valid credential gets in while garbage arrives", func(t *testing.T) {
		ctx, stop := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		var garbage sync.Map // answers to the garbage, by status code
		var sent atomic.Int64
		for i := range 8 {
			wg.Go(func() {
				for n := 0; ctx.Err() == nil; n++ {
					ws, resp, _ := h.dial(ctx, tests[(i+n)%len(tests)].req)
					if ws != nil {
						_ = ws.Close()
					}
					if resp != nil {
						garbage.Store(resp.StatusCode, true)
						sent.Add(1)
					}
				}
			})
		}
		eventually(t, "garbage arriving", func() (bool, string) { return sent.Load() >= 100, "" })
		ws, resp, err := h.dial(t.Context(), request{identity: c.identity, kind: protocol.AuthCredential, secret: cred})
		stop()
		wg.Wait()
		if err != nil {
			t.Fatalf("the valid agent was refused: %v (%v)", err, resp)
		}
		_ = ws.Close()
		garbage.Range(func(code, _ any) bool {
			if code != http.StatusUnauthorized {
				t.Errorf("garbage was answered %d, want 401 only", code)
			}
			return true
		})
	})
}

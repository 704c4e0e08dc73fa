package tunnel_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/flotilla-gitops/flotilla/agent"
	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/logtest"
)

// sendAndHangUp sends r's upgrade request and closes the connection without reading
// the answer, as when a proxy or the network loses it.
func (h *hub) sendAndHangUp(t *testing.T, r request) {
	t.Helper()
	conn, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodGet, h.url()+protocol.Path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = r.header()
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
}

// issued is the credential the hub answers r with, failing the test on any other answer.
func (h *hub) issued(t *testing.T, r request) string {
	t.Helper()
	ws, resp, err := h.dial(t.Context(), r)
	if err != nil {
		t.Fatalf("answered %v (%v), want a credential", resp, err)
	}
	_ = ws.Close()
	cred := resp.Header.Get(protocol.HeaderCredential)
	if _, err := secrets.ParseToken(cred); err != nil {
		t.Fatalf("the answer carries no credential: %v", err)
	}
	return cred
}

// storedHash is the credential hash in force for the cluster on the hub.
func (c *cluster) storedHash(t *testing.T) string {
	t.Helper()
	if sec := c.credentialSecret(t); sec != nil {
		return string(sec.Data["hash"])
	}
	return ""
}

func TestALostRedemptionAnswerIsRecoverableByTheSameAgentOnly(t *testing.T) {
	var now clock
	k := newCounted(t)
	h := startHub(t, k, func(o *tunnel.Options) { o.Now = now.now; o.RedemptionRetryWindow = 5 * time.Minute })
	c := newCluster(t, "lost-answer")
	k.sees(t, c)
	key, _ := protocol.NewRedemptionKey()
	otherKey, _ := protocol.NewRedemptionKey()
	enroll := request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal(), key: key.Reveal()}

	h.sendAndHangUp(t, enroll)
	eventually(t, "the redemption recorded", func() (bool, string) {
		wc := c.wc(t)
		return wc.Status.Enrollment != nil && c.storedHash(t) != "", "not yet"
	})
	lost := c.storedHash(t)
	// The cache the hub authenticates from has caught up with what it wrote.
	eventually(t, "the hub's cache has the redemption", func() (bool, string) {
		var sec corev1.Secret
		err := k.cache.Get(t.Context(), client.ObjectKey{Namespace: c.ns, Name: tunnel.CredentialSecretName(c.name)}, &sec)
		return err == nil && string(sec.Data["hash"]) == lost, fmt.Sprint(err)
	})

	t.Run("another redemption key is refused", func(t *testing.T) {
		h.refused(t, request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal(), key: otherKey.Reveal()})
		if !strings.Contains(h.log.String(), "with another redemption key") {
			t.Fatalf("the hub's log lacks the reason:\n%s", h.log.String())
		}
	})
	t.Run("no redemption key is refused", func(t *testing.T) {
		h.refused(t, request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal()})
	})
	t.Run("the same key after the window is refused", func(t *testing.T) {
		now.advance(5*time.Minute + time.Second)
		defer now.advance(-(5*time.Minute + time.Second))
		h.refused(t, enroll)
		if !strings.Contains(h.log.String(), "longer ago than a redemption may be repeated") {
			t.Fatalf("the hub's log lacks the reason:\n%s", h.log.String())
		}
	})
	var cred string
	t.Run("the same key within the window gets a fresh credential", func(t *testing.T) {
		cred = h.issued(t, enroll)
		tok, _ := secrets.ParseToken(cred)
		if got := c.storedHash(t); got != tok.Hash().String() || got == lost {
			t.Fatalf("the hub holds credential hash %s, want the fresh credential's %s in place of the lost one", got, tok.Hash())
		}
		if !strings.Contains(h.log.String(), "the first answer was lost") {
			t.Fatalf("the hub's log does not say what happened:\n%s", h.log.String())
		}
	})
	t.Run("the key is spent once the agent has connected", func(t *testing.T) {
		// The hub checks a credential against its cache of Secrets, which learns of the
		// fresh one a moment after it is stored; an agent refused meanwhile dials again.
		tok, _ := secrets.ParseToken(cred)
		eventually(t, "the hub's cache holds the fresh credential", func() (bool, string) {
			var sec corev1.Secret
			err := k.cache.Get(t.Context(), client.ObjectKey{Namespace: c.ns, Name: tunnel.CredentialSecretName(c.name)}, &sec)
			return err == nil && string(sec.Data["hash"]) == tok.Hash().String(), fmt.Sprint(err)
		})
		h.connect(t, request{identity: c.identity, kind: protocol.AuthCredential, secret: cred}, true)
		eventually(t, "the redemption key forgotten", func() (bool, string) {
			var sec corev1.Secret
			err := k.cache.Get(t.Context(), client.ObjectKey{Namespace: c.ns, Name: tunnel.CredentialSecretName(c.name)}, &sec)
			_, kept := sec.Data["redemptionKeyHash"]
			return err == nil && !kept, fmt.Sprint(err)
		})
		h.refused(t, enroll)
	})
	noSecretIn(t, "the hub's log", h.log.String(), c.token.Reveal(), cred, key.Reveal(), otherKey.Reveal())
	for k, v := range c.credentialSecret(t).Data {
		noSecretIn(t, "the hub's Secret key "+k, string(v), cred, key.Reveal())
	}
}

// loseFirstAnswer relays connections to target, except that it cuts the first one as
// soon as the hub starts answering: the request arrives, the answer does not.
type loseFirstAnswer struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  int
}

func newLoseFirstAnswer(t *testing.T, target string) *loseFirstAnswer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &loseFirstAnswer{l: l, target: target}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			r.mu.Lock()
			r.conns++
			first := r.conns == 1
			r.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			if first {
				go func() {
					_, _ = bufio.NewReader(out).Peek(1)
					_ = in.Close()
					_ = out.Close()
				}()
				continue
			}
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	return r
}

func (r *loseFirstAnswer) count() int { r.mu.Lock(); defer r.mu.Unlock(); return r.conns }

func TestAnAgentWhoseRedemptionAnswerIsLostStillEnrolls(t *testing.T) {
	h := startHub(t, nil, nil)
	c := newCluster(t, "agent-lost")
	relay := newLoseFirstAnswer(t, h.addr)
	ns := "agent-" + c.ns
	if err := admin().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	ap, err := apply.New(apply.Options{Client: admin(), Identity: c.identity})
	if err != nil {
		t.Fatal(err)
	}
	var agentLog logtest.Buffer
	secretKey := types.NamespacedName{Namespace: ns, Name: "flotilla-agent-credential"}
	a, err := agent.New(agent.Options{
		HubURL: "ws://" + relay.l.Addr().String(), Identity: c.identity, EnrollmentToken: protocol.Secret(c.token.Reveal()),
		CredentialSecret: secretKey, Client: admin(), Applier: ap, Liveness: fast,
		Backoff: wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: time.Second},
		Log:     slogTo(&agentLog),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	eventually(t, "the agent connected", func() (bool, string) { return h.srv.Connected(c.identity), "" })
	if relay.count() < 2 {
		t.Fatalf("the agent got in on connection %d: the first answer was not lost", relay.count())
	}
	if !strings.Contains(h.log.String(), "the first answer was lost") {
		t.Fatalf("the agent did not get in by repeating its redemption:\n%s", h.log.String())
	}
	var sec corev1.Secret
	if err := admin().Get(t.Context(), secretKey, &sec); err != nil {
		t.Fatal(err)
	}
	tok, err := secrets.ParseToken(string(sec.Data[agent.CredentialKey]))
	if err != nil {
		t.Fatalf("the agent stored no credential: %v", err)
	}
	if got := c.storedHash(t); got != tok.Hash().String() {
		t.Fatalf("the hub holds credential hash %s, the agent %s", got, tok.Hash())
	}
	if _, kept := sec.Data[agent.RedemptionKeyKey]; kept {
		t.Fatal("the agent kept its redemption key beside the credential")
	}
	noSecretIn(t, "the agent's log", agentLog.String(), c.token.Reveal(), tok.Reveal())
	noSecretIn(t, "the hub's log", h.log.String(), c.token.Reveal(), tok.Reveal())
}

func TestARedeemedTokenStaysRefusedAfterTheClusterIsRemovedAndAddedBack(t *testing.T) {
	k := newCounted(t)
	h := startHub(t, k, nil)
	c := newCluster(t, "readded")
	k.sees(t, c)
	p := h.enroll(t, c)

	// The hub's decommission: revoke, disconnect, delete.
	if err := h.srv.Revoke(t.Context(), c.wc(t)); err != nil {
		t.Fatal(err)
	}
	h.srv.Disconnect(c.identity)
	if err := admin().Delete(t.Context(), c.wc(t)); err != nil {
		t.Fatal(err)
	}
	if c.credentialSecret(t) != nil {
		t.Fatal("the credential Secret outlived the revocation")
	}
	eventually(t, "the WorkerCluster gone from the hub's cache", func() (bool, string) {
		err := k.cache.Get(t.Context(), c.key(), new(v1alpha1.WorkerCluster))
		return client.IgnoreNotFound(err) == nil && err != nil, fmt.Sprint(err)
	})

	// The same directory, with the same enrollment file, added back.
	c.create(t)
	enroll := request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal()}
	eventually(t, "the re-added cluster's token refused as redeemed", func() (bool, string) {
		h.refused(t, enroll)
		return strings.Contains(h.log.String(), "rotate-token "+c.name), "the log does not say so yet"
	})
	if !strings.Contains(h.log.String(), "already redeemed") {
		t.Fatalf("the hub's log does not say the token was redeemed:\n%s", h.log.String())
	}
	h.refused(t, request{identity: c.identity, kind: protocol.AuthCredential, secret: p.credential})

	// A rotated token enrolls the cluster again.
	rotated, err := secrets.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	wc := c.wc(t)
	wc.Spec.EnrollmentTokenHash = rotated.Hash().String()
	if err := admin().Update(t.Context(), wc); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the rotated token redeemed", func() (bool, string) {
		ws, resp, err := h.dial(t.Context(), request{identity: c.identity, kind: protocol.AuthEnrollment, secret: rotated.Reveal()})
		if err != nil {
			return false, fmt.Sprintf("%v (%v)", err, resp)
		}
		_ = ws.Close()
		return true, ""
	})
	var record corev1.Secret
	if err := admin().Get(t.Context(), client.ObjectKey{Namespace: c.ns, Name: tunnel.RecordSecretName(c.name)}, &record); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []secrets.Token{c.token, rotated} {
		if !strings.Contains(string(record.Data["redeemedTokens"]), tok.Hash().String()) {
			t.Fatalf("the record lacks token %s:\n%s", tok, record.Data["redeemedTokens"])
		}
	}
	noSecretIn(t, "the hub's log", h.log.String(), c.token.Reveal(), rotated.Reveal(), p.credential)
}

// A hub cluster too slow to answer within the handshake leaves the token unredeemed,
// not redeemed by an agent that never got its credential: the same agent's next attempt
// gets in. The write that takes too long is the credential's, never stored, or the
// redemption's own, stored though the hub never heard so; meanwhile another writer of
// the cluster's status (a dispatcher woken by the redemption) moves it on.
func TestARedemptionAnsweredTooLateCanBeMadeAgain(t *testing.T) {
	for _, tc := range []struct {
		name string
		// late says whether the request is the one that takes too long.
		late func(c *cluster, req any) bool
		// stored says whether the API server stores it in the end.
		stored bool
	}{
		{"the credential's write", func(c *cluster, req any) bool {
			sec, ok := req.(*corev1ac.SecretApplyConfiguration)
			return ok && sec.Name != nil && *sec.Name == tunnel.CredentialSecretName(c.name)
		}, false},
		{"the redemption's write", func(c *cluster, req any) bool {
			wc, ok := req.(*v1alpha1.WorkerCluster)
			return ok && wc.Name == c.name && wc.Status.Enrollment != nil
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, "late-"+strings.ReplaceAll(strings.TrimPrefix(tc.name, "the "), "'s write", ""))
			plain, err := client.NewWithWatch(planes[0].Config, client.Options{Scheme: admin().Scheme()})
			if err != nil {
				t.Fatal(err)
			}
			var late atomic.Bool
			// lateAnswer makes the request when the API server stores it, then answers only
			// once the handshake is over, after another writer moved the status on.
			lateAnswer := func(ctx context.Context, do func(context.Context) error) error {
				var err error
				if tc.stored {
					err = do(context.WithoutCancel(ctx))
				}
				if _, rerr := conditions.NewWriter(admin()).Record(context.WithoutCancel(ctx), types.NamespacedName{Namespace: c.ns, Name: c.name},
					conditions.Placed{Pool: "us", Placement: v1alpha1.PlacementDisabled}); rerr != nil {
					t.Error(rerr)
				}
				<-ctx.Done()
				if err != nil {
					return err
				}
				return ctx.Err()
			}
			slow := interceptor.NewClient(plain, interceptor.Funcs{
				Apply: func(ctx context.Context, cl client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
					if tc.late(c, obj) && late.CompareAndSwap(false, true) {
						return lateAnswer(ctx, func(ctx context.Context) error { return cl.Apply(ctx, obj, opts...) })
					}
					return cl.Apply(ctx, obj, opts...)
				},
				SubResourcePatch: func(ctx context.Context, cl client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
					if tc.late(c, obj) && late.CompareAndSwap(false, true) {
						return lateAnswer(ctx, func(ctx context.Context) error { return cl.SubResource(sub).Patch(ctx, obj, patch, opts...) })
					}
					return cl.SubResource(sub).Patch(ctx, obj, patch, opts...)
				},
			})
			h := startHub(t, nil, func(o *tunnel.Options) { o.Client, o.HandshakeTimeout = slow, 5*time.Second })
			key, _ := protocol.NewRedemptionKey()
			enroll := request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal(), key: key.Reveal()}

			ws, resp, err := h.dial(t.Context(), enroll)
			if ws != nil {
				_ = ws.Close()
				t.Fatal("the agent was admitted though the hub never heard its redemption was stored")
			}
			if resp == nil || resp.StatusCode != http.StatusServiceUnavailable || !late.Load() {
				t.Fatalf("the first attempt was answered %v (%v), an answer came late: %v; want 503 after a late answer", resp, err, late.Load())
			}
			h.issued(t, enroll)
			noSecretIn(t, "the hub's log", h.log.String(), c.token.Reveal())
		})
	}
}

// A flood of garbage does not hide a replayed token from the operator: refusals of a
// secret shaped as the hub issues them are logged within a budget of their own, not
// the one garbage exhausts.
func TestAFloodOfGarbageDoesNotHideAReplayedToken(t *testing.T) {
	k := newCounted(t)
	h := startHub(t, k, nil)
	c := newCluster(t, "flooded")
	k.sees(t, c)
	h.enroll(t, c)

	// Garbage, without a break, from before the replay until after it.
	stop := make(chan struct{})
	var flood sync.WaitGroup
	var sent atomic.Int64
	for range 4 {
		flood.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ws, _, _ := h.dial(t.Context(), request{identity: c.identity, kind: protocol.AuthEnrollment})
				if ws != nil {
					_ = ws.Close()
				}
				sent.Add(1)
			}
		})
	}
	eventually(t, "the garbage past the log's budget", func() (bool, string) {
		return strings.Contains(h.log.String(), "requests not logged"), fmt.Sprintf("%d sent", sent.Load())
	})
	h.refused(t, request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal()})
	close(stop)
	flood.Wait()
	if !strings.Contains(h.log.String(), "already redeemed") {
		t.Fatalf("the replayed token's refusal is not in the hub's log (%d requests of garbage)", sent.Load())
	}
}

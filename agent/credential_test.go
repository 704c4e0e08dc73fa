package agent_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

const identity = "4-acme-gpu-a"

var (
	// Shaped as the hub issues them; the agent judges none of them by that shape.
	storedCredential  = protocol.Secret("flt1_" + strings.Repeat("a", 59))
	rotatedCredential = protocol.Secret("flt1_" + strings.Repeat("b", 59))
	enrollmentToken   = protocol.Secret("flt1_" + strings.Repeat("t", 59))
	// expiry of the stored credential.
	expiry = time.Date(2031, 3, 1, 12, 0, 0, 0, time.UTC)
)

// fakeHub is enough of a hub to drive the agent's handling of its credential: it admits
// the one credential it holds and refuses every other secret with 401 and no detail,
// as the hub does, and hands each admitted tunnel to the test once the hello is read.
type fakeHub struct {
	url     string
	tunnels chan *hubTunnel

	mu    sync.Mutex
	dials []string // the Flotilla-Auth of each dial, admitted or not
}

// hubTunnel is the hub's end of one admitted tunnel.
type hubTunnel struct {
	tun  *protocol.Tunnel
	conn *protocol.Conn
	msgs chan any // what the agent sends after its hello; closed with the tunnel
}

// startHub is a fakeHub admitting admit, or nothing when admit is empty.
func startHub(t *testing.T, admit protocol.Secret) *fakeHub {
	t.Helper()
	h := &fakeHub{tunnels: make(chan *hubTunnel, 8)}
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := r.Header.Get(protocol.HeaderAuth)
		h.mu.Lock()
		h.dials = append(h.dials, kind)
		h.mu.Unlock()
		if admit == "" || kind != protocol.AuthCredential || r.Header.Get("Authorization") != "Bearer "+admit.Reveal() {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		ws, err := up.Upgrade(w, r, http.Header{protocol.HeaderProtocol: {strconv.Itoa(protocol.ProtocolVersion)}})
		if err != nil {
			return
		}
		tun, err := protocol.NewTunnel(ws, false, liveness)
		if err != nil {
			_ = ws.Close()
			return
		}
		defer tun.Close()
		stream, err := tun.AcceptStream()
		if err != nil {
			return
		}
		ht := &hubTunnel{tun: tun, conn: protocol.NewConn(stream), msgs: make(chan any, 64)}
		defer close(ht.msgs)
		if _, _, err := ht.conn.Receive(); err != nil {
			return
		}
		tun.HelloRead()
		h.tunnels <- ht
		for {
			_, body, err := ht.conn.Receive()
			if err != nil {
				return
			}
			ht.msgs <- body
		}
	}))
	t.Cleanup(srv.Close)
	h.url = "ws" + strings.TrimPrefix(srv.URL, "http")
	return h
}

// dialled counts the dials that presented kind.
func (h *fakeHub) dialled(kind string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, k := range h.dials {
		if k == kind {
			n++
		}
	}
	return n
}

// next is the next tunnel the hub admitted.
func (h *fakeHub) next(t *testing.T) *hubTunnel {
	t.Helper()
	select {
	case ht := <-h.tunnels:
		return ht
	case <-time.After(poll.Deadline):
		t.Fatal("the agent did not connect to the hub")
		return nil
	}
}

// answer is the agent's answer to a rotation: CredentialStored or Error, past the
// heartbeats.
func (ht *hubTunnel) answer(t *testing.T) any {
	t.Helper()
	deadline := time.After(poll.Deadline)
	for {
		select {
		case m, ok := <-ht.msgs:
			if !ok {
				t.Fatal("the tunnel closed before the agent answered the rotation")
			}
			switch m.(type) {
			case *protocol.CredentialStored, *protocol.Error:
				return m
			}
		case <-deadline:
			t.Fatal("the agent did not answer the rotation")
		}
	}
}

// liveness is fast enough that a tunnel the hub closes is noticed within a test's
// patience.
var liveness = protocol.Liveness{Interval: 200 * time.Millisecond, Timeout: 2 * time.Second}

// noApply is an applier for tests that send no desired state.
type noApply struct{}

func (noApply) Apply(context.Context, protocol.DesiredState) protocol.Applied {
	return protocol.Applied{}
}

// worker is the agent's Secret in a namespace of the worker cluster's own, holding cred
// expiring at expires as the agent stores it: applied under the agent's field manager,
// so that a key the agent leaves out of a later apply is dropped.
type worker struct {
	client client.Client
	secret types.NamespacedName
}

func newWorker(t *testing.T, cred protocol.Secret, expires time.Time) worker {
	t.Helper()
	c := planes[0].Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "agent-"}}
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), ns) })
	w := worker{client: c, secret: types.NamespacedName{Namespace: ns.Name, Name: "flotilla-agent-credential"}}
	sec := corev1ac.Secret(w.secret.Name, w.secret.Namespace).
		WithType(corev1.SecretTypeOpaque).
		WithData(map[string][]byte{agent.CredentialKey: []byte(cred.Reveal()), agent.ExpiresAtKey: []byte(expires.Format(time.RFC3339))})
	if err := c.Apply(t.Context(), sec, client.FieldOwner(agent.FieldManager), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	return w
}

// storedSecret is the agent's Secret's data.
func storedSecret(t *testing.T, w worker) map[string][]byte {
	t.Helper()
	var sec corev1.Secret
	if err := w.client.Get(t.Context(), w.secret, &sec); err != nil {
		t.Fatal(err)
	}
	return sec.Data
}

// runAgent runs an agent of the hub with the client and clock, its options changed by
// with, until the returned stop, or the test's end.
func runAgent(t *testing.T, h *fakeHub, w worker, now time.Time, token protocol.Secret, log *logtest.Buffer, with ...func(*agent.Options)) (stop func()) {
	t.Helper()
	opts := agent.Options{
		HubURL: h.url, Identity: identity, EnrollmentToken: token, CredentialSecret: w.secret,
		Client: w.client, Applier: noApply{}, Liveness: liveness,
		Backoff: wait.Backoff{Duration: 20 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: 200 * time.Millisecond},
		Log:     log.Logger(), Now: func() time.Time { return now },
	}
	for _, f := range with {
		f(&opts)
	}
	a, err := agent.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-ran; !errors.Is(err, context.Canceled) {
				t.Errorf("Run: %v, want context.Canceled", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// noSecretIn fails the test if text holds any of the secrets; it never prints them.
func noSecretIn(t *testing.T, what, text string, secrets ...protocol.Secret) {
	t.Helper()
	for i, s := range secrets {
		if s != "" && strings.Contains(text, s.Reveal()) {
			t.Errorf("%s holds secret %d of %d", what, i+1, len(secrets))
		}
	}
}

// A rotation whose credential the agent could not present is refused: the stored
// credential stays, in the Secret and in memory, the agent does not confirm the
// rotation, and it says why in its log and to the hub. The hub, unconfirmed, keeps
// accepting the stored credential, with which the agent comes back.
func TestARotationWithAnUnusableCredentialIsRefusedAndTheStoredOneKept(t *testing.T) {
	tests := []struct {
		name    string
		rotated protocol.Secret
		reason  string
	}{
		{"empty", "", "it is empty"},
		{"padding alone", "==", "it is not a bearer token"},
		{"with a space", rotatedCredential[:20] + " " + rotatedCredential[20:], "it is not a bearer token"},
		{"with a line break", rotatedCredential + "\r\nX-Injected: 1", "it is not a bearer token"},
		{"padding before its end", rotatedCredential[:20] + "=" + rotatedCredential[20:], "it is not a bearer token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := startHub(t, storedCredential)
			w := newWorker(t, storedCredential, expiry)
			log := &logtest.Buffer{}
			runAgent(t, h, w, expiry.Add(-24*time.Hour), "", log)
			ht := h.next(t)

			if err := ht.conn.Send(protocol.TypeRotateCredential, &protocol.RotateCredential{Credential: tt.rotated, ExpiresAt: expiry.Add(90 * 24 * time.Hour)}); err != nil {
				t.Fatal(err)
			}
			switch m := ht.answer(t).(type) {
			case *protocol.CredentialStored:
				t.Errorf("the agent confirmed storing the unusable credential (fingerprint %s)", m.Fingerprint)
			case *protocol.Error:
				if m.Code != protocol.CodeMalformed || !strings.Contains(m.Message, tt.reason) {
					t.Errorf("the agent's refusal: code %q, message %q; want %s saying %q", m.Code, m.Message, protocol.CodeMalformed, tt.reason)
				}
				noSecretIn(t, "the agent's refusal", m.Message, tt.rotated, storedCredential)
			}
			data := storedSecret(t, w)
			if got := protocol.Secret(data[agent.CredentialKey]); got != storedCredential {
				t.Errorf("the Secret's credential changed (%d bytes now), want the stored one kept", len(got))
			}
			if got := string(data[agent.ExpiresAtKey]); got != expiry.Format(time.RFC3339) {
				t.Errorf("the Secret's expiry is %q, want the stored one's, %s", got, expiry.Format(time.RFC3339))
			}
			if !strings.Contains(log.String(), "refused the rotated credential") || !strings.Contains(log.String(), `reason="`+tt.reason) {
				t.Errorf("the agent's log does not say it refused the rotation, and why:\n%s", log.String())
			}

			if t.Failed() {
				return // what it holds is not what the hub admits
			}
			// The hub drops the tunnel; the agent comes back with what it holds.
			_ = ht.tun.Close()
			h.next(t)
			noSecretIn(t, "the agent's log", log.String(), tt.rotated, storedCredential)
		})
	}
}

// An agent whose credential expired tells the operator that the cluster needs a new
// enrollment token at every attempt, and again once restarted: the enrollment attempt
// that follows the refusal keeps the credential's expiry in the Secret beside the
// redemption key it stores. The agent still holds the enrollment token it redeemed
// long ago, as the chart keeps it.
func TestAnExpiredCredentialIsReportedAtEveryAttemptAndAfterARestart(t *testing.T) {
	h := startHub(t, "") // refuses the expired credential and the redeemed token
	w := newWorker(t, storedCredential, expiry)
	now := expiry.Add(time.Hour)
	instruction := "the agent credential expired at " + expiry.Format(time.RFC3339) + " and the hub no longer accepts it: the cluster needs a new enrollment token; run `flotilla cluster rotate-token gpu-a`"

	first := &logtest.Buffer{}
	stop := runAgent(t, h, w, now, enrollmentToken, first)
	poll.Until(t, "two enrollment attempts", func() (bool, string) {
		n := h.dialled(protocol.AuthEnrollment)
		return n >= 2, strconv.Itoa(n) + " so far"
	})
	stop()
	if n := strings.Count(first.String(), instruction); n < 2 {
		t.Errorf("the agent told the operator %d times in %d refused attempts, want every time:\n%s", n, h.dialled(protocol.AuthCredential), first.String())
	}
	data := storedSecret(t, w)
	if got := string(data[agent.ExpiresAtKey]); got != expiry.Format(time.RFC3339) {
		t.Errorf("after the enrollment attempts the Secret's expiry is %q, want %s", got, expiry.Format(time.RFC3339))
	}
	if protocol.Secret(data[agent.CredentialKey]) != storedCredential || len(data[agent.RedemptionKeyKey]) == 0 {
		t.Errorf("after the enrollment attempts the Secret holds %d credential and %d redemption key bytes, want the stored credential and a key", len(data[agent.CredentialKey]), len(data[agent.RedemptionKeyKey]))
	}

	restarted := &logtest.Buffer{}
	before := h.dialled(protocol.AuthEnrollment)
	runAgent(t, h, w, now, enrollmentToken, restarted)
	// The instruction is logged before the enrollment attempt that follows it.
	poll.Until(t, "the restarted agent's enrollment attempt", func() (bool, string) {
		n := h.dialled(protocol.AuthEnrollment) - before
		return n >= 1, strconv.Itoa(n) + " so far"
	})
	if !strings.Contains(restarted.String(), instruction) {
		t.Errorf("the restarted agent does not tell the operator that its credential expired:\n%s", restarted.String())
	}
	noSecretIn(t, "the agent's log", first.String()+restarted.String(), storedCredential, enrollmentToken)
}

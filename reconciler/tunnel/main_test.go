package tunnel_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/gorilla/websocket"
	"github.com/hashicorp/yamux"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// planes[0] is the hub cluster.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	if os.Getenv(peersEnv) != "" {
		os.Exit(runPeers())
	}
	// The informer caches log through controller-runtime; the tests read the hub's own log.
	ctrllog.SetLogger(logr.Discard())
	controlplane.Main(m, 1, &planes, controlplane.Options{})
}

func admin() client.Client { return planes[0].Client }

// fast liveness, so that a dead peer is noticed within a test's patience.
var fast = protocol.Liveness{Interval: 200 * time.Millisecond, Timeout: 2 * time.Second}

// counted is a client and an informer cache of the hub cluster, as the hub wires them,
// over one connection that counts every request sent to the API server.
type counted struct {
	client   client.Client
	cache    cache.Cache
	requests atomic.Int64
}

func newCounted(t testing.TB) *counted {
	t.Helper()
	c := &counted{}
	cfg := rest.CopyConfig(planes[0].Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			c.requests.Add(1)
			return rt.RoundTrip(r)
		})
	})
	var err error
	if c.client, err = client.New(cfg, client.Options{Scheme: admin().Scheme()}); err != nil {
		t.Fatal(err)
	}
	hasIdentity, err := labels.NewRequirement(v1alpha1.WorkerClusterLabel, selection.Exists, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The selection cmd/flotilla-hub makes: the WorkerClusters flotilla manages and the
	// Secrets labelled with an identity.
	c.cache, err = cache.New(cfg, cache.Options{
		Scheme: admin().Scheme(),
		ByObject: map[client.Object]cache.ByObject{
			&v1alpha1.WorkerCluster{}: {Label: labels.SelectorFromSet(labels.Set{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue})},
			&corev1.Secret{}:          {Label: labels.NewSelector().Add(*hasIdentity)},
		},
		ReaderFailOnMissingInformer: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := tunnel.IndexIdentities(ctx, c.cache); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{&v1alpha1.WorkerCluster{}, &corev1.Secret{}} {
		if _, err := c.cache.GetInformer(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() { _ = c.cache.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if !c.cache.WaitForCacheSync(t.Context()) {
		t.Fatal("the cache did not sync")
	}
	return c
}

// sees waits until the cache holds the cluster's WorkerCluster as the hub cluster does:
// an agent that dials before then is refused as unknown, and retries.
func (k *counted) sees(t testing.TB, c *cluster) {
	t.Helper()
	want := c.wc(t)
	eventually(t, "the hub's cache has "+c.identity, func() (bool, string) {
		var wc v1alpha1.WorkerCluster
		err := k.cache.Get(t.Context(), c.key(), &wc)
		return err == nil && wc.ResourceVersion == want.ResourceVersion, fmt.Sprint(err)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func slogTo(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// clock is the hub's time in a test, moved by hand.
type clock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// hub is a tunnel server on a loopback address.
type hub struct {
	srv    *tunnel.Server
	addr   string
	log    *logtest.Buffer
	client client.Client
}

// startHub serves a tunnel whose client and reader are those of k, or the admin
// client when k is nil.
func startHub(t testing.TB, k *counted, mod func(*tunnel.Options)) *hub {
	t.Helper()
	h := &hub{log: &logtest.Buffer{}, client: admin()}
	opts := tunnel.Options{Client: admin(), Liveness: fast, AllowInsecureLoopback: true,
		Log: slogTo(h.log)}
	if k != nil {
		opts.Client, opts.Reader, opts.IdentityIndexed, h.client = k.client, k.cache, true, k.client
	}
	if mod != nil {
		mod(&opts)
	}
	srv, err := tunnel.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(protocol.Path, srv)
	hs := &http.Server{Handler: mux}
	done := make(chan struct{})
	go func() { _ = hs.Serve(l); close(done) }()
	t.Cleanup(func() {
		_ = hs.Close()
		<-done
		srv.Close()
	})
	h.srv, h.addr = srv, l.Addr().String()
	return h
}

func (h *hub) url() string { return "ws://" + h.addr }

// cluster is a WorkerCluster on the hub with its enrollment token.
type cluster struct {
	ns, name, identity string
	token              secrets.Token
}

var clusters atomic.Int64

// newCluster creates a WorkerCluster, in a namespace of its own, as the hub would from
// a fleet repository.
func newCluster(t testing.TB, name string) *cluster {
	t.Helper()
	n := clusters.Add(1)
	c := &cluster{ns: fmt.Sprintf("tenant-%s-%d", name, n), name: name, identity: fmt.Sprintf("%d-%s", n, name)}
	if err := admin().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}); err != nil {
		t.Fatal(err)
	}
	var err error
	if c.token, err = secrets.NewToken(); err != nil {
		t.Fatal(err)
	}
	c.create(t)
	return c
}

// create creates the cluster's WorkerCluster (again, after a removal).
func (c *cluster) create(t testing.TB) {
	t.Helper()
	wc := &v1alpha1.WorkerCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: c.name, Labels: map[string]string{
			v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.WorkerClusterLabel: c.identity,
		}},
		Spec: v1alpha1.WorkerClusterSpec{Region: "r", Residency: "eu", Preset: "gpu", EnrollmentTokenHash: c.token.Hash().String()},
	}
	if err := admin().Create(t.Context(), wc); err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) key() client.ObjectKey { return client.ObjectKey{Namespace: c.ns, Name: c.name} }

func (c *cluster) wc(t testing.TB) *v1alpha1.WorkerCluster {
	t.Helper()
	var wc v1alpha1.WorkerCluster
	if err := admin().Get(t.Context(), c.key(), &wc); err != nil {
		t.Fatal(err)
	}
	return &wc
}

// credentialSecret is the hub's Secret of the cluster's agent credential, as stored;
// nil when there is none.
func (c *cluster) credentialSecret(t *testing.T) *corev1.Secret {
	t.Helper()
	var sec corev1.Secret
	err := admin().Get(t.Context(), client.ObjectKey{Namespace: c.ns, Name: tunnel.CredentialSecretName(c.name)}, &sec)
	if client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	if err != nil {
		return nil
	}
	return &sec
}

// request is an upgrade request as an agent makes it.
type request struct {
	identity, kind, secret, key string
}

func (r request) header() http.Header {
	h := http.Header{}
	if r.secret != "" {
		h.Set("Authorization", "Bearer "+r.secret)
	}
	h.Set(protocol.HeaderIdentity, r.identity)
	h.Set(protocol.HeaderAuth, r.kind)
	h.Set(protocol.HeaderProtocol, strconv.Itoa(protocol.ProtocolVersion))
	if r.key != "" {
		h.Set(protocol.HeaderRedemptionKey, r.key)
	}
	return h
}

// dial makes the upgrade request; the response is nil when the connection failed.
func (h *hub) dial(ctx context.Context, r request) (*websocket.Conn, *http.Response, error) {
	ws, resp, err := websocket.DefaultDialer.DialContext(ctx, h.url()+protocol.Path, r.header())
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	return ws, resp, err
}

// refused dials and fails the test unless the hub answers 401.
func (h *hub) refused(t *testing.T, r request) {
	t.Helper()
	ws, resp, err := h.dial(t.Context(), r)
	if ws != nil {
		_ = ws.Close()
	}
	if resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("answered %v (%v), want 401", resp, err)
	}
}

// peer is an agent at the protocol level: it does exactly what a test makes it do.
type peer struct {
	tunnel     *protocol.Tunnel
	stream     *yamux.Stream
	conn       *protocol.Conn
	credential string // issued by the hub when the peer enrolled
}

// connect dials with r, opens the control stream and, when hello is set, says hello.
func (h *hub) connect(t testing.TB, r request, hello bool) *peer {
	t.Helper()
	ws, resp, err := h.dial(t.Context(), r)
	if err != nil {
		t.Fatalf("dial as %s: %v (%v)", r.identity, err, resp)
	}
	tn, err := protocol.NewTunnel(ws, true, fast)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tn.Close() })
	st, err := tn.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{tunnel: tn, stream: st, conn: protocol.NewConn(st), credential: resp.Header.Get(protocol.HeaderCredential)}
	if hello {
		if err := p.conn.Send(protocol.TypeHello, &protocol.Hello{Identity: r.identity, AgentVersion: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// enroll redeems the cluster's token and says hello; the hub then knows the agent as
// connected.
func (h *hub) enroll(t testing.TB, c *cluster) *peer {
	t.Helper()
	p := h.connect(t, request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal()}, true)
	if _, err := secrets.ParseToken(p.credential); err != nil {
		t.Fatalf("enrolling %s issued no credential: %v", c.identity, err)
	}
	eventually(t, c.identity+" connected", func() (bool, string) { return h.srv.Connected(c.identity), "not connected" })
	return p
}

// eventually waits for cond, as every test of the package does.
var eventually = poll.Until

func condition(wc *v1alpha1.WorkerCluster, typ string) *metav1.Condition {
	for i := range wc.Status.Conditions {
		if wc.Status.Conditions[i].Type == typ {
			return &wc.Status.Conditions[i]
		}
	}
	return nil
}

// noSecretIn fails the test when text contains a secret.
func noSecretIn(t *testing.T, what, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			t.Fatalf("%s contains a secret", what)
		}
	}
}

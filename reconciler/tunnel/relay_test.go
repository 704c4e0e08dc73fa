package tunnel_test

import (
	"bufio"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// leaderProxy is the leader's API proxy on a loopback address of its own, which it
// can stop and serve again on, as a Service's address outlives the Pods behind it.
type leaderProxy struct {
	t      *testing.T
	proxy  *tunnel.Proxy
	addr   string
	cert   tls.Certificate
	server *http.Server
}

func (l *leaderProxy) start() {
	t := l.t
	t.Helper()
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		t.Fatal(err)
	}
	l.addr = ln.Addr().String()
	l.server = &http.Server{Handler: l.proxy, TLSConfig: &tls.Config{Certificates: []tls.Certificate{l.cert}, NextProtos: []string{"h2", "http/1.1"}}}
	go func() { _ = l.server.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = l.server.Close() })
}

// stop ends the leader's proxy and every connection it held, as a Pod that goes.
func (l *leaderProxy) stop() { _ = l.server.Close() }

// relayWorld is a leader that holds an agent's tunnel and serves its proxy, and a
// standby, a tunnel server of its own that holds no tunnel, whose proxy relays to it.
type relayWorld struct {
	*proxyHub
	leader  *leaderProxy
	standby *httptest.Server
	worker  *proxied
}

func newRelayWorld(t *testing.T, name string) *relayWorld {
	t.Helper()
	h := startProxyHub(t, tunnel.ProxyOptions{})
	wk := h.enrollProxied(t, name)
	// The certificate httptest made for the hub's proxy serves the leader's too.
	cert := h.proxy.TLS.Certificates[0]
	bundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h.proxy.Certificate().Raw})
	opts := tunnel.ProxyOptions{ResumeWindow: 30 * time.Second, Log: slogTo(h.log)}
	leader := &leaderProxy{t: t, addr: "127.0.0.1:0", cert: cert}
	var err error
	if leader.proxy, err = tunnel.NewProxy(h.srv, withLeader(opts, "", bundle)); err != nil {
		t.Fatal(err)
	}
	leader.start()
	standbyTunnels := startHub(t, nil, nil)
	standbyProxy, err := tunnel.NewProxy(standbyTunnels.srv, withLeader(opts, "https://"+leader.addr, bundle))
	if err != nil {
		t.Fatal(err)
	}
	standby := httptest.NewUnstartedServer(standbyProxy)
	standby.EnableHTTP2 = true
	standby.StartTLS()
	t.Cleanup(standby.Close)
	return &relayWorld{proxyHub: h, leader: leader, standby: standby, worker: wk}
}

// withLeader is opts relaying to leader; every replica of a hub that relays has one,
// the leader's own pointing at itself.
func withLeader(opts tunnel.ProxyOptions, leader string, bundle []byte) tunnel.ProxyOptions {
	if leader == "" {
		leader = "https://127.0.0.1:1" // the leader reaches its workers itself
	}
	opts.Leader, opts.LeaderTrust = leader, func() []byte { return bundle }
	return opts
}

// viaStandby sends a request through the standby's proxy.
func (r *relayWorld) viaStandby(t *testing.T, token, path string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, r.standby.URL+tunnel.ProxyPathPrefix+r.worker.identity+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := r.standby.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestAStandbyRelaysToTheLeaderWhatItHoldsNoTunnelFor(t *testing.T) {
	r := newRelayWorld(t, "relay-get")
	resp := r.viaStandby(t, r.worker.token.Reveal(), "/api/v1/namespaces/default")
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"name":"default"`) {
		t.Fatalf("a GET through the standby: %d %s", resp.StatusCode, body)
	}
	if hdr, _ := r.worker.seen.last(); hdr.Get("Authorization") != "" || hdr.Get("X-Flotilla-Relayed") != "" {
		t.Errorf("the worker got the caller's token or the relay's mark: %v", hdr)
	}

	// The standby checks the token itself, and refuses as the leader does.
	other := r.enrollProxied(t, "relay-other")
	resp = r.viaStandby(t, other.token.Reveal(), "/api/v1/namespaces/default")
	if body := readAll(t, resp); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("another worker's token through the standby: %d %s", resp.StatusCode, body)
	}
	if !strings.Contains(r.log.String(), "not this identity's proxy token") {
		t.Error("the standby's refusal is not logged with its reason")
	}
}

// A watch the standby relays does not end when the leader's proxy goes: it resumes
// from the last resourceVersion through the proxy that serves next, and passes on
// what changed meanwhile.
func TestAWatchAStandbyRelaysOutlivesTheLeader(t *testing.T) {
	r := newRelayWorld(t, "relay-watch")
	label := "relay-watch-" + r.worker.identity
	mkNamespace := func(name string) {
		t.Helper()
		if err := admin().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"relay": label}}}); err != nil {
			t.Fatal(err)
		}
	}
	resp := r.viaStandby(t, r.worker.token.Reveal(), "/api/v1/namespaces?watch=true&labelSelector=relay%3D"+label)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a watch through the standby: %d %s", resp.StatusCode, readAll(t, resp))
	}
	defer resp.Body.Close()
	events := bufio.NewScanner(resp.Body)
	events.Buffer(nil, 1<<20)
	next := func(want string) {
		t.Helper()
		if !events.Scan() {
			t.Fatalf("the watch through the standby ended waiting for %s: %v", want, events.Err())
		}
		if !strings.Contains(events.Text(), `"name":"`+want+`"`) {
			t.Fatalf("got %s, want the event of %s", events.Text(), want)
		}
	}
	first := fmt.Sprintf("%s-a", label)
	mkNamespace(first)
	next(first)

	r.leader.stop()
	// Made while no leader serves: the resumed watch passes it on.
	second := fmt.Sprintf("%s-b", label)
	mkNamespace(second)
	r.leader.start()
	next(second)
}

// While the leader cannot be reached, the standby holds a new watch open for a worker
// that was connected, and refuses one for a worker whose agent had left, at once: that
// worker must count as lost.
func TestAStandbyHoldsOnlyForAWorkerThatWasConnected(t *testing.T) {
	r := newRelayWorld(t, "relay-hold")
	r.leader.stop()
	resp := r.viaStandby(t, r.worker.token.Reveal(), "/api/v1/namespaces?watch=true")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a watch for a connected worker while no leader serves: %d %s, want 200 at once", resp.StatusCode, readAll(t, resp))
	}
	_ = resp.Body.Close()

	_ = r.worker.peer.tunnel.Close()
	poll.Until(t, "the hub records the agent gone", func() (bool, string) {
		wc := r.worker.wc(t)
		c := apimeta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionConnected)
		return c != nil && c.Status == metav1.ConditionFalse, fmt.Sprintf("%v", c)
	})
	for _, path := range []string{"/api/v1/namespaces?watch=true", "/api"} {
		resp := r.viaStandby(t, r.worker.token.Reveal(), path)
		if body := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("%s for a worker whose agent left, while no leader serves: %d %s, want 503", path, resp.StatusCode, body)
		}
	}
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

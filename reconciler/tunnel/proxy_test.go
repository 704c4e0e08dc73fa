package tunnel_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/agent/proxy"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// seen is what a peer's API end received.
type seen struct {
	mu      sync.Mutex
	headers []http.Header
	paths   []string
}

func (s *seen) last() (http.Header, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.paths) == 0 {
		return nil, ""
	}
	return s.headers[len(s.headers)-1], s.paths[len(s.paths)-1]
}

// serveProxy makes the peer serve the hub's proxy streams as an agent does, passing each
// request on to the hub cluster's API server (standing in for the worker's) as its
// admin, and recording what arrived. rewrite, when given, changes each request on its
// way to the API server.
func (p *peer) serveProxy(t testing.TB, rewrite ...func(*httputil.ProxyRequest)) *seen {
	t.Helper()
	target, err := url.Parse(planes[0].Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(planes[0].Config)
	if err != nil {
		t.Fatal(err)
	}
	got := &seen{}
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(target)
		for _, f := range rewrite {
			f(pr)
		}
	}, Transport: rt, FlushInterval: -1}
	l := proxy.NewListener(64)
	go func() {
		for {
			st, err := p.tunnel.AcceptStream()
			if err != nil {
				_ = l.Close()
				return
			}
			if k, err := protocol.ReadStreamKind(st); err != nil || k != protocol.StreamProxy || !l.Offer(st) {
				_ = st.Close()
			}
		}
	}()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.mu.Lock()
		got.headers = append(got.headers, r.Header.Clone())
		got.paths = append(got.paths, r.URL.RequestURI())
		got.mu.Unlock()
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return got
}

// proxied is a cluster enrolled with a peer that serves the proxy, and its proxy token.
type proxied struct {
	*cluster
	peer  *peer
	seen  *seen
	token secrets.Token
}

// proxyHub is a tunnel server with its API proxy on a loopback address.
type proxyHub struct {
	*hub
	proxy *httptest.Server
}

func startProxyHub(t testing.TB, opts tunnel.ProxyOptions) *proxyHub {
	t.Helper()
	h := startHub(t, nil, nil)
	if opts.Log == nil {
		opts.Log = slogTo(h.log)
	}
	// TLS and HTTP/2, as Kueue's clients speak to the proxy.
	proxy, err := tunnel.NewProxy(h.srv, opts)
	if err != nil {
		t.Fatal(err)
	}
	ps := httptest.NewUnstartedServer(proxy)
	ps.EnableHTTP2 = true
	ps.StartTLS()
	t.Cleanup(ps.Close)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the hub's log:\n%s", h.log)
		}
	})
	return &proxyHub{hub: h, proxy: ps}
}

func (h *proxyHub) enrollProxied(t testing.TB, name string) *proxied {
	t.Helper()
	c := newCluster(t, name)
	h.srv.Push(c.key(), c.identity, &protocol.DesiredState{Generation: 1, Hash: "h1"})
	p := h.enroll(t, c)
	pc := &proxied{cluster: c, peer: p, seen: p.serveProxy(t)}
	var err error
	if pc.token, err = h.srv.IssueProxyToken(t.Context(), c.wc(t)); err != nil {
		t.Fatal(err)
	}
	return pc
}

// get sends a GET through the proxy with the bearer token.
func (h *proxyHub) get(t testing.TB, identity, token, path string) (int, string) {
	t.Helper()
	return h.do(t, http.MethodGet, identity, token, path, nil, nil)
}

func (h *proxyHub) do(t testing.TB, method, identity, token, path string, body io.Reader, hdr http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, h.proxy.URL+tunnel.ProxyPathPrefix+identity+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := h.proxy.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestAProxyTokenOpensOnlyItsOwnWorker(t *testing.T) {
	h := startProxyHub(t, tunnel.ProxyOptions{})
	a := h.enrollProxied(t, "proxy-a")
	b := h.enrollProxied(t, "proxy-b")
	other, err := secrets.NewToken()
	if err != nil {
		t.Fatal(err)
	}

	code, body := h.get(t, a.identity, a.token.Reveal(), "/api/v1/namespaces/default")
	if code != http.StatusOK || !strings.Contains(body, `"name":"default"`) {
		t.Fatalf("a's token on a's worker: %d %s", code, body)
	}
	var unauthorized string
	for _, tc := range []struct{ name, identity, token string }{
		{"another worker's token", a.identity, b.token.Reveal()},
		{"a token never issued", a.identity, other.Reveal()},
		{"a token of another shape", a.identity, "not-a-token"},
		{"no token", a.identity, ""},
		{"an identity the hub does not know", "99-nobody", a.token.Reveal()},
		{"the agent's own credential", a.identity, a.peer.credential},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := h.get(t, tc.identity, tc.token, "/api/v1/namespaces/default")
			if code != http.StatusUnauthorized {
				t.Fatalf("answered %d %s, want 401", code, body)
			}
			// Every refusal reads the same: a caller learns nothing from it.
			if unauthorized == "" {
				unauthorized = body
			} else if body != unauthorized {
				t.Fatalf("refusals differ: %q and %q", body, unauthorized)
			}
		})
	}
	if strings.Contains(h.log.String(), a.token.Reveal()) || strings.Contains(h.log.String(), b.token.Reveal()) {
		t.Fatal("a proxy token is in the hub's log")
	}
	if !strings.Contains(h.log.String(), "not this identity's proxy token") {
		t.Fatalf("the operator's log does not say why a token was refused:\n%s", h.log)
	}

	// A new token replaces the old one at once.
	fresh, err := h.srv.IssueProxyToken(t.Context(), a.wc(t))
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := h.get(t, a.identity, a.token.Reveal(), "/api"); code != http.StatusUnauthorized {
		t.Fatalf("a replaced token answered %d", code)
	}
	if code, body := h.get(t, a.identity, fresh.Reveal(), "/api"); code != http.StatusOK {
		t.Fatalf("the new token answered %d %s", code, body)
	}
	if ok, err := h.srv.ProxyTokenValid(t.Context(), a.wc(t), fresh.Reveal()); err != nil || !ok {
		t.Fatalf("ProxyTokenValid of the new token: %v, %v", ok, err)
	}
	if ok, _ := h.srv.ProxyTokenValid(t.Context(), a.wc(t), a.token.Reveal()); ok {
		t.Fatal("ProxyTokenValid of the replaced token")
	}
	// The hash is kept, not the token.
	if sec := a.credentialSecret(t); sec == nil || strings.Contains(fmt.Sprint(sec.Data), fresh.Reveal()) || len(sec.Data["proxyTokenHash"]) == 0 {
		t.Fatalf("the credential Secret should keep the proxy token's hash only: %v", sec)
	}
}

func TestTheWorkerNeverSeesTheCallersCredentials(t *testing.T) {
	h := startProxyHub(t, tunnel.ProxyOptions{})
	a := h.enrollProxied(t, "creds")
	hdr := http.Header{"Impersonate-User": {"system:admin"}, "Impersonate-Group": {"system:masters"}, "Impersonate-Extra-Scopes": {"x"}}
	if code, body := h.do(t, http.MethodGet, a.identity, a.token.Reveal(), "/api/v1/namespaces/default", nil, hdr); code != http.StatusOK {
		t.Fatalf("answered %d %s", code, body)
	}
	got, path := a.seen.last()
	if path != "/api/v1/namespaces/default" {
		t.Fatalf("the worker got path %q, want the API path without the proxy's prefix", path)
	}
	for k := range got {
		if k == "Authorization" || strings.HasPrefix(k, "Impersonate-") {
			t.Fatalf("the worker got header %s", k)
		}
	}
}

func TestAnOlderAgentStaysConnectedButCannotBeReachedThroughTheProxy(t *testing.T) {
	h := startProxyHub(t, tunnel.ProxyOptions{})
	c := newCluster(t, "old-agent")
	h.srv.Push(c.key(), c.identity, &protocol.DesiredState{Generation: 1, Hash: "h1"})
	r := request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal()}
	hdr := r.header()
	hdr.Set(protocol.HeaderProtocol, "1")
	ws, resp, err := websocket.DefaultDialer.DialContext(t.Context(), h.url()+protocol.Path, hdr)
	if err != nil {
		t.Fatalf("a version-1 agent was refused: %v %v", err, resp)
	}
	if got := resp.Header.Get(protocol.HeaderProtocol); got != "1" {
		t.Fatalf("the hub answered protocol %q to a version-1 agent, want 1", got)
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
	conn := protocol.NewConn(st)
	conn.SetVersion(1)
	if err := conn.Send(protocol.TypeHello, &protocol.Hello{Identity: c.identity, AgentVersion: "old"}); err != nil {
		t.Fatal(err)
	}
	// The hub speaks version 1 to it: the desired state arrives and reads as such.
	env, body, err := conn.Receive()
	if err != nil || env.Version != 1 {
		t.Fatalf("first message to a version-1 agent: %+v %T %v", env, body, err)
	}
	eventually(t, "the old agent connected", func() (bool, string) {
		wc := c.wc(t)
		return wc.Status.Agent != nil && wc.Status.Agent.ProtocolVersion == 1, fmt.Sprint(wc.Status.Agent)
	})
	tok, err := h.srv.IssueProxyToken(t.Context(), c.wc(t))
	if err != nil {
		t.Fatal(err)
	}
	code, msg := h.get(t, c.identity, tok.Reveal(), "/api")
	if code != http.StatusServiceUnavailable || !strings.Contains(msg, "upgrade the agent") {
		t.Fatalf("through the proxy to a version-1 agent: %d %s", code, msg)
	}
	if !h.srv.Connected(c.identity) {
		t.Fatal("the old agent was disconnected")
	}
}

func TestTheProxyCapsBodiesAndRequestsInFlight(t *testing.T) {
	h := startProxyHub(t, tunnel.ProxyOptions{MaxBodyBytes: 1 << 10, MaxInFlight: 2})
	a := h.enrollProxied(t, "caps")
	big := strings.NewReader(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big"},"data":{"x":"` + strings.Repeat("x", 2<<10) + `"}}`)
	if code, body := h.do(t, http.MethodPost, a.identity, a.token.Reveal(), "/api/v1/namespaces/default/configmaps", big, http.Header{"Content-Type": {"application/json"}}); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body over the cap: %d %s", code, body)
	}
	// Two watches hold both places; a third request waits for neither.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for range 2 {
		w := h.openWatch(t, ctx, a, "/api/v1/namespaces/default/configmaps?watch=true")
		defer w.close()
	}
	if code, body := h.get(t, a.identity, a.token.Reveal(), "/api"); code != http.StatusTooManyRequests {
		t.Fatalf("a third request with two watches open: %d %s", code, body)
	}
	b := h.enrollProxied(t, "caps-other")
	if code, body := h.get(t, b.identity, b.token.Reveal(), "/api"); code != http.StatusOK {
		t.Fatalf("another worker while the first is at its cap: %d %s", code, body)
	}
}

// watcher reads watch events from the proxy.
type watcher struct {
	events chan event
	body   io.ReadCloser
}

type event struct {
	Type   string
	Object struct {
		Kind     string
		Metadata metav1.ObjectMeta
	}
}

func (w *watcher) close() { _ = w.body.Close() }

func (h *proxyHub) openWatch(t testing.TB, ctx context.Context, c *proxied, path string) *watcher {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.proxy.URL+tunnel.ProxyPathPrefix+c.identity+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token.Reveal())
	resp, err := h.proxy.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("watch %s: %d %s", path, resp.StatusCode, b)
	}
	w := &watcher{events: make(chan event, 100), body: resp.Body}
	go func() {
		defer close(w.events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var ev event
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				w.events <- ev
			}
		}
	}()
	return w
}

// next waits for the next event that is not a bookmark; ok is false when the watch ended.
func (w *watcher) next(t *testing.T) (event, bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.events:
			if ok && ev.Type == "BOOKMARK" {
				continue
			}
			return ev, ok
		case <-deadline:
			t.Fatal("no watch event within 30 s")
			return event{}, false
		}
	}
}

func createConfigMap(t *testing.T, ns, name string) {
	t.Helper()
	if err := admin().Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
		t.Fatal(err)
	}
}

func TestAWatchOutlivesATunnelBlipShorterThanTheWindow(t *testing.T) {
	h := startProxyHub(t, tunnel.ProxyOptions{ResumeWindow: 20 * time.Second})
	a := h.enrollProxied(t, "blip")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := h.openWatch(t, ctx, a, "/api/v1/namespaces/"+a.ns+"/configmaps?watch=true&allowWatchBookmarks=true")
	defer w.close()
	createConfigMap(t, a.ns, "before")
	if ev, ok := w.next(t); !ok || ev.Type != "ADDED" || ev.Object.Metadata.Name != "before" {
		t.Fatalf("first event %+v (open %v)", ev, ok)
	}

	// The tunnel breaks; a change happens while the agent is away; the agent redials.
	_ = a.peer.tunnel.Close()
	eventually(t, "the hub noticed the break", func() (bool, string) { return !h.srv.Connected(a.identity), "" })
	createConfigMap(t, a.ns, "during")
	back := h.connect(t, request{identity: a.identity, kind: protocol.AuthCredential, secret: a.peer.credential}, true)
	backSeen := back.serveProxy(t)
	createConfigMap(t, a.ns, "after")

	var names []string
	for len(names) < 2 {
		ev, ok := w.next(t)
		if !ok {
			t.Fatalf("the watch ended across a blip; events after it: %v", names)
		}
		names = append(names, ev.Type+" "+ev.Object.Metadata.Name)
	}
	if want := []string{"ADDED during", "ADDED after"}; strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("events after the blip %v, want %v: none lost, none repeated", names, want)
	}
	_, path := backSeen.last()
	if !strings.Contains(path, "resourceVersion=") {
		t.Fatalf("the watch was resumed without a resourceVersion: %s", path)
	}
}

func TestAWatchEndsWhenTheAgentStaysAwayPastTheWindow(t *testing.T) {
	h := startProxyHub(t, tunnel.ProxyOptions{ResumeWindow: 500 * time.Millisecond})
	a := h.enrollProxied(t, "gone")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := h.openWatch(t, ctx, a, "/api/v1/namespaces/"+a.ns+"/configmaps?watch=true")
	defer w.close()
	createConfigMap(t, a.ns, "one")
	if _, ok := w.next(t); !ok {
		t.Fatal("the watch ended before the break")
	}
	_ = a.peer.tunnel.Close()
	for {
		if _, ok := w.next(t); !ok {
			break
		}
	}
	if !strings.Contains(h.log.String(), "did not come back within the resume window") {
		t.Fatalf("the log does not say why the watch ended:\n%s", h.log)
	}
}

// TestAWatchTheWorkerEndsEndsForTheWatcher: the worker's own end of a watch (its
// timeout) is passed on, not resumed.
func TestAWatchTheWorkerEndsEndsForTheWatcher(t *testing.T) {
	h := startProxyHub(t, tunnel.ProxyOptions{})
	a := h.enrollProxied(t, "timeout")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := h.openWatch(t, ctx, a, "/api/v1/namespaces/"+a.ns+"/configmaps?watch=true&timeoutSeconds=1")
	defer w.close()
	for {
		if _, ok := w.next(t); !ok {
			break
		}
	}
	a.seen.mu.Lock()
	defer a.seen.mu.Unlock()
	if len(a.seen.paths) != 1 {
		t.Fatalf("a watch the worker ended was taken up again: %v", a.seen.paths)
	}
}

// A watch whose watcher set no timeout is taken up again when the worker's API server
// ends it on its own timeout (between 30 and 60 minutes after it started, unless asked
// otherwise): Kueue v0.17.0 may evict work when a watch to a worker ends (kueue#12999).
// The agent here asks the API server for a timeout of a second, standing in for one
// that came; what changed after it reaches the watcher on the same stream.
func TestAWatchTheWorkerTimesOutOnItsOwnGoesOn(t *testing.T) {
	h := startProxyHub(t, tunnel.ProxyOptions{})
	c := newCluster(t, "own-timeout")
	h.srv.Push(c.key(), c.identity, &protocol.DesiredState{Generation: 1, Hash: "h1"})
	p := h.enroll(t, c)
	a := &proxied{cluster: c, peer: p, seen: p.serveProxy(t, func(pr *httputil.ProxyRequest) {
		if q := pr.Out.URL.Query(); q.Get("watch") == "true" {
			q.Set("timeoutSeconds", "1")
			pr.Out.URL.RawQuery = q.Encode()
		}
	})}
	var err error
	if a.token, err = h.srv.IssueProxyToken(t.Context(), c.wc(t)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := h.openWatch(t, ctx, a, "/api/v1/namespaces/"+a.ns+"/configmaps?watch=true")
	defer w.close()
	createConfigMap(t, a.ns, "before")
	if ev, ok := w.next(t); !ok || ev.Object.Metadata.Name != "before" {
		t.Fatalf("first event %+v (open %v)", ev, ok)
	}
	eventually(t, "the worker ended the first watch and the proxy asked again", func() (bool, string) {
		a.seen.mu.Lock()
		defer a.seen.mu.Unlock()
		return len(a.seen.paths) >= 2, fmt.Sprint(a.seen.paths)
	})
	createConfigMap(t, a.ns, "after")
	if ev, ok := w.next(t); !ok || ev.Type != "ADDED" || ev.Object.Metadata.Name != "after" {
		t.Fatalf("after the worker's timeout: event %+v (open %v), want ADDED after on the same watch", ev, ok)
	}
	if _, path := a.seen.last(); !strings.Contains(path, "resourceVersion=") {
		t.Fatalf("the watch was taken up again without a resourceVersion: %s", path)
	}
}

// A watcher that stops reading holds up its own watch only: flow control stops that
// stream, and the same worker's other requests, and other workers', go on.
func TestASlowWatcherHoldsUpNoOneElse(t *testing.T) {
	h := startProxyHub(t, tunnel.ProxyOptions{})
	a := h.enrollProxied(t, "slow-a")
	b := h.enrollProxied(t, "slow-b")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Opened and never read: its events pile up until every window on the way is full.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.proxy.URL+tunnel.ProxyPathPrefix+a.identity+"/api/v1/namespaces/"+a.ns+"/configmaps?watch=true", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+a.token.Reveal())
	resp, err := h.proxy.Client().Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("watch: %v %v", resp, err)
	}
	defer resp.Body.Close()
	// About 8 MiB of events: beyond Go's HTTP/2 stream window of 4 MiB and yamux's of
	// 256 KiB, so the watch's writers on the hub and the agent block.
	payload := strings.Repeat("x", 160<<10)
	for i := range 52 {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: fmt.Sprintf("big-%02d", i)}, Data: map[string]string{"x": payload}}
		if err := admin().Create(t.Context(), cm); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []*proxied{a, b} {
		got := make(chan string, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.proxy.URL+tunnel.ProxyPathPrefix+c.identity+"/api/v1/namespaces/"+c.ns, nil)
			req.Header.Set("Authorization", "Bearer "+c.token.Reveal())
			r, err := h.proxy.Client().Do(req)
			if err != nil {
				got <- err.Error()
				return
			}
			_ = r.Body.Close()
			got <- r.Status
		}()
		select {
		case st := <-got:
			if st != "200 OK" {
				t.Fatalf("%s beside a stuck watch: %s", c.identity, st)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: a request waited 30 s behind a watcher that stopped reading", c.identity)
		}
	}
}

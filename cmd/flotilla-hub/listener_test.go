package main

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// testIdleTimeout is short, so that the tests that wait for it to pass wait little.
const testIdleTimeout = 300 * time.Millisecond

// served is one of the hub's servers as the hub runs it, on a loopback port, with the
// registry its connections are counted in.
type served struct {
	addr string
	reg  *prometheus.Registry
	// client trusts the server's certificate; nil for a server without TLS.
	client *tls.Config
	log    *logtest.Buffer
}

// serveProxy runs the API proxy's server (proxyServer behind listen, as dispatchParts
// serves it) with h in place of the tunnels' proxy.
func serveProxy(t *testing.T, h http.Handler, lim ListenerLimits) served {
	t.Helper()
	cert, pool := selfSigned(t)
	s, l := listenAs(t, "proxy", lim)
	srv := proxyServer(l.Addr().String(), h, func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil }, lim)
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	s.client = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	return s
}

// serveTunnel runs the tunnel's server without TLS, as with allowInsecureLoopback.
func serveTunnel(t *testing.T, h http.Handler, lim ListenerLimits) served {
	t.Helper()
	s, l := listenAs(t, "tunnel", lim)
	srv := tunnelServer(l.Addr().String(), h, lim)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

func listenAs(t *testing.T, name string, lim ListenerLimits) (served, net.Listener) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := newMetrics(reg, planes[0].Client)
	var log logtest.Buffer
	l, err := listen(t.Context(), "127.0.0.1:0", limitOptions{Name: name, Max: lim.Max, Counts: m.connections(name, lim.Max), Log: log.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	return served{addr: l.Addr().String(), reg: reg, log: &log}, l
}

// metric is the value of a series of the connection metrics in reg.
func metric(t *testing.T, reg *prometheus.Registry, name, listener string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "listener" && l.GetValue() == listener {
					return m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no series %s{listener=%q}", name, listener)
	return 0
}

// selfSigned is a certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "proxy"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// h2Preface is what an HTTP/2 client sends first: the connection preface and an empty
// SETTINGS frame (length 0, type 4, no flags, stream 0).
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + "\x00\x00\x00\x04\x00\x00\x00\x00\x00"

// idleConn opens a connection to s in proto (HTTP/1.1 or HTTP/2) and leaves it idle: over
// HTTP/1.1 after one request answered and kept alive, over HTTP/2 once its preface is
// sent. It returns the connection and what to read it through.
func idleConn(t *testing.T, s served, proto string) (net.Conn, io.Reader) {
	t.Helper()
	alpn := map[string]string{"HTTP/1.1": "http/1.1", "HTTP/2": "h2"}[proto]
	cfg := s.client.Clone()
	cfg.NextProtos = []string{alpn}
	c, err := tls.Dial("tcp", s.addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if got := c.ConnectionState().NegotiatedProtocol; got != alpn {
		t.Fatalf("the server speaks %q, want %q", got, alpn)
	}
	if proto == "HTTP/2" {
		if _, err := io.WriteString(c, h2Preface); err != nil {
			t.Fatal(err)
		}
		return c, c
	}
	br := bufio.NewReader(c)
	get(t, c, br)
	return c, br
}

// get sends a request over c, reads its answer through br, and fails the test unless
// it is 200 and keeps c open.
func get(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: hub\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("the answer is %s, close %t; want 200 and the connection kept", resp.Status, resp.Close)
	}
}

// untilClosedByServer reads r, c's data, until the server closes c; the test fails if it
// has not within poll's deadline.
func untilClosedByServer(t *testing.T, what string, c net.Conn, r io.Reader) {
	t.Helper()
	buf := make([]byte, 4096)
	poll.Until(t, what, func() (bool, string) {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		for {
			_, err := r.Read(buf)
			var ne net.Error
			switch {
			case err == nil:
				// The server's answer or frames: read on.
			case errors.As(err, &ne) && ne.Timeout():
				return false, "the connection is open"
			default:
				return true, ""
			}
		}
	})
}

func ok(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }

// An idle connection to the API proxy, kept alive after a request or an HTTP/2
// connection with no stream open, is closed by the proxy: any pod that reaches the
// proxy could otherwise hold such connections until the hub runs out of descriptors.
func TestProxyClosesAnIdleConnectionAfterTheIdleTimeout(t *testing.T) {
	for _, proto := range []string{"HTTP/1.1", "HTTP/2"} {
		t.Run(proto, func(t *testing.T) {
			s := serveProxy(t, http.HandlerFunc(ok), ListenerLimits{Max: 8, IdleTimeout: Duration(testIdleTimeout)})
			c, r := idleConn(t, s, proto)
			untilClosedByServer(t, "the proxy closes an idle "+proto+" connection", c, r)
			poll.Until(t, "the closed connection is given back", func() (bool, string) {
				n := metric(t, s.reg, "flotilla_hub_connections_open", "proxy")
				return n == 0, fmt.Sprintf("%v connections open", n)
			})
		})
	}
}

// A watch through the proxy is a request under way, however long: it outlives the idle
// timeout, over HTTP/2 (where its connection has a stream open) as over HTTP/1.1.
// Whether the idle timeout has passed is told by another connection, opened after the
// watch's first event and left idle: once the proxy has closed that one, it would have
// closed the watch's too, were the watch idle.
func TestProxyNeverCutsAWatchThatOutlivesTheIdleTimeout(t *testing.T) {
	for _, tt := range []struct {
		proto string
		major int
	}{{"HTTP/1.1", 1}, {"HTTP/2", 2}} {
		t.Run(tt.proto, func(t *testing.T) {
			next := make(chan struct{})
			mux := http.NewServeMux()
			mux.HandleFunc("/", ok)
			mux.HandleFunc("GET /watch", func(w http.ResponseWriter, r *http.Request) {
				rc := http.NewResponseController(w)
				_, _ = io.WriteString(w, "event 1\n")
				_ = rc.Flush()
				select {
				case <-next:
				case <-r.Context().Done():
					return
				}
				_, _ = io.WriteString(w, "event 2\n")
			})
			s := serveProxy(t, mux, ListenerLimits{Max: 8, IdleTimeout: Duration(testIdleTimeout)})

			var protocols http.Protocols
			protocols.SetHTTP1(tt.major == 1)
			protocols.SetHTTP2(tt.major == 2)
			tr := &http.Transport{TLSClientConfig: s.client.Clone(), Protocols: &protocols}
			t.Cleanup(tr.CloseIdleConnections)
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://"+s.addr+"/watch", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.ProtoMajor != tt.major {
				t.Fatalf("the watch is served over %s, want %s", resp.Proto, tt.proto)
			}
			lines := make(chan string, 3)
			go func() {
				br := bufio.NewReader(resp.Body)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						lines <- fmt.Sprintf("the watch ended: %v", err)
						return
					}
					lines <- line
				}
			}()
			if got := poll.Receive(t, "the watch's first event", lines); got != "event 1\n" {
				t.Fatalf("the watch's first line is %q", got)
			}

			sentinel, r := idleConn(t, s, tt.proto)
			untilClosedByServer(t, "the idle timeout passes (an idle connection opened after the watch began is closed)", sentinel, r)

			close(next)
			if got := poll.Receive(t, "the watch's second event", lines); got != "event 2\n" {
				t.Fatalf("after the idle timeout the watch reads %q, want its second event", got)
			}
			if got := poll.Receive(t, "the watch's end", lines); got != "the watch ended: EOF" {
				t.Fatalf("the watch ends with %q, want the handler's own end", got)
			}
		})
	}
}

// dialFails dials s over TLS and returns the error the handshake ends with, nil when
// it is admitted. A connection left waiting in the listener's queue fails the test
// once poll's deadline has passed.
func dialFails(t *testing.T, s served) error {
	t.Helper()
	type dialed struct {
		c   net.Conn
		err error
	}
	done := make(chan dialed, 1)
	go func() {
		d := tls.Dialer{Config: s.client.Clone()}
		d.Config.NextProtos = []string{"http/1.1"}
		c, err := d.DialContext(t.Context(), "tcp", s.addr)
		done <- dialed{c, err}
	}()
	got := poll.Receive(t, "the proxy answers a connection over its bound at once", done)
	if got.c != nil {
		_ = got.c.Close()
	}
	return got.err
}

// Over its bound the proxy accepts a connection and closes it at once, rather than
// leave it in the kernel's queue, and counts it; once a connection closes, a new one
// is admitted.
func TestProxyRefusesAConnectionOverItsBoundAtOnceAndCountsIt(t *testing.T) {
	const bound = 3
	s := serveProxy(t, http.HandlerFunc(ok), ListenerLimits{Max: bound, IdleTimeout: Duration(time.Hour)})
	var held []net.Conn
	for range bound {
		c, _ := idleConn(t, s, "HTTP/1.1")
		held = append(held, c)
	}
	if n := metric(t, s.reg, "flotilla_hub_connections_open", "proxy"); n != bound {
		t.Fatalf("%v connections open, want %d", n, bound)
	}
	if n := metric(t, s.reg, "flotilla_hub_connections_max", "proxy"); n != bound {
		t.Fatalf("the bound shows as %v, want %d", n, bound)
	}
	if n := metric(t, s.reg, "flotilla_hub_connections_refused_total", "proxy"); n != 0 {
		t.Fatalf("%v connections refused before any was over the bound", n)
	}

	err := dialFails(t, s)
	if err == nil {
		t.Fatalf("connection %d of a bound of %d is admitted", bound+1, bound)
	}
	if n := metric(t, s.reg, "flotilla_hub_connections_refused_total", "proxy"); n != 1 {
		t.Fatalf("%v connections counted as refused, want 1 (the handshake ended with %v)", n, err)
	}
	if got := s.log.String(); strings.Count(got, "connection refused") != 1 || !strings.Contains(got, "listener=proxy") {
		t.Errorf("the refusal is logged as\n%s\nwant one line naming the listener", got)
	}

	_ = held[0].Close()
	poll.Until(t, "the proxy gives back a closed connection", func() (bool, string) {
		n := metric(t, s.reg, "flotilla_hub_connections_open", "proxy")
		return n == bound-1, fmt.Sprintf("%v connections open", n)
	})
	c, r := idleConn(t, s, "HTTP/1.1")
	get(t, c, r.(*bufio.Reader))
	if n := metric(t, s.reg, "flotilla_hub_connections_refused_total", "proxy"); n != 1 {
		t.Fatalf("%v connections counted as refused, want still 1", n)
	}
	if n := metric(t, s.reg, "flotilla_hub_connections_open", "proxy"); n != bound {
		t.Fatalf("%v connections open, want %d", n, bound)
	}
}

// A tunnel is a connection hijacked from the server: it counts against the bound until
// its new owner closes it, and is given back once however often it is closed, so that
// the bound never grows.
func TestTunnelListenerCountsAHijackedConnectionUntilItIsClosedOnce(t *testing.T) {
	release, closed := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/", ok)
	mux.HandleFunc("GET /tunnel", func(w http.ResponseWriter, _ *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: tunnel\r\n\r\n")
		_ = brw.Flush()
		<-release
		_ = c.Close()
		_ = c.Close()
		close(closed)
	})
	s := serveTunnel(t, mux, ListenerLimits{Max: 1, IdleTimeout: Duration(time.Hour)})

	tunnel, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tunnel.Close() })
	if _, err := io.WriteString(tunnel, "GET /tunnel HTTP/1.1\r\nHost: hub\r\nConnection: Upgrade\r\nUpgrade: tunnel\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(tunnel), nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("the upgrade is answered %v (%v), want 101", resp, err)
	}

	// Over the bound while the tunnel is open.
	over, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = over.Close() })
	untilClosedByServer(t, "a connection over the bound is closed", over, over)
	if n := metric(t, s.reg, "flotilla_hub_connections_refused_total", "tunnel"); n != 1 {
		t.Fatalf("%v connections counted as refused, want 1", n)
	}

	close(release)
	poll.Receive(t, "the tunnel's owner closes it", closed)
	if n := metric(t, s.reg, "flotilla_hub_connections_open", "tunnel"); n != 0 {
		t.Fatalf("%v connections open after the tunnel was closed twice, want 0", n)
	}
	// The one place is free, and only one.
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	get(t, c, bufio.NewReader(c))
	over2, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = over2.Close() })
	untilClosedByServer(t, "a second connection over the bound of one is closed", over2, over2)
	if n := metric(t, s.reg, "flotilla_hub_connections_refused_total", "tunnel"); n != 2 {
		t.Fatalf("%v connections counted as refused, want 2", n)
	}
}

// The configuration bounds each listener, with defaults that admit a fleet of 10,000
// clusters' agents and give every other listener room enough.
func TestConfigBoundsEachListenersConnections(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		want    map[string]ListenerLimits
		refused string
	}{
		{name: "defaults", want: map[string]ListenerLimits{
			"tunnel": {Max: 20_000, IdleTimeout: Duration(2 * time.Minute)},
			"http":   {Max: 1_024, IdleTimeout: Duration(2 * time.Minute)},
			"proxy":  {Max: 1_024, IdleTimeout: Duration(2 * time.Minute)},
		}},
		{name: "set", yaml: "connections:\n  proxy: {max: 64, idleTimeout: 30s}\n  tunnel: {max: 50000}\n", want: map[string]ListenerLimits{
			"tunnel": {Max: 50_000, IdleTimeout: Duration(2 * time.Minute)},
			"http":   {Max: 1_024, IdleTimeout: Duration(2 * time.Minute)},
			"proxy":  {Max: 64, IdleTimeout: Duration(30 * time.Second)},
		}},
		{name: "negative", yaml: "connections:\n  http: {max: -1}\n", refused: "connections.http: max and idleTimeout must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := LoadConfig(writeConfig(t, goodConfig+tt.yaml))
			if tt.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tt.refused) {
					t.Fatalf("LoadConfig = %v, want it refused with %q", err, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]ListenerLimits{"tunnel": c.Connections.Tunnel, "http": c.Connections.HTTP, "proxy": c.Connections.Proxy}
			for name, want := range tt.want {
				if got[name] != want {
					t.Errorf("connections.%s = %+v, want %+v", name, got[name], want)
				}
			}
		})
	}
}

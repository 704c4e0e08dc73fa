package main

import (
	"crypto/tls"
	"net/http"
	"time"
)

// The hub's three HTTP servers and the timeouts each one's callers need. Every server
// closes a connection that has carried no request for its listener's IdleTimeout, over
// HTTP/1.1 and over the HTTP/2 that TLS negotiates alike: net/http gives its HTTP/2
// server the http.Server's IdleTimeout, and counts an HTTP/2 connection with a stream
// open as busy. What bounds how many connections each holds is its listener
// (limitListener).

// headerTimeout bounds the reading of a request's header on every server, and the TLS
// handshake before it.
const headerTimeout = 10 * time.Second

// httpServer serves /healthz, /readyz, /metrics, the webhooks and the plan pages.
// Requests here are small and answered at once: a client that trickles its request in
// is cut off. Webhook bodies are read whole before their signature can be checked, so
// reading them is bounded in time too.
func httpServer(addr string, h http.Handler, lim ListenerLimits) *http.Server {
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: headerTimeout,
		ReadTimeout: 30 * time.Second, WriteTimeout: time.Minute, IdleTimeout: time.Duration(lim.IdleTimeout)}
}

// tunnelServer serves the agents' tunnels. The upgrade request is bounded like any
// other; the tunnel it becomes must stay open, so the upgrade clears these deadlines,
// the idle timeout no longer applies to a hijacked connection, and no write timeout is
// set: the tunnel's heartbeats and send deadlines judge it from then on.
func tunnelServer(addr string, h http.Handler, lim ListenerLimits) *http.Server {
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: headerTimeout,
		ReadTimeout: 30 * time.Second, IdleTimeout: time.Duration(lim.IdleTimeout),
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}}
}

// proxyServer is the API proxy's server. A watch through the proxy lasts as long as
// Kueue keeps it, hours, so no read or write timeout cuts a request under way: only a
// request's header is bounded, and a connection that carries no request is closed after
// lim.IdleTimeout, or any pod that reaches the proxy could hold idle connections until
// the hub runs out of file descriptors.
func proxyServer(addr string, h http.Handler, cert func(*tls.ClientHelloInfo) (*tls.Certificate, error), lim ListenerLimits) *http.Server {
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: headerTimeout, IdleTimeout: time.Duration(lim.IdleTimeout),
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: cert}}
}

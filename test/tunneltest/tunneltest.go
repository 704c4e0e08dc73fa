// Package tunneltest serves a hub's tunnel endpoint on loopback for tests that run an
// agent against the real tunnel server, without the rest of the hub.
package tunneltest

import (
	"net"
	"net/http"
	"testing"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
)

// Serve serves srv at protocol.Path on a loopback port until the test ends, then closes
// the server and srv, and returns the ws:// URL an agent dials (with
// --allow-insecure-loopback).
func Serve(t testing.TB, srv *tunnel.Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(protocol.Path, srv)
	hs := &http.Server{Handler: mux}
	served := make(chan struct{})
	go func() { _ = hs.Serve(l); close(served) }()
	t.Cleanup(func() { _ = hs.Close(); <-served; srv.Close() })
	return "ws://" + l.Addr().String()
}

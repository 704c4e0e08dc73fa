package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// fakeTunnel stands in for the agent.
type fakeTunnel struct{ up, ever atomic.Bool }

func (f *fakeTunnel) Connected() bool     { return f.up.Load() }
func (f *fakeTunnel) EverConnected() bool { return f.ever.Load() }

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func TestHealthServer(t *testing.T) {
	state := &fakeTunnel{}
	srv := httptest.NewServer(newHealthHandler(state, newRegistry(state), slog.New(slog.DiscardHandler)))
	defer srv.Close()

	// Each step changes the tunnel, then checks every endpoint.
	steps := []struct {
		name          string
		up, ever      bool
		wantReady     int
		wantConnected string
	}{
		{name: "before the first connection", wantReady: http.StatusServiceUnavailable, wantConnected: "flotilla_agent_connected 0\n"},
		{name: "connected", up: true, ever: true, wantReady: http.StatusOK, wantConnected: "flotilla_agent_connected 1\n"},
		{name: "the hub went away after a connection", ever: true, wantReady: http.StatusOK, wantConnected: "flotilla_agent_connected 0\n"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			state.up.Store(s.up)
			state.ever.Store(s.ever)
			if code, _ := get(t, srv.URL+"/healthz"); code != http.StatusOK {
				t.Errorf("/healthz: %d, want 200", code)
			}
			if code, body := get(t, srv.URL+"/readyz"); code != s.wantReady {
				t.Errorf("/readyz: %d %q, want %d", code, body, s.wantReady)
			}
			code, body := get(t, srv.URL+"/metrics")
			if code != http.StatusOK {
				t.Fatalf("/metrics: %d", code)
			}
			for _, want := range []string{
				"# TYPE flotilla_agent_connected gauge\n", s.wantConnected,
				"go_goroutines ", "process_resident_memory_bytes ",
			} {
				if !strings.Contains(body, want) {
					t.Errorf("/metrics lacks %q", want)
				}
			}
		})
	}
	if code, _ := get(t, srv.URL+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/: %d, want 404: the agent serves nothing but health and metrics", code)
	}
}

func TestAgentRefBeforeTheAgentExists(t *testing.T) {
	var r agentRef
	if r.Connected() || r.EverConnected() {
		t.Error("an agent that does not exist yet reports a connection")
	}
}

func TestServeHealthStopsWithItsContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	state := &fakeTunnel{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- serveHealth(ctx, ln, newHealthHandler(state, newRegistry(state), slog.New(slog.DiscardHandler)), slog.New(slog.DiscardHandler))
	}()
	if code, _ := get(t, "http://"+ln.Addr().String()+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serveHealth after its context ended: %v, want nil", err)
	}
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Error("still listening after shutdown")
	}
}

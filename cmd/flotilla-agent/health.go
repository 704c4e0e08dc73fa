package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flotilla-gitops/flotilla/agent"
)

// tunnelState is what the probes and metrics read of the agent.
type tunnelState interface {
	Connected() bool
	EverConnected() bool
}

// agentRef is the agent once it exists: the health server starts first, so that the
// liveness probe answers while the agent is still reading the cluster's version.
type agentRef struct{ p atomic.Pointer[agent.Agent] }

func (r *agentRef) set(a *agent.Agent) { r.p.Store(a) }

func (r *agentRef) Connected() bool {
	a := r.p.Load()
	return a != nil && a.Connected()
}

func (r *agentRef) EverConnected() bool {
	a := r.p.Load()
	return a != nil && a.EverConnected()
}

// newRegistry is the agent's own metrics registry, not the global default one, so that
// no library's init can add to what the agent exposes.
func newRegistry(state tunnelState) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flotilla_agent_connected",
			Help: "1 while the tunnel to the hub is up, else 0.",
		}, func() float64 {
			if state.Connected() {
				return 1
			}
			return 0
		}),
	)
	return reg
}

// newHealthHandler serves the probes and the metrics.
//
// /readyz turns ready once the agent has been connected to the hub and stays so: the
// worker keeps its last applied state while the hub is away, and a pod that goes unready
// on every hub outage would only page the worker's administrator for the hub's trouble.
// flotilla_agent_connected says whether the tunnel is up now.
func newHealthHandler(state tunnelState, gatherer prometheus.Gatherer, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !state.EverConnected() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not yet connected to the hub")
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError),
	}))
	return mux
}

// serveHealth serves h on ln until ctx ends, then shuts down gracefully.
func serveHealth(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serving health and metrics on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutting down the health server: %w", err)
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving health and metrics on %s: %w", ln.Addr(), err)
	}
	return nil
}

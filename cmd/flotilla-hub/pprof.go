package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// pprofMux serves Go's profiles under /debug/pprof/, as net/http/pprof registers them on
// the default mux; the hub serves nothing on the default mux, so they are named here.
func pprofMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// servePprof serves the profiles on addr until ctx ends. A CPU profile or a trace
// lasts as long as its caller asks (30 s by default): no write timeout cuts it.
func servePprof(ctx context.Context, addr string, log *slog.Logger) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("the pprof listener: %w", err)
	}
	srv := &http.Server{Handler: pprofMux(), ReadHeaderTimeout: headerTimeout, IdleTimeout: defaultIdleTimeout}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("serving Go's profiles", "address", l.Addr().String(), "path", "/debug/pprof/")
	go func() {
		if err := srv.Serve(l); err != nil && err != http.ErrServerClosed {
			log.Error("the pprof listener", "error", err)
		}
	}()
	return nil
}

package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flotilla-gitops/flotilla/reconciler/logbudget"
)

// connCounts are where a limitListener reports: the connections it holds open and
// those it refused.
type connCounts struct {
	open    prometheus.Gauge
	refused prometheus.Counter
}

// limitOptions configure a limitListener.
type limitOptions struct {
	// Name is the listener's in logs: tunnel, http or proxy.
	Name string
	// Max is how many connections it holds open at once; at least 1.
	Max    int
	Counts connCounts
	Log    *slog.Logger
}

// limitListener holds at most Max connections open at once, so that whoever reaches a
// listener cannot hold connections until the hub runs out of file descriptors.
//
// Over the bound it accepts a connection and closes it at once, and counts it. It does
// not leave it in the kernel's queue as golang.org/x/net/netutil.LimitListener does by
// not accepting: there a flood's connections and the legitimate callers' wait in one
// queue, unanswered, until each caller's own timeout, and once the queue is full the
// kernel drops new ones unseen and uncounted. Closed at once, a legitimate caller learns
// at once and redials with its backoff (client-go, the agent), and gets in as soon as a
// connection closes, which the idle timeout of the server behind sees to; the refusals
// show in flotilla_hub_connections_refused_total, and the refusal costs no TLS handshake.
type limitListener struct {
	net.Listener
	opts limitOptions
	open atomic.Int64
	// refusals bounds the log lines of refused connections: the metric counts every
	// one, and a flood must not flood the log too.
	refusals logbudget.Budget
}

// listen opens a TCP listener on addr that holds at most opts.Max connections open.
func listen(ctx context.Context, addr string, opts limitOptions) (net.Listener, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return newLimitListener(l, opts), nil
}

func newLimitListener(l net.Listener, opts limitOptions) *limitListener {
	opts.Max = max(opts.Max, 1)
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &limitListener{Listener: l, opts: opts}
}

// Accept returns the next connection within the bound, closing every one over it.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= int64(l.opts.Max) {
			l.opts.Counts.open.Inc()
			return &limitConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		// Counted before it is closed, so that whoever sees the connection end sees
		// it counted.
		l.opts.Counts.refused.Inc()
		_ = c.Close()
		l.refusals.Log(l.opts.Log, slog.LevelWarn, "connection refused: the listener holds as many as it may; flotilla_hub_connections_refused_total counts them",
			"listener", l.opts.Name, "max", l.opts.Max, "remote", c.RemoteAddr().String())
	}
}

func (l *limitListener) release() {
	l.open.Add(-1)
	l.opts.Counts.open.Dec()
}

// limitConn is a connection within a limitListener's bound, which it gives back when
// closed. The HTTP server closes a connection more than once, and a hijacked one (a
// tunnel's websocket) is closed by its new owner through this Close too: it is given
// back once.
type limitConn struct {
	net.Conn
	l        *limitListener
	released sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.released.Do(c.l.release)
	return err
}

// CloseWrite half-closes the connection as the HTTP server does a bare TCP connection
// before closing it, so that the client reads the whole answer rather than a reset.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

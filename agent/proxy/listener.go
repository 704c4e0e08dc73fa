package proxy

import (
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Listener is a net.Listener of connections handed to it, the streams that the hub
// opens through the tunnel, so that an http.Server serves them as it serves TCP.
type Listener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	open  atomic.Int64
	max   int64
}

// NewListener is a Listener that holds at most maxConns connections open at once;
// Offer refuses more. A hub opens a connection per concurrent request, so a cap a
// little above the handler's MaxConcurrent leaves room for idle keep-alive ones.
func NewListener(maxConns int) *Listener {
	return &Listener{conns: make(chan net.Conn), done: make(chan struct{}), max: int64(maxConns)}
}

// Offer hands c to the server and reports whether it was taken: it is not once the
// listener is closed or holds maxConns connections, and the caller then closes c.
// It blocks until the server accepts c.
func (l *Listener) Offer(c net.Conn) bool {
	// Closed comes first: below, a select with both cases ready picks either.
	select {
	case <-l.done:
		return false
	default:
	}
	if l.open.Add(1) > l.max {
		l.open.Add(-1)
		return false
	}
	select {
	case l.conns <- &countedConn{Conn: c, l: l}:
		return true
	case <-l.done:
		l.open.Add(-1)
		return false
	}
}

// Open is the number of connections taken and not yet closed.
func (l *Listener) Open() int { return int(l.open.Load()) }

// Accept waits for the next connection offered.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case <-l.done:
		return nil, net.ErrClosed
	default:
	}
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept and Offer. Connections already taken stay with the server.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr names the listener in the server's messages.
func (l *Listener) Addr() net.Addr { return tunnelAddr{} }

type tunnelAddr struct{}

func (tunnelAddr) Network() string { return "tunnel" }
func (tunnelAddr) String() string  { return "hub-tunnel" }

// countedConn gives its place back when it is closed, once however often it is closed.
type countedConn struct {
	net.Conn
	l    *Listener
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

// NewServer is the http.Server that serves h on a Listener. It bounds how long a request
// may take to send its headers and how long a connection may idle between requests, and
// nothing else: a watch must stream for as long as the hub reads it, so there is no read
// or write timeout.
func NewServer(h http.Handler, log *slog.Logger) *http.Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

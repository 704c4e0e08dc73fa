package protocol

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/hashicorp/yamux"
)

// Liveness sets how a side of the tunnel tells a dead peer: it pings every Interval and
// gives up when nothing, not even a pong, arrived for Timeout.
type Liveness struct {
	Interval time.Duration
	Timeout  time.Duration
}

// DefaultLiveness pings every 10 s and declares the peer dead after 30 s of silence.
var DefaultLiveness = Liveness{Interval: 10 * time.Second, Timeout: 30 * time.Second}

// ErrTextFrame is the read error of a tunnel whose peer sent a WebSocket text message:
// the protocol is binary only, so this is garbage and the tunnel is closed.
var ErrTextFrame = errors.New("protocol: text WebSocket message on a binary tunnel")

// writeTimeout bounds one write to the WebSocket, so a peer that stops reading cannot
// wedge the writer forever.
const writeTimeout = 10 * time.Second

// Tunnel is one WebSocket connection carrying yamux streams.
type Tunnel struct {
	*yamux.Session
	ws   *websocket.Conn
	conn *wsConn
	stop func() bool
}

// WriteTimedOut reports whether a write to the peer, of a stream's data or of a ping,
// took longer than its deadline: the peer stopped reading, and the tunnel is closed
// for it.
func (t *Tunnel) WriteTimedOut() bool { return t.conn.timedOut.Load() }

// NewTunnel starts yamux over ws. The agent is the client (isClient true): it opens the
// control stream; the hub is the server. Pings start at once. The hub's side closes the
// tunnel when the agent opens a second stream, or sends more than a hello on the
// control stream before HelloRead.
func NewTunnel(ws *websocket.Conn, isClient bool, live Liveness) (*Tunnel, error) {
	if live.Interval <= 0 || live.Timeout <= live.Interval {
		return nil, fmt.Errorf("protocol: liveness %+v: the timeout must exceed a positive interval", live)
	}
	var streams *streamGuard
	if !isClient {
		streams = &streamGuard{}
	}
	c := &wsConn{ws: ws, guard: newPingGuard(streams)}
	extend := func() { _ = ws.SetReadDeadline(time.Now().Add(live.Timeout)) }
	extend()
	ws.SetPongHandler(func(string) error { extend(); return nil })
	ws.SetPingHandler(func(data string) error {
		extend()
		err := ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(writeTimeout))
		if errors.Is(err, websocket.ErrCloseSent) {
			return nil
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		return err
	})
	c.extend = extend

	cfg := yamux.DefaultConfig()
	// The WebSocket pings stand in for yamux's keepalive: one liveness mechanism, with
	// the deadline the hub and agent agreed on.
	cfg.EnableKeepAlive = false
	cfg.ConnectionWriteTimeout = writeTimeout
	cfg.LogOutput = io.Discard
	// Few streams per tunnel: a small backlog keeps an idle tunnel small.
	cfg.AcceptBacklog = 16
	var sess *yamux.Session
	var err error
	if isClient {
		sess, err = yamux.Client(c, cfg)
	} else {
		sess, err = yamux.Server(c, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("protocol: starting streams: %w", err)
	}
	t := &Tunnel{Session: sess, ws: ws, conn: c}
	// A timer, not a goroutine, so an idle tunnel costs no stack for its pings.
	var timer *time.Timer
	var mu sync.Mutex
	stopped := false
	ping := func() {}
	ping = func() {
		if sess.IsClosed() {
			return
		}
		if err := ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeTimeout)); err != nil && !errors.Is(err, websocket.ErrCloseSent) {
			c.noteTimeout(err)
			_ = sess.Close()
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			timer.Reset(live.Interval)
		}
	}
	mu.Lock()
	timer = time.AfterFunc(live.Interval, func() { ping() })
	mu.Unlock()
	t.stop = func() bool {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		return timer.Stop()
	}
	return t, nil
}

// HelloRead tells the hub's side of the tunnel that the hub read the agent's hello:
// from then on the control stream may carry whole messages, not only a hello's worth.
// It does nothing on the agent's side.
func (t *Tunnel) HelloRead() {
	if s := t.conn.guard.streams; s != nil {
		s.helloRead.Store(true)
	}
}

// Refused is the rule of the protocol the peer broke (ErrPingFlood, ErrExtraStream,
// ErrBeforeHello), for which the tunnel closed; nil when it broke none.
func (t *Tunnel) Refused() error {
	if err := t.conn.refused.Load(); err != nil {
		return *err
	}
	return nil
}

// Close ends every stream and the WebSocket.
func (t *Tunnel) Close() error {
	t.stop()
	err := t.Session.Close()
	_ = t.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	if cerr := t.ws.Close(); err == nil {
		err = cerr
	}
	return err
}

// wsConn turns the binary messages of a WebSocket into the byte stream yamux runs on.
type wsConn struct {
	ws       *websocket.Conn
	r        io.Reader
	guard    *pingGuard
	extend   func()
	wmu      sync.Mutex
	timedOut atomic.Bool
	// refused is what the guard refused; every read fails with it from then on, since
	// the guard has lost its place in the frames.
	refused atomic.Pointer[error]
}

func (c *wsConn) noteTimeout(err error) {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		c.timedOut.Store(true)
	}
}

func (c *wsConn) Read(p []byte) (int, error) {
	if err := c.refused.Load(); err != nil {
		return 0, *err
	}
	for {
		if c.r == nil {
			typ, r, err := c.ws.NextReader()
			if err != nil {
				return 0, err
			}
			if typ != websocket.BinaryMessage {
				return 0, ErrTextFrame
			}
			c.extend()
			c.r = r
		}
		n, err := c.r.Read(p)
		if gerr := c.guard.see(p[:n]); gerr != nil {
			c.refused.Store(&gerr)
			return 0, gerr
		}
		if errors.Is(err, io.EOF) {
			c.r = nil
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
}

func (c *wsConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.ws.SetWriteDeadline(time.Now().Add(writeTimeout))
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		c.noteTimeout(err)
		return 0, err
	}
	return len(p), nil
}

func (c *wsConn) Close() error { return c.ws.Close() }

// IsWriteTimeout reports whether err from a write on a tunnel's stream means the peer
// took nothing for the write's deadline.
func IsWriteTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, yamux.ErrConnectionWriteTimeout) || (errors.As(err, &ne) && ne.Timeout())
}

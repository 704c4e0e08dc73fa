// Package tunnel is the hub's end of the agents' tunnels: the WebSocket endpoint agents
// dial, the one-shot enrollment that turns a token from the fleet repository into an
// agent credential, and the control stream over which the hub sends each worker its
// whole desired state and learns what the worker applied and which GPUs it has.
//
// What the hub learns lives in the hub cluster, in the WorkerCluster's status and in a
// Secret holding the credential's hash; the tunnel keeps nothing else between
// connections, so a restarted hub picks up where it left off.
package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// fieldManager owns what the tunnel writes on the hub cluster.
const fieldManager = "flotilla-hub-tunnel"

// DesiredStates gives the desired state of a worker, whole; the hub's reconciler
// implements it from the rendered fleet.
type DesiredStates interface {
	Desired(ctx context.Context, wc *v1alpha1.WorkerCluster) (*protocol.DesiredState, error)
}

// Options configure a Server.
type Options struct {
	// Client reads and writes WorkerClusters and credential Secrets on the hub cluster.
	Client  client.Client
	Desired DesiredStates
	// Liveness of the tunnels; defaults to protocol.DefaultLiveness.
	Liveness protocol.Liveness
	// AllowInsecureLoopback accepts plain ws:// from loopback addresses, for a hub and
	// agent on one machine. Everything else must arrive over TLS.
	AllowInsecureLoopback bool
	// ResyncEvery is how often each connected agent gets its whole desired state again,
	// besides every connect and every Push. Default 5 minutes.
	ResyncEvery time.Duration
	// RotateEvery is how often an agent's credential is replaced while connected.
	// Default 24 hours.
	RotateEvery time.Duration
	// LastSeenEvery is how coarsely status.lastSeen is recorded. Default 1 minute.
	LastSeenEvery time.Duration
	// HandshakeTimeout bounds the time from upgrade to the agent's hello.
	HandshakeTimeout time.Duration
	// OnStatus, when set, is called after the tunnel changed a WorkerCluster's status, so
	// the hub can sum the conditions up and report them.
	OnStatus func(ctx context.Context, key client.ObjectKey)
	// Resolve, when set, names the WorkerCluster of an identity the hub already knows,
	// so that authenticating an agent reads one object instead of listing every
	// WorkerCluster: after a hub restart thousands of agents redial at once. An
	// identity it does not know is looked up by listing.
	Resolve func(identity string) (client.ObjectKey, bool)
	Log     *slog.Logger
	Now     func() time.Time
}

// Server serves agents' tunnels. Use it as the handler of protocol.Path.
type Server struct {
	opts     Options
	upgrader websocket.Upgrader

	mu       sync.Mutex
	sessions map[string]*session // by identity
	closing  atomic.Bool
}

// New checks the options.
func New(opts Options) (*Server, error) {
	if opts.Client == nil || opts.Desired == nil {
		return nil, errors.New("tunnel: a client and a source of desired states are required")
	}
	if opts.Liveness == (protocol.Liveness{}) {
		opts.Liveness = protocol.DefaultLiveness
	}
	if opts.ResyncEvery <= 0 {
		opts.ResyncEvery = 5 * time.Minute
	}
	if opts.RotateEvery <= 0 {
		opts.RotateEvery = 24 * time.Hour
	}
	if opts.LastSeenEvery <= 0 {
		opts.LastSeenEvery = time.Minute
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Server{
		opts: opts,
		upgrader: websocket.Upgrader{
			// Small buffers keep an idle tunnel small; messages larger than a buffer
			// are simply written in several frames.
			ReadBufferSize:  1024,
			WriteBufferSize: 1024,
			WriteBufferPool: &sync.Pool{},
			// Agents are not browsers: there is no origin to check.
			CheckOrigin: func(*http.Request) bool { return true },
		},
		sessions: map[string]*session{},
	}, nil
}

// ServeHTTP authenticates the upgrade request and runs the tunnel until it ends.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	log := s.opts.Log.With("identity", r.Header.Get(protocol.HeaderIdentity), "remote", r.RemoteAddr)
	if r.TLS == nil && !(s.opts.AllowInsecureLoopback && loopback(r.RemoteAddr)) {
		log.Warn("agent refused: plain HTTP is only accepted from loopback, when allowed")
		http.Error(w, "the tunnel requires TLS (wss://)", http.StatusForbidden)
		return
	}
	v, err := strconv.Atoi(r.Header.Get(protocol.HeaderProtocol))
	switch {
	case err != nil || v < 1:
		http.Error(w, "missing or malformed "+protocol.HeaderProtocol+" header", http.StatusBadRequest)
		return
	case v > protocol.ProtocolVersion:
		log.Warn("agent refused: newer protocol", "version", v)
		http.Error(w, fmt.Sprintf("protocol version %d is newer than this hub speaks (%d): upgrade the hub, or run an agent of the hub's version", v, protocol.ProtocolVersion), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.HandshakeTimeout)
	adm, err := s.authenticate(ctx, r)
	cancel()
	if err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			log.Warn("agent refused", "auth", r.Header.Get(protocol.HeaderAuth), "reason", ref.Reason, "fingerprint", ref.Fingerprint)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		log.Error("agent not admitted: hub fault", "error", err)
		http.Error(w, "the hub cannot admit agents right now", http.StatusServiceUnavailable)
		return
	}
	hdr := http.Header{}
	if !adm.credential.IsZero() {
		hdr.Set(protocol.HeaderCredential, adm.credential.Reveal())
		log.Info("enrollment token redeemed", "fingerprint", adm.fingerprint, "credential", adm.credential.Hash().Fingerprint())
	}
	ws, err := s.upgrader.Upgrade(w, r, hdr)
	if err != nil {
		// The upgrader answered the client already.
		log.Warn("upgrade failed", "error", err)
		return
	}
	ws.SetReadLimit(int64(protocol.MaxMessageSize) + 1024)
	t, err := protocol.NewTunnel(ws, false, s.opts.Liveness)
	if err != nil {
		_ = ws.Close()
		log.Error("starting the tunnel", "error", err)
		return
	}
	sess := &session{srv: s, tunnel: t, wc: adm.wc, identity: adm.wc.Labels[v1alpha1.WorkerClusterLabel], log: log.With("workerCluster", adm.wc.Namespace+"/"+adm.wc.Name)}
	// The session outlives this handler: returning lets net/http drop the request and
	// its connection buffers, which an idle tunnel would otherwise keep for its life.
	go sess.run(context.WithoutCancel(r.Context()))
}

func loopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Push sends the current desired state to the identity's agent, when connected; it
// reports whether one was connected.
func (s *Server) Push(ctx context.Context, identity string) (bool, error) {
	sess := s.session(identity)
	if sess == nil {
		return false, nil
	}
	return true, sess.sendDesired(ctx)
}

// Connected reports whether the identity's agent has a live tunnel.
func (s *Server) Connected(identity string) bool { return s.session(identity) != nil }

// Disconnect closes the identity's tunnel, e.g. after its credential was revoked.
func (s *Server) Disconnect(identity string) {
	if sess := s.session(identity); sess != nil {
		_ = sess.tunnel.Close()
	}
}

// Close ends every tunnel, for a hub that shuts down; agents redial. The clusters are
// not recorded as disconnected: the hub is leaving, not the agents, and the next hub
// finds out which of them come back.
func (s *Server) Close() {
	s.closing.Store(true)
	s.mu.Lock()
	all := make([]*session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		all = append(all, sess)
	}
	s.mu.Unlock()
	for _, sess := range all {
		_ = sess.tunnel.Close()
	}
}

// Sessions counts live tunnels.
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

func (s *Server) session(identity string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[identity]
}

// register makes sess the identity's session and closes the one it replaces.
func (s *Server) register(sess *session) {
	s.mu.Lock()
	old := s.sessions[sess.identity]
	s.sessions[sess.identity] = sess
	s.mu.Unlock()
	if old != nil {
		old.log.Info("tunnel replaced by a new connection of the same identity")
		old.replaced.Store(true)
		_ = old.tunnel.Close()
	}
}

// unregister forgets sess unless a newer session replaced it; it reports whether sess
// was still the current one.
func (s *Server) unregister(sess *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[sess.identity] == sess {
		delete(s.sessions, sess.identity)
		return true
	}
	return false
}

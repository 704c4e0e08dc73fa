// Package tunnel is the hub's end of the agents' tunnels: the WebSocket endpoint agents
// dial, the one-shot enrollment that turns a token from the fleet repository into an
// agent credential, and the control stream over which the hub sends each worker its
// whole desired state and learns what the worker applied and which GPUs it has.
//
// The hub's reconciler pushes each identity's desired state ([Server.Push]); the
// tunnel keeps the last one, sends it on every connect, resync and push, and never
// asks the hub for it. What the tunnel learns of an agent it hands as facts to the
// owner of the WorkerCluster's status (reconciler/conditions); the rest lives in a
// Secret holding the credential's hash and, as annotations, its lifetime. Nothing else
// is kept between connections, so a restarted hub picks up where it left off. A second small Secret per cluster
// (RecordSecretName) records the enrollment tokens it redeemed and outlives the
// cluster's removal ([Server.Revoke]), so that a spent token stays spent.
//
// [Proxy] serves the hub's Kueue the workers' Kubernetes APIs over these tunnels, with a
// bearer token per worker. Every replica of a hub serves it; one that holds no tunnel to
// a worker relays to the leader's (relay.go), so that Kueue's watches outlive a
// failover.
//
// # Hostile peers
//
// Anyone who can reach the endpoint can send requests. Authentication checks the shape
// of what is presented (a token's prefix, length and checksum, the identity's form)
// before it looks anything up, and looks up only through Options.Reader, an informer
// cache in the hub: a refused request costs the hub cluster's API nothing, however
// many arrive, and none of them delays an agent whose secret is valid. Refusals are
// logged at a bounded rate.
//
// Until the hub read its hello, a connection may send no more than a hello of
// protocol.MaxHelloSize; at no time may it open a stream besides the control stream. It
// is closed for either, and the log says why. Every write to an agent has a deadline
// (Options.WriteTimeout): an agent that stops reading is disconnected, and its
// WorkerCluster says so (Connected False, SendTimeout). The hub hands desired states to
// a connection's writer and returns ([Server.Push]): a stuck agent never holds up the
// hub's reconcile, and a newer state replaces one not yet sent.
//
// A redemption whose answer was lost can be repeated by the agent that made it, with
// the redemption key it sent (see agent/protocol), within RedemptionRetryWindow.
//
// # Credential lifetimes
//
// Every credential the tunnel issues has a lifetime, and the tunnel rotates it over the
// live tunnel long before its end (lifetime.go says when). An expired credential is
// refused like any other secret, with a log line naming the WorkerCluster, the
// credential's fingerprint and the expiry; a live tunnel whose credential runs out is
// closed. A credential issued before lifetimes were recorded gets one from the hub's
// first sight of its agent after the upgrade.
package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/logbudget"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// fieldManager owns what the tunnel writes on the hub cluster.
const fieldManager = "flotilla-hub-tunnel"

// Options configure a Server.
type Options struct {
	// Client reads and writes WorkerClusters and credential Secrets on the hub cluster.
	Client client.Client
	// Reader is where authentication reads WorkerClusters and the tunnel's Secrets
	// (those labelled v1alpha1.WorkerClusterLabel): an informer-backed cache in the
	// hub, so that a request that fails to authenticate costs no API call. Writes, and
	// reads that follow a valid secret, go through Client. Defaults to Client.
	Reader client.Reader
	// IdentityIndexed says that Reader has the index of IndexIdentities.
	IdentityIndexed bool
	// Status records what the tunnel learns of each agent on its WorkerCluster's
	// status. Defaults to a conditions.Writer of Client.
	Status *conditions.Writer
	// Liveness of the tunnels; defaults to protocol.DefaultLiveness.
	Liveness protocol.Liveness
	// AllowInsecureLoopback accepts plain ws:// from loopback addresses, for a hub and
	// agent on one machine. Everything else must arrive over TLS.
	AllowInsecureLoopback bool
	// ResyncEvery is how often each connected agent gets its whole desired state again,
	// besides every connect and every Push. Default 5 minutes.
	ResyncEvery time.Duration
	// RotateEvery bounds the age of an agent's credential: a connected agent gets a new
	// one once its credential is RotateEvery old, or half its lifetime when that is
	// sooner. Default 24 hours.
	RotateEvery time.Duration
	// CredentialLifetime is how long a credential is accepted when its WorkerCluster's
	// spec.credentialLifetime says nothing. Default v1alpha1.DefaultCredentialLifetime.
	CredentialLifetime time.Duration
	// CredentialCheckEvery bounds how long the tunnel goes without looking at a
	// credential's lifetime (a rotation due, its last third, its end): it wakes at each of
	// these by itself, and at least this often in case the clock jumped. Default 5
	// minutes.
	CredentialCheckEvery time.Duration
	// LastSeenEvery is how coarsely status.lastSeen is recorded. Default 1 minute.
	LastSeenEvery time.Duration
	// LastSeenRate bounds the records of status.lastSeen per second over all connected
	// agents: with more agents than LastSeenEvery at this rate allows, each agent's is
	// recorded less often. Ten thousand agents recorded once a minute would be 167
	// writes a second, more than the hub's client may send (kubeAPI.qps) and about what
	// a modest API server takes, leaving nothing for the changes the hub must write.
	// Default 10 a second: at most 600 agents at the minute.
	LastSeenRate float64
	// HandshakeTimeout bounds the time from upgrade to the agent's hello.
	HandshakeTimeout time.Duration
	// WriteTimeout bounds the sending of one message to an agent: an agent that takes
	// nothing for that long is disconnected and recorded as such (SendTimeout).
	// Default 30 seconds.
	WriteTimeout time.Duration
	// Reports bounds each agent's apply reports and inventories (ReportBudget).
	Reports ReportBudget
	// RedemptionRetryWindow is how long after a redemption the agent that made it may
	// repeat it, with the same redemption key, should the answer have been lost.
	// Default 5 minutes.
	RedemptionRetryWindow time.Duration
	Log                   *slog.Logger
	Now                   func() time.Time
}

// Server serves agents' tunnels. Use it as the handler of protocol.Path.
type Server struct {
	opts     Options
	upgrader websocket.Upgrader
	refusals logbudget.Budget
	// secrets is the budget of refusals of a secret shaped as the hub issues them (a
	// replayed token, an expired credential): a flood of garbage never hides them.
	secrets logbudget.Budget
	// faults is the budget of requests the hub could not admit through a fault of its
	// own: a flood of garbage never hides the hub's faults from its operators.
	faults logbudget.Budget

	mu          sync.Mutex
	sessions    map[string]*session     // by identity
	desired     map[string]pushed       // by identity
	proxyTokens map[string]secrets.Hash // by identity, as far as known
	// reportBudgets are the identities' budgets of reports, kept across their tunnels.
	reportBudgets map[string]*reportLimiters
	// registered is closed, and replaced, whenever a session registers: the proxy's
	// watches that wait for their agent to redial wake on it.
	registered chan struct{}
	closing    atomic.Bool
	// life ends with Close, and with it the sweep of disconnected agents' credentials
	// and the retries of facts the sessions could not record.
	life     context.Context
	endLife  context.CancelFunc
	sweeping sync.Once
}

// pushed is what the hub last pushed for an identity.
type pushed struct {
	key   client.ObjectKey
	state *protocol.DesiredState
}

// New checks the options.
func New(opts Options) (*Server, error) {
	if opts.Client == nil {
		return nil, errors.New("tunnel: a client is required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Status == nil {
		opts.Status = conditions.NewWriterWith(opts.Client, conditions.WriterOptions{Now: opts.Now, Log: opts.Log})
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
	if opts.LastSeenRate <= 0 {
		opts.LastSeenRate = 10
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 30 * time.Second
	}
	opts.Reports = opts.Reports.withDefaults()
	if opts.RedemptionRetryWindow <= 0 {
		opts.RedemptionRetryWindow = 5 * time.Minute
	}
	if opts.Reader == nil {
		opts.Reader = opts.Client
	}
	if opts.CredentialLifetime <= 0 {
		opts.CredentialLifetime = v1alpha1.DefaultCredentialLifetime
	}
	if opts.CredentialCheckEvery <= 0 {
		opts.CredentialCheckEvery = 5 * time.Minute
	}
	life, endLife := context.WithCancel(context.Background())
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
		sessions:      map[string]*session{},
		desired:       map[string]pushed{},
		proxyTokens:   map[string]secrets.Hash{},
		reportBudgets: map[string]*reportLimiters{},
		registered:    make(chan struct{}),
		life:          life,
		endLife:       endLife,
	}, nil
}

// ServeHTTP authenticates the upgrade request and runs the tunnel until it ends.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	identity := r.Header.Get(protocol.HeaderIdentity)
	if !validIdentity(identity) {
		// Whatever a hostile client put there stays out of the log.
		identity = ""
	}
	log := s.opts.Log.With("identity", identity, "remote", r.RemoteAddr)
	if r.TLS == nil && !(s.opts.AllowInsecureLoopback && protocol.IsLoopbackAddr(r.RemoteAddr)) {
		s.refusals.Log(log, slog.LevelWarn, "agent refused: plain HTTP is only accepted from loopback, when allowed")
		http.Error(w, "the tunnel requires TLS (wss://)", http.StatusForbidden)
		return
	}
	v, err := strconv.Atoi(r.Header.Get(protocol.HeaderProtocol))
	switch {
	case err != nil || v < 1:
		http.Error(w, "missing or malformed "+protocol.HeaderProtocol+" header", http.StatusBadRequest)
		return
	case v > protocol.ProtocolVersion:
		s.refusals.Log(log, slog.LevelWarn, "agent refused: newer protocol", "version", v)
		http.Error(w, fmt.Sprintf("protocol version %d is newer than this hub speaks (%d): upgrade the hub, or run an agent of the hub's version", v, protocol.ProtocolVersion), http.StatusBadRequest)
		return
	}
	// A client that hangs up does not cut a redemption short between its writes: it
	// completes, and the agent can repeat it with its redemption key.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.opts.HandshakeTimeout)
	adm, err := s.authenticate(ctx, r)
	cancel()
	if err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			budget := &s.refusals
			if ref.Fingerprint != "" {
				budget = &s.secrets
			}
			budget.Log(log, slog.LevelWarn, "agent refused", append([]any{"auth", authKind(r), "reason", ref.Reason, "fingerprint", ref.Fingerprint}, ref.Args...)...)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		s.faults.Log(log, slog.LevelError, "agent not admitted: hub fault", "error", err)
		http.Error(w, "the hub cannot admit agents right now", http.StatusServiceUnavailable)
		return
	}
	identity = adm.wc.Labels[v1alpha1.WorkerClusterLabel]
	if adm.credential.IsZero() && s.cooling(identity) {
		s.secrets.Log(log, slog.LevelWarn, "agent refused: it was disconnected for sending reports over its budget, and is admitted again once the budget has room", "fingerprint", adm.fingerprint)
		w.Header().Set("Retry-After", "60")
		http.Error(w, "the agent sent more reports than its budget allows: retry later", http.StatusTooManyRequests)
		return
	}
	// The agent learns from the answer which version the two speak: an older agent keeps
	// its own, and the hub opens no stream it would not understand.
	version := protocol.Negotiate(v)
	hdr := http.Header{}
	hdr.Set(protocol.HeaderProtocol, strconv.Itoa(version))
	if !adm.credential.IsZero() {
		hdr.Set(protocol.HeaderCredential, adm.credential.Reveal())
		hdr.Set(protocol.HeaderCredentialExpires, stamp(adm.record.current.expires))
		if adm.again {
			log.Info("enrollment token presented again with its redemption key: the first answer was lost; a fresh credential replaces the one issued then", "fingerprint", adm.fingerprint, "credential", adm.credential.Hash().Fingerprint())
		} else {
			log.Info("enrollment token redeemed", "fingerprint", adm.fingerprint, "credential", adm.credential.Hash().Fingerprint())
		}
	}
	ws, err := s.upgrader.Upgrade(w, r, hdr)
	if err != nil {
		// The upgrader answered the client already.
		log.Warn("upgrade failed", "error", err)
		return
	}
	// The HTTP server's read timeout bounds the upgrade request; the tunnel it became
	// stays open for as long as its heartbeats say it is alive.
	if err := ws.NetConn().SetDeadline(time.Time{}); err != nil {
		_ = ws.Close()
		log.Warn("clearing the upgrade request's deadlines", "error", err)
		return
	}
	ws.SetReadLimit(int64(protocol.MaxMessageSize) + 1024)
	t, err := protocol.NewTunnel(ws, false, s.opts.Liveness)
	if err != nil {
		_ = ws.Close()
		log.Error("starting the tunnel", "error", err)
		return
	}
	sess := &session{srv: s, tunnel: t, wc: adm.wc, reports: newReports(s.opts.Reports, s.reportLimiters(identity, !adm.credential.IsZero())), identity: adm.wc.Labels[v1alpha1.WorkerClusterLabel], version: version, log: log.With("workerCluster", adm.wc.Namespace+"/"+adm.wc.Name),
		admittedWith: adm.record, justIssued: !adm.credential.IsZero(), promoted: adm.promoted}
	// The session outlives this handler: returning lets net/http drop the request and
	// its connection buffers, which an idle tunnel would otherwise keep for its life.
	go sess.run(context.WithoutCancel(r.Context()))
}

// authKind is the request's Flotilla-Auth for the log, when it is one the hub knows.
func authKind(r *http.Request) string {
	switch k := r.Header.Get(protocol.HeaderAuth); k {
	case protocol.AuthEnrollment, protocol.AuthCredential:
		return k
	}
	return ""
}

// Push makes ds the desired state of the identity, whose WorkerCluster is key, and
// hands it to the identity's agent when connected; it reports whether one was. It does
// not wait for the network: the connection's writer sends the state, and a newer one
// pushed before it went out replaces it, so a fleet-wide push is never held by a slow
// agent. An agent that does not take it within WriteTimeout is disconnected. An agent
// that connects later gets the state then, and its authentication reads key rather
// than searching for its WorkerCluster. A state pushed again is sent again, for the
// agent to apply again (an object it refused may have been handed over since): the
// hub leaves out pushes that would change nothing (Desired).
func (s *Server) Push(key client.ObjectKey, identity string, ds *protocol.DesiredState) bool {
	// The hub pushes every cluster it knows: from the first push on, the credentials of
	// those whose agent is away are watched too.
	s.sweeping.Do(func() { go s.sweepCredentials() })
	s.mu.Lock()
	s.desired[identity] = pushed{key: key, state: ds}
	sess := s.sessions[identity]
	s.mu.Unlock()
	if sess == nil {
		return false
	}
	sess.queueDesired()
	return true
}

// Forget drops what was pushed for the identity, whose cluster left the fleet.
func (s *Server) Forget(identity string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.desired, identity)
	delete(s.proxyTokens, identity)
	delete(s.reportBudgets, identity)
}

// Desired is the desired state last pushed for the identity; nil when none was.
func (s *Server) Desired(identity string) *protocol.DesiredState { return s.desiredState(identity) }

func (s *Server) desiredState(identity string) *protocol.DesiredState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.desired[identity].state
}

// known is the WorkerCluster of an identity the hub pushed a desired state for.
func (s *Server) known(identity string) (client.ObjectKey, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.desired[identity]
	return p.key, ok
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
	s.endLife()
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

// sessionAndWake is the identity's session and a channel closed when the next session
// of any identity registers.
func (s *Server) sessionAndWake(identity string) (*session, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[identity], s.registered
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
	close(s.registered)
	s.registered = make(chan struct{})
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

// lastSeenEvery is how often each connected agent's status.lastSeen is recorded:
// LastSeenEvery, or less often when the connected agents would record more than
// LastSeenRate a second.
func (s *Server) lastSeenEvery() time.Duration {
	s.mu.Lock()
	n := len(s.sessions)
	s.mu.Unlock()
	return max(s.opts.LastSeenEvery, time.Duration(float64(n)/s.opts.LastSeenRate*float64(time.Second)))
}

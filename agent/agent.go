// Package agent is flotilla's agent in a worker cluster: it dials the hub, redeems its
// enrollment token once for a credential it keeps in a Secret of its own namespace
// (with the credential's expiry, and replaced whenever the hub rotates it), applies
// every desired state the hub sends, and reports what it applied and which GPUs the
// cluster has. A rotation whose credential it could not present (empty, or not a
// bearer token) it refuses and does not confirm: it keeps the stored credential, which
// the hub keeps accepting. Refused with a credential past its expiry, it says so in its
// log at every attempt, also once restarted (the expiry stays in the Secret while it
// tries its enrollment token), and that the cluster needs a new enrollment token.
// Until it holds a credential it keeps a redemption key in the same Secret and sends it
// with the token, so that a redemption whose answer was lost on the way can be
// repeated (see agent/protocol). It listens on nothing but health and metrics: the
// tunnel is outbound, so a worker behind NAT with only outbound HTTPS is enough.
//
// With a hub that speaks protocol.ProxyVersion or later, and Options.Proxy set, the
// agent also serves the streams the hub opens to reach the worker's API server for
// Kueue's MultiKueue (protocol.StreamProxy): each stream is one HTTP/1.1 connection,
// handed to an http.Server running Options.Proxy (see agent/proxy, which forwards only
// what MultiKueue needs, under an identity of its own). Every other stream, and every
// stream of a hub that negotiated an older version, is closed at once.
//
// While the hub is away the worker keeps its last applied state; the agent redials
// with jittered exponential backoff and, on reconnecting, receives the whole desired
// state again.
package agent

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/hashicorp/yamux"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/agent/proxy"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// CredentialKey is the key of the agent credential in its Secret.
const CredentialKey = "credential"

// RedemptionKeyKey is the key, in the same Secret, of the redemption key the agent
// sends with its enrollment token until it holds a credential; it is dropped when the
// credential is stored.
const RedemptionKeyKey = "redemptionKey"

// ExpiresAtKey is the key, in the same Secret, of when the hub stops accepting the
// credential (RFC 3339), so that the agent can say why it is refused without the hub
// telling it. A credential from a hub before credential lifetimes has none.
const ExpiresAtKey = "expiresAt"

// FieldManager is the agent's field manager, for its own Secret as for what it applies.
const FieldManager = v1alpha1.AgentFieldManager

// Applier applies a desired state on the worker.
type Applier interface {
	Apply(ctx context.Context, state protocol.DesiredState) protocol.Applied
}

// InventorySource reads the worker's GPUs.
type InventorySource interface {
	Collect(ctx context.Context) (protocol.Inventory, error)
}

// Options configure an Agent.
type Options struct {
	// HubURL is the hub's base URL, wss://host[:port] (ws:// only for a loopback hub).
	HubURL   string
	Identity string
	// EnrollmentToken is redeemed when no credential is stored yet (or the stored one
	// was refused, after the fleet issued a new token).
	EnrollmentToken protocol.Secret
	// CredentialSecret is where the credential is kept, in the agent's namespace.
	CredentialSecret types.NamespacedName
	// Client reads and writes the worker cluster: the credential Secret here.
	Client client.Client
	// TLS is the client TLS configuration (CA bundle); nil uses the system roots.
	TLS       *tls.Config
	Liveness  protocol.Liveness
	Applier   Applier
	Inventory InventorySource
	// InventoryEvery is how often the GPU inventory is sent. Default 1 minute.
	InventoryEvery time.Duration
	// Proxy serves the hub's Kubernetes API requests; nil refuses them, and the hub
	// reports the worker as not able to take dispatched work. Each desired state the
	// agent applies sets its scope (the state's Dispatch).
	Proxy *proxy.Handler
	// MaxProxyStreams caps the proxy streams open at once; more are closed as they
	// arrive. Default 128.
	MaxProxyStreams int
	// ApplyTimeout bounds one apply of a desired state, so that an API server that
	// stops answering cannot stall the agent behind a tunnel that looks healthy.
	// Default 5 minutes.
	ApplyTimeout time.Duration
	// ComponentsRetry is how often a desired state whose components are not ready yet is
	// applied and reported again. Default 30 seconds.
	ComponentsRetry time.Duration
	// Clock paces those retries. Defaults to the real clock.
	Clock clock.Clock
	// Backoff between dials; defaults to DefaultBackoff.
	Backoff           wait.Backoff
	AgentVersion      string
	KubernetesVersion string
	Log               *slog.Logger
	// Now is the agent's clock, which judges its credential's expiry. Defaults to
	// time.Now.
	Now func() time.Time
}

// Agent is one agent. Run it once.
type Agent struct {
	opts Options

	mu         sync.Mutex
	credential protocol.Secret // also in the Secret; kept here should storing it fail
	expires    time.Time       // the credential's expiry; zero when the hub sent none
	applied    string          // hash last applied
	// saidScope is the proxy's scope as last logged.
	saidScope proxy.Scope
	// redemption is the redemption key of the enrollment attempts under way: drawn
	// once, sent with every attempt, so that the hub can answer a repeated attempt
	// whose first answer was lost; forgotten once a credential arrives.
	redemption protocol.Secret

	connected atomic.Bool
	everUp    atomic.Bool

	// streamLog bounds the log lines of refused streams: a hub gone wrong cannot flood
	// the worker's log.
	streamLog     rate.Sometimes
	streamRefused atomic.Int64
}

// New checks the options.
func New(opts Options) (*Agent, error) {
	switch {
	case opts.HubURL == "" || opts.Identity == "":
		return nil, errors.New("agent: the hub URL and the identity are required")
	case opts.Client == nil || opts.Applier == nil:
		return nil, errors.New("agent: a client and an applier are required")
	case opts.CredentialSecret.Name == "" || opts.CredentialSecret.Namespace == "":
		return nil, errors.New("agent: the credential Secret's namespace and name are required")
	}
	if opts.Liveness == (protocol.Liveness{}) {
		opts.Liveness = protocol.DefaultLiveness
	}
	if opts.ApplyTimeout <= 0 {
		opts.ApplyTimeout = 5 * time.Minute
	}
	if opts.MaxProxyStreams <= 0 {
		opts.MaxProxyStreams = 128
	}
	if opts.ComponentsRetry <= 0 {
		opts.ComponentsRetry = 30 * time.Second
	}
	if opts.InventoryEvery <= 0 {
		opts.InventoryEvery = time.Minute
	}
	if opts.Backoff.Steps == 0 {
		opts.Backoff = DefaultBackoff()
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Agent{opts: opts, streamLog: rate.Sometimes{First: 10, Interval: 10 * time.Second}}, nil
}

// Connected reports whether the tunnel is up, for the readiness probe.
func (a *Agent) Connected() bool { return a.connected.Load() }

// EverConnected reports whether the agent was connected at least once.
func (a *Agent) EverConnected() bool { return a.everUp.Load() }

// errRefused is a dial the hub answered with 401.
var errRefused = errors.New("the hub refused the agent's secret")

// Run dials the hub and serves tunnels until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	redial := NewRedial(a.opts.Backoff)
	for {
		began := time.Now()
		err := a.connectOnce(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d := redial.After(time.Since(began))
		a.opts.Log.Info("tunnel down; redialling", "error", err, "in", d.Round(time.Millisecond))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// connectOnce authenticates with the stored credential, falling back to the
// enrollment token, and serves the tunnel until it ends.
func (a *Agent) connectOnce(ctx context.Context) error {
	cred, key, expires, err := a.stored(ctx)
	if err != nil {
		return err
	}
	var ws *websocket.Conn
	var version int
	if cred != "" {
		ws, version, err = a.dial(ctx, protocol.AuthCredential, cred, "")
		if errors.Is(err, errRefused) && !expires.IsZero() && !a.opts.Now().Before(expires) {
			// The hub says only "unauthorized"; the agent knows why. The credential is
			// still presented every time: a clock of the agent's ahead of the hub's must
			// not lock it out before the hub does.
			a.opts.Log.Error(fmt.Sprintf("the agent credential expired at %s and the hub no longer accepts it: the cluster needs a new enrollment token; run `flotilla cluster rotate-token %s` in the fleet repository, merge it, and install the agent with the new values file",
				expires.UTC().Format(time.RFC3339), workerName(a.opts.Identity)), "credential", fingerprint(cred), "expiredAt", expires.UTC().Format(time.RFC3339))
		}
		if errors.Is(err, errRefused) && a.opts.EnrollmentToken != "" {
			a.opts.Log.Warn("the hub refused the stored credential; trying the enrollment token")
		} else if err != nil {
			return err
		} else {
			return a.serve(ctx, ws, version)
		}
	}
	if a.opts.EnrollmentToken == "" {
		return errors.New("no credential is stored and no enrollment token is configured")
	}
	key, err = a.redemptionKey(ctx, key, cred, expires)
	if err != nil {
		return err
	}
	if ws, version, err = a.dial(ctx, protocol.AuthEnrollment, a.opts.EnrollmentToken, key); err != nil {
		return err
	}
	return a.serve(ctx, ws, version)
}

// redemptionKey is the key of this series of enrollment attempts: the one in memory,
// else the one stored (by a process that restarted during the series), else a new one,
// stored beside the credential so that a restart keeps it. cred, a stored credential
// the hub refused, is stored with it rather than thrown away, and so is its expiry:
// without it the agent, restarted or redialling, could no longer tell the operator that
// the credential expired and the cluster needs a new enrollment token.
func (a *Agent) redemptionKey(ctx context.Context, stored, cred protocol.Secret, expires time.Time) (protocol.Secret, error) {
	a.mu.Lock()
	key := a.redemption
	if key == "" {
		key = stored
	}
	a.mu.Unlock()
	if key == "" {
		var err error
		if key, err = protocol.NewRedemptionKey(); err != nil {
			return "", err
		}
	}
	a.mu.Lock()
	a.redemption = key
	a.mu.Unlock()
	if key != stored {
		if err := a.store(ctx, cred, key, expires); err != nil {
			// Kept in memory: a lost answer can still be recovered by this process.
			a.opts.Log.Error("storing the redemption key", "error", err)
		}
	}
	return key, nil
}

// dial opens the tunnel and returns it with the protocol version the hub negotiated.
func (a *Agent) dial(ctx context.Context, kind string, secret, redemptionKey protocol.Secret) (*websocket.Conn, int, error) {
	d := websocket.Dialer{
		TLSClientConfig:  a.opts.TLS,
		HandshakeTimeout: 15 * time.Second,
		ReadBufferSize:   1024,
		WriteBufferSize:  1024,
		Proxy:            http.ProxyFromEnvironment,
	}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+secret.Reveal())
	h.Set(protocol.HeaderIdentity, a.opts.Identity)
	h.Set(protocol.HeaderAuth, kind)
	h.Set(protocol.HeaderProtocol, strconv.Itoa(protocol.ProtocolVersion))
	if redemptionKey != "" {
		h.Set(protocol.HeaderRedemptionKey, redemptionKey.Reveal())
	}
	ws, resp, err := d.DialContext(ctx, a.opts.HubURL+protocol.Path, h)
	if err != nil {
		if resp != nil {
			defer resp.Body.Close()
			if resp.StatusCode == http.StatusUnauthorized {
				return nil, 0, fmt.Errorf("%w (%s)", errRefused, kind)
			}
			// The hub says why (a newer protocol, a budget spent): clipped, since
			// whatever answers the URL may say anything.
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			return nil, 0, fmt.Errorf("dialling the hub: HTTP %d: %s", resp.StatusCode, protocol.Clip(strings.TrimSpace(string(msg))))
		}
		return nil, 0, fmt.Errorf("dialling the hub: %w", err)
	}
	// Before anything the hub issued is stored: a hub that answers a version this agent
	// does not speak broke the negotiation, and nothing else it says is trusted.
	version, err := negotiated(resp.Header)
	if err != nil {
		_ = ws.Close()
		return nil, 0, err
	}
	if kind == protocol.AuthEnrollment {
		issued := protocol.Secret(resp.Header.Get(protocol.HeaderCredential))
		if issued == "" {
			_ = ws.Close()
			return nil, 0, errors.New("the hub admitted the enrollment but issued no credential")
		}
		// A hub before credential lifetimes sends no expiry: the credential has none.
		expires, _ := time.Parse(time.RFC3339, resp.Header.Get(protocol.HeaderCredentialExpires))
		a.mu.Lock()
		a.credential, a.expires = issued, expires
		a.redemption = ""
		a.mu.Unlock()
		if err := a.storeCredential(ctx, issued, expires); err != nil {
			// Kept in memory for this process; storing is retried at every rotation
			// and reconnect.
			a.opts.Log.Error("storing the agent credential", "error", err)
		}
		a.opts.Log.Info("enrolled: the enrollment token is redeemed and the credential stored", "credential", fingerprint(issued), "expiresAt", stampOrNone(expires))
	}
	return ws, version, nil
}

// negotiated is the version the hub answered the upgrade with: 1 from a hub that does
// not say, which predates negotiation.
func negotiated(h http.Header) (int, error) {
	s := h.Get(protocol.HeaderProtocol)
	if s == "" {
		return 1, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 || v > protocol.ProtocolVersion {
		return 0, fmt.Errorf("the hub answered protocol version %.10q; this agent speaks 1 to %d", s, protocol.ProtocolVersion)
	}
	return v, nil
}

func (a *Agent) serve(ctx context.Context, ws *websocket.Conn, version int) error {
	ws.SetReadLimit(int64(protocol.MaxMessageSize) + 1024)
	t, err := protocol.NewTunnel(ws, true, a.opts.Liveness)
	if err != nil {
		_ = ws.Close()
		return err
	}
	stream, err := t.OpenStream()
	if err != nil {
		_ = t.Close()
		return fmt.Errorf("opening the control stream: %w", err)
	}
	streamsDone := a.serveStreams(t, version)
	// Nothing of this tunnel outlives serve: its streams end with it, and so do the
	// goroutines that accept and refuse them (and log while they do).
	defer func() {
		_ = t.Close()
		streamsDone()
	}()
	conn := protocol.NewConn(stream)
	conn.SetVersion(version)
	a.mu.Lock()
	applied := a.applied
	a.mu.Unlock()
	if err := conn.Send(protocol.TypeHello, &protocol.Hello{Identity: a.opts.Identity, AgentVersion: a.opts.AgentVersion, KubernetesVersion: a.opts.KubernetesVersion, AppliedHash: applied}); err != nil {
		return err
	}
	a.connected.Store(true)
	a.everUp.Store(true)
	defer a.connected.Store(false)
	a.opts.Log.Info("connected to the hub", "protocol", version, "proxy", a.opts.Proxy != nil && version >= protocol.ProxyVersion)

	// Heartbeats, inventory and applies run beside the receive loop; they stop with the
	// tunnel. The tunnel's end waits for the apply under way, so that the next tunnel's
	// applies never run beside it.
	var applying sync.WaitGroup
	defer applying.Wait()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { <-sctx.Done(); _ = t.Close() }()
	go a.periodic(sctx, conn)
	desired := make(chan *protocol.DesiredState, 1)
	applying.Go(func() {
		if err := a.applyLoop(sctx, conn, desired); err != nil {
			a.opts.Log.Warn("reporting an applied state", "error", err)
			_ = t.Close()
		}
	})

	for {
		_, body, err := conn.Receive()
		if err != nil {
			if protocol.Recoverable(err) {
				a.opts.Log.Warn("refused a message from the hub", "error", err)
				_ = conn.Send(protocol.TypeError, protocol.RefusalFor(err))
				continue
			}
			return fmt.Errorf("control stream: %w", err)
		}
		if m, ok := body.(*protocol.DesiredState); ok {
			// In place of the state the apply loop has not taken yet: the newest is
			// applied, and the receive loop never waits for an apply. It alone sends,
			// so the slot is free once emptied.
			select {
			case <-desired:
			default:
			}
			desired <- m
			continue
		}
		if err := a.handle(sctx, conn, body); err != nil {
			return err
		}
	}
}

// streamKindTimeout bounds the wait for the first byte of a stream the hub opened.
const streamKindTimeout = 10 * time.Second

// serveStreams accepts the streams the hub opens until the tunnel closes. Proxy streams
// go to an http.Server of this tunnel when the agent has a proxy and the hub negotiated
// a version that has them; every other stream is closed at once rather than left to
// queue in the multiplexer. The returned function waits, once the tunnel is closed, for
// everything serveStreams started.
func (a *Agent) serveStreams(t *protocol.Tunnel, version int) (wait func()) {
	var wg sync.WaitGroup
	var ln *proxy.Listener
	why := "dispatch is turned off in this agent"
	switch {
	case version < protocol.ProxyVersion:
		why = "the hub negotiated a protocol version without such streams"
	case a.opts.Proxy != nil:
		ln = proxy.NewListener(a.opts.MaxProxyStreams)
		srv := proxy.NewServer(a.opts.Proxy, a.opts.Log)
		wg.Go(func() { _ = srv.Serve(ln) })
		// The server and its connections end with the tunnel; Close, not Shutdown:
		// their streams are gone with it.
		wg.Go(func() { <-t.CloseChan(); _ = srv.Close() })
	}
	wg.Go(func() {
		for {
			st, err := t.AcceptStream()
			if err != nil {
				return
			}
			if ln == nil {
				a.refuseStream(st, why, "protocol", version)
				continue
			}
			wg.Go(func() { a.routeStream(st, ln) })
		}
	})
	return wg.Wait
}

// routeStream reads a stream's kind and hands a proxy stream to ln.
func (a *Agent) routeStream(st *yamux.Stream, ln *proxy.Listener) {
	_ = st.SetReadDeadline(time.Now().Add(streamKindTimeout))
	kind, err := protocol.ReadStreamKind(st)
	if err != nil {
		a.refuseStream(st, "no stream kind", "error", err)
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	if kind != protocol.StreamProxy {
		a.refuseStream(st, "a stream of a kind this agent does not serve", "kind", kind.String())
		return
	}
	if !ln.Offer(st) {
		a.refuseStream(st, "too many proxy streams are open", "open", ln.Open())
	}
}

func (a *Agent) refuseStream(st *yamux.Stream, why string, args ...any) {
	_ = st.Close()
	n := a.streamRefused.Add(1)
	a.streamLog.Do(func() {
		a.opts.Log.Warn("refused a stream the hub opened: "+why, append(args, "refused", n)...)
	})
}

func (a *Agent) periodic(ctx context.Context, conn *protocol.Conn) {
	hb := time.NewTicker(a.opts.Liveness.Interval)
	inv := time.NewTicker(a.opts.InventoryEvery)
	defer hb.Stop()
	defer inv.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-hb.C:
			_ = conn.Send(protocol.TypeHeartbeat, &protocol.Heartbeat{Time: now.UTC()})
		case <-inv.C:
			a.sendInventory(ctx, conn)
		}
	}
}

func (a *Agent) handle(ctx context.Context, conn *protocol.Conn, body any) error {
	switch m := body.(type) {
	case *protocol.RotateCredential:
		if why := unusable(m.Credential); why != "" {
			// Not confirmed either: the hub keeps accepting the stored credential and
			// sends a rotation again, whereas storing this one would erase or replace the
			// stored one with what the agent cannot present, and lock it out.
			a.opts.Log.Error("refused the rotated credential: the stored one is kept, and the hub keeps accepting it until a rotation is confirmed",
				"reason", why, "credential", fingerprint(m.Credential), "expiresAt", stampOrNone(m.ExpiresAt))
			return conn.Send(protocol.TypeError, &protocol.Error{Code: protocol.CodeMalformed, Message: "the rotated credential is refused: " + why})
		}
		if err := a.storeCredential(ctx, m.Credential, m.ExpiresAt); err != nil {
			// Not confirmed: the hub keeps accepting the old credential, and sends the
			// new one again.
			a.opts.Log.Error("storing the rotated credential", "error", err)
			return nil
		}
		a.setCredential(m.Credential, m.ExpiresAt)
		a.opts.Log.Info("stored the rotated credential", "credential", fingerprint(m.Credential), "expiresAt", stampOrNone(m.ExpiresAt))
		return conn.Send(protocol.TypeCredentialStored, &protocol.CredentialStored{Fingerprint: fingerprint(m.Credential)})
	case *protocol.Heartbeat:
	case *protocol.Error:
		a.opts.Log.Warn("the hub refused a message", "code", m.Code, "message", m.Message)
	default:
		return conn.Send(protocol.TypeError, &protocol.Error{Code: protocol.CodeUnknownType, Message: fmt.Sprintf("%T is not a message a hub sends", body)})
	}
	return nil
}

// applyLoop applies the desired states the receive loop hands it, one at a time, the
// newest the hub sent first. While components converge it applies and reports the last
// state again every ComponentsRetry until another state arrives: a component that
// becomes ready later turns the worker green without the hub sending anything. One loop
// retries, never one per state: the hub sends its state again every five minutes and
// on every reconnect. It returns nil when ctx ends, or the error of a report it could
// not send.
func (a *Agent) applyLoop(ctx context.Context, conn *protocol.Conn, states <-chan *protocol.DesiredState) error {
	var (
		m     *protocol.DesiredState
		retry clock.Timer
	)
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	for {
		var fire <-chan time.Time
		if retry != nil {
			fire = retry.C()
		}
		select {
		case <-ctx.Done():
			return nil
		case m = <-states:
		case <-fire:
		}
		if retry != nil {
			retry.Stop()
			retry = nil
		}
		again, err := a.applyAndReport(ctx, conn, m)
		if err != nil {
			return err
		}
		if again {
			retry = a.opts.Clock.NewTimer(a.opts.ComponentsRetry)
		}
	}
}

// applyAndReport applies m once and reports it; again says that a component is on its
// way, and m is worth applying again.
func (a *Agent) applyAndReport(ctx context.Context, conn *protocol.Conn, m *protocol.DesiredState) (again bool, err error) {
	// The apply runs to its end even if the tunnel drops meanwhile: the hub sends the
	// state again on reconnecting, and applying it again changes nothing.
	// A proxy without a scope yet (the agent restarted) takes the state's before the
	// apply, as far as the worker has its namespaces already, so that the hub's Kueue
	// is not kept waiting through an apply of minutes (components converging); every
	// proxy takes it after the apply, with the namespaces it made.
	a.scopeProxy(ctx, m, true)
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.opts.ApplyTimeout)
	res := a.opts.Applier.Apply(actx, *m)
	cancel()
	res.Generation, res.Hash = m.Generation, m.Hash
	a.scopeProxy(ctx, m, false)
	if res.Complete() {
		a.mu.Lock()
		a.applied = m.Hash
		a.mu.Unlock()
	}
	a.opts.Log.Info("applied the desired state", "hash", m.Hash, "generation", m.Generation, "objects", len(res.Results), "complete", res.Complete())
	// The inventory goes first: the report that makes the cluster ready should find
	// its GPUs already known, so that the first green status counts them.
	a.sendInventory(ctx, conn)
	if err := conn.Send(protocol.TypeApplied, &res); err != nil {
		return false, err
	}
	return converging(res.Components), nil
}

// scopeProxy narrows the API proxy to what the state m lets the hub's Kueue reach: its
// workload namespaces, once they exist; those it dropped are out of reach (agent/proxy's
// package doc says what becomes of what is left in them). Before an apply it scopes only
// a proxy that has no scope, and logs nothing: a namespace the apply has yet to make is
// no news.
func (a *Agent) scopeProxy(ctx context.Context, m *protocol.DesiredState, beforeApply bool) {
	if a.opts.Proxy == nil || beforeApply && a.opts.Proxy.Scope().Origin != "" {
		return
	}
	var s proxy.Scope
	if d := m.Dispatch; d != nil && !m.Decommission {
		s = proxy.Scope{Origin: d.Origin, Namespaces: d.Namespaces}
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.opts.ApplyTimeout)
	defer cancel()
	excluded, err := a.opts.Proxy.SetScope(actx, s)
	if beforeApply {
		return
	}
	if err != nil {
		a.opts.Log.Error("binding the dispatch identity in the workload namespaces", "error", err)
	}
	// Said when it changes, not at every resync.
	after := a.opts.Proxy.Scope()
	a.mu.Lock()
	before := a.saidScope
	a.saidScope = after
	a.mu.Unlock()
	if after.Origin == before.Origin && slices.Equal(after.Namespaces, before.Namespaces) {
		return
	}
	for _, e := range excluded {
		a.opts.Log.Warn("the hub's Kueue may not reach a workload namespace", "namespace", e.Namespace, "reason", e.Reason)
	}
	a.opts.Log.Info("the hub's Kueue may reach", "origin", after.Origin, "namespaces", after.Namespaces)
}

// converging: a component is on its way, not refused or failed.
func converging(statuses []components.Status) bool {
	waiting := false
	for _, s := range statuses {
		switch {
		case s.Action == components.ActionRefused || s.Action == components.ActionFailed:
			return false
		case !s.Ready:
			waiting = true
		}
	}
	return waiting
}

func (a *Agent) sendInventory(ctx context.Context, conn *protocol.Conn) {
	if a.opts.Inventory == nil {
		return
	}
	inv, err := a.opts.Inventory.Collect(ctx)
	if err != nil {
		a.opts.Log.Error("reading the GPU inventory", "error", err)
		return
	}
	_ = conn.Send(protocol.TypeInventory, &inv)
}

// fingerprint is how the hub names a credential: the first 12 hex digits of its
// SHA-256.
func fingerprint(s protocol.Secret) string {
	sum := sha256.Sum256([]byte(s.Reveal()))
	return hex.EncodeToString(sum[:6])
}

// unusable is why a rotated credential cannot replace the stored one, or "" when it
// can. An empty one would be no credential: the Secret keeps only what is not empty.
// One that is not a bearer token (RFC 6750's b64token) the agent could not present in
// its Authorization header. The reason never repeats the credential.
func unusable(s protocol.Secret) string {
	c := s.Reveal()
	if c == "" {
		return "it is empty"
	}
	body := strings.TrimRight(c, "=")
	if body == "" || strings.IndexFunc(body, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("-._~+/", r))
	}) >= 0 {
		return "it is not a bearer token (RFC 6750): it may hold only letters, digits and -._~+/, then = at its end"
	}
	return ""
}

func (a *Agent) setCredential(s protocol.Secret, expires time.Time) {
	a.mu.Lock()
	a.credential, a.expires = s, expires
	a.mu.Unlock()
}

// stampOrNone is an expiry for the log: RFC 3339, or "none" from a hub that sent none.
func stampOrNone(t time.Time) string {
	if t.IsZero() {
		return "none"
	}
	return t.UTC().Format(time.RFC3339)
}

// workerName is the cluster's name in the fleet repository, read from its identity
// (<length of the tenant>-<tenant>-<worker>), for what to tell the operator; NAME when
// the identity was shortened with a hash and the name cannot be read back.
func workerName(identity string) string {
	n, rest, ok := strings.Cut(identity, "-")
	tenant, err := strconv.Atoi(n)
	if !ok || err != nil || tenant < 1 || len(rest) < tenant+2 || rest[tenant] != '-' || len(identity) >= validation.LabelValueMaxLength {
		return "NAME"
	}
	return rest[tenant+1:]
}

// stored is the credential in the Secret, or the one in memory when the Secret could
// not be written, with its expiry, and the redemption key in the Secret.
func (a *Agent) stored(ctx context.Context) (cred, key protocol.Secret, expires time.Time, err error) {
	var sec corev1.Secret
	err = a.opts.Client.Get(ctx, a.opts.CredentialSecret, &sec)
	a.mu.Lock()
	mem, memExpires := a.credential, a.expires
	a.mu.Unlock()
	switch {
	case apierrors.IsNotFound(err):
		if mem != "" {
			_ = a.storeCredential(ctx, mem, memExpires)
		}
		return mem, "", memExpires, nil
	case err != nil:
		if mem != "" {
			return mem, "", memExpires, nil
		}
		return "", "", time.Time{}, fmt.Errorf("reading the credential Secret %s: %w", a.opts.CredentialSecret, err)
	}
	key = protocol.Secret(sec.Data[RedemptionKeyKey])
	if stored := protocol.Secret(sec.Data[CredentialKey]); stored != "" {
		// An expiry that does not parse is one not known.
		expires, _ = time.Parse(time.RFC3339, string(sec.Data[ExpiresAtKey]))
		return stored, key, expires, nil
	}
	return mem, key, memExpires, nil
}

// storeCredential stores the credential alone, with its expiry: a redemption key stored
// before is dropped with it.
func (a *Agent) storeCredential(ctx context.Context, s protocol.Secret, expires time.Time) error {
	return a.store(ctx, s, "", expires)
}

// store makes the Secret hold the credential, its expiry and the redemption key, those
// not empty.
func (a *Agent) store(ctx context.Context, cred, key protocol.Secret, expires time.Time) error {
	data := map[string][]byte{}
	if cred != "" {
		data[CredentialKey] = []byte(cred.Reveal())
		if !expires.IsZero() {
			data[ExpiresAtKey] = []byte(expires.UTC().Format(time.RFC3339))
		}
	}
	if key != "" {
		data[RedemptionKeyKey] = []byte(key.Reveal())
	}
	sec := corev1ac.Secret(a.opts.CredentialSecret.Name, a.opts.CredentialSecret.Namespace).
		WithLabels(map[string]string{"app.kubernetes.io/name": "flotilla-agent"}).
		WithType(corev1.SecretTypeOpaque).
		WithData(data)
	// Apply replaces what the agent owns whole: a key not named here is dropped.
	if err := a.opts.Client.Apply(ctx, sec, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("writing the credential Secret %s: %w", a.opts.CredentialSecret, err)
	}
	return nil
}

package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// session is one agent's live tunnel.
type session struct {
	srv      *Server
	tunnel   *protocol.Tunnel
	conn     *protocol.Conn
	wc       *v1alpha1.WorkerCluster
	identity string
	// version is the protocol version negotiated with the agent.
	version  int
	log      *slog.Logger
	replaced atomic.Bool
	// issued is the credential issued by the redemption that opened this tunnel, if
	// one did: the agent's hello shows that the answer arrived.
	issued secrets.Hash
	// stuck is set when a write to the agent timed out and the hub closed the tunnel.
	stuck atomic.Bool

	mu            sync.Mutex
	lastSeenSaved time.Time
	pending       secrets.Token // a rotated credential not yet confirmed
	sent          string        // hash of the desired state sent last
	timers        []*time.Timer
	closed        bool
	// next is the desired state waiting for the writer; a newer one replaces it.
	next *protocol.DesiredState
	// writing is set while a writer goroutine drains next. There is none while nothing
	// waits, so an idle session costs no stack for it.
	writing bool
}

func (s *session) run(ctx context.Context) {
	defer s.tunnel.Close()
	hctx, cancel := context.WithTimeout(ctx, s.srv.opts.HandshakeTimeout)
	stream, err := s.tunnel.AcceptStreamWithContext(hctx)
	cancel()
	if err != nil {
		s.log.Warn("the agent opened no control stream", "error", err)
		return
	}
	s.conn = protocol.NewConn(stream)
	s.conn.SetVersion(s.version)
	s.conn.SetWriteTimeout(s.srv.opts.WriteTimeout)
	// Until the agent says who it is, it gets no room for more than a hello.
	s.conn.SetMaxMessageSize(protocol.MaxHelloSize)
	_ = stream.SetReadDeadline(time.Now().Add(s.srv.opts.HandshakeTimeout))
	_, body, err := s.conn.Receive()
	hello, ok := body.(*protocol.Hello)
	if errors.Is(err, protocol.ErrTooLarge) {
		s.log.Warn("closing the tunnel: the agent's first message is larger than a hello may be", "cap", protocol.MaxHelloSize, "error", err)
		return
	}
	if err != nil || !ok {
		s.log.Warn("the agent sent no hello", "error", err)
		_ = s.conn.Send(protocol.TypeError, &protocol.Error{Code: protocol.CodeMalformed, Message: "the first message must be a hello"})
		return
	}
	if hello.Identity != s.identity {
		s.log.Warn("the agent's hello names another identity", "hello", hello.Identity)
		_ = s.conn.Send(protocol.TypeError, &protocol.Error{Code: protocol.CodeMalformed, Message: "the hello names another identity than the upgrade request"})
		return
	}
	_ = stream.SetReadDeadline(time.Time{})
	s.conn.SetMaxMessageSize(protocol.MaxMessageSize)

	s.srv.register(s)
	s.log.Info("agent connected", "agentVersion", hello.AgentVersion, "kubernetesVersion", hello.KubernetesVersion, "appliedHash", hello.AppliedHash)
	defer s.stop(ctx)
	if err := s.forgetRedemptionKey(ctx); err != nil {
		s.log.Error("forgetting the redemption key", "error", err)
	}
	if err := s.connected(ctx, hello); err != nil {
		s.log.Error("recording the connection", "error", err)
	}
	s.queueDesired()
	s.every(s.srv.opts.ResyncEvery, s.queueDesired)
	s.every(s.srv.opts.RotateEvery, func() {
		if err := s.rotate(ctx); err != nil {
			s.log.Error("rotating the agent credential", "error", err)
		}
	})

	for {
		_, body, err := s.conn.Receive()
		if err != nil {
			if protocol.Recoverable(err) {
				s.log.Warn("refused a message from the agent", "error", err)
				_ = s.send(protocol.TypeError, protocol.RefusalFor(err))
				continue
			}
			if !errors.Is(err, io.EOF) && !s.replaced.Load() && !s.stuck.Load() {
				s.log.Info("tunnel closed", "error", err)
			}
			return
		}
		if err := s.handle(ctx, body); err != nil {
			s.log.Error("handling a message from the agent", "error", err)
		}
	}
}

// forgetRedemptionKey drops the redemption key's hash once the agent has said hello:
// it holds its credential, so the redemption is not to be repeated, by it or by anyone
// who learnt its key.
func (s *session) forgetRedemptionKey(ctx context.Context) error {
	if !s.issued.IsZero() {
		// Just redeemed on this connection: the cache may not show the key yet.
		return s.srv.writeCredential(ctx, s.wc, credentialHashes{current: s.issued})
	}
	var sec corev1.Secret
	if err := s.srv.opts.Reader.Get(ctx, client.ObjectKey{Namespace: s.wc.Namespace, Name: CredentialSecretName(s.wc.Name)}, &sec); err != nil {
		return client.IgnoreNotFound(err)
	}
	if _, ok := sec.Data[redemptionKeyHashKey]; !ok {
		return nil
	}
	current, _ := secrets.ParseHash(string(sec.Data[credentialHashKey]))
	pending, _ := secrets.ParseHash(string(sec.Data[pendingHashKey]))
	if current.IsZero() {
		return nil // revoked meanwhile: nothing to keep
	}
	return s.srv.writeCredential(ctx, s.wc, credentialHashes{current: current, pending: pending})
}

func (s *session) handle(ctx context.Context, body any) error {
	switch m := body.(type) {
	case *protocol.Applied:
		return s.applied(ctx, m)
	case *protocol.Inventory:
		return s.inventory(ctx, m)
	case *protocol.Heartbeat:
		return s.seen(ctx)
	case *protocol.CredentialStored:
		return s.credentialStored(ctx, m)
	case *protocol.Error:
		s.log.Warn("the agent refused a message", "code", m.Code, "message", m.Message)
		return nil
	}
	return s.send(protocol.TypeError, &protocol.Error{Code: protocol.CodeUnknownType, Message: fmt.Sprintf("%T is not a message an agent sends", body)})
}

// send writes one message, within WriteTimeout. An agent that took nothing for that
// long is stuck: its tunnel is closed, and stop records why.
func (s *session) send(typ string, body any) error {
	err := s.conn.Send(typ, body)
	if err != nil && protocol.IsWriteTimeout(err) && s.stuck.CompareAndSwap(false, true) {
		s.log.Warn("disconnecting the agent: it took nothing the hub sent", "message", typ, "writeTimeout", s.srv.opts.WriteTimeout)
		_ = s.tunnel.Close()
	}
	return err
}

// every runs f every d until the session stops; a timer, not a goroutine, so an idle
// session costs no stack for it.
func (s *session) every(d time.Duration, f func()) {
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		f()
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.closed {
			t.Reset(d)
		}
	})
	s.mu.Lock()
	s.timers = append(s.timers, t)
	s.mu.Unlock()
}

func (s *session) stop(ctx context.Context) {
	s.mu.Lock()
	s.closed = true
	for _, t := range s.timers {
		t.Stop()
	}
	s.mu.Unlock()
	if !s.srv.unregister(s) || s.srv.closing.Load() {
		return // a newer connection of the identity owns the status now, or the hub leaves
	}
	cause := conditions.HungUp
	switch {
	case s.stuck.Load():
		cause = conditions.Stuck
	case s.tunnel.WriteTimedOut():
		cause = conditions.Stalled
	}
	s.log.Info("agent disconnected", "cause", cause)
	if err := s.record(ctx, conditions.Disconnected{At: s.srv.opts.Now(), Cause: cause, WriteTimeout: s.srv.opts.WriteTimeout}); err != nil {
		s.log.Error("recording the disconnection", "error", err)
	}
}

// queueDesired hands the identity's current desired state, as the hub last pushed it,
// to the writer. It touches nothing on the network, so the caller never waits for the
// agent.
func (s *session) queueDesired() {
	ds := s.srv.desiredState(s.identity)
	if ds == nil {
		return // nothing to send yet
	}
	s.mu.Lock()
	s.next = ds
	start := !s.writing && !s.closed
	if start {
		s.writing = true
	}
	s.mu.Unlock()
	if start {
		go s.write()
	}
}

// write sends the waiting desired state until none waits. It writes nothing to the hub
// cluster: the hash sent is recorded with the agent's report of applying it.
func (s *session) write() {
	for {
		s.mu.Lock()
		ds := s.next
		s.next = nil
		if ds == nil || s.closed {
			s.writing = false
			s.mu.Unlock()
			return
		}
		s.sent = ds.Hash
		s.mu.Unlock()
		if err := s.send(protocol.TypeDesired, ds); err != nil {
			s.log.Warn("sending the desired state", "hash", ds.Hash, "error", err)
		}
	}
}

func (s *session) connected(ctx context.Context, hello *protocol.Hello) error {
	now := s.srv.opts.Now()
	s.mu.Lock()
	s.lastSeenSaved = now
	s.mu.Unlock()
	return s.record(ctx, conditions.Connected{At: now, AgentVersion: hello.AgentVersion, KubernetesVersion: hello.KubernetesVersion, Protocol: s.version})
}

// seen records status.lastSeen, at most once per LastSeenEvery.
func (s *session) seen(ctx context.Context) error {
	now := s.srv.opts.Now()
	s.mu.Lock()
	due := now.Sub(s.lastSeenSaved) >= s.srv.opts.LastSeenEvery
	if due {
		s.lastSeenSaved = now
	}
	s.mu.Unlock()
	if !due {
		return nil
	}
	return s.record(ctx, conditions.Seen{At: now})
}

func (s *session) applied(ctx context.Context, a *protocol.Applied) error {
	s.mu.Lock()
	sent := s.sent
	s.mu.Unlock()
	s.log.Info("the agent applied a desired state", "hash", a.Hash, "generation", a.Generation, "complete", a.Complete())
	return s.record(ctx, conditions.Applied{Report: a, Sent: sent})
}

func (s *session) inventory(ctx context.Context, inv *protocol.Inventory) error {
	return s.record(ctx, conditions.Inventory{Report: inv})
}

// rotate issues a new credential. The old one stays valid until the agent confirms it
// stored the new one, so a rotation cut short by a disconnect never locks it out.
func (s *session) rotate(ctx context.Context) error {
	s.mu.Lock()
	inFlight := !s.pending.IsZero()
	s.mu.Unlock()
	if inFlight {
		// The agent has not confirmed the last one: a second pending credential could
		// leave it holding one the hub no longer accepts.
		s.log.Warn("not rotating the agent credential: the last rotation is unconfirmed")
		return nil
	}
	cred, err := secrets.NewToken()
	if err != nil {
		return err
	}
	current, err := s.currentCredential(ctx)
	if err != nil {
		return err
	}
	if err := s.srv.writeCredential(ctx, s.wc, credentialHashes{current: current, pending: cred.Hash()}); err != nil {
		return err
	}
	s.mu.Lock()
	s.pending = cred
	s.mu.Unlock()
	s.log.Info("rotating the agent credential", "credential", cred.Hash().Fingerprint())
	return s.send(protocol.TypeRotateCredential, &protocol.RotateCredential{Credential: protocol.Secret(cred.Reveal())})
}

func (s *session) currentCredential(ctx context.Context) (secrets.Hash, error) {
	sec := new(corev1.Secret)
	if err := s.srv.opts.Client.Get(ctx, client.ObjectKey{Namespace: s.wc.Namespace, Name: CredentialSecretName(s.wc.Name)}, sec); err != nil {
		return secrets.Hash{}, fmt.Errorf("reading the credential of WorkerCluster %s/%s: %w", s.wc.Namespace, s.wc.Name, err)
	}
	return secrets.ParseHash(string(sec.Data[credentialHashKey]))
}

func (s *session) credentialStored(ctx context.Context, m *protocol.CredentialStored) error {
	s.mu.Lock()
	pending := s.pending
	s.mu.Unlock()
	if pending.IsZero() || pending.Hash().Fingerprint() != m.Fingerprint {
		return fmt.Errorf("the agent confirmed credential %q, which is not the one sent", m.Fingerprint)
	}
	if err := s.srv.writeCredential(ctx, s.wc, credentialHashes{current: pending.Hash()}); err != nil {
		return err
	}
	s.mu.Lock()
	s.pending = secrets.Token{}
	s.mu.Unlock()
	s.log.Info("agent credential rotated", "credential", m.Fingerprint)
	return s.record(ctx, conditions.CredentialIssued{Fingerprint: m.Fingerprint, At: s.srv.opts.Now()})
}

// record hands facts about the agent to the owner of the WorkerCluster's status.
func (s *session) record(ctx context.Context, facts ...conditions.Fact) error {
	_, err := s.srv.opts.Status.Record(ctx, client.ObjectKeyFromObject(s.wc), facts...)
	return err
}

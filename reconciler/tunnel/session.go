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

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/logbudget"
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
	// admittedWith is the credential Secret as authentication read or wrote it.
	admittedWith credentialRecord
	// justIssued is set when a redemption opened this tunnel, so that admittedWith is
	// what it wrote: the agent's hello shows that the answer arrived.
	justIssued bool
	// promoted is set when authentication made the rotated credential the one in force.
	promoted bool
	// stuck is set when a write to the agent timed out and the hub closed the tunnel.
	stuck atomic.Bool
	// expired is set when the hub closed the tunnel because the credential expired.
	expired atomic.Bool
	// revoked is set when the hub closed the tunnel because Git revoked the credential.
	revoked atomic.Bool

	// reports is the agent's budget of reports that make the hub write.
	reports *reports
	// agentLines bounds the log lines the agent's own messages cause (its errors, what
	// the hub refused of it): an agent must not write the hub's log at its link's rate.
	agentLines logbudget.Budget

	// cred is the credential's state; its mutex serializes the credential's work (the
	// clock, a confirmation), which writes the Secret and sends to the agent.
	cred credentialState

	mu            sync.Mutex
	lastSeenSaved time.Time
	sent          string // hash of the desired state sent last
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
		if !s.brokeProtocol() {
			s.log.Warn("the agent opened no control stream", "error", err)
		}
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
		if s.brokeProtocol() {
			return
		}
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
	s.tunnel.HelloRead()

	s.srv.register(s)
	s.log.Info("agent connected", "agentVersion", hello.AgentVersion, "kubernetesVersion", hello.KubernetesVersion, "appliedHash", hello.AppliedHash)
	defer s.stop(ctx)
	inForce, err := s.startCredential(ctx)
	if err != nil {
		s.log.Error("reading the agent credential's lifetime", "error", err)
	}
	if err := s.connected(ctx, hello, inForce...); err != nil {
		s.log.Error("recording the connection", "error", err)
	}
	s.queueDesired()
	s.every(s.srv.opts.ResyncEvery, s.queueDesired)
	s.startCredentialClock(ctx)

	for {
		_, body, err := s.conn.Receive()
		if err != nil {
			if protocol.Recoverable(err) {
				s.agentLines.Log(s.log, slog.LevelWarn, "refused a message from the agent", "error", err)
				_ = s.send(protocol.TypeError, protocol.RefusalFor(err))
				continue
			}
			if !s.brokeProtocol() && !errors.Is(err, io.EOF) && !s.replaced.Load() && !s.stuck.Load() {
				s.log.Info("tunnel closed", "error", err)
			}
			return
		}
		if err := s.handle(ctx, body); err != nil {
			s.log.Error("handling a message from the agent", "error", err)
		}
	}
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
		s.agentLines.Log(s.log, slog.LevelWarn, "the agent refused a message", "code", protocol.Clip(m.Code), "message", protocol.Clip(m.Message))
		return nil
	}
	return s.send(protocol.TypeError, &protocol.Error{Code: protocol.CodeUnknownType, Message: fmt.Sprintf("%T is not a message an agent sends", body)})
}

// brokeProtocol reports whether the tunnel closed because the agent broke a rule of
// the transport, and says so in the log: the read that failed for it only shows the
// tunnel gone.
func (s *session) brokeProtocol() bool {
	err := s.tunnel.Refused()
	if err != nil {
		s.log.Warn("the hub closed the tunnel: the agent broke the protocol", "error", err)
	}
	return err != nil
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
	case s.revoked.Load():
		cause = conditions.Revoked
	case s.reports.wasFlooded():
		cause = conditions.Flooded
	case s.expired.Load():
		cause = conditions.Expired
	case s.stuck.Load():
		cause = conditions.Stuck
	case s.tunnel.WriteTimedOut():
		cause = conditions.Stalled
	}
	s.log.Info("agent disconnected", "cause", cause)
	facts := append(s.reports.drain(), conditions.Disconnected{At: s.srv.opts.Now(), Cause: cause, WriteTimeout: s.srv.opts.WriteTimeout, ReportBudget: s.reports.budget.String()})
	if err := s.record(ctx, facts...); err != nil {
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

// connected records the connection, with what is learnt of the credential with it.
func (s *session) connected(ctx context.Context, hello *protocol.Hello, also ...conditions.Fact) error {
	now := s.srv.opts.Now()
	s.mu.Lock()
	s.lastSeenSaved = now
	s.mu.Unlock()
	return s.record(ctx, append([]conditions.Fact{conditions.Connected{At: now, AgentVersion: hello.AgentVersion, KubernetesVersion: hello.KubernetesVersion, Protocol: s.version}}, also...)...)
}

// seen records status.lastSeen, at most once per lastSeenEvery.
func (s *session) seen(ctx context.Context) error {
	now := s.srv.opts.Now()
	every := s.srv.lastSeenEvery()
	s.mu.Lock()
	due := now.Sub(s.lastSeenSaved) >= every
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
	s.agentLines.Log(s.log, slog.LevelInfo, "the agent applied a desired state", "hash", protocol.Clip(a.Hash), "generation", a.Generation, "complete", a.Complete())
	return s.report(ctx, protocol.TypeApplied, conditions.Applied{Report: a, Sent: sent})
}

func (s *session) inventory(ctx context.Context, inv *protocol.Inventory) error {
	return s.report(ctx, protocol.TypeInventory, conditions.Inventory{Report: inv})
}

// record hands facts about the agent to the owner of the WorkerCluster's status. The
// session learns each only once: facts the hub cluster refused are tried again with the
// cluster's next write or a heartbeat later, so that a connection refused once does not
// leave the cluster waiting for an agent connected all along until it reconnects.
func (s *session) record(ctx context.Context, facts ...conditions.Fact) error {
	_, err := s.srv.opts.Status.RecordOrRetry(ctx, s.srv.life, client.ObjectKeyFromObject(s.wc), s.srv.opts.Liveness.Interval, facts...)
	return err
}

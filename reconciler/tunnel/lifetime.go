package tunnel

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// Credential lifetimes.
//
// Each credential is good from its issue until its expiry, a lifetime that Git declares
// (spec.credentialLifetime, else Options.CredentialLifetime); the credential Secret
// records both times beside the hash. A session rotates its agent's credential once it
// is RotateEvery old (a day by default) or half its lifetime, whichever comes first:
// the day bounds what a leaked credential is worth, and the half leaves a short
// lifetime the second half for retries. A rotation the agent does not confirm is sent
// again, the same credential, every RotateEvery or twelfth of the lifetime, whichever is
// sooner. A credential reaches the last third of its lifetime only when a sixth of it
// or more went by without a confirmed rotation: the session records it then, and the
// WorkerCluster's CredentialCurrent turns False (conditions.WarningBegins). At the
// expiry the session closes the tunnel; the agent's redial is refused.
//
// Agents that are not connected are not forgotten: every CredentialCheckEvery the
// server judges again the WorkerClusters of the clusters it knows (those the hub pushed)
// whose agent is away, so that their last third and their end show on the WorkerCluster
// and its commit too.

// credentialState is what a session knows of its agent's credential. Its mutex is held
// through each piece of credential work, which writes the Secret and sends to the
// agent, so that a rotation and a confirmation never interleave.
type credentialState struct {
	mu sync.Mutex
	// current is the credential in force, as the Secret records it.
	current issuedCredential
	// pending is the rotated credential sent and not confirmed yet, life its lifetime,
	// sent when it was last sent; zero while none waits.
	pending secrets.Token
	life    issuedCredential
	sent    time.Time
	// warned is set once current's last third was recorded.
	warned bool
}

// startCredential settles the credential the agent connected with, and returns what to
// record of it with the connection. The redemption key is forgotten once the agent said
// hello: it holds its credential, so the redemption is not to be repeated, by it or by
// anyone who learnt its key. A credential issued before the hub recorded lifetimes gets
// one from now, the hub's first sight of it since, so that an upgrade expires nothing.
func (s *session) startCredential(ctx context.Context) ([]conditions.Fact, error) {
	rec := s.admittedWith
	stale := !rec.redemptionKey.IsZero() || rec.current.expires.IsZero() || !rec.pending.hash.IsZero() && rec.pending.expires.IsZero()
	if stale && !s.justIssued && !s.promoted {
		// Authentication read the cache: what is written starts from the hub
		// cluster's own.
		var sec corev1.Secret
		err := s.srv.opts.Client.Get(ctx, client.ObjectKey{Namespace: s.wc.Namespace, Name: CredentialSecretName(s.wc.Name)}, &sec)
		if apierrors.IsNotFound(err) {
			return nil, nil // revoked meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("reading the credential of WorkerCluster %s/%s: %w", s.wc.Namespace, s.wc.Name, err)
		}
		rec = readRecord(&sec)
	}
	if rec.current.hash.IsZero() {
		return nil, nil // revoked meanwhile
	}
	now := s.srv.opts.Now().UTC().Truncate(time.Second)
	life := s.srv.lifetime(s.wc)
	dirty, assumed := !rec.redemptionKey.IsZero(), false
	rec.redemptionKey = secrets.Hash{}
	if rec.current.expires.IsZero() {
		rec.current.issued, rec.current.expires = now, now.Add(life)
		dirty, assumed = true, true
	}
	if !rec.pending.hash.IsZero() && rec.pending.expires.IsZero() {
		rec.pending.issued, rec.pending.expires = now, now.Add(life)
		dirty = true
	}
	// Kept even should the write fail: the clock rotates the credential all the same,
	// and the rotation records the new one's lifetime.
	s.cred.mu.Lock()
	s.cred.current = rec.current
	s.cred.mu.Unlock()
	if dirty {
		if err := s.srv.writeCredential(ctx, s.wc, rec); err != nil {
			return nil, err
		}
	}
	fp := rec.current.hash.Fingerprint()
	if assumed {
		s.log.Info("the agent credential was issued before the hub recorded credential lifetimes: its lifetime counts from now, the hub's first sight of it",
			"credential", fp, "lifetime", conditions.Lifetime(life), "expiresAt", stamp(rec.current.expires))
	}
	if s.promoted {
		return []conditions.Fact{conditions.CredentialRotated{Fingerprint: fp, IssuedAt: rec.current.issued, ExpiresAt: rec.current.expires, At: now, Revocation: rec.current.revocation}}, nil
	}
	return []conditions.Fact{conditions.CredentialInForce{Fingerprint: fp, IssuedAt: rec.current.issued, ExpiresAt: rec.current.expires, Assumed: assumed, Revocation: rec.current.revocation}}, nil
}

// startCredentialClock looks at the credential now, and again whenever its next moment
// comes, or after CredentialCheckEvery at the latest.
func (s *session) startCredentialClock(ctx context.Context) {
	if next := s.credentialClock(ctx); next > 0 {
		s.schedule(next, func() time.Duration { return s.credentialClock(ctx) })
	}
}

// schedule runs f after d, and again after each duration it returns, until it returns
// zero or the session stops; a timer, not a goroutine, so an idle session costs no
// stack for it.
func (s *session) schedule(d time.Duration, f func() time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		next := f()
		s.mu.Lock()
		defer s.mu.Unlock()
		if next > 0 && !s.closed {
			t.Reset(next)
		}
	})
	s.timers = append(s.timers, t)
}

// credentialClock does what the credential's lifetime asks for now: close the tunnel of
// an expired credential, rotate one that is due, send an unconfirmed rotation again,
// record the start of the last third. It returns when to look again; zero once the
// tunnel is closed.
func (s *session) credentialClock(ctx context.Context) time.Duration {
	c := &s.cred
	c.mu.Lock()
	defer c.mu.Unlock()
	o := &s.srv.opts
	cur := c.current
	if cur.hash.IsZero() || cur.expires.IsZero() {
		return o.CredentialCheckEvery // revoked, or not read: nothing to keep
	}
	now := o.Now()
	fp := cur.hash.Fingerprint()
	if cur.expiredAt(now) {
		s.log.Warn("closing the tunnel: the agent credential expired; the cluster needs a new enrollment token (flotilla cluster rotate-token "+s.wc.Name+")",
			"credential", fp, "expiredAt", stamp(cur.expires))
		s.expired.Store(true)
		if err := s.record(ctx); err != nil {
			s.log.Error("recording the expired credential", "error", err)
		}
		_ = s.tunnel.Close()
		return 0
	}
	life := cur.expires.Sub(cur.issued)
	rotateAt := cur.issued.Add(min(o.RotateEvery, life/2))
	retry := min(o.RotateEvery, life/12)
	var err error
	switch {
	case c.pending.IsZero() && !now.Before(rotateAt):
		err = s.rotate(ctx, now)
	case !c.pending.IsZero() && !now.Before(c.sent.Add(retry)):
		err = s.sendAgain(now)
	}
	if err != nil {
		s.log.Error("rotating the agent credential", "error", err)
	}
	warnAt := conditions.WarningBegins(cur.issued, cur.expires)
	if !c.warned && !now.Before(warnAt) {
		c.warned = true
		s.log.Warn("the agent credential is in the last third of its lifetime and no rotation was confirmed: once it expires the agent cannot connect",
			"credential", fp, "expiresAt", stamp(cur.expires), "rotationUnconfirmed", !c.pending.IsZero())
		if err := s.record(ctx); err != nil {
			s.log.Error("recording the credential's last third", "error", err)
		}
	}
	next := cur.expires
	if c.pending.IsZero() {
		next = earliest(next, rotateAt)
	} else {
		next = earliest(next, c.sent.Add(retry))
	}
	if !c.warned {
		next = earliest(next, warnAt)
	}
	// Past due means the work just failed: it is tried again at the next check.
	if d := next.Sub(now); d > 0 && d < o.CredentialCheckEvery {
		return d
	}
	return o.CredentialCheckEvery
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// rotate issues a new credential and sends it. The old one stays valid until the agent
// confirms it stored the new one, so a rotation cut short by a disconnect never locks it
// out. The caller holds s.cred.mu.
func (s *session) rotate(ctx context.Context, now time.Time) error {
	var sec corev1.Secret
	if err := s.srv.opts.Client.Get(ctx, client.ObjectKey{Namespace: s.wc.Namespace, Name: CredentialSecretName(s.wc.Name)}, &sec); err != nil {
		return fmt.Errorf("reading the credential of WorkerCluster %s/%s: %w", s.wc.Namespace, s.wc.Name, err)
	}
	rec := readRecord(&sec)
	if rec.current.hash.IsZero() {
		return nil // revoked: nothing to rotate
	}
	// The lifetime Git declares now, as far as the cache knows.
	wc := new(v1alpha1.WorkerCluster)
	if err := s.srv.opts.Reader.Get(ctx, client.ObjectKeyFromObject(s.wc), wc); err != nil {
		wc = s.wc
	}
	if rec.current.revokedBy(wc) {
		// Git revoked the credential in force: its successor must not be issued to
		// whoever holds it.
		s.closeRevoked(rec.current, wc)
		return nil
	}
	cred, pending, err := s.srv.issue(wc)
	if err != nil {
		return err
	}
	// A rotation keeps the revocation its predecessor was issued under: only the
	// redemption of a new enrollment token earns a later one.
	pending.revocation = rec.current.revocation
	rec.pending, rec.redemptionKey = pending, secrets.Hash{}
	if err := s.srv.writeCredential(ctx, s.wc, rec); err != nil {
		return err
	}
	c := &s.cred
	c.current = rec.current
	c.pending, c.life, c.sent = cred, pending, now
	s.log.Info("rotating the agent credential", "credential", pending.hash.Fingerprint(), "expiresAt", stamp(pending.expires))
	if err := s.send(protocol.TypeRotateCredential, &protocol.RotateCredential{Credential: protocol.Secret(cred.Reveal()), ExpiresAt: pending.expires}); err != nil {
		return err
	}
	return s.record(ctx, conditions.RotationSent{At: now})
}

// sendAgain sends the unconfirmed credential once more: the agent may have failed to
// store it, and storing the same one again does no harm. The caller holds s.cred.mu.
func (s *session) sendAgain(now time.Time) error {
	c := &s.cred
	c.sent = now
	s.log.Info("sending the unconfirmed agent credential again", "credential", c.life.hash.Fingerprint(), "expiresAt", stamp(c.life.expires))
	return s.send(protocol.TypeRotateCredential, &protocol.RotateCredential{Credential: protocol.Secret(c.pending.Reveal()), ExpiresAt: c.life.expires})
}

// credentialStored makes the confirmed credential the one in force.
func (s *session) credentialStored(ctx context.Context, m *protocol.CredentialStored) error {
	c := &s.cred
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending.IsZero() || c.pending.Hash().Fingerprint() != m.Fingerprint {
		if !c.current.hash.IsZero() && c.current.hash.Fingerprint() == m.Fingerprint {
			return nil // a credential sent twice, confirmed twice
		}
		return fmt.Errorf("the agent confirmed credential %q, which is not the one sent", protocol.Clip(m.Fingerprint))
	}
	if err := s.srv.writeCredential(ctx, s.wc, credentialRecord{current: c.life}); err != nil {
		return err
	}
	c.current = c.life
	c.pending, c.life, c.sent, c.warned = secrets.Token{}, issuedCredential{}, time.Time{}, false
	s.log.Info("agent credential rotated", "credential", m.Fingerprint, "expiresAt", stamp(c.current.expires))
	return s.record(ctx, conditions.CredentialRotated{Fingerprint: m.Fingerprint, IssuedAt: c.current.issued, ExpiresAt: c.current.expires, At: s.srv.opts.Now(), Revocation: c.current.revocation})
}

// sweepCredentials judges again, every CredentialCheckEvery until Close, the
// WorkerClusters of the clusters whose agent is away.
func (s *Server) sweepCredentials() {
	t := time.NewTicker(s.opts.CredentialCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-s.life.Done():
			return
		case <-t.C:
		}
		s.sweepOnce(s.life)
	}
}

// sweepOnce records, for each cluster the hub pushed whose agent is not connected, a
// credential that entered its last third or ran out since its WorkerCluster was last
// judged. It reads the cache; only a change is written.
func (s *Server) sweepOnce(ctx context.Context) {
	s.mu.Lock()
	var away []client.ObjectKey
	for identity, p := range s.desired {
		if s.sessions[identity] == nil {
			away = append(away, p.key)
		}
	}
	s.mu.Unlock()
	now := s.opts.Now()
	for _, key := range away {
		if ctx.Err() != nil {
			return
		}
		wc := new(v1alpha1.WorkerCluster)
		if err := s.opts.Reader.Get(ctx, key, wc); err != nil || !conditions.CredentialDue(wc, now) {
			continue
		}
		if _, err := s.opts.Status.Record(ctx, key); err != nil && !apierrors.IsNotFound(err) {
			s.opts.Log.Error("recording the lifetime of an agent credential", "workerCluster", key.String(), "error", err)
		}
	}
}

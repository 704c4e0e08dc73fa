package tunnel

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/validation"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// Keys of the credential Secret. It holds hashes only: the hub never keeps a secret it
// could leak.
const (
	credentialHashKey = "hash"
	// pendingHashKey is a rotated credential the agent has not yet confirmed storing;
	// both are accepted until it does.
	pendingHashKey = "pendingHash"
	// redemptionKeyHashKey is the hash of the redemption key the enrollment token was
	// redeemed with, kept until the agent shows it received its credential, so that
	// the same agent can redeem again if the answer was lost.
	redemptionKeyHashKey = "redemptionKeyHash"
)

// Annotations of the credential Secret: the lifetime of each credential it holds, in
// RFC 3339. They are not secret, and `kubectl get secret -o yaml` shows them as they are.
// A credential without them was issued by a hub that recorded no lifetimes.
const (
	issuedAtAnnotation         = "flotilla.dev/credential-issued-at"
	expiresAtAnnotation        = "flotilla.dev/credential-expires-at"
	pendingIssuedAtAnnotation  = "flotilla.dev/pending-credential-issued-at"
	pendingExpiresAtAnnotation = "flotilla.dev/pending-credential-expires-at"
	// The spec.revocation each credential was issued under; none is zero.
	revocationAnnotation        = "flotilla.dev/credential-revocation"
	pendingRevocationAnnotation = "flotilla.dev/pending-credential-revocation"
)

// CredentialSecretName is the Secret, in the WorkerCluster's namespace, that holds the
// hash of its agent's credential.
func CredentialSecretName(workerCluster string) string { return workerCluster + "-agent-credential" }

// refusal is an authentication failure: Reason, and Args as log attributes, go to the
// operator's log, never to the caller, who only learns "unauthorized".
type refusal struct {
	Reason      string
	Fingerprint string
	Args        []any
}

func (r *refusal) Error() string { return r.Reason }

func refuse(reason, fingerprint string, args ...any) error {
	return &refusal{Reason: reason, Fingerprint: fingerprint, Args: args}
}

// admitted is the result of a successful authentication.
type admitted struct {
	wc *v1alpha1.WorkerCluster
	// credential is set when the request redeemed an enrollment token: the agent's new
	// credential, returned once in the upgrade answer.
	credential secrets.Token
	// fingerprint of what was presented, for the log.
	fingerprint string
	// again is set when the redemption repeated one whose answer was lost.
	again bool
	// record is the credential Secret as authentication read or wrote it.
	record credentialRecord
	// promoted is set when the agent presented the rotated credential whose
	// confirmation was lost: authentication made it the one in force.
	promoted bool
}

// presented is what an upgrade request claims, checked for shape only.
type presented struct {
	identity string
	token    secrets.Token
	fp       string
	// keyHash is the hash of the redemption key sent with an enrollment token; zero
	// when none was sent.
	keyHash secrets.Hash
}

// authenticate checks the upgrade request's secret for the identity it names. Every
// check of shape comes before the first lookup, and the lookups read Options.Reader, so
// that a request that fails costs the hub cluster's API nothing.
func (s *Server) authenticate(ctx context.Context, r *http.Request) (*admitted, error) {
	p, kind, err := checkShape(r)
	if err != nil {
		return nil, err
	}
	wc, err := s.lookup(ctx, p.identity, p.fp)
	if err != nil {
		return nil, err
	}
	if kind == protocol.AuthEnrollment {
		return s.redeem(ctx, wc, p)
	}
	return s.checkCredential(ctx, wc, p)
}

// checkShape refuses a request whose secret, identity or redemption key cannot be what
// the hub issued, without looking anything up.
func checkShape(r *http.Request) (presented, string, error) {
	var p presented
	secret, ok := bearer(r)
	if !ok {
		return p, "", refuse("no bearer secret", "")
	}
	kind := r.Header.Get(protocol.HeaderAuth)
	if kind != protocol.AuthEnrollment && kind != protocol.AuthCredential {
		return p, "", refuse(fmt.Sprintf("unknown %s", protocol.HeaderAuth), "")
	}
	tok, err := secrets.ParseToken(secret)
	if err != nil {
		// ParseToken's errors never repeat the text; nothing of it is worth naming.
		return p, "", refuse("the bearer secret: "+err.Error(), "")
	}
	p.token, p.fp = tok, tok.Hash().Fingerprint()
	p.identity = r.Header.Get(protocol.HeaderIdentity)
	if !validIdentity(p.identity) {
		return p, "", refuse("no valid identity", p.fp)
	}
	if key := r.Header.Get(protocol.HeaderRedemptionKey); key != "" {
		if kind != protocol.AuthEnrollment || !protocol.ValidRedemptionKey(key) {
			return p, "", refuse("a malformed or misplaced "+protocol.HeaderRedemptionKey, p.fp)
		}
		p.keyHash = sha256.Sum256([]byte(key))
	}
	return p, kind, nil
}

// validIdentity is the shape of an identity: the value of a label.
func validIdentity(identity string) bool {
	return identity != "" && len(validation.IsValidLabelValue(identity)) == 0
}

func bearer(r *http.Request) (string, bool) {
	const prefix = "Bearer "
	h := r.Header.Get("Authorization")
	if len(h) <= len(prefix) || h[:len(prefix)] != prefix {
		return "", false
	}
	return h[len(prefix):], true
}

// IdentityIndex is the name of the index of WorkerClusters by identity that
// IndexIdentities adds to a cache.
const IdentityIndex = "flotilla.dev/identity"

// IndexIdentities indexes the WorkerClusters of a cache by identity, before it starts;
// with Options.IdentityIndexed, an identity is then found in one step, however many
// clusters the hub has, instead of by matching the label of each.
func IndexIdentities(ctx context.Context, indexer client.FieldIndexer) error {
	return indexer.IndexField(ctx, &v1alpha1.WorkerCluster{}, IdentityIndex, func(o client.Object) []string {
		if id := o.GetLabels()[v1alpha1.WorkerClusterLabel]; id != "" {
			return []string{id}
		}
		return nil
	})
}

// lookup finds the one WorkerCluster with the identity, in whatever tenant namespace.
func (s *Server) lookup(ctx context.Context, identity, fp string) (*v1alpha1.WorkerCluster, error) {
	// The hub pushed this identity's state: after a hub restart thousands of agents
	// redial at once, and reading one object each is much less than listing.
	if key, ok := s.known(identity); ok {
		wc := new(v1alpha1.WorkerCluster)
		err := s.opts.Reader.Get(ctx, key, wc)
		switch {
		case apierrors.IsNotFound(err):
			return nil, refuse("no WorkerCluster has this identity", fp)
		case err != nil:
			return nil, fmt.Errorf("reading WorkerCluster %s of identity %s: %w", key, identity, err)
		case wc.Labels[v1alpha1.WorkerClusterLabel] != identity:
			return nil, refuse(fmt.Sprintf("WorkerCluster %s no longer has this identity", key), fp)
		}
		return wc, nil
	}
	var list v1alpha1.WorkerClusterList
	var match client.ListOption = client.MatchingLabels{v1alpha1.WorkerClusterLabel: identity}
	if s.opts.IdentityIndexed {
		match = client.MatchingFields{IdentityIndex: identity}
	}
	if err := s.opts.Reader.List(ctx, &list, match); err != nil {
		return nil, fmt.Errorf("listing WorkerClusters of identity %s: %w", identity, err)
	}
	switch len(list.Items) {
	case 0:
		return nil, refuse("no WorkerCluster has this identity", fp)
	case 1:
		return &list.Items[0], nil
	}
	return nil, refuse(fmt.Sprintf("%d WorkerClusters claim this identity", len(list.Items)), fp)
}

// redeem consumes the enrollment token: the redemption is recorded with an optimistic
// lock on the WorkerCluster's status, so of two agents racing with one token exactly
// one gets in, and a token seen once is refused ever after, except to the agent that
// redeemed it, with its redemption key, within RedemptionRetryWindow.
//
// Everything that refuses reads Options.Reader; the hub cluster is written, and read
// afresh, only for the holder of the token.
func (s *Server) redeem(ctx context.Context, wc *v1alpha1.WorkerCluster, p presented) (*admitted, error) {
	if wc.Spec.EnrollmentTokenHash == "" {
		return nil, refuse("the WorkerCluster has no enrollment token", p.fp)
	}
	want, err := secrets.ParseHash(wc.Spec.EnrollmentTokenHash)
	if err != nil {
		return nil, refuse("the WorkerCluster's enrollment token hash is malformed", p.fp)
	}
	if !p.token.Hash().Equal(want) {
		return nil, refuse(secrets.ErrTokenMismatch.Error(), p.fp)
	}
	for fresh := false; ; fresh = true {
		adm, err := s.redeemOnce(ctx, wc, p, want)
		if !apierrors.IsConflict(err) {
			return adm, err
		}
		if fresh {
			return nil, refuse("another connection redeemed the enrollment token first", p.fp)
		}
		// The WorkerCluster read from the cache was older than the hub cluster's: judge
		// again on the current one (the presenter holds the token, so this read is not
		// one that garbage can cause).
		cur := new(v1alpha1.WorkerCluster)
		if err := s.opts.Client.Get(ctx, client.ObjectKeyFromObject(wc), cur); err != nil {
			return nil, fmt.Errorf("reading WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
		}
		if cur.Spec.EnrollmentTokenHash != wc.Spec.EnrollmentTokenHash || cur.Labels[v1alpha1.WorkerClusterLabel] != p.identity {
			return nil, refuse("the WorkerCluster changed its enrollment token or identity meanwhile", p.fp)
		}
		wc = cur
	}
}

// redeemOnce judges and records one redemption on wc as read. A conflict error means wc
// was not the current version.
func (s *Server) redeemOnce(ctx context.Context, wc *v1alpha1.WorkerCluster, p presented, token secrets.Hash) (*admitted, error) {
	if e := wc.Status.Enrollment; e != nil && e.TokenHash == wc.Spec.EnrollmentTokenHash {
		return s.redeemAgain(ctx, wc, p, e)
	}
	recorded, err := s.redeemedBefore(ctx, wc, token)
	if err != nil {
		return nil, err
	}
	if recorded {
		return nil, refuse(fmt.Sprintf("the enrollment token was already redeemed for WorkerCluster %s/%s (the record of redeemed tokens, Secret %s, outlives the cluster's removal from the fleet); a redeemed token is never accepted again: give the cluster a new one with `flotilla cluster rotate-token %s`",
			wc.Namespace, wc.Name, RecordSecretName(wc.Name), wc.Name), p.fp)
	}
	cred, issued, err := s.issue(wc)
	if err != nil {
		return nil, err
	}
	before, beforeCred := wc.Status.Enrollment.DeepCopy(), wc.Status.Credential.DeepCopy()
	key, issuedFP := client.ObjectKeyFromObject(wc), cred.Hash().Fingerprint()
	err = s.opts.Status.Claim(ctx, wc, conditions.Redeemed{TokenHash: wc.Spec.EnrollmentTokenHash, At: issued.issued, Credential: issuedFP, ExpiresAt: issued.expires, Revocation: issued.revocation})
	if apierrors.IsConflict(err) {
		return nil, err
	}
	if err != nil {
		// The API server may have stored it though its answer came too late.
		s.undoRedemption(ctx, key, issuedFP, before, beforeCred, p)
		return nil, fmt.Errorf("recording the redemption on WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	rec := credentialRecord{current: issued, redemptionKey: p.keyHash}
	if err := s.writeCredential(ctx, wc, rec); err != nil {
		s.undoRedemption(ctx, key, issuedFP, before, beforeCred, p)
		return nil, err
	}
	// The status already refuses the token while this WorkerCluster lives; the record
	// is for after its removal, which records it again, so a failure here is not the
	// agent's to pay for.
	if err := recordRedeemed(ctx, s.opts.Client, wc, token); err != nil {
		s.opts.Log.Error("recording the redeemed enrollment token", "workerCluster", wc.Namespace+"/"+wc.Name, "fingerprint", p.fp, "error", err)
	}
	return &admitted{wc: wc, credential: cred, fingerprint: p.fp, record: rec}, nil
}

// undoRedemption gives the token back when its redemption was, or may have been,
// recorded for a credential that was not stored: without the credential's hash the
// agent could never connect, and its next attempt, with no redemption key stored, would
// be refused. That follows most often from a hub cluster too slow to answer within the
// handshake, so the undoing gets a time of its own. It reads the WorkerCluster from the
// API server, retries on conflicts with other writes of its status (a dispatcher woken
// by the redemption), and undoes nothing but the redemption that issued fingerprint.
func (s *Server) undoRedemption(ctx context.Context, key client.ObjectKey, fingerprint string, before *v1alpha1.Enrollment, beforeCred *v1alpha1.CredentialStatus, p presented) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		var wc v1alpha1.WorkerCluster
		if err := s.opts.Client.Get(ctx, key, &wc); err != nil {
			return err
		}
		if e := wc.Status.Enrollment; e == nil || e.CredentialFingerprint != fingerprint {
			return nil // never stored, or another redemption's since
		}
		return s.opts.Status.Claim(ctx, &wc, conditions.RedemptionUndone{Previous: before, PreviousCredential: beforeCred})
	})
	if err != nil {
		s.opts.Log.Error("undoing a redemption whose credential could not be stored", "identity", p.identity, "fingerprint", p.fp, "error", err)
	}
}

// undoTimeout bounds the undoing of a redemption whose credential could not be stored.
const undoTimeout = 30 * time.Second

// redeemAgain answers a token that this WorkerCluster already redeemed: refused, unless
// it comes with the redemption key it was redeemed with, within the retry window. Then
// the first answer was lost, and the agent gets a fresh credential in place of the one
// it never received.
func (s *Server) redeemAgain(ctx context.Context, wc *v1alpha1.WorkerCluster, p presented, e *v1alpha1.Enrollment) (*admitted, error) {
	redeemed := fmt.Sprintf("the enrollment token was already redeemed at %s", e.RedeemedAt.UTC().Format(time.RFC3339))
	if p.keyHash.IsZero() {
		return nil, refuse(redeemed, p.fp)
	}
	if age := s.opts.Now().Sub(e.RedeemedAt.Time); age > s.opts.RedemptionRetryWindow {
		return nil, refuse(fmt.Sprintf("%s, longer ago than a redemption may be repeated (%s)", redeemed, s.opts.RedemptionRetryWindow), p.fp)
	}
	var sec corev1.Secret
	err := s.opts.Reader.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: CredentialSecretName(wc.Name)}, &sec)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading the credential of WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	stored, _ := secrets.ParseHash(string(sec.Data[redemptionKeyHashKey]))
	if stored.IsZero() || !stored.Equal(p.keyHash) {
		return nil, refuse(redeemed+", with another redemption key or by an agent that has since connected", p.fp)
	}
	cred, issued, err := s.issue(wc)
	if err != nil {
		return nil, err
	}
	err = s.opts.Status.Claim(ctx, wc, conditions.CredentialIssued{Fingerprint: cred.Hash().Fingerprint(), At: issued.issued, ExpiresAt: issued.expires, Revocation: issued.revocation})
	if apierrors.IsConflict(err) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("recording the repeated redemption on WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	rec := credentialRecord{current: issued, redemptionKey: p.keyHash}
	if err := s.writeCredential(ctx, wc, rec); err != nil {
		return nil, err
	}
	return &admitted{wc: wc, credential: cred, fingerprint: p.fp, again: true, record: rec}, nil
}

func (s *Server) checkCredential(ctx context.Context, wc *v1alpha1.WorkerCluster, p presented) (*admitted, error) {
	var sec corev1.Secret
	err := s.opts.Reader.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: CredentialSecretName(wc.Name)}, &sec)
	if apierrors.IsNotFound(err) {
		return nil, refuse("no credential was issued (revoked, or never enrolled)", p.fp)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the credential of WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	rec := readRecord(&sec)
	h := p.token.Hash()
	now := s.opts.Now()
	switch {
	case !rec.current.hash.IsZero() && h.Equal(rec.current.hash):
		if rec.current.expiredAt(now) {
			return nil, s.expired(ctx, wc, rec.current, p.fp)
		}
		if rec.current.revokedBy(wc) {
			return nil, revoked(wc, rec.current, p.fp)
		}
		return &admitted{wc: wc, fingerprint: p.fp, record: rec}, nil
	case !rec.pending.hash.IsZero() && h.Equal(rec.pending.hash):
		if rec.pending.expiredAt(now) {
			return nil, s.expired(ctx, wc, rec.pending, p.fp)
		}
		if rec.pending.revokedBy(wc) {
			return nil, revoked(wc, rec.pending, p.fp)
		}
		// The agent stored the rotated credential, and the confirmation was lost.
		promoted := credentialRecord{current: rec.pending}
		if err := s.writeCredential(ctx, wc, promoted); err != nil {
			return nil, err
		}
		return &admitted{wc: wc, fingerprint: p.fp, record: promoted, promoted: true}, nil
	case rec.current.hash.IsZero():
		return nil, refuse("no credential is in force (revoked)", p.fp)
	}
	return nil, refuse("the credential does not match the one issued", p.fp)
}

// expired refuses a credential past its lifetime. The refusal names the cluster, the
// expiry and what to do, in the operator's log only; the WorkerCluster is judged again,
// once, so that it says so too (the agent redials, and the cached status says when it
// already does).
func (s *Server) expired(ctx context.Context, wc *v1alpha1.WorkerCluster, c issuedCredential, fp string) error {
	name := wc.Namespace + "/" + wc.Name
	if cond := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionCredentialCurrent); cond == nil || cond.Reason != v1alpha1.ReasonCredentialExpired {
		if _, err := s.opts.Status.Record(ctx, client.ObjectKeyFromObject(wc)); err != nil {
			s.opts.Log.Error("recording an expired agent credential", "workerCluster", name, "error", err)
		}
	}
	return refuse(fmt.Sprintf("the agent credential of WorkerCluster %s expired at %s and is no longer accepted: the cluster needs a new enrollment token (`flotilla cluster rotate-token %s`, then install the agent with the new values file)",
		name, stamp(c.expires), wc.Name), fp, "workerCluster", name, "expiredAt", stamp(c.expires))
}

// revoked refuses a credential issued under a lower spec.revocation than wc's. The
// WorkerCluster says so already (its CredentialCurrent is derived from the two counts);
// the log names the counts for the operator.
func revoked(wc *v1alpha1.WorkerCluster, c issuedCredential, fp string) error {
	name := wc.Namespace + "/" + wc.Name
	return refuse(fmt.Sprintf("the agent credential of WorkerCluster %s was revoked: it was issued under revocation %d and the cluster's is %d; install the agent with the values file of `flotilla cluster rotate-token --revoke %s`",
		name, c.revocation, wc.Spec.Revocation, wc.Name), fp, "workerCluster", name, "issuedUnder", c.revocation, "revocation", wc.Spec.Revocation)
}

// issuedCredential is one credential the credential Secret holds: its hash, its
// lifetime and the revocation count it was issued under. A zero expires is a
// credential of a hub that recorded no lifetimes.
type issuedCredential struct {
	hash            secrets.Hash
	issued, expires time.Time
	revocation      int64
}

// revokedBy reports whether wc's spec.revocation revokes the credential.
func (c issuedCredential) revokedBy(wc *v1alpha1.WorkerCluster) bool {
	return c.revocation < wc.Spec.Revocation
}

// expiredAt reports whether the credential is past its lifetime at now.
func (c issuedCredential) expiredAt(now time.Time) bool {
	return !c.expires.IsZero() && !now.Before(c.expires)
}

// credentialRecord is what the credential Secret holds; zero parts are left out.
type credentialRecord struct {
	current, pending issuedCredential
	redemptionKey    secrets.Hash
}

// readRecord reads the credential Secret. What does not parse is left zero: a hash that
// does not parse matches nothing, and a time that does not parse is one not recorded.
func readRecord(sec *corev1.Secret) credentialRecord {
	var r credentialRecord
	r.current.hash, _ = secrets.ParseHash(string(sec.Data[credentialHashKey]))
	r.pending.hash, _ = secrets.ParseHash(string(sec.Data[pendingHashKey]))
	r.redemptionKey, _ = secrets.ParseHash(string(sec.Data[redemptionKeyHashKey]))
	r.current.issued = parseStamp(sec.Annotations[issuedAtAnnotation])
	r.current.expires = parseStamp(sec.Annotations[expiresAtAnnotation])
	r.pending.issued = parseStamp(sec.Annotations[pendingIssuedAtAnnotation])
	r.pending.expires = parseStamp(sec.Annotations[pendingExpiresAtAnnotation])
	// A count that does not parse is one the hub never wrote: it counts as the first,
	// which any revocation revokes.
	r.current.revocation, _ = strconv.ParseInt(sec.Annotations[revocationAnnotation], 10, 64)
	r.pending.revocation, _ = strconv.ParseInt(sec.Annotations[pendingRevocationAnnotation], 10, 64)
	return r
}

func parseStamp(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// stamp is how the tunnel writes a time, in the Secret and in its log: RFC 3339, UTC.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// lifetime is how long a credential issued now for wc is good for: the lifetime Git
// declares for it, else Options.CredentialLifetime.
func (s *Server) lifetime(wc *v1alpha1.WorkerCluster) time.Duration {
	if l := wc.Spec.CredentialLifetime; l != nil && l.Duration > 0 {
		return l.Duration
	}
	return s.opts.CredentialLifetime
}

// issue draws a new credential for wc, issued now. Times are kept to the second, as
// the Secret and the status hold them.
func (s *Server) issue(wc *v1alpha1.WorkerCluster) (secrets.Token, issuedCredential, error) {
	cred, err := secrets.NewToken()
	if err != nil {
		return secrets.Token{}, issuedCredential{}, err
	}
	now := s.opts.Now().UTC().Truncate(time.Second)
	return cred, issuedCredential{hash: cred.Hash(), issued: now, expires: now.Add(s.lifetime(wc)), revocation: wc.Spec.Revocation}, nil
}

// writeCredential makes the credential Secret hold r.
func (s *Server) writeCredential(ctx context.Context, wc *v1alpha1.WorkerCluster, r credentialRecord) error {
	data := map[string][]byte{credentialHashKey: []byte(r.current.hash.String())}
	ann := map[string]string{}
	if !r.current.expires.IsZero() {
		ann[issuedAtAnnotation], ann[expiresAtAnnotation] = stamp(r.current.issued), stamp(r.current.expires)
	}
	if r.current.revocation > 0 {
		ann[revocationAnnotation] = strconv.FormatInt(r.current.revocation, 10)
	}
	if !r.pending.hash.IsZero() {
		data[pendingHashKey] = []byte(r.pending.hash.String())
		if !r.pending.expires.IsZero() {
			ann[pendingIssuedAtAnnotation], ann[pendingExpiresAtAnnotation] = stamp(r.pending.issued), stamp(r.pending.expires)
		}
		if r.pending.revocation > 0 {
			ann[pendingRevocationAnnotation] = strconv.FormatInt(r.pending.revocation, 10)
		}
	}
	if !r.redemptionKey.IsZero() {
		data[redemptionKeyHashKey] = []byte(r.redemptionKey.String())
	}
	sec := corev1ac.Secret(CredentialSecretName(wc.Name), wc.Namespace).
		WithLabels(map[string]string{v1alpha1.WorkerClusterLabel: wc.Labels[v1alpha1.WorkerClusterLabel]}).
		WithType(corev1.SecretTypeOpaque).
		WithData(data)
	if len(ann) > 0 {
		sec.WithAnnotations(ann)
	}
	// Apply replaces what this manager owns whole: a hash or a time not named here is
	// dropped.
	if err := s.opts.Client.Apply(ctx, sec, client.FieldOwner(fieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("writing the credential of WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	return nil
}

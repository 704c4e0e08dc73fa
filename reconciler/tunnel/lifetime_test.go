package tunnel_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent"
	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/logtest"
)

// lifetime is the credentials' lifetime in these tests: rotation is due after 3h (half
// of it, sooner than the daily rotation), the last third begins at 4h, and an
// unconfirmed rotation is sent again every 30m.
const lifetime = 6 * time.Hour

// lifetimeHub is a hub whose credentials live for lifetime by clk, and which looks at
// them often enough that a test never waits for it.
func lifetimeHub(t *testing.T, clk *clock) *hub {
	t.Helper()
	return startHub(t, nil, func(o *tunnel.Options) {
		o.Now, o.CredentialLifetime, o.CredentialCheckEvery = clk.now, lifetime, 20*time.Millisecond
	})
}

// newFleetCluster is newCluster with an identity as the hub gives it
// (<len(tenant)>-<tenant>-<worker>), so that the agent can name its cluster.
func newFleetCluster(t *testing.T, name string) *cluster {
	t.Helper()
	n := clusters.Add(1)
	tenant := fmt.Sprintf("t%d", n)
	c := &cluster{ns: "tenant-" + tenant + "-" + name, name: name, identity: fleet.Identity(tenant, name)}
	if err := admin().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}); err != nil {
		t.Fatal(err)
	}
	var err error
	if c.token, err = secrets.NewToken(); err != nil {
		t.Fatal(err)
	}
	c.create(t)
	return c
}

// runningAgent is a real agent of the cluster, with its own clock and log.
type runningAgent struct {
	log    *logtest.Buffer
	secret types.NamespacedName
	stop   func()
}

func startAgent(t *testing.T, h *hub, c *cluster, clk *clock) *runningAgent {
	t.Helper()
	ns := "agent-" + c.ns
	if err := admin().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	ap, err := apply.New(apply.Options{Client: admin(), Identity: c.identity})
	if err != nil {
		t.Fatal(err)
	}
	ra := &runningAgent{log: &logtest.Buffer{}, secret: types.NamespacedName{Namespace: ns, Name: "flotilla-agent-credential"}}
	a, err := agent.New(agent.Options{
		HubURL: h.url(), Identity: c.identity, EnrollmentToken: protocol.Secret(c.token.Reveal()),
		CredentialSecret: ra.secret, Client: admin(), Applier: ap, Liveness: fast,
		Backoff: wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: 500 * time.Millisecond},
		Log:     slogTo(ra.log), Now: clk.now,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	var once bool
	ra.stop = func() {
		if !once {
			once = true
			cancel()
			<-done
		}
	}
	t.Cleanup(ra.stop)
	return ra
}

// stored is what the agent keeps: its credential and the credential's expiry.
func (ra *runningAgent) stored(t *testing.T) (string, string) {
	t.Helper()
	var sec corev1.Secret
	if err := admin().Get(t.Context(), ra.secret, &sec); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	return string(sec.Data[agent.CredentialKey]), string(sec.Data[agent.ExpiresAtKey])
}

// credentialIs waits until the cluster's CredentialCurrent has the reason, and returns
// the WorkerCluster then.
func (c *cluster) credentialIs(t *testing.T, reason string) *v1alpha1.WorkerCluster {
	t.Helper()
	var wc *v1alpha1.WorkerCluster
	eventually(t, c.name+"'s CredentialCurrent "+reason, func() (bool, string) {
		wc = c.wc(t)
		cond := condition(wc, v1alpha1.ConditionCredentialCurrent)
		return cond != nil && cond.Reason == reason, fmt.Sprintf("%+v", cond)
	})
	return wc
}

// annotations of the hub's credential Secret.
func (c *cluster) lifetimeAnnotations(t *testing.T) (issued, expires string) {
	t.Helper()
	sec := c.credentialSecret(t)
	if sec == nil {
		t.Fatal("the hub holds no credential Secret")
	}
	return sec.Annotations["flotilla.dev/credential-issued-at"], sec.Annotations["flotilla.dev/credential-expires-at"]
}

func parseStamp(t *testing.T, s string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatalf("%q is no RFC 3339 time: %v", s, err)
	}
	return at
}

func TestACredentialIsRotatedOverTheLiveTunnelBeforeItExpires(t *testing.T) {
	var clk clock
	h := lifetimeHub(t, &clk)
	c := newFleetCluster(t, "rotating")
	ra := startAgent(t, h, c, &clk)
	eventually(t, "the agent connected", func() (bool, string) { return h.srv.Connected(c.identity), "" })

	// Issued with the redemption: the hub, the status and the agent agree on its end.
	wc := c.credentialIs(t, v1alpha1.ReasonCredentialFresh)
	issued, expires := c.lifetimeAnnotations(t)
	first := wc.Status.Credential
	if got := parseStamp(t, expires).Sub(parseStamp(t, issued)); got != lifetime {
		t.Fatalf("the Secret records a lifetime of %s (%s to %s), want %s", got, issued, expires, lifetime)
	}
	if !first.ExpiresAt.Time.Equal(parseStamp(t, expires)) || first.RotatedAt != nil {
		t.Fatalf("status.credential %+v, want expiresAt %s and no rotation yet", first, expires)
	}
	cred, agentExpires := ra.stored(t)
	if agentExpires != expires {
		t.Fatalf("the agent stored expiry %q, the hub %q", agentExpires, expires)
	}

	// Half its lifetime later the hub hands the agent a new one over the same tunnel.
	clk.advance(lifetime/2 + time.Minute)
	eventually(t, "the rotation confirmed", func() (bool, string) {
		wc = c.wc(t)
		cr := wc.Status.Credential
		return cr != nil && cr.RotatedAt != nil && cr.RotationPendingSince == nil, fmt.Sprintf("%+v", cr)
	})
	rotated := wc.Status.Credential
	if !rotated.ExpiresAt.After(first.ExpiresAt.Time.Add(lifetime/2)) || !rotated.IssuedAt.After(first.IssuedAt.Time) {
		t.Fatalf("after the rotation status.credential is %+v; want a new lifetime from the rotation on (the first ran %s to %s)", rotated, first.IssuedAt, first.ExpiresAt)
	}
	if cond := condition(wc, v1alpha1.ConditionCredentialCurrent); cond.Status != metav1.ConditionTrue || !strings.Contains(cond.Message, "rotated at ") {
		t.Fatalf("CredentialCurrent = %+v, want True saying when it was rotated", cond)
	}
	eventually(t, "the agent stored the new credential and its expiry", func() (bool, string) {
		now, exp := ra.stored(t)
		_, hubExpires := c.lifetimeAnnotations(t)
		return now != cred && exp == hubExpires && exp == rotated.ExpiresAt.UTC().Format(time.RFC3339), exp
	})
	if n := strings.Count(h.log.String(), "agent connected"); n != 1 {
		t.Fatalf("%d connections, want the rotation over the first one:\n%s", n, h.log.String())
	}
	h.refused(t, request{identity: c.identity, kind: protocol.AuthCredential, secret: cred})
	now, _ := ra.stored(t)
	noSecretIn(t, "the hub's log", h.log.String(), c.token.Reveal(), cred, now)
	noSecretIn(t, "the agent's log", ra.log.String(), c.token.Reveal(), cred, now)
}

func TestARotationThatIsNeverConfirmedWarnsBeforeTheCredentialExpires(t *testing.T) {
	var clk clock
	h := lifetimeHub(t, &clk)
	c := newCluster(t, "unconfirmed")
	p := h.enroll(t, c)
	wc := c.credentialIs(t, v1alpha1.ReasonCredentialFresh)
	expires := wc.Status.Credential.ExpiresAt.UTC().Format(time.RFC3339)

	// Rotation is due: the agent receives the new credential with its expiry, and never
	// confirms it.
	clk.advance(lifetime/2 + time.Minute)
	rot := receiveRotation(t, p)
	if rot.ExpiresAt.IsZero() || rot.Credential == "" {
		t.Fatalf("the rotation carries no credential or no expiry: expires %s", rot.ExpiresAt)
	}
	eventually(t, "the status says a rotation waits", func() (bool, string) {
		wc = c.wc(t)
		return wc.Status.Credential.RotationPendingSince != nil, fmt.Sprintf("%+v", wc.Status.Credential)
	})
	if cond := condition(wc, v1alpha1.ConditionCredentialCurrent); cond.Status != metav1.ConditionTrue || !strings.Contains(cond.Message, "is not confirmed yet") {
		t.Fatalf("CredentialCurrent = %+v, want True while the credential is young, saying a rotation waits", cond)
	}
	// The same credential is sent again while no confirmation comes.
	clk.advance(lifetime / 12)
	if again := receiveRotation(t, p); again.Credential.Reveal() != rot.Credential.Reveal() {
		t.Fatal("the hub sent another credential instead of the unconfirmed one")
	}

	// Its last third: the WorkerCluster and the commit say so, before it runs out.
	clk.advance(lifetime / 6)
	wc = c.credentialIs(t, v1alpha1.ReasonRotationFailing)
	if cond := condition(wc, v1alpha1.ConditionCredentialCurrent); cond.Status != metav1.ConditionFalse || !strings.Contains(cond.Message, "expires at "+expires) {
		t.Fatalf("CredentialCurrent = %+v, want False naming the expiry %s", cond, expires)
	}
	st := conditions.CommitStatus("flotilla/"+c.name, wc)
	if want := "agent credential expires " + expires + ", rotation failing · "; !strings.HasPrefix(st.Description, want) || st.State == commitstatus.Failure {
		t.Fatalf("commit status %s %q, want it to lead with %q without failing", st.State, st.Description, want)
	}
	if !strings.Contains(h.log.String(), "the agent credential is in the last third of its lifetime") {
		t.Fatalf("the hub's log does not warn:\n%s", h.log.String())
	}

	// Its end: the hub closes the tunnel, refuses the credential, and the cluster fails.
	clk.advance(lifetime / 3)
	eventually(t, "the tunnel closed", func() (bool, string) { return !h.srv.Connected(c.identity), "" })
	wc = c.credentialIs(t, v1alpha1.ReasonCredentialExpired)
	if ready := condition(wc, v1alpha1.ConditionReady); ready.Reason != v1alpha1.ReasonCredentialExpired {
		t.Fatalf("Ready = %+v, want False for the expired credential", ready)
	}
	if st := conditions.CommitStatus("flotilla/"+c.name, wc); st.State != commitstatus.Failure || !strings.Contains(st.Description, "flotilla cluster rotate-token "+c.name) {
		t.Fatalf("commit status %s %q, want a failure saying to rotate the token", st.State, st.Description)
	}
	eventually(t, "Connected False saying the credential expired", func() (bool, string) {
		cond := condition(c.wc(t), v1alpha1.ConditionConnected)
		return cond.Status == metav1.ConditionFalse && strings.Contains(cond.Message, "the agent credential expired"), fmt.Sprintf("%+v", cond)
	})
	h.refused(t, request{identity: c.identity, kind: protocol.AuthCredential, secret: p.credential})
	noSecretIn(t, "the hub's log", h.log.String(), c.token.Reveal(), p.credential, rot.Credential.Reveal())
}

// receiveRotation reads what the hub sends the peer until a rotation comes.
func receiveRotation(t *testing.T, p *peer) *protocol.RotateCredential {
	t.Helper()
	_ = p.stream.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer func() { _ = p.stream.SetReadDeadline(time.Time{}) }()
	for {
		_, body, err := p.conn.Receive()
		if err != nil {
			t.Fatalf("no rotation came: %v", err)
		}
		if rot, ok := body.(*protocol.RotateCredential); ok {
			return rot
		}
	}
}

func TestAnExpiredCredentialIsRefusedAndBothSidesSaySoInTheirLogs(t *testing.T) {
	var clk clock
	h := lifetimeHub(t, &clk)
	c := newFleetCluster(t, "away")
	// The hub knows the cluster: it watches its credential while the agent is away.
	h.srv.Push(c.key(), c.identity, &protocol.DesiredState{Generation: 1, Hash: "sha256:" + strings.Repeat("0", 64)})
	ra := startAgent(t, h, c, &clk)
	eventually(t, "the agent connected", func() (bool, string) { return h.srv.Connected(c.identity), "" })
	wc := c.credentialIs(t, v1alpha1.ReasonCredentialFresh)
	expires := wc.Status.Credential.ExpiresAt.UTC().Format(time.RFC3339)
	cred, _ := ra.stored(t)
	ra.stop()
	eventually(t, "the agent gone", func() (bool, string) { return !h.srv.Connected(c.identity), "" })

	// Away into its last third: nobody could rotate it, and the status says so.
	clk.advance(lifetime*2/3 + time.Minute)
	wc = c.credentialIs(t, v1alpha1.ReasonExpiresSoon)
	if st := conditions.CommitStatus("flotilla/"+c.name, wc); !strings.HasPrefix(st.Description, "agent credential expires "+expires+", not rotated · ") {
		t.Fatalf("commit status %q does not lead with the coming expiry", st.Description)
	}
	// Away past its end.
	clk.advance(lifetime / 3)
	c.credentialIs(t, v1alpha1.ReasonCredentialExpired)

	// Back, with the credential it holds: refused, and each side says why.
	ra = startAgent(t, h, c, &clk)
	eventually(t, "the agent's log says its credential expired", func() (bool, string) {
		return strings.Contains(ra.log.String(), "the agent credential expired at "+expires), ra.log.Last(400)
	})
	agentLine := regexp.MustCompile(`the agent credential expired at ` + regexp.QuoteMeta(expires) + ` and the hub no longer accepts it: the cluster needs a new enrollment token; run .flotilla cluster rotate-token ` + c.name + `. in the fleet repository`)
	if !agentLine.MatchString(ra.log.String()) {
		t.Fatalf("the agent's log does not say what to do:\n%s", ra.log.String())
	}
	fp := secrets.Token{}
	if tok, err := secrets.ParseToken(cred); err == nil {
		fp = tok
	}
	hubLine := regexp.MustCompile(`level=WARN msg="agent refused" .*reason="the agent credential of WorkerCluster ` + regexp.QuoteMeta(c.ns+"/"+c.name) + ` expired at ` + regexp.QuoteMeta(expires) + `[^"]*flotilla cluster rotate-token ` + c.name +
		`[^"]*" fingerprint=` + fp.Hash().Fingerprint() + ` workerCluster=` + regexp.QuoteMeta(c.ns+"/"+c.name) + ` expiredAt=` + regexp.QuoteMeta(expires))
	eventually(t, "the hub's log refuses it naming the cluster, fingerprint and expiry", func() (bool, string) {
		return hubLine.MatchString(h.log.String()), h.log.Last(600)
	})
	if h.srv.Connected(c.identity) {
		t.Fatal("the agent got in with an expired credential")
	}
	noSecretIn(t, "the hub's log", h.log.String(), c.token.Reveal(), cred)
	noSecretIn(t, "the agent's log", ra.log.String(), c.token.Reveal(), cred)
}

// An agent enrolled by a hub that recorded no lifetimes holds a credential with none:
// the upgraded hub counts its lifetime from its first sight of it, and it keeps working.
func TestACredentialFromBeforeLifetimesKeepsWorkingAfterTheUpgrade(t *testing.T) {
	var clk clock
	h := lifetimeHub(t, &clk)
	c := newCluster(t, "upgraded")
	cred, err := secrets.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	// What the older hub left: a redemption in the status, a hash in the Secret.
	clk.advance(-400 * 24 * time.Hour)
	redeemed := metav1.NewTime(clk.now().Truncate(time.Second))
	clk.advance(400 * 24 * time.Hour)
	wc := c.wc(t)
	wc.Status.Enrollment = &v1alpha1.Enrollment{TokenHash: c.token.Hash().String(), RedeemedAt: redeemed, CredentialFingerprint: cred.Hash().Fingerprint(), CredentialIssuedAt: &redeemed}
	if err := admin().Status().Update(t.Context(), wc); err != nil {
		t.Fatal(err)
	}
	old := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: tunnel.CredentialSecretName(c.name), Labels: map[string]string{v1alpha1.WorkerClusterLabel: c.identity}},
		Data:       map[string][]byte{"hash": []byte(cred.Hash().String())},
	}
	if err := admin().Create(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	if _, err := conditions.NewWriterWith(admin(), conditions.WriterOptions{Now: clk.now}).Record(t.Context(), c.key()); err != nil {
		t.Fatal(err)
	}
	if cond := condition(c.wc(t), v1alpha1.ConditionCredentialCurrent); cond == nil || cond.Status != metav1.ConditionUnknown || cond.Reason != v1alpha1.ReasonLifetimeNotRecorded {
		t.Fatalf("before its agent connects, CredentialCurrent = %+v; want Unknown, its lifetime not recorded", cond)
	}

	// More than a lifetime after its issue, it still connects.
	firstSight := clk.now()
	p := h.connect(t, request{identity: c.identity, kind: protocol.AuthCredential, secret: cred.Reveal()}, true)
	eventually(t, "the upgraded agent connected", func() (bool, string) { return h.srv.Connected(c.identity), "" })
	wc = c.credentialIs(t, v1alpha1.ReasonCredentialFresh)
	cr := wc.Status.Credential
	if !cr.LifetimeAssumed || cr.IssuedAt.Time.Before(firstSight.Add(-time.Second)) || !cr.ExpiresAt.Time.Equal(cr.IssuedAt.Add(lifetime)) {
		t.Fatalf("status.credential %+v; want a lifetime of %s assumed from %s, the hub's first sight", cr, lifetime, firstSight.UTC())
	}
	if cond := condition(wc, v1alpha1.ConditionCredentialCurrent); !strings.Contains(cond.Message, "issued before the hub recorded lifetimes") {
		t.Fatalf("CredentialCurrent says %q, not that its lifetime was assumed", cond.Message)
	}
	if issued, expires := c.lifetimeAnnotations(t); issued != cr.IssuedAt.UTC().Format(time.RFC3339) || expires != cr.ExpiresAt.UTC().Format(time.RFC3339) {
		t.Fatalf("the Secret records %s to %s, the status %s to %s", issued, expires, cr.IssuedAt, cr.ExpiresAt)
	}
	if !strings.Contains(h.log.String(), "issued before the hub recorded credential lifetimes: its lifetime counts from now") {
		t.Fatalf("the hub's log does not say it assumed a lifetime:\n%s", h.log.String())
	}

	// Reconnecting later counts from the same first sight, not again from then.
	_ = p.tunnel.Close()
	eventually(t, "the agent gone", func() (bool, string) { return !h.srv.Connected(c.identity), "" })
	clk.advance(time.Hour)
	h.connect(t, request{identity: c.identity, kind: protocol.AuthCredential, secret: cred.Reveal()}, true)
	eventually(t, "the upgraded agent connected again", func() (bool, string) { return h.srv.Connected(c.identity), "" })
	wc = c.credentialIs(t, v1alpha1.ReasonCredentialFresh)
	if again := wc.Status.Credential; !again.ExpiresAt.Equal(&cr.ExpiresAt) || !again.LifetimeAssumed {
		t.Fatalf("after reconnecting status.credential is %+v, want the lifetime first assumed (%s)", again, cr.ExpiresAt)
	}
}

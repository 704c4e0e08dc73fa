package conditions

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// A credential issued at `at` for 90 days: its last third begins on day 60.
var (
	expiry  = at.Add(90 * 24 * time.Hour)
	warning = at.Add(60 * 24 * time.Hour)
)

// readyWorker is a cluster that takes work, whose credential was issued at `at`.
func readyWorker(credential func(*v1alpha1.CredentialStatus)) *v1alpha1.WorkerCluster {
	wc := withGPUs(hashes("h1", "h1")(enrolled(worker("Connected=True/TunnelUp", "WorkerConfigured=True/Applied"))))
	wc.Status.Credential = &v1alpha1.CredentialStatus{IssuedAt: metav1.NewTime(at), ExpiresAt: metav1.NewTime(expiry)}
	if credential != nil {
		credential(wc.Status.Credential)
	}
	return wc
}

func pendingSince(d time.Duration) func(*v1alpha1.CredentialStatus) {
	return func(c *v1alpha1.CredentialStatus) {
		t := metav1.NewTime(at.Add(d))
		c.RotationPendingSince = &t
	}
}

// TestCredentialCurrent pins what a credential's age means for CredentialCurrent, Ready
// and the cluster's commit status.
func TestCredentialCurrent(t *testing.T) {
	tests := []struct {
		name string
		wc   *v1alpha1.WorkerCluster
		now  time.Time
		// current and ready are CredentialCurrent's and Ready's status/reason.
		current, ready string
		says           string // in CredentialCurrent's message
		state          commitstatus.State
		// leads is how the commit status's description starts.
		leads string
	}{
		{"a young credential is current", readyWorker(nil), at.Add(24 * time.Hour),
			"True/Fresh", "True/Ready", "expires at 2027-03-04T09:30:00Z; issued at 2026-12-04T09:30:00Z", commitstatus.Success, "ready · "},
		{"a rotated credential says when", readyWorker(func(c *v1alpha1.CredentialStatus) { r := metav1.NewTime(at); c.RotatedAt = &r }), at,
			"True/Fresh", "True/Ready", "; rotated at 2026-12-04T09:30:00Z", commitstatus.Success, "ready · "},
		{"an unconfirmed rotation of a young credential is only mentioned", readyWorker(pendingSince(24 * time.Hour)), at.Add(48 * time.Hour),
			"True/Fresh", "True/Ready", "a new credential sent at 2026-12-05T09:30:00Z is not confirmed yet", commitstatus.Success, "ready · "},
		{"an assumed lifetime says so", readyWorker(func(c *v1alpha1.CredentialStatus) { c.LifetimeAssumed = true }), at,
			"True/Fresh", "True/Ready", "issued before the hub recorded lifetimes, so its lifetime counts from 2026-12-04T09:30:00Z", commitstatus.Success, "ready · "},
		{"failing rotations in the last third warn a working cluster without failing it", readyWorker(pendingSince(24 * time.Hour)), warning,
			"False/RotationFailing", "True/Ready", "the hub has sent the agent a new one since 2026-12-05T09:30:00Z, and the agent has not confirmed storing it",
			commitstatus.Success, "agent credential expires 2027-03-04T09:30:00Z, rotation failing · ready · 64× H100 80GB on 8 nodes"},
		{"an agent away in the last third", readyWorker(nil), warning.Add(time.Hour),
			"False/ExpiresSoon", "True/Ready", "has not been rotated since 2026-12-04T09:30:00Z", commitstatus.Success, "agent credential expires 2027-03-04T09:30:00Z, not rotated · "},
		{"an expired credential fails the cluster", readyWorker(pendingSince(24 * time.Hour)), expiry,
			"False/CredentialExpired", "False/CredentialExpired", "expired at 2027-03-04T09:30:00Z and the hub refuses it: give the cluster a new enrollment token with `flotilla cluster rotate-token gpu-a`",
			commitstatus.Failure, "the agent credential expired at 2027-03-04T09:30:00Z"},
		{"a credential of an older hub waits for its agent", enrolled(worker()), at,
			"Unknown/LifetimeNotRecorded", "False/AwaitingConnection", "its lifetime of 90 days counts from when its agent next connects", commitstatus.Pending, "waiting for the agent to connect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			Derive(tt.wc, tt.now)
			c := meta.FindStatusCondition(tt.wc.Status.Conditions, v1alpha1.ConditionCredentialCurrent)
			if got := string(c.Status) + "/" + c.Reason; got != tt.current || !strings.Contains(c.Message, tt.says) {
				t.Errorf("CredentialCurrent = %s %q, want %s saying %q", got, c.Message, tt.current, tt.says)
			}
			r := meta.FindStatusCondition(tt.wc.Status.Conditions, v1alpha1.ConditionReady)
			if got := string(r.Status) + "/" + r.Reason; got != tt.ready {
				t.Errorf("Ready = %s (%q), want %s", got, r.Message, tt.ready)
			}
			st := CommitStatus("flotilla/gpu-a", tt.wc)
			if st.State != tt.state || !strings.HasPrefix(st.Description, tt.leads) {
				t.Errorf("commit status %s %q, want %s leading with %q", st.State, st.Description, tt.state, tt.leads)
			}
			if CredentialDue(tt.wc, tt.now) {
				t.Error("CredentialDue right after deriving at the same time")
			}
		})
	}
}

func TestCredentialDueWhenTheLifetimeMovesOn(t *testing.T) {
	wc := readyWorker(nil)
	Derive(wc, at)
	for _, tt := range []struct {
		now time.Time
		due bool
	}{{at.Add(59 * 24 * time.Hour), false}, {warning, true}, {expiry, true}} {
		if got := CredentialDue(wc, tt.now); got != tt.due {
			t.Errorf("CredentialDue at %s = %v, want %v", tt.now, got, tt.due)
		}
	}
	if CredentialDue(worker(), expiry) {
		t.Error("a cluster nobody enrolled has a credential due")
	}
}

func TestCredentialFacts(t *testing.T) {
	issued, expires := at, at.Add(90*24*time.Hour)
	later := at.Add(24 * time.Hour)
	t.Run("a redemption records the lifetime", func(t *testing.T) {
		wc := worker()
		Redeemed{TokenHash: "sha256:" + strings.Repeat("ab", 32), At: issued, Credential: "c1", ExpiresAt: expires}.record(wc)
		if c := wc.Status.Credential; c == nil || !c.IssuedAt.Time.Equal(issued) || !c.ExpiresAt.Time.Equal(expires) || c.RotatedAt != nil {
			t.Fatalf("status.credential %+v", c)
		}
	})
	t.Run("the first unconfirmed send is kept, and a confirmation clears it", func(t *testing.T) {
		wc := enrolled(worker())
		CredentialInForce{Fingerprint: "c1", IssuedAt: issued, ExpiresAt: expires}.record(wc)
		RotationSent{At: later}.record(wc)
		RotationSent{At: later.Add(time.Hour)}.record(wc)
		if p := wc.Status.Credential.RotationPendingSince; p == nil || !p.Time.Equal(later) {
			t.Fatalf("rotationPendingSince %v, want the first send %s", p, later)
		}
		CredentialRotated{Fingerprint: "c2", IssuedAt: later, ExpiresAt: later.Add(90 * 24 * time.Hour), At: later.Add(2 * time.Hour)}.record(wc)
		c := wc.Status.Credential
		if c.RotationPendingSince != nil || c.RotatedAt == nil || !c.RotatedAt.Time.Equal(later.Add(2*time.Hour)) || !c.IssuedAt.Time.Equal(later) || wc.Status.Enrollment.CredentialFingerprint != "c2" {
			t.Fatalf("after the confirmation status.credential is %+v, fingerprint %s", c, wc.Status.Enrollment.CredentialFingerprint)
		}
	})
	t.Run("an assumed lifetime stays assumed for its credential only", func(t *testing.T) {
		wc := enrolled(worker())
		wc.Status.Enrollment.CredentialFingerprint = "c1"
		CredentialInForce{Fingerprint: "c1", IssuedAt: issued, ExpiresAt: expires, Assumed: true}.record(wc)
		CredentialInForce{Fingerprint: "c1", IssuedAt: issued, ExpiresAt: expires}.record(wc)
		if !wc.Status.Credential.LifetimeAssumed {
			t.Fatal("reconnecting with the same credential forgot its lifetime was assumed")
		}
		CredentialInForce{Fingerprint: "c2", IssuedAt: later, ExpiresAt: expires}.record(wc)
		if wc.Status.Credential.LifetimeAssumed {
			t.Fatal("another credential took over the assumption")
		}
	})
	t.Run("an undone redemption restores the credential before", func(t *testing.T) {
		wc := worker()
		RedemptionUndone{}.record(wc)
		if wc.Status.Credential != nil {
			t.Fatalf("an undone first redemption left %+v", wc.Status.Credential)
		}
	})
}

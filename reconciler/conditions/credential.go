package conditions

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// WarningBegins is when a credential issued at issued and good until expires enters
// the last third of its lifetime, where CredentialCurrent turns False. The hub rotates
// a credential daily, or at half its lifetime when that is sooner (reconciler/tunnel),
// so a credential gets there only after the rotations of a sixth of its lifetime or
// more have failed: for the default 90 days, two months of daily attempts, leaving a
// month's warning before the agent is locked out.
func WarningBegins(issued, expires time.Time) time.Time {
	return expires.Add(-expires.Sub(issued) / 3)
}

// credentialCurrent is CredentialCurrent's value at now, for an enrolled cluster.
func credentialCurrent(wc *v1alpha1.WorkerCluster, now time.Time) (metav1.ConditionStatus, string, string) {
	c := wc.Status.Credential
	if c == nil {
		life := v1alpha1.DefaultCredentialLifetime
		if l := wc.Spec.CredentialLifetime; l != nil {
			life = l.Duration
		}
		return metav1.ConditionUnknown, v1alpha1.ReasonLifetimeNotRecorded,
			fmt.Sprintf("the agent credential was issued before the hub recorded credential lifetimes: its lifetime of %s counts from when its agent next connects", Lifetime(life))
	}
	if wc.Spec.Revocation > c.Revocation {
		return metav1.ConditionFalse, v1alpha1.ReasonCredentialRevoked,
			// The action first: some forges cut a commit status's description at 140.
			fmt.Sprintf("agent credential revoked: install the agent with the new values.%s.local.yaml of `flotilla cluster rotate-token --revoke %s`; the hub refuses the credential issued under revocation %d, cluster.yaml says %d",
				wc.Name, wc.Name, c.Revocation, wc.Spec.Revocation)
	}
	expires := c.ExpiresAt.Time
	if !now.Before(expires) {
		return metav1.ConditionFalse, v1alpha1.ReasonCredentialExpired,
			fmt.Sprintf("the agent credential expired at %s and the hub refuses it: give the cluster a new enrollment token with `flotilla cluster rotate-token %s` and install the agent with the new values file", stamp(expires), wc.Name)
	}
	if !now.Before(WarningBegins(c.IssuedAt.Time, expires)) {
		if p := c.RotationPendingSince; p != nil {
			return metav1.ConditionFalse, v1alpha1.ReasonRotationFailing,
				fmt.Sprintf("the agent credential expires at %s: the hub has sent the agent a new one since %s, and the agent has not confirmed storing it (see the agent's log); once it expires the agent cannot connect", stamp(expires), stamp(p.Time))
		}
		return metav1.ConditionFalse, v1alpha1.ReasonExpiresSoon,
			fmt.Sprintf("the agent credential expires at %s and has not been rotated since %s: the hub rotates it over the tunnel, so the agent must connect before then", stamp(expires), stamp(c.IssuedAt.Time))
	}
	msg := "expires at " + stamp(expires)
	switch {
	case c.LifetimeAssumed:
		msg += fmt.Sprintf("; issued before the hub recorded lifetimes, so its lifetime counts from %s", stamp(c.IssuedAt.Time))
	case c.RotatedAt != nil:
		msg += "; rotated at " + stamp(c.RotatedAt.Time)
	default:
		msg += "; issued at " + stamp(c.IssuedAt.Time)
	}
	if p := c.RotationPendingSince; p != nil {
		msg += "; a new credential sent at " + stamp(p.Time) + " is not confirmed yet"
	}
	return metav1.ConditionTrue, v1alpha1.ReasonCredentialFresh, msg
}

// credentialWarning is what a commit status says first of a credential in the last
// third of its lifetime, or "": its description is cut at 140 characters by some forges.
func credentialWarning(wc *v1alpha1.WorkerCluster) string {
	c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionCredentialCurrent)
	if c == nil || c.Status != metav1.ConditionFalse || wc.Status.Credential == nil {
		return ""
	}
	expires := stamp(wc.Status.Credential.ExpiresAt.Time)
	switch c.Reason {
	case v1alpha1.ReasonRotationFailing:
		return "agent credential expires " + expires + ", rotation failing"
	case v1alpha1.ReasonExpiresSoon:
		return "agent credential expires " + expires + ", not rotated"
	}
	return ""
}

// CredentialDue reports whether deriving wc's status at now would change its
// CredentialCurrent condition: the credential entered the last third of its lifetime, or
// ran out, since it was last judged. It lets a caller that watches many clusters write
// only those.
func CredentialDue(wc *v1alpha1.WorkerCluster, now time.Time) bool {
	if wc.Status.Enrollment == nil {
		return false
	}
	st, reason, _ := credentialCurrent(wc, now)
	c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionCredentialCurrent)
	return c == nil || c.Status != st || c.Reason != reason
}

// Lifetime is a credential lifetime as people say it: 90 days, 36h, 90m.
func Lifetime(d time.Duration) string {
	switch {
	case d >= 48*time.Hour && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return d.String()
}

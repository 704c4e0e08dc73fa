package conditions

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// Fact is something learnt about a worker cluster. Each kind records itself on the
// part of the status it concerns; the Writer derives the rest.
type Fact interface {
	record(*v1alpha1.WorkerCluster)
}

// Redeemed: an agent redeemed the cluster's enrollment token and was issued the
// credential named by Credential (a fingerprint), good until ExpiresAt.
type Redeemed struct {
	TokenHash  string
	At         time.Time
	Credential string
	ExpiresAt  time.Time
	// Revocation is the spec.revocation the credential was issued under.
	Revocation int64
}

func (f Redeemed) record(wc *v1alpha1.WorkerCluster) {
	at := metav1.NewTime(f.At)
	wc.Status.Enrollment = &v1alpha1.Enrollment{TokenHash: f.TokenHash, RedeemedAt: at, CredentialFingerprint: f.Credential, CredentialIssuedAt: &at}
	wc.Status.Credential = lifetime(f.At, f.ExpiresAt, f.Revocation)
}

// lifetime is the credential status of a credential issued at and good until expires,
// under revocation; nil when no expiry is known.
func lifetime(at, expires time.Time, revocation int64) *v1alpha1.CredentialStatus {
	if expires.IsZero() {
		return nil
	}
	return &v1alpha1.CredentialStatus{IssuedAt: metav1.NewTime(at), ExpiresAt: metav1.NewTime(expires), Revocation: revocation}
}

// RedemptionUndone gives a token back: the credential of a redemption could not be
// stored, so the agent could never have used it. Previous is the enrollment before, and
// PreviousCredential its credential's lifetime.
type RedemptionUndone struct {
	Previous           *v1alpha1.Enrollment
	PreviousCredential *v1alpha1.CredentialStatus
}

func (f RedemptionUndone) record(wc *v1alpha1.WorkerCluster) {
	wc.Status.Enrollment = f.Previous.DeepCopy()
	wc.Status.Credential = f.PreviousCredential.DeepCopy()
}

// CredentialIssued: the agent holds a new credential, good until ExpiresAt, issued in
// place of one it never received (a repeated redemption).
type CredentialIssued struct {
	Fingerprint string
	At          time.Time
	ExpiresAt   time.Time
	Revocation  int64
}

func (f CredentialIssued) record(wc *v1alpha1.WorkerCluster) {
	if wc.Status.Enrollment == nil {
		return // revoked meanwhile
	}
	at := metav1.NewTime(f.At)
	wc.Status.Enrollment.CredentialFingerprint = f.Fingerprint
	wc.Status.Enrollment.CredentialIssuedAt = &at
	next := lifetime(f.At, f.ExpiresAt, f.Revocation)
	if next != nil && wc.Status.Credential != nil {
		next.RotatedAt = wc.Status.Credential.RotatedAt
	}
	wc.Status.Credential = next
}

// CredentialRotated: the agent confirmed, at At, storing the credential the hub rotated
// to, which was issued at IssuedAt and is good until ExpiresAt.
type CredentialRotated struct {
	Fingerprint         string
	IssuedAt, ExpiresAt time.Time
	At                  time.Time
	Revocation          int64
}

func (f CredentialRotated) record(wc *v1alpha1.WorkerCluster) {
	if wc.Status.Enrollment == nil {
		return // revoked meanwhile
	}
	issued, at := metav1.NewTime(f.IssuedAt), metav1.NewTime(f.At)
	wc.Status.Enrollment.CredentialFingerprint = f.Fingerprint
	wc.Status.Enrollment.CredentialIssuedAt = &issued
	wc.Status.Credential = lifetime(f.IssuedAt, f.ExpiresAt, f.Revocation)
	if wc.Status.Credential != nil {
		wc.Status.Credential.RotatedAt = &at
	}
}

// RotationSent: the hub sent the agent a new credential at At, which it has not
// confirmed yet. The first of a series of unconfirmed sends is the one kept.
type RotationSent struct {
	At time.Time
}

func (f RotationSent) record(wc *v1alpha1.WorkerCluster) {
	if c := wc.Status.Credential; c != nil && c.RotationPendingSince == nil {
		at := metav1.NewTime(f.At)
		c.RotationPendingSince = &at
	}
}

// CredentialInForce: the agent that just connected holds the credential Fingerprint,
// whose lifetime runs from IssuedAt to ExpiresAt; Assumed when it was issued before
// the hub recorded lifetimes and its lifetime counts from the hub's first sight of it.
// A rotation still unconfirmed stays recorded: the agent may confirm it now.
type CredentialInForce struct {
	Fingerprint         string
	IssuedAt, ExpiresAt time.Time
	Assumed             bool
	Revocation          int64
}

func (f CredentialInForce) record(wc *v1alpha1.WorkerCluster) {
	if wc.Status.Enrollment == nil || f.ExpiresAt.IsZero() {
		return
	}
	next := lifetime(f.IssuedAt, f.ExpiresAt, f.Revocation)
	next.LifetimeAssumed = f.Assumed
	if c := wc.Status.Credential; c != nil {
		next.RotatedAt, next.RotationPendingSince = c.RotatedAt, c.RotationPendingSince
		// The first sight of a credential without a lifetime is once; it stays assumed
		// for as long as it is the one in force.
		next.LifetimeAssumed = next.LifetimeAssumed || c.LifetimeAssumed && wc.Status.Enrollment.CredentialFingerprint == f.Fingerprint
	}
	wc.Status.Credential = next
	wc.Status.Enrollment.CredentialFingerprint = f.Fingerprint
}

// Connected: the agent said hello on a new tunnel.
type Connected struct {
	At                              time.Time
	AgentVersion, KubernetesVersion string
	// Protocol is the negotiated protocol version.
	Protocol int
}

func (f Connected) record(wc *v1alpha1.WorkerCluster) {
	at := metav1.NewTime(f.At)
	wc.Status.LastSeen = &at
	wc.Status.Agent = &v1alpha1.AgentInfo{Version: f.AgentVersion, KubernetesVersion: f.KubernetesVersion, ProtocolVersion: int32(f.Protocol)}
	set(wc, v1alpha1.ConditionConnected, metav1.ConditionTrue, v1alpha1.ReasonTunnelUp,
		fmt.Sprintf("connected at %s, agent %s on Kubernetes %s", stamp(f.At), f.AgentVersion, f.KubernetesVersion))
}

// Cause says why a tunnel ended.
type Cause int

const (
	// HungUp: the agent or the network closed the tunnel.
	HungUp Cause = iota
	// Stuck: the hub closed the tunnel because the agent took nothing it sent for the
	// tunnel's write timeout.
	Stuck
	// Stalled: the connection stopped taking data (the tunnel's liveness writes timed out).
	Stalled
	// NotBack: a restarted hub waited for the agent that a previous hub had connected,
	// and it did not come back.
	NotBack
	// Expired: the hub closed the tunnel because the agent's credential expired.
	Expired
	// Flooded: the hub closed the tunnel because the agent kept sending reports over
	// its budget.
	Flooded
	// Revoked: the hub closed the tunnel because the cluster's spec.revocation revoked
	// the credential it was opened with.
	Revoked
)

func (c Cause) String() string {
	switch c {
	case HungUp:
		return "HungUp"
	case Stuck:
		return "Stuck"
	case Stalled:
		return "Stalled"
	case NotBack:
		return "NotBack"
	case Expired:
		return "Expired"
	case Flooded:
		return "Flooded"
	case Revoked:
		return "Revoked"
	}
	return fmt.Sprintf("Cause(%d)", int(c))
}

// Disconnected: the agent's tunnel ended, for Cause. WriteTimeout is the tunnel's, for
// the message of a Stuck agent; ReportBudget the agent's, for the message of a Flooded
// one.
type Disconnected struct {
	At           time.Time
	Cause        Cause
	WriteTimeout time.Duration
	ReportBudget string
	// Seen, for NotBack, is the status.lastSeen the hub found when it judged the agent
	// not back (zero for none). A lastSeen that moved since is an agent seen since,
	// which stays connected however late this fact is recorded: no clock is compared.
	Seen time.Time
}

func (f Disconnected) record(wc *v1alpha1.WorkerCluster) {
	if f.Cause == NotBack {
		// Only what a previous hub left connected: an agent that disconnected says
		// when and why already.
		c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionConnected)
		var seen time.Time
		if wc.Status.LastSeen != nil {
			seen = wc.Status.LastSeen.Time
		}
		if c != nil && c.Status == metav1.ConditionTrue && seen.Equal(f.Seen) {
			set(wc, v1alpha1.ConditionConnected, metav1.ConditionFalse, v1alpha1.ReasonTunnelDown, "the agent has not connected since the hub restarted")
		}
		return
	}
	at := metav1.NewTime(f.At)
	wc.Status.LastSeen = &at
	reason := v1alpha1.ReasonTunnelDown
	msg := fmt.Sprintf("the agent disconnected at %s; the worker keeps its last applied state", stamp(f.At))
	switch f.Cause {
	case Stuck:
		reason = v1alpha1.ReasonSendTimeout
		msg = fmt.Sprintf("the hub disconnected the agent at %s: it took nothing the hub sent for %s (a stuck agent, or a network that drops its traffic); the worker keeps its last applied state",
			stamp(f.At), f.WriteTimeout)
	case Stalled:
		reason = v1alpha1.ReasonSendTimeout
		msg = fmt.Sprintf("the hub disconnected the agent at %s: its connection stopped taking data (a stuck agent, or a network that drops its traffic); the worker keeps its last applied state",
			stamp(f.At))
	case Expired:
		msg = fmt.Sprintf("the hub closed the tunnel at %s: the agent credential expired; the worker keeps its last applied state", stamp(f.At))
	case Revoked:
		reason = v1alpha1.ReasonCredentialRevoked
		msg = fmt.Sprintf("the hub disconnected the agent at %s: revocation %d of cluster.yaml revoked its credential; install the agent with the values file of `flotilla cluster rotate-token --revoke %s`; the worker keeps its last applied state",
			stamp(f.At), wc.Spec.Revocation, wc.Name)
	case Flooded:
		reason = v1alpha1.ReasonTooManyReports
		msg = fmt.Sprintf("the hub disconnected the agent at %s: it kept sending apply reports and inventories faster than its budget of %s (an agent in a loop, or someone else holding its credential: check the agent's log, and rotate its token with --revoke if in doubt); the worker keeps its last applied state",
			stamp(f.At), f.ReportBudget)
	}
	set(wc, v1alpha1.ConditionConnected, metav1.ConditionFalse, reason, msg)
}

// Seen: the agent was heard from (a heartbeat).
type Seen struct {
	At time.Time
}

func (f Seen) record(wc *v1alpha1.WorkerCluster) {
	at := metav1.NewTime(f.At)
	wc.Status.LastSeen = &at
}

// Desired: the hub rendered a new desired state for the cluster, with this hash.
type Desired struct {
	Hash string
}

func (f Desired) record(wc *v1alpha1.WorkerCluster) { wc.Status.DesiredHash = f.Hash }

// Sourced: the cluster's desired state comes from Commit, the newest commit that
// changed its inputs, whose digest is InputsDigest (none for a cluster leaving the
// fleet).
type Sourced struct {
	Commit       string
	InputsDigest string
}

func (f Sourced) record(wc *v1alpha1.WorkerCluster) {
	wc.Status.Source = &v1alpha1.SourceStatus{Commit: f.Commit, InputsDigest: f.InputsDigest}
}

// Applied: the agent reported applying a desired state. Sent is the hash of the
// desired state the tunnel sent it last, when it knows one.
type Applied struct {
	Report *protocol.Applied
	Sent   string
}

func (f Applied) record(wc *v1alpha1.WorkerCluster) {
	if f.Sent != "" {
		wc.Status.DesiredHash = f.Sent
	}
	if f.Report.Complete() {
		wc.Status.AppliedHash = f.Report.Hash
	}
	if f.Report.Components != nil {
		wc.Status.Components = nil
		for _, c := range f.Report.Components {
			wc.Status.Components = append(wc.Status.Components, v1alpha1.ComponentStatus{
				Name: string(c.Component), Version: c.Version, Managed: c.Action != components.ActionChecked, Ready: c.Ready, Message: c.Message,
			})
		}
	}
	status, reason, msg := applied(wc.Status.DesiredHash, f.Report)
	// The report is about the generation the agent was sent, which may be older than
	// the WorkerCluster's by now: Derive judges it against the current one.
	meta.SetStatusCondition(&wc.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionWorkerConfigured, Status: status, Reason: reason, Message: msg, ObservedGeneration: f.Report.Generation,
	})
}

// applied says what a report means for WorkerConfigured: True only for the current
// desired state applied whole.
func applied(desired string, a *protocol.Applied) (metav1.ConditionStatus, string, string) {
	for _, c := range a.Components {
		switch {
		case c.Action == components.ActionRefused:
			return metav1.ConditionFalse, refusedReason(c), c.String()
		case c.Action == components.ActionFailed:
			return metav1.ConditionFalse, v1alpha1.ReasonComponentFailed, c.String()
		}
	}
	var waiting []string
	for _, c := range a.Components {
		if !c.Ready {
			waiting = append(waiting, c.String())
		}
	}
	if len(waiting) > 0 {
		return metav1.ConditionFalse, v1alpha1.ReasonComponentsConverging, strings.Join(waiting, "; ") + "; the worker's ClusterQueues admit no new work until then"
	}
	if a.Error != "" {
		return metav1.ConditionFalse, v1alpha1.ReasonApplyFailed, "the agent could not apply the desired state: " + a.Error
	}
	for _, r := range a.Results {
		if r.Action == protocol.ActionRefused {
			return metav1.ConditionFalse, v1alpha1.ReasonAdoptionRefused, r.Message
		}
	}
	for _, r := range a.Results {
		if r.Action == protocol.ActionFailed {
			return metav1.ConditionFalse, v1alpha1.ReasonApplyFailed, fmt.Sprintf("%s %s: %s", r.Kind, objectName(r), r.Message)
		}
	}
	if desired != "" && a.Hash != desired {
		return metav1.ConditionFalse, v1alpha1.ReasonOutdated, fmt.Sprintf("the agent applied %s; the desired state is %s", a.Hash, desired)
	}
	msg := fmt.Sprintf("applied %d objects at %s", len(a.Results), a.Hash)
	for _, c := range a.Components {
		if c.Action == components.ActionChecked && c.Running != c.Version {
			msg += "; " + c.String()
		}
	}
	return metav1.ConditionTrue, v1alpha1.ReasonApplied, msg
}

// refusedReason is the reason of a refused component: the worker's image policy's rule
// when the agent names one, else a component in the way. Only reasons the hub knows are
// taken from an agent: a condition's reason is the hub's vocabulary, not the worker's.
func refusedReason(c components.Status) string {
	switch c.Reason {
	case components.ReasonRegistryNotAllowed:
		return v1alpha1.ReasonRegistryNotAllowed
	case components.ReasonDigestNotAllowed:
		return v1alpha1.ReasonDigestNotAllowed
	}
	return v1alpha1.ReasonComponentRefused
}

func objectName(r protocol.ObjectResult) string {
	if r.Namespace != "" {
		return r.Namespace + "/" + r.Name
	}
	return r.Name
}

// Inventory: the agent reported the GPUs of its cluster's Ready, schedulable nodes.
type Inventory struct {
	Report *protocol.Inventory
}

func (f Inventory) record(wc *v1alpha1.WorkerCluster) {
	wc.Status.GPUs = nil
	for _, t := range f.Report.Totals {
		wc.Status.GPUs = append(wc.Status.GPUs, v1alpha1.GPUTotal{Product: t.Product, Count: t.GPUs, Nodes: int32(t.Nodes)})
	}
	wc.Status.UnavailableGPUNodes = int32(f.Report.UnavailableNodes)
}

func set(wc *v1alpha1.WorkerCluster, typ string, s metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&wc.Status.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: wc.Generation})
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// Placed: the hub placed the cluster in the hub's Kueue (or could not, or does not
// dispatch for its fleet).
type Placed struct {
	Pool      string
	Placement v1alpha1.DispatchPlacement
	// Withdrawn: the hub's pool ClusterQueue no longer counts the cluster's quota.
	Withdrawn bool
}

func (f Placed) record(wc *v1alpha1.WorkerCluster) {
	d := wc.Status.Dispatch
	if d == nil {
		d = &v1alpha1.DispatchStatus{}
	}
	d.Pool, d.Placement, d.Withdrawn = f.Pool, f.Placement, f.Withdrawn
	if f.Placement != v1alpha1.PlacementMember && f.Placement != v1alpha1.PlacementDraining {
		d.Active = nil // no MultiKueueCluster to judge
	}
	wc.Status.Dispatch = d
}

// KueueJudged: Kueue set the Active condition of the cluster's MultiKueueCluster; nil
// Active means it has none (yet).
type KueueJudged struct {
	Active *v1alpha1.KueueCondition
}

func (f KueueJudged) record(wc *v1alpha1.WorkerCluster) {
	if wc.Status.Dispatch == nil {
		return // placed nowhere: nothing of Kueue's to carry
	}
	wc.Status.Dispatch.Active = f.Active.DeepCopy()
}

package conditions

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

var at = time.Date(2026, 12, 4, 9, 30, 0, 0, time.UTC)

// worker is a WorkerCluster at generation 2 whose conditions are given as
// type=status/reason.
func worker(conds ...string) *v1alpha1.WorkerCluster {
	wc := &v1alpha1.WorkerCluster{ObjectMeta: metav1.ObjectMeta{Name: "gpu-a", Generation: 2}}
	for _, c := range conds {
		typ, rest, _ := strings.Cut(c, "=")
		status, reason, _ := strings.Cut(rest, "/")
		wc.Status.Conditions = append(wc.Status.Conditions, metav1.Condition{Type: typ, Status: metav1.ConditionStatus(status), Reason: reason, Message: "before", ObservedGeneration: 2})
	}
	return wc
}

func TestAppliedReports(t *testing.T) {
	ok := protocol.ObjectResult{Kind: "ClusterQueue", Name: "cq", Action: protocol.ActionUnchanged}
	tests := []struct {
		name    string
		desired string
		applied protocol.Applied
		status  metav1.ConditionStatus
		reason  string
		// appliedHash is what status.appliedHash holds afterwards.
		appliedHash string
	}{
		{"the current state applied whole is configured", "sha256:a", protocol.Applied{Generation: 2, Hash: "sha256:a", Results: []protocol.ObjectResult{ok}}, metav1.ConditionTrue, v1alpha1.ReasonApplied, "sha256:a"},
		{"an older state applied whole is not", "sha256:b", protocol.Applied{Generation: 2, Hash: "sha256:a", Results: []protocol.ObjectResult{ok}}, metav1.ConditionFalse, v1alpha1.ReasonOutdated, "sha256:a"},
		{"a refused object names the refusal", "sha256:a", protocol.Applied{Generation: 2, Hash: "sha256:a", Results: []protocol.ObjectResult{ok, {Kind: "ClusterQueue", Name: "x", Action: protocol.ActionRefused, Message: "refuse to adopt existing object not owned by this WorkerCluster"}}}, metav1.ConditionFalse, v1alpha1.ReasonAdoptionRefused, ""},
		{"a refusal wins over a failure", "sha256:a", protocol.Applied{Generation: 2, Hash: "sha256:a", Results: []protocol.ObjectResult{{Action: protocol.ActionFailed, Message: "x"}, {Action: protocol.ActionRefused, Message: "refuse to adopt"}}}, metav1.ConditionFalse, v1alpha1.ReasonAdoptionRefused, ""},
		{"a failed object fails", "sha256:a", protocol.Applied{Generation: 2, Hash: "sha256:a", Results: []protocol.ObjectResult{{Kind: "LocalQueue", Namespace: "team", Name: "q", Action: protocol.ActionFailed, Message: "forbidden"}}}, metav1.ConditionFalse, v1alpha1.ReasonApplyFailed, ""},
		{"a state not applied as a whole fails", "sha256:a", protocol.Applied{Generation: 2, Hash: "sha256:a", Error: "the API server is unreachable"}, metav1.ConditionFalse, v1alpha1.ReasonApplyFailed, ""},
		{"an older generation applied whole is outdated", "sha256:a", protocol.Applied{Generation: 1, Hash: "sha256:a", Results: []protocol.ObjectResult{ok}}, metav1.ConditionFalse, v1alpha1.ReasonOutdated, "sha256:a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wc := worker()
			Applied{Report: &tt.applied, Sent: tt.desired}.record(wc)
			Derive(wc)
			c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionWorkerConfigured)
			if c.Status != tt.status || c.Reason != tt.reason || c.Message == "" {
				t.Fatalf("WorkerConfigured = %s %s %q, want %s %s with a message", c.Status, c.Reason, c.Message, tt.status, tt.reason)
			}
			if wc.Status.AppliedHash != tt.appliedHash || wc.Status.DesiredHash != tt.desired {
				t.Errorf("applied %q, desired %q; want %q, %q", wc.Status.AppliedHash, wc.Status.DesiredHash, tt.appliedHash, tt.desired)
			}
		})
	}
}

func TestConnectionFacts(t *testing.T) {
	tests := []struct {
		name   string
		before []string
		fact   Fact
		status metav1.ConditionStatus
		reason string
		// says is a part of the message a person reads.
		says     string
		lastSeen bool
	}{
		{"a hello connects", []string{"Connected=False/TunnelDown"}, Connected{At: at, AgentVersion: "v0.9.0", KubernetesVersion: "v1.34.1"},
			metav1.ConditionTrue, v1alpha1.ReasonTunnelUp, "agent v0.9.0 on Kubernetes v1.34.1", true},
		{"a hang-up keeps the worker's state", []string{"Connected=True/TunnelUp"}, Disconnected{At: at, Cause: HungUp},
			metav1.ConditionFalse, v1alpha1.ReasonTunnelDown, "disconnected at 2026-12-04T09:30:00Z; the worker keeps its last applied state", true},
		{"a stuck agent says how long it took nothing", []string{"Connected=True/TunnelUp"}, Disconnected{At: at, Cause: Stuck, WriteTimeout: 30 * time.Second},
			metav1.ConditionFalse, v1alpha1.ReasonSendTimeout, "took nothing the hub sent for 30s", true},
		{"a stalled connection is a send timeout", []string{"Connected=True/TunnelUp"}, Disconnected{At: at, Cause: Stalled},
			metav1.ConditionFalse, v1alpha1.ReasonSendTimeout, "stopped taking data", true},
		{"an agent not back after a hub restart is down", []string{"Connected=True/TunnelUp"}, Disconnected{Cause: NotBack},
			metav1.ConditionFalse, v1alpha1.ReasonTunnelDown, "has not connected since the hub restarted", false},
		{"not back keeps the reason of an agent that had disconnected", []string{"Connected=False/SendTimeout"}, Disconnected{Cause: NotBack},
			metav1.ConditionFalse, v1alpha1.ReasonSendTimeout, "before", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wc := worker(tt.before...)
			tt.fact.record(wc)
			c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionConnected)
			if c.Status != tt.status || c.Reason != tt.reason || !strings.Contains(c.Message, tt.says) {
				t.Fatalf("Connected = %s %s %q, want %s %s saying %q", c.Status, c.Reason, c.Message, tt.status, tt.reason, tt.says)
			}
			if got := wc.Status.LastSeen != nil && wc.Status.LastSeen.Time.Equal(at); got != tt.lastSeen {
				t.Errorf("lastSeen recorded = %v, want %v", got, tt.lastSeen)
			}
		})
	}
}

func TestEnrollmentFacts(t *testing.T) {
	token := "sha256:" + strings.Repeat("ab", 32)
	later := at.Add(time.Hour)
	wc := worker()
	Redeemed{TokenHash: token, At: at, Credential: "sha256:1111"}.record(wc)
	Derive(wc)
	if c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionRegistered); c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonEnrolled || !strings.Contains(c.Message, "2026-12-04T09:30:00Z") {
		t.Fatalf("after a redemption Registered = %+v, want True Enrolled saying when", c)
	}
	CredentialIssued{Fingerprint: "sha256:2222", At: later}.record(wc)
	if e := wc.Status.Enrollment; e.CredentialFingerprint != "sha256:2222" || !e.CredentialIssuedAt.Time.Equal(later) || !e.RedeemedAt.Time.Equal(at) || e.TokenHash != token {
		t.Fatalf("after a rotation the enrollment is %+v, want the new credential and the redemption kept", e)
	}
	RedemptionUndone{}.record(wc)
	Derive(wc)
	if wc.Status.Enrollment != nil || meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionRegistered) != nil {
		t.Fatalf("an undone first redemption leaves %+v, %+v; want no enrollment and no Registered", wc.Status.Enrollment, wc.Status.Conditions)
	}
	CredentialIssued{Fingerprint: "sha256:3333", At: later}.record(wc)
	if wc.Status.Enrollment != nil {
		t.Fatalf("a credential confirmed after revocation made up an enrollment: %+v", wc.Status.Enrollment)
	}
}

func TestInventory(t *testing.T) {
	wc := worker()
	wc.Status.GPUs = []v1alpha1.GPUTotal{{Product: "NVIDIA-A100-SXM4-40GB", Count: 8, Nodes: 1}}
	Inventory{Report: &protocol.Inventory{Totals: []protocol.ProductTotal{{Product: "NVIDIA-H100-80GB-HBM3", GPUs: 16, Nodes: 2}}, UnavailableNodes: 1}}.record(wc)
	if len(wc.Status.GPUs) != 1 || wc.Status.GPUs[0] != (v1alpha1.GPUTotal{Product: "NVIDIA-H100-80GB-HBM3", Count: 16, Nodes: 2}) || wc.Status.UnavailableGPUNodes != 1 {
		t.Fatalf("GPUs %+v, unavailable %d: want the report to replace what was there", wc.Status.GPUs, wc.Status.UnavailableGPUNodes)
	}
}

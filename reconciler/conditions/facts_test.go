package conditions

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
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
		{"a component on its way is converging", "sha256:a", protocol.Applied{Generation: 2, Hash: "sha256:a", Components: []components.Status{
			{Component: components.JobSet, Version: "v0.11.1", Action: components.ActionInstalled, Ready: true},
			{Component: components.Kueue, Version: "v0.17.0", Action: components.ActionInstalled, Ready: false, Message: "waiting for kueue v0.17.0 to answer: its webhook does not answer"}}},
			metav1.ConditionFalse, v1alpha1.ReasonComponentsConverging, ""},
		{"a refused component names what was found", "sha256:a", protocol.Applied{Generation: 2, Hash: "sha256:a", Components: []components.Status{
			{Component: components.JobSet, Version: "v0.11.1", Action: components.ActionInstalled},
			{Component: components.Kueue, Version: "v0.17.0", Action: components.ActionRefused, Message: "Kueue was installed without Helm"}}},
			metav1.ConditionFalse, v1alpha1.ReasonComponentRefused, ""},
		{"a registry the worker does not allow says so", "sha256:a", protocol.Applied{Generation: 2, Hash: "sha256:a", Components: []components.Status{
			{Component: components.JobSet, Version: "v0.11.1", Action: components.ActionRefused, Reason: components.ReasonRegistryNotAllowed, Message: `registry "mirror.example" is not among the registries this worker allows`},
			{Component: components.Kueue, Version: "v0.17.0", Action: components.ActionRefused, Reason: components.ReasonRegistryNotAllowed, Message: `registry "mirror.example" is not among the registries this worker allows`}}},
			metav1.ConditionFalse, v1alpha1.ReasonRegistryNotAllowed, ""},
		{"a digest the worker does not allow says so", "sha256:a", protocol.Applied{Generation: 2, Hash: "sha256:a", Components: []components.Status{
			{Component: components.Kueue, Version: "v0.17.0", Action: components.ActionRefused, Reason: components.ReasonDigestNotAllowed, Message: "kueue's image carries no digest"}}},
			metav1.ConditionFalse, v1alpha1.ReasonDigestNotAllowed, ""},
		{"a reason the hub does not know is a refusal", "sha256:a", protocol.Applied{Generation: 2, Hash: "sha256:a", Components: []components.Status{
			{Component: components.Kueue, Version: "v0.17.0", Action: components.ActionRefused, Reason: "Anything At All", Message: "refused"}}},
			metav1.ConditionFalse, v1alpha1.ReasonComponentRefused, ""},
		{"a failed install fails", "sha256:a", protocol.Applied{Generation: 2, Hash: "sha256:a", Components: []components.Status{
			{Component: components.Kueue, Version: "v0.17.0", Action: components.ActionFailed, Message: "the chart did not render"}}},
			metav1.ConditionFalse, v1alpha1.ReasonComponentFailed, ""},
		{"ready components and objects are configured", "sha256:a", protocol.Applied{Generation: 2, Hash: "sha256:a", Results: []protocol.ObjectResult{ok}, Components: []components.Status{
			{Component: components.JobSet, Version: "v0.11.1", Action: components.ActionUnchanged, Ready: true},
			{Component: components.Kueue, Version: "v0.17.0", Action: components.ActionUpgraded, Ready: true}}},
			metav1.ConditionTrue, v1alpha1.ReasonApplied, "sha256:a"},
		{"an older generation applied whole is outdated", "sha256:a", protocol.Applied{Generation: 1, Hash: "sha256:a", Results: []protocol.ObjectResult{ok}}, metav1.ConditionFalse, v1alpha1.ReasonOutdated, "sha256:a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wc := worker()
			Applied{Report: &tt.applied, Sent: tt.desired}.record(wc)
			Derive(wc, at)
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

const refusedRegistry = `registry "mirror.example" is not among the registries this worker allows (components.allowedRegistries in the agent's Helm values: registry.k8s.io); its administrator adds it there`

// What a worker's components show: in the status, on WorkerConfigured, and on the
// commit, where converging is pending and a refusal is a failure.
func TestComponentReports(t *testing.T) {
	tests := []struct {
		name       string
		statuses   []components.Status
		message    string // in WorkerConfigured's message
		state      commitstatus.State
		components []v1alpha1.ComponentStatus
	}{
		{
			name: "converging names the component, its version and the hold",
			statuses: []components.Status{
				{Component: components.JobSet, Version: "v0.11.1", Action: components.ActionUnchanged, Ready: true},
				{Component: components.Kueue, Version: "v0.17.0", Action: components.ActionUpgraded, Message: "waiting for kueue v0.17.0 to report ClusterQueue gpu Active"},
			},
			message: "kueue v0.17.0: waiting for kueue v0.17.0 to report ClusterQueue gpu Active; the worker's ClusterQueues admit no new work until then",
			state:   commitstatus.Pending,
			components: []v1alpha1.ComponentStatus{
				{Name: "jobset", Version: "v0.11.1", Managed: true, Ready: true},
				{Name: "kueue", Version: "v0.17.0", Managed: true, Message: "waiting for kueue v0.17.0 to report ClusterQueue gpu Active"},
			},
		},
		{
			name: "every component that is not ready is named",
			statuses: []components.Status{
				{Component: components.JobSet, Version: "v0.11.1", Action: components.ActionInstalled, Message: "waiting for kueue v0.17.0 to answer first, since its webhooks see JobSets too"},
				{Component: components.Kueue, Version: "v0.17.0", Action: components.ActionInstalled, Message: "waiting for kueue v0.17.0 to answer: its webhook does not answer"},
			},
			message: "jobset v0.11.1: waiting for kueue v0.17.0 to answer first, since its webhooks see JobSets too; kueue v0.17.0: waiting for kueue v0.17.0 to answer: its webhook does not answer; the worker's ClusterQueues admit no new work until then",
			state:   commitstatus.Pending,
			components: []v1alpha1.ComponentStatus{
				{Name: "jobset", Version: "v0.11.1", Managed: true, Message: "waiting for kueue v0.17.0 to answer first, since its webhooks see JobSets too"},
				{Name: "kueue", Version: "v0.17.0", Managed: true, Message: "waiting for kueue v0.17.0 to answer: its webhook does not answer"},
			},
		},
		{
			name: "a refusal fails the commit with how to hand over",
			statuses: []components.Status{
				{Component: components.Kueue, Version: "v0.17.0", Action: components.ActionRefused, Message: "found Kueue installed without Helm; set spec.components.adopt: true"},
			},
			message:    "kueue v0.17.0: found Kueue installed without Helm; set spec.components.adopt: true",
			state:      commitstatus.Failure,
			components: []v1alpha1.ComponentStatus{{Name: "kueue", Version: "v0.17.0", Managed: true, Message: "found Kueue installed without Helm; set spec.components.adopt: true"}},
		},
		{
			name: "a registry the worker does not allow fails the commit with who allows it",
			statuses: []components.Status{
				{Component: components.JobSet, Version: "v0.11.1", Action: components.ActionRefused, Reason: components.ReasonRegistryNotAllowed, Message: refusedRegistry},
				{Component: components.Kueue, Version: "v0.17.0", Action: components.ActionRefused, Reason: components.ReasonRegistryNotAllowed, Message: refusedRegistry},
			},
			message: "jobset v0.11.1: " + refusedRegistry,
			state:   commitstatus.Failure,
			components: []v1alpha1.ComponentStatus{
				{Name: "jobset", Version: "v0.11.1", Managed: true, Message: refusedRegistry},
				{Name: "kueue", Version: "v0.17.0", Managed: true, Message: refusedRegistry},
			},
		},
		{
			name: "a version other than the fleet's on an unmanaged worker is reported, not failed",
			statuses: []components.Status{
				{Component: components.Kueue, Version: "v0.17.0", Action: components.ActionChecked, Ready: true, Running: "v0.16.2", Message: "not managed by flotilla; runs v0.16.2, and fleet.yaml names v0.17.0"},
			},
			message:    "applied 1 objects at sha256:a; kueue v0.17.0: not managed by flotilla; runs v0.16.2, and fleet.yaml names v0.17.0",
			state:      commitstatus.Success,
			components: []v1alpha1.ComponentStatus{{Name: "kueue", Version: "v0.17.0", Ready: true, Message: "not managed by flotilla; runs v0.16.2, and fleet.yaml names v0.17.0"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wc := worker(v1alpha1.ConditionRegistered+"=True/"+v1alpha1.ReasonEnrolled, v1alpha1.ConditionConnected+"=True/"+v1alpha1.ReasonTunnelUp)
			wc.Status.Enrollment = &v1alpha1.Enrollment{RedeemedAt: metav1.NewTime(at)}
			rep := protocol.Applied{Generation: 2, Hash: "sha256:a", Results: []protocol.ObjectResult{{Kind: "ClusterQueue", Name: "gpu", Action: protocol.ActionUnchanged}}, Components: tt.statuses}
			Applied{Report: &rep, Sent: "sha256:a"}.record(wc)
			Derive(wc, at)
			c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionWorkerConfigured)
			if c.Message != tt.message {
				t.Errorf("WorkerConfigured says %q, want %q", c.Message, tt.message)
			}
			if st := CommitStatus("flotilla/gpu-a", wc); st.State != tt.state || st.Description != c.Message && tt.state != commitstatus.Success {
				t.Errorf("commit status %s %q, want %s saying %q", st.State, st.Description, tt.state, c.Message)
			}
			if diff := cmp.Diff(tt.components, wc.Status.Components); diff != "" {
				t.Errorf("status.components (-want +got):\n%s", diff)
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
		// seen, when set, is the lastSeen stored before the fact.
		seen time.Time
	}{
		{"a hello connects", []string{"Connected=False/TunnelDown"}, Connected{At: at, AgentVersion: "v0.9.0", KubernetesVersion: "v1.34.1"},
			metav1.ConditionTrue, v1alpha1.ReasonTunnelUp, "agent v0.9.0 on Kubernetes v1.34.1", true, time.Time{}},
		{"a hang-up keeps the worker's state", []string{"Connected=True/TunnelUp"}, Disconnected{At: at, Cause: HungUp},
			metav1.ConditionFalse, v1alpha1.ReasonTunnelDown, "disconnected at 2026-12-04T09:30:00Z; the worker keeps its last applied state", true, time.Time{}},
		{"a stuck agent says how long it took nothing", []string{"Connected=True/TunnelUp"}, Disconnected{At: at, Cause: Stuck, WriteTimeout: 30 * time.Second},
			metav1.ConditionFalse, v1alpha1.ReasonSendTimeout, "took nothing the hub sent for 30s", true, time.Time{}},
		{"a stalled connection is a send timeout", []string{"Connected=True/TunnelUp"}, Disconnected{At: at, Cause: Stalled},
			metav1.ConditionFalse, v1alpha1.ReasonSendTimeout, "stopped taking data", true, time.Time{}},
		{"an agent not back after a hub restart is down", []string{"Connected=True/TunnelUp"}, Disconnected{Cause: NotBack},
			metav1.ConditionFalse, v1alpha1.ReasonTunnelDown, "has not connected since the hub restarted", false, time.Time{}},
		{"not back keeps the reason of an agent that had disconnected", []string{"Connected=False/SendTimeout"}, Disconnected{Cause: NotBack},
			metav1.ConditionFalse, v1alpha1.ReasonSendTimeout, "before", false, time.Time{}},
		{"an agent not seen since the hub looked is down", []string{"Connected=True/TunnelUp"}, Disconnected{Cause: NotBack, Seen: at.Add(-time.Hour)},
			metav1.ConditionFalse, v1alpha1.ReasonTunnelDown, "has not connected since the hub restarted", false, at.Add(-time.Hour)},
		{"not back leaves an agent seen since the hub looked connected", []string{"Connected=True/TunnelUp"}, Disconnected{Cause: NotBack, Seen: at.Add(-time.Hour)},
			metav1.ConditionTrue, v1alpha1.ReasonTunnelUp, "", false, at.Add(time.Second)},
		{"not back leaves an agent seen for the first time since the hub looked connected", []string{"Connected=True/TunnelUp"}, Disconnected{Cause: NotBack},
			metav1.ConditionTrue, v1alpha1.ReasonTunnelUp, "", false, at.Add(time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wc := worker(tt.before...)
			if !tt.seen.IsZero() {
				wc.Status.LastSeen = &metav1.Time{Time: tt.seen}
			}
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
	Derive(wc, at)
	if c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionRegistered); c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonEnrolled || !strings.Contains(c.Message, "2026-12-04T09:30:00Z") {
		t.Fatalf("after a redemption Registered = %+v, want True Enrolled saying when", c)
	}
	CredentialIssued{Fingerprint: "sha256:2222", At: later}.record(wc)
	if e := wc.Status.Enrollment; e.CredentialFingerprint != "sha256:2222" || !e.CredentialIssuedAt.Time.Equal(later) || !e.RedeemedAt.Time.Equal(at) || e.TokenHash != token {
		t.Fatalf("after a rotation the enrollment is %+v, want the new credential and the redemption kept", e)
	}
	RedemptionUndone{}.record(wc)
	Derive(wc, at)
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

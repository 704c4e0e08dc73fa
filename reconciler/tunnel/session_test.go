package tunnel

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
)

func TestAppliedCondition(t *testing.T) {
	ok := protocol.ObjectResult{Kind: "ClusterQueue", Name: "cq", Action: protocol.ActionUnchanged}
	tests := []struct {
		name    string
		desired string
		applied protocol.Applied
		status  metav1.ConditionStatus
		reason  string
	}{
		{"the current state applied whole is configured", "sha256:a", protocol.Applied{Hash: "sha256:a", Results: []protocol.ObjectResult{ok}}, metav1.ConditionTrue, ReasonApplied},
		{"an older state applied whole is not", "sha256:b", protocol.Applied{Hash: "sha256:a", Results: []protocol.ObjectResult{ok}}, metav1.ConditionFalse, ReasonOutdated},
		{"a refused object names the refusal", "sha256:a", protocol.Applied{Hash: "sha256:a", Results: []protocol.ObjectResult{ok, {Kind: "ClusterQueue", Name: "x", Action: protocol.ActionRefused, Message: "refuse to adopt existing object not owned by this WorkerCluster"}}}, metav1.ConditionFalse, ReasonAdoptionRefused},
		{"a refusal wins over a failure", "sha256:a", protocol.Applied{Hash: "sha256:a", Results: []protocol.ObjectResult{{Action: protocol.ActionFailed, Message: "x"}, {Action: protocol.ActionRefused, Message: "refuse to adopt"}}}, metav1.ConditionFalse, ReasonAdoptionRefused},
		{"a failed object fails", "sha256:a", protocol.Applied{Hash: "sha256:a", Results: []protocol.ObjectResult{{Kind: "LocalQueue", Namespace: "team", Name: "q", Action: protocol.ActionFailed, Message: "forbidden"}}}, metav1.ConditionFalse, ReasonApplyFailed},
		{"a state not applied as a whole fails", "sha256:a", protocol.Applied{Hash: "sha256:a", Error: "the API server is unreachable"}, metav1.ConditionFalse, ReasonApplyFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, reason, msg := appliedCondition(tt.desired, &tt.applied)
			if status != tt.status || reason != tt.reason || msg == "" {
				t.Fatalf("= %s %s %q, want %s %s with a message", status, reason, msg, tt.status, tt.reason)
			}
		})
	}
}

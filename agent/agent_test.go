package agent

import (
	"strings"
	"testing"
)

// The agent names its cluster in what it tells the operator to run; it reads the name
// back from its identity, and says NAME where the identity cannot give it.
func TestTheAgentNamesItsClusterFromItsIdentity(t *testing.T) {
	tests := []struct {
		identity, want string
	}{
		{"4-acme-gpu-east", "gpu-east"},
		{"9-acme-labs-gpu-a", "gpu-a"},
		{"1-a-b", "b"},
		// Shortened with a hash, the end is no longer the name.
		{"20-" + strings.Repeat("t", 20) + "-" + strings.Repeat("w", 28) + "-0123456789", "NAME"},
		{"12-acme-gpu", "NAME"},
		{"acme-gpu", "NAME"},
		{"0--gpu", "NAME"},
	}
	for _, tt := range tests {
		if got := workerName(tt.identity); got != tt.want {
			t.Errorf("workerName(%q) = %q, want %q", tt.identity, got, tt.want)
		}
	}
}

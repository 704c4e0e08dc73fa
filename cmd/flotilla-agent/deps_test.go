package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The agent runs in customers' worker clusters: the hub's keys and SOPS, and the forge
// clients, must not even be linked into it.
func TestAgentDoesNotLinkTheHubsSecrets(t *testing.T) {
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{
			"github.com/flotilla-gitops/flotilla/secrets",
			"github.com/getsops/sops/",
			"filippo.io/age",
			"github.com/google/go-github/",
			"code.gitea.io/sdk/",
			"gitlab.com/gitlab-org/api/",
		} {
			if strings.HasPrefix(pkg, banned) {
				t.Errorf("flotilla-agent links %s", pkg)
			}
		}
	}
}

// The hub's rooms: the agent links nothing of the hub, and the fleet model, rendering
// and plans know nothing of the tunnel, so that reading a repository never depends on
// how agents are reached.
func TestImportBoundaries(t *testing.T) {
	const module = "github.com/flotilla-gitops/flotilla/"
	tests := []struct {
		pkg    string
		banned []string
	}{
		// The API types and their labels are the agent's and the hub's common language;
		// nothing else of the hub is.
		{".", []string{module + "reconciler/hub", module + "reconciler/tunnel", module + "reconciler/fleet",
			module + "reconciler/render", module + "reconciler/plan", module + "gitsource"}},
		{module + "reconciler/fleet", []string{module + "reconciler/tunnel", module + "reconciler/hub"}},
		{module + "reconciler/render", []string{module + "reconciler/tunnel", module + "reconciler/hub"}},
		{module + "reconciler/plan", []string{module + "reconciler/tunnel", module + "reconciler/hub"}},
	}
	for _, tt := range tests {
		t.Run(tt.pkg, func(t *testing.T) {
			out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", tt.pkg).Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v", tt.pkg, err)
			}
			for _, dep := range strings.Fields(string(out)) {
				for _, banned := range tt.banned {
					if strings.HasPrefix(dep, banned) {
						t.Errorf("%s depends on %s", tt.pkg, dep)
					}
				}
			}
		})
	}
}

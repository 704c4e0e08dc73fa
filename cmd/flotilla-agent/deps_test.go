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

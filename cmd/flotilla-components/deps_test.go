package main

import (
	"os/exec"
	"strings"
	"testing"
)

// flotilla-components runs in customers' worker clusters beside the agent, with the
// agent's credentials: like the agent, it must not even link the hub, its keys and SOPS,
// or the forge clients.
func TestTheInstallerLinksNothingOfTheHub(t *testing.T) {
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{
			"github.com/flotilla-gitops/flotilla/reconciler/",
			"github.com/flotilla-gitops/flotilla/secrets",
			"github.com/flotilla-gitops/flotilla/gitsource",
			"github.com/getsops/sops/",
			"filippo.io/age",
			"github.com/google/go-github/",
			"code.gitea.io/sdk/",
			"gitlab.com/gitlab-org/api/",
		} {
			if strings.HasPrefix(pkg, banned) {
				t.Errorf("flotilla-components links %s", pkg)
			}
		}
	}
}

package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The agent runs in customers' worker clusters: the hub's keys and SOPS, and the forge
// clients, must not even be linked into it. Nor Helm: linked, it alone would take more
// resident memory than the idle agent's whole budget, so it runs in the short-lived
// installer binary beside the agent.
func TestAgentDoesNotLinkTheHubsSecretsNorHelm(t *testing.T) {
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
			"helm.sh/",
			// Through fluxcd/cli-utils, ssa links kubectl: about 30 MiB resident from
			// package initialisation alone (see agent/apply's package doc).
			"github.com/fluxcd/pkg/ssa",
			"k8s.io/kubectl/",
			"github.com/flotilla-gitops/flotilla/agent/components/installer",
			"github.com/flotilla-gitops/flotilla/agent/components/charts",
		} {
			if strings.HasPrefix(pkg, banned) {
				t.Errorf("flotilla-agent links %s", pkg)
			}
		}
	}
}

// The hub's rooms: the agent links nothing of the hub; the status owner, the fleet
// model, rendering and plans know nothing of the tunnel, so that reading a repository
// or judging a status never depends on how agents are reached; the hub's reconciler
// reaches the tunnel through an interface, and cmd/flotilla-hub joins the two, as it
// joins dispatch to the tunnel's proxy tokens; Git
// knows nothing of the fleet's layout.
func TestImportBoundaries(t *testing.T) {
	const module = "github.com/flotilla-gitops/flotilla/"
	tests := []struct {
		pkg    string
		banned []string
	}{
		// The API types and their labels are the agent's and the hub's common language;
		// nothing else of the hub is.
		{".", []string{module + "reconciler/hub", module + "reconciler/tunnel", module + "reconciler/fleet",
			module + "reconciler/render", module + "reconciler/plan", module + "reconciler/conditions", module + "reconciler/dispatch",
			module + "secrets", module + "gitsource", module + "agent/components/charts"}},
		{module + "reconciler/conditions", []string{module + "reconciler/tunnel", module + "reconciler/hub"}},
		{module + "reconciler/hub", []string{module + "reconciler/tunnel"}},
		{module + "reconciler/tunnel", []string{module + "reconciler/hub"}},
		// Git knows nothing of the hub but the budget of log lines every listener of the
		// hub shares, a leaf that knows nothing either.
		{module + "gitsource", []string{module + "reconciler/"}},
		{module + "reconciler/logbudget", []string{module}},
		{module + "reconciler/fleet", []string{module + "reconciler/tunnel", module + "reconciler/hub"}},
		{module + "reconciler/render", []string{module + "reconciler/tunnel", module + "reconciler/hub"}},
		{module + "reconciler/plan", []string{module + "reconciler/tunnel", module + "reconciler/hub"}},
		// The hub's Kueue objects are laid out from Git and registrations; tokens come
		// through an interface.
		{module + "reconciler/dispatch", []string{module + "reconciler/tunnel", module + "reconciler/hub"}},
		// The components' charts are the short-lived Helm binary's: neither the
		// long-running agent nor the hub, which validates versions by their list, holds
		// them.
		{module + "cmd/flotilla-hub", []string{module + "agent/components/charts"}},
	}
	// What a package may depend on under a prefix banned to it.
	allowed := map[string][]string{module + "gitsource": {module + "reconciler/logbudget"}}
	// One go list for all: each call loads the module graph anew.
	args := []string{"list", "-deps", "-f", "{{.ImportPath}}: {{join .Deps \" \"}}"}
	for _, tt := range tests {
		args = append(args, tt.pkg)
	}
	out, err := exec.CommandContext(t.Context(), "go", args...).Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(string(out), "\n") {
		pkg, list, _ := strings.Cut(line, ": ")
		deps[pkg] = strings.Fields(list)
	}
	deps["."] = deps[module+"cmd/flotilla-agent"]
	for _, tt := range tests {
		t.Run(tt.pkg, func(t *testing.T) {
			if deps[tt.pkg] == nil {
				t.Fatalf("go list did not list %s", tt.pkg)
			}
			for _, dep := range deps[tt.pkg] {
				if slices.Contains(allowed[tt.pkg], dep) {
					continue
				}
				for _, banned := range tt.banned {
					if strings.HasPrefix(dep, banned) {
						t.Errorf("%s depends on %s", tt.pkg, dep)
					}
				}
			}
		})
	}
}

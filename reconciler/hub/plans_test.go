package hub

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

// A plan is bounded by its deadline: past it the pull request gets a failing plan that
// says so, instead of a plan worker held for as long as the head takes.
func TestAPlanPastItsDeadlineFailsSayingSo(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", "../../fleet-template")
	repo.Branch("main", "cordon")
	file := "clusters/" + fleetgen.ExampleCluster + "/cluster.yaml"
	cordoned := strings.Replace(string(fleetgen.Template()[file].Data), "cordoned: false", "cordoned: true", 1)
	repo.Commit("cordon", "cordon the example", map[string][]byte{file: []byte(cordoned)})
	repo.SetRef("refs/pull/1/head", "cordon")
	g, err := gitsource.New(gitsource.Options{URL: repo.URL(), Branch: "main"})
	if err != nil {
		t.Fatal(err)
	}
	prs, err := g.PullRequests(t.Context(), nil)
	if err != nil || len(prs) != 1 {
		t.Fatalf("pull requests %v: %v", prs, err)
	}

	tests := []struct {
		name     string
		deadline time.Duration
		state    commitstatus.State
		summary  string
	}{
		{"a plan within its deadline is planned", time.Minute, commitstatus.Success, "~1"},
		{"a plan past its deadline fails saying so", time.Nanosecond, commitstatus.Failure, "not planned: planning took longer than 1ns"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &Hub{opts: Options{PlanTimeout: tt.deadline}, renderer: render.New()}
			s := &Source{hub: h, opts: SourceOptions{Tenant: "example"}, log: slog.New(slog.DiscardHandler)}
			p, err := s.plan(t.Context(), prs[0])
			if err != nil {
				t.Fatal(err)
			}
			if p.State() != tt.state || !strings.Contains(p.Summary(), tt.summary) {
				t.Errorf("plan %s: %q, want %s saying %q", p.State(), p.Summary(), tt.state, tt.summary)
			}
			if p.Commit != prs[0].Head.String() {
				t.Errorf("the plan is of %s, want the head %s", p.Commit, prs[0].Head)
			}
		})
	}
}

package plan_test

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/plan"
)

func TestStatusSaysWhatThePlanFound(t *testing.T) {
	clusterErr := func(i int) fleet.Error {
		return fleet.Error{File: fmt.Sprintf("clusters/gpu-%d/cluster.yaml", i), Line: 7, Column: 3, Message: "spec.preset is required"}
	}
	tests := []struct {
		name   string
		plan   *plan.Plan
		prefix string
		state  commitstatus.State
		want   string
	}{
		{
			name:  "counts name clusters added, changed, removed and unchanged, and objects",
			plan:  &plan.Plan{BaseFound: true, Clusters: clusters(6), Counts: plan.Counts{Added: 2, Changed: 1, Removed: 0, Unchanged: 3, Objects: 1}},
			state: commitstatus.Success,
			want:  "+2 clusters, ~1, -0, 3 unchanged · 1 object changed",
		},
		{
			name:  "a comparison with the branch's head says so",
			plan:  &plan.Plan{Clusters: clusters(1), Counts: plan.Counts{Changed: 1, Objects: 2}},
			state: commitstatus.Success,
			want:  "+0 clusters, ~1, -0 · 2 objects changed · compared with the branch's head",
		},
		{
			name:  "one error is quoted whole",
			plan:  &plan.Plan{BaseFound: true, Clusters: []*plan.ClusterPlan{{Name: "gpu-1", Errors: fleet.ErrorList{clusterErr(1)}}}},
			state: commitstatus.Failure,
			want:  "clusters/gpu-1/cluster.yaml:7:3: spec.preset is required",
		},
		{
			name: "fleet-wide errors come first, a multi-line message is one line, the whole is cut",
			plan: &plan.Plan{BaseFound: true,
				FleetErrors: fleet.ErrorList{{File: "presets/gpu/kustomization.yaml", Message: "kustomize: accumulating resources:\n\tmissing.yaml"}},
				Clusters:    []*plan.ClusterPlan{{Name: "gpu-1", Errors: fleet.ErrorList{clusterErr(1)}}}},
			state: commitstatus.Failure,
			want:  "2 errors: presets/gpu/kustomization.yaml:1:1: kustomize: accumulating resources: missing.yaml; clusters/gpu-1/cluster.yaml:7:3: spec.preset" + commitstatus.Ellipsis,
		},
		{
			name: "many errors are cut to the forges' limit",
			plan: &plan.Plan{BaseFound: true, Clusters: []*plan.ClusterPlan{
				{Name: "gpu-1", Errors: fleet.ErrorList{clusterErr(1)}}, {Name: "gpu-2", Errors: fleet.ErrorList{clusterErr(2)}}, {Name: "gpu-3", Errors: fleet.ErrorList{clusterErr(3)}}}},
			prefix: "acme",
			state:  commitstatus.Failure,
			want:   "3 errors: clusters/gpu-1/cluster.yaml:7:3: spec.preset is required; clusters/gpu-2/cluster.yaml:7:3: spec.preset is required; clusters/gpu-" + commitstatus.Ellipsis,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.plan.Status(tt.prefix, "https://hub.example.com/plans/x")
			wantContext := "flotilla/plan"
			if tt.prefix != "" {
				wantContext = tt.prefix + "/plan"
			}
			if st.Context != wantContext || st.State != tt.state || st.TargetURL != "https://hub.example.com/plans/x" {
				t.Errorf("status %+v, want %s on %s", st, tt.state, wantContext)
			}
			if st.Description != tt.want {
				t.Errorf("description\n%q\nwant\n%q", st.Description, tt.want)
			}
			if n := utf8.RuneCountInString(st.Description); n > plan.MaxDescription || strings.Contains(st.Description, "\n") {
				t.Errorf("description of %d characters: not one line within %d", n, plan.MaxDescription)
			}
		})
	}
}

func clusters(n int) []*plan.ClusterPlan {
	out := make([]*plan.ClusterPlan, n)
	for i := range out {
		out[i] = &plan.ClusterPlan{Name: fmt.Sprintf("gpu-%d", i)}
	}
	return out
}

func TestRequireTenantFailsAPlanForAnotherTenant(t *testing.T) {
	tests := []struct {
		name, headTenant string
		state            commitstatus.State
		summary          string
	}{
		{name: "the repository's own tenant passes", headTenant: "acme", state: commitstatus.Success, summary: "no cluster changes"},
		{name: "another tenant fails as the hub would on merge", headTenant: "globex", state: commitstatus.Failure,
			summary: `fleet.yaml:1:1: names tenant "globex"; this repository may only hold tenant "acme"`},
		{name: "an unreadable fleet.yaml is left to its own errors", headTenant: "", state: commitstatus.Success, summary: "no cluster changes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &plan.Plan{Tenant: tt.headTenant, BaseFound: true}
			p.RequireTenant("acme")
			if p.State() != tt.state || p.Summary() != tt.summary {
				t.Fatalf("state %s, summary %q; want %s, %q", p.State(), p.Summary(), tt.state, tt.summary)
			}
		})
	}
}

package fleet_test

import (
	"strings"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
)

// A credential lifetime that cannot be read, or is outside its bounds, is placed at its
// own line in fleet.yaml, and in cluster.yaml it fails that cluster alone.
func TestLoadRejectsCredentialLifetimesOutsideTheirBounds(t *testing.T) {
	inFleet := func(v string) string {
		return edited(t, fleet.FleetFile, "  decommission: Prune\n", "  decommission: Prune\n  credentialLifetime: "+v+"\n")
	}
	runFleetRejects(t, []fleetCase{
		{name: "days are no Go duration", data: inFleet("90d"), line: 35, col: 3,
			msg: `spec.credentialLifetime "90d" is not a duration: write it in hours, e.g. 2160h for 90 days`},
		{name: "a number", data: inFleet("90"), line: 35, col: 3,
			msg: "spec.credentialLifetime must be a duration such as 2160h (90 days)"},
		{name: "shorter than an hour", data: inFleet("30m"), line: 35, col: 3,
			msg: "spec.credentialLifetime 30m is shorter than 1h: the hub needs room to rotate a credential before it runs out"},
		{name: "negative", data: inFleet("-2160h"), line: 35, col: 3,
			msg: "spec.credentialLifetime -2160h is shorter than 1h"},
		{name: "longer than a year", data: inFleet("10000h"), line: 35, col: 3,
			msg: "spec.credentialLifetime 10000h is longer than 8784h (366 days)"},
	})

	inCluster := func(v string) map[string]string {
		return map[string]string{clusterFile: edited(t, clusterFile, "  cordoned: false\n", "  cordoned: false\n  credentialLifetime: "+v+"\n")}
	}
	runRejects(t, []rejectCase{
		{name: "a cluster's lifetime in days", changes: inCluster("30d"), file: clusterFile, line: 18, col: 3,
			msg: `spec.credentialLifetime "30d" is not a duration: write it in hours, e.g. 2160h for 90 days`},
		{name: "a cluster's lifetime of zero", changes: inCluster("0s"), file: clusterFile, line: 18, col: 3,
			msg: "spec.credentialLifetime 0s is shorter than 1h"},
		{name: "a cluster's lifetime as a mapping", changes: inCluster("{hours: 3}"), file: clusterFile, line: 18, col: 3,
			msg: "spec.credentialLifetime must be a duration such as 2160h (90 days)"},
	})
}

// The lifetime the hub carries to a WorkerCluster: the cluster's own, else the fleet's,
// else none, which the hub reads as the 90-day default.
func TestCredentialLifetimeIsTheClustersElseTheFleets(t *testing.T) {
	fleetSays := edited(t, fleet.FleetFile, "  decommission: Prune\n", "  decommission: Prune\n  credentialLifetime: 720h\n")
	clusterSays := edited(t, clusterFile, "  cordoned: false\n", "  cordoned: false\n  credentialLifetime: 48h\n")
	tests := []struct {
		name    string
		changes map[string]string
		want    time.Duration // 0: none declared
	}{
		{"neither says", nil, 0},
		{"fleet.yaml says", map[string]string{fleet.FleetFile: fleetSays}, 720 * time.Hour},
		{"cluster.yaml says", map[string]string{clusterFile: clusterSays}, 48 * time.Hour},
		{"cluster.yaml wins over fleet.yaml", map[string]string{fleet.FleetFile: fleetSays, clusterFile: clusterSays}, 48 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadWith(t, tt.changes)
			wantNoErrors(t, f)
			got := fleet.CredentialLifetime(f, f.Clusters[example])
			switch {
			case tt.want == 0 && got != nil:
				t.Fatalf("lifetime %s, want none declared", got.Duration)
			case tt.want != 0 && (got == nil || got.Duration != tt.want):
				t.Fatalf("lifetime %v, want %s", got, tt.want)
			}
		})
	}
}

func TestTemplateCredentialLifetimeLoadsOnceUncommented(t *testing.T) {
	const commented = "  # credentialLifetime: 2160h"
	s := template(t, fleet.FleetFile)
	if !strings.Contains(s, commented) {
		t.Fatalf("the template's fleet.yaml has no %q", commented)
	}
	f := loadWith(t, map[string]string{fleet.FleetFile: strings.Replace(s, commented, "  credentialLifetime: 2160h", 1)})
	wantNoErrors(t, f)
	if l := f.Spec.Spec.CredentialLifetime; l == nil || l.Duration != 90*24*time.Hour {
		t.Fatalf("credentialLifetime = %v, want 90 days", l)
	}
}

package fleet_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/proxy"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
)

func TestLoadRejectsAdoptionByAClusterThatDeclinesManagedComponents(t *testing.T) {
	runRejects(t, []rejectCase{{
		name:    "adopt with managed false",
		changes: map[string]string{clusterFile: edited(t, clusterFile, "  cordoned: false\n", "  cordoned: false\n  components:\n    managed: false\n    adopt: true\n")},
		file:    clusterFile, line: 20, col: 5,
		msg: "spec.components.adopt hands Kueue and JobSet over to flotilla, which spec.components.managed: false declines",
	}})
}

// What the agent is asked to make of Kueue and JobSet: the fleet's versions, images and
// switch, the cluster's say last, and always the integrations the hub's MultiKueue
// watches.
func TestComponentsAreTheFleetsWithTheClustersSay(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	fleetWith := func(old, new string) string { return edited(t, fleet.FleetFile, old, new) }
	clusterWith := func(components string) string {
		return edited(t, clusterFile, "  cordoned: false\n", "  cordoned: false\n  components:\n"+components)
	}
	base := components.Spec{
		Managed:    true,
		Kueue:      components.Release{Version: "v0.17.0"},
		JobSet:     components.Release{Version: "v0.11.1"},
		Frameworks: proxy.DefaultFrameworks(),
	}
	tests := []struct {
		name    string
		changes map[string]string
		want    func(*components.Spec)
		image   string // Kueue's image, when the case is about it
	}{
		{name: "the template's fleet manages both", want: func(*components.Spec) {},
			image: "registry.k8s.io/kueue/kueue:v0.17.0"},
		{name: "a mirror and a digest keep the release's repository and tag",
			changes: map[string]string{fleet.FleetFile: fleetWith("    managed: true\n", "    managed: true\n    registry: mirror.example.com:5000/k8s/\n    kueueDigest: "+digest+"\n")},
			want: func(s *components.Spec) {
				s.Registry, s.Kueue.Digest = "mirror.example.com:5000/k8s/", digest
			},
			image: "mirror.example.com:5000/k8s/kueue/kueue:v0.17.0@" + digest},
		{name: "a fleet that runs its own Kueue", changes: map[string]string{fleet.FleetFile: fleetWith("managed: true", "managed: false")},
			want: func(s *components.Spec) { s.Managed = false }},
		{name: "a cluster that runs its own Kueue in a managed fleet", changes: map[string]string{clusterFile: clusterWith("    managed: false\n")},
			want: func(s *components.Spec) { s.Managed = false }},
		{name: "a cluster managed in a fleet that is not", changes: map[string]string{
			fleet.FleetFile: fleetWith("managed: true", "managed: false"), clusterFile: clusterWith("    managed: true\n")},
			want: func(*components.Spec) {}},
		{name: "a cluster that hands its Kueue over", changes: map[string]string{clusterFile: clusterWith("    adopt: true\n")},
			want: func(s *components.Spec) { s.Adopt = true }},
		{name: "a fleet.yaml written before flotilla installed Kueue leaves it to the workers' teams",
			changes: map[string]string{fleet.FleetFile: fleetWith("  components:\n    managed: true\n", "")},
			want:    func(s *components.Spec) { s.Managed = false }},
		{name: "a fleet that names no JobSet version gets the one this release installs",
			changes: map[string]string{fleet.FleetFile: fleetWith("  jobSetVersion: v0.11.1\n", "")},
			want:    func(*components.Spec) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadWith(t, tt.changes)
			if errs := f.AllErrors(); len(errs) > 0 {
				t.Fatalf("the fleet does not load: %v", errs)
			}
			want := base
			want.Frameworks = append([]string(nil), base.Frameworks...)
			tt.want(&want)
			got := fleet.Components(f, f.Clusters[example])
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("components (-want +got):\n%s", diff)
			}
			if tt.image != "" && got.Image(components.Kueue) != tt.image {
				t.Errorf("Kueue's image = %s, want %s", got.Image(components.Kueue), tt.image)
			}
		})
	}
}

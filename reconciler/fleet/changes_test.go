package fleet_test

import (
	"io/fs"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// What a commit asks the hub to read again follows from the paths it changed: a
// fleet-wide input means every cluster, with the file to look at in the reason; a
// cluster's directory means that cluster alone; anything the hub does not read means
// nothing.
func TestAChangeRereadsTheClustersItTouches(t *testing.T) {
	// firstChange stands for the source's walk below a changed path.
	firstChange := func(p string) string {
		return map[string]string{"presets/a100": "presets/a100/kustomization.yaml"}[p]
	}
	for _, tc := range []struct {
		name     string
		change   fleet.Change
		all      bool
		reason   string
		clusters []string
	}{
		{name: "fleet.yaml", change: fleet.Change{Paths: []string{"fleet.yaml"}}, all: true, reason: "fleet.yaml changed"},
		{name: ".sops.yaml", change: fleet.Change{Paths: []string{".sops.yaml"}}, all: true, reason: ".sops.yaml changed"},
		{name: "a preset, named by its first changed file", change: fleet.Change{Paths: []string{"presets/a100"}, FirstChange: firstChange},
			all: true, reason: "presets/a100/kustomization.yaml changed"},
		{name: "a preset without a source to look deeper", change: fleet.Change{Paths: []string{"presets/a100"}}, all: true, reason: "presets/a100 changed"},
		{name: "a preset among cluster changes", change: fleet.Change{Paths: []string{"clusters/gpu-a", "presets/a100"}, FirstChange: firstChange},
			all: true, reason: "presets/a100/kustomization.yaml changed"},
		{name: "clusters/ replaced whole", change: fleet.Change{Paths: []string{"clusters"}}, all: true, reason: "clusters changed"},
		{name: "two clusters", change: fleet.Change{Paths: []string{"clusters/gpu-a", "clusters/gpu-b"}}, clusters: []string{"gpu-a", "gpu-b"}},
		{name: "a deeper path counts for its cluster, once", change: fleet.Change{Paths: []string{"clusters/gpu-b/cluster.yaml", "clusters/gpu-a", "clusters/gpu-b"}},
			clusters: []string{"gpu-a", "gpu-b"}},
		{name: "a file directly under clusters/ is read again under its name", change: fleet.Change{Paths: []string{"clusters/README.md"}},
			clusters: []string{"README.md"}},
		{name: "an unrelated top-level file changes nothing", change: fleet.Change{Paths: []string{"README.md", ".github/workflows"}}},
		{name: "an unrelated file beside a cluster", change: fleet.Change{Paths: []string{"README.md", "clusters/gpu-a"}}, clusters: []string{"gpu-a"}},
		{name: "more paths than the source keeps", change: fleet.Change{All: true, Reason: "more than 10000 paths changed"},
			all: true, reason: "more than 10000 paths changed"},
		{name: "nothing", change: fleet.Change{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.change.Affected()
			if got.All != tc.all || got.Reason != tc.reason || !slices.Equal(got.Clusters, tc.clusters) {
				t.Fatalf("affected %+v, want all=%v reason=%q clusters=%q", got, tc.all, tc.reason, tc.clusters)
			}
		})
	}
}

// A file the loader reads through a symbolic link touches whoever links to it, wherever
// it lies: a cluster linking to a shared file, or to another cluster's, is read again
// when that file changes, even when it is missing yet; a file a preset links to touches
// every cluster.
func TestAChangeBehindASymbolicLinkRereadsWhoReadsIt(t *testing.T) {
	const example, other = fleetgen.ExampleCluster, "gpu-b"
	fsys := fleetgen.Template()
	link := func(p, target string) { fsys[p] = &fstest.MapFile{Data: []byte(target), Mode: fs.ModeSymlink} }
	enrollment := fsys["clusters/"+example+"/enrollment.sops.yaml"].Data
	fleetgen.AddCluster(fsys, other, enrollment, 1, fleetgen.Options{})
	fsys["shared/"+example+".yaml"] = fsys["clusters/"+example+"/cluster.yaml"]
	link("clusters/"+example+"/cluster.yaml", "../../shared/"+example+".yaml")
	link("clusters/"+other+"/notes.txt", "../"+example+"/enrollment.sops.yaml")
	link("clusters/"+example+"/todo.txt", "../../not/there/yet.txt")
	fsys["lib/notes.txt"] = &fstest.MapFile{Data: []byte("shared by the presets\n"), Mode: 0o644}
	link("presets/gpu/notes.txt", "../../lib/notes.txt")
	f := fleet.Load(fsys)

	for _, tc := range []struct {
		name     string
		paths    []string
		all      bool
		clusters []string
	}{
		{name: "a shared file a cluster links to", paths: []string{"shared/" + example + ".yaml"}, clusters: []string{example}},
		{name: "a directory above a file a cluster links to", paths: []string{"shared"}, clusters: []string{example}},
		{name: "another cluster's file a cluster links to", paths: []string{"clusters/" + example}, clusters: []string{example, other}},
		{name: "a file a link leads to that is not there yet", paths: []string{"not/there"}, clusters: []string{example}},
		{name: "a file a preset links to", paths: []string{"lib/notes.txt"}, all: true},
		{name: "a file no one links to", paths: []string{"shared/other.yaml", "README.md"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fleet.Change{Paths: tc.paths}.AffectedIn(nil, f)
			if got.All != tc.all || !slices.Equal(got.Clusters, tc.clusters) {
				t.Fatalf("affected %+v, want all=%v clusters=%q", got, tc.all, tc.clusters)
			}
			if tc.all && !strings.Contains(got.Reason, "lib/notes.txt") {
				t.Errorf("the reason %q does not name the file that changed", got.Reason)
			}
		})
	}
}

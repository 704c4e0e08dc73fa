package fleet_test

import (
	"reflect"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// wantSameAsFullLoad fails unless f, kept up to date with LoadCluster, is what a full
// Load of fsys gives.
func wantSameAsFullLoad(t *testing.T, f *fleet.Fleet, fsys fstest.MapFS) {
	t.Helper()
	full := fleet.Load(fsys)
	if got, want := f.ClusterNames(), full.ClusterNames(); !reflect.DeepEqual(got, want) {
		t.Fatalf("clusters are %v, a full load has %v", got, want)
	}
	for _, name := range full.ClusterNames() {
		if !reflect.DeepEqual(f.Clusters[name], full.Clusters[name]) {
			t.Fatalf("cluster %s differs from a full load:\nerrors:\n%s\nfull load's errors:\n%s",
				name, describe(f.Clusters[name].Errors), describe(full.Clusters[name].Errors))
		}
	}
	if got, want := f.AllErrors(), full.AllErrors(); !reflect.DeepEqual(got, want) {
		t.Fatalf("errors differ from a full load:\n%s\nfull load:\n%s", describe(got), describe(want))
	}
}

func TestLoadClusterMatchesAFullLoad(t *testing.T) {
	fsys := baseFleet()
	f := fleet.Load(fsys)
	wantNoErrors(t, f)
	originalDigest := f.Clusters[example].Digest
	gpu := fleetgen.ClusterName

	steps := []struct {
		name    string
		changes map[string]string
		reload  string
		// remove deletes a directory before the reload.
		remove string
		// gone is whether the directory no longer exists.
		gone  bool
		check func(t *testing.T, c *fleet.Cluster)
	}{
		{
			name:    "break a cluster",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "residency: us", "residency: apac")},
			reload:  example,
			check: func(t *testing.T, c *fleet.Cluster) {
				wantOnlyError(t, c.Errors, clusterFile, 10, 3, `residency "apac" is not allowed`)
				if c.Digest == originalDigest {
					t.Fatal("digest did not change with cluster.yaml")
				}
			},
		},
		{
			name:    "fix it again",
			changes: map[string]string{clusterFile: template(t, clusterFile)},
			reload:  example,
			check: func(t *testing.T, c *fleet.Cluster) {
				if !c.Valid() || c.Digest != originalDigest {
					t.Fatalf("fixed cluster: valid %t, digest changed %t", c.Valid(), c.Digest != originalDigest)
				}
			},
		},
		{
			name:    "add a cluster",
			changes: newCluster(t, "new-cluster", "new-cluster"),
			reload:  "new-cluster",
			check: func(t *testing.T, c *fleet.Cluster) {
				if !c.Valid() || c.Name != "new-cluster" {
					t.Fatalf("new cluster: %+v", c.Errors)
				}
			},
		},
		{
			name:    "claim the name of a directory",
			changes: claim(t, 0, gpu(1)),
			reload:  gpu(0),
			check: func(t *testing.T, c *fleet.Cluster) {
				wantError(t, c.Errors, "clusters/gpu-00000/cluster.yaml", 4, 3, `worker name "gpu-00001" is already used by clusters/gpu-00001`)
			},
		},
		{
			name:    "claim a free name",
			changes: claim(t, 0, "shared"),
			reload:  gpu(0),
		},
		{
			name:    "claim the same free name from a second cluster",
			changes: claim(t, 2, "shared"),
			reload:  gpu(2),
			check: func(t *testing.T, c *fleet.Cluster) {
				wantError(t, c.Errors, "clusters/gpu-00002/cluster.yaml", 4, 3, `worker name "shared" is already used by clusters/gpu-00000`)
			},
		},
		{
			// gpu-00002 is not read again, but its clash with gpu-00000 is gone.
			name:   "remove the first claimant",
			remove: "clusters/" + gpu(0),
			reload: gpu(0),
			gone:   true,
		},
		{
			name:    "bring the first claimant back",
			changes: claim(t, 0, "shared"),
			reload:  gpu(0),
		},
		{
			name:    "the first claimant takes its own name",
			changes: map[string]string{"clusters/gpu-00000/cluster.yaml": sibling(t, 0, "cluster.yaml")},
			reload:  gpu(0),
		},
		{
			name:    "give a cluster an overlay",
			changes: overlay("resources:\n  - priority.yaml\n"),
			reload:  example,
			check: func(t *testing.T, c *fleet.Cluster) {
				if c.Overlay() == nil || !c.Valid() || c.Digest == originalDigest {
					t.Fatal("overlay not loaded")
				}
			},
		},
		{
			name:   "remove a cluster",
			remove: exampleDir,
			reload: example,
			gone:   true,
		},
		{
			name:   "reload a cluster that never existed",
			reload: "no-such-cluster",
			gone:   true,
		},
		{
			name:    "a file where a cluster directory was",
			changes: map[string]string{"clusters/" + gpu(2): "not a directory\n"},
			reload:  gpu(2),
			gone:    true,
		},
	}
	for _, step := range steps {
		// Each step builds on the one before, so a failure stops the rest.
		ok := t.Run(step.name, func(t *testing.T) {
			apply(fsys, step.changes)
			if step.remove != "" {
				apply(fsys, removeDir(fsys, step.remove))
			}
			c := f.LoadCluster(fsys, step.reload)
			if step.gone {
				if c != nil {
					t.Fatalf("LoadCluster returned %s for a directory that is gone", c.Name)
				}
				if _, ok := f.Clusters[step.reload]; ok {
					t.Fatalf("cluster %s is still there", step.reload)
				}
			} else {
				if c == nil || f.Clusters[step.reload] != c {
					t.Fatalf("LoadCluster returned %v, not the cluster it keeps", c)
				}
				if step.check != nil {
					step.check(t, c)
				}
			}
			wantSameAsFullLoad(t, f, fsys)
		})
		if !ok {
			break
		}
	}
}

// removeDir returns the changes that delete every file below dir.
func removeDir(fsys fstest.MapFS, dir string) map[string]string {
	changes := map[string]string{}
	for p := range fsys {
		if strings.HasPrefix(p, dir+"/") {
			changes[p] = removed
		}
	}
	return changes
}

func TestDigestChangesWithEveryFileOfTheCluster(t *testing.T) {
	base := loadWith(t, nil).Clusters[example].Digest
	seen := map[string]string{base: "unchanged"}
	for name, changes := range map[string]map[string]string{
		"cluster.yaml":          {clusterFile: template(t, clusterFile) + "# comment\n"},
		"enrollment":            {enrollmentFile: template(t, enrollmentFile) + "# comment\n"},
		"an extra file":         {exampleDir + "/README.md": "notes\n"},
		"an empty extra file":   {exampleDir + "/empty.yaml": ""},
		"another empty file":    {exampleDir + "/other.yaml": ""},
		"a file in a subfolder": {exampleDir + "/docs/README.md": "notes\n"},
	} {
		d := loadWith(t, changes).Clusters[example].Digest
		if other, dup := seen[d]; dup {
			t.Errorf("changing %s gives the digest of %s", name, other)
		}
		seen[d] = name
	}
	if again := loadWith(t, nil).Clusters[example].Digest; again != base {
		t.Error("digest of the same files changed")
	}
}

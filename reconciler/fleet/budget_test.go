package fleet_test

import (
	"bytes"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"unsafe"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gittree"
)

// readsFS is what the loader needs of a commit's tree.
type readsFS interface {
	fleet.SharedFS
	fs.ReadDirFS
	fs.ReadLinkFS
	fs.StatFS
}

// countingFS counts the bytes of file content the loader takes, path by path: content
// shared between paths counts once for every path that took it.
type countingFS struct {
	fsys  readsFS
	bytes int64
}

func (c *countingFS) Open(name string) (fs.File, error) {
	f, err := c.fsys.Open(name)
	if err != nil {
		return nil, err
	}
	return countingFile{File: f, n: &c.bytes}, nil
}

func (c *countingFS) ReadShared(name string) ([]byte, error) {
	data, err := c.fsys.ReadShared(name)
	c.bytes += int64(len(data))
	return data, err
}

func (c *countingFS) ReadDir(name string) ([]fs.DirEntry, error) { return c.fsys.ReadDir(name) }
func (c *countingFS) ReadLink(name string) (string, error)       { return c.fsys.ReadLink(name) }
func (c *countingFS) Lstat(name string) (fs.FileInfo, error)     { return c.fsys.Lstat(name) }
func (c *countingFS) Stat(name string) (fs.FileInfo, error)      { return c.fsys.Stat(name) }

type countingFile struct {
	fs.File
	n *int64
}

func (f countingFile) Read(p []byte) (int, error) {
	n, err := f.File.Read(p)
	*f.n += int64(n)
	return n, err
}

// cost is what loading fsys charges its budget: every entry listed below presets/ and
// clusters/ and fleet.yaml, the bytes of fleet.yaml and of every file inside a preset or
// cluster directory, and the most elements a path has.
func cost(fsys fstest.MapFS) (files int, size int64, depth int) {
	entries := map[string]bool{fleet.FleetFile: true}
	for p, f := range fsys {
		parts := strings.Split(p, "/")
		if parts[0] != fleet.PresetsDir && parts[0] != fleet.ClustersDir {
			if p == fleet.FleetFile {
				size += int64(len(f.Data))
			}
			continue
		}
		for i := 2; i <= len(parts); i++ {
			entries[strings.Join(parts[:i], "/")] = true
		}
		if len(parts) >= 3 {
			size += int64(len(f.Data))
		}
		depth = max(depth, len(parts))
	}
	return len(entries), size, depth
}

func TestLoadRefusesAHeadOverItsBudgetAsAWhole(t *testing.T) {
	fsys := baseFleet()
	files, size, depth := cost(fsys)
	exact := fleet.Budget{MaxBytes: size, MaxFiles: files, MaxDepth: depth}
	cases := []struct {
		name   string
		budget fleet.Budget
		msg    string
	}{
		{name: "one byte short", budget: fleet.Budget{MaxBytes: size - 1, MaxFiles: files, MaxDepth: depth},
			msg: fmt.Sprintf("the head's files add up to more than %d bytes", size-1)},
		{name: "one file short", budget: fleet.Budget{MaxBytes: size, MaxFiles: files - 1, MaxDepth: depth},
			msg: fmt.Sprintf("the head holds more than %d files, directories and symbolic links followed, the most the hub reads of one head (budget files)", files-1)},
		{name: "one level short", budget: fleet.Budget{MaxBytes: size, MaxFiles: files, MaxDepth: depth - 1},
			msg: fmt.Sprintf("the head nests paths more than %d deep, the most the hub reads (budget depth)", depth-1)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for name, fsys := range map[string]fs.FS{"checkout": diskFS(t, fsys), "commit": commitFS(t, nil)} {
				f := fleet.LoadWith(fsys, fleet.LoadOptions{Budget: tc.budget})
				if len(f.Errors) != 1 || !strings.Contains(f.Errors[0].Message, tc.msg) || f.Errors[0].File == "" {
					t.Fatalf("%s: want only a budget error %q naming a file; got:\n%s", name, tc.msg, describe(f.Errors))
				}
				if !f.OverBudget() || f.Valid() {
					t.Fatalf("%s: OverBudget %t, Valid %t", name, f.OverBudget(), f.Valid())
				}
				// fleet.yaml is read, so that the head is reported where its fleet says.
				if f.Spec == nil || f.Spec.Spec.Tenant != "example" {
					t.Fatalf("%s: fleet.yaml was not read", name)
				}
				// Every cluster directory stays, unread: none of them looks removed.
				if f.Incomplete() || len(f.Clusters) != siblings+1 || len(f.Presets) != 0 {
					t.Fatalf("%s: incomplete %t, clusters %v, presets %v", name, f.Incomplete(), f.ClusterNames(), f.PresetNames())
				}
				for _, c := range f.Clusters {
					wantOnlyError(t, c.Errors, c.Dir, 0, 0, "not read: the head broke the hub's budget at "+f.Errors[0].File)
					if len(c.Files) != 0 || c.Valid() {
						t.Fatalf("%s: cluster %s holds %d files, valid %t", name, c.Name, len(c.Files), c.Valid())
					}
				}
			}
		})
	}
	t.Run("exactly the budget", func(t *testing.T) {
		for name, fsys := range map[string]fs.FS{"checkout": diskFS(t, fsys), "commit": commitFS(t, nil)} {
			f := fleet.LoadWith(fsys, fleet.LoadOptions{Budget: exact})
			wantNoErrors(t, f)
			if f.OverBudget() {
				t.Fatalf("%s: over budget", name)
			}
		}
	})
}

func TestLoadRefusesManyPathsToOneBlobBeforeReadingThem(t *testing.T) {
	// One blob of the largest size a file may have, named from 20,000 paths: under 1 MB
	// of pull request, 20 GB to read path by path.
	big := append([]byte("# "), bytes.Repeat([]byte("x"), fleet.MaxFileSize-3)...)
	big = append(big, '\n')
	const paths = 20_000
	cases := []struct {
		name string
		at   func(i int) string
		// cluster is set when the paths are one cluster's: that cluster fails alone,
		// its own budget broken, and the rest of the fleet loads.
		cluster bool
	}{
		{name: "in one cluster", at: func(i int) string { return fmt.Sprintf("%s/copies/c%05d.yaml", exampleDir, i) }, cluster: true},
		{name: "as many clusters", at: func(i int) string { return fmt.Sprintf("clusters/copy-%05d/cluster.yaml", i) }},
		{name: "in a preset", at: func(i int) string { return fmt.Sprintf("presets/gpu/copies/c%05d.yaml", i) }},
		{name: "in many preset folders", at: func(i int) string { return fmt.Sprintf("presets/p%05d/kustomization.yaml", i) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			changes := gittree.Files{}
			for i := range paths {
				changes[tc.at(i)] = gittree.File{Data: big}
			}
			fsys := &countingFS{fsys: commitFS(t, changes).(gitsource.TreeFS)}
			var f *fleet.Fleet
			allocated := allocatedBy(func() { f = fleet.Load(fsys) })
			t.Logf("allocated %.1f MiB, took %d MiB path by path", float64(allocated)/(1<<20), fsys.bytes>>20)
			limit := int64(fleet.DefaultMaxBytes)
			if tc.cluster {
				limit = fleet.DefaultMaxClusterBytes
				if f.OverBudget() || !f.Valid() || !strings.Contains(clusterErrors(t, f, example).Error(), "(budget clusterFiles)") {
					t.Fatalf("want the cluster's own budget broken and the fleet valid; errors:\n%s", describe(f.AllErrors()))
				}
				wantOthersValid(t, f, example)
			} else if !f.OverBudget() || !strings.Contains(f.Errors.Error(), "(budget bytes)") {
				t.Fatalf("want the bytes budget broken; errors:\n%s", describe(f.Errors))
			}
			// Every path counts, but nothing past the budget was taken.
			if fsys.bytes > limit {
				t.Fatalf("the loader took %d bytes, more than the budget's %d", fsys.bytes, limit)
			}
			// One copy of the blob, the listing and the bookkeeping; not 20 GB.
			if limit := uint64(48 << 20); allocated > limit {
				t.Fatalf("loading allocated %d MiB, more than %d MiB", allocated>>20, limit>>20)
			}
		})
	}
}

// realEnrollment is the template's enrollment file grown to the size of one encrypted to
// a few age recipients.
func realEnrollment(t testing.TB) []byte {
	t.Helper()
	data := []byte(template(t, enrollmentFile))
	for len(data) < 2<<10 {
		data = append(data, "# another recipient's stanza would be here\n"...)
	}
	return data
}

func TestLoadReadsARealShapedFleetOf10000ClustersWithinTheDefaultBudget(t *testing.T) {
	// Validating 10,000 clusters takes its seconds: let the rest of the package run
	// meanwhile.
	t.Parallel()
	const n = 10_000
	fsys := fleetgen.Template()
	for p := range fsys {
		if strings.HasPrefix(p, fleet.ClustersDir+"/") {
			delete(fsys, p)
		}
	}
	enrollment := realEnrollment(t)
	for i := range n {
		// Every cluster with an overlay and its object: four files, the most the
		// layout has.
		fleetgen.AddCluster(fsys, fleetgen.ClusterName(i), enrollment, i, fleetgen.Options{OverlayEvery: 1})
	}
	files, size, _ := cost(fsys)
	t.Logf("%d clusters: %d entries, %.1f MiB", n, files, float64(size)/(1<<20))
	f := fleet.Load(gitsource.NewTreeFS(gittree.New(t, gittree.FromMapFS(fsys))))
	if f.OverBudget() {
		t.Fatalf("a real fleet is over the default budget:\n%s", describe(f.Errors))
	}
	wantNoErrors(t, f)
	if len(f.Clusters) != n {
		t.Fatalf("%d clusters loaded, want %d", len(f.Clusters), n)
	}
}

func TestLoadHoldsTheContentOfIdenticalFilesOnce(t *testing.T) {
	f := fleet.Load(commitFS(t, nil))
	wantNoErrors(t, f)
	var first *byte
	for _, name := range f.ClusterNames() {
		e := f.Clusters[name].Enrollment()
		if len(e) == 0 {
			t.Fatalf("cluster %s has no enrollment file", name)
		}
		if first == nil {
			first = unsafe.SliceData(e)
		} else if unsafe.SliceData(e) != first {
			t.Fatalf("cluster %s holds its own copy of an enrollment file every cluster shares", name)
		}
	}
}

func TestLoadClusterKeepsTheHeadWithinItsBudget(t *testing.T) {
	fsys := baseFleet()
	_, size, _ := cost(fsys)
	budget := fleet.Budget{MaxBytes: size + 100}
	f := fleet.LoadWith(fsys, fleet.LoadOptions{Budget: budget})
	wantNoErrors(t, f)
	sibling := fleetgen.ClusterName(0)
	extra := path.Join(fleet.ClustersDir, sibling, "notes.txt")

	// A file that fits in what the rest of the head leaves.
	apply(fsys, map[string]string{extra: strings.Repeat("x", 100)})
	if c := f.LoadCluster(fsys, sibling); c == nil || !c.Valid() || f.OverBudget() {
		t.Fatalf("a cluster within the budget: over budget %t, errors:\n%s", f.OverBudget(), describe(f.AllErrors()))
	}

	// One byte more breaks the head's budget: the fleet fails as a whole, the cluster
	// is not read, the others keep what they were.
	apply(fsys, map[string]string{extra: strings.Repeat("x", 101)})
	c := f.LoadCluster(fsys, sibling)
	if c == nil || c.Valid() || len(c.Files) != 0 {
		t.Fatalf("the cluster over the budget was read: %+v", c)
	}
	wantOnlyError(t, f.Errors, extra, 0, 0, fmt.Sprintf("the head's files add up to more than %d bytes", size+100))
	if !f.OverBudget() || f.Valid() || !f.Clusters[example].Valid() {
		t.Fatalf("over budget %t, fleet valid %t, example valid %t", f.OverBudget(), f.Valid(), f.Clusters[example].Valid())
	}

	// Shrinking another cluster makes room for the one over the budget once it is read
	// again; until then the head stays over budget.
	apply(fsys, map[string]string{clusterFile: edited(t, clusterFile, "displayName: Example GKE cluster in Iowa", "displayName: x")})
	if c := f.LoadCluster(fsys, example); c == nil || !c.Valid() || !f.OverBudget() {
		t.Fatalf("another cluster read while the head is over budget: over budget %t, errors:\n%s", f.OverBudget(), describe(f.AllErrors()))
	}
	c = f.LoadCluster(fsys, sibling)
	if c == nil || !c.Valid() || f.OverBudget() || len(f.Errors) != 0 {
		t.Fatalf("the head back within its budget: over budget %t, errors:\n%s", f.OverBudget(), describe(f.AllErrors()))
	}
	f.LoadCluster(fsys, example)
	wantSameAsFullLoad(t, f, fsys)
	wantNoErrors(t, fleet.LoadWith(fsys, fleet.LoadOptions{Budget: budget}))

	t.Run("a head loaded over budget", func(t *testing.T) {
		f := fleet.LoadWith(fsys, fleet.LoadOptions{Budget: fleet.Budget{MaxBytes: 10}})
		if c := f.LoadCluster(fsys, sibling); c == nil || c.Valid() || len(c.Files) != 0 || !f.OverBudget() {
			t.Fatalf("a cluster of a head over budget was read: %+v", c)
		}
	})
}

// A cluster directory over its own budget is one broken cluster, not a broken fleet: a
// vendored chart or a build's output merged into one directory must not stop every
// other cluster's changes. Loaded whole or on its own, the cluster holds only the error
// that names its budget and where it broke, and it loads again once it fits.
func TestAClusterDirectoryOverItsOwnBudgetFailsAlone(t *testing.T) {
	base := baseFleet()
	_, _, depth := cost(base)
	// The budget of a cluster is what the largest of the fleet's holds, and a little.
	entries, size := map[string]int{}, map[string]int64{}
	for p, f := range base {
		if parts := strings.Split(p, "/"); parts[0] == fleet.ClustersDir && len(parts) > 2 {
			entries[parts[1]]++
			size[parts[1]] += int64(len(f.Data))
		}
	}
	most, largest := slices.Max(slices.Collect(maps.Values(entries))), slices.Max(slices.Collect(maps.Values(size)))
	budget := fleet.Budget{MaxDepth: depth, MaxClusterBytes: largest + 100, MaxClusterFiles: most + 1}
	tiny := map[string]string{}
	for i := range most - entries[example] + 2 {
		tiny[fmt.Sprintf("%s/f%d.txt", exampleDir, i)] = "x"
	}
	deep := exampleDir + strings.Repeat("/d", depth) + "/x.yaml"
	cases := []struct {
		name    string
		changes map[string]string
		file    string
		msg     string
	}{
		{name: "one byte over its bytes", changes: map[string]string{exampleDir + "/notes.txt": strings.Repeat("x", int(largest-size[example])+101)},
			file: exampleDir + "/notes.txt", msg: fmt.Sprintf("the cluster directory's files add up to more than %d bytes", largest+100)},
		{name: "one entry over its files", changes: tiny,
			file: exampleDir, msg: fmt.Sprintf("the cluster directory holds more than %d files, directories and symbolic links followed, the most the hub reads of one cluster directory (budget clusterFiles)", most+1)},
		{name: "a path deeper than the head allows", changes: map[string]string{deep: "x: 1\n"},
			file: strings.Join(strings.Split(deep, "/")[:depth+1], "/"), msg: fmt.Sprintf("the cluster directory nests paths more than %d deep", depth)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fsys := baseFleet()
			f := fleet.LoadWith(fsys, fleet.LoadOptions{Budget: budget})
			wantNoErrors(t, f)
			apply(fsys, tc.changes)
			for name, fsys := range map[string]fs.FS{"in memory": fsys, "checkout": diskFS(t, fsys)} {
				whole := fleet.LoadWith(fsys, fleet.LoadOptions{Budget: budget})
				c := whole.Clusters[example]
				e := wantOnlyError(t, c.Errors, tc.file, 0, 0, tc.msg)
				if e.Cluster != example || len(c.Files) != 0 || c.Valid() {
					t.Fatalf("%s: the error is %s's, the cluster holds %d files, valid %t", name, e.Cluster, len(c.Files), c.Valid())
				}
				if whole.OverBudget() || !whole.Valid() {
					t.Fatalf("%s: the fleet is over budget %t, valid %t:\n%s", name, whole.OverBudget(), whole.Valid(), describe(whole.Errors))
				}
				wantOthersValid(t, whole, example)
			}

			// Read on its own, as a change to the cluster alone is.
			c := f.LoadCluster(fsys, example)
			if want := fleet.LoadWith(fsys, fleet.LoadOptions{Budget: budget}).Clusters[example]; !reflect.DeepEqual(c, want) {
				t.Fatalf("read on its own, the cluster is\n%s\nread with the head,\n%s", describe(c.Errors), describe(want.Errors))
			}
			if f.OverBudget() || !f.Valid() {
				t.Fatalf("the fleet is over budget %t, valid %t:\n%s", f.OverBudget(), f.Valid(), describe(f.Errors))
			}
			wantOthersValid(t, f, example)

			for p := range tc.changes {
				tc.changes[p] = removed
			}
			apply(fsys, tc.changes)
			for p := range fsys {
				if strings.HasPrefix(p, exampleDir+"/d") {
					delete(fsys, p)
				}
			}
			if c := f.LoadCluster(fsys, example); !c.Valid() {
				t.Fatalf("the cluster back within its budget:\n%s", describe(c.Errors))
			}
			wantNoErrors(t, f)
		})
	}
}

package fleet_test

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// The example cluster of the template is the one every case breaks.
const (
	example        = fleetgen.ExampleCluster
	exampleDir     = "clusters/" + example
	clusterFile    = exampleDir + "/cluster.yaml"
	enrollmentFile = exampleDir + "/enrollment.sops.yaml"
	overlayFile    = exampleDir + "/kustomization.yaml"
)

// removed as the content of a change deletes the file.
const removed = "\x00removed"

// siblings is how many synthetic clusters stand next to the example cluster, so that
// every case can check that a broken cluster fails nobody else.
const siblings = 3

// baseFleet is the template with synthetic clusters next to its example cluster; the
// second one has an overlay.
func baseFleet() fstest.MapFS {
	fsys := fleetgen.Template()
	enrollment := fsys[enrollmentFile].Data
	for i := range siblings {
		fleetgen.AddCluster(fsys, fleetgen.ClusterName(i), enrollment, i, fleetgen.Options{OverlayEvery: 2})
	}
	return fsys
}

// template returns a file of the fleet template.
func template(t testing.TB, file string) string {
	t.Helper()
	f, ok := fleetgen.Template()[file]
	if !ok {
		t.Fatalf("the template has no %s", file)
	}
	return string(f.Data)
}

// edited returns a file of the template with old replaced by new, once.
func edited(t testing.TB, file, old, new string) string {
	t.Helper()
	s := template(t, file)
	if !strings.Contains(s, old) {
		t.Fatalf("%s does not contain %q", file, old)
	}
	return strings.Replace(s, old, new, 1)
}

// apply writes changes (path to content, or removed) into fsys.
func apply(fsys fstest.MapFS, changes map[string]string) {
	for p, data := range changes {
		if data == removed {
			delete(fsys, p)
			continue
		}
		fsys[p] = &fstest.MapFile{Data: []byte(data), Mode: 0o644}
	}
}

// loadWith loads the base fleet with changes applied.
func loadWith(t testing.TB, changes map[string]string) *fleet.Fleet {
	t.Helper()
	fsys := baseFleet()
	apply(fsys, changes)
	return fleet.Load(fsys)
}

// wantError fails unless errs holds an error at exactly file, line and column whose
// message contains substr. It returns that error.
func wantError(t testing.TB, errs fleet.ErrorList, file string, line, col int, substr string) fleet.Error {
	t.Helper()
	for _, e := range errs {
		if e.File == file && e.Line == line && e.Column == col && strings.Contains(e.Message, substr) {
			return e
		}
	}
	t.Fatalf("want an error at %s line %d column %d containing %q; got:\n%s", file, line, col, substr, describe(errs))
	return fleet.Error{}
}

// wantOnlyError is wantError for a list that must hold that error and no other.
func wantOnlyError(t testing.TB, errs fleet.ErrorList, file string, line, col int, substr string) fleet.Error {
	t.Helper()
	e := wantError(t, errs, file, line, col, substr)
	if len(errs) != 1 {
		t.Fatalf("want only the error %q; got:\n%s", substr, describe(errs))
	}
	return e
}

func describe(errs fleet.ErrorList) string {
	if len(errs) == 0 {
		return "  (no errors)"
	}
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "  %s line %d column %d [%s]: %s\n", e.File, e.Line, e.Column, e.Cluster, e.Message)
	}
	return b.String()
}

// wantNoErrors fails when the fleet has any error.
func wantNoErrors(t testing.TB, f *fleet.Fleet) {
	t.Helper()
	if errs := f.AllErrors(); len(errs) > 0 {
		t.Fatalf("want no errors; got:\n%s", describe(errs))
	}
	if !f.Valid() {
		t.Fatal("fleet is not valid although it has no errors")
	}
}

// wantOthersValid fails unless every cluster but the broken ones loaded and is valid,
// and every error of the fleet belongs to a broken cluster.
func wantOthersValid(t testing.TB, f *fleet.Fleet, broken ...string) {
	t.Helper()
	want := []string{example}
	for i := range siblings {
		want = append(want, fleetgen.ClusterName(i))
	}
	for _, name := range want {
		if slices.Contains(broken, name) {
			continue
		}
		c, ok := f.Clusters[name]
		if !ok {
			t.Fatalf("cluster %s is missing", name)
		}
		if !c.Valid() {
			t.Fatalf("cluster %s is not valid; its errors:\n%s", name, describe(c.Errors))
		}
	}
	for _, e := range f.AllErrors() {
		if !slices.Contains(broken, e.Cluster) {
			t.Fatalf("error outside the broken clusters %v: %s", broken, e)
		}
		if e.Cluster != "" && !strings.HasPrefix(e.File, path.Join(fleet.ClustersDir, e.Cluster)) {
			t.Fatalf("error of cluster %s is placed outside its directory: %s", e.Cluster, e)
		}
	}
}

// clusterErrors are the errors of one cluster, which must exist.
func clusterErrors(t testing.TB, f *fleet.Fleet, name string) fleet.ErrorList {
	t.Helper()
	c, ok := f.Clusters[name]
	if !ok {
		t.Fatalf("cluster %s is missing; clusters: %v", name, f.ClusterNames())
	}
	return c.Errors
}

// rejectCase is one bad input of a cluster rule: the files changed and the one error
// it must cause.
type rejectCase struct {
	name    string
	changes map[string]string
	// cluster whose errors are checked; the example cluster when empty.
	cluster   string
	file      string
	line, col int
	msg       string
	// others are more errors the case causes besides the one checked.
	others bool
	// alsoBroken are more clusters the case breaks.
	alsoBroken []string
	// secret must appear in no error message.
	secret string
}

// runRejects runs cases of one rule: each must fail its own cluster with its own error
// and leave every other cluster valid.
func runRejects(t *testing.T, cases []rejectCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Helper()
			f := loadWith(t, tc.changes)
			name := tc.cluster
			if name == "" {
				name = example
			}
			errs := clusterErrors(t, f, name)
			if tc.others {
				wantError(t, errs, tc.file, tc.line, tc.col, tc.msg)
			} else {
				wantOnlyError(t, errs, tc.file, tc.line, tc.col, tc.msg)
			}
			if f.Clusters[name].Valid() {
				t.Fatalf("cluster %s is valid despite its errors", name)
			}
			if !f.Valid() {
				t.Fatalf("fleet.yaml or a preset failed too:\n%s", describe(f.Errors))
			}
			if tc.secret != "" && strings.Contains(f.AllErrors().Error(), tc.secret) {
				t.Fatalf("an error repeats %q:\n%s", tc.secret, describe(f.AllErrors()))
			}
			wantOthersValid(t, f, append([]string{name}, tc.alsoBroken...)...)
		})
	}
}

// writeDir writes fsys into a new temporary directory, directories of it included, and
// returns the directory's path.
func writeDir(t testing.TB, fsys fstest.MapFS) string {
	t.Helper()
	dir := t.TempDir()
	for p, f := range fsys {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if f.Mode.IsDir() {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// diskFS is fsys written to disk, read back as a checkout is (fleet.DirFS).
func diskFS(t testing.TB, fsys fstest.MapFS) fs.FS {
	t.Helper()
	return fleet.DirFS(writeDir(t, fsys))
}

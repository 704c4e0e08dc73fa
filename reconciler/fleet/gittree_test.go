package fleet_test

import (
	"io/fs"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/gittree"
)

// commitFS is the base fleet with changes, committed and read back as the hub reads a
// pull request's head. A change replaces whatever the base fleet holds at or below its
// path.
func commitFS(t testing.TB, changes gittree.Files) fs.FS {
	t.Helper()
	files := gittree.FromMapFS(baseFleet())
	for p := range changes {
		for q := range files {
			if q == p || strings.HasPrefix(q, p+"/") {
				delete(files, q)
			}
		}
	}
	for p, f := range changes {
		files[p] = f
	}
	return gitsource.NewTreeFS(gittree.New(t, files))
}

// linkChain is n links in the example cluster, first.yaml -> hop1.yaml -> ... -> target.
func linkChain(n int, target string) gittree.Files {
	files := gittree.Files{}
	from := exampleDir + "/first.yaml"
	for i := 1; i < n; i++ {
		next := "hop" + strconv.Itoa(i) + ".yaml"
		files[from] = gittree.Link(next)
		from = exampleDir + "/" + next
	}
	files[from] = gittree.Link(target)
	return files
}

func TestLoadRefusesHostileTreesInACommitNamingTheFile(t *testing.T) {
	deep := exampleDir + "/" + strings.Repeat("d/", 40) + "x.yaml"
	// depthError is where a path first has more elements than the default budget allows.
	depthError := strings.Join(strings.Split(deep, "/")[:fleet.DefaultMaxDepth+1], "/")
	cases := []struct {
		name    string
		changes gittree.Files
		// file and msg are the error the case must cause, among the fleet's errors when
		// fleetWide is set and among the example cluster's otherwise.
		file, msg string
		fleetWide bool
		// overBudget is whether the head broke its budget, incomplete whether clusters/
		// could not be listed.
		overBudget, incomplete bool
	}{
		{name: "fleet.yaml linked to itself", changes: gittree.Files{fleet.FleetFile: gittree.Link(fleet.FleetFile)},
			file: fleet.FleetFile, msg: "too many levels of symbolic links", fleetWide: true},
		{name: "clusters linked to itself", changes: gittree.Files{fleet.ClustersDir: gittree.Link(fleet.ClustersDir)},
			file: fleet.ClustersDir, msg: "too many levels of symbolic links", fleetWide: true, incomplete: true},
		{name: "presets linked to itself", changes: gittree.Files{fleet.PresetsDir: gittree.Link(fleet.PresetsDir)},
			file: fleet.PresetsDir, msg: "too many levels of symbolic links", fleetWide: true},
		{name: "a cluster directory linked to itself", changes: gittree.Files{"clusters/loop": gittree.Link("loop")},
			file: "clusters/loop", msg: "too many levels of symbolic links", fleetWide: true},
		{name: "cluster.yaml linked to itself", changes: gittree.Files{clusterFile: gittree.Link("cluster.yaml")},
			file: clusterFile, msg: "too many levels of symbolic links"},
		{name: "two files linked to each other", changes: gittree.Files{
			exampleDir + "/a.yaml": gittree.Link("b.yaml"), exampleDir + "/b.yaml": gittree.Link("a.yaml")},
			file: exampleDir + "/a.yaml", msg: "too many levels of symbolic links"},
		{name: "a chain of links one longer than allowed", changes: linkChain(gitsource.MaxLinkHops+1, "cluster.yaml"),
			file: exampleDir + "/first.yaml", msg: "too many levels of symbolic links"},
		{name: "a link out of the repository", changes: gittree.Files{exampleDir + "/x.yaml": gittree.Link("../../../x")},
			file: exampleDir + "/x.yaml", msg: `symbolic link to "../../../x" leaves the repository`},
		{name: "an absolute link", changes: gittree.Files{exampleDir + "/x.yaml": gittree.Link("/etc/passwd")},
			file: exampleDir + "/x.yaml", msg: `symbolic link to "/etc/passwd" leaves the repository`},
		{name: "a link through a linked directory", changes: gittree.Files{
			exampleDir + "/alias": gittree.Link("../../presets/gpu"), exampleDir + "/q.yaml": gittree.Link("alias/queues.yaml")},
			file: exampleDir + "/q.yaml", msg: "passes through the symbolic link " + exampleDir + "/alias"},
		// A checkout would read presets/gpu's parent's file, not the cluster's own.
		{name: "a .. after a linked directory", changes: gittree.Files{
			exampleDir + "/alias": gittree.Link("../../presets/gpu"), exampleDir + "/q.yaml": gittree.Link("alias/../cluster.yaml")},
			file: exampleDir + "/q.yaml", msg: "passes through the symbolic link " + exampleDir + "/alias"},
		{name: "a .. after a file", changes: gittree.Files{exampleDir + "/q.yaml": gittree.Link("cluster.yaml/../cluster.yaml")},
			file: exampleDir + "/q.yaml", msg: "passes through " + exampleDir + "/cluster.yaml, which is not a directory"},
		{name: "a directory linked to a directory above it", changes: gittree.Files{exampleDir + "/up": gittree.Link("..")},
			file: exampleDir + "/up", msg: "symbolic links to directories are not supported"},
		{name: "an entry named ..", changes: gittree.Files{exampleDir + "/../x.yaml": gittree.Regular("x: 1\n")},
			file: exampleDir, msg: `holds an entry named "..", which no checkout can hold`},
		{name: "a name both a file and a directory", changes: gittree.Files{
			exampleDir + "/x.yaml": gittree.Regular("x: 1\n"), exampleDir + "/x.yaml/y": gittree.Regular("y: 1\n")},
			file: exampleDir, msg: `holds two entries named "x.yaml"`},
		{name: "directories nested deeper than the budget", changes: gittree.Files{deep: gittree.Regular("x: 1\n")},
			file: depthError, msg: "the cluster directory nests paths more than 16 deep, the most the hub reads (budget depth)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := fleet.Load(commitFS(t, tc.changes))
			if tc.fleetWide {
				wantError(t, f.Errors, tc.file, 0, 0, tc.msg)
				if f.Valid() {
					t.Fatal("the fleet is valid")
				}
			} else {
				wantError(t, clusterErrors(t, f, example), tc.file, 0, 0, tc.msg)
				if f.Clusters[example].Valid() {
					t.Fatal("the cluster is valid")
				}
				wantOthersValid(t, f, example)
			}
			if f.OverBudget() != tc.overBudget || f.Incomplete() != tc.incomplete {
				t.Fatalf("OverBudget %t, Incomplete %t; want %t, %t", f.OverBudget(), f.Incomplete(), tc.overBudget, tc.incomplete)
			}
		})
	}

	t.Run("a chain of as many links as allowed", func(t *testing.T) {
		changes := linkChain(gitsource.MaxLinkHops, "../../presets/gpu/queues.yaml")
		f := fleet.Load(commitFS(t, changes))
		wantNoErrors(t, f)
		if got, want := string(f.Clusters[example].Files[exampleDir+"/first.yaml"]), template(t, "presets/gpu/queues.yaml"); got != want {
			t.Fatalf("the chain read %q, want the preset's file", got)
		}
	})
	t.Run("directories nested deep outside presets and clusters", func(t *testing.T) {
		f := fleet.Load(commitFS(t, gittree.Files{strings.Repeat("docs/", 5000) + "x.md": gittree.Regular("x")}))
		wantNoErrors(t, f)
	})
}

// TestLoadReadsLinksInACommitAsInACheckout loads the same links from a checkout on disk
// and from a commit: the loader must say the same of both.
func TestLoadReadsLinksInACommitAsInACheckout(t *testing.T) {
	chain := func(n int) map[string]string {
		out := map[string]string{}
		for p, f := range linkChain(n, "../../presets/gpu/queues.yaml") {
			out[p] = string(f.Data)
		}
		return out
	}
	cases := map[string]map[string]string{
		"fleet.yaml linked to itself":          {fleet.FleetFile: fleet.FleetFile},
		"cluster.yaml linked to itself":        {clusterFile: "cluster.yaml"},
		"a cluster directory linked to itself": {"clusters/loop": "loop"},
		"a chain as long as allowed":           chain(gitsource.MaxLinkHops),
		"a chain one longer than allowed":      chain(gitsource.MaxLinkHops + 1),
		"a link out":                           {exampleDir + "/x.yaml": "../../../x"},
		"a link through a linked directory": {
			"presets/alias": "gpu", exampleDir + "/q.yaml": "../../presets/alias/queues.yaml"},
		"a link to a preset's file":  {exampleDir + "/q.yaml": "../../presets/gpu/queues.yaml"},
		"a link to a directory":      {exampleDir + "/presets": "../../presets"},
		"a cluster directory linked": {"clusters/alias": example},
	}
	for name, links := range cases {
		t.Run(name, func(t *testing.T) {
			onDisk := fleet.Load(linkedRepo(t, nil, links))
			changes := gittree.Files{}
			for p, target := range links {
				changes[p] = gittree.Link(target)
			}
			inGit := fleet.Load(commitFS(t, changes))
			if got, want := inGit.AllErrors(), onDisk.AllErrors(); !reflect.DeepEqual(got, want) {
				t.Fatalf("from a commit:\n%s\nfrom a checkout:\n%s", describe(got), describe(want))
			}
			for name, c := range onDisk.Clusters {
				if inGit.Clusters[name] == nil || inGit.Clusters[name].Digest != c.Digest {
					t.Errorf("cluster %s reads differently from a commit", name)
				}
			}
		})
	}
}

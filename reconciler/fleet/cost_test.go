package fleet_test

import (
	"fmt"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// The example cluster's preset, gke-dws, renders this many objects.
const exampleBase = 5

// objectsFile is n ResourceFlavors, one document each, about 125 bytes a document.
func objectsFile(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata:\n  name: flavor-%04d\n  labels: {pad: %q}\n", i, strings.Repeat("x", 20))
	}
	return b.String()
}

// listFile is a ResourceFlavorList of n items, which kustomize renders as n objects.
func listFile(n int) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: ResourceFlavorList\nitems:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {apiVersion: kueue.x-k8s.io/v1beta2, kind: ResourceFlavor, metadata: {name: f%04d}}\n", i)
	}
	return b.String()
}

// nestedLists is a List of lists ResourceFlavorLists of n items each.
func nestedLists(lists, n int) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: List\nitems:\n")
	for i := range lists {
		b.WriteString("  - apiVersion: v1\n    kind: ResourceFlavorList\n    items:\n")
		for j := range n {
			fmt.Fprintf(&b, "      - {apiVersion: kueue.x-k8s.io/v1beta2, kind: ResourceFlavor, metadata: {name: f%d-%04d}}\n", i, j)
		}
	}
	return b.String()
}

// includedFrom returns an overlay of the example cluster that includes n sibling
// directories, each with its own name prefix and file as its resource at line 4 column 5.
func includedFrom(n int, file, data string) map[string]string {
	var overlay strings.Builder
	overlay.WriteString(overlayHead + "resources:\n")
	changes := map[string]string{exampleDir + "/" + file: data}
	for i := 1; i <= n; i++ {
		d := fmt.Sprintf("d%02d", i)
		fmt.Fprintf(&overlay, "  - %s\n", d)
		changes[exampleDir+"/"+d+"/kustomization.yaml"] = overlayHead + "resources:\n  - ../" + file + "\nnamePrefix: " + d + "-\n"
	}
	changes[overlayFile] = overlay.String()
	return changes
}

const overCap = "makes kustomize render more than 1000 objects for presets/gke-dws and clusters/example-us-central1; a render has at most that much"

func TestLoadRefusesAnOverlayWhoseRenderWouldBeTooLarge(t *testing.T) {
	// 250 objects in 31 KiB: the preset's 5, then 255, 505, 755 and 1005 at the fourth
	// directory.
	sixteen := includedFrom(16, "objects.yaml", objectsFile(250))
	if n := len(sixteen[exampleDir+"/objects.yaml"]); n > 32<<10 || n < 30<<10 {
		t.Fatalf("objects.yaml is %d bytes, want about 31 KiB", n)
	}
	big := "# " + strings.Repeat("x", 900<<10) + "\n" + objectsFile(1)
	cases := []rejectCase{
		{
			name:    "one file included from 16 directories, each with its own name prefix",
			changes: sixteen,
			file:    exampleDir + "/d04/kustomization.yaml", line: 4, col: 5,
			msg: `"../objects.yaml" ` + overCap,
		},
		{
			name:    "a List whose items take the render one past the cap",
			changes: merge(overlay("resources:\n  - list.yaml\n"), map[string]string{exampleDir + "/list.yaml": listFile(fleet.MaxRenderObjects - exampleBase + 1)}),
			file:    overlayFile, line: 4, col: 5,
			msg: `"list.yaml" ` + overCap,
		},
		{
			name:    "Lists nested in a List",
			changes: merge(overlay("resources:\n  - list.yaml\n"), map[string]string{exampleDir + "/list.yaml": nestedLists(2, 600)}),
			file:    overlayFile, line: 4, col: 5,
			msg: `"list.yaml" ` + overCap,
		},
		{
			name:    "a file of 900 KiB included from five directories",
			changes: includedFrom(5, "big.yaml", big),
			file:    exampleDir + "/d05/kustomization.yaml", line: 4, col: 5,
			msg: `"../big.yaml" makes kustomize render more than 4 MiB of kustomizations, resources and patches for presets/gke-dws and clusters/example-us-central1`,
		},
	}
	runRejects(t, cases)
}

func TestLoadRefusesAPresetWhoseRenderWouldBeTooLarge(t *testing.T) {
	// gpu's queues.yaml holds 3 objects.
	f := loadWith(t, map[string]string{
		"presets/gpu/kustomization.yaml": edited(t, "presets/gpu/kustomization.yaml", "  - queues.yaml\n", "  - queues.yaml\n  - many.yaml\n"),
		"presets/gpu/many.yaml":          listFile(fleet.MaxRenderObjects - 2),
	})
	wantOnlyError(t, f.Errors, "presets/gpu/kustomization.yaml", 7, 5,
		`"many.yaml" makes kustomize render more than 1000 objects for presets/gpu; a render has at most that much`)
}

func TestLoadAcceptsARenderOfAsManyObjectsAsTheCap(t *testing.T) {
	cases := map[string]map[string]string{
		"a List that brings the render to the cap": merge(overlay("resources:\n  - list.yaml\n"),
			map[string]string{exampleDir + "/list.yaml": listFile(fleet.MaxRenderObjects - exampleBase)}),
		"one file included from directories up to the cap": includedFrom(3, "objects.yaml", objectsFile(331)),
		"an empty List and empty documents":                merge(overlay("resources:\n  - list.yaml\n"), map[string]string{exampleDir + "/list.yaml": "---\n---\nkind: FooList\nitems: []\n---\n"}),
	}
	for name, changes := range cases {
		t.Run(name, func(t *testing.T) {
			wantNoErrors(t, loadWith(t, changes))
		})
	}
}

func TestProveLocalRefusesARenderOverTheCapBeforeKustomizeRuns(t *testing.T) {
	files := map[string][]byte{}
	for p, f := range fleetgen.Template() {
		files[p] = f.Data
	}
	for p, data := range includedFrom(16, "objects.yaml", objectsFile(250)) {
		files[p] = []byte(data)
	}
	// The preset and the overlay of one render count together, as they render together.
	wantOnlyError(t, fleet.ProveLocal(files, "presets/gke-dws", exampleDir), exampleDir+"/d04/kustomization.yaml", 4, 5,
		`"../objects.yaml" `+overCap)
	// A file of another name than the loader parses is counted and checked all the same.
	files[exampleDir+"/d01/kustomization.yaml"] = []byte(overlayHead + "resources:\n  - ../objects\n")
	files[exampleDir+"/objects"] = []byte("a: &a 1\nb: *a\n")
	wantError(t, fleet.ProveLocal(files, exampleDir), exampleDir+"/objects", 1, 4, "YAML anchors and aliases are not allowed")
}

// presetsAndOverlays is a fleet of n presets of two small files and n clusters, each
// with an overlay that names a directory that is not there.
func presetsAndOverlays(n int) fstest.MapFS {
	fsys := fleetgen.Template()
	enrollment := fsys[enrollmentFile].Data
	for i := range n {
		dir := fmt.Sprintf("presets/p%05d", i)
		fsys[dir+"/kustomization.yaml"] = &fstest.MapFile{Data: []byte(overlayHead + "resources:\n  - flavor.yaml\n")}
		fsys[dir+"/flavor.yaml"] = &fstest.MapFile{Data: []byte(objectsFile(1))}
		name := fleetgen.ClusterName(i)
		fleetgen.AddCluster(fsys, name, enrollment, i, fleetgen.Options{})
		fsys["clusters/"+name+"/kustomization.yaml"] = &fstest.MapFile{Data: []byte(overlayHead + "resources:\n  - missing\n")}
	}
	return fsys
}

// TestLoadCostGrowsLinearlyWithPresetsAndOverlays pins that a cluster's overlay is
// checked against the presets without copying them and that a path that resolves to
// nothing is looked up, not searched for: four times the presets and overlays cost
// about four times the bytes, not sixteen.
func TestLoadCostGrowsLinearlyWithPresetsAndOverlays(t *testing.T) {
	measure := func(n int) uint64 {
		fsys := presetsAndOverlays(n)
		var f *fleet.Fleet
		allocated := allocatedBy(func() { f = fleet.Load(fsys) })
		if !f.Valid() {
			t.Fatalf("the fleet of %d presets does not load:\n%s", n, describe(f.Errors))
		}
		if errs := clusterErrors(t, f, fleetgen.ClusterName(n-1)); len(errs) != 1 || !strings.Contains(errs[0].Message, `"missing" does not exist`) {
			t.Fatalf("the overlay's missing directory gave:\n%s", describe(errs))
		}
		return allocated
	}
	small, large := measure(250), measure(1000)
	t.Logf("250 presets and overlays: %d KiB; 1000: %d KiB", small>>10, large>>10)
	if ratio := float64(large) / float64(small); ratio > 6 {
		t.Errorf("loading 1000 presets and overlays allocated %.1f times what 250 did (%d MiB, %d MiB); it grows faster than the fleet",
			ratio, large>>20, small>>20)
	}
}

// BenchmarkLoadManyPresetsAndOverlays loads 2,000 presets and 2,000 clusters with an
// overlay each.
func BenchmarkLoadManyPresetsAndOverlays(b *testing.B) {
	fsys := presetsAndOverlays(2000)
	b.ReportAllocs()
	for b.Loop() {
		fleet.Load(fsys)
	}
}

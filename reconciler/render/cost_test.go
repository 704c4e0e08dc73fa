package render_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// flavors is n ResourceFlavors, one document each, about 125 bytes a document.
func flavors(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata:\n  name: flavor-%04d\n  labels: {pad: %q}\n", i, strings.Repeat("x", 20))
	}
	return b.String()
}

// includedFrom is the example cluster's overlay including n sibling directories, each
// with its own name prefix and objects.yaml of perFile objects as its resource.
func includedFrom(n, perFile int) map[string]string {
	var overlay strings.Builder
	overlay.WriteString(kHead + "resources:\n")
	files := map[string]string{"objects.yaml": flavors(perFile)}
	for i := 1; i <= n; i++ {
		d := fmt.Sprintf("d%02d", i)
		fmt.Fprintf(&overlay, "  - %s\n", d)
		files[d+"/kustomization.yaml"] = kHead + "resources:\n  - ../objects.yaml\nnamePrefix: " + d + "-\n"
	}
	files["kustomization.yaml"] = overlay.String()
	return files
}

// allocated is how many bytes fn allocates.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestRenderRefusesAnOverlayOverTheCapBeforeKustomizeRuns pins that a head that would
// keep kustomize busy for seconds (one 31 KiB file of 250 objects included from 16
// directories, 4,005 objects with the preset) is refused from the proof alone: the
// refusal allocates a small fraction of what rendering a cluster of half the cap does.
func TestRenderRefusesAnOverlayOverTheCapBeforeKustomizeRuns(t *testing.T) {
	const file = "clusters/" + example + "/d04/kustomization.yaml"
	const msg = `"../objects.yaml" makes kustomize render more than 1000 objects for presets/gke-dws and clusters/` + example
	wantCap := func(t *testing.T, err error) {
		t.Helper()
		var list fleet.ErrorList
		if !errors.As(err, &list) {
			t.Fatalf("render gave %v, want the fleet's errors", err)
		}
		for _, e := range list {
			if e.File == file && e.Line == 4 && e.Column == 5 && strings.Contains(e.Message, msg) {
				return
			}
		}
		t.Fatalf("no error at %s:4:5 containing %q:\n%v", file, msg, list)
	}

	// 505 objects with the preset's 5: kustomize runs.
	half := load(t, withCluster(t, same, includedFrom(2, 250)))
	var res *render.Result
	var err error
	rendered := allocated(func() { res, err = render.New().Render(half, example) })
	if err != nil {
		t.Fatalf("a render under the cap is refused: %v", err)
	}
	if len(res.Objects) < 505 {
		t.Fatalf("the render under the cap has %d objects, want at least 505", len(res.Objects))
	}

	t.Run("validated by the loader", func(t *testing.T) {
		f := fleet.Load(withCluster(t, same, includedFrom(16, 250)))
		if f.Clusters[example].Valid() {
			t.Fatal("the example cluster is valid")
		}
		wantCap(t, f.Clusters[example].Errors)
		if _, err := render.New().Render(f, example); err == nil {
			t.Fatal("render of the refused cluster succeeded")
		}
	})
	t.Run("changed after loading", func(t *testing.T) {
		// A Fleet is a value that a caller could change after the loader validated it:
		// render proves the cost of what it gives kustomize once more.
		f := load(t, fleetgen.Template())
		c := f.Clusters[example]
		for p, data := range includedFrom(16, 250) {
			c.Files[c.Dir+"/"+p] = []byte(data)
		}
		refused := allocated(func() { _, err = render.New().Render(f, example) })
		wantCap(t, err)
		if refused*10 > rendered {
			t.Errorf("the refusal allocated %d KiB, more than a tenth of the %d KiB of a render of 505 objects: kustomize ran",
				refused>>10, rendered>>10)
		}
	})
}

// BenchmarkRenderAtTheCap renders a cluster whose overlay takes its render to 998
// objects, about fleet.MaxRenderObjects: the most kustomize may be given for one
// cluster.
func BenchmarkRenderAtTheCap(b *testing.B) {
	fsys := fleetgen.Template()
	for p, data := range includedFrom(3, 331) {
		fsys["clusters/"+example+"/"+p] = &fstest.MapFile{Data: []byte(data)}
	}
	f := fleet.Load(fsys)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := render.New().Render(f, example); err != nil {
			b.Fatal(err)
		}
	}
}

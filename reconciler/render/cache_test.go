package render

import (
	"fmt"
	"path"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// TestLRUHoldsToItsBudget pins the cache's bounds: the bytes charged never pass the
// budget, nor the entries their number, the least recently used go first, and an entry
// above the bound of one is not kept.
func TestLRUHoldsToItsBudget(t *testing.T) {
	c := newLRU[int, string](100, 40, 4)
	for i := range 10 {
		if !c.add(i, "v", 30) {
			t.Fatalf("entry %d of 30 bytes is not kept", i)
		}
		if c.bytes() > 100 || c.len() > 3 {
			t.Fatalf("after %d entries of 30 bytes: %d entries, %d bytes; want at most 3 and 100", i+1, c.len(), c.bytes())
		}
		// Entry 0 is used before every add, so it stays while the others come and go.
		if _, ok := c.get(0); !ok {
			t.Fatalf("after %d entries: the most recently used entry was evicted", i+1)
		}
	}
	for i, want := range map[int]bool{0: true, 7: false, 8: true, 9: true} {
		if _, ok := c.get(i); ok != want {
			t.Errorf("entry %d kept: %t, want %t", i, ok, want)
		}
	}
	if c.add(10, "big", 41) {
		t.Error("an entry above the bound of one is kept")
	}
	if _, ok := c.get(10); ok || c.len() != 3 || c.bytes() != 90 {
		t.Errorf("after refusing an entry: %d entries, %d bytes, want 3 and 90", c.len(), c.bytes())
	}
	c.add(0, "again", 10)
	if c.len() != 3 || c.bytes() != 70 {
		t.Errorf("after replacing an entry: %d entries, %d bytes, want 3 and 70", c.len(), c.bytes())
	}
	c = newLRU[int, string](100, 40, 10)
	for i := range 5 {
		c.add(i, "v", 10)
	}
	c.add(5, "v", 40)
	c.add(6, "v", 40)
	if c.bytes() > 100 || c.len() != 4 {
		t.Errorf("%d entries of %d bytes, want the 2 of 40 and the 2 most recent of 10", c.len(), c.bytes())
	}
}

// flavorsOverlay is a cluster's kustomization.yaml and objects.yaml: n ResourceFlavors
// with names of the cluster's own, each with a label of pad bytes.
func flavorsOverlay(cluster string, n, pad int) map[string]string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata:\n  name: %s-%04d\n  labels: {pad: %q}\n", cluster, i, strings.Repeat("x", pad))
	}
	return map[string]string{
		"kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - objects.yaml\n",
		"objects.yaml":       b.String(),
	}
}

// TestRendererCachesHoldToTheirByteBudget pins the overlay cache to its bound in bytes:
// clusters with overlays of their own, each large, do not take it past its budget (here
// a few entries' worth, for speed), it keeps the most recent of them, and an overlay
// whose objects hold more than maxOverlayBytes is not cached at all.
func TestRendererCachesHoldToTheirByteBudget(t *testing.T) {
	// Each of clusters overlays renders flavors objects of about 250 bytes of JSON; the
	// last cluster's, large objects of 1.5 KiB each: well above maxOverlayBytes.
	const clusters, flavors, large = 8, 150, 500
	fsys := fleetgen.Fleet(clusters+1, fleetgen.Options{})
	for i := range clusters + 1 {
		n, pad := flavors, 60
		if i == clusters {
			n, pad = large, 1500
		}
		for p, data := range flavorsOverlay(fleetgen.ClusterName(i), n, pad) {
			fsys[path.Join("clusters", fleetgen.ClusterName(i), p)] = &fstest.MapFile{Data: []byte(data)}
		}
	}
	f := fleet.Load(fsys)
	if errs := f.AllErrors(); len(errs) > 0 {
		t.Fatalf("fleet does not load:\n%v", errs)
	}

	r := New()
	render := func(i int) {
		t.Helper()
		if _, err := r.Render(f, fleetgen.ClusterName(i)); err != nil {
			t.Fatalf("%s: %v", fleetgen.ClusterName(i), err)
		}
	}
	render(0)
	if r.overlays.len() != 1 {
		t.Fatalf("the overlay cache holds %d entries after one overlay, want 1", r.overlays.len())
	}
	entry := r.overlays.bytes()
	if entry < flavors*250 || entry > maxOverlayBytes {
		t.Fatalf("an overlay of %d objects of about 250 bytes of JSON is charged %d bytes, want between %d and %d",
			flavors, entry, flavors*250, maxOverlayBytes)
	}
	t.Logf("an overlay of %d objects of about 250 bytes of JSON is charged %d bytes", flavors, entry)
	// Room for three such entries, and a little.
	budget := 3*entry + entry/2
	r.overlays = newLRU[[32]byte, []map[string]any](budget, maxOverlayBytes, maxCachedOverlays)
	for i := range clusters {
		render(i)
		if r.overlays.bytes() > budget {
			t.Fatalf("after %d overlays the cache is charged %d bytes, above its budget of %d", i+1, r.overlays.bytes(), budget)
		}
	}
	if r.overlays.len() != 3 {
		t.Errorf("the cache holds %d overlays, want the 3 that fit", r.overlays.len())
	}
	// The most recent is kept: rendering it again adds nothing and evicts nothing.
	before := r.overlays.bytes()
	render(clusters - 1)
	if r.overlays.len() != 3 || r.overlays.bytes() != before {
		t.Errorf("rendering the most recent overlay again changed the cache: %d entries, %d bytes, were 3 and %d",
			r.overlays.len(), r.overlays.bytes(), before)
	}

	r = New()
	res, err := r.Render(f, fleetgen.ClusterName(clusters))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Objects) < large {
		t.Fatalf("the large overlay rendered %d objects, want at least %d", len(res.Objects), large)
	}
	if r.overlays.len() != 0 || r.overlays.bytes() != 0 {
		t.Errorf("an overlay of %d objects of 1.5 KiB is cached: %d entries, %d bytes; want none above %d bytes",
			large, r.overlays.len(), r.overlays.bytes(), maxOverlayBytes)
	}
	t.Logf("a render of %d objects of 1.5 KiB holds about %d bytes", len(res.Objects), footprint(unstructuredObjects(res)))
	// The component it was made from is small, and cached by the overlay's hash.
	if r.components.len() != 1 {
		t.Errorf("the component cache holds %d entries, want 1", r.components.len())
	}
}

func unstructuredObjects(res *Result) []map[string]any {
	out := make([]map[string]any, len(res.Objects))
	for i, o := range res.Objects {
		out[i] = o.Object
	}
	return out
}

// TestRendererRendersConcurrently renders clusters that share their preset and overlay
// from many goroutines at once, as a hub and the plans of pull requests do: each gets
// what a Renderer of its own gives it.
func TestRendererRendersConcurrently(t *testing.T) {
	f := fleet.Load(fleetgen.Fleet(8, fleetgen.Options{OverlayEvery: 2}))
	if errs := f.AllErrors(); len(errs) > 0 {
		t.Fatalf("fleet does not load:\n%v", errs)
	}
	names := f.ClusterNames()
	want := map[string]string{}
	for _, name := range names {
		res, err := New().Render(f, name)
		if err != nil {
			t.Fatal(err)
		}
		want[name] = res.Hash
	}
	r := New()
	var wg sync.WaitGroup
	errs := make(chan error, 4*len(names))
	for range 4 {
		for _, name := range names {
			wg.Go(func() {
				res, err := r.Render(f, name)
				switch {
				case err != nil:
					errs <- err
				case res.Hash != want[name]:
					errs <- fmt.Errorf("%s: hash %s, a Renderer of its own gives %s", name, res.Hash, want[name])
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

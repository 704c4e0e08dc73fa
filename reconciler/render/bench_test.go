package render_test

import (
	"fmt"
	"io/fs"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gittree"
)

// benchOptions is a fleet as one might run it: a few clusters cordoned, a few with their
// own overlay.
var benchOptions = fleetgen.Options{CordonEvery: 20, OverlayEvery: 50}

// BenchmarkFullRender is what a hub does on start or after a fleet-wide change: load,
// validate and render every cluster. The fleet is read from a directory on disk, as
// the issue that set the goal measured it and as `flotilla validate` reads a checkout,
// and from a commit's tree in memory, which is what the hub reads (gitsource keeps the
// objects it fetched in memory).
func BenchmarkFullRender(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		sources := []struct {
			name string
			fsys func(b *testing.B) fs.FS
		}{
			{"disk", func(b *testing.B) fs.FS { return fleet.DirFS(fleetgen.WriteDir(b, fleetgen.Fleet(n, benchOptions))) }},
			{"git", func(b *testing.B) fs.FS {
				return gitsource.NewTreeFS(gittree.New(b, gittree.FromMapFS(fleetgen.Fleet(n, benchOptions))))
			}},
		}
		for _, src := range sources {
			b.Run(fmt.Sprintf("clusters=%d/from=%s", n, src.name), func(b *testing.B) {
				fsys := src.fsys(b)
				b.ReportAllocs()
				for b.Loop() {
					f := fleet.Load(fsys)
					r := render.New()
					for _, name := range f.ClusterNames() {
						if _, err := r.Render(f, name); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}

// BenchmarkRerenderOneCluster is what a hub does when a commit changes one cluster of a
// large fleet: re-read that directory and render it, with the preset cache warm.
func BenchmarkRerenderOneCluster(b *testing.B) {
	for _, tc := range []struct {
		name    string
		overlay bool
	}{{"preset", false}, {"overlay", true}} {
		b.Run(tc.name, func(b *testing.B) {
			fsys := fleet.DirFS(fleetgen.WriteDir(b, fleetgen.Fleet(10000, benchOptions)))
			f := fleet.Load(fsys)
			r := render.New()
			for _, name := range f.ClusterNames()[:10] {
				if _, err := r.Render(f, name); err != nil {
					b.Fatal(err)
				}
			}
			name := fleetgen.ClusterName(4321)
			opts := fleetgen.Options{}
			if tc.overlay {
				opts.OverlayEvery = 1
			}
			enrollment, err := fs.ReadFile(fsys, "clusters/"+name+"/enrollment.sops.yaml")
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				// A different quota every round, as a commit would bring.
				i++
				// The new commit's directory, in memory: what is measured is validating and
				// rendering it, not the file system it comes from.
				variant := fstest.MapFS{}
				fleetgen.AddCluster(variant, name, enrollment, i, opts)
				c := f.LoadCluster(variant, name)
				if !c.Valid() {
					b.Fatal(c.Errors)
				}
				if _, err := r.Render(f, name); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

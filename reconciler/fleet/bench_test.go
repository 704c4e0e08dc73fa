package fleet_test

import (
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gittree"
)

// hostileHeads are heads a pull request can push at the hub, each under a few MB of
// pack, and whether the default budget refuses them: the whole head, or the one cluster
// directory that holds what is hostile, which fails alone while the rest loads.
func hostileHeads() []struct {
	name       string
	files      gittree.Files
	overBudget bool
} {
	template := func(changes gittree.Files) gittree.Files {
		files := gittree.FromMapFS(fleetgen.Template())
		for p, f := range changes {
			files[p] = f
		}
		return files
	}
	big := []byte("#" + strings.Repeat("x", fleet.MaxFileSize-2) + "\n")
	copies := gittree.Files{}
	for i := range 20_000 {
		copies[fmt.Sprintf("%s/copies/c%05d.yaml", exampleDir, i)] = gittree.File{Data: big}
	}
	tiny := []byte("a: 1\n")
	// As many tiny files as the budget lets through, spread over clusters that each
	// load, and as many again in one directory, refused at its listing.
	spread, heap := gittree.Files{}, gittree.Files{}
	for i := range 95_000 {
		spread[fmt.Sprintf("clusters/%s/f%05d.yaml", fleetgen.ClusterName(i%1000), i)] = gittree.File{Data: tiny}
		heap[fmt.Sprintf("%s/tiny/f%06d.yaml", exampleDir, i)] = gittree.File{Data: tiny}
	}
	for i := range 5_000 {
		heap[fmt.Sprintf("%s/tiny/g%06d.yaml", exampleDir, i)] = gittree.File{Data: tiny}
	}
	enrollment := fleetgen.Template()[enrollmentFile].Data
	for i := range 1000 {
		dir := "clusters/" + fleetgen.ClusterName(i)
		spread[dir+"/"+fleet.ClusterFile] = gittree.File{Data: clusterYAML(i)}
		spread[dir+"/"+fleet.EnrollmentFile] = gittree.File{Data: enrollment}
	}
	// Link chains: 10,000 links in a ring, each one resolved to the hop limit.
	links := gittree.Files{}
	for i := range 10_000 {
		links[fmt.Sprintf("%s/l%05d.yaml", exampleDir, i)] = gittree.Link(fmt.Sprintf("l%05d.yaml", (i+1)%10_000))
	}
	return []struct {
		name       string
		files      gittree.Files
		overBudget bool
	}{
		{"20000-paths-to-one-1MiB-blob", template(copies), true},
		{"100000-tiny-files-in-one-directory", template(heap), true},
		{"95000-tiny-files-in-1000-clusters", template(spread), false},
		{"directories-10000-deep", template(gittree.Files{exampleDir + "/" + strings.Repeat("d/", 10_000) + "x.yaml": gittree.Regular("x: 1\n")}), true},
		{"10000-links-in-a-ring", template(links), true},
	}
}

func clusterYAML(i int) []byte {
	fsys := fleetgen.Template()
	fleetgen.AddCluster(fsys, fleetgen.ClusterName(i), nil, i, fleetgen.Options{})
	return fsys["clusters/"+fleetgen.ClusterName(i)+"/"+fleet.ClusterFile].Data
}

// BenchmarkLoadHostileHead loads heads built to cost the hub memory through TreeFS, as
// the hub loads a pull request's head, and reports the most heap the load held on top of
// the commit itself (peak-MiB) besides what it allocated in all (B/op).
func BenchmarkLoadHostileHead(b *testing.B) {
	for _, h := range hostileHeads() {
		b.Run(h.name, func(b *testing.B) {
			objects, tree := gittree.New(b, h.files)
			var peak uint64
			b.ReportAllocs()
			for b.Loop() {
				var f *fleet.Fleet
				peak = max(peak, peakHeap(func() { f = fleet.Load(gitsource.NewTreeFS(objects, tree)) }))
				refused := f.OverBudget()
				if c := f.Clusters[example]; c != nil && c.OverBudget() {
					refused = true
				}
				if refused != h.overBudget {
					b.Fatalf("refused %t, want %t: %v", refused, h.overBudget, f.Errors)
				}
			}
			b.ReportMetric(float64(peak)/(1<<20), "peak-MiB")
			runtime.KeepAlive(objects)
		})
	}
}

// heapObjects is the runtime's count of bytes in heap objects, live or not yet swept:
// what the heap holds.
const heapObjects = "/memory/classes/heap/objects:bytes"

// peakHeap runs fn and returns the most the heap held above what it held before,
// sampled every 100µs from another goroutine.
func peakHeap(fn func()) uint64 {
	sample := []metrics.Sample{{Name: heapObjects}}
	read := func() uint64 {
		metrics.Read(sample)
		return sample[0].Value.Uint64()
	}
	runtime.GC()
	base := read()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		peak = base
	)
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Microsecond)
		defer tick.Stop()
		for {
			v := read()
			mu.Lock()
			peak = max(peak, v)
			mu.Unlock()
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	fn()
	v := read()
	close(done)
	wg.Wait()
	return max(peak, v) - base
}

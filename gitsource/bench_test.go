package gitsource_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

// BenchmarkFetchOneChange10k is the hub's work after a merge that changes one cluster of
// a 10,000-cluster fleet: check the remote head, fetch, and compute the changed set.
// Setting the repository up takes minutes, so `make bench` leaves it out; run it with
// go test -run '^$' -bench FetchOneChange10k -benchtime 10x ./gitsource/
func BenchmarkFetchOneChange10k(b *testing.B) {
	repo := gitserver.Start(b).NewRepo(b, "fleet", fleetgen.WriteDir(b, fleetgen.Fleet(10_000, fleetgen.Options{})))
	file := "clusters/" + fleetgen.ClusterName(42) + "/notes.txt"
	change := 0
	commit := func() string {
		change++
		return repo.Commit("main", "change one cluster", map[string][]byte{file: fmt.Appendf(nil, "change %d\n", change)})
	}

	b.Run("go-git", func(b *testing.B) {
		s, err := gitsource.New(gitsource.Options{URL: repo.URL(), Branch: "main"})
		if err != nil {
			b.Fatal(err)
		}
		snap, _, err := s.Update(context.Background(), plumbing.ZeroHash)
		if err != nil {
			b.Fatal(err)
		}
		last := snap.Commit
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			head := commit()
			b.StartTimer()
			snap, ch, err := s.Update(context.Background(), last)
			if err != nil || snap.Commit.String() != head || len(ch.Clusters) != 1 {
				b.Fatalf("update: %v, %+v", err, ch)
			}
			last = snap.Commit
		}
		b.StopTimer()
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "MiB-heap-after")
	})
}

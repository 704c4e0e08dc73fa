package logbudget

import (
	"testing"
	"time"
)

func TestLinesAreLetThroughAtABoundedRateAndTheRestCounted(t *testing.T) {
	for _, perSecond := range []int{0, 5} {
		b := Budget{PerSecond: perSecond}
		want := perSecond
		if want == 0 {
			want = DefaultPerSecond
		}
		start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
		logged := 0
		for i := range 1000 {
			if ok, _ := b.take(start.Add(time.Duration(i) * time.Millisecond / 2)); ok {
				logged++
			}
		}
		if logged != want {
			t.Fatalf("PerSecond %d: %d of 1000 lines in half a second logged, want %d", perSecond, logged, want)
		}
		ok, skipped := b.take(start.Add(time.Second))
		if !ok || skipped != 1000-want {
			t.Fatalf("PerSecond %d: the first line of the next second: logged %v, %d reported skipped, want true, %d", perSecond, ok, skipped, 1000-want)
		}
		if _, skipped := b.take(start.Add(time.Second)); skipped != 0 {
			t.Fatalf("PerSecond %d: %d skipped lines reported twice", perSecond, skipped)
		}
	}
}

package tunnel

import (
	"testing"
	"time"
)

func TestRefusalsAreLoggedAtABoundedRateAndTheRestCounted(t *testing.T) {
	var b logBudget
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	logged := 0
	for i := range 1000 {
		if ok, _ := b.take(start.Add(time.Duration(i) * time.Millisecond / 2)); ok {
			logged++
		}
	}
	if logged != refusalsPerSecond {
		t.Fatalf("%d of 1000 refusals in half a second logged, want %d", logged, refusalsPerSecond)
	}
	ok, skipped := b.take(start.Add(time.Second))
	if !ok || skipped != 1000-refusalsPerSecond {
		t.Fatalf("the first refusal of the next second: logged %v, %d reported skipped, want true, %d", ok, skipped, 1000-refusalsPerSecond)
	}
	if _, skipped := b.take(start.Add(time.Second)); skipped != 0 {
		t.Fatalf("%d skipped refusals reported twice", skipped)
	}
}

package keylock

import (
	"sync/atomic"
	"testing"
)

// A key's holder keeps out the others of that key and nobody else's.
func TestAKeysLockHoldsThatKeyAlone(t *testing.T) {
	var l Locks[string]
	unlockA := l.Lock("a")
	if _, ok := l.TryLock("a"); ok {
		t.Fatal("a taken twice")
	}
	unlockB, ok := l.TryLock("b")
	if !ok {
		t.Fatal("b waits for a")
	}
	unlockB()

	var released atomic.Bool
	got := make(chan bool)
	go func() {
		unlock := l.Lock("a")
		got <- released.Load()
		unlock()
	}()
	released.Store(true)
	unlockA()
	if !<-got {
		t.Fatal("a taken while held")
	}
	if unlock, ok := l.TryLock("a"); !ok {
		t.Fatal("a stays held after its holders let go")
	} else {
		unlock()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.locks) != 0 {
		t.Fatalf("%d keys kept after every holder let go", len(l.locks))
	}
}

// Package keylock serializes work per key, each key with a mutex of its own that exists
// while someone holds or waits for it. The work under such a lock waits on an API, the
// hub cluster's or a forge's; a mutex shared between keys, as a fixed set picked by hash
// would be, would hold other keys' work for as long.
package keylock

import "sync"

// Locks is a mutex per key. The zero value is ready to use.
type Locks[K comparable] struct {
	mu    sync.Mutex
	locks map[K]*lock
}

type lock struct {
	sync.Mutex
	holders int
}

// Lock locks key's mutex and returns its unlock.
func (k *Locks[K]) Lock(key K) (unlock func()) {
	unlock, _ = k.acquire(key, true)
	return unlock
}

// TryLock locks key's mutex unless someone holds it.
func (k *Locks[K]) TryLock(key K) (unlock func(), ok bool) {
	return k.acquire(key, false)
}

func (k *Locks[K]) acquire(key K, wait bool) (func(), bool) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[K]*lock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &lock{}
		k.locks[key] = l
	}
	if !wait {
		// Taken under k.mu: a holder letting go meanwhile cannot drop the entry.
		if !l.TryLock() {
			k.mu.Unlock()
			return nil, false
		}
		l.holders++
		k.mu.Unlock()
	} else {
		l.holders++
		k.mu.Unlock()
		l.Lock()
	}
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.holders--; l.holders == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}, true
}

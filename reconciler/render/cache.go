package render

import "container/list"

// lru is a cache bounded by the bytes its entries are charged, as well as by their
// number: a fleet repository is untrusted, pull requests' plans share the hub's
// Renderer, and one entry may hold tens of MiB, so a bound on entries alone is no bound
// on memory. When an entry does not fit, the least recently used go first; an entry
// charged more than maxEntry is never kept. The caller holds the lock that guards it.
type lru[K comparable, V any] struct {
	// budget bounds the bytes charged to all entries together, maxEntry those of one,
	// and maxEntries their number.
	budget, maxEntry int64
	maxEntries       int
	// size is the bytes charged to the entries held.
	size int64
	// order holds the entries, the most recently used first.
	order   list.List
	entries map[K]*list.Element
}

type lruEntry[K comparable, V any] struct {
	key   K
	value V
	cost  int64
}

func newLRU[K comparable, V any](budget, maxEntry int64, maxEntries int) *lru[K, V] {
	return &lru[K, V]{budget: budget, maxEntry: maxEntry, maxEntries: maxEntries, entries: map[K]*list.Element{}}
}

// get returns the value kept for key, and marks it the most recently used.
func (c *lru[K, V]) get(key K) (V, bool) {
	el, ok := c.entries[key]
	if !ok {
		var zero V
		return zero, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*lruEntry[K, V]).value, true
}

// add keeps value for key, charged cost bytes, evicting the least recently used entries
// to make room. It reports whether the value is kept: not when cost is above maxEntry.
func (c *lru[K, V]) add(key K, value V, cost int64) bool {
	if cost < 0 || cost > c.maxEntry || cost > c.budget {
		return false
	}
	if el, ok := c.entries[key]; ok {
		c.remove(el)
	}
	for c.order.Len() > 0 && (c.size+cost > c.budget || c.order.Len() >= c.maxEntries) {
		c.remove(c.order.Back())
	}
	c.entries[key] = c.order.PushFront(&lruEntry[K, V]{key: key, value: value, cost: cost})
	c.size += cost
	return true
}

func (c *lru[K, V]) remove(el *list.Element) {
	e := c.order.Remove(el).(*lruEntry[K, V])
	delete(c.entries, e.key)
	c.size -= e.cost
}

// len is the number of entries held, and bytes what they are charged.
func (c *lru[K, V]) len() int     { return c.order.Len() }
func (c *lru[K, V]) bytes() int64 { return c.size }

// Bytes charged for the parts of decoded JSON: about what the Go runtime allocates for
// each on a 64-bit machine, so that footprint comes out near the live heap they hold.
const (
	// A map's header, and each of its slots: a control byte and a key's and a value's
	// headers. A map has a group of 8 slots at least, and keeps at most 7 in 8 full.
	mapBytes, mapSlotBytes, mapMinSlots = 48, 33, 8
	// A slice's header, boxed in the interface that holds it, and each element's
	// interface.
	sliceBytes, sliceElemBytes = 24, 16
	// A string's header, boxed in the interface that holds it (a map key's is in the
	// map's slot), and the size class its bytes are rounded up to; a boxed scalar.
	stringBytes, stringAlign, scalarBytes = 16, 8, 8
)

// footprint estimates the bytes that objects decoded from JSON hold in memory: several
// times their JSON. It charges every map, list and string it meets as if none of them
// were shared.
func footprint(objects []map[string]any) int64 {
	n := int64(sliceBytes + 8*cap(objects))
	for _, o := range objects {
		n += valueFootprint(o)
	}
	return n
}

func valueFootprint(v any) int64 {
	switch x := v.(type) {
	case map[string]any:
		slots := mapMinSlots
		for slots*7/8 < len(x) {
			slots *= 2
		}
		n := int64(mapBytes + mapSlotBytes*slots)
		for k, e := range x {
			n += stringData(k) + valueFootprint(e)
		}
		return n
	case []any:
		n := int64(sliceBytes + sliceElemBytes*cap(x))
		for _, e := range x {
			n += valueFootprint(e)
		}
		return n
	case string:
		return stringBytes + stringData(x)
	case nil:
		return 0
	}
	return scalarBytes
}

// stringData is what a string's bytes take on the heap.
func stringData(s string) int64 {
	return int64((len(s) + stringAlign - 1) &^ (stringAlign - 1))
}

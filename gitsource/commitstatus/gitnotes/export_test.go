package gitnotes

// Held is how many git objects b holds in memory.
func (b *Backend) Held() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.store.Objects)
}

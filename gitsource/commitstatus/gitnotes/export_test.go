package gitnotes

// Held is how many git objects b holds in memory.
func (b *Backend) Held() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.store.Objects)
}

// HeldObjects are the commits, trees and note blobs b's store holds, and notes the
// notes whose contents it holds beside.
func (b *Backend) HeldObjects() (commits, trees, blobs, notes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.store.Commits), len(b.store.Trees), len(b.store.Blobs), b.notes.Len()
}

// HeldNotes is how many notes' contents a backend holds at most.
const HeldNotes = heldNotes

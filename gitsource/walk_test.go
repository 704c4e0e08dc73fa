package gitsource

import (
	"fmt"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
)

// A directory entry that names a commit (a submodule) names one of another repository.
// Pruning keeps no commit of the copy through it, even one the copy holds: it would keep
// that commit without its tree, and the copy would then claim a commit it cannot read,
// and ask the server for it never again.
func TestPruningKeepsNoCommitThroughASubmoduleEntry(t *testing.T) {
	s := newStore()
	put := func(typ plumbing.ObjectType, data string) plumbing.Hash {
		o := newStoredObject(typ, []byte(data))
		s.add([]*storedObject{o})
		return o.hash
	}
	entry := func(mode, name string, h plumbing.Hash) string { return mode + " " + name + "\x00" + string(h[:]) }
	commit := func(tree plumbing.Hash) string {
		return fmt.Sprintf("tree %s\nauthor A <a@example.com> 0 +0000\ncommitter A <a@example.com> 0 +0000\n\nc\n", tree)
	}
	blob := put(plumbing.BlobObject, "x")
	other := put(plumbing.CommitObject, commit(put(plumbing.TreeObject, entry("100644", "a", blob))))
	root := put(plumbing.CommitObject, commit(put(plumbing.TreeObject, entry("160000", "sub", other))))

	n, err := s.pruned(func(plumbing.ReferenceName) bool { return true }, []plumbing.Hash{root}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !n.have(root) {
		t.Fatal("the root commit was pruned")
	}
	if n.have(other) {
		t.Fatal("the commit a submodule entry names was kept, without its tree")
	}
}

package gitsource

import (
	"fmt"
	"slices"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// A copy is pruned once it holds more than twice what was reachable after its last
// pruning, plus this slack. Pruning walks what is kept (some 10 milliseconds for the
// branch of 10,000 clusters), so a large fleet's copy, to which each push adds a
// clusters/ directory of some 400 KiB, is pruned every few dozen fetches, and a small
// one every few.
const (
	pruneSlackBytes   = 4 << 20
	pruneSlackObjects = 10_000
)

// grown reports whether the store holds enough that no ref needs any more for a
// pruning to be worth its walk.
func (s *store) grown() bool {
	st := s.stats()
	return st.Bytes > 2*s.live.Bytes+pruneSlackBytes || st.Objects > 2*s.live.Objects+pruneSlackObjects
}

// pruned is a new store with the refs of s that keep says to keep, and only the
// objects of roots with up to depth commits of history each (1: the roots alone).
// s itself is not changed: a Snapshot or PullRequest handed out before reads on from it.
func (s *store) pruned(keep func(plumbing.ReferenceName) bool, roots []plumbing.Hash, depth int) (*store, error) {
	objs, shallow, err := reachable(s, roots, depth)
	if err != nil {
		return nil, err
	}
	n := newStore()
	n.objects = objs
	for _, o := range objs {
		n.size += int64(len(o.data))
	}
	n.shallow = shallow
	for name, h := range s.refs {
		if keep(name) && objs[h] != nil {
			n.refs[name] = h
		}
	}
	n.live = n.stats()
	return n, nil
}

// reachable walks roots and their history, generation by generation up to depth,
// and every directory and file of the commits it reaches. The shallow commits of the
// result are those with a parent it does not hold, so a server is told exactly where
// the history stops.
func reachable(s *store, roots []plumbing.Hash, depth int) (map[plumbing.Hash]*storedObject, []plumbing.Hash, error) {
	objs, commits, err := walk(s, roots, depth, nil)
	if err != nil {
		return nil, nil, err
	}
	var shallow []plumbing.Hash
	for _, c := range commits {
		for _, p := range c.ParentHashes {
			if objs[p] == nil {
				shallow = append(shallow, c.Hash)
				break
			}
		}
	}
	return objs, shallow, nil
}

// walk finds what reachable does, leaving out known objects and what only they lead
// to, and returns the commits it decoded too.
func walk(s *store, roots []plumbing.Hash, depth int, known map[plumbing.Hash]*storedObject) (map[plumbing.Hash]*storedObject, []*object.Commit, error) {
	objs := map[plumbing.Hash]*storedObject{}
	seen := func(h plumbing.Hash) bool { return objs[h] != nil || known[h] != nil }
	var commits []*object.Commit
	frontier := slices.Clone(roots)
	for gen := 0; gen < depth && len(frontier) > 0; gen++ {
		var next []plumbing.Hash
		for _, h := range frontier {
			o := s.get(h)
			if o == nil || seen(h) || o.typ != plumbing.CommitObject {
				continue
			}
			c, err := object.DecodeCommit(s, o)
			if err != nil {
				return nil, nil, fmt.Errorf("gitsource: commit %s: %w", h, err)
			}
			objs[h] = o
			commits = append(commits, c)
			next = append(next, c.ParentHashes...)
		}
		frontier = next
	}
	trees := make([]plumbing.Hash, 0, len(commits))
	for _, c := range commits {
		trees = append(trees, c.TreeHash)
	}
	for len(trees) > 0 {
		h := trees[len(trees)-1]
		trees = trees[:len(trees)-1]
		if seen(h) {
			continue
		}
		t := s.get(h)
		if t == nil {
			// A copy holds every tree of the commits it holds; a missing one leaves
			// its commit unreadable, as it already was.
			continue
		}
		objs[h] = t
		for data := t.data; len(data) > 0; {
			e, rest, err := nextEntry(data)
			if err != nil {
				return nil, nil, fmt.Errorf("gitsource: tree %s: %w", h, err)
			}
			switch {
			case e.isDir():
				trees = append(trees, e.hash)
			case e.isSubmodule():
				// Another repository's commit. The copy may hold a commit of that name
				// (a pull request may point a submodule at another's head), but kept
				// from here it would be kept without its tree.
			default:
				if o := s.get(e.hash); o != nil && known[e.hash] == nil {
					objs[e.hash] = o
				}
			}
			data = rest
		}
	}
	return objs, commits, nil
}

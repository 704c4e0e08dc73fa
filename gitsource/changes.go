package gitsource

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
)

// Changes are the paths that differ between two commits' trees. They name no file of
// a fleet: what a changed path means (one cluster, or every one) is the fleet model's
// to say.
type Changes struct {
	// All is set when any path may have changed: the first read, a rewritten history,
	// a last commit no longer known, or more than MaxChangedPaths changed paths. Paths
	// is then nil.
	All bool
	// Reason says why All is set, for logs.
	Reason string
	// Paths are the changed paths, sorted, named down to the second level: a changed
	// top-level file is named itself ("fleet.yaml"); a top-level directory whose
	// content changed is named by each of its entries that changed ("presets/a100",
	// "clusters/gpu-a"), never deeper. A path that was removed or renamed away is
	// among them.
	Paths []string
	// Commits are the commits of a push of several, newest first, each with the paths
	// it changed, for attributing each change to the newest commit that made it: set
	// when the head descends from the last reconciled commit through more than one
	// commit (within PushDepth), nil otherwise, when every change is the head's. A
	// change in Paths that no commit names (one whose parents the copy does not hold)
	// is the head's.
	Commits []PushedCommit

	// st, old and new are the compared trees, for FirstChange.
	st       *store
	old, new plumbing.Hash
}

// Empty reports whether no path changed.
func (c Changes) Empty() bool { return !c.All && len(c.Paths) == 0 }

// FirstChange names, for a reader, the first changed file at or below p, one of
// Paths: "presets/a100/kustomization.yaml" for "presets/a100". It is p itself when p
// is a file, when nothing below it can be read, or past a depth of maxReasonDepth.
// It reads only the directories on the way, so a caller may ask once the meaning of
// a path calls for a file to point at.
func (c Changes) FirstChange(p string) string {
	if c.st == nil {
		return p
	}
	root := func(h plumbing.Hash) treeEntry { return treeEntry{mode: []byte("40000"), name: []byte{}, hash: h} }
	o, n := root(c.old), root(c.new)
	for name := range strings.SplitSeq(p, "/") {
		var err error
		if o, err = c.st.entry(o, name); err != nil {
			return p
		}
		if n, err = c.st.entry(n, name); err != nil {
			return p
		}
	}
	first, err := firstChange(c.st, p, o, n, 0)
	if err != nil {
		return p
	}
	return first
}

// MaxChangedPaths is the most changed paths a comparison keeps: every cluster of a
// fleet of 10,000, the most a hub is built for, changed at once. Past it, re-reading
// everything is what the change costs anyway, and the paths are not kept.
const MaxChangedPaths = 10_000

var errTooManyChanged = errors.New("too many changed paths")

// diff compares two trees of st. Entries are compared by hash and mode in the order
// git sorts them, straight from the trees' bytes, and a directory is read only where
// its entries differ, and only at the top level: the cost follows the size of the
// change and of the changed top-level directories, not of the fleet. A change of one
// cluster among 10,000 reads the two roots and the two clusters/ directories, and
// allocates nothing per unchanged entry.
func diff(ctx context.Context, st *store, old, new plumbing.Hash) (Changes, error) {
	oldRoot, err := st.tree(old)
	if err != nil {
		return Changes{}, err
	}
	newRoot, err := st.tree(new)
	if err != nil {
		return Changes{}, err
	}
	var paths []string
	keep := func(p string) error {
		if len(paths) == MaxChangedPaths {
			return errTooManyChanged
		}
		paths = append(paths, p)
		return nil
	}
	err = diffEntries(oldRoot, newRoot, func(o, n treeEntry) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		top := string(o.or(n).name)
		oldDir, err := st.subtree(o)
		if err != nil {
			return err
		}
		newDir, err := st.subtree(n)
		if err != nil {
			return err
		}
		if oldDir == nil && newDir == nil {
			return keep(top)
		}
		named := false
		err = diffEntries(oldDir, newDir, func(o, n treeEntry) error {
			named = true
			return keep(top + "/" + string(o.or(n).name))
		})
		if err == nil && !named {
			// A directory whose entries compare equal yet whose hash differs (an
			// unsorted tree, say) still changed.
			err = keep(top)
		}
		return err
	})
	if errors.Is(err, errTooManyChanged) {
		return Changes{All: true, Reason: fmt.Sprintf("more than %d paths changed", MaxChangedPaths)}, nil
	}
	if err != nil {
		return Changes{}, fmt.Errorf("gitsource: comparing trees %s and %s: %w", old, new, err)
	}
	// Git's order puts a directory's name as if it ended in "/"; callers get plain
	// sorted paths, each once: a file and a directory of one name, both changed
	// without an entry to name, are one path.
	slices.Sort(paths)
	return Changes{Paths: slices.Compact(paths), st: st, old: old, new: new}, nil
}

// maxReasonDepth bounds how deep firstChange looks for a changed file to name: a
// reason is for a reader, and a head may nest directories without end.
const maxReasonDepth = 16

// firstChange names the first changed file at or below p, whose entries are o in the
// old tree and n in the new one.
func firstChange(st *store, p string, o, n treeEntry, depth int) (string, error) {
	if depth >= maxReasonDepth {
		return p, nil
	}
	oldDir, err := st.subtree(o)
	if err != nil {
		return "", err
	}
	newDir, err := st.subtree(n)
	if err != nil {
		return "", err
	}
	first := p
	found := errors.New("found")
	err = diffEntries(oldDir, newDir, func(o, n treeEntry) error {
		var err error
		if first, err = firstChange(st, p+"/"+string(o.or(n).name), o, n, depth+1); err != nil {
			return err
		}
		return found
	})
	if err != nil && !errors.Is(err, found) {
		return "", err
	}
	return first, nil
}

// treeEntry is one entry of a tree as stored: "<mode> <name>\x00<hash>". The zero
// value is an absent entry.
type treeEntry struct {
	mode, name []byte
	hash       plumbing.Hash
}

func (e treeEntry) present() bool { return e.name != nil }

func (e treeEntry) or(other treeEntry) treeEntry {
	if e.present() {
		return e
	}
	return other
}

func (e treeEntry) isDir() bool { return string(bytes.TrimLeft(e.mode, "0")) == "40000" }

// isSubmodule reports whether e names a commit: a submodule, a gitlink in git's words.
func (e treeEntry) isSubmodule() bool { return string(e.mode) == "160000" }

// nextEntry splits the first entry off a tree's bytes.
func nextEntry(data []byte) (treeEntry, []byte, error) {
	sp := bytes.IndexByte(data, ' ')
	nul := bytes.IndexByte(data, 0)
	if sp <= 0 || nul <= sp+1 || len(data) < nul+1+len(plumbing.ZeroHash) {
		return treeEntry{}, nil, errors.New("malformed tree")
	}
	e := treeEntry{mode: data[:sp], name: data[sp+1 : nul]}
	copy(e.hash[:], data[nul+1:])
	return e, data[nul+1+len(plumbing.ZeroHash):], nil
}

// compareEntries orders entries as git sorts a tree.
func compareEntries(a, b treeEntry) int { return gitOrder(a.name, a.isDir(), b.name, b.isDir()) }

// gitOrder orders two entries of a tree, named a and b and directories or not, as git
// sorts them: by name, a directory's as if it ended in a slash. The comparison of two
// heads reads names as bytes, TreeFS as strings.
func gitOrder[T ~string | ~[]byte](a T, aDir bool, b T, bDir bool) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return cmp.Compare(a[i], b[i])
		}
	}
	next := func(s T, dir bool) byte {
		switch {
		case len(s) > n:
			return s[n]
		case dir:
			return '/'
		}
		return 0
	}
	return cmp.Compare(next(a, aDir), next(b, bDir))
}

// diffEntries calls each for every entry of old or new that the other tree lacks or
// holds with another hash or mode; a nil tree has no entries.
//
// Entries the two trees store as the same bytes, at the same place counted from
// either end, are the same entries: they are skipped at the speed of a byte
// comparison, so that a change to one entry among 10,000 compares a handful.
func diffEntries(old, new []byte, each func(o, n treeEntry) error) error {
	for same := commonPrefix(old, new); ; {
		_, rest, err := nextEntry(old)
		size := len(old) - len(rest)
		if err != nil || size > same {
			break
		}
		old, new, same = rest, new[size:], same-size
	}
	tail := commonSuffix(old, new)
	var o, n treeEntry
	var err error
	for len(old) > 0 || len(new) > 0 || o.present() || n.present() {
		if !o.present() && !n.present() && len(old) == len(new) && len(old) <= tail {
			// What is left is the same bytes in both, split at the same places: no
			// change, even where they do not parse, which TreeFS refuses on reading.
			return nil
		}
		if !o.present() && len(old) > 0 {
			if o, old, err = nextEntry(old); err != nil {
				return err
			}
		}
		if !n.present() && len(new) > 0 {
			if n, new, err = nextEntry(new); err != nil {
				return err
			}
		}
		c := 0
		switch {
		case !n.present():
			c = -1
		case !o.present():
			c = 1
		default:
			c = compareEntries(o, n)
		}
		switch {
		case c < 0:
			err = each(o, treeEntry{})
			o = treeEntry{}
		case c > 0:
			err = each(treeEntry{}, n)
			n = treeEntry{}
		default:
			if o.hash != n.hash || !bytes.Equal(o.mode, n.mode) {
				err = each(o, n)
			}
			o, n = treeEntry{}, treeEntry{}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// commonPrefix is the length of the longest prefix a and b share.
func commonPrefix(a, b []byte) int {
	n, i := min(len(a), len(b)), 0
	for ; i+64 <= n && bytes.Equal(a[i:i+64], b[i:i+64]); i += 64 {
	}
	for ; i < n && a[i] == b[i]; i++ {
	}
	return i
}

// commonSuffix is the length of the longest suffix a and b share.
func commonSuffix(a, b []byte) int {
	n, i := min(len(a), len(b)), 0
	for ; i+64 <= n && bytes.Equal(a[len(a)-i-64:len(a)-i], b[len(b)-i-64:len(b)-i]); i += 64 {
	}
	for ; i < n && a[len(a)-1-i] == b[len(b)-1-i]; i++ {
	}
	return i
}

// tree is the bytes of the tree h.
func (s *store) tree(h plumbing.Hash) ([]byte, error) {
	o := s.get(h)
	if o == nil || o.typ != plumbing.TreeObject {
		return nil, fmt.Errorf("tree %s: %w", h, plumbing.ErrObjectNotFound)
	}
	return o.data, nil
}

// subtree is the bytes of the directory e, or nil when e is absent or not a
// directory: a file has no entries to compare.
func (s *store) subtree(e treeEntry) ([]byte, error) {
	if !e.present() || !e.isDir() {
		return nil, nil
	}
	return s.tree(e.hash)
}

// entry is the entry name of the directory e, or an absent entry when e is absent, is
// not a directory, or has no such entry.
func (s *store) entry(e treeEntry, name string) (treeEntry, error) {
	data, err := s.subtree(e)
	if err != nil {
		return treeEntry{}, err
	}
	for len(data) > 0 {
		var ent treeEntry
		if ent, data, err = nextEntry(data); err != nil {
			return treeEntry{}, err
		}
		if string(ent.name) == name {
			return ent, nil
		}
	}
	return treeEntry{}, nil
}

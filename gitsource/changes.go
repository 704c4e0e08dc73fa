package gitsource

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
)

// Changes is what a new head asks the hub to re-read.
type Changes struct {
	// All is set when a fleet-wide input changed, or the history was rewritten: every
	// cluster must be re-read.
	All bool
	// Reason says why All is set, for logs.
	Reason string
	// Clusters are the directories under clusters/ with a change below them, sorted;
	// a directory that was removed or renamed away is among them.
	Clusters []string
}

// Empty reports whether nothing the hub reads changed.
func (c Changes) Empty() bool { return !c.All && len(c.Clusters) == 0 }

// fleetWide are the paths whose change touches every cluster.
func fleetWide(p string) bool {
	return p == "fleet.yaml" || p == ".sops.yaml" || p == "presets" || strings.HasPrefix(p, "presets/")
}

// diff compares two trees of st. Entries are compared by hash and mode in the order
// git sorts them, straight from the trees' bytes, and a directory is read only where
// its entries differ: the cost follows the size of the change and of the clusters/
// directory, not of the fleet. A change of one cluster among 10,000 reads the two
// roots and the two clusters/ directories, and allocates nothing per entry.
func diff(ctx context.Context, st *store, old, new plumbing.Hash) (Changes, error) {
	oldRoot, err := st.tree(old)
	if err != nil {
		return Changes{}, err
	}
	newRoot, err := st.tree(new)
	if err != nil {
		return Changes{}, err
	}
	var ch Changes
	clusters := map[string]bool{}
	err = diffEntries(oldRoot, newRoot, func(o, n treeEntry) error {
		name := string(o.or(n).name)
		switch {
		case fleetWide(name):
			if !ch.All {
				p, err := firstChange(st, name, o, n, 0)
				if err != nil {
					return err
				}
				ch.All, ch.Reason = true, p+" changed"
			}
		case name == "clusters":
			oldDir, err := st.subtree(o)
			if err != nil {
				return err
			}
			newDir, err := st.subtree(n)
			if err != nil {
				return err
			}
			// A file directly under clusters/ counts under its own name: the loader
			// ignores it, so re-reading that name is harmless. Past
			// maxChangedClusters names, re-reading every cluster is what the change
			// costs anyway, and the names are not kept.
			err = diffEntries(oldDir, newDir, func(o, n treeEntry) error {
				if len(clusters) == maxChangedClusters {
					return errTooManyChanged
				}
				clusters[string(o.or(n).name)] = true
				return nil
			})
			if errors.Is(err, errTooManyChanged) {
				clear(clusters)
				ch.All, ch.Reason = true, fmt.Sprintf("more than %d cluster directories changed", maxChangedClusters)
				err = nil
			}
			return err
		}
		return ctx.Err()
	})
	if err != nil {
		return Changes{}, fmt.Errorf("gitsource: comparing trees %s and %s: %w", old, new, err)
	}
	ch.Clusters = slices.Sorted(maps.Keys(clusters))
	return ch, nil
}

// maxChangedClusters is the most changed cluster names a comparison keeps: a fleet
// of 10,000 clusters, the most a hub is built for, changed all at once.
const maxChangedClusters = 10_000

var errTooManyChanged = errors.New("too many changed clusters")

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

// compareEntries orders entries as git sorts a tree: by name, a directory's name as
// if it ended in a slash.
func compareEntries(a, b treeEntry) int {
	n := min(len(a.name), len(b.name))
	if c := bytes.Compare(a.name[:n], b.name[:n]); c != 0 {
		return c
	}
	next := func(e treeEntry) byte {
		switch {
		case len(e.name) > n:
			return e.name[n]
		case e.isDir():
			return '/'
		}
		return 0
	}
	return cmp.Compare(next(a), next(b))
}

// diffEntries calls each for every entry of old or new that the other tree lacks or
// holds with another hash or mode; a nil tree has no entries.
func diffEntries(old, new []byte, each func(o, n treeEntry) error) error {
	var o, n treeEntry
	var err error
	for len(old) > 0 || len(new) > 0 || o.present() || n.present() {
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

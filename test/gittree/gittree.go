// Package gittree writes Git commits from a map of paths, for tests that read a tree the
// way the hub reads a pull request's head: symbolic links with any target, deep nesting,
// thousands of paths naming one blob, and trees no checkout could produce (an entry named
// "..", two entries of one name, a name that is both a file and a directory).
//
// Trees are written object by object into any go-git storer, never through a worktree,
// so that nothing on disk stands between the test and what a commit can hold.
package gittree

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"
	"unsafe"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/storage/memory"
)

// File is one entry of a tree: a blob with its mode.
type File struct {
	Data []byte
	// Mode is filemode.Regular when zero.
	Mode filemode.FileMode
}

// Regular is a file of mode 100644.
func Regular(data string) File { return File{Data: []byte(data), Mode: filemode.Regular} }

// Link is a symbolic link to target, stored as Git stores one: a blob holding the target.
func Link(target string) File { return File{Data: []byte(target), Mode: filemode.Symlink} }

// Files are the entries of a commit by slash-separated path. A path is split at every
// slash and nothing else is checked, so "a/../b" makes a directory named ".." and "a//b"
// an entry with an empty name, which go-git refuses to decode.
type Files map[string]File

// FromMapFS turns an in-memory fleet (test/fleetgen) into Files, every file regular.
func FromMapFS(fsys fstest.MapFS) Files {
	out := make(Files, len(fsys))
	for p, f := range fsys {
		if f.Mode.IsDir() {
			continue
		}
		out[p] = File{Data: f.Data, Mode: filemode.Regular}
	}
	return out
}

// New writes files as a tree into a new in-memory repository and returns the
// repository's objects and the tree's hash, ready for gitsource.NewTreeFS.
func New(tb testing.TB, files Files) (storer.EncodedObjectStorer, plumbing.Hash) {
	tb.Helper()
	s := memory.NewStorage()
	h, err := WriteTree(s, files)
	if err != nil {
		tb.Fatalf("gittree: %v", err)
	}
	return s, h
}

// WriteCommit writes files as a commit with the given parents into s and returns its hash.
// The author and date are fixed, so the same files and parents give the same commit.
func WriteCommit(s storer.EncodedObjectStorer, files Files, msg string, parents ...plumbing.Hash) (plumbing.Hash, error) {
	tree, err := WriteTree(s, files)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	sig := object.Signature{Name: "gittree", Email: "gittree@flotilla.invalid", When: time.Unix(1_700_000_000, 0).UTC()}
	c := &object.Commit{Author: sig, Committer: sig, Message: msg, TreeHash: tree, ParentHashes: parents}
	obj := s.NewEncodedObject()
	if err := c.Encode(obj); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("encoding the commit: %w", err)
	}
	return s.SetEncodedObject(obj)
}

// WriteTree writes files as a tree into s and returns the root tree's hash. Blobs are
// hashed once per distinct slice, so twenty thousand paths sharing one large Data cost
// one hash.
func WriteTree(s storer.EncodedObjectStorer, files Files) (plumbing.Hash, error) {
	w := writer{s: s, blobs: map[sliceKey]plumbing.Hash{}}
	root := &dir{}
	for p, f := range files {
		if strings.ContainsRune(p, 0) {
			return plumbing.ZeroHash, fmt.Errorf("path %q holds a NUL byte, which a tree cannot store", p)
		}
		parts := strings.Split(p, "/")
		d := root
		for _, name := range parts[:len(parts)-1] {
			d = d.sub(name)
		}
		d.files = append(d.files, named{name: parts[len(parts)-1], file: f})
	}
	return w.tree(root)
}

// WriteEntries writes a tree of entries into s exactly as given, and returns its hash:
// for a tree out of git's order, which go-git's encoder refuses, or one naming a tree
// written before from many places, which Files would spell out path by path.
func WriteEntries(s storer.EncodedObjectStorer, entries ...object.TreeEntry) (plumbing.Hash, error) {
	var b []byte
	for _, e := range entries {
		b = append(append(fmt.Appendf(b, "%o %s", uint32(e.Mode), e.Name), 0), e.Hash[:]...)
	}
	return writeObject(s, plumbing.TreeObject, b)
}

// WriteBlob writes data as a blob into s and returns its hash.
func WriteBlob(s storer.EncodedObjectStorer, data []byte) (plumbing.Hash, error) {
	return writeObject(s, plumbing.BlobObject, data)
}

func writeObject(s storer.EncodedObjectStorer, typ plumbing.ObjectType, data []byte) (plumbing.Hash, error) {
	obj := s.NewEncodedObject()
	obj.SetType(typ)
	obj.SetSize(int64(len(data)))
	w, err := obj.Writer()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if _, err := w.Write(data); err != nil {
		return plumbing.ZeroHash, err
	}
	if err := w.Close(); err != nil {
		return plumbing.ZeroHash, err
	}
	return s.SetEncodedObject(obj)
}

// dir is a directory being built; a name may appear among both files and dirs, or twice
// among files when paths collide, and is written as it stands.
type dir struct {
	files []named
	dirs  map[string]*dir
}

type named struct {
	name string
	file File
}

func (d *dir) sub(name string) *dir {
	if d.dirs == nil {
		d.dirs = map[string]*dir{}
	}
	s, ok := d.dirs[name]
	if !ok {
		s = &dir{}
		d.dirs[name] = s
	}
	return s
}

// sliceKey names a slice by its backing array and length: the same Data shared by many
// paths is hashed once.
type sliceKey struct {
	p *byte
	n int
}

type writer struct {
	s     storer.EncodedObjectStorer
	blobs map[sliceKey]plumbing.Hash
}

func (w *writer) blob(data []byte) (plumbing.Hash, error) {
	k := sliceKey{unsafe.SliceData(data), len(data)}
	if h, ok := w.blobs[k]; ok {
		return h, nil
	}
	h, err := WriteBlob(w.s, data)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	w.blobs[k] = h
	return h, nil
}

// tree writes d and everything below it. Subdirectories are written iteratively from the
// deepest up, so that a tree nested tens of thousands deep needs no deep Go stack.
func (w *writer) tree(root *dir) (plumbing.Hash, error) {
	type frame struct {
		d    *dir
		name string
		up   int // index of the parent frame; -1 for the root
	}
	order := []frame{{d: root, up: -1}}
	for i := 0; i < len(order); i++ {
		for name, sub := range order[i].d.dirs {
			order = append(order, frame{d: sub, name: name, up: i})
		}
	}
	entries := make([][]object.TreeEntry, len(order))
	for i := len(order) - 1; i >= 0; i-- {
		f := order[i]
		for _, n := range f.d.files {
			h, err := w.blob(n.file.Data)
			if err != nil {
				return plumbing.ZeroHash, err
			}
			mode := n.file.Mode
			if mode == filemode.Empty {
				mode = filemode.Regular
			}
			entries[i] = append(entries[i], object.TreeEntry{Name: n.name, Mode: mode, Hash: h})
		}
		// Git sorts a tree's entries as if directories' names ended in a slash.
		slices.SortStableFunc(entries[i], func(a, b object.TreeEntry) int { return cmp.Compare(sortName(a), sortName(b)) })
		h, err := WriteEntries(w.s, entries[i]...)
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("tree %q: %w", f.name, err)
		}
		if f.up < 0 {
			return h, nil
		}
		entries[f.up] = append(entries[f.up], object.TreeEntry{Name: f.name, Mode: filemode.Dir, Hash: h})
		entries[i] = nil
	}
	panic("unreachable: the root is the first frame")
}

func sortName(e object.TreeEntry) string {
	if e.Mode == filemode.Dir {
		return e.Name + "/"
	}
	return e.Name
}

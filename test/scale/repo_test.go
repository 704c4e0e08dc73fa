package scale

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage"

	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

// newFleetRepo creates the repository name on srv holding files. The git server's
// working clone stages one file at a time, reading and writing its whole index each
// time, which for the twenty thousand files of ten thousand clusters takes hours: the
// first commit holds what is outside clusters/, and a second one, written straight
// into the bare repository's object store, adds clusters/.
func newFleetRepo(tb testing.TB, srv *gitserver.Server, name string, files fstest.MapFS, writeDir func(fstest.MapFS) string) *gitserver.Repo {
	tb.Helper()
	rest, clusters := fstest.MapFS{}, map[string][]byte{}
	for p, f := range files {
		if rel, ok := strings.CutPrefix(p, "clusters/"); ok {
			clusters[rel] = f.Data
		} else {
			rest[p] = f
		}
	}
	repo := srv.NewRepo(tb, name, writeDir(rest))
	if err := addTree(srv.Path(name), "clusters", clusters); err != nil {
		tb.Fatalf("adding clusters/ to %s: %v", name, err)
	}
	return repo
}

// addTree commits files under dir on main of the bare repository at bare.
func addTree(bare, dir string, files map[string][]byte) error {
	r, err := git.PlainOpen(bare)
	if err != nil {
		return err
	}
	ref, err := r.Reference(plumbing.NewBranchReferenceName("main"), true)
	if err != nil {
		return err
	}
	parent, err := r.CommitObject(ref.Hash())
	if err != nil {
		return err
	}
	root, err := parent.Tree()
	if err != nil {
		return err
	}
	sub, err := writeTree(r.Storer, files)
	if err != nil {
		return err
	}
	entries := slices.DeleteFunc(slices.Clone(root.Entries), func(e object.TreeEntry) bool { return e.Name == dir })
	entries = append(entries, object.TreeEntry{Name: dir, Mode: filemode.Dir, Hash: sub})
	top, err := putTree(r.Storer, entries)
	if err != nil {
		return err
	}
	sig := object.Signature{Name: "Fleet Owner", Email: "owner@example.com", When: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	c := &object.Commit{Author: sig, Committer: sig, Message: "add " + fmt.Sprint(len(files)) + " files under " + dir + "/\n", TreeHash: top, ParentHashes: []plumbing.Hash{parent.Hash}}
	obj := r.Storer.NewEncodedObject()
	if err := c.Encode(obj); err != nil {
		return err
	}
	h, err := r.Storer.SetEncodedObject(obj)
	if err != nil {
		return err
	}
	return r.Storer.SetReference(plumbing.NewHashReference(ref.Name(), h))
}

// writeTree writes files (slash-separated paths) as a tree and returns its hash.
func writeTree(s storage.Storer, files map[string][]byte) (plumbing.Hash, error) {
	var entries []object.TreeEntry
	subdirs := map[string]map[string][]byte{}
	for p, data := range files {
		first, rest, nested := strings.Cut(p, "/")
		if nested {
			if subdirs[first] == nil {
				subdirs[first] = map[string][]byte{}
			}
			subdirs[first][rest] = data
			continue
		}
		obj := s.NewEncodedObject()
		obj.SetType(plumbing.BlobObject)
		w, err := obj.Writer()
		if err != nil {
			return plumbing.ZeroHash, err
		}
		_, err = w.Write(data)
		if err = errors.Join(err, w.Close()); err != nil {
			return plumbing.ZeroHash, err
		}
		h, err := s.SetEncodedObject(obj)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		entries = append(entries, object.TreeEntry{Name: first, Mode: filemode.Regular, Hash: h})
	}
	for name, sub := range subdirs {
		h, err := writeTree(s, sub)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		entries = append(entries, object.TreeEntry{Name: name, Mode: filemode.Dir, Hash: h})
	}
	return putTree(s, entries)
}

// putTree stores a tree of entries in git's order: by name, a directory's as if it
// ended in a slash.
func putTree(s storage.Storer, entries []object.TreeEntry) (plumbing.Hash, error) {
	key := func(e object.TreeEntry) string {
		if e.Mode == filemode.Dir {
			return e.Name + "/"
		}
		return e.Name
	}
	slices.SortFunc(entries, func(a, b object.TreeEntry) int { return strings.Compare(key(a), key(b)) })
	obj := s.NewEncodedObject()
	if err := (&object.Tree{Entries: entries}).Encode(obj); err != nil {
		return plumbing.ZeroHash, err
	}
	return s.SetEncodedObject(obj)
}

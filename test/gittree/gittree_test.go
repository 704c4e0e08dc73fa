package gittree_test

import (
	"testing"

	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/flotilla-gitops/flotilla/test/gittree"
)

func TestTreesHoldWhatTheFilesSay(t *testing.T) {
	big := make([]byte, 1<<20)
	files := gittree.Files{
		"a/b/c.yaml": gittree.Regular("c: 1\n"),
		"a/link":     gittree.Link("b/c.yaml"),
		"run.sh":     {Data: []byte("#!/bin/sh\n"), Mode: filemode.Executable},
		"dup/x":      gittree.Regular("file"),
		"dup/x/y":    gittree.Regular("below"),
		"up/../z":    gittree.Regular("z"),
	}
	for _, p := range []string{"copies/1", "copies/2", "copies/3"} {
		files[p] = gittree.File{Data: big}
	}
	tree, err := object.GetTree(gittree.New(t, files))
	if err != nil {
		t.Fatal(err)
	}

	want := map[string]struct {
		mode filemode.FileMode
		size int64
	}{
		"a/b/c.yaml": {filemode.Regular, 5},
		"a/link":     {filemode.Symlink, 8},
		"run.sh":     {filemode.Executable, 10},
		"copies/1":   {filemode.Regular, 1 << 20},
	}
	for p, w := range want {
		e, err := tree.FindEntry(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		f, err := tree.TreeEntryFile(e)
		if err != nil || e.Mode != w.mode || f.Size != w.size {
			t.Errorf("%s: mode %v, size %d, %v; want %v, %d", p, e.Mode, f.Size, err, w.mode, w.size)
		}
	}
	// Paths to one content share one blob.
	hashes := map[string]bool{}
	copies, err := tree.Tree("copies")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range copies.Entries {
		hashes[e.Hash.String()] = true
	}
	if len(hashes) != 1 {
		t.Errorf("three paths to one content are %d blobs", len(hashes))
	}
	// What no checkout could hold is written as it stands.
	dup, err := tree.Tree("dup")
	if err != nil {
		t.Fatal(err)
	}
	if names := entryNames(dup); len(names) != 2 || names[0] != "x" || names[1] != "x" {
		t.Errorf("dup holds %v, want a file and a directory both named x", names)
	}
	up, err := tree.Tree("up")
	if err != nil {
		t.Fatal(err)
	}
	if names := entryNames(up); len(names) != 1 || names[0] != ".." {
		t.Errorf("up holds %v, want a directory named ..", names)
	}
}

func entryNames(t *object.Tree) []string {
	var out []string
	for _, e := range t.Entries {
		out = append(out, e.Name)
	}
	return out
}

package gitsource

import (
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"

	"github.com/flotilla-gitops/flotilla/test/gittree"
)

// rawTree writes a tree's bytes from "mode name hash" lines, in the order given: the
// order git sorts entries in, which these cases spell out by hand.
func rawTree(t *testing.T, entries ...string) []byte {
	t.Helper()
	var b []byte
	for _, e := range entries {
		f := strings.Fields(e)
		h, err := hex.DecodeString(fmt.Sprintf("%040s", f[2]))
		if err != nil {
			t.Fatal(err)
		}
		b = append(append(append(b, f[0]+" "+f[1]...), 0), h...)
	}
	return b
}

func TestDiffEntriesMatchesNamesInGitOrder(t *testing.T) {
	for _, tc := range []struct {
		name     string
		old, new []string
		want     []string
	}{
		{"equal trees", []string{"100644 a 1", "40000 b 2"}, []string{"100644 a 1", "40000 b 2"}, nil},
		{"a file's mode alone", []string{"100644 run.sh 1"}, []string{"100755 run.sh 1"}, []string{"run.sh"}},
		// A directory sorts as if its name ended in "/": after "gpu-b" and "gpu.c",
		// before "gpu0".
		{"a directory between longer names", []string{"100644 gpu-b 1", "100644 gpu.c 2", "40000 gpu 3", "40000 gpu0 4"},
			[]string{"100644 gpu-b 1", "100644 gpu.c 2", "40000 gpu 5", "40000 gpu0 4"}, []string{"gpu"}},
		{"a file replaced by a directory of its name", []string{"100644 gpu 1", "40000 gpu0 2"}, []string{"40000 gpu 1", "40000 gpu0 2"},
			[]string{"gpu", "gpu"}},
		{"added and removed", []string{"40000 a 1", "40000 c 3"}, []string{"40000 b 2", "40000 c 3", "40000 d 4"}, []string{"a", "b", "d"}},
		{"everything from nothing", nil, []string{"40000 a 1", "100644 b 2"}, []string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			err := diffEntries(rawTree(t, tc.old...), rawTree(t, tc.new...), func(o, n treeEntry) error {
				got = append(got, string(o.or(n).name))
				return nil
			})
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("changed %q (%v), want %q", got, err, tc.want)
			}
		})
	}
}

// FuzzDiffEntriesNamesEveryChangeAndNoOther holds the comparison, which skips the
// bytes two trees share at either end, to what a map of each tree's entries says
// changed. Names are drawn from a few that share prefixes and sort around "/", so that
// a shared run of bytes often ends inside an entry.
func FuzzDiffEntriesNamesEveryChangeAndNoOther(f *testing.F) {
	f.Add([]byte{0x00, 0x11, 0x22, 0x33})
	f.Add([]byte{0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x86})
	f.Add([]byte("gpu clusters of a fleet"))
	names := []string{"g", "g-", "g-1", "g.", "g0", "gg", "g/", "gpu", "gpu-1", "gpu-10", "gpu.a", "gpu0", "h", "h-1", "hh", "i"}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Each byte puts one name in the old tree, the new one or both, as a file or a
		// directory, with one of two contents in each.
		type entry struct {
			dir  bool
			hash byte
		}
		old, new := map[string]entry{}, map[string]entry{}
		for _, b := range data {
			name := strings.TrimSuffix(names[b&0x0f], "/")
			e := entry{dir: b&0x10 != 0, hash: b >> 7}
			switch b >> 5 & 0x3 {
			case 0:
				old[name] = e
			case 1:
				new[name] = e
			case 2:
				old[name], new[name] = e, e
			case 3:
				old[name], new[name] = e, entry{dir: e.dir, hash: e.hash ^ 1}
			}
		}
		// key is an entry's place in git's order: a directory's name as if it ended in
		// "/".
		key := func(name string, dir bool) string {
			if dir {
				return name + "/"
			}
			return name
		}
		encode := func(m map[string]entry) []byte {
			keys := map[string]string{}
			for name, e := range m {
				keys[key(name, e.dir)] = name
			}
			var b []byte
			for _, k := range slices.Sorted(maps.Keys(keys)) {
				name, e := keys[k], m[keys[k]]
				mode := "100644"
				if e.dir {
					mode = "40000"
				}
				var h plumbing.Hash
				h[19] = e.hash
				b = append(append(append(b, mode+" "+name...), 0), h[:]...)
			}
			return b
		}
		changed := map[string]bool{}
		for name, e := range old {
			if n, ok := new[name]; !ok || n != e {
				changed[key(name, e.dir)] = true
			}
		}
		for name, e := range new {
			if o, ok := old[name]; !ok || o != e {
				changed[key(name, e.dir)] = true
			}
		}
		want := slices.Sorted(maps.Keys(changed))
		var got []string
		err := diffEntries(encode(old), encode(new), func(o, n treeEntry) error {
			e := o.or(n)
			got = append(got, key(string(e.name), e.isDir()))
			return nil
		})
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("old %v, new %v: changed %q (%v), want %q", old, new, got, err, want)
		}
	})
}

func TestDiffRefusesAMalformedTree(t *testing.T) {
	for _, data := range [][]byte{[]byte("100644 a"), []byte("100644 a\x00short"), []byte("no-space\x00" + strings.Repeat("x", 20))} {
		if err := diffEntries(data, nil, func(o, n treeEntry) error { return nil }); err == nil {
			t.Errorf("tree %q read without an error", data)
		}
	}
	s := newStore()
	if _, err := diff(t.Context(), s, plumbing.ZeroHash, plumbing.ZeroHash); err == nil {
		t.Error("a diff of trees the store lacks succeeded")
	}
}

// A comparison names what changed down to the second level, which is as deep as a
// reader needs to tell one directory of a top-level directory from another, and no
// deeper, so that its cost never follows what lies below.
func TestDiffNamesChangedPathsToTheSecondLevel(t *testing.T) {
	base := gittree.Files{
		"README.md":                    gittree.Regular("fleet\n"),
		"top.yaml":                     gittree.Regular("a: 1\n"),
		"notes":                        gittree.Regular("a file\n"),
		"sets/a100/kustomization.yaml": gittree.Regular("resources: [queue.yaml]\n"),
		"sets/a100/queue.yaml":         gittree.Regular("kind: ClusterQueue\n"),
		"sets/a100/deep/er/file.yaml":  gittree.Regular("x: 1\n"),
		"items/gpu-a/cluster.yaml":     gittree.Regular("name: gpu-a\n"),
		"items/gpu-b/cluster.yaml":     gittree.Regular("name: gpu-b\n"),
		"items/gpu-b/overlay/x.yaml":   gittree.Regular("x: 1\n"),
	}
	with := func(changes gittree.Files) gittree.Files {
		files := maps.Clone(base)
		for p, f := range changes {
			if f.Data == nil {
				delete(files, p)
			} else {
				files[p] = f
			}
		}
		return files
	}
	removed := gittree.File{}
	for _, tc := range []struct {
		name  string
		new   gittree.Files
		paths []string
		// first is what FirstChange says of each path.
		first map[string]string
	}{
		{name: "nothing", new: base},
		{name: "a top-level file", new: with(gittree.Files{"README.md": gittree.Regular("new text\n")}), paths: []string{"README.md"},
			first: map[string]string{"README.md": "README.md"}},
		{name: "a file deep below a directory counts for its second level", new: with(gittree.Files{"sets/a100/deep/er/file.yaml": gittree.Regular("x: 2\n")}),
			paths: []string{"sets/a100"}, first: map[string]string{"sets/a100": "sets/a100/deep/er/file.yaml"}},
		{name: "two entries of one directory", new: with(gittree.Files{
			"items/gpu-a/cluster.yaml": gittree.Regular("name: gpu-a\ncordoned: true\n"), "items/gpu-b/overlay/x.yaml": gittree.Regular("x: 2\n")}),
			paths: []string{"items/gpu-a", "items/gpu-b"}, first: map[string]string{"items/gpu-b": "items/gpu-b/overlay/x.yaml"}},
		{name: "an entry added and one removed", new: with(gittree.Files{"items/gpu-a/cluster.yaml": removed, "items/gpu-c/cluster.yaml": gittree.Regular("name: gpu-c\n")}),
			paths: []string{"items/gpu-a", "items/gpu-c"}, first: map[string]string{"items/gpu-a": "items/gpu-a/cluster.yaml"}},
		{name: "a file directly in a directory", new: with(gittree.Files{"items/index.txt": gittree.Regular("gpu-a\n")}), paths: []string{"items/index.txt"}},
		{name: "a file replaced by a directory of its name, both named", new: with(gittree.Files{"notes": removed, "notes/one.md": gittree.Regular("1\n")}),
			paths: []string{"notes", "notes/one.md"}},
		{name: "a new top-level directory", new: with(gittree.Files{"docs/guide/intro.md": gittree.Regular("hello\n")}), paths: []string{"docs/guide"},
			first: map[string]string{"docs/guide": "docs/guide/intro.md"}},
		{name: "a file's mode alone", new: with(gittree.Files{"top.yaml": {Data: []byte("a: 1\n"), Mode: filemode.Executable}}), paths: []string{"top.yaml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore()
			old, err := gittree.WriteTree(s, base)
			if err != nil {
				t.Fatal(err)
			}
			new, err := gittree.WriteTree(s, tc.new)
			if err != nil {
				t.Fatal(err)
			}
			ch, err := diff(t.Context(), s, old, new)
			if err != nil {
				t.Fatal(err)
			}
			if ch.All || !slices.Equal(ch.Paths, tc.paths) || ch.Empty() != (len(tc.paths) == 0) {
				t.Fatalf("changes %+v, want paths %q", ch, tc.paths)
			}
			for p, want := range tc.first {
				if got := ch.FirstChange(p); got != want {
					t.Errorf("first change at %s: %q, want %q", p, got, want)
				}
			}
		})
	}
}

// Comparing two heads that differ in one entry of a large top-level directory reads
// the two roots and the two versions of that directory: the entries below it need not
// even be in the copy.
func TestDiffReadsOnlyTheTopLevelDirectoriesThatDiffer(t *testing.T) {
	s := newStore()
	head := func(changed byte) plumbing.Hash {
		var dir, file plumbing.Hash
		dir[0], file[0] = changed, 1
		items := rawTreeOf(treeLine{"40000", "gpu-a", dir}, treeLine{"40000", "gpu-b", file})
		root := rawTreeOf(treeLine{"100644", "README.md", file}, treeLine{"40000", "items", items.hash}, treeLine{"40000", "sets", file})
		s.add([]*storedObject{items, root})
		return root.hash
	}
	ch, err := diff(t.Context(), s, head(1), head(2))
	if err != nil || !slices.Equal(ch.Paths, []string{"items/gpu-a"}) {
		t.Fatalf("changes %+v (%v), want items/gpu-a read from the two roots and items/ alone", ch, err)
	}
	// Asked for a file to name, the directories on the way are read, and what is
	// missing below leaves the path as it is.
	if got := ch.FirstChange("items/gpu-a"); got != "items/gpu-a" {
		t.Errorf("first change below a directory the copy lacks: %q", got)
	}
}

// A head that changes more paths than a fleet is built for asks for everything to be
// re-read, rather than for a list the hub would hold name by name.
func TestDiffOfMorePathsThanAFleetHoldsAsksForAll(t *testing.T) {
	for _, tc := range []struct {
		name    string
		changed int
		all     bool
	}{
		{"as many changed paths as a fleet holds clusters", MaxChangedPaths, false},
		{"one more", MaxChangedPaths + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore()
			var file plumbing.Hash
			clustersOf := func() plumbing.Hash {
				// The directory holds names git sorts as written, each a different file
				// from the other head's.
				var b []byte
				for i := range tc.changed {
					b = append(append(fmt.Appendf(b, "100644 gpu-%06d", i), 0), file[:]...)
				}
				clusters := newStoredObject(plumbing.TreeObject, b)
				root := newStoredObject(plumbing.TreeObject, append(append([]byte("40000 items"), 0), clusters.hash[:]...))
				s.add([]*storedObject{clusters, root})
				return root.hash
			}
			file[0] = 1
			old := clustersOf()
			file[0] = 2
			ch, err := diff(t.Context(), s, old, clustersOf())
			if err != nil {
				t.Fatal(err)
			}
			if ch.All != tc.all || tc.all && (ch.Paths != nil || !strings.Contains(ch.Reason, "more than 10000 paths changed")) ||
				!tc.all && len(ch.Paths) != tc.changed {
				t.Fatalf("all %v (%s), %d paths: want all %v", ch.All, ch.Reason, len(ch.Paths), tc.all)
			}
		})
	}
}

// BenchmarkDiffOneChange10k is the comparison alone after a merge that changes one
// cluster of a 10,000-cluster fleet: its cost and allocations must not grow with the
// clusters that did not change.
func BenchmarkDiffOneChange10k(b *testing.B) {
	const clusters = 10_000
	s := newStore()
	head := func(changed byte) plumbing.Hash {
		var b []byte
		for i := range clusters {
			var dir plumbing.Hash
			dir[0], dir[1] = byte(i>>8), byte(i)
			if i == 42 {
				dir[2] = changed
			}
			b = append(append(fmt.Appendf(b, "40000 gpu-%06d", i), 0), dir[:]...)
		}
		dir := newStoredObject(plumbing.TreeObject, b)
		var file plumbing.Hash
		file[0] = 1
		root := rawTreeOf(
			treeLine{"100644", ".sops.yaml", file}, treeLine{"40000", "clusters", dir.hash},
			treeLine{"100644", "fleet.yaml", file}, treeLine{"40000", "presets", file})
		s.add([]*storedObject{dir, root})
		return root.hash
	}
	old, new := head(1), head(2)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := diff(b.Context(), s, old, new); err != nil {
			b.Fatal(err)
		}
	}
}

type treeLine struct {
	mode, name string
	hash       plumbing.Hash
}

// rawTreeOf is a tree object of the entries, in the order given.
func rawTreeOf(entries ...treeLine) *storedObject {
	var b []byte
	for _, e := range entries {
		b = append(append(append(b, e.mode+" "+e.name...), 0), e.hash[:]...)
	}
	return newStoredObject(plumbing.TreeObject, b)
}

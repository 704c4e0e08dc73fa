package gitsource_test

import (
	"errors"
	"fmt"
	"io/fs"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"unsafe"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gittree"
)

// treeFS builds files as a commit in memory and reads it as the hub does.
func treeFS(t *testing.T, files gittree.Files) gitsource.TreeFS {
	t.Helper()
	return gitsource.NewTreeFS(gittree.New(t, files))
}

func TestTreeFSPassesTheFileSystemConformanceSuite(t *testing.T) {
	files := gittree.FromMapFS(fleetgen.Template())
	files["docs/readme.md"] = gittree.Regular("# fleet\n")
	files["docs/fleet.yaml"] = gittree.Link("../fleet.yaml")
	files["docs/presets"] = gittree.Link("../presets")
	fsys := treeFS(t, files)
	if err := fstest.TestFS(fsys, "fleet.yaml", "docs/readme.md", "docs/fleet.yaml", "presets/gpu/queues.yaml"); err != nil {
		t.Fatal(err)
	}
}

// chain is n links, link1 -> link2 -> ... -> linkN -> target.
func chain(files gittree.Files, n int, target string) {
	for i := 1; i < n; i++ {
		files["link"+strconv.Itoa(i)] = gittree.Link("link" + strconv.Itoa(i+1))
	}
	files["link"+strconv.Itoa(n)] = gittree.Link(target)
}

func TestTreeFSFollowsLinksWithinTheTreeAndABoundedNumberOfHops(t *testing.T) {
	// deep is a directory nested 10,000 deep: resolving it must need no deep stack.
	deep := strings.Repeat("d/", 10_000) + "leaf.yaml"
	cases := []struct {
		name  string
		files gittree.Files
		// open is the name opened; want its content, or an error containing fail.
		open, want, fail string
	}{
		{name: "a file linked to itself", files: gittree.Files{"fleet.yaml": gittree.Link("fleet.yaml")},
			open: "fleet.yaml", fail: "too many levels of symbolic links"},
		{name: "a directory linked to itself", files: gittree.Files{"clusters": gittree.Link("clusters")},
			open: "clusters/x/cluster.yaml", fail: "too many levels of symbolic links"},
		{name: "a directory linked to its parent", files: gittree.Files{"a/up": gittree.Link(".."), "a/f": gittree.Regular("f")},
			open: "a/up/a/up/a/up/a/f", want: "f"},
		{name: "two links to each other", files: gittree.Files{"a": gittree.Link("b"), "b": gittree.Link("a")},
			open: "a", fail: "too many levels of symbolic links"},
		{name: "a chain of as many links as allowed", files: func() gittree.Files {
			f := gittree.Files{"target": gittree.Regular("end")}
			chain(f, gitsource.MaxLinkHops, "target")
			return f
		}(), open: "link1", want: "end"},
		{name: "a chain one link longer than allowed", files: func() gittree.Files {
			f := gittree.Files{"target": gittree.Regular("end")}
			chain(f, gitsource.MaxLinkHops+1, "target")
			return f
		}(), open: "link1", fail: "too many levels of symbolic links"},
		{name: "a relative link out of the tree", files: gittree.Files{"a/x": gittree.Link("../../x")},
			open: "a/x", fail: `symbolic link a/x to "../../x" leaves the repository`},
		{name: "a link to the parent of the root", files: gittree.Files{"x": gittree.Link("..")},
			open: "x", fail: `symbolic link x to ".." leaves the repository`},
		{name: "an absolute link", files: gittree.Files{"x": gittree.Link("/etc/passwd")},
			open: "x", fail: `symbolic link x to "/etc/passwd" leaves the repository`},
		{name: "a link out through a linked directory", files: gittree.Files{"a": gittree.Link("b"), "b/up": gittree.Link("../..")},
			open: "a/up/etc/passwd", fail: `symbolic link b/up to "../.." leaves the repository`},
		{name: "a file through a linked directory", files: gittree.Files{"alias": gittree.Link("real"), "real/f.yaml": gittree.Regular("f")},
			open: "alias/f.yaml", want: "f"},
		// As a checkout reads it: the .. after base leaves where base leads, not base.
		{name: "a .. after a linked directory in a link", files: gittree.Files{
			"clusters/a/base": gittree.Link("../../presets/a100/sub"), "clusters/a/k.yaml": gittree.Link("base/../x.yaml"),
			"presets/a100/sub/y.yaml": gittree.Regular("y"), "presets/a100/x.yaml": gittree.Regular("preset"), "clusters/a/x.yaml": gittree.Regular("cluster")},
			open: "clusters/a/k.yaml", want: "preset"},
		{name: "a .. after a file in a link", files: gittree.Files{"f": gittree.Regular("f"), "x": gittree.Regular("x"), "l": gittree.Link("f/../x")},
			open: "l", fail: "not a directory"},
		{name: "a link to the root", files: gittree.Files{"root": gittree.Link("."), "f": gittree.Regular("f")},
			open: "root/root/f", want: "f"},
		{name: "an empty link", files: gittree.Files{"x": gittree.Link("")},
			open: "x", fail: "empty target"},
		{name: "a link longer than a path may be", files: gittree.Files{"x": gittree.Link(strings.Repeat("a/", 3000))},
			open: "x", fail: "longer than the 4096 a path may be"},
		{name: "a path through a file", files: gittree.Files{"f": gittree.Regular("f")},
			open: "f/g", fail: "not a directory"},
		{name: "an entry named ..", files: gittree.Files{"a/../x": gittree.Regular("x")},
			open: "a/x", fail: `directory a holds an entry named "..", which no checkout can hold`},
		{name: "two entries of one name", files: gittree.Files{"a/x": gittree.Regular("file"), "a/x/y": gittree.Regular("dir")},
			open: "a/x", fail: `directory a holds two entries named "x"`},
		{name: "two entries of one name with others between them", files: gittree.Files{"a/x": gittree.Regular("file"), "a/x-1": gittree.Regular("1"),
			"a/x.y": gittree.Regular("y"), "a/x/y": gittree.Regular("dir")},
			open: "a/x-1", fail: `directory a holds two entries named "x"`},
		{name: "a directory named .git", files: gittree.Files{"a/.git/x.yaml": gittree.Regular("x")},
			open: "a/.git/x.yaml", fail: `directory a/.git: invalid path component: ".git"`},
		{name: "a directory named .git in disguise", files: gittree.Files{"a/.GIT./x.yaml": gittree.Regular("x")},
			open: "a/.GIT./x.yaml", fail: "invalid path"},
		{name: "a directory named with a control character", files: gittree.Files{"a/b\x1bc/x.yaml": gittree.Regular("x")},
			open: "a/b\x1bc/x.yaml", fail: "contains control character"},
		{name: "a name that goes on past a NUL byte", files: gittree.Files{"a": gittree.Regular("a"), "b": gittree.Regular("b")},
			open: "a\x00b", fail: "file does not exist"},
		{name: "a deep directory", files: gittree.Files{deep: gittree.Regular("deep")}, open: deep, want: "deep"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fsys := treeFS(t, tc.files)
			checks := map[string]func() (string, error){
				"ReadFile": func() (string, error) { b, err := fs.ReadFile(fsys, tc.open); return string(b), err },
				"ReadShared": func() (string, error) {
					b, err := fsys.ReadShared(tc.open)
					return string(b), err
				},
				"Stat": func() (string, error) { _, err := fsys.Stat(tc.open); return tc.want, err },
			}
			for name, check := range checks {
				got, err := check()
				switch {
				case tc.fail == "" && err != nil:
					t.Errorf("%s %s: %v", name, tc.open, err)
				case tc.fail == "" && got != tc.want:
					t.Errorf("%s %s = %q, want %q", name, tc.open, got, tc.want)
				case tc.fail != "" && (err == nil || !strings.Contains(err.Error(), tc.fail)):
					t.Errorf("%s %s: error %v, want one containing %q", name, tc.open, err, tc.fail)
				case tc.fail != "" && !strings.Contains(err.Error(), tc.open):
					t.Errorf("%s %s: error %q does not name the file", name, tc.open, err)
				}
			}
		})
	}
}

// Git writes a tree's entries sorted, and TreeFS finds names by binary search in that
// order; a commit may hold a tree written otherwise, which must read as go-git reads it.
func TestTreeFSReadsATreeOutOfGitsOrder(t *testing.T) {
	objects := memory.NewStorage()
	// go-git writes only sorted trees; these are written entry by entry as given.
	write := func(entries ...object.TreeEntry) plumbing.Hash {
		t.Helper()
		h, err := gittree.WriteEntries(objects, entries...)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	blob := func(data string) plumbing.Hash {
		t.Helper()
		h, err := gittree.WriteBlob(objects, []byte(data))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	z, a := blob("z"), blob("a")
	sub := write(object.TreeEntry{Name: "f", Mode: filemode.Regular, Hash: a})
	unsorted := write(
		object.TreeEntry{Name: "z", Mode: filemode.Regular, Hash: z},
		object.TreeEntry{Name: "dir", Mode: filemode.Dir, Hash: sub},
		object.TreeEntry{Name: "a", Mode: filemode.Regular, Hash: a})
	fsys := gitsource.NewTreeFS(objects, unsorted)
	for name, want := range map[string]string{"z": "z", "a": "a", "dir/f": "a"} {
		if got, err := fs.ReadFile(fsys, name); err != nil || string(got) != want {
			t.Errorf("ReadFile %s = %q, %v; want %q", name, got, err, want)
		}
	}
	if _, err := fsys.Stat("b"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat of a missing name: %v, want fs.ErrNotExist", err)
	}
	list, err := fsys.ReadDir(".")
	if names := dirNames(list); err != nil || !slices.Equal(names, []string{"a", "dir", "z"}) {
		t.Errorf("ReadDir = %v, %v; want a, dir, z", names, err)
	}
	twice := write(
		object.TreeEntry{Name: "x", Mode: filemode.Regular, Hash: z},
		object.TreeEntry{Name: "a", Mode: filemode.Regular, Hash: a},
		object.TreeEntry{Name: "x", Mode: filemode.Regular, Hash: a})
	if _, err := fs.ReadFile(gitsource.NewTreeFS(objects, twice), "a"); err == nil || !strings.Contains(err.Error(), `holds two entries named "x"`) {
		t.Errorf("a tree holding x twice, out of order: %v", err)
	}
}

func dirNames(list []fs.DirEntry) []string {
	var out []string
	for _, e := range list {
		out = append(out, e.Name())
	}
	return out
}

func TestTreeFSLstatAndReadLinkReportTheLinkItself(t *testing.T) {
	fsys := treeFS(t, gittree.Files{"self": gittree.Link("self"), "out": gittree.Link("../x"), "dir/f": gittree.Regular("f")})
	for _, name := range []string{"self", "out"} {
		info, err := fsys.Lstat(name)
		if err != nil || info.Mode()&fs.ModeSymlink == 0 || info.Name() != name {
			t.Errorf("Lstat %s = %v, %v; want a symbolic link", name, info, err)
		}
	}
	if target, err := fsys.ReadLink("out"); err != nil || target != "../x" {
		t.Errorf("ReadLink out = %q, %v", target, err)
	}
	if _, err := fsys.ReadLink("dir/f"); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("ReadLink of a file: %v, want fs.ErrInvalid", err)
	}
	if _, err := fsys.Lstat("missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Lstat of a missing file: %v, want fs.ErrNotExist", err)
	}
}

func TestTreeFSReadsEveryPathToOneBlobIntoOneSlice(t *testing.T) {
	big := make([]byte, 1<<20)
	files := gittree.Files{"other": gittree.Regular("other")}
	for _, p := range []string{"a/one", "b/two", "c/d/three"} {
		files[p] = gittree.File{Data: big}
	}
	files["link"] = gittree.Link("a/one")
	fsys := treeFS(t, files)
	var first *byte
	for _, p := range []string{"a/one", "b/two", "c/d/three", "link"} {
		data, err := fsys.ReadShared(p)
		if err != nil || len(data) != len(big) {
			t.Fatalf("ReadShared %s: %d bytes, %v", p, len(data), err)
		}
		if first == nil {
			first = unsafe.SliceData(data)
		} else if unsafe.SliceData(data) != first {
			t.Errorf("%s got a copy of the blob, not the slice the first path got", p)
		}
	}
	other, err := fsys.ReadShared("other")
	if err != nil || string(other) != "other" || unsafe.SliceData(other) == first {
		t.Errorf("another blob: %q, %v", other, err)
	}
}

func TestTreeFSIsSafeForConcurrentLoads(t *testing.T) {
	files := gittree.FromMapFS(fleetgen.Fleet(20, fleetgen.Options{OverlayEvery: 3}))
	files["clusters/alias"] = gittree.Link(fleetgen.ClusterName(1))
	objects, tree := gittree.New(t, files)
	shared := gitsource.NewTreeFS(objects, tree)
	want := fleet.Load(gitsource.NewTreeFS(objects, tree))
	var wg sync.WaitGroup
	results := make([]*fleet.Fleet, 8)
	for i := range results {
		wg.Go(func() {
			// Half share one TreeFS, half have their own over the same tree.
			fsys := shared
			if i%2 == 1 {
				fsys = gitsource.NewTreeFS(objects, tree)
			}
			results[i] = fleet.Load(fsys)
		})
	}
	wg.Wait()
	for i, f := range results {
		if !slices.Equal(f.ClusterNames(), want.ClusterNames()) || f.AllErrors().Error() != want.AllErrors().Error() {
			t.Fatalf("load %d differs: %v\n%s", i, f.ClusterNames(), f.AllErrors())
		}
		for name, c := range want.Clusters {
			if f.Clusters[name].Digest != c.Digest {
				t.Fatalf("load %d reads cluster %s differently", i, name)
			}
		}
	}
}

func TestTreeFSDecodesATreeOnceWhateverThePathsNamingIt(t *testing.T) {
	// A tree of 10,000 entries, as clusters/ is, named by 100 directories of the root.
	files := gittree.Files{}
	for i := range 10_000 {
		files[fmt.Sprintf("f%05d", i)] = gittree.Regular("x")
	}
	objects, big := gittree.New(t, files)
	var dirs []object.TreeEntry
	for i := range 100 {
		dirs = append(dirs, object.TreeEntry{Name: fmt.Sprintf("d%03d", i), Mode: filemode.Dir, Hash: big})
	}
	root, err := gittree.WriteEntries(objects, dirs...)
	if err != nil {
		t.Fatal(err)
	}
	fsys := gitsource.NewTreeFS(objects, root)
	read := func(dirs ...int) uint64 {
		t.Helper()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for _, d := range dirs {
			if data, err := fs.ReadFile(fsys, fmt.Sprintf("d%03d/f04321", d)); err != nil || string(data) != "x" {
				t.Fatalf("d%03d/f04321: %q, %v", d, data, err)
			}
		}
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	first := read(0)
	var rest []int
	for i := 1; i < 100; i++ {
		rest = append(rest, i)
	}
	if others := read(rest...); others >= first {
		t.Errorf("99 more paths to the tree allocated %d bytes, the first %d: the tree was decoded again", others, first)
	}
}

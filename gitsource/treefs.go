package gitsource

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// MaxLinkHops is the most symbolic links followed to resolve one name, the fleet
// loader's limit too: a pull request's head decides what its links point at, so a loop
// or a long chain must end in an error, never in unbounded work.
const MaxLinkHops = 8

// maxLinkTarget is the longest link target read, PATH_MAX on Linux: a checkout could not
// hold a longer one, and every hop may lengthen the path being resolved by that much.
const maxLinkTarget = 4096

// errLinkLoop is what a name that needs more than MaxLinkHops links fails with.
var errLinkLoop = errors.New("too many levels of symbolic links")

// TreeFS reads a commit's tree as an fs.FS, so that the fleet loader reads a commit the
// way it reads a checkout.
//
// Symbolic links are resolved the way a checkout on disk resolves them, within bounds
// that a hostile commit cannot move: at most MaxLinkHops links for one name, none leading
// out of the tree (an absolute target, or one climbing above the root, is an error) and a
// loop is an error rather than a crash. Stat, Open, ReadDir and ReadShared follow links;
// Lstat and ReadLink report the link itself.
//
// ReadShared hands out each blob's content once, whatever the number of paths naming
// it, so that twenty thousand paths to one large blob cost its size once in memory; a
// tree is decoded once in the same way.
//
// A TreeFS is safe for concurrent use. It remembers the directories it decoded and the
// blobs it handed out for as long as it is referenced.
type TreeFS struct{ s *treeState }

var (
	_ fs.ReadDirFS  = TreeFS{}
	_ fs.ReadLinkFS = TreeFS{}
	_ fs.StatFS     = TreeFS{}
)

type treeState struct {
	mu sync.Mutex
	// objects holds the trees and blobs; files reads blobs from it.
	objects storer.EncodedObjectStorer
	files   *object.Tree
	// dirs are the directories reached so far, by their path without links; "." is the
	// root.
	dirs map[string]*treeDirIndex
	// trees are the same directories by their tree's hash: a commit can name one large
	// tree from many paths, and each must not cost its size again.
	trees map[plumbing.Hash]*treeDirIndex
	// blobs are the contents ReadShared handed out, by blob hash.
	blobs map[plumbing.Hash][]byte
	// sizes and targets are what entries' blobs were looked up for: a link loop is
	// followed over and over, and each lookup would otherwise decode the blob again.
	// They are kept by entry, as go-git checks an entry's name when its blob is read.
	sizes   map[*object.TreeEntry]int64
	targets map[*object.TreeEntry]string
}

// treeDirIndex is one decoded directory.
type treeDirIndex struct {
	entries []object.TreeEntry
	// byName finds the entries of a directory whose entries are out of git's order;
	// nil when they are in it, and found by binary search.
	byName map[string]*object.TreeEntry
	// err is set for a directory no checkout could hold: an entry named "", "." or
	// "..", a name with a slash, or two entries of one name.
	err error
}

// NewTreeFS reads the tree root of objects.
func NewTreeFS(objects storer.EncodedObjectStorer, root plumbing.Hash) TreeFS {
	s := &treeState{
		objects: objects,
		dirs:    map[string]*treeDirIndex{},
		trees:   map[plumbing.Hash]*treeDirIndex{},
		blobs:   map[plumbing.Hash][]byte{},
		sizes:   map[*object.TreeEntry]int64{},
		targets: map[*object.TreeEntry]string{},
	}
	// go-git reads a blob through a tree, checking the entry's name on the way; an
	// empty tree is one that carries the storer and nothing else.
	empty := &plumbing.MemoryObject{}
	empty.SetType(plumbing.TreeObject)
	files, err := object.DecodeTree(objects, empty)
	if err != nil {
		// Decoding an empty tree reads nothing that could fail.
		panic(fmt.Sprintf("gitsource: an empty tree: %v", err))
	}
	s.files = files
	d, err := decodeDir(objects, root)
	if err != nil {
		d = &treeDirIndex{err: err}
	} else {
		s.trees[root] = d
	}
	s.dirs["."] = d
	return TreeFS{s: s}
}

// decodeDir reads the tree h into its entries. The names are substrings of the
// tree's content as read, so that a directory of 10,000 entries costs two
// allocations, where go-git's own decoder makes several per entry; modes are made
// canonical as go-git makes them.
func decodeDir(objects storer.EncodedObjectStorer, h plumbing.Hash) (*treeDirIndex, error) {
	o, err := objects.EncodedObject(plumbing.TreeObject, h)
	if err != nil {
		return nil, fmt.Errorf("tree %s: %w", h, err)
	}
	r, err := o.Reader()
	if err != nil {
		return nil, fmt.Errorf("tree %s: %w", h, err)
	}
	defer r.Close()
	data := make([]byte, o.Size())
	if _, err := io.ReadFull(r, data); err != nil {
		return nil, fmt.Errorf("tree %s: %w", h, err)
	}
	// Each entry's name ends at its first NUL, and a hash follows: counting them first
	// allocates the entries once.
	n := 0
	for rest := data; len(rest) > 0; n++ {
		nul := bytes.IndexByte(rest, 0)
		if nul < 0 || len(rest) < nul+1+len(plumbing.ZeroHash) {
			break
		}
		rest = rest[nul+1+len(plumbing.ZeroHash):]
	}
	// data is never written again, so the names can share it rather than a copy.
	text := unsafe.String(unsafe.SliceData(data), len(data))
	entries := make([]object.TreeEntry, 0, n)
	for at, rest := 0, data; len(rest) > 0; {
		e, next, err := nextEntry(rest)
		if err != nil {
			return nil, fmt.Errorf("tree %s: %w", h, object.ErrMalformedTree)
		}
		mode := text[at : at+len(e.mode)]
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil {
			return nil, fmt.Errorf("tree %s: %w: mode %q", h, object.ErrMalformedTree, mode)
		}
		name := at + len(e.mode) + 1
		entries = append(entries, object.TreeEntry{Name: text[name : name+len(e.name)], Mode: canonicalMode(filemode.FileMode(m)), Hash: e.hash})
		at += len(rest) - len(next)
		rest = next
	}
	return index(entries), nil
}

// canonicalMode is the mode go-git gives an entry of a decoded tree: what git would
// check it out as.
func canonicalMode(m filemode.FileMode) filemode.FileMode {
	switch m & 0o170000 {
	case 0o040000:
		return filemode.Dir
	case 0o100000:
		if m&0o111 != 0 {
			return filemode.Executable
		}
		return filemode.Regular
	case 0o120000:
		return filemode.Symlink
	}
	return filemode.Submodule
}

func index(entries []object.TreeEntry) *treeDirIndex {
	d := &treeDirIndex{entries: entries}
	sorted := true
	for i := range entries {
		e := &entries[i]
		if e.Name == "" || e.Name == "." || e.Name == ".." || strings.IndexByte(e.Name, '/') >= 0 {
			d.err = fmt.Errorf("holds an entry named %q, which no checkout can hold", e.Name)
			return d
		}
		sorted = sorted && (i == 0 || compareNames(&entries[i-1], e.Name, e.Mode == filemode.Dir) < 0)
	}
	if !sorted {
		d.byName = make(map[string]*object.TreeEntry, len(entries))
		for i := range entries {
			e := &entries[i]
			if d.byName[e.Name] != nil {
				d.err = fmt.Errorf("holds two entries named %q", e.Name)
				return d
			}
			d.byName[e.Name] = e
		}
		return d
	}
	// In git's order, entries of one name sort apart only as a file and a directory,
	// with nothing between them but names that go on from the file's; a file whose
	// next entry does not go on from its name has no directory of its name.
	for i := range entries[:max(len(entries)-1, 0)] {
		e := &entries[i]
		if e.Mode != filemode.Dir && strings.HasPrefix(entries[i+1].Name, e.Name) && d.find(e.Name, true) != nil {
			d.err = fmt.Errorf("holds two entries named %q", e.Name)
			return d
		}
	}
	return d
}

// compareNames orders the entry e and an entry named name as git sorts a tree.
func compareNames(e *object.TreeEntry, name string, dir bool) int {
	return gitOrder(e.Name, e.Mode == filemode.Dir, name, dir)
}

// find is the directory's entry named name that is a directory (dir) or not.
func (d *treeDirIndex) find(name string, dir bool) *object.TreeEntry {
	i, ok := slices.BinarySearchFunc(d.entries, name, func(e object.TreeEntry, name string) int { return compareNames(&e, name, dir) })
	if !ok {
		return nil
	}
	return &d.entries[i]
}

// lookup is the directory's entry named name, or nil.
func (d *treeDirIndex) lookup(name string) *object.TreeEntry {
	if strings.IndexByte(name, 0) >= 0 {
		// No entry holds a NUL, and compareNames reads one as the end of a name.
		return nil
	}
	if d.byName != nil {
		return d.byName[name]
	}
	if e := d.find(name, false); e != nil {
		return e
	}
	return d.find(name, true)
}

// rootEntry stands for the root, which has no entry of its own.
var rootEntry = object.TreeEntry{Name: ".", Mode: filemode.Dir}

// resolved is a name after its links: the path it stands for and that path's entry.
type resolved struct {
	path  string
	entry *object.TreeEntry
}

// resolve finds name's entry. Links among the directories on the way are always
// followed and the last element's link when follow is set; the caller holds s.mu.
//
// The walk goes one element at a time, as a checkout's kernel does: a ".." in a link's
// target leaves the directory the walk is in, which may be where an earlier link led,
// not the one the target's text names before it.
func (t TreeFS) resolve(op, name string, follow bool) (resolved, error) {
	if !fs.ValidPath(name) {
		return resolved{}, &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	fail := func(err error) (resolved, error) { return resolved{}, &fs.PathError{Op: op, Path: name, Err: err} }
	// The directories walked into from the root, each with its path and its entry:
	// where a ".." goes back to.
	type level struct {
		path  string
		dir   *treeDirIndex
		entry *object.TreeEntry
	}
	var levels [16]level
	walked := append(levels[:0], level{path: ".", dir: t.s.dirs["."]}) // the root has no entry
	rest := name
	if name == "." {
		rest = ""
	}
	hops, link, target := 0, "", ""
	for rest != "" {
		elem, more, notLast := strings.Cut(rest, "/")
		last := !notLast
		rest = more
		cur := walked[len(walked)-1]
		switch elem {
		case "", ".":
			continue
		case "..":
			if len(walked) == 1 {
				return fail(fmt.Errorf("symbolic link %s to %q leaves the repository", link, target))
			}
			walked = walked[:len(walked)-1]
			continue
		}
		if cur.dir.err != nil {
			return fail(fmt.Errorf("directory %s %w", cur.path, cur.dir.err))
		}
		e := cur.dir.lookup(elem)
		if e == nil {
			return fail(fs.ErrNotExist)
		}
		p := path.Join(cur.path, elem)
		if e.Mode == filemode.Symlink && (!last || follow) {
			if hops++; hops > MaxLinkHops {
				return fail(errLinkLoop)
			}
			to, err := t.linkTarget(e)
			if err != nil {
				return fail(fmt.Errorf("symbolic link %s: %w", p, err))
			}
			if path.IsAbs(to) {
				return fail(fmt.Errorf("symbolic link %s to %q leaves the repository", p, to))
			}
			link, target = p, to
			if !last {
				to += "/" + rest
			}
			rest = to
			continue
		}
		if last {
			return resolved{path: p, entry: e}, nil
		}
		if e.Mode != filemode.Dir {
			return fail(errors.New("not a directory"))
		}
		sub, err := t.dir(p, e)
		if err != nil {
			return fail(err)
		}
		walked = append(walked, level{path: p, dir: sub, entry: e})
	}
	// The name ends at a directory a "." or ".." or a link's target left the walk in.
	end := walked[len(walked)-1]
	if end.entry == nil {
		root := rootEntry // a copy: nothing a caller does reaches the next call
		end.entry = &root
	}
	return resolved{path: end.path, entry: end.entry}, nil
}

// dir finds the directory p, whose entry is e, decoding its tree the first time any
// path names it.
func (t TreeFS) dir(p string, e *object.TreeEntry) (*treeDirIndex, error) {
	if d, ok := t.s.dirs[p]; ok {
		return d, nil
	}
	// go-git refuses a name no checkout would write (".git" in its disguises, control
	// characters) when a blob is read; a directory of such a name is refused the same
	// way. The empty tree holds nothing, so all it can say of a name is that check.
	if _, err := t.s.files.FindEntry(e.Name); !errors.Is(err, object.ErrEntryNotFound) {
		return nil, fmt.Errorf("directory %s: %w", p, err)
	}
	d, ok := t.s.trees[e.Hash]
	if !ok {
		var err error
		if d, err = decodeDir(t.s.objects, e.Hash); err != nil {
			return nil, fmt.Errorf("directory %s: %w", p, err)
		}
		t.s.trees[e.Hash] = d
	}
	t.s.dirs[p] = d
	return d, nil
}

func (t TreeFS) linkTarget(e *object.TreeEntry) (string, error) {
	if s, ok := t.s.targets[e]; ok {
		return s, nil
	}
	f, err := t.s.files.TreeEntryFile(e)
	if err != nil {
		return "", err
	}
	if f.Size > maxLinkTarget {
		return "", fmt.Errorf("target is %d bytes, longer than the %d a path may be", f.Size, maxLinkTarget)
	}
	s, err := f.Contents()
	if err != nil {
		return "", err
	}
	switch {
	case s == "":
		return "", errors.New("empty target")
	case strings.IndexByte(s, 0) >= 0:
		return "", errors.New("target holds a NUL byte")
	}
	t.s.targets[e] = s
	return s, nil
}

// blob is the file of a resolved regular file.
func (t TreeFS) blob(op string, r resolved) (*object.File, error) {
	f, err := t.s.files.TreeEntryFile(r.entry)
	if err != nil {
		return nil, &fs.PathError{Op: op, Path: r.path, Err: err}
	}
	t.s.sizes[r.entry] = f.Size
	return f, nil
}

// size is the size of a resolved file or link.
func (t TreeFS) size(op string, r resolved) (int64, error) {
	if n, ok := t.s.sizes[r.entry]; ok {
		return n, nil
	}
	f, err := t.blob(op, r)
	if err != nil {
		return 0, err
	}
	return f.Size, nil
}

func (t TreeFS) Open(name string) (fs.File, error) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	r, err := t.resolve("open", name, true)
	if err != nil {
		return nil, err
	}
	switch {
	case r.entry.Mode == filemode.Dir:
		return &treeDir{fs: t, name: name, info: fileInfo{name: path.Base(name), mode: fs.ModeDir | 0o755}}, nil
	case r.entry.Mode.IsFile():
		f, err := t.blob("open", r)
		if err != nil {
			return nil, err
		}
		info := info(r.entry, f.Size)
		info.name = path.Base(name)
		if data, ok := t.s.blobs[r.entry.Hash]; ok {
			return &treeFile{ReadCloser: io.NopCloser(bytes.NewReader(data)), info: info}, nil
		}
		rd, err := f.Reader()
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: name, Err: err}
		}
		return &treeFile{ReadCloser: rd, info: info}, nil
	default: // a submodule
		return nil, &fs.PathError{Op: "open", Path: name, Err: errors.New("is a submodule")}
	}
}

// ReadShared returns the content of the file name, following links. Every path naming
// the same blob gets the same slice, read once: callers must never modify it.
func (t TreeFS) ReadShared(name string) ([]byte, error) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	r, err := t.resolve("read", name, true)
	if err != nil {
		return nil, err
	}
	switch {
	case r.entry.Mode == filemode.Dir:
		return nil, &fs.PathError{Op: "read", Path: name, Err: errors.New("is a directory")}
	case !r.entry.Mode.IsFile():
		return nil, &fs.PathError{Op: "read", Path: name, Err: errors.New("is a submodule")}
	}
	if _, err := t.size("read", r); err != nil {
		return nil, err
	}
	if data, ok := t.s.blobs[r.entry.Hash]; ok {
		return data, nil
	}
	f, err := t.blob("read", r)
	if err != nil {
		return nil, err
	}
	rd, err := f.Reader()
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	defer rd.Close()
	data := make([]byte, f.Size)
	if _, err := io.ReadFull(rd, data); err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	t.s.blobs[r.entry.Hash] = data
	return data, nil
}

// ContentID names the content of the file name, following links: git's object name of
// its blob, the same for every path that holds the same bytes.
func (t TreeFS) ContentID(name string) (string, error) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	r, err := t.resolve("read", name, true)
	if err != nil {
		return "", err
	}
	if !r.entry.Mode.IsFile() {
		return "", &fs.PathError{Op: "read", Path: name, Err: errors.New("not a file")}
	}
	return r.entry.Hash.String(), nil
}

func (t TreeFS) Stat(name string) (fs.FileInfo, error) { return t.stat("stat", name, true) }

func (t TreeFS) Lstat(name string) (fs.FileInfo, error) { return t.stat("lstat", name, false) }

func (t TreeFS) stat(op, name string, follow bool) (fs.FileInfo, error) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	r, err := t.resolve(op, name, follow)
	if err != nil {
		return nil, err
	}
	var size int64
	if r.entry.Mode.IsFile() || r.entry.Mode == filemode.Symlink {
		if size, err = t.size(op, r); err != nil {
			return nil, err
		}
	}
	i := info(r.entry, size)
	// The name is the one asked for: a followed link keeps its own name, as on disk.
	i.name = path.Base(name)
	return i, nil
}

func (t TreeFS) ReadLink(name string) (string, error) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	r, err := t.resolve("readlink", name, false)
	if err != nil {
		return "", err
	}
	if r.entry.Mode != filemode.Symlink {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: fs.ErrInvalid}
	}
	target, err := t.linkTarget(r.entry)
	if err != nil {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: err}
	}
	return target, nil
}

func (t TreeFS) ReadDir(name string) ([]fs.DirEntry, error) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	r, err := t.resolve("readdir", name, true)
	if err != nil {
		return nil, err
	}
	if r.entry.Mode != filemode.Dir {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: errors.New("not a directory")}
	}
	d := t.s.dirs["."]
	if r.path != "." {
		if d, err = t.dir(r.path, r.entry); err != nil {
			return nil, &fs.PathError{Op: "readdir", Path: name, Err: err}
		}
	}
	if d.err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: d.err}
	}
	out := make([]fs.DirEntry, 0, len(d.entries))
	for i := range d.entries {
		e := &d.entries[i]
		i := info(e, 0)
		// A name of its own: a slice of the tree's content would keep all of it alive
		// for as long as the caller keeps the name (a fleet keeps its clusters').
		i.name = strings.Clone(e.Name)
		out = append(out, dirEntry{fs: t, path: path.Join(name, e.Name), info: i})
	}
	// Git sorts a tree's entries with directories as if they ended in "/"; io/fs
	// wants plain name order.
	slices.SortFunc(out, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return out, nil
}

type fileInfo struct {
	name string
	mode fs.FileMode
	size int64
}

func info(e *object.TreeEntry, size int64) fileInfo {
	var m fs.FileMode
	switch {
	case e.Mode == filemode.Dir:
		m = fs.ModeDir | 0o755
	case e.Mode == filemode.Symlink:
		m = fs.ModeSymlink | 0o777
	case e.Mode == filemode.Executable:
		m = 0o755
	case e.Mode == filemode.Submodule:
		m = fs.ModeIrregular
	default:
		m = 0o644
	}
	return fileInfo{name: path.Base(e.Name), mode: m, size: size}
}

func (i fileInfo) Name() string       { return i.name }
func (i fileInfo) Size() int64        { return i.size }
func (i fileInfo) Mode() fs.FileMode  { return i.mode }
func (i fileInfo) ModTime() time.Time { return time.Time{} }
func (i fileInfo) IsDir() bool        { return i.mode.IsDir() }
func (i fileInfo) Sys() any           { return nil }

// dirEntry is listed from the tree alone; its size needs the blob, read by Info.
type dirEntry struct {
	fs   TreeFS
	path string
	info fileInfo
}

func (d dirEntry) Name() string               { return d.info.name }
func (d dirEntry) IsDir() bool                { return d.info.IsDir() }
func (d dirEntry) Type() fs.FileMode          { return d.info.mode.Type() }
func (d dirEntry) Info() (fs.FileInfo, error) { return d.fs.Lstat(d.path) }

type treeFile struct {
	io.ReadCloser
	info fileInfo
}

func (f *treeFile) Stat() (fs.FileInfo, error) { return f.info, nil }

type treeDir struct {
	fs   TreeFS
	name string
	info fileInfo
	list []fs.DirEntry
	read bool
}

func (d *treeDir) Stat() (fs.FileInfo, error) { return d.info, nil }
func (d *treeDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.name, Err: errors.New("is a directory")}
}
func (d *treeDir) Close() error { return nil }

func (d *treeDir) ReadDir(n int) ([]fs.DirEntry, error) {
	if !d.read {
		list, err := d.fs.ReadDir(d.name)
		if err != nil {
			return nil, err
		}
		d.list, d.read = list, true
	}
	if n <= 0 {
		out := d.list
		d.list = nil
		return out, nil
	}
	if len(d.list) == 0 {
		return nil, io.EOF
	}
	n = min(n, len(d.list))
	out := d.list[:n]
	d.list = d.list[n:]
	return out, nil
}

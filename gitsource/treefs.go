package gitsource

import (
	"errors"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// TreeFS reads a commit's tree as an fs.FS, so that the fleet loader reads a commit the
// way it reads a checkout. Symbolic links are reported as such and read with ReadLink,
// never followed by the file system itself.
type TreeFS struct{ root *object.Tree }

var (
	_ fs.ReadDirFS  = TreeFS{}
	_ fs.ReadLinkFS = TreeFS{}
	_ fs.StatFS     = TreeFS{}
)

// NewTreeFS wraps a tree.
func NewTreeFS(t *object.Tree) TreeFS { return TreeFS{root: t} }

// entry finds name; the root is a directory entry without a name.
func (t TreeFS) entry(op, name string) (*object.TreeEntry, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	if name == "." {
		return &object.TreeEntry{Name: ".", Mode: filemode.Dir, Hash: t.root.Hash}, nil
	}
	e, err := t.root.FindEntry(name)
	if err != nil {
		return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
	}
	return e, nil
}

func (t TreeFS) Open(name string) (fs.File, error) {
	e, err := t.entry("open", name)
	if err != nil {
		return nil, err
	}
	switch {
	case e.Mode == filemode.Dir:
		return &treeDir{fs: t, name: name, entry: e}, nil
	case e.Mode == filemode.Symlink:
		// Open follows links in io/fs; the loader resolves them itself, inside the tree.
		return nil, &fs.PathError{Op: "open", Path: name, Err: errors.New("is a symbolic link")}
	case e.Mode.IsFile():
		blob, err := t.root.File(name)
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: name, Err: err}
		}
		r, err := blob.Reader()
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: name, Err: err}
		}
		return &treeFile{ReadCloser: r, info: info(e, blob.Size)}, nil
	default: // a submodule
		return nil, &fs.PathError{Op: "open", Path: name, Err: errors.New("is a submodule")}
	}
}

func (t TreeFS) Stat(name string) (fs.FileInfo, error) {
	e, err := t.entry("stat", name)
	if err != nil {
		return nil, err
	}
	if e.Mode == filemode.Symlink {
		target, err := t.ReadLink(name)
		if err != nil {
			return nil, err
		}
		return t.Stat(path.Join(path.Dir(name), target))
	}
	return t.lstat(name, e)
}

func (t TreeFS) Lstat(name string) (fs.FileInfo, error) {
	e, err := t.entry("lstat", name)
	if err != nil {
		return nil, err
	}
	return t.lstat(name, e)
}

func (t TreeFS) lstat(name string, e *object.TreeEntry) (fs.FileInfo, error) {
	var size int64
	if e.Mode.IsFile() || e.Mode == filemode.Symlink {
		f, err := t.root.File(name)
		if err != nil {
			return nil, &fs.PathError{Op: "stat", Path: name, Err: err}
		}
		size = f.Size
	}
	return info(e, size), nil
}

func (t TreeFS) ReadLink(name string) (string, error) {
	e, err := t.entry("readlink", name)
	if err != nil {
		return "", err
	}
	if e.Mode != filemode.Symlink {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: fs.ErrInvalid}
	}
	f, err := t.root.File(name)
	if err != nil {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: err}
	}
	s, err := f.Contents()
	if err != nil {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: err}
	}
	return s, nil
}

func (t TreeFS) ReadDir(name string) ([]fs.DirEntry, error) {
	tree := t.root
	if name != "." {
		e, err := t.entry("readdir", name)
		if err != nil {
			return nil, err
		}
		if e.Mode != filemode.Dir {
			return nil, &fs.PathError{Op: "readdir", Path: name, Err: errors.New("not a directory")}
		}
		if tree, err = t.root.Tree(name); err != nil {
			return nil, &fs.PathError{Op: "readdir", Path: name, Err: err}
		}
	}
	out := make([]fs.DirEntry, 0, len(tree.Entries))
	for i := range tree.Entries {
		e := &tree.Entries[i]
		out = append(out, dirEntry{info(e, -1)})
	}
	// Git sorts a tree's entries with directories as if they ended in "/"; io/fs
	// wants plain name order.
	sortEntries(out)
	return out, nil
}

func sortEntries(es []fs.DirEntry) {
	slices.SortFunc(es, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
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
func (i fileInfo) Size() int64        { return max(i.size, 0) }
func (i fileInfo) Mode() fs.FileMode  { return i.mode }
func (i fileInfo) ModTime() time.Time { return time.Time{} }
func (i fileInfo) IsDir() bool        { return i.mode.IsDir() }
func (i fileInfo) Sys() any           { return nil }

type dirEntry struct{ fileInfo }

func (d dirEntry) Type() fs.FileMode          { return d.mode.Type() }
func (d dirEntry) Info() (fs.FileInfo, error) { return d.fileInfo, nil }

type treeFile struct {
	io.ReadCloser
	info fileInfo
}

func (f *treeFile) Stat() (fs.FileInfo, error) { return f.info, nil }

type treeDir struct {
	fs    TreeFS
	name  string
	entry *object.TreeEntry
	list  []fs.DirEntry
	read  bool
}

func (d *treeDir) Stat() (fs.FileInfo, error) { return info(d.entry, 0), nil }
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

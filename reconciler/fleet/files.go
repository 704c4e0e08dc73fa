package fleet

import (
	"errors"
	"io"
	"io/fs"
	"path"
	"strings"
)

// MaxFileSize is the largest file a fleet repository may hold. Fleet files are small
// declarations; anything bigger is a mistake or an attack on the hub's memory.
const MaxFileSize = 1 << 20

// maxLinkHops bounds how many symbolic links are followed for one file.
const maxLinkHops = 8

// resolve follows the symbolic links at p, refusing any that would leave the repository.
// It returns the path of the regular file or directory p stands for.
func resolve(fsys fs.FS, p string, e errs) (string, fs.FileInfo, bool) {
	rl, canReadLinks := fsys.(fs.ReadLinkFS)
	cur := p
	for hop := 0; ; hop++ {
		var info fs.FileInfo
		var err error
		if canReadLinks {
			info, err = rl.Lstat(cur)
		} else {
			info, err = fs.Stat(fsys, cur)
		}
		if err != nil {
			e.whole("cannot read: %v", unwrapPathError(err))
			return "", nil, false
		}
		if info.Mode()&fs.ModeSymlink == 0 {
			return cur, info, true
		}
		if !canReadLinks {
			e.whole("symbolic links are not supported here")
			return "", nil, false
		}
		if hop >= maxLinkHops {
			e.whole("too many levels of symbolic links")
			return "", nil, false
		}
		target, err := rl.ReadLink(cur)
		if err != nil {
			e.whole("cannot read symbolic link: %v", unwrapPathError(err))
			return "", nil, false
		}
		next := path.Join(path.Dir(cur), target)
		if path.IsAbs(target) || next == ".." || strings.HasPrefix(next, "../") {
			e.whole("symbolic link to %q leaves the repository", target)
			return "", nil, false
		}
		// The target is joined lexically, so every directory on its way must be a real
		// one: a symbolic link among them could lead anywhere.
		for d := path.Dir(next); d != "."; d = path.Dir(d) {
			info, err := rl.Lstat(d)
			if err != nil {
				e.whole("cannot read: %v", unwrapPathError(err))
				return "", nil, false
			}
			if info.Mode()&fs.ModeSymlink != 0 {
				e.whole("symbolic link to %q passes through the symbolic link %s, which is not supported", target, d)
				return "", nil, false
			}
		}
		cur = next
	}
}

// readFile reads one file of at most MaxFileSize bytes.
func readFile(fsys fs.FS, p string, e errs) ([]byte, bool) {
	real, info, ok := resolve(fsys, p, e)
	if !ok {
		return nil, false
	}
	if info.IsDir() {
		e.whole("expected a file, found a directory")
		return nil, false
	}
	if info.Size() > MaxFileSize {
		e.whole("file is %d bytes; files in a fleet repository may be at most %d bytes (1 MiB)", info.Size(), MaxFileSize)
		return nil, false
	}
	f, err := fsys.Open(real)
	if err != nil {
		e.whole("cannot read: %v", unwrapPathError(err))
		return nil, false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		e.whole("cannot read: %v", unwrapPathError(err))
		return nil, false
	}
	if len(data) > MaxFileSize {
		e.whole("file is larger than %d bytes (1 MiB), the most a fleet file may be", MaxFileSize)
		return nil, false
	}
	return data, true
}

// readTree reads every file below dir, keyed by its path from the repository's root.
// Problems are reported against the file they concern; the rest is still read.
func readTree(fsys fs.FS, dir string, e errs, files map[string][]byte) bool {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		errs{file: dir, cluster: e.cluster, list: e.list}.whole("cannot read directory: %v", unwrapPathError(err))
		return false
	}
	ok := true
	for _, ent := range entries {
		p := path.Join(dir, ent.Name())
		fe := errs{file: p, cluster: e.cluster, list: e.list}
		if ent.IsDir() {
			ok = readTree(fsys, p, e, files) && ok
			continue
		}
		if ent.Type()&fs.ModeSymlink != 0 {
			_, info, good := resolve(fsys, p, fe)
			if !good {
				ok = false
				continue
			}
			if info.IsDir() {
				fe.whole("symbolic links to directories are not supported")
				ok = false
				continue
			}
		} else if !ent.Type().IsRegular() {
			fe.whole("not a regular file")
			ok = false
			continue
		}
		data, good := readFile(fsys, p, fe)
		if !good {
			ok = false
			continue
		}
		files[p] = data
	}
	return ok
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

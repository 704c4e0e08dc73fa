package fleet

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
)

// MaxFileSize is the largest file a fleet repository may hold. Fleet files are small
// declarations; anything bigger is a mistake or an attack on the hub's memory.
const MaxFileSize = 1 << 20

// maxLinkHops bounds how many symbolic links are followed for one file; gitsource's
// TreeFS follows as many (gitsource.MaxLinkHops), so that a link reads the same from a
// checkout and from a commit.
const maxLinkHops = 8

// Budget bounds what the loader reads of one head, whatever the head holds. A pull
// request is untrusted input that the hub loads before anyone looked at it: one 1 MiB
// blob named from 20,000 paths is a pull request of under 1 MB that would otherwise cost
// 20 GB to load. A head that breaks its budget is a broken fleet (see Fleet.OverBudget).
// Each cluster directory has a budget of its own within the head's: a directory over it
// fails that cluster alone, as any other mistake in it does, and the rest of the fleet
// goes on.
//
// A field left zero takes its default.
type Budget struct {
	// MaxBytes is the most bytes of file content read. Every path counts, including
	// paths to content already read, and a file's size counts before it is read.
	MaxBytes int64
	// MaxFiles is the most directory entries listed (files, symbolic links and
	// directories) and symbolic links followed: a link followed costs what reading one
	// more entry does, and a loop of them would otherwise cost the hub time for free.
	MaxFiles int
	// MaxDepth is the most elements a path may have; clusters/NAME/cluster.yaml has 3.
	// A cluster directory's path deeper than that fails the cluster alone.
	MaxDepth int
	// MaxClusterBytes is the most bytes of file content one cluster directory may
	// hold, counted as MaxBytes counts them.
	MaxClusterBytes int64
	// MaxClusterFiles is the most entries one cluster directory may hold and symbolic
	// links its files may follow, counted as MaxFiles counts them.
	MaxClusterFiles int
}

// The defaults admit a fleet of 10,000 clusters with room to spare and keep what a
// hostile head costs the hub well under 256 MiB. A cluster is a directory with
// cluster.yaml (about 0.5 KiB), a SOPS enrollment file (1-2 KiB, more with many
// recipients) and at most a few small overlay files: 4 or 5 entries and up to 3 KiB, so
// 10,000 clusters are 40,000-50,000 entries and under 30 MiB, about half of each budget.
// A head cannot make the loader hold more than DefaultMaxBytes of content and the
// bookkeeping of DefaultMaxFiles entries, a few hundred bytes each: in
// BenchmarkLoadHostileHead, 95,000 tiny files that all load peak under 100 MiB of heap,
// and 20,000 paths to one 1 MiB blob are refused at 10 MiB. DefaultMaxDepth leaves
// presets room for kustomize components nested a dozen deep; the layout needs 3. A
// cluster directory may hold a thousand times what a real one does, four files of
// MaxFileSize and a thousand entries: a mistake the size of a vendored chart or a
// build's output fails its cluster, not the fleet, while 16 such directories still
// leave the head its budget.
const (
	DefaultMaxBytes        = 64 << 20
	DefaultMaxFiles        = 100_000
	DefaultMaxDepth        = 16
	DefaultMaxClusterBytes = 4 * MaxFileSize
	DefaultMaxClusterFiles = 1_000
)

// DefaultBudget is the budget Load applies.
func DefaultBudget() Budget {
	return Budget{MaxBytes: DefaultMaxBytes, MaxFiles: DefaultMaxFiles, MaxDepth: DefaultMaxDepth,
		MaxClusterBytes: DefaultMaxClusterBytes, MaxClusterFiles: DefaultMaxClusterFiles}
}

// withDefaults fills the fields left zero or negative.
func (b Budget) withDefaults() Budget {
	d := DefaultBudget()
	if b.MaxBytes <= 0 {
		b.MaxBytes = d.MaxBytes
	}
	if b.MaxFiles <= 0 {
		b.MaxFiles = d.MaxFiles
	}
	if b.MaxDepth <= 0 {
		b.MaxDepth = d.MaxDepth
	}
	if b.MaxClusterBytes <= 0 {
		b.MaxClusterBytes = d.MaxClusterBytes
	}
	if b.MaxClusterFiles <= 0 {
		b.MaxClusterFiles = d.MaxClusterFiles
	}
	return b
}

// SharedFS is a file system whose files never change once listed, such as a commit's
// tree (gitsource.TreeFS), and which can hand out a file's content without copying it.
// The loader reads through ReadShared when the file system has it, so that content named
// from many paths is held in memory once.
type SharedFS interface {
	fs.FS
	// ReadShared returns the content of the regular file name. Every path to the same
	// content may get the same slice: nobody may modify it.
	ReadShared(name string) ([]byte, error)
}

// usage is what part of a head cost its budget.
type usage struct {
	files int
	bytes int64
}

// meter charges what the loader reads to a budget and remembers the first place the
// budget broke; after that, nothing more is read.
type meter struct {
	budget Budget
	used   usage
	broken *Error
	// head, when set, makes this the meter of one cluster directory: what it reads is
	// charged to the head's meter too, and its own budget is the cluster's.
	head *meter
}

// cluster returns the meter of one cluster directory read within m.
func (m *meter) cluster() *meter {
	return &meter{budget: Budget{MaxBytes: m.budget.MaxClusterBytes, MaxFiles: m.budget.MaxClusterFiles, MaxDepth: m.budget.MaxDepth}, head: m}
}

// names are how errors name what m reads and its budgets of files and bytes, as the
// hub's configuration names them without their "max".
func (m *meter) names() (who, files, bytes string) {
	if m.head != nil {
		return "cluster directory", "clusterFiles", "clusterBytes"
	}
	return "head", "files", "bytes"
}

// list charges the n entries listed in dir, before any of them is looked at.
func (m *meter) list(dir string, n int) bool {
	if m.broken != nil {
		return false
	}
	if m.used.files+n > m.budget.MaxFiles {
		who, files, _ := m.names()
		m.broken = &Error{File: dir, Message: fmt.Sprintf(
			"the %s holds more than %d files, directories and symbolic links followed, the most the hub reads of one %s (budget %s)",
			who, m.budget.MaxFiles, who, files)}
		return false
	}
	if m.head != nil && !m.head.list(dir, n) {
		m.broken = m.head.broken
		return false
	}
	m.used.files += n
	return true
}

// depth checks that p is not nested too deep to read.
func (m *meter) depth(p string) bool {
	if m.broken != nil {
		return false
	}
	if strings.Count(p, "/")+1 > m.budget.MaxDepth {
		who, _, _ := m.names()
		m.broken = &Error{File: p, Message: fmt.Sprintf(
			"the %s nests paths more than %d deep, the most the hub reads (budget depth)", who, m.budget.MaxDepth)}
		return false
	}
	return true
}

// read charges size bytes of the file p, before they are read.
func (m *meter) read(p string, size int64) bool {
	if m.broken != nil {
		return false
	}
	if m.used.bytes+size > m.budget.MaxBytes {
		who, _, bytes := m.names()
		m.broken = &Error{File: p, Message: fmt.Sprintf(
			"the %s's files add up to more than %d bytes (%s), the most the hub reads of one %s (budget %s); every path counts, also paths to content already read",
			who, m.budget.MaxBytes, mebibytes(m.budget.MaxBytes), who, bytes)}
		return false
	}
	if m.head != nil && !m.head.read(p, size) {
		m.broken = m.head.broken
		return false
	}
	m.used.bytes += size
	return true
}

func mebibytes(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// admit charges the file p at the root, reached through its links, the way reading it
// would, and reports whether it fits in the budget. When p is a symbolic link that leads
// nowhere it returns why; whatever else is wrong with p, the reader that follows
// reports.
func admit(fsys fs.FS, p string, m *meter, via *[]string) (ErrorList, bool) {
	if !m.list(".", 1) {
		return nil, false
	}
	var problems ErrorList
	_, info, ok := resolve(fsys, p, errs{file: p, list: &problems}, m, via)
	if m.broken != nil {
		return nil, false
	}
	if !ok {
		if info, err := lstat(fsys, p); err == nil && info.Mode()&fs.ModeSymlink != 0 {
			return problems, true
		}
		return nil, true
	}
	if info.IsDir() || info.Size() > MaxFileSize {
		return nil, true
	}
	return nil, m.read(p, info.Size())
}

// resolve follows the symbolic links at p, refusing any that would leave the repository,
// and charges m, when not nil, for every link it follows. It returns the path of the
// regular file or directory p stands for. When via is not nil, every path a link leads
// to is added to it, even one that is not there: a change there changes what p reads.
func resolve(fsys fs.FS, p string, e errs, m *meter, via *[]string) (string, fs.FileInfo, bool) {
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
		if m != nil && !m.list(cur, 1) {
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
		if via != nil {
			*via = append(*via, next)
		}
		// The target is joined lexically, so every directory on its way must be a real
		// one: a symbolic link among them could lead anywhere. That holds of those a ".."
		// of the target leaves too, which the joined path no longer names: on disk, the
		// ".." after a link leaves where the link leads. (The directories above the link
		// are real: the walk came down through them.)
		for walk, rest, down := path.Dir(cur), target, 0; rest != ""; {
			var elem string
			elem, rest, _ = strings.Cut(rest, "/")
			switch elem {
			case "", ".":
				continue
			case "..":
				if down == 0 {
					walk = path.Dir(walk)
					continue
				}
				down--
				if !realDirectory(rl, walk, target, e) {
					return "", nil, false
				}
				walk = path.Dir(walk)
			default:
				walk, down = path.Join(walk, elem), down+1
			}
		}
		for d := path.Dir(next); d != "."; d = path.Dir(d) {
			if !realDirectory(rl, d, target, e) {
				return "", nil, false
			}
		}
		cur = next
	}
}

// realDirectory reports whether d, on the way of a symbolic link to target, is a directory
// and no link; e says why not.
func realDirectory(rl fs.ReadLinkFS, d, target string, e errs) bool {
	info, err := rl.Lstat(d)
	switch {
	case err != nil:
		e.whole("cannot read: %v", unwrapPathError(err))
	case info.Mode()&fs.ModeSymlink != 0:
		e.whole("symbolic link to %q passes through the symbolic link %s, which is not supported", target, d)
	case !info.IsDir():
		e.whole("symbolic link to %q passes through %s, which is not a directory", target, d)
	default:
		return true
	}
	return false
}

// readFile reads one file of at most MaxFileSize bytes.
func readFile(fsys fs.FS, p string, e errs) ([]byte, bool) { return readMetered(fsys, p, e, nil) }

// readMetered reads one file of at most MaxFileSize bytes, charged to m before it is
// read when m is not nil.
func readMetered(fsys fs.FS, p string, e errs, m *meter) ([]byte, bool) {
	real, info, ok := resolve(fsys, p, e, m, nil)
	if !ok {
		return nil, false
	}
	return readResolved(fsys, p, real, info, e, m)
}

// readResolved reads the file p stands for, real, which resolve found.
func readResolved(fsys fs.FS, p, real string, info fs.FileInfo, e errs, m *meter) ([]byte, bool) {
	if info.IsDir() {
		e.whole("expected a file, found a directory")
		return nil, false
	}
	if !info.Mode().IsRegular() {
		// A FIFO or a device in a checkout: reading it could wait forever, or never end.
		e.whole("not a regular file")
		return nil, false
	}
	if info.Size() > MaxFileSize {
		e.whole("file is %d bytes; files in a fleet repository may be at most %d bytes (1 MiB)", info.Size(), MaxFileSize)
		return nil, false
	}
	if m != nil && !m.read(p, info.Size()) {
		return nil, false
	}
	var data []byte
	var err error
	if sfs, ok := fsys.(SharedFS); ok {
		data, err = sfs.ReadShared(real)
	} else {
		data, err = readLimited(fsys, real, info.Size())
	}
	if err != nil {
		e.whole("cannot read: %v", unwrapPathError(err))
		return nil, false
	}
	if len(data) > MaxFileSize {
		e.whole("file is larger than %d bytes (1 MiB), the most a fleet file may be", MaxFileSize)
		return nil, false
	}
	// A file on disk can grow between its stat and its read; what was read counts.
	if grown := int64(len(data)) - info.Size(); m != nil && grown > 0 && !m.read(p, grown) {
		return nil, false
	}
	return data, true
}

// readLimited reads at most MaxFileSize+1 bytes of the file p, which its stat says is
// size bytes long. The buffer is made for that size and one byte more, so that a file
// that kept its size is read in one call and its end found in the next; io.ReadAll,
// starting small and doubling, allocated twice what a fleet's files hold. A file that
// grew since is read on, up to the limit.
func readLimited(fsys fs.FS, p string, size int64) ([]byte, error) {
	data := make([]byte, 0, min(max(size, 0), MaxFileSize)+1)
	if rfs, ok := fsys.(wholeFileFS); ok {
		return rfs.readWhole(p, data)
	}
	f, err := fsys.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readInto(f, data)
}

// wholeFileFS is a file system that reads a file into a buffer without an fs.File:
// DirFS, whose files as os.File would cost system calls the loader has no use for.
type wholeFileFS interface {
	readWhole(name string, data []byte) ([]byte, error)
}

// readInto appends what r holds to data, up to MaxFileSize+1 bytes in all, growing data
// only when it is full.
func readInto(r io.Reader, data []byte) ([]byte, error) {
	r = io.LimitReader(r, MaxFileSize+1)
	for {
		if len(data) == cap(data) {
			data = append(data, 0)[:len(data)]
		}
		n, err := r.Read(data[len(data):cap(data)])
		data = data[:len(data)+n]
		if errors.Is(err, io.EOF) {
			return data, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// readTree reads every file below dir, keyed by its path from the repository's root,
// charging m for every entry and byte, and adds to via the paths its symbolic links lead
// to. Problems are reported against the file they concern; the rest is still read,
// unless the budget broke.
func readTree(fsys fs.FS, dir string, e errs, files map[string][]byte, m *meter, via *[]string) bool {
	if !m.depth(dir) {
		return false
	}
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		errs{file: dir, cluster: e.cluster, list: e.list}.whole("cannot read directory: %v", unwrapPathError(err))
		return false
	}
	if !m.list(dir, len(entries)) {
		return false
	}
	ok := true
	for _, ent := range entries {
		p := path.Join(dir, ent.Name())
		fe := errs{file: p, cluster: e.cluster, list: e.list}
		if ent.IsDir() {
			ok = readTree(fsys, p, e, files, m, via) && ok
			if m.broken != nil {
				return false
			}
			continue
		}
		if !m.depth(p) {
			return false
		}
		link := ent.Type()&fs.ModeSymlink != 0
		if !link && !ent.Type().IsRegular() {
			fe.whole("not a regular file")
			ok = false
			continue
		}
		// A listed file is resolved too: on disk, it may have become a link since.
		real, info, good := resolve(fsys, p, fe, m, via)
		if good && link && info.IsDir() {
			fe.whole("symbolic links to directories are not supported")
			good = false
		}
		if m.broken != nil {
			return false
		}
		if !good {
			ok = false
			continue
		}
		data, good := readResolved(fsys, p, real, info, fe, m)
		if m.broken != nil {
			return false
		}
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

package gitsource

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
)

// Limits bound what one fetch may bring into memory. A fetch that would go past
// either limit fails as a whole with a *BudgetError, and nothing it brought is kept.
// Only what is new counts: objects the store already has are not sent again.
type Limits struct {
	// Bytes is the most content, uncompressed, that the new commits, directories and
	// files of one fetch may add up to.
	Bytes int64
	// Objects is the most new commits, directories and files one fetch may bring.
	Objects int
	// DirEntries is the most entries one directory may hold. A directory is a single
	// object of some 30 bytes an entry, so a push of a few MiB can hold millions of
	// entries, and reading each costs the hub hundreds of bytes: such a directory is
	// refused while its bytes are counted, before anything reads its entries.
	DirEntries int
}

// The default limits. A fleet of 10,000 clusters at depth 1 is tens of thousands of
// objects and a few MiB: the generated fleet of the benchmarks is 20,021 objects and
// 4.2 MiB, and each cluster's own enrollment file and overlay add about a KiB and two
// objects a cluster. The first fetch of the pull requests' copy brings the branch with
// PullRequestDepth commits below it, each with a clusters/ directory of some 400 KiB:
// 20 MiB more. The branch's defaults leave such a fleet seven times that room, while a
// merged mistake (a file of gigabytes, millions of files) fails the fetch instead of
// the hub.
//
// A pull request's fetch brings only what the branch does not have: kilobytes for one
// that changes a few clusters, some 20 MiB for one that rewrites clusters/ in each of
// its PullRequestDepth commits. Its defaults admit that, and keep what one hostile
// pull request can make the hub hold (its content and some 100 bytes an object) under
// 80 MiB.
//
// DefaultDirEntries is the fleet loader's budget of entries for a whole head
// (fleet.DefaultMaxFiles): a directory with more could never be loaded, and clusters/
// of a fleet of 10,000 clusters holds a tenth of it.
const (
	DefaultBranchBytes        = 256 << 20
	DefaultBranchObjects      = 500_000
	DefaultPullRequestBytes   = 64 << 20
	DefaultPullRequestObjects = 100_000
	DefaultDirEntries         = 100_000
)

func (l Limits) withDefaults(bytes int64, objects int) Limits {
	if l.Bytes == 0 {
		l.Bytes = bytes
	}
	if l.Objects == 0 {
		l.Objects = objects
	}
	if l.DirEntries == 0 {
		l.DirEntries = DefaultDirEntries
	}
	return l
}

func (l Limits) check(name string) error {
	if l.Bytes < 0 || l.Objects < 0 || l.DirEntries < 0 {
		return fmt.Errorf("gitsource: %s %+v: a limit cannot be negative", name, l)
	}
	return nil
}

// budget is the limits of one fetch and whose fetch it is, for the error.
type budget struct {
	Limits
	scope, per string
	depth      int
}

func (b budget) exceeded() *BudgetError {
	return &BudgetError{Scope: b.scope, Depth: b.depth, Limits: b.Limits, per: b.per}
}

// BudgetError is a fetch refused because it would bring more into memory than its
// Limits allow. Its message is written for whoever pushed the content: for a pull
// request, its author.
type BudgetError struct {
	// Scope is whose fetch it was: "pull request #12", "branch main".
	Scope string
	// Commit is the head that was fetched.
	Commit plumbing.Hash
	// Depth is how many commits of history the fetch asked for, the head included.
	Depth int
	// Limits are the budget that was broken.
	Limits Limits
	// TooManyObjects is set when the number of objects broke the budget; otherwise
	// their size did.
	TooManyObjects bool
	// FileSize, when set, is the size of one file that alone is over the byte budget.
	FileSize int64
	// DirEntries, when set, is the number of entries of one directory that alone is
	// over Limits.DirEntries.
	DirEntries int
	// HeldPullRequests or HeldBytes, when set, say that the pull request was not read
	// because the pull requests with lower numbers already hold that many pull
	// requests, or that many bytes, the most the hub holds at once
	// (Options.MaxPullRequests, Options.PullRequestsTotal). Unlike the other budgets
	// this one is not the head's doing: the same head may be read once some of those
	// pull requests close, so it should not be remembered as failed for good.
	HeldPullRequests int
	HeldBytes        int64

	// per says what one budget is for: "pull request", "fetch of the branch".
	per string
}

func (e *BudgetError) Error() string {
	history := fmt.Sprintf("its last %d commits bring", e.Depth)
	if e.Depth == 1 {
		history = "its head commit brings"
	}
	switch {
	case e.HeldPullRequests > 0:
		return fmt.Sprintf("%s: the hub holds at most %d pull requests at once, the oldest first; this one is read once older ones close",
			e.Scope, e.HeldPullRequests)
	case e.HeldBytes > 0:
		return fmt.Sprintf("%s: the hub holds at most %s of pull requests at once, the oldest first; this one is read once older ones close",
			e.Scope, byteSize(e.HeldBytes))
	case e.DirEntries > 0:
		return fmt.Sprintf("%s: %s a directory of %d entries, more than the %d the hub reads in one directory",
			e.Scope, history, e.DirEntries, e.Limits.DirEntries)
	case e.TooManyObjects:
		return fmt.Sprintf("%s: %s more than %d new files, directories and commits, the most the hub reads for one %s",
			e.Scope, history, e.Limits.Objects, e.per)
	case e.FileSize > 0:
		return fmt.Sprintf("%s: a file of %s is larger than the %s the hub reads for one %s",
			e.Scope, byteSize(e.FileSize), byteSize(e.Limits.Bytes), e.per)
	default:
		return fmt.Sprintf("%s: %s more than %s of new content, the most the hub reads for one %s",
			e.Scope, history, byteSize(e.Limits.Bytes), e.per)
	}
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// delta is a deltified object whose base is not known yet.
type delta struct {
	offset     int64
	baseOffset int64
	baseHash   plumbing.Hash
	data       []byte
}

// readPack parses a pack within b, resolving deltas against the pack's own objects
// and, for a thin pack, the store's. go-git's own parser would inflate a file whole
// before its storer saw it, and keep every delta of the pack until the end; this one
// checks each object's declared size against the budget before inflating it, and
// returns the objects for the store to take together once the pack is complete.
func readPack(r io.Reader, s *store, b budget) ([]*storedObject, error) {
	sc := packfile.NewScanner(r)
	_, count, err := sc.Header()
	if err != nil {
		return nil, fmt.Errorf("reading pack header: %w", err)
	}
	if int64(count) > int64(b.Objects) {
		e := b.exceeded()
		e.TooManyObjects = true
		return nil, e
	}
	var (
		objs     = make([]*storedObject, 0, min(count, 1<<16))
		byOffset = make(map[int64]*storedObject, min(count, 1<<16))
		byHash   = make(map[plumbing.Hash]*storedObject, min(count, 1<<16))
		pending  []delta
		// used counts resolved objects and the deltas waiting for their base.
		used int64
	)
	overBytes := func(size int64, typ plumbing.ObjectType) error {
		if size <= b.Bytes-used {
			return nil
		}
		e := b.exceeded()
		if typ == plumbing.BlobObject && size > b.Bytes {
			e.FileSize = size
		}
		return e
	}
	keep := func(offset int64, o *storedObject) error {
		if o.typ == plumbing.TreeObject && b.DirEntries > 0 {
			if n := treeEntries(o.data); n > b.DirEntries {
				e := b.exceeded()
				e.DirEntries = n
				return e
			}
		}
		objs = append(objs, o)
		byOffset[offset] = o
		byHash[o.hash] = o
		used += int64(len(o.data))
		return nil
	}
	base := func(d *delta) *storedObject {
		if d.baseHash.IsZero() {
			return byOffset[d.baseOffset]
		}
		if o := byHash[d.baseHash]; o != nil {
			return o
		}
		return s.get(d.baseHash)
	}
	resolve := func(d *delta, src *storedObject) error {
		srcSize, rest, err := uvarint(d.data)
		if err != nil || srcSize != uint64(len(src.data)) {
			return fmt.Errorf("a delta at offset %d does not fit its base: %w", d.offset, packfile.ErrInvalidDelta)
		}
		targetSize, _, err := uvarint(rest)
		if err != nil {
			return fmt.Errorf("a delta at offset %d: %w", d.offset, packfile.ErrInvalidDelta)
		}
		if err := overBytes(int64(min(targetSize, math.MaxInt64)), src.typ); err != nil {
			return err
		}
		data, err := patch(src.data, d.data)
		if err != nil {
			return fmt.Errorf("a delta at offset %d: %w", d.offset, err)
		}
		if uint64(len(data)) != targetSize {
			return fmt.Errorf("a delta at offset %d: %w", d.offset, packfile.ErrInvalidDelta)
		}
		return keep(d.offset, newStoredObject(src.typ, data))
	}
	for range count {
		h, err := sc.NextObjectHeader()
		if err != nil {
			return nil, fmt.Errorf("reading pack: %w", err)
		}
		if err := overBytes(h.Length, h.Type); err != nil {
			return nil, err
		}
		data, err := inflate(sc, h.Length)
		if err != nil {
			return nil, fmt.Errorf("reading pack object at offset %d: %w", h.Offset, err)
		}
		switch h.Type {
		case plumbing.CommitObject, plumbing.TreeObject, plumbing.BlobObject, plumbing.TagObject:
			if err := keep(h.Offset, newStoredObject(h.Type, data)); err != nil {
				return nil, err
			}
		case plumbing.OFSDeltaObject, plumbing.REFDeltaObject:
			d := delta{offset: h.Offset, baseOffset: h.OffsetReference, baseHash: h.Reference, data: data}
			if src := base(&d); src != nil {
				if err := resolve(&d, src); err != nil {
					return nil, err
				}
				continue
			}
			// A base later in the pack; rare, but a pack may be written so.
			pending = append(pending, d)
			used += int64(len(data))
		default:
			return nil, fmt.Errorf("pack object at offset %d: %w", h.Offset, packfile.ErrMalformedPackFile)
		}
	}
	for len(pending) > 0 {
		var waiting []delta
		for _, d := range pending {
			src := base(&d)
			if src == nil {
				waiting = append(waiting, d)
				continue
			}
			used -= int64(len(d.data))
			if err := resolve(&d, src); err != nil {
				return nil, err
			}
		}
		if len(waiting) == len(pending) {
			return nil, fmt.Errorf("a delta at offset %d: %w", waiting[0].offset, packfile.ErrReferenceDeltaNotFound)
		}
		pending = waiting
	}
	if _, err := sc.Checksum(); err != nil {
		return nil, fmt.Errorf("reading pack: %w", err)
	}
	return objs, nil
}

// treeEntries counts the entries of a tree's bytes, "<mode> <name>\x00<hash>" each,
// without decoding them: the count costs no allocation, whatever the tree holds. A
// malformed tail is not counted; reading the tree reports it.
func treeEntries(data []byte) int {
	n := 0
	for {
		nul := bytes.IndexByte(data, 0)
		if nul < 0 || len(data) < nul+1+len(plumbing.ZeroHash) {
			return n
		}
		n++
		data = data[nul+1+len(plumbing.ZeroHash):]
	}
}

// inflate reads the next object's content; the scanner stops at the declared size.
func inflate(sc *packfile.Scanner, size int64) ([]byte, error) {
	buf := bytes.NewBuffer(make([]byte, 0, size))
	n, _, err := sc.NextObject(buf)
	if err != nil {
		return nil, err
	}
	if n != size {
		return nil, fmt.Errorf("%w: %d bytes, %d declared", packfile.ErrMalformedPackFile, n, size)
	}
	return buf.Bytes(), nil
}

// patch applies a delta to src.
func patch(src, d []byte) ([]byte, error) {
	if len(src) > 0 {
		out, err := packfile.PatchDelta(src, d)
		if err != nil {
			return nil, err
		}
		// The result grew by doubling: keep only what it holds.
		if cap(out) > len(out)+len(out)/8 {
			out = bytes.Clone(out)
		}
		return out, nil
	}
	// PatchDelta refuses an empty base, which a delta may still build on.
	var target plumbing.MemoryObject
	if err := packfile.ApplyDelta(&target, &storedObject{data: src}, d); err != nil {
		return nil, err
	}
	r, _ := target.Reader()
	return io.ReadAll(r)
}

// uvarint reads the little-endian base-128 sizes that open a delta.
func uvarint(b []byte) (uint64, []byte, error) {
	var v uint64
	for i := 0; i < len(b) && i < 10; i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i]&0x80 == 0 {
			return v, b[i+1:], nil
		}
	}
	return 0, nil, errors.New("truncated size")
}

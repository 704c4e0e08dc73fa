package gitsource

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/storage/memory"
)

// packEntry is one object of a hand-written pack: content, or a delta on base.
type packEntry struct {
	typ  plumbing.ObjectType
	base plumbing.Hash // for a REF delta
	data []byte
	// zeros, when set, is the content instead of data: that many zero bytes, streamed
	// into the compressor, never held.
	zeros int64
}

// writePack writes a version 2 pack the way a server sends it.
func writePack(t *testing.T, entries ...packEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteString("PACK")
	_ = binary.Write(&buf, binary.BigEndian, uint32(2))
	_ = binary.Write(&buf, binary.BigEndian, uint32(len(entries)))
	for _, e := range entries {
		size := int64(len(e.data))
		if e.zeros > 0 {
			size = e.zeros
		}
		c := byte(e.typ)<<4 | byte(size&0x0f)
		size >>= 4
		for size > 0 {
			buf.WriteByte(c | 0x80)
			c = byte(size & 0x7f)
			size >>= 7
		}
		buf.WriteByte(c)
		if e.typ == plumbing.REFDeltaObject {
			buf.Write(e.base[:])
		}
		z, _ := zlib.NewWriterLevel(&buf, zlib.BestSpeed)
		if e.zeros > 0 {
			chunk := make([]byte, 1<<20)
			for left := e.zeros; left > 0; left -= int64(len(chunk)) {
				if _, err := z.Write(chunk[:min(left, int64(len(chunk)))]); err != nil {
					t.Fatal(err)
				}
			}
		} else if _, err := z.Write(e.data); err != nil {
			t.Fatal(err)
		}
		if err := z.Close(); err != nil {
			t.Fatal(err)
		}
	}
	sum := sha1.Sum(buf.Bytes())
	buf.Write(sum[:])
	return buf.Bytes()
}

// randomBytes are bytes that neither compress nor delta against each other.
func randomBytes(seed uint64, n int) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

func blobHash(data []byte) plumbing.Hash { return plumbing.ComputeHash(plumbing.BlobObject, data) }

func TestPacksReadBackEveryObject(t *testing.T) {
	base := randomBytes(1, 8<<10)
	edited := append(append([]byte{}, base[:4<<10]...), append([]byte("an edit in the middle"), base[4<<10:]...)...)
	again := append(append([]byte{}, edited...), "and one at the end"...)
	for _, tc := range []struct {
		name string
		// inStore are objects the store has before the pack, for a thin pack.
		inStore [][]byte
		entries []packEntry
		want    [][]byte
	}{
		{"whole objects", nil, []packEntry{
			{typ: plumbing.BlobObject, data: base},
			{typ: plumbing.BlobObject, data: []byte{}},
		}, [][]byte{base, {}}},
		{"a chain of deltas on an object of the pack", nil, []packEntry{
			{typ: plumbing.BlobObject, data: base},
			{typ: plumbing.REFDeltaObject, base: blobHash(base), data: packfile.DiffDelta(base, edited)},
			{typ: plumbing.REFDeltaObject, base: blobHash(edited), data: packfile.DiffDelta(edited, again)},
		}, [][]byte{base, edited, again}},
		{"a delta before its base", nil, []packEntry{
			{typ: plumbing.REFDeltaObject, base: blobHash(base), data: packfile.DiffDelta(base, edited)},
			{typ: plumbing.BlobObject, data: base},
		}, [][]byte{edited, base}},
		{"a thin pack: a delta on an object the store has", [][]byte{base}, []packEntry{
			{typ: plumbing.REFDeltaObject, base: blobHash(base), data: packfile.DiffDelta(base, edited)},
		}, [][]byte{edited}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore()
			for _, d := range tc.inStore {
				s.add([]*storedObject{newStoredObject(plumbing.BlobObject, d)})
			}
			objs, err := readPack(bytes.NewReader(writePack(t, tc.entries...)), s, budget{Limits: Limits{Bytes: DefaultPullRequestBytes, Objects: DefaultPullRequestObjects}})
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) != len(tc.want) {
				t.Fatalf("%d objects read, want %d", len(objs), len(tc.want))
			}
			got := map[plumbing.Hash][]byte{}
			for _, o := range objs {
				got[o.hash] = o.data
			}
			for i, w := range tc.want {
				if !bytes.Equal(got[blobHash(w)], w) {
					t.Errorf("object %d (%s) reads differently", i, blobHash(w))
				}
			}
		})
	}
}

// A pack over the budget is refused from what its headers declare, before the content
// is inflated: a file of zeros compresses a thousandfold, and a delta of a few
// kilobytes can describe gigabytes.
func TestPacksOverTheBudgetAreRefusedBeforeTheyAreInflated(t *testing.T) {
	const limit = 1 << 20
	base := randomBytes(2, 64<<10)
	// Each single-byte instruction copies the whole 64 KiB base: 1,024 of them
	// describe a 64 MiB file.
	bomb := binary.AppendUvarint(binary.AppendUvarint(nil, uint64(len(base))), 64<<20)
	bomb = append(bomb, bytes.Repeat([]byte{0x80}, 1024)...)
	small := func(seed uint64) packEntry {
		return packEntry{typ: plumbing.BlobObject, data: randomBytes(seed, 300<<10)}
	}
	for _, tc := range []struct {
		name    string
		entries []packEntry
		want    BudgetError
		message string
	}{
		{"a file of zeros larger than the budget", []packEntry{{typ: plumbing.BlobObject, zeros: 16 << 20}},
			BudgetError{FileSize: 16 << 20}, "pull request #4: a file of 16 MiB is larger than the 1 MiB the hub reads for one pull request"},
		{"a small delta that makes a file larger than the budget", []packEntry{{typ: plumbing.BlobObject, data: base}, {typ: plumbing.REFDeltaObject, base: blobHash(base), data: bomb}},
			BudgetError{FileSize: 64 << 20}, "a file of 64 MiB"},
		{"files that add up to more than the budget", []packEntry{small(3), small(4), small(5), small(6)},
			BudgetError{}, "pull request #4: its last 50 commits bring more than 1 MiB of new content, the most the hub reads for one pull request"},
		{"more objects than the budget", slices.Repeat([]packEntry{{typ: plumbing.BlobObject, data: []byte("x")}}, 6),
			BudgetError{TooManyObjects: true}, "pull request #4: its last 50 commits bring more than 5 new files, directories and commits, the most the hub reads for one pull request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pack := writePack(t, tc.entries...)
			b := budget{Limits: Limits{Bytes: limit, Objects: 5}, scope: "pull request #4", per: "pull request", depth: PullRequestDepth}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			objs, err := readPack(bytes.NewReader(pack), newStore(), b)
			runtime.ReadMemStats(&after)
			var be *BudgetError
			if !errors.As(err, &be) {
				t.Fatalf("read %d objects, error %v: want a budget error", len(objs), err)
			}
			if be.FileSize != tc.want.FileSize || be.TooManyObjects != tc.want.TooManyObjects || be.Limits != b.Limits || be.Scope != b.scope {
				t.Errorf("error %+v, want %+v", be, tc.want)
			}
			if !strings.Contains(err.Error(), tc.message) {
				t.Errorf("error %q, want it to say %q", err, tc.message)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 4*limit {
				t.Errorf("refusing the pack allocated %d MiB, more than the budget allows", grew>>20)
			}
		})
	}
}

// The store is what go-git reads and writes through: it must hold and find what
// go-git's own memory storage would.
func TestStoreKeepsWhatGoGitWrites(t *testing.T) {
	s := newStore()
	ref := memory.NewStorage()
	for i := range 3 {
		o := ref.NewEncodedObject()
		o.SetType(plumbing.BlobObject)
		w, _ := o.Writer()
		_, _ = w.Write(randomBytes(uint64(i), 100))
		h, err := s.SetEncodedObject(o)
		if err != nil || h != o.Hash() {
			t.Fatalf("stored %s as %s (%v)", o.Hash(), h, err)
		}
		got, err := s.EncodedObject(plumbing.BlobObject, h)
		if err != nil || got.Size() != 100 {
			t.Fatalf("reading %s back: %v", h, err)
		}
		if _, err := s.EncodedObject(plumbing.TreeObject, h); !errors.Is(err, plumbing.ErrObjectNotFound) {
			t.Fatalf("a blob found as a tree: %v", err)
		}
	}
	if st := s.stats(); st.Objects != 3 || st.Bytes != 300 {
		t.Fatalf("stats %+v after three 100-byte files", st)
	}
}

// wideTree is the bytes of a directory of n entries, all naming one file.
func wideTree(n int, file plumbing.Hash) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, "100644 f%07d\x00", i)
		b.Write(file[:])
	}
	return b.Bytes()
}

// A directory costs the hub some hundreds of bytes an entry to read, and one tree
// object of a push of a few MiB can hold millions: a directory wider than the budget
// is refused while its bytes are counted, before any entry is decoded, and says so to
// whoever pushed it.
func TestWideDirectoriesAreRefusedBeforeTheirEntriesAreRead(t *testing.T) {
	file := []byte("x\n")
	commitOf := func(tree []byte) packEntry {
		h := plumbing.ComputeHash(plumbing.TreeObject, tree)
		return packEntry{typ: plumbing.CommitObject, data: fmt.Appendf(nil,
			"tree %s\nauthor a <a@example.com> 0 +0000\ncommitter a <a@example.com> 0 +0000\n\nwide\n", h)}
	}
	narrow := wideTree(10, blobHash(file))
	widened := wideTree(11, blobHash(file))
	huge := wideTree(400_000, blobHash(file))
	for _, tc := range []struct {
		name    string
		limits  Limits
		entries []packEntry
		// want is the width of the refused directory; 0 when the pack is read.
		want    int
		message string
	}{
		{"a commit with a directory of 400,000 entries", Limits{}, []packEntry{
			{typ: plumbing.BlobObject, data: file}, {typ: plumbing.TreeObject, data: huge}, commitOf(huge),
		}, 400_000, "pull request #4: its last 50 commits bring a directory of 400000 entries, more than the 100000 the hub reads in one directory"},
		{"a directory as wide as the budget", Limits{DirEntries: 10}, []packEntry{
			{typ: plumbing.BlobObject, data: file}, {typ: plumbing.TreeObject, data: narrow}, commitOf(narrow),
		}, 0, ""},
		{"a delta that widens a directory past the budget", Limits{DirEntries: 10}, []packEntry{
			{typ: plumbing.BlobObject, data: file}, {typ: plumbing.TreeObject, data: narrow},
			{typ: plumbing.REFDeltaObject, base: plumbing.ComputeHash(plumbing.TreeObject, narrow), data: packfile.DiffDelta(narrow, widened)},
		}, 11, "a directory of 11 entries, more than the 10 the hub reads in one directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pack := writePack(t, tc.entries...)
			b := budget{Limits: tc.limits.withDefaults(DefaultPullRequestBytes, DefaultPullRequestObjects), scope: "pull request #4", per: "pull request", depth: PullRequestDepth}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			objs, err := readPack(bytes.NewReader(pack), newStore(), b)
			runtime.ReadMemStats(&after)
			if tc.want == 0 {
				if err != nil || len(objs) != len(tc.entries) {
					t.Fatalf("read %d objects of %d, error %v: want all read", len(objs), len(tc.entries), err)
				}
				return
			}
			var be *BudgetError
			if !errors.As(err, &be) || be.DirEntries != tc.want || be.Limits != b.Limits {
				t.Fatalf("read %d objects, error %+v: want a budget error on a directory of %d entries", len(objs), err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.message) {
				t.Errorf("error %q, want it to say %q", err, tc.message)
			}
			// Decoded, the 400,000 entries alone would be some 100 MiB; their bytes
			// are 14 MiB, read once.
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 2*uint64(len(pack))+(4<<20) && grew > 32<<20 {
				t.Errorf("refusing the directory allocated %d MiB for a pack of %d MiB", grew>>20, len(pack)>>20)
			}
		})
	}
}

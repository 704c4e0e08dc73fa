package gitsource

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"sync"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// store is one in-memory copy of the repository: objects, the refs that name what
// the copy keeps, and the shallow boundary of its history.
//
//   - Every pack a fetch brings is parsed within the fetch's budget (see readPack),
//     and its objects become visible together, or not at all.
//   - Objects are immutable once stored and the map holding them is guarded, so a
//     Snapshot or PullRequest may read its trees while a later fetch adds objects.
//   - Releasing objects never changes a store: prune copies what is reachable into a
//     new one, and whoever still reads the old one keeps it alive by reference.
//
// refs and shallow are only used under the owning Source's lock.
type store struct {
	mu      sync.RWMutex
	objects map[plumbing.Hash]*storedObject
	// size is the content of objects in bytes.
	size int64

	refs    map[plumbing.ReferenceName]plumbing.Hash
	shallow []plumbing.Hash
	// live is what the store held after its last pruning.
	live Stats
}

// The Source's readers (go-git's commit and tree decoding) see a store as this.
var _ storer.EncodedObjectStorer = (*store)(nil)

func newStore() *store {
	return &store{objects: map[plumbing.Hash]*storedObject{}, refs: map[plumbing.ReferenceName]plumbing.Hash{}}
}

// Stats measure one in-memory copy of the repository.
type Stats struct {
	Objects int
	// Bytes is the content of the objects (commits, directories, files), uncompressed.
	Bytes int64
}

func (s *store) stats() Stats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return Stats{Objects: len(s.objects), Bytes: s.size}
}

// add makes objects visible together, and returns those the store did not hold: what
// they cost it.
func (s *store) add(objs []*storedObject) []*storedObject {
	s.mu.Lock()
	defer s.mu.Unlock()
	var added []*storedObject
	for _, o := range objs {
		if _, ok := s.objects[o.hash]; !ok {
			s.objects[o.hash] = o
			s.size += int64(len(o.data))
			added = append(added, o)
		}
	}
	return added
}

func (s *store) get(h plumbing.Hash) *storedObject {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.objects[h]
}

func (s *store) have(h plumbing.Hash) bool { return s.get(h) != nil }

// setShallow records the boundary a server reported after a fetch.
func (s *store) setShallow(shallow, unshallow []plumbing.Hash) {
	for _, h := range shallow {
		if !slices.Contains(s.shallow, h) {
			s.shallow = append(s.shallow, h)
		}
	}
	s.shallow = slices.DeleteFunc(s.shallow, func(h plumbing.Hash) bool { return slices.Contains(unshallow, h) })
}

// NewEncodedObject is a scratch object for go-git; SetEncodedObject copies it.
func (s *store) NewEncodedObject() plumbing.EncodedObject { return &plumbing.MemoryObject{} }

// SetEncodedObject stores a copy of obj. Fetches do not come this way but through
// readPack; go-git's readers write nothing.
func (s *store) SetEncodedObject(obj plumbing.EncodedObject) (plumbing.Hash, error) {
	switch obj.Type() {
	case plumbing.CommitObject, plumbing.TreeObject, plumbing.BlobObject, plumbing.TagObject:
	default:
		return plumbing.ZeroHash, plumbing.ErrInvalidType
	}
	r, err := obj.Reader()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	o := newStoredObject(obj.Type(), data)
	s.add([]*storedObject{o})
	return o.hash, nil
}

func (s *store) EncodedObject(t plumbing.ObjectType, h plumbing.Hash) (plumbing.EncodedObject, error) {
	o := s.get(h)
	if o == nil || t != plumbing.AnyObject && o.typ != t {
		return nil, plumbing.ErrObjectNotFound
	}
	return o, nil
}

func (s *store) IterEncodedObjects(t plumbing.ObjectType) (storer.EncodedObjectIter, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var objs []plumbing.EncodedObject
	for _, o := range s.objects {
		if t == plumbing.AnyObject || o.typ == t {
			objs = append(objs, o)
		}
	}
	return storer.NewEncodedObjectSliceIter(objs), nil
}

func (s *store) HasEncodedObject(h plumbing.Hash) error {
	if !s.have(h) {
		return plumbing.ErrObjectNotFound
	}
	return nil
}

func (s *store) EncodedObjectSize(h plumbing.Hash) (int64, error) {
	o := s.get(h)
	if o == nil {
		return 0, plumbing.ErrObjectNotFound
	}
	return int64(len(o.data)), nil
}

func (s *store) AddAlternate(string) error {
	return errors.New("gitsource: an in-memory copy has no alternates")
}

// storedObject is an object as stored: its content never changes.
type storedObject struct {
	typ  plumbing.ObjectType
	hash plumbing.Hash
	data []byte
}

func newStoredObject(t plumbing.ObjectType, data []byte) *storedObject {
	return &storedObject{typ: t, hash: plumbing.ComputeHash(t, data), data: data}
}

func (o *storedObject) Hash() plumbing.Hash             { return o.hash }
func (o *storedObject) Type() plumbing.ObjectType       { return o.typ }
func (o *storedObject) SetType(plumbing.ObjectType)     {}
func (o *storedObject) Size() int64                     { return int64(len(o.data)) }
func (o *storedObject) SetSize(int64)                   {}
func (o *storedObject) Writer() (io.WriteCloser, error) { return nil, errReadOnly }

// Reader is seekable, like go-git's own in-memory objects.
func (o *storedObject) Reader() (io.ReadCloser, error) {
	return readerCloser{bytes.NewReader(o.data)}, nil
}

var errReadOnly = errors.New("gitsource: a stored object is read-only")

type readerCloser struct{ *bytes.Reader }

func (readerCloser) Close() error { return nil }

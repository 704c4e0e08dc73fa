// Package gitnotes keeps commit statuses in the fleet repository itself, as git notes
// under refs/notes/flotilla, for a hub that has no forge to post to: any git server
// works, and `git notes --ref flotilla show <commit>` or `flotilla commit status`
// reads them.
//
// A note holds one JSON document per commit with the newest status of every context and
// how many times each was set. Writers fetch the notes ref, change the note, commit and
// push without force; a push that lost a race with another writer is redone on top of
// the winner's notes, so nothing written is lost. A writer fetches only the newest
// notes, never their history, and fans the notes tree out as git does once it grows, so
// that what one status costs does not grow with every status set before. It holds the
// newest notes commit and its trees, which say where each note is, and the newest few
// notes themselves: an older note is fetched again when it is read, so that what a hub
// holds does not grow with every note it ever wrote.
//
// Every connection to the server is given up when the context of the call ends, over
// SSH too, whose connection go-git starts with no context: a server that accepts and
// never answers fails the post in time instead of holding the backend for good, and
// costs a few connections however often the post is retried (see gitconn).
package gitnotes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage/memory"
	"k8s.io/utils/lru"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/internal/gitconn"
)

// DefaultRef is where flotilla's notes live.
const DefaultRef = "refs/notes/flotilla"

// Options say which repository holds the notes.
type Options struct {
	URL  string
	Auth transport.AuthMethod
	// Ref defaults to DefaultRef.
	Ref string
	// Author signs the notes commits; defaults to "flotilla <flotilla@localhost>".
	Author object.Signature
	// Attempts bounds how often a push that lost a race is redone. Default 10.
	Attempts int
	// Now is the clock for note times; defaults to time.Now.
	Now func() time.Time
}

// Backend is a commitstatus.Backend over git notes.
type Backend struct {
	opts  Options
	ep    *transport.Endpoint
	mu    sync.Mutex
	store *memory.Storage
	repo  *git.Repository
	// notes are the contents of the newest notes read or written, by blob: the store
	// holds the notes' commit and trees only (see keepNewest).
	notes *lru.Cache
	// hangs counts the connections given up on (see gitconn).
	hangs gitconn.Hangs
}

// heldNotes is how many notes a backend holds, and heldNoteSize the largest it holds:
// the publisher reads a commit's statuses once and then writes them, so the notes of
// the commits a hub posts to now are read from memory; any other is fetched.
const (
	heldNotes    = 64
	heldNoteSize = 64 << 10
)

var _ commitstatus.Backend = (*Backend)(nil)

// Note is the document kept for one commit.
type Note struct {
	Statuses map[string]Entry `json:"statuses"`
}

// Entry is one context's newest status on a commit.
type Entry struct {
	State       commitstatus.State `json:"state"`
	Description string             `json:"description,omitempty"`
	TargetURL   string             `json:"targetURL,omitempty"`
	Updated     time.Time          `json:"updated"`
	// Count is how many times the context was set on the commit.
	Count int `json:"count"`
}

// New prepares a backend; nothing is fetched until the first call.
func New(opts Options) (*Backend, error) {
	if opts.URL == "" {
		return nil, errors.New("gitnotes: no repository URL")
	}
	if opts.Ref == "" {
		opts.Ref = DefaultRef
	}
	if !strings.HasPrefix(opts.Ref, "refs/notes/") {
		return nil, fmt.Errorf("gitnotes: %q is not a notes ref (refs/notes/...)", opts.Ref)
	}
	if opts.Author.Name == "" {
		opts.Author = object.Signature{Name: "flotilla", Email: "flotilla@localhost"}
	}
	if opts.Attempts <= 0 {
		opts.Attempts = 10
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	ep, err := transport.NewEndpoint(opts.URL)
	if err != nil {
		return nil, fmt.Errorf("gitnotes: the URL %s: %s", gitsource.RedactURL(opts.URL), gitsource.RedactError(err, opts.Auth, opts.URL))
	}
	b := &Backend{opts: opts, ep: ep, notes: lru.New(heldNotes)}
	if err := b.open(memory.NewStorage()); err != nil {
		return nil, err
	}
	return b, nil
}

// open makes st the backend's store.
func (b *Backend) open(st *memory.Storage) error {
	repo, err := git.Init(st, nil)
	if err != nil {
		return fmt.Errorf("gitnotes: %w", err)
	}
	b.store, b.repo = st, repo
	return nil
}

// keepNewest drops every object but the notes commit head and its trees, and keeps the
// notes the store holds, up to heldNotes, among the newest: the notes' history is never
// read again, and every status set writes a new note, a new version of the trees on its
// path and a commit, which a hub that posts for weeks would otherwise hold all along,
// and with them every note it ever wrote or fetched. The trees stay: they say where
// each note is and are written anew on every set; a note that is read again is fetched.
// The store is then shallow at head, which the next fetch and push build on.
func (b *Backend) keepNewest(head plumbing.Hash) error {
	if head.IsZero() {
		return nil
	}
	c, err := b.repo.CommitObject(head)
	if err != nil {
		return fmt.Errorf("gitnotes: %s at %s: %w", b.opts.Ref, head, err)
	}
	st := memory.NewStorage()
	keep := func(h plumbing.Hash) (plumbing.EncodedObject, error) {
		o, err := b.store.EncodedObject(plumbing.AnyObject, h)
		if err != nil {
			return nil, fmt.Errorf("gitnotes: %s at %s: %w", b.opts.Ref, head, err)
		}
		if _, err := st.SetEncodedObject(o); err != nil {
			return nil, fmt.Errorf("gitnotes: %w", err)
		}
		return o, nil
	}
	if _, err := keep(head); err != nil {
		return err
	}
	trees := []plumbing.Hash{c.TreeHash}
	for len(trees) > 0 {
		h := trees[len(trees)-1]
		trees = trees[:len(trees)-1]
		if _, ok := st.Objects[h]; ok {
			continue
		}
		o, err := keep(h)
		if err != nil {
			return err
		}
		var t object.Tree
		if err := t.Decode(o); err != nil {
			return fmt.Errorf("gitnotes: tree of %s at %s: %w", b.opts.Ref, head, err)
		}
		for _, e := range t.Entries {
			if e.Mode == filemode.Dir {
				trees = append(trees, e.Hash)
			}
		}
	}
	for h, o := range b.store.Blobs {
		b.hold(h, o)
	}
	if err := st.SetShallow([]plumbing.Hash{head}); err != nil {
		return fmt.Errorf("gitnotes: %w", err)
	}
	if err := st.SetReference(plumbing.NewHashReference(plumbing.ReferenceName(b.opts.Ref), head)); err != nil {
		return fmt.Errorf("gitnotes: %w", err)
	}
	return b.open(st)
}

// advance makes the store hold next, which a push just took from head to the server,
// as keepNewest would, without going through every tree: the store held head and its
// trees, and ch says which of them next wrote anew. The note written is held among the
// newest.
func (b *Backend) advance(head, next plumbing.Hash, ch change) error {
	if head.IsZero() {
		return b.keepNewest(next)
	}
	added := map[plumbing.Hash]bool{}
	for _, h := range ch.added {
		added[h] = true
	}
	if o, err := b.store.EncodedObject(plumbing.BlobObject, ch.added[0]); err == nil {
		b.hold(o.Hash(), o)
	}
	b.remove(ch.added[0], head)
	for _, h := range ch.replaced {
		if !added[h] {
			b.remove(h)
		}
	}
	if err := b.store.SetShallow([]plumbing.Hash{next}); err != nil {
		return fmt.Errorf("gitnotes: %w", err)
	}
	return nil
}

// remove drops the objects hs from the store.
func (b *Backend) remove(hs ...plumbing.Hash) {
	for _, h := range hs {
		delete(b.store.Objects, h)
		delete(b.store.Commits, h)
		delete(b.store.Trees, h)
		delete(b.store.Blobs, h)
	}
}

// hold keeps the note blob o, named h, among the newest notes, unless it is larger
// than heldNoteSize.
func (b *Backend) hold(h plumbing.Hash, o plumbing.EncodedObject) {
	if o.Size() > heldNoteSize {
		return
	}
	r, err := o.Reader()
	if err != nil {
		return
	}
	defer r.Close()
	if data, err := io.ReadAll(r); err == nil {
		b.notes.Add(h, data)
	}
}

// Canonical is st itself: a note has no length limit and keeps all four states.
func (b *Backend) Canonical(st commitstatus.Status) commitstatus.Status { return st }

// Latest reads the note of commit.
func (b *Backend) Latest(ctx context.Context, commit string) (map[string]commitstatus.Status, error) {
	n, err := b.Read(ctx, commit)
	if err != nil {
		return nil, err
	}
	out := make(map[string]commitstatus.Status, len(n.Statuses))
	for name, e := range n.Statuses {
		out[name] = commitstatus.Status{Context: name, State: e.State, Description: e.Description, TargetURL: e.TargetURL}
	}
	return out, nil
}

// Read returns the whole note of commit, an empty one when there is none.
func (b *Backend) Read(ctx context.Context, commit string) (Note, error) {
	h, err := parseCommit(commit)
	if err != nil {
		return Note{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	head, err := b.fetch(ctx)
	if err != nil {
		return Note{}, err
	}
	n, _, err := b.note(ctx, head, h)
	return n, err
}

// Set records st on commit and pushes the notes.
func (b *Backend) Set(ctx context.Context, commit string, st commitstatus.Status) error {
	h, err := parseCommit(commit)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for range b.opts.Attempts {
		head, err := b.fetch(ctx)
		if err != nil {
			return err
		}
		n, _, err := b.note(ctx, head, h)
		if errors.Is(err, errMoved) {
			// The note changed since head, and was not held: the notes fetched next
			// bring it.
			continue
		}
		if err != nil {
			return err
		}
		if n.Statuses == nil {
			n.Statuses = map[string]Entry{}
		}
		e := n.Statuses[st.Context]
		n.Statuses[st.Context] = Entry{State: st.State, Description: st.Description, TargetURL: st.TargetURL, Updated: b.opts.Now().UTC(), Count: e.Count + 1}
		next, written, err := b.commit(head, h, n, fmt.Sprintf("%s: %s on %s", st.Context, st.State, h))
		if err != nil {
			return err
		}
		err = b.push(ctx, head, next, written.added)
		if err == nil {
			return b.advance(head, next, written)
		}
		// What this attempt wrote was not taken: it goes, or the store would keep it
		// until another writer's notes are fetched.
		b.remove(written.added...)
		// A writer that pushed first shows as the ref moved from head, or, when both
		// pushes met on the server, as whatever the losing receive-pack said: either way
		// the ref has moved, and the change is redone on top of it.
		if errors.Is(err, errMoved) {
			continue
		}
		if moved, lerr := b.moved(ctx, head); lerr != nil || !moved {
			return b.wrap("pushing notes", err)
		}
	}
	return fmt.Errorf("gitnotes: %s on %s: lost the race to push %d times", st.Context, h, b.opts.Attempts)
}

// note reads the note on commit in the notes commit head, with the path it is at.
func (b *Backend) note(ctx context.Context, head, commit plumbing.Hash) (Note, string, error) {
	if head.IsZero() {
		return Note{}, "", nil
	}
	tree, err := b.notesTree(head)
	if err != nil {
		return Note{}, "", err
	}
	p, blob, ok, err := findNote(tree, commit.String())
	if err != nil || !ok {
		return Note{}, "", err
	}
	data, err := b.blob(ctx, blob)
	if err != nil {
		return Note{}, "", fmt.Errorf("gitnotes: note of %s: %w", commit, err)
	}
	var n Note
	if err := json.Unmarshal(data, &n); err != nil {
		return Note{}, "", fmt.Errorf("gitnotes: note of %s in %s is not flotilla's: %w", commit, b.opts.Ref, err)
	}
	return n, p, nil
}

// maxNote bounds what is read of a note, so a hostile note cannot exhaust the hub.
const maxNote = 4 << 20

func (b *Backend) notesTree(head plumbing.Hash) (*object.Tree, error) {
	c, err := b.repo.CommitObject(head)
	if err != nil {
		return nil, fmt.Errorf("gitnotes: %s at %s: %w", b.opts.Ref, head, err)
	}
	t, err := c.Tree()
	if err != nil {
		return nil, fmt.Errorf("gitnotes: tree of %s at %s: %w", b.opts.Ref, head, err)
	}
	return t, nil
}

// blob is the content of the note blob h: held, or else fetched.
func (b *Backend) blob(ctx context.Context, h plumbing.Hash) ([]byte, error) {
	if v, ok := b.notes.Get(h); ok {
		return v.([]byte), nil
	}
	o, err := b.store.EncodedObject(plumbing.BlobObject, h)
	if errors.Is(err, plumbing.ErrObjectNotFound) {
		o, err = b.fetchBlob(ctx, h)
	}
	if err != nil {
		return nil, err
	}
	if o.Size() > maxNote {
		return nil, fmt.Errorf("larger than %d bytes", maxNote)
	}
	r, err := o.Reader()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, maxNote+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxNote {
		return nil, fmt.Errorf("larger than %d bytes", maxNote)
	}
	if len(data) <= heldNoteSize {
		b.notes.Add(h, data)
	}
	return data, nil
}

// findNote finds the note of the object named hex, flat or under the fan-out
// directories git notes makes in large notes trees (ab/cdef...): its path and blob.
func findNote(t *object.Tree, hex string) (string, plumbing.Hash, bool, error) {
	prefix := ""
	for rest := hex; ; {
		for _, e := range t.Entries {
			if e.Name == rest && e.Mode.IsFile() {
				return prefix + rest, e.Hash, true, nil
			}
		}
		if len(rest) <= 2 {
			return "", plumbing.ZeroHash, false, nil
		}
		e, err := t.FindEntry(rest[:2])
		if err != nil || e.Mode != filemode.Dir {
			return "", plumbing.ZeroHash, false, nil
		}
		sub, err := t.Tree(rest[:2])
		if err != nil {
			return "", plumbing.ZeroHash, false, err
		}
		prefix, rest, t = prefix+rest[:2]+"/", rest[2:], sub
	}
}

// fanOutAt is how many entries a level of the notes tree holds before new notes go one
// level down, under a directory named by the next two digits of their commit, as git
// itself fans out a notes tree that grows: every status set writes the trees on its
// note's path anew, which in a flat tree of a year's commits would be megabytes.
const fanOutAt = 256

// newNotePath is where the note of the object named hex goes in the notes tree t: into
// the fan-out directories t already has on its way, and into a new one at a level that
// holds fanOutAt entries or more. Git reads notes at any level, mixed.
func newNotePath(t *object.Tree, hex string) (string, error) {
	prefix := ""
	for rest := hex; ; {
		if len(rest) <= 2 {
			return prefix + rest, nil
		}
		if e, err := t.FindEntry(rest[:2]); err == nil && e.Mode == filemode.Dir {
			sub, err := t.Tree(rest[:2])
			if err != nil {
				return "", fmt.Errorf("gitnotes: notes tree %s%s: %w", prefix, rest[:2], err)
			}
			prefix, rest, t = prefix+rest[:2]+"/", rest[2:], sub
			continue
		}
		if len(t.Entries) >= fanOutAt {
			return prefix + rest[:2] + "/" + rest[2:], nil
		}
		return prefix + rest, nil
	}
}

// change is what a notes commit wrote on top of the one before.
type change struct {
	// added are the objects written, the note's blob first: what a push sends.
	added []plumbing.Hash
	// replaced are the trees of the commit before that it wrote anew.
	replaced []plumbing.Hash
}

// commit writes a notes commit on top of head with commit's note set to n.
func (b *Backend) commit(head, commit plumbing.Hash, n Note, msg string) (plumbing.Hash, change, error) {
	var ch change
	data, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		return plumbing.ZeroHash, ch, err
	}
	data = append(data, '\n')
	write := func(encode func(plumbing.EncodedObject) error) (plumbing.Hash, error) {
		h, err := b.write(encode)
		if err == nil {
			ch.added = append(ch.added, h)
		}
		return h, err
	}
	blob, err := write(func(o plumbing.EncodedObject) error {
		o.SetType(plumbing.BlobObject)
		w, err := o.Writer()
		if err != nil {
			return err
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
		return w.Close()
	})
	if err != nil {
		return plumbing.ZeroHash, ch, err
	}
	var root *object.Tree
	var parents []plumbing.Hash
	notePath := commit.String()
	if !head.IsZero() {
		if root, err = b.notesTree(head); err != nil {
			return plumbing.ZeroHash, ch, err
		}
		parents = []plumbing.Hash{head}
		if p, _, ok, err := findNote(root, commit.String()); err != nil {
			return plumbing.ZeroHash, ch, err
		} else if ok {
			notePath = p
		} else if notePath, err = newNotePath(root, commit.String()); err != nil {
			return plumbing.ZeroHash, ch, err
		}
	}
	treeHash, err := b.replace(write, &ch, root, strings.Split(notePath, "/"), blob)
	if err != nil {
		return plumbing.ZeroHash, ch, err
	}
	sig := b.opts.Author
	sig.When = b.opts.Now()
	c := &object.Commit{Author: sig, Committer: sig, Message: msg + "\n", TreeHash: treeHash, ParentHashes: parents}
	next, err := write(func(o plumbing.EncodedObject) error { return c.Encode(o) })
	return next, ch, err
}

// replace writes, with write, a copy of t (nil for an empty tree) with the file at path
// set to blob, and counts t in ch as replaced.
func (b *Backend) replace(write func(func(plumbing.EncodedObject) error) (plumbing.Hash, error), ch *change, t *object.Tree, path []string, blob plumbing.Hash) (plumbing.Hash, error) {
	var entries []object.TreeEntry
	if t != nil {
		entries = append(entries, t.Entries...)
		ch.replaced = append(ch.replaced, t.Hash)
	}
	name := path[0]
	entry := object.TreeEntry{Name: name, Mode: filemode.Regular, Hash: blob}
	if len(path) > 1 {
		var sub *object.Tree
		if t != nil {
			if s, err := t.Tree(name); err == nil {
				sub = s
			}
		}
		h, err := b.replace(write, ch, sub, path[1:], blob)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		entry = object.TreeEntry{Name: name, Mode: filemode.Dir, Hash: h}
	}
	found := false
	for i := range entries {
		if entries[i].Name == name {
			entries[i], found = entry, true
		}
	}
	if !found {
		entries = append(entries, entry)
	}
	// Git orders tree entries by name, a directory as if its name ended in a slash.
	key := func(e object.TreeEntry) string {
		if e.Mode == filemode.Dir {
			return e.Name + "/"
		}
		return e.Name
	}
	sort.Slice(entries, func(i, j int) bool { return key(entries[i]) < key(entries[j]) })
	nt := &object.Tree{Entries: entries}
	return write(func(o plumbing.EncodedObject) error { return nt.Encode(o) })
}

func (b *Backend) write(encode func(plumbing.EncodedObject) error) (plumbing.Hash, error) {
	o := b.repo.Storer.NewEncodedObject()
	if err := encode(o); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("gitnotes: encoding: %w", err)
	}
	return b.repo.Storer.SetEncodedObject(o)
}

func parseCommit(s string) (plumbing.Hash, error) {
	if len(s) != 40 || !plumbing.IsHash(s) {
		return plumbing.ZeroHash, fmt.Errorf("gitnotes: %q is not a full commit hash", s)
	}
	return plumbing.NewHash(s), nil
}

func (b *Backend) wrap(op string, err error) error {
	if errors.Is(err, transport.ErrAuthenticationRequired) || errors.Is(err, transport.ErrAuthorizationFailed) {
		return fmt.Errorf("gitnotes: %s %s: %w", op, gitsource.RedactURL(b.opts.URL), commitstatus.ErrUnauthorized)
	}
	return fmt.Errorf("gitnotes: %s %s: %s", op, gitsource.RedactURL(b.opts.URL), gitsource.RedactError(err, b.opts.Auth, b.opts.URL))
}

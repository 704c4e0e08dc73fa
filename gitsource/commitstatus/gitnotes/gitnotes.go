// Package gitnotes keeps commit statuses in the fleet repository itself, as git notes
// under refs/notes/flotilla, for a hub that has no forge to post to: any git server
// works, and `git notes --ref flotilla show <commit>` or `flotilla commit status`
// reads them.
//
// A note holds one JSON document per commit with the newest status of every context and
// how many times each was set. Writers fetch the notes ref, change the note, commit and
// push without force; a push that lost a race with another writer is redone on top of
// the winner's notes, so nothing written is lost. A writer fetches and holds only the
// newest notes, never their history, and fans the notes tree out as git does once it
// grows, so that what one status costs does not grow with every status set before.
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
	"github.com/go-git/go-git/v5/plumbing/revlist"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage/memory"

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
	// kept is how many objects, and keptBytes how many bytes of them, the store held
	// when it last kept only the newest notes, and written how many bytes of objects
	// were written since (see keepNewest).
	kept      int
	keptBytes int64
	written   int64
	// hangs counts the connections given up on (see gitconn).
	hangs gitconn.Hangs
}

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
	b := &Backend{opts: opts, ep: ep}
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
	b.kept, b.keptBytes, b.written = len(st.Objects), 0, 0
	for _, o := range st.Objects {
		b.keptBytes += o.Size()
	}
	return nil
}

// keepNewest drops every object but the notes commit head and its tree, once the store
// has grown well past that: the notes' history is never read again, and every status
// set writes a new version of its note and of the notes' tree, which a hub that posts
// for weeks would otherwise hold in memory all along. The store is then shallow at
// head, which the next fetch and push build on.
func (b *Backend) keepNewest(head plumbing.Hash) error {
	if head.IsZero() || (len(b.store.Objects) <= 2*b.kept+keepSlack && b.written <= max(keepBytes, b.keptBytes)) {
		return nil
	}
	c, err := b.repo.CommitObject(head)
	if err != nil {
		return fmt.Errorf("gitnotes: %s at %s: %w", b.opts.Ref, head, err)
	}
	newest, err := revlist.Objects(b.repo.Storer, []plumbing.Hash{c.TreeHash}, nil)
	if err != nil {
		return fmt.Errorf("gitnotes: tree of %s at %s: %w", b.opts.Ref, head, err)
	}
	st := memory.NewStorage()
	for _, h := range append(newest, head) {
		o, err := b.repo.Storer.EncodedObject(plumbing.AnyObject, h)
		if err != nil {
			return fmt.Errorf("gitnotes: %s at %s: %w", b.opts.Ref, head, err)
		}
		if _, err := st.SetEncodedObject(o); err != nil {
			return fmt.Errorf("gitnotes: %w", err)
		}
	}
	if err := st.SetShallow([]plumbing.Hash{head}); err != nil {
		return fmt.Errorf("gitnotes: %w", err)
	}
	if err := st.SetReference(plumbing.NewHashReference(plumbing.ReferenceName(b.opts.Ref), head)); err != nil {
		return fmt.Errorf("gitnotes: %w", err)
	}
	return b.open(st)
}

// The store keeps only the newest notes once it holds twice what it did then and
// keepSlack objects more, or once what was written since outweighs what it kept, and
// keepBytes. Every status set writes the notes' root tree again, 256 entries once the
// notes fan out: counted in bytes, the versions a hub holds between two keeps stay
// within about what the newest notes weigh, not tens of MiB of trees gone by.
const (
	keepSlack = 64
	keepBytes = 1 << 20
)

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
	n, _, err := b.note(head, h)
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
		n, _, err := b.note(head, h)
		if err != nil {
			return err
		}
		if n.Statuses == nil {
			n.Statuses = map[string]Entry{}
		}
		e := n.Statuses[st.Context]
		n.Statuses[st.Context] = Entry{State: st.State, Description: st.Description, TargetURL: st.TargetURL, Updated: b.opts.Now().UTC(), Count: e.Count + 1}
		next, err := b.commit(head, h, n, fmt.Sprintf("%s: %s on %s", st.Context, st.State, h))
		if err != nil {
			return err
		}
		err = b.push(ctx, head, next)
		if err == nil {
			return b.keepNewest(next)
		}
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
func (b *Backend) note(head, commit plumbing.Hash) (Note, string, error) {
	if head.IsZero() {
		return Note{}, "", nil
	}
	tree, err := b.notesTree(head)
	if err != nil {
		return Note{}, "", err
	}
	p, ok, err := findNote(tree, commit.String())
	if err != nil || !ok {
		return Note{}, "", err
	}
	f, err := tree.File(p)
	if err != nil {
		return Note{}, "", fmt.Errorf("gitnotes: note of %s: %w", commit, err)
	}
	r, err := f.Reader()
	if err != nil {
		return Note{}, "", fmt.Errorf("gitnotes: note of %s: %w", commit, err)
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, maxNote+1))
	if err != nil {
		return Note{}, "", fmt.Errorf("gitnotes: note of %s: %w", commit, err)
	}
	if len(data) > maxNote {
		return Note{}, "", fmt.Errorf("gitnotes: note of %s is larger than %d bytes", commit, maxNote)
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

// findNote finds the note of the object named hex, flat or under the fan-out
// directories git notes makes in large notes trees (ab/cdef...).
func findNote(t *object.Tree, hex string) (string, bool, error) {
	prefix := ""
	for rest := hex; ; {
		for _, e := range t.Entries {
			if e.Name == rest && e.Mode.IsFile() {
				return prefix + rest, true, nil
			}
		}
		if len(rest) <= 2 {
			return "", false, nil
		}
		e, err := t.FindEntry(rest[:2])
		if err != nil || e.Mode != filemode.Dir {
			return "", false, nil
		}
		sub, err := t.Tree(rest[:2])
		if err != nil {
			return "", false, err
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

// commit writes a notes commit on top of head with commit's note set to n.
func (b *Backend) commit(head, commit plumbing.Hash, n Note, msg string) (plumbing.Hash, error) {
	data, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		return plumbing.ZeroHash, err
	}
	data = append(data, '\n')
	blob, err := b.write(func(o plumbing.EncodedObject) error {
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
		return plumbing.ZeroHash, err
	}
	var root *object.Tree
	var parents []plumbing.Hash
	notePath := commit.String()
	if !head.IsZero() {
		if root, err = b.notesTree(head); err != nil {
			return plumbing.ZeroHash, err
		}
		parents = []plumbing.Hash{head}
		if p, ok, err := findNote(root, commit.String()); err != nil {
			return plumbing.ZeroHash, err
		} else if ok {
			notePath = p
		} else if notePath, err = newNotePath(root, commit.String()); err != nil {
			return plumbing.ZeroHash, err
		}
	}
	treeHash, err := b.replace(root, strings.Split(notePath, "/"), blob)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	sig := b.opts.Author
	sig.When = b.opts.Now()
	c := &object.Commit{Author: sig, Committer: sig, Message: msg + "\n", TreeHash: treeHash, ParentHashes: parents}
	return b.write(func(o plumbing.EncodedObject) error { return c.Encode(o) })
}

// replace writes a copy of t (nil for an empty tree) with the file at path set to blob.
func (b *Backend) replace(t *object.Tree, path []string, blob plumbing.Hash) (plumbing.Hash, error) {
	var entries []object.TreeEntry
	if t != nil {
		entries = append(entries, t.Entries...)
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
		h, err := b.replace(sub, path[1:], blob)
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
	return b.write(func(o plumbing.EncodedObject) error { return nt.Encode(o) })
}

func (b *Backend) write(encode func(plumbing.EncodedObject) error) (plumbing.Hash, error) {
	o := b.repo.Storer.NewEncodedObject()
	if err := encode(o); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("gitnotes: encoding: %w", err)
	}
	b.written += o.Size()
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

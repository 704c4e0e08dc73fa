// Package gitsource follows a fleet repository: it keeps a shallow, single-branch copy
// in memory, fetches only when the remote head moved, and tells which cluster
// directories changed between the last reconciled commit and the new head, from the two
// trees rather than from anything a forge says.
package gitsource

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage/memory"
)

// Options say which repository and branch to follow.
type Options struct {
	URL    string
	Branch string
	// Auth is nil for a repository that needs no credentials; see HTTPAuth and SSHAuth.
	Auth transport.AuthMethod
	// TrustedKeys, an armored OpenPGP keyring, turns on verification of the head: an
	// unsigned head, or one signed by a key not in the ring, is refused by Update.
	TrustedKeys string
}

// Source is one followed branch. Its methods are safe for concurrent use; fetches are
// serialized.
type Source struct {
	opts   Options
	mu     sync.Mutex
	repo   *git.Repository
	remote *git.Remote

	// prMu guards prRepo, the deeper copy pull requests are read from.
	prMu   sync.Mutex
	prRepo *git.Repository
}

// Snapshot is the fleet repository at one commit.
type Snapshot struct {
	Commit plumbing.Hash
	tree   *object.Tree
	// Parents of the commit, as the commit names them.
	Parents []plumbing.Hash
	// Signer is the identity of the trusted key that signed the commit, when the
	// source verifies heads.
	Signer string
}

// FS reads the snapshot's files, for fleet.Load.
func (s *Snapshot) FS() fs.FS { return NewTreeFS(s.tree) }

// New checks the options; nothing is fetched until the first Update.
func New(opts Options) (*Source, error) {
	if opts.URL == "" {
		return nil, errors.New("gitsource: no repository URL")
	}
	if opts.Branch == "" {
		return nil, errors.New("gitsource: no branch")
	}
	if opts.TrustedKeys != "" {
		if err := checkKeyRing(opts.TrustedKeys); err != nil {
			return nil, err
		}
	}
	repo, err := git.Init(memory.NewStorage(), nil)
	if err != nil {
		return nil, err
	}
	remote, err := repo.CreateRemote(&config.RemoteConfig{
		Name:  "origin",
		URLs:  []string{opts.URL},
		Fetch: []config.RefSpec{branchSpec(opts.Branch)},
	})
	if err != nil {
		return nil, fmt.Errorf("gitsource: %s: %w", RedactURL(opts.URL), err)
	}
	return &Source{opts: opts, repo: repo, remote: remote}, nil
}

func branchSpec(branch string) config.RefSpec {
	return config.RefSpec("+refs/heads/" + branch + ":refs/remotes/origin/" + branch)
}

func (s *Source) trackingRef() plumbing.ReferenceName {
	return plumbing.NewRemoteReferenceName("origin", s.opts.Branch)
}

// RemoteHead asks the remote for the branch's head without fetching any object.
func (s *Source) RemoteHead(ctx context.Context) (plumbing.Hash, error) {
	refs, err := s.remote.ListContext(ctx, &git.ListOptions{Auth: s.opts.Auth})
	if err != nil {
		return plumbing.ZeroHash, s.wrap("listing refs", err)
	}
	want := plumbing.NewBranchReferenceName(s.opts.Branch)
	for _, r := range refs {
		if r.Name() == want {
			return r.Hash(), nil
		}
	}
	return plumbing.ZeroHash, fmt.Errorf("gitsource: %s has no branch %q", RedactURL(s.opts.URL), s.opts.Branch)
}

// Head is the last fetched head, or the zero hash before the first fetch.
func (s *Source) Head() plumbing.Hash {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.head()
}

func (s *Source) head() plumbing.Hash {
	ref, err := s.repo.Reference(s.trackingRef(), true)
	if err != nil {
		return plumbing.ZeroHash
	}
	return ref.Hash()
}

// Fetch brings the branch's head into memory, shallow and without tags, when the remote
// has moved; it returns the head either way. A force-push is fetched like any move.
func (s *Source) Fetch(ctx context.Context) (*Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	remote, err := s.RemoteHead(ctx)
	if err != nil {
		return nil, err
	}
	if remote != s.head() {
		err := s.remote.FetchContext(ctx, &git.FetchOptions{
			RefSpecs: []config.RefSpec{branchSpec(s.opts.Branch)},
			Depth:    1,
			Auth:     s.opts.Auth,
			Tags:     git.NoTags,
			Force:    true,
		})
		if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
			return nil, s.wrap("fetching", err)
		}
	}
	return s.snapshot(s.head())
}

// Snapshot reads a commit that was fetched before.
func (s *Source) Snapshot(h plumbing.Hash) (*Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshot(h)
}

func (s *Source) snapshot(h plumbing.Hash) (*Snapshot, error) {
	c, err := s.repo.CommitObject(h)
	if err != nil {
		return nil, fmt.Errorf("gitsource: commit %s: %w", h, err)
	}
	tree, err := c.Tree()
	if err != nil {
		return nil, fmt.Errorf("gitsource: tree of %s: %w", h, err)
	}
	return &Snapshot{Commit: h, tree: tree, Parents: c.ParentHashes}, nil
}

// Update fetches and compares the new head with last, the commit the caller reconciled
// last (the zero hash at start): the changes say what to re-read. With TrustedKeys set,
// a new head that fails verification gives a *VerificationError and nothing to apply.
func (s *Source) Update(ctx context.Context, last plumbing.Hash) (*Snapshot, Changes, error) {
	snap, err := s.Fetch(ctx)
	if err != nil {
		return nil, Changes{}, err
	}
	if snap.Commit == last {
		return snap, Changes{}, nil
	}
	if s.opts.TrustedKeys != "" {
		c, err := s.repo.CommitObject(snap.Commit)
		if err != nil {
			return nil, Changes{}, fmt.Errorf("gitsource: commit %s: %w", snap.Commit, err)
		}
		if snap.Signer, err = verify(c, s.opts.TrustedKeys); err != nil {
			return nil, Changes{}, err
		}
	}
	if last.IsZero() {
		return snap, Changes{All: true, Reason: "first read"}, nil
	}
	old, err := s.Snapshot(last)
	if err != nil {
		return snap, Changes{All: true, Reason: "the last reconciled commit is no longer known"}, nil
	}
	ch, err := Diff(ctx, old.tree, snap.tree)
	if err != nil {
		return nil, Changes{}, err
	}
	if !descends(snap, last) {
		// A rewritten history may have come with changes the trees alone do not show to
		// a reader of statuses, such as commits that vanished: read everything again.
		ch.All, ch.Reason = true, "the new head does not descend from the last reconciled commit"
	}
	return snap, ch, nil
}

// descends reports whether last is a parent of the new head. The copy is shallow, so
// anything further back is unknown and treated as a rewrite: a full re-read is always
// correct, only slower.
func descends(snap *Snapshot, last plumbing.Hash) bool {
	for _, p := range snap.Parents {
		if p == last {
			return true
		}
	}
	return false
}

func (s *Source) wrap(op string, err error) error {
	return fmt.Errorf("gitsource: %s %s: %s", op, RedactURL(s.opts.URL), RedactError(err, s.opts.Auth))
}

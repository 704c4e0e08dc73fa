// Package gitsource follows a fleet repository: it keeps a shallow, single-branch copy
// in memory, fetches only when the remote head moved, and tells which paths changed
// between the last reconciled commit and the new head, from the two trees rather than
// from anything a forge says. It knows no fleet's layout: Changes names paths down to
// the second level (a changed top-level file, or the changed entries of a top-level
// directory), and the fleet model says what they mean.
package gitsource

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/plumbing/transport"

	"github.com/flotilla-gitops/flotilla/gitsource/internal/gitconn"
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
	// BranchLimits bound each fetch of the branch: a head that would bring more fails
	// Update with a *BudgetError, and nothing of it is read. Zero fields take
	// DefaultBranchBytes and DefaultBranchObjects.
	BranchLimits Limits
	// PullRequestLimits bound the fetch of each pull request's head with its history:
	// a pull request that would bring more is returned with Err set, and the others
	// are read. Zero fields take DefaultPullRequestBytes, DefaultPullRequestObjects and
	// DefaultDirEntries.
	PullRequestLimits Limits
	// MaxPullRequests and PullRequestsTotal bound the pull requests read at once, in
	// number and in the bytes their heads and history add to the branch's: pull
	// requests past either, the lowest numbers first, are returned with Err set to a
	// *BudgetError that says so, and read once room frees up. Zero takes
	// DefaultMaxPullRequests and DefaultPullRequestsTotal.
	MaxPullRequests   int
	PullRequestsTotal int64
}

// The defaults keep what all open pull requests together make the hub hold to three
// pull requests at their own budget, DefaultPullRequestBytes, and the number of them
// to what a plan pass gets through in minutes.
const (
	DefaultMaxPullRequests   = 50
	DefaultPullRequestsTotal = 3 * DefaultPullRequestBytes
)

// Source is one followed branch. Its methods are safe for concurrent use; fetches are
// serialized.
//
// It keeps two copies of the repository in memory: the branch's head at depth 1, and,
// for pull requests, the branch and each open pull request's head with
// PullRequestDepth commits of history. Each fetch is bounded by Options' limits, and
// what no head needs any more (old heads, closed pull requests) is released once it
// adds up to what is needed; a Snapshot or PullRequest handed out earlier stays
// readable for as long as its holder keeps it.
type Source struct {
	opts Options

	// mu guards branch, the branch's copy, and branchRefused, its last head over the
	// budget.
	mu            sync.Mutex
	branch        *store
	branchRefused *BudgetError

	// prMu guards prs, the deeper copy pull requests are read from, refused, the pull
	// requests whose head was over the budget, and slow, those whose fetch outlasted the
	// time a call of PullRequests had left, with that head; all by local ref.
	prMu    sync.Mutex
	prs     *store
	refused map[plumbing.ReferenceName]*BudgetError
	slow    map[plumbing.ReferenceName]plumbing.Hash

	// branchHangs and prHangs count the connections given up on (see open).
	branchHangs, prHangs gitconn.Hangs
}

// Snapshot is the fleet repository at one commit.
type Snapshot struct {
	Commit plumbing.Hash
	// tree is the commit's tree, in objects.
	tree    plumbing.Hash
	objects storer.EncodedObjectStorer
	// Parents of the commit, as the commit names them.
	Parents []plumbing.Hash
	// Signer is the identity of the trusted key that signed the commit, when the
	// source verifies heads.
	Signer string
}

// FS reads the snapshot's files, for fleet.Load.
func (s *Snapshot) FS() fs.FS { return NewTreeFS(s.objects, s.tree) }

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
	if err := opts.BranchLimits.check("BranchLimits"); err != nil {
		return nil, err
	}
	if err := opts.PullRequestLimits.check("PullRequestLimits"); err != nil {
		return nil, err
	}
	if opts.MaxPullRequests < 0 || opts.PullRequestsTotal < 0 {
		return nil, fmt.Errorf("gitsource: MaxPullRequests %d, PullRequestsTotal %d: a limit cannot be negative", opts.MaxPullRequests, opts.PullRequestsTotal)
	}
	if opts.MaxPullRequests == 0 {
		opts.MaxPullRequests = DefaultMaxPullRequests
	}
	if opts.PullRequestsTotal == 0 {
		opts.PullRequestsTotal = DefaultPullRequestsTotal
	}
	opts.BranchLimits = opts.BranchLimits.withDefaults(DefaultBranchBytes, DefaultBranchObjects)
	opts.PullRequestLimits = opts.PullRequestLimits.withDefaults(DefaultPullRequestBytes, DefaultPullRequestObjects)
	if _, err := transport.NewEndpoint(opts.URL); err != nil {
		if redacted := RedactURL(opts.URL); redacted != opts.URL {
			// The parser's message quotes the URL, or the part of it that is wrong:
			// the credentials, maybe.
			return nil, fmt.Errorf("gitsource: %s is not a valid URL", redacted)
		}
		return nil, fmt.Errorf("gitsource: %s: %w", opts.URL, err)
	}
	return &Source{opts: opts, branch: newStore(), prs: newStore(), refused: map[plumbing.ReferenceName]*BudgetError{}, slow: map[plumbing.ReferenceName]plumbing.Hash{}}, nil
}

// trackingRef holds the branch's head in the branch's copy.
func (s *Source) trackingRef() plumbing.ReferenceName {
	return plumbing.NewRemoteReferenceName("origin", s.opts.Branch)
}

// Memory is what a Source holds in memory.
type Memory struct {
	// Branch is the branch's copy; PullRequests the copy pull requests are read from.
	Branch, PullRequests Stats
}

// Memory says what the Source holds now. Snapshots and pull requests still held by a
// caller may keep more alive.
func (s *Source) Memory() Memory {
	var m Memory
	s.mu.Lock()
	m.Branch = s.branch.stats()
	s.mu.Unlock()
	s.prMu.Lock()
	m.PullRequests = s.prs.stats()
	s.prMu.Unlock()
	return m
}

// RemoteHead asks the remote for the branch's head without fetching any object.
func (s *Source) RemoteHead(ctx context.Context) (plumbing.Hash, error) {
	ss, err := s.open(ctx, &s.branchHangs)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	defer ss.Close()
	return s.remoteHead(ss)
}

func (s *Source) remoteHead(ss *session) (plumbing.Hash, error) {
	h := ss.ref(plumbing.NewBranchReferenceName(s.opts.Branch))
	if h.IsZero() {
		return plumbing.ZeroHash, fmt.Errorf("gitsource: %s has no branch %q", RedactURL(s.opts.URL), s.opts.Branch)
	}
	return h, nil
}

// Head is the last fetched head, or the zero hash before the first fetch.
func (s *Source) Head() plumbing.Hash {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.branch.refs[s.trackingRef()]
}

// Fetch brings the branch's head into memory, shallow and without tags, when the remote
// has moved; it returns the head either way. A force-push is fetched like any move. The
// head before stays readable through Snapshot until the next fetch.
func (s *Source) Fetch(ctx context.Context) (*Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetch(ctx, s.branch.refs[s.trackingRef()])
}

// fetch brings the remote's head and keeps, besides it, the commit keep.
func (s *Source) fetch(ctx context.Context, keep plumbing.Hash) (*Snapshot, error) {
	ss, err := s.open(ctx, &s.branchHangs)
	if err != nil {
		return nil, err
	}
	defer ss.Close()
	remote, err := s.remoteHead(ss)
	if err != nil {
		return nil, err
	}
	tracking := s.trackingRef()
	if remote != s.branch.refs[tracking] {
		if be := s.branchRefused; be != nil && be.Commit == remote {
			// Over the budget it stays: fetching it again would bring as much again.
			return nil, fmt.Errorf("gitsource: fetching %s: %w", RedactURL(s.opts.URL), be)
		}
		_, err := ss.fetch(ctx, s.branch, remote, 1, budget{Limits: s.opts.BranchLimits, scope: "branch " + s.opts.Branch, per: "fetch of the branch", depth: 1})
		if err != nil {
			var be *BudgetError
			if errors.As(err, &be) {
				be.Commit = remote
				s.branchRefused = be
				return nil, fmt.Errorf("gitsource: fetching %s: %w", RedactURL(s.opts.URL), be)
			}
			return nil, s.wrap("fetching", err)
		}
		if err := s.reach(ctx, remote, keep); err != nil {
			return nil, err
		}
		s.branch.refs[tracking] = remote
	}
	if s.branch.grown() {
		// A copy that holds a push's line keeps it until Update has told the push's
		// commits apart, whether this fetch deepened it or an earlier one did for a
		// caller that has not moved on from keep since; the next fetch releases it.
		depth := 1
		if s.holdsPush(remote, keep) {
			depth = PushDepth + 1
		}
		pruned, err := s.branch.pruned(func(n plumbing.ReferenceName) bool { return n == tracking }, []plumbing.Hash{remote, keep}, depth)
		if err != nil {
			return nil, err
		}
		s.branch = pruned
	}
	return s.snapshot(remote)
}

// holdsPush reports whether the copy holds more than head and last of the branch's way
// from last to head, which Update walks to tell the push's commits apart.
func (s *Source) holdsPush(head, last plumbing.Hash) bool {
	if last.IsZero() || head == last {
		return false
	}
	h, err := pushHistory(s.branch, head, last)
	return err == nil && h.found && !(h.complete && len(h.commits) <= 1)
}

// Snapshot reads a commit that was fetched before: the head, or the commit kept
// beside it (the last one Update compared the head with).
func (s *Source) Snapshot(h plumbing.Hash) (*Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshot(h)
}

func (s *Source) snapshot(h plumbing.Hash) (*Snapshot, error) {
	c, err := object.GetCommit(s.branch, h)
	if err != nil {
		return nil, fmt.Errorf("gitsource: commit %s: %w", h, err)
	}
	tree, err := c.Tree()
	if err != nil {
		return nil, fmt.Errorf("gitsource: tree of %s: %w", h, err)
	}
	return &Snapshot{Commit: h, tree: tree.Hash, objects: s.branch, Parents: c.ParentHashes}, nil
}

// Update fetches and compares the new head with last, the commit the caller reconciled
// last (the zero hash at start): the changes say which paths differ, or that any may.
// With TrustedKeys set, a new head that fails verification gives a *VerificationError
// and nothing to apply; a head over BranchLimits gives a *BudgetError. The copy keeps
// the new head and last, so a caller that could not apply the head may ask again with
// the same last.
func (s *Source) Update(ctx context.Context, last plumbing.Hash) (*Snapshot, Changes, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap, err := s.fetch(ctx, last)
	if err != nil {
		return nil, Changes{}, err
	}
	if snap.Commit == last {
		return snap, Changes{}, nil
	}
	if s.opts.TrustedKeys != "" {
		c, err := object.GetCommit(s.branch, snap.Commit)
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
	old, err := s.snapshot(last)
	if err != nil {
		return snap, Changes{All: true, Reason: "the last reconciled commit is no longer known"}, nil
	}
	ch, err := diff(ctx, s.branch, old.tree, snap.tree)
	if err != nil {
		return nil, Changes{}, err
	}
	h, err := pushHistory(s.branch, snap.Commit, last)
	if err != nil {
		return nil, Changes{}, err
	}
	if !h.found {
		// A rewritten history may have come with changes the trees alone do not show to
		// a reader of statuses, such as commits that vanished: read everything again.
		// So is a push of more than PushDepth commits: a full re-read is always
		// correct, only slower.
		return snap, Changes{All: true, Reason: fmt.Sprintf("the new head does not descend from the last reconciled commit within %d commits", PushDepth)}, nil
	}
	if !h.complete {
		// The head descends from the last commit, but not along the branch's line that
		// the copy holds: the push's changes are the head's, as a whole.
		return snap, ch, nil
	}
	if ch.Commits, err = pushedCommits(ctx, s.branch, h); err != nil {
		return nil, Changes{}, err
	}
	return snap, ch, nil
}

// reach deepens the copy below head, in deepenSteps, until it holds the commits from
// last to head. A deepening over the branch's budget, or refused, leaves the push to be
// compared as a whole.
func (s *Source) reach(ctx context.Context, head, last plumbing.Hash) error {
	if last.IsZero() || !s.branch.have(last) {
		return nil
	}
	for _, depth := range deepenSteps {
		h, err := pushHistory(s.branch, head, last)
		if err != nil {
			return err
		}
		if h.complete || h.truncated || !h.edge {
			return nil
		}
		ss, err := s.open(ctx, &s.branchHangs)
		if err != nil {
			return err
		}
		_, err = ss.deepen(ctx, s.branch, head, depth, budget{Limits: s.opts.BranchLimits, scope: "branch " + s.opts.Branch, per: "fetch of the branch", depth: depth})
		ss.Close()
		if err != nil {
			// ctx's end is an error; any other failure leaves the push whole.
			return ctx.Err()
		}
	}
	return nil
}

func (s *Source) wrap(op string, err error) error {
	return fmt.Errorf("gitsource: %s %s: %s", op, RedactURL(s.opts.URL), RedactError(err, s.opts.Auth, s.opts.URL))
}

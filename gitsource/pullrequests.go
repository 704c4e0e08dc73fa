package gitsource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// PullRequestDepth is how much history is fetched below the followed branch and each
// pull request's head to find where the pull request forked: a pull request forked
// further back is compared with the branch's head instead (see PullRequest.BaseFound).
const PullRequestDepth = 50

// pullRef matches the refs forges keep for the head of every pull request: GitHub's
// and Gitea's refs/pull/N/head, GitLab's refs/merge-requests/N/head.
var pullRef = regexp.MustCompile(`^refs/(pull|merge-requests)/([1-9][0-9]{0,9})/head$`)

// PullRequest is an open pull request's head, read so the hub can validate and render
// it before it merges.
type PullRequest struct {
	// Ref is the forge's ref for the head, e.g. refs/pull/12/head.
	Ref    string
	Number int
	Head   plumbing.Hash
	// Base is the commit the pull request forked from: the merge base of its head and
	// the branch's head.
	Base plumbing.Hash
	// BaseFound is false when the fork point lies beyond PullRequestDepth; Base is then
	// the branch's head, and Changes may name paths that changed on the branch since.
	BaseFound bool
	// Changes are what merging the pull request would change, from the trees of Base
	// and Head.
	Changes Changes
	// Merged is true when the head is already part of the branch: the pull request
	// has been merged (its ref stays), and there is nothing left to plan.
	Merged bool
	// Err is set when the head could not be read; Base, Changes, FS and BaseFS are
	// then unusable. It is a *BudgetError (errors.As) when the head with its history
	// would bring more than Options.PullRequestLimits: its message tells the author
	// which limit the pull request broke, and the head fails the same way until it
	// changes, except when it says the pull requests before it hold all the hub holds
	// of pull requests at once (HeldPullRequests or HeldBytes set): that passes as they
	// close. Any other Err (the forge refused the fetch, the connection broke, the
	// head's objects do not parse, ErrNotRead) may pass: the next call tries again.
	Err error

	// tree and baseTree are the head's and the base's trees, in objects.
	tree, baseTree plumbing.Hash
	objects        storer.EncodedObjectStorer
}

// FS reads the pull request's head; with Err set, every read fails with Err.
func (p *PullRequest) FS() fs.FS { return p.treeFS(p.tree) }

// BaseFS reads the commit the pull request is compared with; with Err set, every read
// fails with Err.
func (p *PullRequest) BaseFS() fs.FS { return p.treeFS(p.baseTree) }

func (p *PullRequest) treeFS(t plumbing.Hash) fs.FS {
	if p.Err != nil || p.objects == nil {
		return unreadFS{p}
	}
	return NewTreeFS(p.objects, t)
}

// unreadFS is a head that could not be read.
type unreadFS struct{ pr *PullRequest }

func (u unreadFS) Open(name string) (fs.File, error) {
	err := u.pr.Err
	if err == nil {
		err = fmt.Errorf("%s at %s was not read", u.pr.Ref, u.pr.Head)
	}
	return nil, &fs.PathError{Op: "open", Path: name, Err: err}
}

// ErrNotRead is the Err of a pull request that the time PullRequests was given ran out
// before, or while, it was read. A pull request whose fetch took the time left is read
// after the others on the next calls, until its head moves: one slow pull request
// holds up no other.
var ErrNotRead = errors.New("the hub's time for reading pull requests ran out before this one was read")

// PullRequests reads the heads of the pull requests the remote has refs for, keeping
// those open says are open (nil keeps all: a forge keeps refs of closed pull requests
// forever, so a hub with a forge asks it which are open). Every head is compared with
// the followed branch, so open should say true only for pull requests into that
// branch, as a forge knows; without open (a plain git server, whose refs do not say
// which branch a pull request targets) every pull-request ref is compared with it.
//
// Heads are fetched only when they moved, each on its own within
// Options.PullRequestLimits: a pull request over them, or whose head cannot be read, is
// returned with Err set, and the others are read all the same. The history below
// them is kept apart from the branch's shallow copy, so following pull requests does
// not slow down following the branch; the heads of pull requests no longer listed are
// released. An error is returned only when the branch itself cannot be read, or ctx
// ended before it was.
func (s *Source) PullRequests(ctx context.Context, open func(number int) bool) ([]*PullRequest, error) {
	s.prMu.Lock()
	defer s.prMu.Unlock()
	ss, err := s.open(ctx, &s.prHangs)
	if err != nil {
		return nil, err
	}
	defer ss.Close()
	base, err := s.remoteHead(ss)
	if err != nil {
		return nil, err
	}
	refs, err := ss.refs.IterReferences()
	if err != nil {
		return nil, s.wrap("listing refs", err)
	}
	var prs []*PullRequest
	_ = refs.ForEach(func(r *plumbing.Reference) error {
		m := pullRef.FindStringSubmatch(r.Name().String())
		if m == nil || r.Type() != plumbing.HashReference {
			return nil
		}
		n, _ := strconv.Atoi(m[2])
		if open == nil || open(n) {
			prs = append(prs, &PullRequest{Ref: r.Name().String(), Number: n, Head: r.Hash()})
		}
		return nil
	})
	slowLast := func(pr *PullRequest) int {
		if h, ok := s.slow[localRef(pr)]; ok && h == pr.Head {
			return 1
		}
		return 0
	}
	slices.SortFunc(prs, func(a, b *PullRequest) int {
		return cmp.Or(cmp.Compare(slowLast(a), slowLast(b)), cmp.Compare(a.Number, b.Number), strings.Compare(a.Ref, b.Ref))
	})
	// Refs of pull requests no longer listed go, so that pruning releases their heads.
	listed := map[plumbing.ReferenceName]bool{baseRef: true}
	for _, pr := range prs {
		listed[localRef(pr)] = true
	}
	maps.DeleteFunc(s.prs.refs, func(name plumbing.ReferenceName, _ plumbing.Hash) bool { return !listed[name] })
	maps.DeleteFunc(s.refused, func(name plumbing.ReferenceName, _ *BudgetError) bool { return !listed[name] })
	maps.DeleteFunc(s.slow, func(name plumbing.ReferenceName, _ plumbing.Hash) bool { return !listed[name] })
	if len(prs) == 0 {
		return nil, s.prunePullRequests(base, nil)
	}

	_, err = ss.fetch(ctx, s.prs, base, PullRequestDepth, budget{Limits: s.opts.BranchLimits, scope: "branch " + s.opts.Branch, per: "fetch of the branch", depth: PullRequestDepth})
	if err != nil {
		var be *BudgetError
		if errors.As(err, &be) {
			be.Commit = base
			return nil, fmt.Errorf("gitsource: fetching %s for pull requests: %w", RedactURL(s.opts.URL), be)
		}
		return nil, s.wrap("fetching the branch for pull requests", err)
	}
	s.prs.refs[baseRef] = base
	// A pull request is charged for what its head and history add to what the branch
	// and the pull requests before it hold or brought: the same objects are held once,
	// and charged once, whoever brought them.
	held, _, err := walk(s.prs, []plumbing.Hash{base}, PullRequestDepth, nil)
	if err != nil {
		return nil, err
	}
	var (
		total    int64
		admitted int
		// charged are the objects the pull requests before brought, charged as they
		// came, read or not. They are kept apart from held: walk stops at what held
		// holds, taking it for whole heads with their trees and history, and a pull
		// request that was not read leaves no whole head.
		charged = map[plumbing.Hash]bool{}
	)
	for _, pr := range prs {
		if ctx.Err() != nil {
			pr.Err = ErrNotRead
			continue
		}
		if admitted >= s.opts.MaxPullRequests {
			be := s.prBudget(pr).exceeded()
			be.Commit, be.HeldPullRequests = pr.Head, s.opts.MaxPullRequests
			pr.Err = be
			continue
		}
		listed := pr.Head
		brought, err := s.fetchPullRequest(ctx, pr, s.opts.PullRequestsTotal-total)
		// What it brought stays in the copy until the next pruning, read or not: it is
		// charged now, or each pull request after one not read could bring as much
		// again; and once only, or one stacked on what it brought would pay for that
		// again.
		for _, o := range brought {
			charged[o.hash] = true
			total += int64(len(o.data))
		}
		if err != nil {
			if ctx.Err() != nil {
				// It took the time that was left: the others go first next time.
				s.slow[localRef(pr)] = listed
				pr.Err = ErrNotRead
				continue
			}
			pr.Err = err
			continue
		}
		delete(s.slow, localRef(pr))
		added, _, err := walk(s.prs, []plumbing.Hash{pr.Head}, PullRequestDepth, held)
		if err != nil {
			pr.Err = err
			continue
		}
		var size int64
		for h, o := range added {
			if !charged[h] {
				size += int64(len(o.data))
			}
		}
		if size > s.opts.PullRequestsTotal-total {
			pr.Err = s.crowded(pr)
			continue
		}
		total += size
		admitted++
		maps.Copy(held, added)
	}
	if err := s.prunePullRequests(base, prs); err != nil {
		return nil, err
	}
	baseCommit, err := object.GetCommit(s.prs, base)
	if err != nil {
		return nil, fmt.Errorf("gitsource: branch %s at %s: %w", s.opts.Branch, base, err)
	}
	// Comparing is the hub's own work, bounded by the budgets, not the network's: what
	// was fetched is compared even when the time for fetching ran out, unless the caller
	// gave up.
	compareCtx := context.WithoutCancel(ctx)
	for _, pr := range prs {
		if pr.Err != nil {
			continue
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			pr.Err = ErrNotRead
			continue
		}
		pr.Err = s.comparePR(compareCtx, pr, baseCommit)
	}
	return prs, nil
}

// baseRef holds the followed branch in the pull requests' copy.
const baseRef = plumbing.ReferenceName("refs/flotilla/base")

// localRef holds a pull request's head in the pull requests' copy.
func localRef(pr *PullRequest) plumbing.ReferenceName {
	m := pullRef.FindStringSubmatch(pr.Ref)
	return plumbing.ReferenceName(fmt.Sprintf("refs/flotilla/%s/%d", m[1], pr.Number))
}

// prBudget is the budget of pr's own fetch.
func (s *Source) prBudget(pr *PullRequest) budget {
	return budget{
		Limits: s.opts.PullRequestLimits,
		scope:  fmt.Sprintf("pull request #%d", pr.Number),
		per:    "pull request",
		depth:  PullRequestDepth,
	}
}

// crowded is the error of pr when the pull requests before it hold all the bytes the
// hub holds of pull requests.
func (s *Source) crowded(pr *PullRequest) *BudgetError {
	be := s.prBudget(pr).exceeded()
	be.Commit, be.HeldBytes = pr.Head, s.opts.PullRequestsTotal
	return be
}

// fetchPullRequest brings pr's head, unless the copy has it, in a session of its own:
// a head that moved since it was listed is read where it is now. The fetch brings at
// most room bytes, what the pull requests before it left of Options.PullRequestsTotal.
// It returns the objects the copy did not hold before, even with an error.
func (s *Source) fetchPullRequest(ctx context.Context, pr *PullRequest, room int64) ([]*storedObject, error) {
	local := localRef(pr)
	if be := s.refused[local]; be != nil && be.Commit == pr.Head {
		// Over the budget it stays: fetching it again would bring as much again.
		return nil, be
	}
	var brought []*storedObject
	if !s.prs.have(pr.Head) {
		if room <= 0 {
			return nil, s.crowded(pr)
		}
		ss, err := s.open(ctx, &s.prHangs)
		if err != nil {
			return nil, err
		}
		defer ss.Close()
		head := ss.ref(plumbing.ReferenceName(pr.Ref))
		if head.IsZero() {
			return nil, fmt.Errorf("%s is gone from %s", pr.Ref, RedactURL(s.opts.URL))
		}
		pr.Head = head
		b := s.prBudget(pr)
		own := b.Limits
		b.Bytes = min(b.Bytes, room)
		brought, err = ss.fetch(ctx, s.prs, head, PullRequestDepth, b)
		var be *BudgetError
		if errors.As(err, &be) {
			be.Commit = head
			if bytesOnly := !be.TooManyObjects && be.DirEntries == 0 && be.FileSize <= own.Bytes; bytesOnly && b.Bytes < own.Bytes {
				// Within its own budget, but not within the room the others left: it
				// may fit once they close, so it is not remembered as refused.
				return brought, s.crowded(pr)
			}
			be.Limits = own
			s.refused[local] = be
			return brought, be
		}
		if err != nil {
			return brought, fmt.Errorf("fetching %s: %s", pr.Ref, RedactError(err, s.opts.Auth, s.opts.URL))
		}
	}
	s.prs.refs[local] = pr.Head
	return brought, nil
}

// prunePullRequests releases, once the copy has grown enough, everything but the
// branch's head and the heads of prs that were read, each with its history.
func (s *Source) prunePullRequests(base plumbing.Hash, prs []*PullRequest) error {
	if !s.prs.grown() {
		return nil
	}
	roots := []plumbing.Hash{base}
	for _, pr := range prs {
		if pr.Err == nil {
			roots = append(roots, pr.Head)
		}
	}
	pruned, err := s.prs.pruned(func(plumbing.ReferenceName) bool { return true }, roots, PullRequestDepth)
	if err != nil {
		return err
	}
	s.prs = pruned
	return nil
}

// comparePR finds pr's fork point and what it changes from there.
func (s *Source) comparePR(ctx context.Context, pr *PullRequest, branchHead *object.Commit) error {
	head, err := object.GetCommit(s.prs, pr.Head)
	if err != nil {
		return fmt.Errorf("gitsource: %s at %s: %w", pr.Ref, pr.Head, err)
	}
	tree, err := head.Tree()
	if err != nil {
		return fmt.Errorf("gitsource: tree of %s at %s: %w", pr.Ref, pr.Head, err)
	}
	forkPoint := branchHead
	found, err := mergeBase(s.prs, pr.Head, branchHead.Hash)
	if err != nil {
		return fmt.Errorf("gitsource: %s: %w", pr.Ref, err)
	}
	if found != nil {
		forkPoint, pr.BaseFound = found, true
		pr.Merged = forkPoint.Hash == pr.Head
	}
	pr.Base = forkPoint.Hash
	baseTree, err := forkPoint.Tree()
	if err != nil {
		return fmt.Errorf("gitsource: tree of %s: %w", forkPoint.Hash, err)
	}
	if pr.Changes, err = diff(ctx, s.prs, baseTree.Hash, tree.Hash); err != nil {
		return fmt.Errorf("gitsource: %s: %w", pr.Ref, err)
	}
	pr.tree, pr.baseTree, pr.objects = tree.Hash, baseTree.Hash, s.prs
	return nil
}

// mergeBase is the fork point of head from branch within st: of the commits of head's
// history that branch's holds too, the nearest to head that no other of them descends
// from; nil when the two do not meet within PullRequestDepth commits of each. The
// copy is shallow: a walk that reaches a commit it does not hold ends there. (go-git's
// MergeBase fails there instead, which in a copy of more than PullRequestDepth commits
// is nearly always before the fork point; it also orders by commit dates, which the
// author of a pull request sets.)
func mergeBase(st *store, head, branch plumbing.Hash) (*object.Commit, error) {
	onBranch, err := ancestors(st, branch, nil)
	if err != nil {
		return nil, err
	}
	var met []*object.Commit
	if _, err := ancestors(st, head, func(c *object.Commit) bool {
		if onBranch[c.Hash] {
			met = append(met, c)
			return false
		}
		return true
	}); err != nil {
		return nil, err
	}
	// A pull request that merged the branch in meets it there and at the older fork
	// point below: the newer one is the base.
	below := map[plumbing.Hash]bool{}
	if len(met) > 1 {
		for _, c := range met {
			older, err := ancestors(st, c.Hash, nil)
			if err != nil {
				return nil, err
			}
			delete(older, c.Hash)
			maps.Copy(below, older)
		}
	}
	for _, c := range met {
		if !below[c.Hash] {
			return c, nil
		}
	}
	return nil, nil
}

// ancestors walks from h through the parents st holds, breadth first, for
// PullRequestDepth generations, and returns the commits it reached. visit, when set, is
// called on each and says whether to go on below it.
func ancestors(st *store, h plumbing.Hash, visit func(*object.Commit) bool) (map[plumbing.Hash]bool, error) {
	seen := map[plumbing.Hash]bool{}
	frontier := []plumbing.Hash{h}
	for gen := 0; gen < PullRequestDepth && len(frontier) > 0; gen++ {
		var next []plumbing.Hash
		for _, h := range frontier {
			if seen[h] {
				continue
			}
			c, err := commitOf(st, h)
			if err != nil {
				return nil, err
			}
			if c == nil {
				continue
			}
			seen[h] = true
			if visit == nil || visit(c) {
				next = append(next, c.ParentHashes...)
			}
		}
		frontier = next
	}
	return seen, nil
}

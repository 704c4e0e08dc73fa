package gitsource

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"
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
	// the branch's head, and Changes may name clusters that changed on the branch since.
	BaseFound bool
	// Changes are what merging the pull request would change, from the trees of Base
	// and Head.
	Changes Changes
	// Merged is true when the head is already part of the branch: the pull request
	// has been merged (its ref stays), and there is nothing left to plan.
	Merged bool

	tree     *object.Tree
	baseTree *object.Tree
}

// FS reads the pull request's head.
func (p *PullRequest) FS() fs.FS { return NewTreeFS(p.tree) }

// BaseFS reads the commit the pull request is compared with.
func (p *PullRequest) BaseFS() fs.FS { return NewTreeFS(p.baseTree) }

// PullRequests reads the heads of the pull requests the remote has refs for, keeping
// those open says are open (nil keeps all: a forge keeps refs of closed pull requests
// forever, so a hub with a forge asks it which are open). Heads are fetched only when
// they moved; the history below them is kept apart from the branch's shallow copy, so
// following pull requests does not slow down following the branch.
func (s *Source) PullRequests(ctx context.Context, open func(number int) bool) ([]*PullRequest, error) {
	s.prMu.Lock()
	defer s.prMu.Unlock()
	refs, err := s.remote.ListContext(ctx, &git.ListOptions{Auth: s.opts.Auth})
	if err != nil {
		return nil, s.wrap("listing refs", err)
	}
	if s.prRepo == nil {
		repo, err := git.Init(memory.NewStorage(), nil)
		if err != nil {
			return nil, err
		}
		if _, err := repo.CreateRemote(&config.RemoteConfig{Name: "origin", URLs: []string{s.opts.URL}}); err != nil {
			return nil, err
		}
		s.prRepo = repo
	}
	branch := plumbing.NewBranchReferenceName(s.opts.Branch)
	var base plumbing.Hash
	var prs []*PullRequest
	var want []config.RefSpec
	for _, r := range refs {
		if r.Name() == branch {
			base = r.Hash()
			want = append(want, config.RefSpec(fmt.Sprintf("+%s:refs/flotilla/base", branch)))
			continue
		}
		m := pullRef.FindStringSubmatch(r.Name().String())
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[2])
		if open != nil && !open(n) {
			continue
		}
		prs = append(prs, &PullRequest{Ref: r.Name().String(), Number: n, Head: r.Hash()})
		if !s.prHave(r.Hash()) {
			want = append(want, config.RefSpec(fmt.Sprintf("+%s:refs/flotilla/%s/%d", r.Name(), m[1], n)))
		}
	}
	if base.IsZero() {
		return nil, fmt.Errorf("gitsource: %s has no branch %q", RedactURL(s.opts.URL), s.opts.Branch)
	}
	if len(prs) == 0 {
		return nil, nil
	}
	if !s.prHave(base) || len(want) > 1 {
		err := s.prRepo.FetchContext(ctx, &git.FetchOptions{
			RemoteName: "origin",
			RefSpecs:   want,
			Depth:      PullRequestDepth,
			Auth:       s.opts.Auth,
			Tags:       git.NoTags,
			Force:      true,
		})
		if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
			return nil, s.wrap("fetching pull requests", err)
		}
	}
	baseCommit, err := s.prRepo.CommitObject(base)
	if err != nil {
		return nil, fmt.Errorf("gitsource: branch %s at %s: %w", s.opts.Branch, base, err)
	}
	for _, pr := range prs {
		if err := s.comparePR(ctx, pr, baseCommit); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(prs, func(a, b *PullRequest) int { return a.Number - b.Number })
	return prs, nil
}

func (s *Source) prHave(h plumbing.Hash) bool {
	_, err := s.prRepo.CommitObject(h)
	return err == nil
}

// comparePR finds pr's fork point and what it changes from there.
func (s *Source) comparePR(ctx context.Context, pr *PullRequest, branchHead *object.Commit) error {
	head, err := s.prRepo.CommitObject(pr.Head)
	if err != nil {
		return fmt.Errorf("gitsource: %s at %s: %w", pr.Ref, pr.Head, err)
	}
	if pr.tree, err = head.Tree(); err != nil {
		return fmt.Errorf("gitsource: tree of %s at %s: %w", pr.Ref, pr.Head, err)
	}
	forkPoint := branchHead
	// MergeBase walks both histories; in a shallow copy it stops at the boundary and
	// finds nothing, or fails on a missing parent: both mean "too far back".
	if bases, err := head.MergeBase(branchHead); err == nil && len(bases) > 0 {
		forkPoint, pr.BaseFound = bases[0], true
		pr.Merged = forkPoint.Hash == pr.Head
	}
	pr.Base = forkPoint.Hash
	if pr.baseTree, err = forkPoint.Tree(); err != nil {
		return fmt.Errorf("gitsource: tree of %s: %w", forkPoint.Hash, err)
	}
	if pr.Changes, err = Diff(ctx, pr.baseTree, pr.tree); err != nil {
		return fmt.Errorf("gitsource: %s: %w", pr.Ref, err)
	}
	return nil
}

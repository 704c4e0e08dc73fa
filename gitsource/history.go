package gitsource

import (
	"context"
	"fmt"
	"slices"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// A push may bring several commits. The branch's copy is shallow (one commit deep), so
// that a push of one commit fetches what that commit changed and no history; when the
// new head's parents do not include the last reconciled commit, the copy is deepened
// below the head, a few commits at a time, until it holds every commit from the last
// reconciled one to the head, or PushDepth commits. Update then says which commit of
// the push changed which paths (Changes.Commits), so that each changed cluster's status
// goes on the newest commit that touched it rather than on the head.

// PushDepth is the most commits of one push that Update tells apart. A push of more
// is compared as a whole: its changes are the head's.
const PushDepth = 50

// deepenSteps are the depths the copy is deepened to, in turn, until it reaches the
// last reconciled commit: a push of k commits fetches at most about four times k
// commits of history, and never more than PushDepth.
var deepenSteps = [...]int{4, 16, PushDepth}

// PushedCommit is one commit of a push and what it changed.
type PushedCommit struct {
	Hash plumbing.Hash
	// All is set when the commit changed more than MaxChangedPaths paths; Paths is
	// then nil.
	All bool
	// Paths are the paths the commit changed, named as Changes.Paths are: against its
	// parent, or, for a merge, those that differ from every parent (what the merge
	// itself changed, as git log names a merge's changes to a path).
	Paths []string
}

// history is what the copy holds of the commits from last (exclusive) to head.
type history struct {
	// found says whether head descends from last within PushDepth commits.
	found bool
	// cut says that some path from head ends at a commit the copy does not hold, or at
	// a first commit, so that what the push brought is not known whole: a merged branch
	// may hold more of its commits below the copy's edge, or lead back into last's
	// history below it, where the walk of that history stopped.
	cut bool
	// truncated says the walk stopped at PushDepth commits without finding last.
	truncated bool
	// commits are the pushed commits, each before every commit it descends from; nil
	// unless found.
	commits []*object.Commit
}

// complete says that the copy holds every commit of the push.
func (h history) complete() bool { return h.found && !h.cut }

// beforeDepth bounds the walk of last's own history that tells a merged branch's old
// fork point from a commit of the push.
const beforeDepth = 4 * PushDepth

// pushHistory walks the copy from head towards last, breadth first, without expanding
// last or what it descends from (those were reconciled before). Commits whose parents
// the copy does not hold end the walk on their path, and leave it cut.
func pushHistory(st *store, head, last plumbing.Hash) (history, error) {
	if last.IsZero() {
		return history{}, nil
	}
	// last's own history, as far as the copy holds it: a merged branch that forked
	// before last leads back into it.
	before := map[plumbing.Hash]bool{}
	frontier := []plumbing.Hash{last}
	for len(frontier) > 0 && len(before) <= beforeDepth {
		h := frontier[0]
		frontier = frontier[1:]
		if before[h] {
			continue
		}
		before[h] = true
		if c, err := commitOf(st, h); err == nil && c != nil {
			frontier = append(frontier, c.ParentHashes...)
		}
	}
	var out history
	seen := map[plumbing.Hash]bool{}
	frontier = []plumbing.Hash{head}
	for len(frontier) > 0 {
		h := frontier[0]
		frontier = frontier[1:]
		if h == last {
			out.found = true
			continue
		}
		if seen[h] || before[h] {
			continue
		}
		seen[h] = true
		if len(out.commits) == PushDepth {
			// More than PushDepth commits: last may be further back, but the push is
			// not told apart.
			return history{truncated: true}, nil
		}
		c, err := commitOf(st, h)
		if err != nil {
			return history{}, err
		}
		if c == nil || len(c.ParentHashes) == 0 {
			// The copy's edge, or a first commit that last's history, as far as the copy
			// holds it, does not reach: what lies on this path may be older than last.
			out.cut = true
			continue
		}
		out.commits = append(out.commits, c)
		frontier = append(frontier, c.ParentHashes...)
	}
	if !out.found {
		out.commits = nil
	}
	out.commits = newestFirst(out.commits)
	return out, nil
}

// newestFirst orders commits, found breadth first from the head, so that each comes
// before every commit it descends from: breadth first, an ancestor reached over a
// short branch would come before its own descendants on a longer one. Among commits
// that do not descend from one another, the order found stays.
func newestFirst(commits []*object.Commit) []*object.Commit {
	children := make(map[plumbing.Hash]int, len(commits))
	for _, c := range commits {
		for _, p := range c.ParentHashes {
			children[p]++
		}
	}
	out := make([]*object.Commit, 0, len(commits))
	done := make([]bool, len(commits))
	for placed := true; placed; {
		placed = false
		for i, c := range commits {
			// The first commit in the order found whose children in the push are all
			// placed. History has no cycles, so one is until all are.
			if done[i] || children[c.Hash] > 0 {
				continue
			}
			done[i], placed = true, true
			out = append(out, c)
			for _, p := range c.ParentHashes {
				children[p]--
			}
			break
		}
	}
	if len(out) < len(commits) {
		// Only commits forged into a cycle get here: they keep the order found.
		for i, c := range commits {
			if !done[i] {
				out = append(out, c)
			}
		}
	}
	return out
}

// commitOf decodes the commit h; nil when the copy does not hold it.
func commitOf(st *store, h plumbing.Hash) (*object.Commit, error) {
	o := st.get(h)
	if o == nil {
		return nil, nil
	}
	c, err := object.DecodeCommit(st, o)
	if err != nil {
		return nil, fmt.Errorf("gitsource: commit %s: %w", h, err)
	}
	return c, nil
}

// pushedCommits says what each commit of h changed. A commit whose parents the copy
// does not hold is left out: its changes are then the head's.
func pushedCommits(ctx context.Context, st *store, h history) ([]PushedCommit, error) {
	if len(h.commits) < 2 {
		// A push of one commit: its changes are the head's, which Changes.Paths say.
		return nil, nil
	}
	out := make([]PushedCommit, 0, len(h.commits))
	for _, c := range h.commits {
		pc, ok, err := changedBy(ctx, st, c)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, pc)
		}
	}
	return out, nil
}

// changedBy is what c changed against its parents; ok is false when the copy does not
// hold them all. A path changed by a merge differs from every parent; a parent that
// differs in more than MaxChangedPaths paths says nothing of which.
func changedBy(ctx context.Context, st *store, c *object.Commit) (pc PushedCommit, ok bool, err error) {
	pc.Hash = c.Hash
	count := map[string]int{}
	compared := 0
	for _, p := range c.ParentHashes {
		parent, err := commitOf(st, p)
		if err != nil || parent == nil {
			return pc, false, err
		}
		ch, err := diff(ctx, st, parent.TreeHash, c.TreeHash)
		if err != nil {
			return pc, false, err
		}
		if ch.All {
			continue
		}
		compared++
		for _, p := range ch.Paths {
			count[p]++
		}
	}
	if compared == 0 {
		// Every comparison had too many paths to name (a root commit has none: it is
		// never among a push's commits, which all descend from the last one).
		pc.All = len(c.ParentHashes) > 0
		return pc, pc.All, nil
	}
	for p, n := range count {
		if n == compared {
			pc.Paths = append(pc.Paths, p)
		}
	}
	slices.Sort(pc.Paths)
	return pc, true, nil
}

package gitsource

import (
	"context"
	"fmt"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// A push may bring several commits. The branch's copy is shallow (one commit deep), so
// that a push of one commit fetches what that commit changed and no history; when the
// new head's parent is not the last reconciled commit, the copy is deepened below the
// head, a few commits at a time, until it holds the branch's own line from the head back
// to the last reconciled commit (the head, its first parent, that one's, and so on), or
// PushDepth commits of it. Update then says which commit of that line changed which
// paths (Changes.Commits), so that each changed cluster's status goes on the newest
// commit that brought a change to it to the branch rather than on the head. A merge
// brings what its branch changed: a pull request merged with a merge commit turns that
// commit green, and the branch's own commits stay the pull request's.

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
	// Paths are the paths the commit changed against its first parent, named as
	// Changes.Paths are: for a merge, what it brought to the branch.
	Paths []string
}

// history is what the copy holds of the commits from last (exclusive) to head.
type history struct {
	// found says whether head descends from last within PushDepth commits.
	found bool
	// complete says that the copy holds the branch's line from head back to last.
	complete bool
	// edge says that a walk from head ended where the copy ends: a deeper copy may
	// tell more.
	edge bool
	// truncated says the branch's line is longer than PushDepth commits.
	truncated bool
	// commits are the branch's line from head back to last (exclusive), newest first;
	// nil unless complete.
	commits []*object.Commit
}

// pushHistory follows the branch's line from head towards last, first parent after
// first parent. When the line does not reach last, head may still descend from last by
// another path, as when the branch was moved to a branch that had merged it: then the
// push is not told apart, but it is no rewritten history either.
func pushHistory(st *store, head, last plumbing.Hash) (history, error) {
	if last.IsZero() {
		return history{}, nil
	}
	var line []*object.Commit
	for h := head; ; {
		if h == last {
			return history{found: true, complete: true, commits: line}, nil
		}
		if len(line) == PushDepth {
			return history{truncated: true}, nil
		}
		c, err := commitOf(st, h)
		if err != nil {
			return history{}, err
		}
		if c == nil || len(c.ParentHashes) == 0 {
			out, err := descends(st, head, last)
			out.edge = out.edge || c == nil
			return out, err
		}
		line = append(line, c)
		h = c.ParentHashes[0]
	}
}

// descends walks the copy from head towards last by every parent, breadth first, for
// at most PushDepth commits.
func descends(st *store, head, last plumbing.Hash) (history, error) {
	var out history
	seen := map[plumbing.Hash]bool{}
	frontier := []plumbing.Hash{head}
	for len(frontier) > 0 {
		h := frontier[0]
		frontier = frontier[1:]
		if h == last {
			out.found = true
			continue
		}
		if seen[h] {
			continue
		}
		seen[h] = true
		if len(seen) > PushDepth {
			return history{truncated: true}, nil
		}
		c, err := commitOf(st, h)
		if err != nil {
			return history{}, err
		}
		if c == nil {
			out.edge = true
			continue
		}
		frontier = append(frontier, c.ParentHashes...)
	}
	return out, nil
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

// pushedCommits says what each commit of h changed.
func pushedCommits(ctx context.Context, st *store, h history) ([]PushedCommit, error) {
	if len(h.commits) < 2 {
		// A push of one commit: its changes are the head's, which Changes.Paths say.
		return nil, nil
	}
	out := make([]PushedCommit, 0, len(h.commits))
	for _, c := range h.commits {
		pc, err := changedBy(ctx, st, c)
		if err != nil {
			return nil, err
		}
		out = append(out, pc)
	}
	return out, nil
}

// changedBy is what c, a commit of the branch's line, changed against its first
// parent: the next commit of the line, or the last reconciled one, whose snapshot
// Update took. Both are in the copy.
func changedBy(ctx context.Context, st *store, c *object.Commit) (PushedCommit, error) {
	pc := PushedCommit{Hash: c.Hash}
	parent, err := commitOf(st, c.ParentHashes[0])
	if err != nil {
		return pc, err
	}
	if parent == nil {
		return pc, fmt.Errorf("gitsource: commit %s: its first parent is not in the copy", c.Hash)
	}
	ch, err := diff(ctx, st, parent.TreeHash, c.TreeHash)
	if err != nil {
		return pc, err
	}
	if ch.All {
		pc.All = true
		return pc, nil
	}
	// diff names the paths sorted, each once.
	pc.Paths = ch.Paths
	return pc, nil
}

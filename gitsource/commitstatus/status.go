// Package commitstatus is the one small interface through which the hub reports
// readiness on commits, whatever keeps the statuses: a forge (GitHub, Gitea, GitLab) or
// notes in the fleet repository itself. Backends translate; the Publisher in this package decides
// when to post, so every backend posts only on change, cuts descriptions the same way,
// retries the same way and stops at the same cap.
//
// The Publisher also keeps within each forge's rate limits: backends report what the
// forge states of its budget (Limited, QuotaTracker), and every request waits its turn in
// one of two lanes (pacer.go), so that the statuses of a fleet-wide change are spread over
// the budget and never delay those of a single one. Submit queues a status and returns at
// once (queue.go); of the statuses of one context on one commit queued meanwhile, only
// the newest is posted.
package commitstatus

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// State is a commit status state in flotilla's terms; backends map it to their forge's.
type State string

const (
	Pending State = "pending"
	Success State = "success"
	Failure State = "failure"
	Error   State = "error"
)

// Valid reports whether s is one of the four states.
func (s State) Valid() bool {
	switch s {
	case Pending, Success, Failure, Error:
		return true
	}
	return false
}

// Status is one context's state on one commit.
type Status struct {
	// Context names what the status is about, e.g. "flotilla/gpu-east-1".
	Context     string
	State       State
	Description string
	// TargetURL is where a reader of the status learns more; empty for none.
	TargetURL string
}

// Backend keeps commit statuses. Implementations are safe for concurrent use.
type Backend interface {
	// Set records st, which Canonical has already shaped, as the newest status of its
	// context on commit (a full 40-hex commit hash).
	Set(ctx context.Context, commit string, st Status) error
	// Latest returns the newest status of every context on commit, all of them, however
	// many pages the forge needs for it. A commit without statuses gives an empty map.
	Latest(ctx context.Context, commit string) (map[string]Status, error)
	// Canonical is st as Latest would read it back after Set: the description cut to
	// the backend's limit, the state folded onto the forge's states. Comparing canonical
	// forms is what lets the Publisher post only on change.
	Canonical(st Status) Status
}

// MaxPerContext is how many statuses GitHub keeps for one commit and context; the
// Publisher never posts more than that to any backend, so a flapping cluster cannot
// exhaust a forge and every backend behaves alike.
const MaxPerContext = 1000

// ErrCapReached is returned once a commit and context hold MaxPerContext statuses.
var ErrCapReached = errors.New("status: the commit holds the maximum number of statuses for this context")

// ErrUnauthorized is returned when the forge refuses the credentials.
var ErrUnauthorized = errors.New("status: the forge refused the credentials")

// RetryableError marks a failure worth another attempt: a server error or a rate limit.
type RetryableError struct {
	Err error
	// After is how long the forge asked to wait (Retry-After or a rate-limit reset);
	// zero leaves the wait to the Publisher's backoff.
	After time.Duration
}

func (e *RetryableError) Error() string {
	if e.After > 0 {
		return fmt.Sprintf("%v (retry after %s)", e.Err, e.After)
	}
	return e.Err.Error()
}

func (e *RetryableError) Unwrap() error { return e.Err }

// Retryable wraps err as worth retrying after the given wait.
func Retryable(err error, after time.Duration) error {
	return &RetryableError{Err: err, After: after}
}

// Ellipsis ends a cut description.
const Ellipsis = "…"

// Truncate cuts s to at most limit characters (runes, which is how the forges count),
// ending a cut string with Ellipsis. A limit of zero or less means no limit.
func Truncate(s string, limit int) string {
	if limit <= 0 || utf8.RuneCountInString(s) <= limit {
		return s
	}
	if limit == 1 {
		return Ellipsis
	}
	n := 0
	for i := range s {
		if n == limit-1 {
			return s[:i] + Ellipsis
		}
		n++
	}
	return s
}

// PullRequestLister is implemented by backends whose forge knows which pull requests
// are open. Forges keep the head refs of closed pull requests forever, and a pull
// request into another branch would never merge into the one the hub follows, so a hub
// plans only the pull requests this says are open into its branch.
type PullRequestLister interface {
	// OpenPullRequests returns the numbers of the open pull requests into branch base.
	OpenPullRequests(ctx context.Context, base string) (map[int]bool, error)
}

package hub

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/plan"
)

// Pull requests are untrusted input: anyone who can open one, from a fork too, makes the
// hub fetch, validate and render its head. So plans run beside the branch, never in its
// way: each source has one plan worker of its own, woken after every sync, which lists,
// fetches and plans while the branch goes on syncing; a hub-wide limit bounds how many
// plans compute at once, and each has a deadline, so that no pull request can hold a
// slot, or another tenant's plans, for longer than that.

// wakePlans asks the source's plan worker to look for new pull-request heads; wakes
// coalesce.
func (s *Source) wakePlans() {
	select {
	case s.planWake <- struct{}{}:
	default:
	}
}

// runPlans plans on every wake until ctx ends.
func (s *Source) runPlans(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.planWake:
		}
		s.syncPlans(ctx)
	}
}

// openPullRequests lists the open pull requests into the branch. The list goes to the
// forge that keeps the statuses, so it waits its turn within the forge's limits with
// them when the source posts statuses.
func (s *Source) openPullRequests(ctx context.Context) (map[int]bool, error) {
	if s.publisher == nil {
		return s.opts.PullRequests.OpenPullRequests(ctx, s.opts.Git.Branch)
	}
	var numbers map[int]bool
	err := s.publisher.Send(ctx, func(ctx context.Context) error {
		var err error
		numbers, err = s.opts.PullRequests.OpenPullRequests(ctx, s.opts.Git.Branch)
		return err
	})
	return numbers, err
}

// syncPlans validates and renders each open pull request's head into the branch once,
// posting its plan; it never changes anything on a worker.
func (s *Source) syncPlans(ctx context.Context) {
	store := s.hub.opts.Plans
	if store == nil {
		return
	}
	// Listing and fetching are bounded like a plan: a forge or a repository that does not
	// answer holds this source's plans up, never its branch.
	listCtx, cancel := context.WithTimeout(ctx, s.hub.opts.PlanTimeout)
	defer cancel()
	var open func(int) bool
	if s.opts.PullRequests != nil {
		numbers, err := s.openPullRequests(listCtx)
		if err != nil {
			s.log.Error("listing open pull requests", "error", err)
			return
		}
		open = func(n int) bool { return numbers[n] }
	}
	prs, err := s.git.PullRequests(listCtx, open)
	if err != nil {
		s.log.Error("reading pull requests", "error", err)
		return
	}
	// The heads planned are remembered apart from the plans' pages, which the store may
	// evict: a repository with more open pull requests than the store keeps would
	// otherwise be planned again on every wake. Only the heads still open are kept.
	planned := make(map[string]bool, len(prs))
	defer func() { s.plannedHeads = planned }()
	for _, pr := range prs {
		head := pr.Head.String()
		if _, kept := store.Get(s.opts.Name, head); kept || s.plannedHeads[head] || pr.Merged {
			planned[head] = true
			continue
		}
		if held(pr.Err) {
			// Waits its turn: said on the commit, and planned on a later pass once older
			// pull requests close.
			s.post(ctx, head, commitstatus.Status{Context: plan.Context(s.prefixNow()), State: commitstatus.Pending, Description: commitstatus.Truncate("not planned yet: "+pr.Err.Error(), plan.MaxDescription)})
			continue
		}
		select {
		case s.hub.planSlots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		p, err := s.plan(ctx, pr)
		<-s.hub.planSlots
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Error("planning a pull request", "ref", pr.Ref, "commit", head, "error", err)
			s.post(ctx, head, commitstatus.Status{Context: plan.Context(s.prefixNow()), State: commitstatus.Error, Description: "hub error: could not plan this pull request; see the hub's log"})
			continue
		}
		store.Put(s.opts.Name, p)
		planned[head] = true
		url := ""
		if s.hub.opts.PublicURL != "" {
			url = strings.TrimSuffix(s.hub.opts.PublicURL, "/") + plan.Path(s.opts.Name, head)
		}
		s.log.Info("planned a pull request", "ref", pr.Ref, "commit", head, "summary", p.Summary())
		s.post(ctx, head, p.Status(s.prefixNow(), url))
	}
}

// held reports whether a pull request was not read because the hub holds as many pull
// requests as it may at once, or its time for reading them ran out: not the pull
// request's fault, and not final.
func held(err error) bool {
	var be *gitsource.BudgetError
	return errors.Is(err, gitsource.ErrNotRead) || errors.As(err, &be) && (be.HeldPullRequests > 0 || be.HeldBytes > 0)
}

// plan computes one pull request's plan within the plan deadline. A head that could not
// be read within the budgets, or whose plan outlasts the deadline, gets a failing plan
// that says so, and is not tried again: its author pushes a smaller change.
func (s *Source) plan(ctx context.Context, pr *gitsource.PullRequest) (*plan.Plan, error) {
	failed := func(msg string) *plan.Plan {
		p := &plan.Plan{PullRequest: pr.Number, Ref: pr.Ref, Commit: pr.Head.String(), Base: pr.Base.String(), BaseFound: pr.BaseFound,
			FleetErrors: fleet.ErrorList{{Message: msg}}}
		p.RequireTenant(s.opts.Tenant)
		return p
	}
	var be *gitsource.BudgetError
	if errors.As(pr.Err, &be) {
		// The same head fails the same way until it changes: a plan that says so.
		return failed("not planned: " + be.Error()), nil
	}
	if pr.Err != nil {
		// Not the pull request's doing, as far as the hub can tell: no plan is kept, so
		// the next sync tries again.
		return nil, pr.Err
	}
	pctx, cancel := context.WithTimeout(ctx, s.hub.opts.PlanTimeout)
	defer cancel()
	p, err := plan.Compute(pctx, pr, s.hub.renderer, plan.Options{MaxRendered: s.hub.opts.MaxPlannedClusters, Budget: s.hub.opts.Budget})
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		s.log.Warn("a plan outlasted its deadline", "ref", pr.Ref, "commit", pr.Head.String(), "deadline", s.hub.opts.PlanTimeout)
		return failed(fmt.Sprintf("not planned: planning took longer than %s, the hub's limit for one pull request", s.hub.opts.PlanTimeout)), nil
	}
	if err != nil {
		return nil, err
	}
	p.RequireTenant(s.opts.Tenant)
	return p, nil
}

package hub

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
)

// refresh sums a WorkerCluster's conditions up, finishes a decommission the agent
// completed, and publishes the cluster's commit status.
func (s *Source) refresh(ctx context.Context, name string) error {
	// A sync and an agent's report may refresh one cluster at once. Were they to
	// interleave, the one that read the older WorkerCluster could post and remember last,
	// and the fleet's summary would wait forever on a state long gone: one at a time, the
	// last refresh reads the newest state.
	unlock := s.refreshLocks.Lock(name)
	defer unlock()
	key := client.ObjectKey{Namespace: s.opts.Namespace, Name: name}
	status := s.hub.opts.Status
	// The status as it will be stored: an agent's acknowledgement is posted as it comes,
	// not after its write, which in a fleet-wide change queues behind thousands of others
	// for the hub cluster's request budget.
	wc, err := status.View(ctx, key)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if wc.Annotations[v1alpha1.DecommissionAnnotation] != "" {
		// Finishing a decommission revokes and deletes: it goes by what is stored.
		if wc, err = status.Record(ctx, key); err != nil {
			return client.IgnoreNotFound(err)
		}
		return s.maybeFinishDecommission(ctx, wc)
	}
	s.publish(ctx, wc)
	var redialErr error
	if d := s.hub.opts.Dispatch; d != nil {
		// Failed, it is tried again with the refresh.
		redialErr = d.Redial(ctx, wc)
	}
	// Deriving again catches a spec the hub moved on since the agent's last report. A
	// record under way derives as it writes; one that waits for the hub's request budget
	// must not hold this worker, so the cluster is refreshed again once it is done.
	if err := status.RecordIfIdle(ctx, key); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return redialErr
}

// publishDeferred publishes the cluster named name as the status writer shows it with
// its deferred facts, without writing them: the state sent to its agent, on the way.
// Posted while the sync that sent it runs, so that the commit is counted as touching
// it (statusBook); the agent's acknowledgement refreshes it after.
func (s *Source) publishDeferred(ctx context.Context, name string) error {
	unlock := s.refreshLocks.Lock(name)
	defer unlock()
	wc, err := s.hub.opts.Status.Get(ctx, client.ObjectKey{Namespace: s.opts.Namespace, Name: name})
	if err != nil {
		return client.IgnoreNotFound(err)
	}
	s.publish(ctx, wc)
	return nil
}

// publish posts wc's commit status, and counts its state for the fleet's summary. The
// caller holds the cluster's refresh lock, which a decommission finishes under too.
func (s *Source) publish(ctx context.Context, wc *v1alpha1.WorkerCluster) {
	name := wc.Name
	s.mu.Lock()
	if uid, gone := s.gone[name]; gone {
		if uid == wc.UID {
			s.mu.Unlock()
			return
		}
		delete(s.gone, name) // added back: another WorkerCluster
	}
	s.mu.Unlock()
	st := conditions.CommitStatus(s.context(name), wc)
	s.post(ctx, sourceOf(wc).Commit, st)
	s.mu.Lock()
	s.states[name] = st.State
	if d := wc.Status.Dispatch; d != nil && d.Placement == v1alpha1.PlacementPoolFull {
		s.poolFull[name] = d.Pool
	} else {
		delete(s.poolFull, name)
	}
	registered := wc.Status.Enrollment != nil
	wake := s.registered[name] != registered
	s.mu.Unlock()
	if wake {
		// A new registration joins the hub's Kueue.
		s.wakeDispatch()
	}
	// Posted whether or not this cluster's state changed: the summary is derived from
	// every cluster's current state on the current head, and the publisher posts it only
	// when it reads differently from what the commit shows. Derived once for many
	// refreshes (summary.go): it costs time in proportion to the fleet.
	s.publishFleetSoon()
}

// publishFleet posts the fleet's summary on the head: how many of the fleet's clusters
// are ready and how many fail, linking to the hub's page of the head, which lists every
// cluster's state (status_book.go says why a large change leans on it). A push whose
// older commit changed every cluster gets it on that commit too, linking to its page.
// Only runSummary calls it, one call at a time (summary.go).
func (s *Source) publishFleet(ctx context.Context) {
	s.mu.Lock()
	if s.applying {
		// The sync asks for the new head's summary once it set the head.
		s.mu.Unlock()
		return
	}
	head, wide, fleetErr, waiting := s.head, s.wide, s.fleetError, len(s.waitingRemovals)
	var full []string
	for _, pool := range s.poolFull {
		full = append(full, pool)
	}
	leftOut := len(s.poolFull)
	refusals := s.dispatchRefusals
	// A cluster the hub failed to reconcile (a key service down, a write refused) keeps
	// the state its agent last reported, of what it had before: it fails until the hub's
	// retry succeeds, whatever its agent says.
	total, ready, failing, retrying := len(s.states), 0, 0, len(s.retry)
	for name := range s.retry {
		if _, ok := s.states[name]; !ok {
			total++
		}
	}
	for name, st := range s.states {
		switch {
		case s.retry[name] != "":
		case st == commitstatus.Success:
			ready++
		case st == commitstatus.Failure, st == commitstatus.Error:
			failing++
		}
	}
	failing += retrying
	invalid := make([]string, 0, len(s.invalid))
	for _, why := range s.invalid {
		invalid = append(invalid, why)
	}
	s.mu.Unlock()
	if head == "" {
		return
	}
	slices.Sort(invalid)
	// The counts lead: a status description is cut at the forge's limit.
	counts := fmt.Sprintf("%s of %s clusters ready", thousands(ready), thousands(total))
	if failing > 0 {
		counts += fmt.Sprintf(", %s failing", thousands(failing))
	}
	if retrying > 0 {
		counts += fmt.Sprintf(" · %s on a fault of the hub, retrying", thousands(retrying))
	}
	st := commitstatus.Status{Context: s.context(fleetContext), TargetURL: s.commitURL(head)}
	switch {
	case fleetErr != "" && waiting > 0:
		st.State, st.Description = commitstatus.Failure, fmt.Sprintf("%d %s until the fleet validates: %s", waiting, plural(waiting, "removal waits", "removals wait"), fleetErr)
	case fleetErr != "":
		st.State, st.Description = commitstatus.Failure, fleetErr
	case len(invalid) > 0:
		st.State, st.Description = commitstatus.Failure, fmt.Sprintf("%s · %d invalid cluster(s): %s", counts, len(invalid), invalid[0])
	case ready == total:
		st.State, st.Description = commitstatus.Success, counts
	case ready+failing == total:
		// Nothing is on its way any more: what fails stays failing until a change.
		st.State, st.Description = commitstatus.Failure, counts
	default:
		st.State, st.Description = commitstatus.Pending, counts
	}
	if len(refusals) > 0 && fleetErr == "" {
		// The refused pools' jobs wait, and the jobs of a namespace without LocalQueues
		// go nowhere, until the fleet or the hub's configuration changes: a failure,
		// whatever the clusters say.
		st.State = commitstatus.Failure
		shown := refusals[:min(len(refusals), maxShownRefusals)]
		st.Description += " · " + strings.Join(shown, " · ")
		if more := len(refusals) - len(shown); more > 0 {
			st.Description += fmt.Sprintf(" · and %d more (the hub's log has every one)", more)
		}
	}
	if len(full) > 0 {
		slices.Sort(full)
		full = slices.Compact(full)
		st.Description += fmt.Sprintf(" · %d %s over the %d-cluster limit of dispatch pool %s: declare pools in fleet.yaml",
			leftOut, plural(leftOut, "cluster", "clusters"), v1alpha1.MaxPoolClusters, strings.Join(full, ", "))
	}
	s.post(ctx, head, st)
	if wide != "" {
		st.TargetURL = s.commitURL(wide)
		s.post(ctx, wide, st)
	}
}

// maxShownRefusals is how many of dispatch's refusals the fleet's summary spells out:
// a forge cuts a long description (the hub's page of the commit shows it whole), and
// the hub's log has every one.
const maxShownRefusals = 5

// commitURL is where the hub serves the page of commit, empty without a public URL.
func (s *Source) commitURL(commit string) string {
	if s.hub.opts.PublicURL == "" {
		return ""
	}
	return strings.TrimSuffix(s.hub.opts.PublicURL, "/") + CommitPath(s.opts.Name, commit)
}

// thousands writes n with a comma between groups of three digits: 10,000.
func thousands(n int) string {
	if n < 0 {
		return "-" + thousands(-n)
	}
	s := strconv.Itoa(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

package hub

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
)

func (s *Source) syncBranch(ctx context.Context) error {
	s.mu.Lock()
	last := s.last
	retryAt := maps.Clone(s.retry)
	s.mu.Unlock()
	retrying := slices.Sorted(maps.Keys(retryAt))
	began := time.Now()
	fetchCtx, cancel := context.WithTimeout(ctx, s.hub.opts.FetchTimeout)
	snap, ch, err := s.git.Update(fetchCtx, last)
	cancel()
	if s.hub.opts.OnFetch != nil {
		s.hub.opts.OnFetch(s.opts.Name, time.Since(began), err)
	}
	if err != nil {
		var ve *gitsource.VerificationError
		if errors.As(err, &ve) {
			s.post(ctx, ve.Commit, commitstatus.Status{Context: s.context("fleet"), State: commitstatus.Failure, Description: "not applied: " + ve.Reason})
		}
		// A head too large to fetch is never read: like a broken fleet.yaml, nothing
		// changes on the workers, and the commit says why.
		var be *gitsource.BudgetError
		if errors.As(err, &be) {
			s.post(ctx, be.Commit.String(), commitstatus.Status{Context: s.context("fleet"), State: commitstatus.Failure, Description: "not applied: " + be.Error()})
		}
		return err
	}
	if snap.Commit == last && len(retrying) == 0 {
		return nil
	}
	head := snap.Commit.String()
	log := s.log.With("commit", head)
	// gitsource names the changed paths; the fleet model says which clusters they touch.
	f, aff := s.loadHead(snap.FS(), fleet.Change{All: ch.All, Reason: ch.Reason, Paths: ch.Paths, FirstChange: ch.FirstChange})
	if f.StatesStatusContextPrefix() && f.Spec.Spec.Tenant == s.opts.Tenant {
		s.mu.Lock()
		s.prefix = f.StatusContextPrefix()
		s.mu.Unlock()
	}

	if f.Spec != nil && f.Spec.Spec.Tenant != s.opts.Tenant {
		// Tenant isolation: a source writes its own namespace only, whatever the
		// repository claims.
		msg := fmt.Sprintf("%s names tenant %q; this repository may only hold tenant %q", fleet.FleetFile, f.Spec.Spec.Tenant, s.opts.Tenant)
		log.Warn("refused a head", "reason", msg)
		s.setHead(snap.Commit, f, msg, "")
		s.post(ctx, head, commitstatus.Status{Context: s.context("fleet"), State: commitstatus.Failure, Description: msg})
		return nil
	}
	fleetErr := ""
	if !f.Valid() {
		if errs := f.Errors; len(errs) > 0 {
			fleetErr = errs[0].Error()
		} else {
			fleetErr = fleet.FleetFile + ": missing"
		}
	}

	// A fleet-wide change lists the WorkerClusters, for those whose directory went; a
	// change to some clusters reads theirs alone, so that it costs the same whatever the
	// fleet's size.
	var existing map[string]*v1alpha1.WorkerCluster
	names := aff.Clusters
	if aff.All {
		if existing, err = s.workerClusters(ctx); err != nil {
			return err
		}
		names = f.ClusterNames()
		for name := range existing {
			if f.Clusters[name] == nil {
				names = append(names, name)
			}
		}
	}
	s.mu.Lock()
	waiting := slices.Collect(maps.Keys(s.waitingRemovals))
	s.mu.Unlock()
	names = append(slices.Clone(names), retrying...)
	names = append(names, waiting...)
	slices.Sort(names)
	names = slices.Compact(names)
	if !aff.All {
		if existing, err = s.workerClustersNamed(ctx, names); err != nil {
			return err
		}
	}
	log.Info("reconciling a head", "clusters", len(names), "all", aff.All, "reason", aff.Reason, "retrying", len(retrying))
	s.mu.Lock()
	s.applying = true
	s.mu.Unlock()
	attr, wide := attribution(ch, head, f)
	s.reconcileNames(ctx, log, f, names, existing, retried(attr, aff, retryAt), fleetErr)
	if snap.Commit == last {
		// A retry of the same head: the push is the one before.
		s.mu.Lock()
		wide = s.wide
		s.mu.Unlock()
	}
	s.setHead(snap.Commit, f, fleetErr, wide)
	s.wakeDispatch()
	return nil
}

// writeWorkers is how many clusters of one head are written to the hub cluster and
// pushed at once. Their requests wait on the hub cluster's API and the client's rate
// limit far more than on the CPU; a sync never has more than this many in flight, well
// under what the API server's priority and fairness runs at once for one client.
const writeWorkers = 32

// reconcileNames reconciles the clusters names of the head in two stages: every core
// validates, renders and decrypts (prepare), and writeWorkers write what was prepared
// to the hub cluster and push it to the agents, each push handed to its agent's
// connection without waiting for it. Clusters are independent, so a fleet-wide change
// costs its slowest stage rather than the sum of each cluster's round trips, and the
// bounded hand-over between the stages keeps few rendered states in memory at once.
func (s *Source) reconcileNames(ctx context.Context, log *slog.Logger, f *fleet.Fleet, names []string, existing map[string]*v1alpha1.WorkerCluster, commitOf func(cluster string) string, fleetErr string) {
	type job struct {
		name string
		p    prepared
	}
	todo := make(chan string)
	ready := make(chan job, writeWorkers)
	var preparers, writers sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(names)) {
		preparers.Go(func() {
			for name := range todo {
				j := job{name: name}
				if c := f.Clusters[name]; c != nil && fleetErr == "" {
					j.p = s.prepare(ctx, f, c, existing[name])
				}
				ready <- j
			}
		})
	}
	for range min(writeWorkers, len(names)) {
		writers.Go(func() {
			for j := range ready {
				s.reconcileName(ctx, log, f, j.name, existing[j.name], commitOf(j.name), fleetErr, j.p)
			}
		})
	}
	for _, name := range names {
		todo <- name
	}
	close(todo)
	preparers.Wait()
	close(ready)
	writers.Wait()
}

// attribution names the commit each cluster's status goes on: of a push of several
// commits along the branch's line, the newest that changed the cluster's inputs (its
// directory, a file it links to, or a fleet-wide file), so that the commit that
// changed a cluster shows what became of it; the head when the push was one commit, or
// none of its commits names the cluster. wide is the commit of the push, other than the
// head, that changed every cluster, empty for none.
func attribution(ch gitsource.Changes, head string, f *fleet.Fleet) (attr func(cluster string) string, wide string) {
	if len(ch.Commits) == 0 {
		return func(string) string { return head }, ""
	}
	by := map[string]string{}
	rest := head
	for _, c := range ch.Commits {
		aff := fleet.Change{All: c.All, Paths: c.Paths}.AffectedIn(f)
		if aff.All {
			// Every cluster not touched by a newer commit: this one changed its inputs.
			rest = c.Hash.String()
			break
		}
		for _, name := range aff.Clusters {
			if _, ok := by[name]; !ok {
				by[name] = c.Hash.String()
			}
		}
	}
	if rest != head {
		wide = rest
	}
	return func(name string) string {
		if h, ok := by[name]; ok {
			return h
		}
		return rest
	}, wide
}

// retried is attr but for the clusters retried after a fault of the hub's that the head
// did not change (aff): their statuses go on the commit they failed on, which is still
// the newest that changed them, and not on one that has nothing to do with them.
func retried(attr func(cluster string) string, aff fleet.Affected, retryAt map[string]string) func(cluster string) string {
	if len(retryAt) == 0 || aff.All {
		return attr
	}
	changed := make(map[string]bool, len(aff.Clusters))
	for _, name := range aff.Clusters {
		changed[name] = true
	}
	return func(name string) string {
		if at := retryAt[name]; at != "" && !changed[name] {
			return at
		}
		return attr(name)
	}
}

// reconcileName brings one cluster of the head to the hub: enrolled or updated,
// decommissioned when its directory is gone, or failed alone. head is the commit its
// status goes on (attribution). p is what prepare made of it, when it is in the head
// and the fleet validates.
func (s *Source) reconcileName(ctx context.Context, log *slog.Logger, f *fleet.Fleet, name string, wc *v1alpha1.WorkerCluster, head, fleetErr string, p prepared) {
	c := f.Clusters[name]
	began := time.Now()
	var err error
	s.mu.Lock()
	if c == nil {
		delete(s.invalid, name)
	}
	// Back in the repository, or gone from the hub: no longer a removal that waits.
	if c != nil || wc == nil {
		delete(s.waitingRemovals, name)
	}
	s.mu.Unlock()
	switch {
	case c == nil && wc != nil && fleetErr != "":
		// The policy that says what the worker keeps is in the fleet.yaml that does not
		// validate, and a head over its budgets may simply not have been read whole:
		// nothing is decommissioned until a head validates again.
		s.mu.Lock()
		s.waitingRemovals[name] = true
		s.mu.Unlock()
		log.Warn("a removal waits for a head that validates", "cluster", name)
		s.post(ctx, head, commitstatus.Status{Context: s.context(name), State: commitstatus.Pending, Description: "removal waits: the fleet does not validate at this commit; the worker keeps its state"})
	case c == nil && wc != nil:
		err = s.decommission(ctx, wc, head, f.DecommissionPolicy())
		if err == nil {
			s.mu.Lock()
			delete(s.waitingRemovals, name)
			s.mu.Unlock()
		}
	case c == nil:
	case fleetErr != "":
		// Nothing renders while fleet.yaml or a preset is broken; the workers keep
		// their last good state.
	default:
		err = s.reconcileCluster(ctx, f, c, head, p)
	}
	if s.hub.opts.OnReconcile != nil {
		s.hub.opts.OnReconcile(s.opts.Name, time.Since(began)+p.took, err)
	}
	s.mu.Lock()
	if err != nil {
		s.retry[name] = head
	} else {
		delete(s.retry, name)
	}
	s.mu.Unlock()
	if err != nil {
		// A fault of the hub's, not of the repository: say so on the commit, keep the
		// worker as it is, and try again on the next poll.
		log.Error("reconciling a cluster", "cluster", name, "error", err)
		s.post(ctx, head, commitstatus.Status{Context: s.context(name), State: commitstatus.Error, Description: faultDescription(err)})
		if wc != nil {
			// Best effort: the hub cluster's API may be what failed.
			cur := wc.DeepCopy()
			patch := client.MergeFrom(wc)
			cur.Annotations = mergeMaps(cur.Annotations, map[string]string{v1alpha1.HubErrorAnnotation: faultDetail(err)})
			if aerr := s.patchWorkerCluster(ctx, cur, patch); aerr != nil {
				log.Warn("recording a hub fault on its WorkerCluster", "cluster", name, "error", aerr)
			}
		}
	}
}

// staleRetry is how soon markStale, which runs once, tries again what the hub cluster
// refused: the list of WorkerClusters, or the record of one.
const staleRetry = 10 * time.Second

// markStale records as disconnected the clusters whose Connected condition a previous
// hub left True and whose agent did not come back to this one.
func (s *Source) markStale(ctx context.Context) {
	existing, err := s.workerClusters(ctx)
	if err != nil {
		s.log.Error("checking for agents that did not come back; trying again", "in", staleRetry, "error", err)
		time.AfterFunc(staleRetry, func() {
			if ctx.Err() == nil {
				s.markStale(ctx)
			}
		})
		return
	}
	for name, wc := range existing {
		c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionConnected)
		if c == nil || c.Status != metav1.ConditionTrue || s.hub.opts.Tunnel.Connected(wc.Labels[v1alpha1.WorkerClusterLabel]) {
			continue
		}
		notBack := conditions.Disconnected{Cause: conditions.NotBack}
		if wc.Status.LastSeen != nil {
			notBack.Seen = wc.Status.LastSeen.Time
		}
		_, err := s.hub.opts.Status.RecordOrRetry(ctx, ctx, client.ObjectKeyFromObject(wc), staleRetry, notBack)
		if err == nil {
			err = s.refresh(ctx, name)
		}
		if err != nil {
			s.log.Error("recording a stale connection", "cluster", name, "error", err)
		}
	}
}

// loadHead loads the new head: only the cluster directories it changed, on top of the
// last head's fleet, so that a change to one cluster costs the same whatever the fleet's
// size; the whole head when a fleet-wide input changed, at the first read, or when the
// last head could not be read whole. The head's budgets still hold: a re-read cluster is
// charged against what the rest of the head uses.
//
// Every cluster is affected when the last head was not applied (it did not validate,
// or named another tenant): the changes of the heads since the last one applied are
// more than what this head changed, and were not kept.
func (s *Source) loadHead(fsys fs.FS, ch fleet.Change) (*fleet.Fleet, fleet.Affected) {
	s.mu.Lock()
	prev, prevErr := s.fleet, s.fleetError
	s.mu.Unlock()
	// The last head's symbolic links say who reads a changed file outside its own
	// directory; a link the new head adds or changes lies in a changed directory.
	aff := ch.AffectedIn(prev)
	if !aff.All && prevErr != "" {
		aff = fleet.Affected{All: true, Reason: "the last head was not applied: " + prevErr}
	}
	if aff.All || prev == nil || prev.OverBudget() || prev.Incomplete() {
		return fleet.LoadWith(fsys, fleet.LoadOptions{Budget: s.hub.opts.Budget}), aff
	}
	for _, name := range aff.Clusters {
		prev.LoadCluster(fsys, name)
	}
	return prev, aff
}

package hub

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
)

// decommissionHash is the desired "state" of a cluster leaving the fleet.
func decommissionHash(wc *v1alpha1.WorkerCluster) string { return "decommission:" + string(wc.UID) }

// decommission asks the agent to prune what it owns; the WorkerCluster goes once it
// reports done, or when the agent does not come back within StaleAfter. Under the
// Keep policy nothing on the worker changes: the agent is only revoked. A cluster the
// hub dispatches to drains first (drain.go).
func (s *Source) decommission(ctx context.Context, wc *v1alpha1.WorkerCluster, head string, policy v1alpha1.DecommissionPolicy) error {
	if s.needsDrain(wc) {
		return s.drain(ctx, wc, head, policy)
	}
	identity := wc.Labels[v1alpha1.WorkerClusterLabel]
	s.log.Info("decommissioning a cluster removed from the fleet", "cluster", wc.Name, "policy", policy)
	if policy == v1alpha1.DecommissionKeep {
		wc.Status.Source = &v1alpha1.SourceStatus{Commit: head}
		unlock := s.refreshLocks.Lock(wc.Name)
		defer unlock()
		return s.finishDecommission(ctx, wc, "decommissioned: the worker keeps its objects (decommission: Keep); the agent is revoked")
	}
	// Every sync of a head without the cluster comes here again, a fleet-wide change
	// among them: the decommission keeps the time it began, or its agent, connected and
	// never done, would be given a new deadline with each; and it keeps the removal's
	// commit, where it is told of until it is done.
	since, begun := time.Now().UTC(), false
	if t, err := time.Parse(time.RFC3339, wc.Annotations[v1alpha1.DecommissionSinceAnnotation]); err == nil && wc.Annotations[v1alpha1.DecommissionAnnotation] != "" {
		since, begun = t, true
	}
	facts := []conditions.Fact{conditions.Desired{Hash: decommissionHash(wc)}}
	if !begun {
		facts = append(facts, conditions.Sourced{Commit: head})
	}
	stored, err := s.hub.opts.Status.Record(ctx, client.ObjectKeyFromObject(wc), facts...)
	if err != nil {
		return err
	}
	patch := client.MergeFrom(wc.DeepCopy())
	wc.Annotations = mergeMaps(wc.Annotations, map[string]string{v1alpha1.DecommissionAnnotation: "prune",
		v1alpha1.DecommissionSinceAnnotation: since.Format(time.RFC3339)})
	if err := s.patchWorkerCluster(ctx, wc, patch); err != nil {
		return err
	}
	s.post(ctx, sourceOf(stored).Commit, commitstatus.Status{Context: s.context(wc.Name), State: commitstatus.Pending, Description: "decommissioning: waiting for the agent to prune what it owns"})
	s.hub.opts.Tunnel.Push(client.ObjectKeyFromObject(wc), identity, &protocol.DesiredState{Generation: wc.Generation, Hash: decommissionHash(wc), Decommission: true})
	// The agent may be redialling (a hub restart, a network blip), or be cut off for
	// not reading what it was sent: it gets the decommission when it connects, and the
	// WorkerCluster goes without pruning only if no agent is connected for StaleAfter.
	// A wait already under way goes on as it was: started again, it would never end
	// while the fleet changes more often than StaleAfter.
	s.mu.Lock()
	waiting := s.pruneTimers[wc.Name] != nil
	s.mu.Unlock()
	if !waiting {
		s.awaitPrune(ctx, client.ObjectKeyFromObject(wc), identity, since.Add(maxPruneWaits*s.hub.opts.StaleAfter))
	}
	return nil
}

// maxPruneWaits bounds, in StaleAfters, how long a connected agent may take to prune:
// an agent of a removed cluster must not delay its own revocation by staying
// connected and never reporting the prune done.
const maxPruneWaits = 10

// awaitPrune finishes a decommission without pruning once StaleAfter has passed
// without the agent reporting it done, unless the agent is connected then: it is still
// pruning, and is given another StaleAfter, until deadline. Each cluster has one such
// timer: a decommission started again replaces it, and none fires after the source
// stops.
func (s *Source) awaitPrune(ctx context.Context, key client.ObjectKey, identity string, deadline time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.pruneTimers[key.Name]; t != nil {
		t.Stop()
	}
	var t *time.Timer
	t = time.AfterFunc(s.hub.opts.StaleAfter, func() {
		s.mu.Lock()
		current := s.pruneTimers[key.Name] == t
		if current {
			delete(s.pruneTimers, key.Name)
		}
		s.mu.Unlock()
		if !current || ctx.Err() != nil {
			return
		}
		var cur v1alpha1.WorkerCluster
		if err := s.hub.opts.Client.Get(ctx, key, &cur); err != nil {
			if client.IgnoreNotFound(err) != nil {
				s.log.Error("checking a decommission; trying again", "cluster", key.Name, "in", s.hub.opts.StaleAfter, "error", err)
				s.awaitPrune(ctx, key, identity, deadline)
			}
			return
		}
		if cur.Annotations[v1alpha1.DecommissionAnnotation] == "" || cur.Status.AppliedHash == decommissionHash(&cur) {
			return
		}
		msg := "removed; the agent did not connect, so nothing was pruned on the worker"
		if s.hub.opts.Tunnel.Connected(identity) {
			if time.Now().Before(deadline) {
				s.awaitPrune(ctx, key, identity, deadline)
				return
			}
			msg = "removed; the agent did not finish pruning in time, so the worker may keep objects; the agent is revoked"
		}
		unlock := s.refreshLocks.Lock(key.Name)
		err := s.finishDecommission(ctx, &cur, msg)
		unlock()
		if err != nil {
			// Revoking and deleting may both be done again.
			s.log.Error("finishing a decommission; trying again", "cluster", key.Name, "in", s.hub.opts.StaleAfter, "error", err)
			s.awaitPrune(ctx, key, identity, deadline)
		}
	})
	s.pruneTimers[key.Name] = t
}

// stopPruneTimer stops the drain or prune timer of the cluster name, which is back in
// the repository.
func (s *Source) stopPruneTimer(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.pruneTimers[name]; t != nil {
		t.Stop()
		delete(s.pruneTimers, name)
	}
}

func (s *Source) maybeFinishDecommission(ctx context.Context, wc *v1alpha1.WorkerCluster) error {
	// A cluster put back in the repository since is no longer leaving.
	if wc.Annotations[v1alpha1.DecommissionAnnotation] == "" || wc.Status.AppliedHash != decommissionHash(wc) {
		return nil
	}
	return s.finishDecommission(ctx, wc, "decommissioned: the agent pruned what it owned")
}

// finishDecommission revokes the agent's credential and deletes the WorkerCluster. The
// caller holds the cluster's refresh lock, so that no report of the cluster is posted or
// counted after.
func (s *Source) finishDecommission(ctx context.Context, wc *v1alpha1.WorkerCluster, msg string) error {
	if err := s.hub.opts.Tunnel.Revoke(ctx, wc); err != nil {
		return fmt.Errorf("revoking the credential of %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	if err := s.hub.opts.Client.Delete(ctx, wc); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	s.hub.opts.Status.Forget(client.ObjectKeyFromObject(wc))
	s.log.Info("cluster decommissioned", "cluster", wc.Name)
	s.post(ctx, sourceOf(wc).Commit, commitstatus.Status{Context: s.context(wc.Name), State: commitstatus.Success, Description: msg})
	s.mu.Lock()
	delete(s.states, wc.Name)
	delete(s.poolFull, wc.Name)
	s.gone[wc.Name] = wc.UID
	s.mu.Unlock()
	s.publishFleetSoon()
	return nil
}

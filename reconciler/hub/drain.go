package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
)

// DefaultDrainGracePeriod bounds a removed cluster's drain when fleet.yaml sets none.
const DefaultDrainGracePeriod = time.Hour

// drainCheckEvery is how often a drain counts the work still placed on its worker.
const drainCheckEvery = 10 * time.Second

// needsDrain reports whether a removed cluster must drain before its decommission: the
// hub dispatches to it, and its drain is not over.
func (s *Source) needsDrain(wc *v1alpha1.WorkerCluster) bool {
	if s.hub.opts.Dispatch == nil || wc.Annotations[v1alpha1.DrainedAnnotation] != "" {
		return false
	}
	d := wc.Status.Dispatch
	return d != nil && (d.Placement == v1alpha1.PlacementMember || d.Placement == v1alpha1.PlacementDraining)
}

// drain starts, or after a hub restart resumes, a removed cluster's drain: the worker's
// ClusterQueues hold, so that it takes no new work, while it keeps its place in the
// hub's Kueue (taking it out would make Kueue requeue the work running there); the
// decommission waits until no work placed on it runs, or the grace period is over.
func (s *Source) drain(ctx context.Context, wc *v1alpha1.WorkerCluster, head string, policy v1alpha1.DecommissionPolicy) error {
	identity := wc.Labels[v1alpha1.WorkerClusterLabel]
	key := client.ObjectKeyFromObject(wc)
	facts := []conditions.Fact{conditions.Placed{Pool: wc.Status.Dispatch.Pool, Placement: v1alpha1.PlacementDraining, Withdrawn: wc.Status.Dispatch.Withdrawn}}
	if wc.Annotations[v1alpha1.DrainingSinceAnnotation] == "" {
		s.log.Info("draining a cluster removed from the fleet before its decommission", "cluster", wc.Name)
		patch := client.MergeFrom(wc.DeepCopy())
		wc.Annotations = mergeMaps(wc.Annotations, map[string]string{v1alpha1.DrainingSinceAnnotation: time.Now().UTC().Format(time.RFC3339)})
		if err := s.patchWorkerCluster(ctx, wc, patch); err != nil {
			return err
		}
		// The removal's commit, where the drain and the decommission are told of.
		facts = append(facts, conditions.Sourced{Commit: head})
	}
	if ds := holding(s.hub.opts.Tunnel.Desired(identity)); ds != nil {
		if _, err := s.hub.opts.Status.Record(ctx, key, conditions.Desired{Hash: ds.Hash}); err != nil {
			return err
		}
		s.hub.opts.Tunnel.Push(key, identity, ds)
	}
	stored, err := s.hub.opts.Status.Record(ctx, key, facts...)
	if err != nil {
		return err
	}
	s.wakeDispatch()
	s.post(ctx, sourceOf(stored).Commit, commitstatus.Status{Context: s.context(wc.Name), State: commitstatus.Pending,
		Description: "removal drains first: no new work; waiting for the work placed on the cluster to finish"})
	s.awaitDrain(ctx, key, policy)
	return nil
}

// awaitDrain checks the drain every drainCheckEvery until it is over, then begins the
// decommission. One timer per cluster, as for prunes.
func (s *Source) awaitDrain(ctx context.Context, key client.ObjectKey, policy v1alpha1.DecommissionPolicy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.pruneTimers[key.Name]; t != nil {
		t.Stop()
	}
	var t *time.Timer
	t = time.AfterFunc(drainCheckEvery, func() {
		s.mu.Lock()
		current := s.pruneTimers[key.Name] == t
		if current {
			delete(s.pruneTimers, key.Name)
		}
		s.mu.Unlock()
		if !current || ctx.Err() != nil {
			return
		}
		if err := s.checkDrain(ctx, key, policy); err != nil {
			s.log.Error("checking a drain", "cluster", key.Name, "error", err)
			s.awaitDrain(ctx, key, policy)
		}
	})
	s.pruneTimers[key.Name] = t
}

// checkDrain ends the drain when nothing placed on the worker runs or the grace period
// is over, and waits again otherwise.
func (s *Source) checkDrain(ctx context.Context, key client.ObjectKey, policy v1alpha1.DecommissionPolicy) error {
	var wc v1alpha1.WorkerCluster
	if err := s.hub.opts.Client.Get(ctx, key, &wc); err != nil {
		return client.IgnoreNotFound(err)
	}
	since, err := time.Parse(time.RFC3339, wc.Annotations[v1alpha1.DrainingSinceAnnotation])
	if err != nil {
		return nil // not draining (any more)
	}
	s.mu.Lock()
	f := s.fleet
	s.mu.Unlock()
	grace, namespaces := DefaultDrainGracePeriod, []string(nil)
	if f != nil && f.Spec != nil {
		namespaces = f.Spec.Spec.WorkloadNamespaces
		if d := f.Spec.Spec.Dispatch; d != nil && d.DrainGracePeriod != nil {
			grace = d.DrainGracePeriod.Duration
		}
	}
	running, err := s.hub.opts.Dispatch.PlacedOn(ctx, namespaces, wc.Labels[v1alpha1.WorkerClusterLabel])
	if err != nil {
		return err
	}
	over := !time.Now().Before(since.Add(grace))
	if running > 0 && !over {
		s.post(ctx, s.drainCommit(&wc), commitstatus.Status{Context: s.context(wc.Name), State: commitstatus.Pending,
			Description: fmt.Sprintf("removal drains first: %d %s placed on the cluster still %s; the decommission begins by %s at the latest",
				running, plural(running, "job", "jobs"), plural(running, "runs", "run"), since.Add(grace).UTC().Format(time.RFC3339))})
		s.awaitDrain(ctx, key, policy)
		return nil
	}
	s.log.Info("drain over", "cluster", wc.Name, "stillRunning", running, "graceOver", over)
	patch := client.MergeFrom(wc.DeepCopy())
	wc.Annotations = mergeMaps(wc.Annotations, map[string]string{v1alpha1.DrainedAnnotation: time.Now().UTC().Format(time.RFC3339)})
	if err := s.patchWorkerCluster(ctx, &wc, patch); err != nil {
		return err
	}
	if err := s.decommission(ctx, &wc, s.drainCommit(&wc), policy); err != nil {
		return err
	}
	// The decommission takes the cluster out of the hub's Kueue: its MultiKueueCluster
	// goes now, not at the next resync minutes later.
	s.wakeDispatch()
	return nil
}

// holding is ds with every ClusterQueue holding: admitted work runs on, nothing new is
// admitted. Nil when there is no state to hold.
func holding(ds *protocol.DesiredState) *protocol.DesiredState {
	if ds == nil || ds.Decommission {
		return nil
	}
	// Running work stays reachable: the hub's Kueue follows it to its end.
	out := &protocol.DesiredState{Generation: ds.Generation, Dispatch: ds.Dispatch}
	h := sha256.New()
	for _, raw := range ds.Objects {
		var obj map[string]any
		if err := json.Unmarshal(raw, &obj); err == nil && obj["kind"] == "ClusterQueue" {
			spec, _ := obj["spec"].(map[string]any)
			if spec == nil {
				spec = map[string]any{}
			}
			spec["stopPolicy"] = "Hold"
			obj["spec"] = spec
			if b, err := json.Marshal(obj); err == nil {
				raw = b
			}
		}
		out.Objects = append(out.Objects, raw)
		h.Write(raw)
	}
	out.Hash = "sha256:" + hex.EncodeToString(h.Sum(nil))
	return out
}

// drainCommit is where the statuses of wc's drain go: the commit that removed the
// cluster (WorkerCluster.Source reads it where an older hub kept it too), or the head
// for a WorkerCluster that no hub recorded a source on.
func (s *Source) drainCommit(wc *v1alpha1.WorkerCluster) string {
	if c := wc.SourceCommit(); c != "" {
		return c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.head
}

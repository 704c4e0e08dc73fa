package hub

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
)

// Dispatcher keeps a tenant's Kueue objects on the hub (reconciler/dispatch).
type Dispatcher interface {
	// Sync brings the tenant's hub objects to what t says; the report, when there is
	// one, says what of it the hub refuses, for the fleet's summary.
	Sync(ctx context.Context, t dispatch.Tenant, wcs map[string]*v1alpha1.WorkerCluster) (*dispatch.Report, error)
	// PlacedOn counts the unfinished workloads of the namespaces that the hub's Kueue
	// placed on the identity's worker.
	PlacedOn(ctx context.Context, namespaces []string, identity string) (int, error)
	// Redial has the hub's Kueue try the cluster's worker again at once, if its agent is
	// connected and Kueue judged the worker unreachable.
	Redial(ctx context.Context, wc *v1alpha1.WorkerCluster) error
}

// dispatchResync is how often a tenant's hub Kueue objects are applied again without
// a change, reverting hand edits.
const dispatchResync = 5 * time.Minute

// wakeDispatch asks for the tenant's hub Kueue objects to be brought up to date.
func (s *Source) wakeDispatch() {
	select {
	case s.dispatchWake <- struct{}{}:
	default:
	}
}

// runDispatch syncs the tenant's hub Kueue objects on every wake and resync, until
// ctx ends. It runs apart from the branch sync: Kueue's objects never hold up a head.
func (s *Source) runDispatch(ctx context.Context) {
	if s.hub.opts.Dispatch == nil {
		return
	}
	t := time.NewTicker(dispatchResync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.dispatchWake:
		case <-t.C:
		}
		if err := s.syncDispatch(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("keeping the hub's Kueue objects", "error", err)
			time.AfterFunc(10*time.Second, s.wakeDispatch)
		}
	}
}

// syncDispatch hands the last head's clusters, as registered, to the dispatcher.
func (s *Source) syncDispatch(ctx context.Context) error {
	s.mu.Lock()
	f, fleetErr := s.fleet, s.fleetError
	s.mu.Unlock()
	// Nothing changes in the hub's Kueue on a head whose fleet.yaml does not validate.
	if f == nil || f.Spec == nil || fleetErr != "" {
		return nil
	}
	existing, err := s.workerClusters(ctx)
	if err != nil {
		return err
	}
	spec := &f.Spec.Spec
	t := dispatch.Tenant{Name: s.opts.Tenant, Enabled: spec.DispatchEnabled(), WorkloadNamespaces: spec.WorkloadNamespaces, HubNamespaces: s.opts.HubNamespaces}
	wcs := map[string]*v1alpha1.WorkerCluster{}
	s.mu.Lock()
	for name, wc := range existing {
		if wc.Annotations[v1alpha1.DecommissionAnnotation] != "" {
			continue
		}
		draining := wc.Annotations[v1alpha1.DrainingSinceAnnotation] != ""
		pool, err := fleet.PoolOf(spec, name, wc.Spec.Residency)
		if draining && wc.Status.Dispatch != nil {
			// Gone from Git: the pool it was placed in, to the end of its drain.
			pool, err = wc.Status.Dispatch.Pool, nil
		}
		if err != nil || pool == "" {
			continue // the cluster's commit says why
		}
		t.Workers = append(t.Workers, dispatch.WorkerOf(wc, pool, s.quotas[name], draining))
		wcs[wc.Labels[v1alpha1.WorkerClusterLabel]] = wc
		s.registered[name] = wc.Status.Enrollment != nil
	}
	s.mu.Unlock()
	rep, err := s.hub.opts.Dispatch.Sync(ctx, t, wcs)
	if rep != nil {
		s.noteDispatchRefusals(s.refusalsOf(rep))
	}
	return err
}

// refusalsOf says what rep refuses, each with how to fix it, sorted.
func (s *Source) refusalsOf(rep *dispatch.Report) []string {
	var out []string
	for _, e := range rep.Refused {
		out = append(out, e.Error())
	}
	for _, ns := range rep.NotGiven {
		out = append(out, fmt.Sprintf("workload namespace %s is not given to the tenant on the hub, so it has no LocalQueue there: add it to dispatch.workloadNamespaces of source %s in the hub's configuration", ns, s.opts.Name))
	}
	for ns, owner := range rep.Taken {
		whose := fmt.Sprintf("without a %s label", v1alpha1.TenantLabel)
		if owner != "" {
			whose = fmt.Sprintf("labelled for tenant %s", owner)
		}
		out = append(out, fmt.Sprintf("workload namespace %s exists on the hub %s, so it has no LocalQueue of this tenant: label it %s=%s to hand it over", ns, whose, v1alpha1.TenantLabel, s.opts.Tenant))
	}
	slices.Sort(out)
	return out
}

// noteDispatchRefusals keeps what the last dispatch sync refused, and has the fleet's
// summary say it when that changed.
func (s *Source) noteDispatchRefusals(refusals []string) {
	s.mu.Lock()
	changed := !slices.Equal(s.dispatchRefusals, refusals)
	s.dispatchRefusals = refusals
	s.mu.Unlock()
	if changed {
		s.publishFleetSoon()
	}
}

// dispatchScope is how far the hub's Kueue may reach into the fleet's workers through
// the API proxy: the fleet's workload namespaces, by the hub's origin. Nil when the hub
// dispatches nothing to them (no proxy, or a fleet that turned dispatch off), which
// closes the proxy on every worker.
func (s *Source) dispatchScope(f *fleet.Fleet) *protocol.Dispatch {
	if s.hub.opts.Dispatch == nil || f == nil || f.Spec == nil || !f.Spec.Spec.DispatchEnabled() {
		return nil
	}
	return &protocol.Dispatch{Origin: dispatch.Origin, Namespaces: slices.Clone(f.Spec.Spec.WorkloadNamespaces)}
}

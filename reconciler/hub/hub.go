// Package hub joins the hub's parts into the product: it follows each fleet source
// (a repository and branch for one tenant), re-reads only the clusters a new head
// changed, validates and renders them, keeps one WorkerCluster per cluster in the
// tenant's namespace, hands the desired states to the tunnel, sums the agents' reports
// up into Ready, and reports each cluster as a commit status on the commit its state
// came from.
//
// Each verb has its file: hub.go the hub and the desired states it hands the tunnel,
// source.go a followed repository and its workers, sync.go a new head of the branch,
// reconcile.go one cluster of it, decommission.go a cluster that left, publish.go the
// commit statuses, plans.go the pull requests' plans, and faults.go how a fault of the
// hub's own reads on a commit.
package hub

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/plan"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// Options configure a Hub.
type Options struct {
	// Client reads and writes WorkerClusters and Secrets on the hub cluster.
	Client    client.Client
	Decryptor *secrets.Decryptor
	Log       *slog.Logger
	// OnSync, OnFetch and OnReconcile, when set, learn for metrics how long each sync
	// of a source, each fetch within it, and each cluster's reconcile took.
	OnSync      func(source string, took time.Duration, err error)
	OnFetch     func(source string, took time.Duration, err error)
	OnReconcile func(source string, took time.Duration, err error)
	// Plans, when set, keeps the plans of open pull requests: each gets a
	// <prefix>/plan status on its head, and the store serves the plan pages.
	Plans *plan.Store
	// PublicURL is the hub's HTTP address as people reach it, for plan statuses'
	// target URLs; empty posts plans without one.
	PublicURL string
	// StaleAfter is how long after its first sync a hub waits for the agents a previous
	// hub had connected before it records the missing ones as disconnected. Default 1
	// minute; it should exceed the agents' redial backoff.
	StaleAfter time.Duration
	// PlanTimeout bounds one pull request's plan, and the listing and fetching before
	// it. Default 1 minute.
	PlanTimeout time.Duration
	// PlanWorkers is how many plans the hub computes at once over all sources. Default 2.
	PlanWorkers int
	// MaxPlannedClusters is how many clusters one plan renders in full; the others are
	// summarized. Default plan.DefaultMaxRendered.
	MaxPlannedClusters int
	// Budget bounds what the hub reads of one head, of the branch or of a pull request;
	// the zero value is fleet's default.
	Budget fleet.Budget
}

// Hub reconciles fleet sources. Attach the tunnel before running it.
type Hub struct {
	opts     Options
	renderer *render.Renderer
	tunnel   *tunnel.Server

	// planSlots holds a token for every plan being computed, over all sources.
	planSlots chan struct{}

	mu      sync.Mutex
	desired map[string]*protocol.DesiredState // by identity
	keys    map[string]client.ObjectKey       // the WorkerCluster of each identity
	sources map[string]*Source                // by tenant namespace
}

// New checks the options.
func New(opts Options) (*Hub, error) {
	if opts.Client == nil || opts.Decryptor == nil {
		return nil, errors.New("hub: a client and a decryptor are required")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.StaleAfter <= 0 {
		opts.StaleAfter = time.Minute
	}
	if opts.PlanTimeout <= 0 {
		opts.PlanTimeout = time.Minute
	}
	if opts.PlanWorkers <= 0 {
		opts.PlanWorkers = 2
	}
	return &Hub{opts: opts, renderer: render.New(), planSlots: make(chan struct{}, opts.PlanWorkers),
		desired: map[string]*protocol.DesiredState{}, keys: map[string]client.ObjectKey{}, sources: map[string]*Source{}}, nil
}

// Attach gives the hub the tunnel it pushes desired states through. The tunnel's
// Desired and OnStatus should be the hub's.
func (h *Hub) Attach(t *tunnel.Server) { h.tunnel = t }

// Desired is the tunnel's source of desired states.
func (h *Hub) Desired(_ context.Context, wc *v1alpha1.WorkerCluster) (*protocol.DesiredState, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.desired[wc.Labels[v1alpha1.WorkerClusterLabel]], nil
}

// Resolve is the tunnel's way to the WorkerCluster of an identity the hub reconciled.
func (h *Hub) Resolve(identity string) (client.ObjectKey, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	key, ok := h.keys[identity]
	return key, ok
}

// OnStatus is the tunnel's hook: an agent's report changed a WorkerCluster's status.
// The cluster is summed up and its commit status posted by the source's workers, so
// that a slow forge never holds up the tunnel, and reports that arrive together (a
// connection, an inventory, an apply) are posted as one.
func (h *Hub) OnStatus(_ context.Context, key client.ObjectKey) {
	h.mu.Lock()
	src := h.sources[key.Namespace]
	h.mu.Unlock()
	if src != nil {
		src.queue.Add(key.Name)
	}
}

func (h *Hub) setKey(identity string, key client.ObjectKey) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.keys[identity] = key
}

func (h *Hub) setDesired(identity string, ds *protocol.DesiredState) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ds == nil {
		// The cluster left the fleet: its agent is no longer known.
		delete(h.desired, identity)
		delete(h.keys, identity)
		return
	}
	h.desired[identity] = ds
}

func mergeMaps(dst, src map[string]string) map[string]string {
	if dst == nil {
		dst = map[string]string{}
	}
	for k, v := range src {
		dst[k] = v
	}
	return dst
}

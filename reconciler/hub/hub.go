// Package hub joins the hub's parts into the product: it follows each fleet source
// (a repository and branch for one tenant), re-reads only the clusters a new head
// changed, validates and renders them, keeps one WorkerCluster per cluster in the
// tenant's namespace, pushes the desired states through the tunnel (the [Tunnel]
// interface: cmd/flotilla-hub hands it reconciler/tunnel's server), and reports each
// cluster as a commit status on the commit its state came from. The WorkerClusters'
// status belongs to reconciler/conditions: the hub records what it renders there and
// learns from it which statuses the agents' reports changed.
//
// Each verb has its file: hub.go the hub and what it needs of the tunnel, source.go a
// followed repository and its workers, sync.go a new head of the branch (its clusters
// prepared on every core, then written), reconcile.go one cluster of it, reads.go where
// WorkerClusters are read from and which writes are left out because they would change
// nothing, decommission.go a cluster that left, publish.go the commit statuses,
// summary.go how often the fleet's summary is derived, status_book.go how each commit's
// statuses reach the forge (and when a large change is summarized), page_commits.go the
// page of a commit's clusters, plans.go the pull requests' plans, and faults.go how a
// fault of the hub's own reads on a commit.
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
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/plan"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// Options configure a Hub.
type Options struct {
	// Client reads and writes WorkerClusters and Secrets on the hub cluster.
	Client client.Client
	// Reader is where the hub reads the WorkerClusters flotilla manages in the sources'
	// namespaces: an informer cache of them in cmd/flotilla-hub, so that a sync lists
	// nothing on the hub cluster and a cluster as Git has it costs no request
	// (reads.go). Defaults to Client.
	Reader    client.Reader
	Decryptor *secrets.Decryptor
	// Tunnel reaches the agents: the hub pushes desired states through it.
	Tunnel Tunnel
	// Status writes the WorkerClusters' status; the hub learns through it which
	// statuses changed, to post their commit statuses.
	Status *conditions.Writer
	Log    *slog.Logger
	// OnSync, OnFetch and OnReconcile, when set, learn for metrics how long each sync
	// of a source, each fetch within it, and each cluster's reconcile took.
	OnSync      func(source string, took time.Duration, err error)
	OnFetch     func(source string, took time.Duration, err error)
	OnReconcile func(source string, took time.Duration, err error)
	// Plans, when set, keeps the plans of open pull requests: each gets a
	// <prefix>/plan status on its head, and the store serves the plan pages.
	Plans *plan.Store
	// PublicURL is the hub's HTTP address as people reach it, for the target URLs of
	// plan statuses and of the fleet's summary; empty posts them without one.
	PublicURL string
	// StaleAfter is how long after its sources start a hub waits for the agents a
	// previous hub had connected before it records the missing ones as disconnected.
	// Default 1 minute; it should exceed the agents' redial backoff.
	StaleAfter time.Duration
	// FetchTimeout bounds one fetch of a source's branch, with the deepening of a push of
	// several commits: a repository that stops answering mid-transfer fails that sync,
	// and the next one tries again. Default 5 minutes.
	FetchTimeout time.Duration
	// AckWait is how long a desired state sent to a connected agent waits, unrecorded,
	// for the agent's acknowledgement, so that one status write records both: a change
	// to every cluster then costs one write per cluster that did not change in Git.
	// Default 2 seconds; negative records each desired state when it is sent.
	AckWait time.Duration
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
	// Dispatch keeps the tenants' Kueue objects on the hub, so that the hub's Kueue
	// dispatches to the workers; nil when the hub runs without its API proxy.
	Dispatch Dispatcher
}

// DefaultAckWait is Options.AckWait's default: an agent applies a desired state within
// a second or so, and a hub cluster that lags does not hold the acknowledgement back
// (the facts go with any write of the status, as soon as it begins).
const DefaultAckWait = 2 * time.Second

// Tunnel is what the hub needs of the agents' tunnels (reconciler/tunnel's Server).
type Tunnel interface {
	// Push makes ds the desired state of the identity, whose WorkerCluster is key, and
	// hands it to its agent if connected, without waiting for the network.
	Push(key client.ObjectKey, identity string, ds *protocol.DesiredState) bool
	// Desired is the state last pushed for the identity, nil when none was: a drain
	// holds the worker's ClusterQueues in it.
	Desired(identity string) *protocol.DesiredState
	// Connected reports whether the identity's agent has a live tunnel.
	Connected(identity string) bool
	// Revoke ends the agent of wc for good, before its WorkerCluster is deleted.
	Revoke(ctx context.Context, wc *v1alpha1.WorkerCluster) error
	// EnforceRevocation closes the tunnel of wc's agent when wc's spec.revocation
	// revokes its credential.
	EnforceRevocation(wc *v1alpha1.WorkerCluster) bool
	// Redeemed reports whether the WorkerCluster named key redeemed token before, in
	// an earlier life: the tunnel refuses it.
	Redeemed(ctx context.Context, key client.ObjectKey, token secrets.Hash) (bool, error)
}

// Hub reconciles fleet sources.
type Hub struct {
	opts     Options
	renderer *render.Renderer

	// planSlots holds a token for every plan being computed, over all sources.
	planSlots chan struct{}

	mu      sync.Mutex
	sources map[string]*Source // by tenant namespace
}

// New checks the options, and has the hub learn of the status changes its Status
// writer makes.
func New(opts Options) (*Hub, error) {
	if opts.Client == nil || opts.Decryptor == nil || opts.Tunnel == nil || opts.Status == nil {
		return nil, errors.New("hub: a client, a decryptor, a tunnel and a status writer are required")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Reader == nil {
		opts.Reader = opts.Client
	}
	if opts.StaleAfter <= 0 {
		opts.StaleAfter = time.Minute
	}
	if opts.AckWait == 0 {
		opts.AckWait = DefaultAckWait
	}
	if opts.FetchTimeout <= 0 {
		opts.FetchTimeout = 5 * time.Minute
	}
	if opts.PlanTimeout <= 0 {
		opts.PlanTimeout = time.Minute
	}
	if opts.PlanWorkers <= 0 {
		opts.PlanWorkers = 2
	}
	h := &Hub{opts: opts, renderer: render.New(), planSlots: make(chan struct{}, opts.PlanWorkers), sources: map[string]*Source{}}
	opts.Status.OnChange(h.statusChanged)
	return h, nil
}

// statusChanged learns that a WorkerCluster's status changed (an agent's report, most
// often). The cluster's commit status is posted by its source's workers, so that a
// slow forge never holds up the tunnel, and reports that arrive together (a
// connection, an inventory, an apply) are posted as one.
func (h *Hub) statusChanged(key client.ObjectKey) {
	h.mu.Lock()
	src := h.sources[key.Namespace]
	h.mu.Unlock()
	if src != nil {
		src.queue.Add(key.Name)
	}
}

// WakeDispatch brings every tenant's Kueue objects on the hub up to date, e.g. when
// the API proxy's trust bundle changed.
func (h *Hub) WakeDispatch() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.sources {
		s.wakeDispatch()
	}
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

package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/keylock"
)

// refreshWorkers is how many of a source's clusters are summed up and posted at once.
const refreshWorkers = 4

// SourceOptions name one fleet source.
type SourceOptions struct {
	// Name identifies the source in logs and metrics; defaults to the tenant.
	Name string
	Git  gitsource.Options
	// Tenant is the only tenant the source's fleet.yaml may name; Namespace is the
	// tenant's namespace on the hub, the only one the source writes.
	Tenant    string
	Namespace string
	// HubNamespaces are the namespaces on the hub that the hub's configuration gives
	// the tenant for its jobs: of the workload namespaces fleet.yaml names, dispatch
	// queues only in these (dispatch.Tenant.HubNamespaces).
	HubNamespaces []string
	// Statuses keeps commit statuses; nil posts none.
	Statuses commitstatus.Backend
	// Limits reads the forge's rate limits when Statuses wraps a backend that knows
	// them (for metrics); nil reads them from Statuses itself.
	Limits commitstatus.Limited
	// Budget, when set, is the forge credential's budget the source shares with the
	// other sources posting with that credential (commitstatus.Budget).
	Budget *commitstatus.Budget
	// SummaryThreshold is how many clusters a change may touch and still get a status
	// per cluster; a larger one gets them only for the clusters that fail, beside the
	// fleet's summary (status_book.go). Zero means DefaultSummaryThreshold; negative
	// never summarizes.
	SummaryThreshold int
	// RememberedCommits is how many commits the source remembers what it posted on
	// (whether each was summarized, each context's latest status), so that a commit seen
	// again is not posted again; older ones are forgotten, the newest first kept. Zero
	// means DefaultRememberedCommits.
	RememberedCommits int
	// Poll is the interval between fetches when no webhook arrives. Default 1 minute.
	Poll time.Duration
	// PullRequests, when set, says which pull requests into the branch are open, as the
	// forge knows: only those are planned. Without it every pull-request ref the
	// repository has is planned, which suits a plain git server, where such refs are
	// pushed on purpose.
	PullRequests commitstatus.PullRequestLister
}

// Source is one followed fleet repository.
type Source struct {
	hub       *Hub
	opts      SourceOptions
	git       *gitsource.Source
	poller    *gitsource.Poller
	publisher *commitstatus.Publisher
	// book keeps each commit's statuses and how they are posted.
	book *statusBook
	log  *slog.Logger
	// queue holds the names of clusters whose agents reported, for refresh.
	queue workqueue.TypedRateLimitingInterface[string]
	// planWake wakes the plan worker after a sync.
	planWake chan struct{}
	// plannedHeads are the open pull requests' heads already planned; only the plan
	// worker uses it.
	plannedHeads map[string]bool
	// refreshLocks keep two refreshes of one cluster apart.
	refreshLocks keylock.Locks[string]
	// summary coalesces the posts of the fleet's summary (summary.go).
	summary summaryWake

	mu   sync.Mutex
	last plumbing.Hash
	head string
	// wide is the commit of the head's push before it that changed every cluster, if
	// any: it shows the fleet's summary too, since the statuses of its clusters are
	// summarized on it and nothing else would tell what became of them.
	wide   string
	prefix string
	// states are the clusters' last published statuses, for the fleet's summary.
	states map[string]commitstatus.State
	// applying is set while a sync reconciles a head it has not set yet: states then
	// mix the last head's clusters with the new one's, and are no summary of either.
	applying bool
	// invalid are the clusters of the last head whose directory does not validate.
	invalid map[string]string
	// retry are the clusters whose last reconcile failed on the hub's side (the hub
	// cluster's API, a KMS), each with the commit its status went on: the next sync tries
	// them again even if the head is the same, and posts on that commit again unless the
	// cluster changed since.
	retry map[string]string
	// fleetError is set while the head is not applied: fleet.yaml, a preset or the
	// head's budgets do not validate, or it names another tenant.
	fleetError string
	// pruneTimers finish the decommissions whose agent stays away, one per cluster.
	pruneTimers map[string]*time.Timer
	// gone are the WorkerClusters decommissioned, by name: a report of one, read
	// before its deletion, must not count it in the summary again, nor post over its
	// last status. A cluster added back is a WorkerCluster of another UID.
	gone map[string]types.UID
	// fleet is the last head as loaded, which the next head's changed clusters are
	// read on top of.
	fleet *fleet.Fleet
	// waitingRemovals are the clusters removed from the repository while fleet.yaml or
	// a preset did not validate: nothing is decommissioned on a head whose policy
	// cannot be read, so they wait for a head that validates.
	waitingRemovals map[string]bool
	// quotas are what each cluster's rendered ClusterQueue offers its dispatch pool.
	quotas map[string]corev1.ResourceList
	// registered says which clusters dispatch last saw registered: a registration
	// wakes it.
	registered map[string]bool
	// dispatchWake wakes the dispatch worker.
	dispatchWake chan struct{}
	// poolFull are the clusters left out of a full dispatch pool, with the pool's name:
	// the fleet's summary warns of them.
	poolFull map[string]string
	// dispatchRefusals say, sorted, what of the fleet the hub's Kueue refuses it at the
	// last dispatch sync (a pool whose names are another's, a namespace the hub's
	// configuration does not give the tenant): the fleet's summary fails on them.
	dispatchRefusals []string
}

// AddSource follows a repository for a tenant.
func (h *Hub) AddSource(opts SourceOptions) (*Source, error) {
	if opts.Tenant == "" || opts.Namespace == "" {
		return nil, errors.New("hub: a source needs its tenant and namespace")
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Minute
	}
	if opts.Name == "" {
		opts.Name = opts.Tenant
	}
	g, err := gitsource.New(opts.Git)
	if err != nil {
		return nil, err
	}
	s := &Source{hub: h, opts: opts, git: g, log: h.opts.Log.With("tenant", opts.Tenant, "repository", gitsource.RedactURL(opts.Git.URL)),
		prefix: fleet.DefaultStatusContextPrefix, states: map[string]commitstatus.State{}, invalid: map[string]string{}, retry: map[string]string{}, waitingRemovals: map[string]bool{}, pruneTimers: map[string]*time.Timer{}, gone: map[string]types.UID{},
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		planWake: make(chan struct{}, 1), dispatchWake: make(chan struct{}, 1), quotas: map[string]corev1.ResourceList{}, registered: map[string]bool{}, poolFull: map[string]string{}}
	if opts.RememberedCommits <= 0 {
		opts.RememberedCommits = DefaultRememberedCommits
	}
	s.book = newStatusBook(opts.SummaryThreshold, opts.RememberedCommits)
	if opts.Statuses != nil {
		s.publisher = commitstatus.NewPublisher(opts.Statuses, commitstatus.PublisherOptions{Log: s.log, Limits: opts.Limits, Budget: opts.Budget, Commits: opts.RememberedCommits})
	}
	s.poller = gitsource.NewPoller(opts.Poll, 0.1, func(ctx context.Context) {
		began := time.Now()
		err := s.Sync(ctx)
		if h.opts.OnSync != nil {
			h.opts.OnSync(opts.Name, time.Since(began), err)
		}
		if err != nil {
			s.log.Error("sync failed", "error", err)
		}
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, dup := h.sources[opts.Namespace]; dup {
		return nil, fmt.Errorf("hub: two sources write namespace %s", opts.Namespace)
	}
	h.sources[opts.Namespace] = s
	return s, nil
}

// StatusQueue is how many commit statuses wait to be posted or are being posted, and
// how many a full queue dropped unposted since start: zero without a status backend.
func (s *Source) StatusQueue() (pending, dropped int) {
	if s.publisher == nil {
		return 0, 0
	}
	return s.publisher.Pending(), s.publisher.Dropped()
}

// Trigger asks for a fetch now, e.g. from a webhook; triggers coalesce.
func (s *Source) Trigger() { s.poller.Trigger() }

// Run syncs at once, then on every trigger and poll, plans the open pull requests
// beside it, and refreshes the clusters whose agents reported, until ctx ends.
func (s *Source) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for range refreshWorkers {
		wg.Go(func() {
			for s.refreshNext(ctx) {
			}
		})
	}
	if s.publisher != nil {
		wg.Go(func() { s.publisher.Run(ctx) })
	}
	wg.Go(func() { s.runPlans(ctx) })
	wg.Go(func() { s.runDispatch(ctx) })
	wg.Go(func() { s.runSummary(ctx) })
	// The agents a previous hub left connected have StaleAfter to come back, whatever
	// the repository holds and whether it can be reached.
	stale := time.AfterFunc(s.hub.opts.StaleAfter, func() {
		if ctx.Err() == nil {
			s.markStale(ctx)
		}
	})
	defer stale.Stop()
	s.poller.Run(ctx)
	s.queue.ShutDown()
	wg.Wait()
}

// refreshNext refreshes one queued cluster; false once the queue is shut down.
func (s *Source) refreshNext(ctx context.Context) bool {
	name, shutdown := s.queue.Get()
	if shutdown {
		return false
	}
	defer s.queue.Done(name)
	if err := s.refresh(ctx, name); err != nil {
		if ctx.Err() == nil {
			s.log.Error("refreshing a WorkerCluster", "workerCluster", name, "error", err)
			s.queue.AddRateLimited(name)
		}
		return true
	}
	s.queue.Forget(name)
	return true
}

// Sync fetches the branch and reconciles what its new head changed, asks for the
// fleet's summary, then wakes the plan worker, which plans the pull requests whose heads
// are new without holding up the next sync.
func (s *Source) Sync(ctx context.Context) error {
	// The statuses of a new head are counted before they are posted: see status_book.go.
	s.book.beginSync()
	err := s.syncBranch(ctx)
	s.endSync()
	// The new head's summary, once the head is set; on a poll that found nothing new,
	// the same summary again, which the publisher posts only if the commit does not show
	// it (summary.go).
	s.publishFleetSoon()
	s.wakePlans()
	return err
}

func (s *Source) prefixNow() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prefix
}

// setHead records h as the head, whose push also brought wide, an older commit that
// changed every cluster (none when empty).
func (s *Source) setHead(h plumbing.Hash, f *fleet.Fleet, fleetErr, wide string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last, s.head, s.fleet, s.fleetError, s.applying = h, h.String(), f, fleetErr, false
	s.wide = wide
}

func (s *Source) context(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prefix + "/" + name
}

// workerClusters are the source's WorkerClusters, as the hub's cache has them.
func (s *Source) workerClusters(ctx context.Context) (map[string]*v1alpha1.WorkerCluster, error) {
	var list v1alpha1.WorkerClusterList
	if err := s.hub.opts.Reader.List(ctx, &list, client.InNamespace(s.opts.Namespace), client.MatchingLabels{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue}); err != nil {
		return nil, fmt.Errorf("listing WorkerClusters in %s: %w", s.opts.Namespace, err)
	}
	out := make(map[string]*v1alpha1.WorkerCluster, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

// workerClustersNamed are the source's WorkerClusters of names that exist, as the
// hub's cache has them.
func (s *Source) workerClustersNamed(ctx context.Context, names []string) (map[string]*v1alpha1.WorkerCluster, error) {
	out := make(map[string]*v1alpha1.WorkerCluster, len(names))
	for _, name := range names {
		wc := new(v1alpha1.WorkerCluster)
		err := s.hub.opts.Reader.Get(ctx, client.ObjectKey{Namespace: s.opts.Namespace, Name: name}, wc)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("reading WorkerCluster %s/%s: %w", s.opts.Namespace, name, err)
		case wc.Labels[v1alpha1.ManagedByLabel] == v1alpha1.ManagedByValue:
			// As the list: one made by hand is not flotilla's.
			out[name] = wc
		}
	}
	return out, nil
}

// Package hub joins the hub's parts into the product: it follows each fleet source
// (a repository and branch for one tenant), re-reads only the clusters a new head
// changed, validates and renders them, keeps one WorkerCluster per cluster in the
// tenant's namespace, hands the desired states to the tunnel, sums the agents' reports
// up into Ready, and reports each cluster as a commit status on the commit its state
// came from.
package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/status"
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
	// Statuses keeps commit statuses; nil posts none.
	Statuses status.Backend
	// Poll is the interval between fetches when no webhook arrives. Default 1 minute.
	Poll time.Duration
	// PullRequests, when set, says which pull requests into the branch are open, as the
	// forge knows: only those are planned. Without it every pull-request ref the
	// repository has is planned, which suits a plain git server, where such refs are
	// pushed on purpose.
	PullRequests status.PullRequestLister
}

// Source is one followed fleet repository.
type Source struct {
	hub       *Hub
	opts      SourceOptions
	git       *gitsource.Source
	poller    *gitsource.Poller
	publisher *status.Publisher
	log       *slog.Logger
	// queue holds the names of clusters whose agents reported, for refresh.
	queue workqueue.TypedRateLimitingInterface[string]
	// planWake wakes the plan worker after a sync.
	planWake chan struct{}
	// refreshLocks keep two refreshes of one cluster apart.
	refreshLocks keyedLocks

	mu     sync.Mutex
	last   plumbing.Hash
	head   string
	prefix string
	// states are the clusters' last published statuses, for the fleet's summary.
	states map[string]status.State
	// invalid are the clusters of the last head whose directory does not validate.
	invalid map[string]string
	// retry are the clusters whose last reconcile failed on the hub's side (the hub
	// cluster's API, a KMS): the next sync tries them again even if the head is the same.
	retry map[string]bool
	// fleetError is set while fleet.yaml or a preset does not validate.
	fleetError string
	// waitingRemovals are the clusters removed from the repository while fleet.yaml or
	// a preset did not validate: nothing is decommissioned on a head whose policy
	// cannot be read, so they wait for a head that validates.
	waitingRemovals map[string]bool
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
		prefix: fleet.DefaultStatusContextPrefix, states: map[string]status.State{}, invalid: map[string]string{}, retry: map[string]bool{}, waitingRemovals: map[string]bool{},
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		planWake: make(chan struct{}, 1)}
	if opts.Statuses != nil {
		s.publisher = status.NewPublisher(opts.Statuses, status.PublisherOptions{Log: s.log})
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
	wg.Go(func() { s.runPlans(ctx) })
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

// Sync fetches the branch and reconciles what its new head changed, then wakes the
// plan worker, which plans the pull requests whose heads are new without holding up the
// next sync.
func (s *Source) Sync(ctx context.Context) error {
	err := s.syncBranch(ctx)
	s.wakePlans()
	return err
}

func (s *Source) prefixNow() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prefix
}

func (s *Source) syncBranch(ctx context.Context) error {
	s.mu.Lock()
	last := s.last
	retrying := slices.Sorted(maps.Keys(s.retry))
	s.mu.Unlock()
	began := time.Now()
	snap, ch, err := s.git.Update(ctx, last)
	if s.hub.opts.OnFetch != nil {
		s.hub.opts.OnFetch(s.opts.Name, time.Since(began), err)
	}
	if err != nil {
		var ve *gitsource.VerificationError
		if errors.As(err, &ve) {
			s.post(ctx, ve.Commit, status.Status{Context: s.context("fleet"), State: status.Failure, Description: "not applied: " + ve.Reason})
		}
		// A head too large to fetch is never read: like a broken fleet.yaml, nothing
		// changes on the workers, and the commit says why.
		var be *gitsource.BudgetError
		if errors.As(err, &be) {
			s.post(ctx, be.Commit.String(), status.Status{Context: s.context("fleet"), State: status.Failure, Description: "not applied: " + be.Error()})
		}
		return err
	}
	if snap.Commit == last && len(retrying) == 0 {
		return nil
	}
	head := snap.Commit.String()
	log := s.log.With("commit", head)
	f := fleet.LoadWith(snap.FS(), fleet.LoadOptions{Budget: s.hub.opts.Budget})
	s.mu.Lock()
	s.prefix = f.StatusContextPrefix()
	s.mu.Unlock()

	if f.Spec != nil && f.Spec.Spec.Tenant != s.opts.Tenant {
		// Tenant isolation: a source writes its own namespace only, whatever the
		// repository claims.
		msg := fmt.Sprintf("%s names tenant %q; this repository may only hold tenant %q", fleet.FleetFile, f.Spec.Spec.Tenant, s.opts.Tenant)
		log.Warn("refused a head", "reason", msg)
		s.setHead(snap.Commit, msg)
		s.post(ctx, head, status.Status{Context: s.context("fleet"), State: status.Failure, Description: msg})
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

	existing, err := s.workerClusters(ctx)
	if err != nil {
		return err
	}
	names := ch.Clusters
	if ch.All {
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
	log.Info("reconciling a head", "clusters", len(names), "all", ch.All, "reason", ch.Reason, "retrying", len(retrying))
	// Clusters are independent: their API writes overlap, and a fleet-wide change is
	// not the sum of each cluster's round trips.
	var g errgroup.Group
	g.SetLimit(reconcileWorkers)
	for _, name := range names {
		g.Go(func() error {
			s.reconcileName(ctx, log, f, name, existing[name], head, fleetErr)
			return nil
		})
	}
	_ = g.Wait()
	s.setHead(snap.Commit, fleetErr)
	s.publishFleet(ctx)
	if last.IsZero() {
		time.AfterFunc(s.hub.opts.StaleAfter, func() { s.markStale(context.WithoutCancel(ctx)) })
	}
	return nil
}

// reconcileWorkers is how many clusters of one head are reconciled at once.
const reconcileWorkers = 8

// reconcileName brings one cluster of the head to the hub: enrolled or updated,
// decommissioned when its directory is gone, or failed alone.
func (s *Source) reconcileName(ctx context.Context, log *slog.Logger, f *fleet.Fleet, name string, wc *v1alpha1.WorkerCluster, head, fleetErr string) {
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
		s.post(ctx, head, status.Status{Context: s.context(name), State: status.Pending, Description: "removal waits: the fleet does not validate at this commit; the worker keeps its state"})
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
		err = s.reconcileCluster(ctx, f, c, wc, head)
	}
	if s.hub.opts.OnReconcile != nil {
		s.hub.opts.OnReconcile(s.opts.Name, time.Since(began), err)
	}
	s.mu.Lock()
	if err != nil {
		s.retry[name] = true
	} else {
		delete(s.retry, name)
	}
	s.mu.Unlock()
	if err != nil {
		// A fault of the hub's, not of the repository: say so on the commit, keep the
		// worker as it is, and try again on the next poll.
		log.Error("reconciling a cluster", "cluster", name, "error", err)
		s.post(ctx, head, status.Status{Context: s.context(name), State: status.Error, Description: faultDescription(err)})
		if wc != nil {
			// Best effort: the hub cluster's API may be what failed.
			cur := wc.DeepCopy()
			patch := client.MergeFrom(wc)
			cur.Annotations = mergeMaps(cur.Annotations, map[string]string{v1alpha1.HubErrorAnnotation: faultDetail(err)})
			if aerr := s.hub.opts.Client.Patch(ctx, cur, patch); aerr != nil {
				log.Warn("recording a hub fault on its WorkerCluster", "cluster", name, "error", aerr)
			}
		}
	}
}

// markStale records as disconnected the clusters whose Connected condition a previous
// hub left True and whose agent did not come back to this one.
func (s *Source) markStale(ctx context.Context) {
	if s.hub.tunnel == nil {
		return
	}
	existing, err := s.workerClusters(ctx)
	if err != nil {
		s.log.Error("checking for agents that did not come back", "error", err)
		return
	}
	for name, wc := range existing {
		c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionConnected)
		if c == nil || c.Status != metav1.ConditionTrue || s.hub.tunnel.Connected(wc.Labels[v1alpha1.WorkerClusterLabel]) {
			continue
		}
		err := s.patchStatus(ctx, name, func(wc *v1alpha1.WorkerCluster) {
			meta.SetStatusCondition(&wc.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionConnected, Status: metav1.ConditionFalse,
				Reason: tunnel.ReasonTunnelDown, Message: "the agent has not connected since the hub restarted", ObservedGeneration: wc.Generation})
		})
		if err == nil {
			err = s.refresh(ctx, name)
		}
		if err != nil {
			s.log.Error("recording a stale connection", "cluster", name, "error", err)
		}
	}
}

func (s *Source) setHead(h plumbing.Hash, fleetErr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last, s.head, s.fleetError = h, h.String(), fleetErr
}

func (s *Source) context(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prefix + "/" + name
}

func (s *Source) workerClusters(ctx context.Context) (map[string]*v1alpha1.WorkerCluster, error) {
	var list v1alpha1.WorkerClusterList
	if err := s.hub.opts.Client.List(ctx, &list, client.InNamespace(s.opts.Namespace), client.MatchingLabels{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue}); err != nil {
		return nil, fmt.Errorf("listing WorkerClusters in %s: %w", s.opts.Namespace, err)
	}
	out := make(map[string]*v1alpha1.WorkerCluster, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

// inputsDigest changes whenever the cluster's directory or a fleet-wide input does.
func inputsDigest(f *fleet.Fleet, c *fleet.Cluster) string {
	h := sha256.New()
	h.Write([]byte(c.Digest))
	spec, _ := json.Marshal(f.Spec)
	h.Write(spec)
	for _, name := range f.PresetNames() {
		h.Write([]byte(name + "\x00" + f.Presets[name].Digest))
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// reconcileCluster validates, renders and enrolls one cluster of the head.
func (s *Source) reconcileCluster(ctx context.Context, f *fleet.Fleet, c *fleet.Cluster, wc *v1alpha1.WorkerCluster, head string) error {
	identity := fleet.Identity(s.opts.Tenant, c.Name)
	digest := inputsDigest(f, c)
	fail := func(why string) error {
		// Fails alone: the WorkerCluster and the worker keep their last good state.
		s.mu.Lock()
		s.invalid[c.Name] = why
		s.mu.Unlock()
		s.post(ctx, head, status.Status{Context: s.context(c.Name), State: status.Failure, Description: why})
		if wc == nil {
			return nil
		}
		return s.annotate(ctx, wc, map[string]string{v1alpha1.InvalidAnnotation: why, v1alpha1.SourceCommitAnnotation: head, v1alpha1.SourceDigestAnnotation: digest})
	}
	if !c.Valid() {
		return fail(c.Errors[0].Error())
	}
	res, err := s.hub.renderer.Render(f, c.Name)
	if err != nil {
		var list fleet.ErrorList
		if errors.As(err, &list) && len(list) > 0 {
			return fail(list[0].Error())
		}
		return fail(err.Error())
	}
	tok, err := s.hub.opts.Decryptor.TokenHash(ctx, path.Join(c.Dir, fleet.EnrollmentFile), c.Enrollment())
	if errors.Is(err, secrets.ErrKeyUnavailable) {
		// The KMS did not answer or refused the hub: nothing is wrong with the file.
		return err
	}
	if err != nil {
		return fail(err.Error())
	}
	s.mu.Lock()
	delete(s.invalid, c.Name)
	s.mu.Unlock()

	commit := head
	if wc != nil && wc.Annotations[v1alpha1.SourceDigestAnnotation] == digest && wc.Annotations[v1alpha1.SourceCommitAnnotation] != "" {
		commit = wc.Annotations[v1alpha1.SourceCommitAnnotation] // nothing of it changed
	}
	key := client.ObjectKey{Namespace: s.opts.Namespace, Name: c.Name}
	want := &v1alpha1.WorkerCluster{}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		// The agent's reports write the status meanwhile: start from what is stored.
		exists := true
		if err := s.hub.opts.Client.Get(ctx, key, want); apierrors.IsNotFound(err) {
			exists, want = false, &v1alpha1.WorkerCluster{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
		} else if err != nil {
			return err
		}
		want.Labels = mergeMaps(want.Labels, map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.WorkerClusterLabel: identity})
		want.Annotations = mergeMaps(want.Annotations, map[string]string{v1alpha1.SourceCommitAnnotation: commit, v1alpha1.SourceDigestAnnotation: digest})
		delete(want.Annotations, v1alpha1.InvalidAnnotation)
		delete(want.Annotations, v1alpha1.DecommissionAnnotation)
		delete(want.Annotations, v1alpha1.HubErrorAnnotation)
		want.Spec = *c.Object.Spec.DeepCopy()
		want.Spec.EnrollmentTokenHash = tok.String()
		if !exists {
			return s.hub.opts.Client.Create(ctx, want)
		}
		return s.hub.opts.Client.Update(ctx, want)
	})
	if err != nil {
		return fmt.Errorf("writing WorkerCluster %s/%s: %w", key.Namespace, key.Name, err)
	}

	ds := &protocol.DesiredState{Generation: want.Generation, Hash: res.Hash}
	for _, o := range res.Objects {
		raw, err := json.Marshal(o.Object)
		if err != nil {
			return err
		}
		ds.Objects = append(ds.Objects, raw)
	}
	s.hub.setDesired(identity, ds)
	s.hub.setKey(identity, key)
	if err := s.patchStatus(ctx, c.Name, func(wc *v1alpha1.WorkerCluster) { wc.Status.DesiredHash = res.Hash }); err != nil {
		return err
	}
	if s.hub.tunnel != nil {
		if _, err := s.hub.tunnel.Push(ctx, identity); err != nil {
			s.log.Warn("pushing the desired state", "cluster", c.Name, "error", err)
		}
	}
	return s.refresh(ctx, c.Name)
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

func (s *Source) annotate(ctx context.Context, wc *v1alpha1.WorkerCluster, ann map[string]string) error {
	patch := client.MergeFrom(wc.DeepCopy())
	wc.Annotations = mergeMaps(wc.Annotations, ann)
	if err := s.hub.opts.Client.Patch(ctx, wc, patch); err != nil {
		return fmt.Errorf("annotating WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	return s.refresh(ctx, wc.Name)
}

func (s *Source) patchStatus(ctx context.Context, name string, mutate func(*v1alpha1.WorkerCluster)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var wc v1alpha1.WorkerCluster
		if err := s.hub.opts.Client.Get(ctx, client.ObjectKey{Namespace: s.opts.Namespace, Name: name}, &wc); err != nil {
			return err
		}
		patch := client.MergeFromWithOptions(wc.DeepCopy(), client.MergeFromWithOptimisticLock{})
		mutate(&wc)
		return s.hub.opts.Client.Status().Patch(ctx, &wc, patch)
	})
}

// refresh sums a WorkerCluster's conditions up, finishes a decommission the agent
// completed, and publishes the cluster's commit status.
func (s *Source) refresh(ctx context.Context, name string) error {
	// A sync and an agent's report may refresh one cluster at once. Were they to
	// interleave, the one that read the older WorkerCluster could post and remember last,
	// and the fleet's summary would wait forever on a state long gone: one at a time, the
	// last refresh reads the newest state.
	unlock := s.refreshLocks.lock(name)
	defer unlock()
	var wc v1alpha1.WorkerCluster
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := s.hub.opts.Client.Get(ctx, client.ObjectKey{Namespace: s.opts.Namespace, Name: name}, &wc); err != nil {
			return err
		}
		patch := client.MergeFromWithOptions(wc.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if !summarize(&wc) {
			return nil
		}
		return s.hub.opts.Client.Status().Patch(ctx, &wc, patch)
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if wc.Annotations[v1alpha1.DecommissionAnnotation] != "" {
		return s.maybeFinishDecommission(ctx, &wc)
	}
	st := commitStatus(s.context(name), &wc)
	if why := wc.Annotations[v1alpha1.InvalidAnnotation]; why != "" {
		st.State, st.Description = status.Failure, why
	}
	s.post(ctx, wc.Annotations[v1alpha1.SourceCommitAnnotation], st)
	s.mu.Lock()
	s.states[name] = st.State
	s.mu.Unlock()
	// Posted whether or not this cluster's state changed: the summary is derived from
	// every cluster's current state on the current head, and the publisher posts it only
	// when it reads differently from what the commit shows.
	s.publishFleet(ctx)
	return nil
}

// keyedLocks serializes work per key over a fixed set of mutexes: two keys may share
// one, which only costs a little waiting.
type keyedLocks [64]sync.Mutex

func (l *keyedLocks) lock(key string) (unlock func()) {
	h := fnv.New32a()
	h.Write([]byte(key))
	m := &l[h.Sum32()%uint32(len(l))]
	m.Lock()
	return m.Unlock
}

// decommissionHash is the desired "state" of a cluster leaving the fleet.
func decommissionHash(wc *v1alpha1.WorkerCluster) string { return "decommission:" + string(wc.UID) }

// decommission asks the agent to prune what it owns; the WorkerCluster goes once it
// reports done, or when the agent does not come back within StaleAfter. Under the
// Keep policy nothing on the worker changes: the agent is only revoked.
func (s *Source) decommission(ctx context.Context, wc *v1alpha1.WorkerCluster, head string, policy v1alpha1.DecommissionPolicy) error {
	identity := wc.Labels[v1alpha1.WorkerClusterLabel]
	s.log.Info("decommissioning a cluster removed from the fleet", "cluster", wc.Name, "policy", policy)
	if policy == v1alpha1.DecommissionKeep {
		wc.Annotations = mergeMaps(wc.Annotations, map[string]string{v1alpha1.SourceCommitAnnotation: head})
		return s.finishDecommission(ctx, wc, "decommissioned: the worker keeps its objects (decommission: Keep); the agent is revoked")
	}
	s.hub.setDesired(identity, &protocol.DesiredState{Generation: wc.Generation, Hash: decommissionHash(wc), Decommission: true})
	if err := s.patchStatus(ctx, wc.Name, func(w *v1alpha1.WorkerCluster) { w.Status.DesiredHash = decommissionHash(wc) }); err != nil {
		return err
	}
	patch := client.MergeFrom(wc.DeepCopy())
	wc.Annotations = mergeMaps(wc.Annotations, map[string]string{v1alpha1.DecommissionAnnotation: "prune", v1alpha1.SourceCommitAnnotation: head})
	if err := s.hub.opts.Client.Patch(ctx, wc, patch); err != nil {
		return err
	}
	s.post(ctx, head, status.Status{Context: s.context(wc.Name), State: status.Pending, Description: "decommissioning: waiting for the agent to prune what it owns"})
	if s.hub.tunnel != nil {
		if _, err := s.hub.tunnel.Push(ctx, identity); err != nil {
			s.log.Warn("pushing the decommission", "cluster", wc.Name, "error", err)
		}
	}
	// The agent may be redialling (a hub restart, a network blip), or be cut off for
	// not reading what it was sent: it gets the decommission when it connects, and the
	// WorkerCluster goes without pruning only if no agent is connected for StaleAfter.
	s.finishIfAgentStaysAway(context.WithoutCancel(ctx), client.ObjectKeyFromObject(wc), identity)
	return nil
}

// finishIfAgentStaysAway finishes a decommission without pruning once StaleAfter has
// passed without the agent reporting it done, unless the agent is connected then: it is
// still pruning, and is given another StaleAfter.
func (s *Source) finishIfAgentStaysAway(ctx context.Context, key client.ObjectKey, identity string) {
	time.AfterFunc(s.hub.opts.StaleAfter, func() {
		var cur v1alpha1.WorkerCluster
		if err := s.hub.opts.Client.Get(ctx, key, &cur); err != nil || cur.Annotations[v1alpha1.DecommissionAnnotation] == "" || cur.Status.AppliedHash == decommissionHash(&cur) {
			return
		}
		if s.hub.tunnel != nil && s.hub.tunnel.Connected(identity) {
			s.finishIfAgentStaysAway(ctx, key, identity)
			return
		}
		if err := s.finishDecommission(ctx, &cur, "removed; the agent did not connect, so nothing was pruned on the worker"); err != nil {
			s.log.Error("finishing a decommission", "cluster", key.Name, "error", err)
		}
	})
}

func (s *Source) maybeFinishDecommission(ctx context.Context, wc *v1alpha1.WorkerCluster) error {
	if wc.Status.AppliedHash != decommissionHash(wc) {
		return nil
	}
	return s.finishDecommission(ctx, wc, "decommissioned: the agent pruned what it owned")
}

// finishDecommission revokes the agent's credential and deletes the WorkerCluster.
func (s *Source) finishDecommission(ctx context.Context, wc *v1alpha1.WorkerCluster, msg string) error {
	identity := wc.Labels[v1alpha1.WorkerClusterLabel]
	if err := tunnel.Revoke(ctx, s.hub.opts.Client, wc); err != nil {
		return fmt.Errorf("revoking the credential of %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	if s.hub.tunnel != nil {
		s.hub.tunnel.Disconnect(identity)
	}
	if err := s.hub.opts.Client.Delete(ctx, wc); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting WorkerCluster %s/%s: %w", wc.Namespace, wc.Name, err)
	}
	s.hub.setDesired(identity, nil)
	s.log.Info("cluster decommissioned", "cluster", wc.Name)
	s.post(ctx, wc.Annotations[v1alpha1.SourceCommitAnnotation], status.Status{Context: s.context(wc.Name), State: status.Success, Description: msg})
	s.mu.Lock()
	delete(s.states, wc.Name)
	s.mu.Unlock()
	s.publishFleet(ctx)
	return nil
}

// publishFleet posts the fleet's summary on the head.
func (s *Source) publishFleet(ctx context.Context) {
	s.mu.Lock()
	head, fleetErr, waiting := s.head, s.fleetError, len(s.waitingRemovals)
	total, ready := len(s.states), 0
	for _, st := range s.states {
		if st == status.Success {
			ready++
		}
	}
	invalid := make([]string, 0, len(s.invalid))
	for _, why := range s.invalid {
		invalid = append(invalid, why)
	}
	s.mu.Unlock()
	if head == "" {
		return
	}
	slices.Sort(invalid)
	st := status.Status{Context: s.context("fleet")}
	switch {
	case fleetErr != "" && waiting > 0:
		// The count leads: the error may be long, and a status description is cut.
		st.State, st.Description = status.Failure, fmt.Sprintf("%d %s until the fleet validates: %s", waiting, plural(waiting, "removal waits", "removals wait"), fleetErr)
	case fleetErr != "":
		st.State, st.Description = status.Failure, fleetErr
	case len(invalid) > 0:
		st.State, st.Description = status.Failure, fmt.Sprintf("%d invalid cluster(s): %s", len(invalid), invalid[0])
	case ready == total:
		st.State, st.Description = status.Success, fmt.Sprintf("%d of %d clusters ready", ready, total)
	default:
		st.State, st.Description = status.Pending, fmt.Sprintf("%d of %d clusters ready", ready, total)
	}
	s.post(ctx, head, st)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func (s *Source) post(ctx context.Context, commit string, st status.Status) {
	if s.publisher == nil || commit == "" {
		return
	}
	if _, err := s.publisher.Publish(ctx, commit, st); err != nil {
		s.log.Error("posting a commit status", "context", st.Context, "commit", commit, "error", err)
	}
}

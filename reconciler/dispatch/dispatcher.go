package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/keylock"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// FieldManager owns what dispatch writes on the hub cluster.
const FieldManager = "flotilla-hub-dispatch"

// DefaultKueueNamespace is where the hub's Kueue runs and reads kubeconfig Secrets.
const DefaultKueueNamespace = "kueue-system"

// Tokens issues and checks the API proxy's bearer tokens (reconciler/tunnel's Server).
type Tokens interface {
	IssueProxyToken(ctx context.Context, wc *v1alpha1.WorkerCluster) (secrets.Token, error)
	ProxyTokenValid(ctx context.Context, wc *v1alpha1.WorkerCluster, token string) (bool, error)
}

// Options configure a Dispatcher.
type Options struct {
	// Client writes the hub's Kueue objects.
	Client client.Client
	Tokens Tokens
	// ProxyURL is the API proxy as Kueue reaches it: https://host:port.
	ProxyURL string
	// ProxyPath is the server URL of an identity's worker behind ProxyURL.
	ProxyPath func(base, identity string) string
	// Trust is the CA bundle that verifies the proxy's certificate.
	Trust func() []byte
	// KueueNamespace is the hub Kueue's namespace. Default kueue-system.
	KueueNamespace string
	// Status records placements and Kueue's judgements.
	Status *conditions.Writer
	Log    *slog.Logger
}

// Dispatcher keeps the hub's Kueue objects of every tenant.
type Dispatcher struct {
	opts Options

	mu       sync.Mutex
	appliers map[string]*apply.Applier // by tenant
	// workers is, by tenant, the identities of its WorkerClusters at its last Sync.
	// What the maps below hold of an identity goes with it (remember).
	workers map[string]map[string]bool
	keys    map[string]client.ObjectKey // WorkerCluster by identity
	// judged is the resourceVersion of the newest MultiKueueCluster whose judgement was
	// recorded, by identity; judging takes one judgement of an identity at a time.
	judged  map[string]string
	judging keylock.Locks[string]
	// redialled is, by identity, the agent's connection that Kueue was last asked to
	// try the worker again for (Redial).
	redialled map[string]string
}

// New checks the options.
func New(opts Options) (*Dispatcher, error) {
	if opts.Client == nil || opts.Tokens == nil || opts.ProxyURL == "" || opts.ProxyPath == nil || opts.Trust == nil || opts.Status == nil {
		return nil, errors.New("dispatch: a client, tokens, the proxy's URL and paths, its trust bundle and a status writer are required")
	}
	if opts.KueueNamespace == "" {
		opts.KueueNamespace = DefaultKueueNamespace
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return newDispatcher(opts), nil
}

func newDispatcher(opts Options) *Dispatcher {
	return &Dispatcher{opts: opts, appliers: map[string]*apply.Applier{}, workers: map[string]map[string]bool{}, keys: map[string]client.ObjectKey{},
		judged: map[string]string{}, redialled: map[string]string{}}
}

// WorkerOf is the dispatch view of a WorkerCluster.
func WorkerOf(wc *v1alpha1.WorkerCluster, pool string, quota corev1.ResourceList, draining bool) Worker {
	w := Worker{Key: wc.Namespace + "/" + wc.Name, Identity: wc.Labels[v1alpha1.WorkerClusterLabel], Pool: pool,
		Cordoned: wc.Spec.Cordoned || draining, Draining: draining, Quota: quota}
	if e := wc.Status.Enrollment; e != nil {
		w.Registered = e.RedeemedAt.Time
	}
	return w
}

// Report is what the tenant's fleet asks of the hub's Kueue that the hub refuses it:
// nothing a retry changes, only a change of the fleet, of the hub's configuration or of
// what holds a name on the hub. The fleet's status shows it.
type Report struct {
	// Refused are the dispatch pools refused, by pool: what holds their names.
	Refused map[string]*PoolRefusedError
	// NotGiven are the workload namespaces of fleet.yaml that the hub's configuration
	// does not give the tenant: they get no LocalQueue of it.
	NotGiven []string
	// Taken are the workload namespaces given to the tenant that exist on the hub
	// labelled for another tenant, or for none (""), by namespace: they get no
	// LocalQueue of it until they are labelled as the tenant's.
	Taken map[string]string
}

// Sync brings the tenant's hub objects to what t says and records where each of its
// registered workers stands. wcs are the tenant's WorkerClusters by identity. The
// report is nil when Sync failed before it could tell what it refuses.
func (d *Dispatcher) Sync(ctx context.Context, t Tenant, wcs map[string]*v1alpha1.WorkerCluster) (*Report, error) {
	ap, err := d.applier(t.Name)
	if err != nil {
		return nil, err
	}
	view, rep, err := d.view(ctx, t)
	if err != nil {
		return nil, fmt.Errorf("tenant %s: %w", t.Name, err)
	}
	return rep, d.sync(ctx, ap, t, view, wcs)
}

// sync applies the layout of t on view.
func (d *Dispatcher) sync(ctx context.Context, ap *apply.Applier, t Tenant, view HubView, wcs map[string]*v1alpha1.WorkerCluster) error {
	layout := Build(t, view)
	var objs []*unstructured.Unstructured
	var errs []error
	for _, w := range layout.Members {
		sec, err := d.kubeConfigSecret(ctx, t.Name, wcs[w.Identity])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		objs = append(objs, sec)
	}
	objs = append(objs, layout.Objects...)
	ds := protocol.DesiredState{}
	for _, o := range objs {
		raw, err := json.Marshal(o.Object)
		if err != nil {
			return err
		}
		ds.Objects = append(ds.Objects, raw)
	}
	if len(errs) > 0 {
		// A Secret that could not be written is still asked for: without it in the
		// desired state the applier would prune the one Kueue uses now.
		return fmt.Errorf("tenant %s: %w", t.Name, errors.Join(errs...))
	}
	res := ap.Apply(ctx, ds)
	applied := res.Complete()
	for _, r := range res.Results {
		if r.Action == protocol.ActionRefused || r.Action == protocol.ActionFailed {
			errs = append(errs, fmt.Errorf("%s %s/%s: %s", r.Kind, r.Namespace, r.Name, r.Message))
		}
	}
	if res.Error != "" {
		errs = append(errs, errors.New(res.Error))
	}
	fresh := d.remember(t.Name, wcs)
	pools := make(map[string]string, len(t.Workers))
	for _, w := range t.Workers {
		pools[w.Identity] = w.Pool
	}
	for id, placement := range layout.Placement {
		wc := wcs[id]
		if wc == nil {
			continue
		}
		pool := pools[id]
		withdrawn := layout.Withdrawn[id]
		if !applied {
			// The ClusterQueue may not have taken the change: claim no more than before.
			withdrawn = withdrawn && wc.Status.Dispatch != nil && wc.Status.Dispatch.Withdrawn
		}
		if cur := wc.Status.Dispatch; cur != nil && cur.Pool == pool && cur.Placement == placement && cur.Withdrawn == withdrawn {
			continue
		}
		// Recorded after the apply: Withdrawn says the hub's ClusterQueue already
		// stopped counting the cluster's quota.
		if _, err := d.opts.Status.Record(ctx, client.ObjectKeyFromObject(wc), conditions.Placed{Pool: pool, Placement: placement, Withdrawn: withdrawn}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	// Kueue may have judged a MultiKueueCluster before this Sync knew its identity: a
	// new member's, one's back in the tenant, or any at the first Sync after a start,
	// when the watch of MultiKueueClusters listed them all before. Only those are read.
	for _, w := range layout.Members {
		if cur := wcs[w.Identity].Status.Dispatch; !fresh[w.Identity] && cur != nil && cur.Active != nil {
			continue
		}
		var mc kueue.MultiKueueCluster
		if err := d.opts.Client.Get(ctx, client.ObjectKey{Name: w.Identity}, &mc); err == nil {
			if err := d.Judged(ctx, &mc); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("tenant %s: %w", t.Name, errors.Join(errs...))
	}
	return nil
}

// remember records the tenant's WorkerClusters, wcs by identity, and returns those it
// did not know. It forgets what it held of the identities the tenant no longer has:
// a fleet that enrols and removes clusters for years would otherwise hold some of each
// in the hub's memory until the hub restarted.
func (d *Dispatcher) remember(tenant string, wcs map[string]*v1alpha1.WorkerCluster) (fresh map[string]bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id := range d.workers[tenant] {
		if _, ok := wcs[id]; !ok {
			delete(d.keys, id)
			delete(d.judged, id)
		}
	}
	fresh = map[string]bool{}
	ids := make(map[string]bool, len(wcs))
	for id, wc := range wcs {
		if _, ok := d.keys[id]; !ok {
			fresh[id] = true
		}
		d.keys[id] = client.ObjectKeyFromObject(wc)
		ids[id] = true
	}
	d.workers[tenant] = ids
	// The redials go with the keys: those of the identities gone, and those Redial
	// recorded for a WorkerCluster that no tenant's Sync had handed over.
	for id := range d.redialled {
		if _, ok := d.keys[id]; !ok {
			delete(d.redialled, id)
		}
	}
	return fresh
}

// applier is the tenant's applier.
func (d *Dispatcher) applier(tenant string) (*apply.Applier, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur := d.appliers[tenant]; cur != nil {
		return cur, nil
	}
	ap, err := apply.New(apply.Options{Client: d.opts.Client, Identity: tenant, OwnerLabel: v1alpha1.TenantLabel, FieldManager: FieldManager,
		PruneKinds: []schema.GroupVersionKind{
			corev1.SchemeGroupVersion.WithKind("Secret"),
			kueue.GroupVersion.WithKind("MultiKueueConfig"),
			kueue.GroupVersion.WithKind("MultiKueueCluster"),
		},
		// The only Secrets the hub owns are the kubeconfigs in Kueue's namespace.
		PruneNamespaces: map[schema.GroupKind]string{{Kind: "Secret"}: d.opts.KueueNamespace},
		Log:             d.opts.Log.With("tenant", tenant)})
	if err != nil {
		return nil, err
	}
	d.appliers[tenant] = ap
	return ap, nil
}

// view reads what Build needs of the hub: the workload namespaces the tenant queues in,
// and the names of its pools and what holds them; and reports what it refuses.
func (d *Dispatcher) view(ctx context.Context, t Tenant) (HubView, *Report, error) {
	rep := &Report{Refused: map[string]*PoolRefusedError{}, Taken: map[string]string{}}
	view := HubView{Pools: map[string]PoolView{}}
	if !t.Enabled {
		return view, rep, nil // it asks for nothing on the hub
	}
	var err error
	if view.Namespaces, err = d.hubNamespaces(ctx, t, rep); err != nil {
		return view, nil, err
	}
	for _, pool := range slices.Sorted(maps.Keys(poolsOf(t))) {
		pv, err := d.viewPool(ctx, t.Name, pool)
		if err != nil {
			return view, nil, fmt.Errorf("dispatch pool %s: %w", pool, err)
		}
		view.Pools[pool] = pv
		if len(pv.Held) > 0 {
			rep.Refused[pool] = &PoolRefusedError{Pool: pool, Held: pv.Held}
			for _, h := range pv.Held {
				d.opts.Log.Warn("a dispatch pool's name is not the tenant's on the hub: the pool is refused, its ClusterQueue holds",
					"tenant", t.Name, "pool", pool, "kind", h.Kind, "name", h.Name, "owner", h.Owner, "heldBy", h.By)
			}
		}
	}
	return view, rep, nil
}

// hubNamespaces says which of the tenant's workload namespaces it queues in on the
// hub: those the hub's configuration gives it (HubNamespaces) that are its own there,
// or do not exist yet (it creates them as its own). What it leaves out goes to rep.
func (d *Dispatcher) hubNamespaces(ctx context.Context, t Tenant, rep *Report) (map[string]bool, error) {
	mine := map[string]bool{}
	for _, name := range t.WorkloadNamespaces {
		if !slices.Contains(t.HubNamespaces, name) {
			rep.NotGiven = append(rep.NotGiven, name)
			d.opts.Log.Warn("fleet.yaml names a workload namespace that the hub's configuration does not give the tenant: no LocalQueue of the tenant is placed in it",
				"tenant", t.Name, "namespace", name, "fix", "add it to the workload namespaces of the tenant's source in the hub's configuration")
			continue
		}
		var ns corev1.Namespace
		err := d.opts.Client.Get(ctx, client.ObjectKey{Name: name}, &ns)
		switch {
		case apierrors.IsNotFound(err):
			mine[name] = true
		case err != nil:
			return nil, fmt.Errorf("reading hub namespace %s: %w", name, err)
		case ns.Labels[v1alpha1.TenantLabel] == t.Name:
			mine[name] = true
		default:
			rep.Taken[name] = ns.Labels[v1alpha1.TenantLabel]
			d.opts.Log.Warn("a workload namespace on the hub is not the tenant's: no LocalQueue of the tenant is placed in it",
				"tenant", t.Name, "namespace", name, "owner", ns.Labels[v1alpha1.TenantLabel],
				"fix", fmt.Sprintf("label it %s=%s if it is this tenant's", v1alpha1.TenantLabel, t.Name))
		}
	}
	return mine, nil
}

// kubeConfigSecret is the kubeconfig Secret of wc's MultiKueueCluster. The token in
// the Secret Kueue reads now is kept while it is valid; a new one is issued otherwise.
func (d *Dispatcher) kubeConfigSecret(ctx context.Context, tenant string, wc *v1alpha1.WorkerCluster) (*unstructured.Unstructured, error) {
	identity := wc.Labels[v1alpha1.WorkerClusterLabel]
	name := KubeConfigSecretName(identity)
	server := d.opts.ProxyPath(d.opts.ProxyURL, identity)
	trust := d.opts.Trust()
	var cur corev1.Secret
	err := d.opts.Client.Get(ctx, client.ObjectKey{Namespace: d.opts.KueueNamespace, Name: name}, &cur)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading Secret %s/%s: %w", d.opts.KueueNamespace, name, err)
	}
	token, _, _ := tokenOf(cur.Data[KubeConfigKey])
	valid := false
	if token != "" {
		if valid, err = d.opts.Tokens.ProxyTokenValid(ctx, wc, token); err != nil {
			return nil, err
		}
	}
	if !valid {
		tok, err := d.opts.Tokens.IssueProxyToken(ctx, wc)
		if err != nil {
			return nil, err
		}
		token = tok.Reveal()
	}
	data := cur.Data[KubeConfigKey]
	if t, ca, srv := tokenOf(data); t != token || !bytes.Equal(ca, trust) || srv != server {
		if data, err = kubeConfig(server, trust, token); err != nil {
			return nil, err
		}
	}
	sec := &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: d.opts.KueueNamespace, Name: name}, Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{KubeConfigKey: data}}
	u := owned(tenant, sec)
	l := u.GetLabels()
	l[v1alpha1.WorkerClusterLabel] = identity
	u.SetLabels(l)
	return u, nil
}

// PlacedOn counts the workloads in the hub's namespaces that Kueue placed on the
// identity's worker and that have not finished: what a removed cluster's drain waits
// for.
func (d *Dispatcher) PlacedOn(ctx context.Context, namespaces []string, identity string) (int, error) {
	n := 0
	for _, ns := range namespaces {
		var list kueue.WorkloadList
		if err := d.opts.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return 0, fmt.Errorf("listing the workloads of hub namespace %s: %w", ns, err)
		}
		for i := range list.Items {
			w := &list.Items[i]
			if w.Status.ClusterName == nil || *w.Status.ClusterName != identity || meta.IsStatusConditionTrue(w.Status.Conditions, kueue.WorkloadFinished) {
				continue
			}
			n++
		}
	}
	return n, nil
}

// judgedRetry is how often a judgement of Kueue's that the hub cluster refused to
// record is tried again.
const judgedRetry = 10 * time.Second

// Judged carries Kueue's judgement of a MultiKueueCluster over to its WorkerCluster.
// Call it for every change of a MultiKueueCluster the hub sees, with a context that
// lives as long as the hub: Kueue says a judgement once, so one the hub cluster refused
// is tried again (judgedRetry) until stored or ctx ends. A MultiKueueCluster older than
// one already judged is passed over: Sync's read of it can reach here after the watch
// brought Kueue's next judgement, which nothing would then bring back.
func (d *Dispatcher) Judged(ctx context.Context, mc *kueue.MultiKueueCluster) error {
	identity := mc.Labels[v1alpha1.WorkerClusterLabel]
	if mc.Labels[v1alpha1.ManagedByLabel] != v1alpha1.ManagedByValue {
		return nil
	}
	unlock := d.judging.Lock(identity)
	defer unlock()
	active := meta.FindStatusCondition(mc.Status.Conditions, kueue.MultiKueueClusterActive)
	d.mu.Lock()
	key, ok := d.keys[identity]
	stale := ok && olderVersion(mc.ResourceVersion, d.judged[identity])
	if ok && !stale {
		d.judged[identity] = mc.ResourceVersion
	}
	d.mu.Unlock()
	if !ok || stale {
		return nil
	}
	var judged *v1alpha1.KueueCondition
	if active != nil {
		judged = &v1alpha1.KueueCondition{Status: active.Status, Reason: active.Reason, Message: active.Message, LastTransitionTime: active.LastTransitionTime}
	}
	_, err := d.opts.Status.RecordOrRetry(ctx, ctx, key, judgedRetry, conditions.KueueJudged{Active: judged})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Redial has the hub's Kueue try wc's worker again at once when its agent connected
// since Kueue judged the worker unreachable (redialFor). Kueue retries a worker it
// cannot reach after a wait that doubles up to 5 min 20 s: without this, a worker whose
// agent was away for minutes, or whose hub was, would wait about as long again after
// their return before taking work. It writes the connection's start on the
// MultiKueueCluster (AgentConnectedAnnotation), once per connection; a change of the
// object makes Kueue reconcile it.
func (d *Dispatcher) Redial(ctx context.Context, wc *v1alpha1.WorkerCluster) error {
	since, ok := redialFor(wc)
	if !ok {
		return nil
	}
	identity := wc.Labels[v1alpha1.WorkerClusterLabel]
	d.mu.Lock()
	done := d.redialled[identity] == since
	d.mu.Unlock()
	if done {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.AgentConnectedAnnotation: since}}})
	if err != nil {
		return err
	}
	mc := &kueue.MultiKueueCluster{ObjectMeta: metav1.ObjectMeta{Name: identity}}
	if err := d.opts.Client.Patch(ctx, mc, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldManager)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // not a member (yet): Kueue tries a new one at once
		}
		return fmt.Errorf("asking Kueue to try worker %s again: MultiKueueCluster %s: %w", identity, identity, err)
	}
	d.mu.Lock()
	d.redialled[identity] = since
	d.mu.Unlock()
	d.opts.Log.Info("the agent is back: asked the hub's Kueue to try the worker again now", "identity", identity, "connectedSince", since, "kueueSays", wc.Status.Dispatch.Active.Message)
	return nil
}

// redialFor says whether Kueue should try wc's worker again now, and for which of its
// agent's connections (its start, RFC 3339): Kueue judges the worker unreachable, and
// the agent connected since, so what Kueue failed on is gone. An agent that was
// connected when Kueue judged is not what Kueue failed on, and its retries are left be;
// so is a judgement with no time, as a hub before this one recorded it.
func redialFor(wc *v1alpha1.WorkerCluster) (connection string, ok bool) {
	s := wc.Status.Dispatch
	if s == nil || (s.Placement != v1alpha1.PlacementMember && s.Placement != v1alpha1.PlacementDraining) {
		return "", false
	}
	a := s.Active
	if a == nil || a.Status == metav1.ConditionTrue || a.LastTransitionTime.IsZero() {
		return "", false
	}
	c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionConnected)
	if c == nil || c.Status != metav1.ConditionTrue || c.LastTransitionTime.Before(&a.LastTransitionTime) {
		return "", false
	}
	return c.LastTransitionTime.UTC().Format(time.RFC3339), true
}

// olderVersion reports whether resourceVersion a is older than b. The API server's
// versions of one resource are ordered integers, as Kubernetes promises since 1.35
// (KEP-5504); versions that are not, as another storage may give, are taken as not older.
func olderVersion(a, b string) bool {
	c, err := resourceversion.CompareResourceVersion(a, b)
	return err == nil && c < 0
}

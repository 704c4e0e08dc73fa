package dispatch

import (
	"context"
	"crypto/tls"
	"fmt"
	"log"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"filippo.io/age"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent"
	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/agent/inventory"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/agent/proxy"
	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitnotes"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	fhub "github.com/flotilla-gitops/flotilla/reconciler/hub"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/secrets/servingca"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/dispatchtest"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/heldpatch"
	"github.com/flotilla-gitops/flotilla/test/kueuetest"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
	"github.com/flotilla-gitops/flotilla/test/sopstest"
)

const (
	// agentNamespace is the agents' namespace on each worker, as the chart installs it.
	agentNamespace = "flotilla-system"
	// proxyCANamespace holds the API proxy's CA Secret on the hub.
	proxyCANamespace = "flotilla-system"
	// workerLostTimeout is the hub Kueue's: short, so that the tunnel-blip test can run
	// a job admitted longer ago than it within the package's time budget. Every test
	// runs under it, which makes each of them stricter: a watch to a worker that ended
	// would make Kueue v0.17.0 requeue their running jobs (kueue#12999).
	workerLostTimeout = 20 * time.Second
	// resumeWindow is the API proxy's: how long a watch waits for its agent to redial.
	// Short, so that the outage test's agent is away past it within the package's time
	// budget; the blip test's agent is back well within it.
	resumeWindow = 15 * time.Second
)

// fast liveness, so that a cut tunnel is noticed within a test's patience.
var fast = protocol.Liveness{Interval: 200 * time.Millisecond, Timeout: time.Second}

// workerSpec is one worker cluster of the fleet.
type workerSpec struct {
	name, region, residency string
	// quota is the cluster.yaml quota, which the worker's ClusterQueue gets.
	quota map[string]string
}

// fleetWorkers are the fleet's two clusters: one per residency, so one per pool.
var fleetWorkers = []workerSpec{
	{name: "gpu-eu", region: "europe-west4", residency: "eu", quota: map[string]string{"cpu": "8", "memory": "32Gi"}},
	{name: "gpu-us", region: "us-central1", residency: "us", quota: map[string]string{"cpu": "6", "memory": "24Gi"}},
}

// worker is one worker cluster as the world runs it.
type worker struct {
	workerSpec
	identity string
	plane    *controlplane.ControlPlane
	token    secrets.Token
	// agentConfig reaches the worker as the agent's ServiceAccount.
	agentConfig *rest.Config
	kueue       *kueuetest.Manager

	mu        sync.Mutex
	stopAgent func()
}

// worldOptions say what sets the worlds of one test process apart.
type worldOptions struct {
	// tenant names the fleet, and workloads its workload namespace, so that two worlds
	// of one test process never share an object.
	tenant, workloads string
	// staleAfter is the hub's StaleAfter; zero keeps the hub's default.
	staleAfter time.Duration
	// relay makes every replica of the hub serve the API proxy, relaying to the
	// leader's what it holds no tunnel for.
	relay bool
	// onePool puts both workers in one residency, so one dispatch pool.
	onePool bool
}

// world is a hub and its two workers, with real Kueue managers on all three planes,
// following a fleet repository on a real git server.
type world struct {
	tb         testing.TB
	tenant     string
	ns         string // the tenant's namespace on the hub
	staleAfter time.Duration
	relay      bool
	// workloads is where jobs are submitted, on the hub as on the workers. On the hub it
	// belongs to the tenant, so each world has its own.
	workloads string
	hub       *controlplane.ControlPlane
	workers   []*worker
	logs      *logtest.Buffer

	dir string // the fleet checkout the test edits
	// fleetYAML is the fleet.yaml of the first commit, which a test may extend.
	fleetYAML string
	ids       *secrets.Identities
	repo      *gitserver.Repo
	notes     *gitnotes.Backend
	src       *fhub.Source

	// dispatcher is the hub's, which a test may hand a judgement of its own.
	dispatcher *dispatch.Dispatcher
	// refusing, when set, answers the hub's status patches it returns an error for in
	// place of the hub cluster.
	refusing atomic.Pointer[func(client.Object) error]

	// The leading replica's parts.
	tun       *tunnel.Server
	authority *servingca.Authority
	// The Services in front of the replicas: the agents dial tunnelAddr, Kueue proxyURL.
	tunnelSvc, proxySvc, leaderProxySvc *dispatchtest.Service
	tunnelAddr                          string
	proxyURL                            string
	// statuses is where every replica posts commit statuses: the forge they share.
	statuses commitstatus.Backend
	posts    *countedStatuses
	// replicas are the hub's, in the order they started; replicas[0] led first.
	replicas []*replica
	hubKueue *kueuetest.Manager
	// hubKueueLog is the hub Kueue manager's latest output.
	hubKueueLog *logtest.Buffer
}

// newWorld starts everything for tb, which stops it all when it ends. The worlds of one
// test process (the tests' and a benchmark's) run one after another, on the same
// planes, each with its own tenant.
func newWorld(tb testing.TB, opts worldOptions) *world {
	tb.Helper()
	ctx := tb.Context()
	w := &world{tb: tb, tenant: opts.tenant, ns: "tenant-" + opts.tenant, workloads: opts.workloads, staleAfter: opts.staleAfter, relay: opts.relay, hub: planes[0], logs: &logtest.Buffer{Max: 256 << 10}}
	for i, s := range fleetWorkers {
		if opts.onePool {
			s.residency = fleetWorkers[0].residency
		}
		w.workers = append(w.workers, &worker{workerSpec: s, identity: fleet.Identity(opts.tenant, s.name), plane: planes[1+i]})
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("last log of the hub and the agents:\n%s", w.logs.Last(64<<10))
		}
	})
	// The git server logs every request through the standard logger: into the world's
	// log, which a failing test shows, rather than between the test's lines.
	log.SetOutput(w.logs)
	tb.Cleanup(func() { log.SetOutput(os.Stderr) })
	// Registered before anything starts, so that it runs once everything has stopped.
	tb.Cleanup(w.removeObjects)
	w.startKueue()
	for _, wk := range w.workers {
		cfg, err := dispatchtest.InstallAgentRBAC(ctx, wk.plane.Client, wk.plane.Config, agentNamespace, nil)
		if err != nil {
			tb.Fatal(err)
		}
		wk.agentConfig = cfg
	}
	w.createFleet()
	w.startHub()
	for _, wk := range w.workers {
		w.startAgent(wk)
	}
	return w
}

// removeObjects deletes what the world's agents applied on the workers and what its
// hub applied for the tenant, so that another world of the same test process (a
// benchmark's after the tests') starts from clean planes: its agents would rightly
// refuse to adopt the preset's cluster-scoped objects of another identity.
func (w *world) removeObjects() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	deleteLabelled := func(c client.Client, kinds []schema.GroupVersionKind, sel client.MatchingLabels) {
		for _, gvk := range kinds {
			if gvk.Kind == "Namespace" {
				continue // workload namespaces are never pruned, and other worlds share them
			}
			var list unstructured.UnstructuredList
			list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
			if err := c.List(ctx, &list, sel); err != nil {
				continue
			}
			for i := range list.Items {
				o := &list.Items[i]
				_ = c.Delete(ctx, o)
				// Kueue's managers, which would release their finalizers, have stopped.
				if len(o.GetFinalizers()) > 0 {
					_ = c.Patch(ctx, o, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
				}
			}
		}
	}
	for _, wk := range w.workers {
		deleteLabelled(wk.plane.Client, apply.PruneKinds(), client.MatchingLabels{v1alpha1.WorkerClusterLabel: wk.identity})
	}
	hubKinds := []schema.GroupVersionKind{corev1.SchemeGroupVersion.WithKind("Secret")}
	for _, k := range []string{"MultiKueueCluster", "MultiKueueConfig", "AdmissionCheck", "LocalQueue", "ClusterQueue", "ResourceFlavor"} {
		hubKinds = append(hubKinds, kueue.GroupVersion.WithKind(k))
	}
	deleteLabelled(w.hub.Client, hubKinds, client.MatchingLabels{v1alpha1.TenantLabel: w.tenant})
	// Kueue's Workloads outlive their deleted Jobs here: no garbage collector runs on a
	// test plane. A Workload left admitted on a worker would count against the next
	// world's ClusterQueue of the same name there, and hold it behind Kueue's finalizer
	// when that world's agent prunes it.
	for _, c := range append([]client.Client{w.hub.Client}, workerClients(w.workers)...) {
		var list kueue.WorkloadList
		if err := c.List(ctx, &list, client.InNamespace(w.workloads)); err != nil {
			continue
		}
		for i := range list.Items {
			wl := &list.Items[i]
			_ = c.Delete(ctx, wl)
			if len(wl.Finalizers) > 0 {
				_ = c.Patch(ctx, wl, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
			}
		}
	}
}

func workerClients(workers []*worker) []client.Client {
	out := make([]client.Client, 0, len(workers))
	for _, wk := range workers {
		out = append(out, wk.plane.Client)
	}
	return out
}

// startKueue runs the three managers at once: the hub's with the configuration
// dispatch needs, the workers' with theirs.
func (w *world) startKueue() {
	tb := w.tb
	var g errgroup.Group
	start := func(plane *controlplane.ControlPlane, cfg *configapi.Configuration, out **kueuetest.Manager, tail *logtest.Buffer) {
		g.Go(func() error {
			m, err := kueuetest.Start(tb.Context(), plane, kueuetest.Options{Config: cfg, Output: tail})
			if err != nil {
				return err
			}
			*out = m
			tb.Cleanup(func() {
				if tb.Failed() {
					tb.Logf("last output of the kueue manager on %s:\n%s", plane.Name, tail.Last(32<<10))
				}
				if err := m.Stop(); err != nil {
					tb.Error(err)
				}
			})
			return nil
		})
	}
	w.hubKueueLog = &logtest.Buffer{Max: 256 << 10}
	start(w.hub, dispatch.HubKueueConfiguration(workerLostTimeout), &w.hubKueue, w.hubKueueLog)
	for _, wk := range w.workers {
		start(wk.plane, dispatch.WorkerKueueConfiguration(), &wk.kueue, &logtest.Buffer{Max: 256 << 10})
	}
	if err := g.Wait(); err != nil {
		tb.Fatal(err)
	}
}

// createFleet writes the fleet repository: the template's fleet.yaml for the tenant,
// its presets, and the two clusters with their enrollment tokens encrypted to the
// hub's age identity.
func (w *world) createFleet() {
	tb := w.tb
	id := sopstest.NewIdentity(tb)
	ids, err := secrets.NewIdentities(id)
	if err != nil {
		tb.Fatal(err)
	}
	fsys := fleetgen.Template()
	for p := range fsys {
		if strings.HasPrefix(p, fleet.ClustersDir+"/") {
			delete(fsys, p)
		}
	}
	fleetYAML := string(fsys["fleet.yaml"].Data)
	for old, repl := range map[string]string{
		"tenant: example":   "tenant: " + w.tenant,
		"    - ml-training": "    - " + w.workloads,
		// The workers run Kueue's manager as a test process (test/kueuetest), not through
		// the agent's Helm install.
		"    managed: true": "    managed: false",
	} {
		if !strings.Contains(fleetYAML, old) {
			tb.Fatalf("the template's fleet.yaml has no %q", old)
		}
		fleetYAML = strings.Replace(fleetYAML, old, repl, 1)
	}
	fsys["fleet.yaml"].Data = []byte(fleetYAML)
	w.fleetYAML = fleetYAML
	w.dir = fleetgen.WriteDir(tb, fsys)
	sopsConfig := sopstest.WriteConfig(tb, w.dir, sopstest.Rule{PathRegex: sopstest.EnrollmentPathRegex, EncryptedRegex: "^token$", Age: []*age.X25519Identity{id}})
	for _, wk := range w.workers {
		if wk.token, err = secrets.NewToken(); err != nil {
			tb.Fatal(err)
		}
		dir := filepath.Join(w.dir, fleet.ClustersDir, wk.name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		enrollment, err := secrets.EncryptEnrollment(sopsConfig, filepath.Join(dir, fleet.EnrollmentFile), wk.token)
		if err != nil {
			tb.Fatal(err)
		}
		writeFile(tb, filepath.Join(dir, fleet.EnrollmentFile), enrollment)
		writeFile(tb, filepath.Join(dir, fleet.ClusterFile), clusterYAML(wk.workerSpec, false))
	}
	srv := gitserver.Start(tb)
	w.repo = srv.NewRepo(tb, "fleet-"+w.tenant, w.dir)
	if w.notes, err = gitnotes.New(gitnotes.Options{URL: w.repo.URL()}); err != nil {
		tb.Fatal(err)
	}
	w.posts = &countedStatuses{Backend: w.notes}
	w.statuses = w.posts
	w.ids = ids
}

// clusterYAML is a worker's cluster.yaml on the template's gpu preset, whose
// ClusterQueue gets the cluster's quota.
func clusterYAML(s workerSpec, cordoned bool) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: flotilla.dev/v1alpha1\nkind: WorkerCluster\nmetadata:\n  name: %s\nspec:\n", s.name)
	fmt.Fprintf(&b, "  region: %s\n  zone: %s-a\n  residency: %s\n  preset: gpu\n  quota:\n", s.region, s.region, s.residency)
	for _, r := range slices.Sorted(maps.Keys(s.quota)) {
		fmt.Fprintf(&b, "    %s: %s\n", r, s.quota[r])
	}
	fmt.Fprintf(&b, "  cordoned: %t\n", cordoned)
	return []byte(b.String())
}

func writeFile(tb testing.TB, p string, data []byte) {
	tb.Helper()
	if err := os.WriteFile(p, data, 0o644); err != nil {
		tb.Fatal(err)
	}
}

// startHub starts the hub as a Deployment of one replica would run it, behind the
// Services the hub chart makes: the tunnel's and the leader's proxy select the leading
// replica, Kueue's proxy Service any replica the test routes it to.
func (w *world) startHub() {
	tb := w.tb
	for _, s := range []**dispatchtest.Service{&w.tunnelSvc, &w.proxySvc, &w.leaderProxySvc} {
		svc, err := dispatchtest.NewService()
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(svc.Close)
		*s = svc
	}
	w.tunnelAddr = w.tunnelSvc.Addr()
	w.proxyURL = "https://" + w.proxySvc.Addr()
	r := w.startReplica("hub-0")
	r.lead()
	w.proxySvc.Route(r.proxyL.Addr().String())
}

// replica is one replica of the hub: its proxy serves from the start, its tunnel, its
// reconciler and its dispatcher once it leads.
type replica struct {
	w      *world
	name   string
	ctx    context.Context
	cancel context.CancelFunc
	log    *slog.Logger

	status    *conditions.Writer
	tun       *tunnel.Server
	authority *servingca.Authority
	proxyL    net.Listener
	tunnelL   net.Listener

	mu       sync.Mutex
	stops    []func()
	srcDone  chan struct{}
	src      *fhub.Source
	disp     *dispatch.Dispatcher
	stopOnce sync.Once
}

// startReplica starts a replica that does not lead: it serves the API proxy only.
func (w *world) startReplica(name string) *replica {
	tb := w.tb
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{w: w, name: name, ctx: ctx, cancel: cancel, log: w.logs.Logger().With("replica", name)}
	tb.Cleanup(r.stop)
	w.replicas = append(w.replicas, r)
	hc := w.hub.Client
	for _, ns := range []string{w.ns, proxyCANamespace} {
		if err := hc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			tb.Fatal(err)
		}
	}
	statusClient, err := client.NewWithWatch(w.hub.Config, client.Options{Scheme: hc.Scheme(), Mapper: hc.RESTMapper()})
	if err != nil {
		tb.Fatal(err)
	}
	r.status = conditions.NewWriter(heldpatch.Refuse(statusClient, func(obj client.Object) error {
		if refuse := w.refusing.Load(); refuse != nil {
			return (*refuse)(obj)
		}
		return nil
	}))
	r.tun, err = tunnel.New(tunnel.Options{Client: hc, Status: r.status, Liveness: fast, AllowInsecureLoopback: true, Log: r.log})
	if err != nil {
		tb.Fatal(err)
	}
	// Every replica keeps the proxy's certificate from the one CA Secret.
	r.authority, err = servingca.New(servingca.Options{Client: hc, Secret: types.NamespacedName{Namespace: proxyCANamespace, Name: "flotilla-api-proxy-" + w.tenant},
		Hosts: []string{"127.0.0.1"}, Labels: map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue}, Log: r.log})
	if err != nil {
		tb.Fatal(err)
	}
	if err := r.authority.Reconcile(ctx); err != nil {
		tb.Fatal(err)
	}
	r.proxyL = listen(tb)
	// As the hub serves it: no write or idle timeout, a watch lasts as long as Kueue
	// keeps it.
	opts := tunnel.ProxyOptions{ResumeWindow: resumeWindow, Log: r.log}
	if w.relay {
		// As the hub chart runs replicas: each relays to the leader's proxy Service
		// what it holds no tunnel for.
		opts.Leader, opts.LeaderTrust = "https://"+w.leaderProxySvc.Addr(), r.authority.Bundle
	}
	proxy, err := tunnel.NewProxy(r.tun, opts)
	if err != nil {
		tb.Fatal(err)
	}
	proxyServer := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.authority.GetCertificate}}
	go func() { _ = proxyServer.ServeTLS(r.proxyL, "", "") }()
	r.onStop(func() { _ = proxyServer.Close() })
	return r
}

// lead makes the replica the leader: it serves the tunnel, follows the fleet repository
// and writes Kueue's objects, and the leader's Services route to it.
func (r *replica) lead() {
	w, tb := r.w, r.w.tb
	mux := http.NewServeMux()
	mux.Handle(protocol.Path, r.tun)
	r.tunnelL = listen(tb)
	tunnelServer := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = tunnelServer.Serve(r.tunnelL) }()
	r.onStop(func() { _ = tunnelServer.Close(); r.tun.Close() })

	hc := w.hub.Client
	var err error
	r.disp, err = dispatch.New(dispatch.Options{Client: hc, Tokens: r.tun, ProxyURL: w.proxyURL, ProxyPath: tunnel.ProxyURL,
		Trust: r.authority.Bundle, Status: r.status, Log: r.log})
	if err != nil {
		tb.Fatal(err)
	}
	w.watchJudgements(r.ctx, r.disp, r.log)
	h, err := fhub.New(fhub.Options{Client: hc, Decryptor: secrets.NewDecryptor(secrets.DecryptorOptions{Identities: w.ids}),
		Tunnel: r.tun, Status: r.status, Log: r.log, Dispatch: r.disp, StaleAfter: w.staleAfter})
	if err != nil {
		tb.Fatal(err)
	}
	r.src, err = h.AddSource(fhub.SourceOptions{Git: gitsource.Options{URL: w.repo.URL(), Branch: "main"}, Tenant: w.tenant, Namespace: w.ns,
		HubNamespaces: []string{w.workloads}, Statuses: w.statuses, Poll: time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	r.srcDone = make(chan struct{})
	go func() { r.src.Run(r.ctx); close(r.srcDone) }()
	w.tun, w.src, w.dispatcher, w.authority = r.tun, r.src, r.disp, r.authority
	w.tunnelSvc.Route(r.tunnelL.Addr().String())
	w.leaderProxySvc.Route(r.proxyL.Addr().String())
}

func (r *replica) onStop(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stops = append(r.stops, f)
}

// stop ends the replica as a deleted Pod ends: the process shuts down, as on SIGTERM,
// and every connection it held ends with it. A cut of its connections while it still
// ran would be a partition instead, which the replica would see as agents leaving.
func (r *replica) stop() {
	r.stopOnce.Do(func() {
		w := r.w
		r.cancel()
		r.mu.Lock()
		stops := r.stops
		r.mu.Unlock()
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		if r.srcDone != nil {
			<-r.srcDone
		}
		if r.tunnelL != nil {
			w.tunnelSvc.Drop(r.tunnelL.Addr().String())
		}
		w.proxySvc.Drop(r.proxyL.Addr().String())
		w.leaderProxySvc.Drop(r.proxyL.Addr().String())
	})
}

// watchJudgements carries every change of the MultiKueueClusters flotilla made over to
// their WorkerClusters, as cmd/flotilla-hub does.
func (w *world) watchJudgements(ctx context.Context, d *dispatch.Dispatcher, log *slog.Logger) {
	tb := w.tb
	c, err := cache.New(w.hub.Config, cache.Options{Scheme: w.hub.Client.Scheme(),
		ByObject: map[client.Object]cache.ByObject{&kueue.MultiKueueCluster{}: {
			Label: labels.SelectorFromSet(labels.Set{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue})}}})
	if err != nil {
		tb.Fatal(err)
	}
	inf, err := c.GetInformer(ctx, &kueue.MultiKueueCluster{})
	if err != nil {
		tb.Fatal(err)
	}
	judge := func(obj any) {
		if mc, ok := obj.(*kueue.MultiKueueCluster); ok {
			if err := d.Judged(ctx, mc); err != nil && ctx.Err() == nil {
				log.Error("recording Kueue's judgement of a worker", "multiKueueCluster", mc.Name, "error", err)
			}
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: judge, UpdateFunc: func(_, n any) { judge(n) }}); err != nil {
		tb.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
}

// startAgent runs the worker's agent until stopAgent or the end of the world. Its API
// proxy forwards as flotilla-dispatch, authenticating as the agent's ServiceAccount.
func (w *world) startAgent(wk *worker) {
	tb := w.tb
	log := w.logs.Logger().With("agent", wk.name)
	ap, err := apply.New(apply.Options{Client: wk.plane.Client, Identity: wk.identity})
	if err != nil {
		tb.Fatal(err)
	}
	inv, err := inventory.NewCollector(inventory.Options{Client: wk.plane.Client})
	if err != nil {
		tb.Fatal(err)
	}
	ph, err := proxy.New(proxy.Options{Config: wk.agentConfig, Namespace: agentNamespace, ClusterRole: dispatchtest.DispatchClusterRole, Log: log})
	if err != nil {
		tb.Fatal(err)
	}
	a, err := agent.New(agent.Options{
		HubURL: "ws://" + w.tunnelAddr, Identity: wk.identity, EnrollmentToken: protocol.Secret(wk.token.Reveal()),
		CredentialSecret: types.NamespacedName{Namespace: agentNamespace, Name: "flotilla-agent-credential-" + w.tenant},
		Client:           wk.plane.Client, Liveness: fast, Applier: ap, Inventory: inv, Proxy: ph,
		Backoff:      wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: time.Second},
		AgentVersion: "test", KubernetesVersion: "v1.36.3", Log: log,
	})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	wk.mu.Lock()
	wk.stopAgent = stop
	wk.mu.Unlock()
	tb.Cleanup(stop)
}

// cutAgent stops the worker's agent, as a network cut or a restarted agent pod would.
func (w *world) cutAgent(wk *worker) {
	wk.mu.Lock()
	stop := wk.stopAgent
	wk.mu.Unlock()
	stop()
}

// workerCluster reads the cluster's WorkerCluster on the hub.
func (w *world) workerCluster(tb testing.TB, wk *worker) *v1alpha1.WorkerCluster {
	tb.Helper()
	var wc v1alpha1.WorkerCluster
	if err := w.hub.Client.Get(tb.Context(), types.NamespacedName{Namespace: w.ns, Name: wk.name}, &wc); err != nil {
		tb.Fatal(err)
	}
	return &wc
}

// dispatchReady waits for the cluster's DispatchReady to have status and reason.
func (w *world) dispatchReady(tb testing.TB, wk *worker, status metav1.ConditionStatus, reason string) *v1alpha1.WorkerCluster {
	tb.Helper()
	var wc *v1alpha1.WorkerCluster
	// Not canceled in a cleanup, which restores a cluster after its test.
	ctx := context.WithoutCancel(tb.Context())
	poll.Until(tb, fmt.Sprintf("%s: DispatchReady %s (%s)", wk.name, status, reason), func() (bool, string) {
		var got v1alpha1.WorkerCluster
		if err := w.hub.Client.Get(ctx, types.NamespacedName{Namespace: w.ns, Name: wk.name}, &got); err != nil {
			return false, err.Error()
		}
		wc = &got
		c := apimeta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionDispatchReady)
		if c == nil {
			return false, "no DispatchReady condition"
		}
		return c.Status == status && c.Reason == reason, fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
	})
	return wc
}

// commitStatus waits for the cluster's commit status on the commit its state came from
// to be want, with a description containing contains.
func (w *world) commitStatus(tb testing.TB, wk *worker, want commitstatus.State, contains string) commitstatus.Status {
	tb.Helper()
	return w.commitStatusOn(tb, wk, "", want, contains)
}

// commitStatusOn waits for the cluster's commit status on commit to be want, with a
// description containing contains. An empty commit is the one the cluster's state came
// from, as its WorkerCluster says.
func (w *world) commitStatusOn(tb testing.TB, wk *worker, commit string, want commitstatus.State, contains string) commitstatus.Status {
	tb.Helper()
	var st commitstatus.Status
	poll.Until(tb, fmt.Sprintf("%s: commit status %s %q", wk.name, want, contains), func() (bool, string) {
		sha := commit
		if sha == "" {
			var wc v1alpha1.WorkerCluster
			if err := w.hub.Client.Get(tb.Context(), types.NamespacedName{Namespace: w.ns, Name: wk.name}, &wc); err != nil {
				return false, err.Error()
			}
			if sha = wc.SourceCommit(); sha == "" {
				return false, "no source commit yet"
			}
		}
		got, err := w.notes.Latest(tb.Context(), sha)
		if err != nil {
			return false, err.Error()
		}
		st = got["flotilla/"+wk.name]
		return st.State == want && strings.Contains(st.Description, contains), fmt.Sprintf("%.8s: %s: %s", sha, st.State, st.Description)
	})
	return st
}

// commitCluster commits the cluster's cluster.yaml, cordoned or not, and has the hub
// fetch it as a webhook would.
func (w *world) commitCluster(tb testing.TB, wk *worker, cordoned bool) string {
	tb.Helper()
	p := path.Join(fleet.ClustersDir, wk.name, fleet.ClusterFile)
	sha := w.repo.Commit("main", fmt.Sprintf("%s: cordoned %t", wk.name, cordoned), map[string][]byte{p: clusterYAML(wk.workerSpec, cordoned)})
	w.src.Trigger()
	return sha
}

// removeCluster commits the removal of the cluster's directory, with fleetChange, when
// set, as fleet.yaml in the same commit, and has the hub fetch it as a webhook would.
func (w *world) removeCluster(tb testing.TB, wk *worker, fleetChange []byte) string {
	tb.Helper()
	changes := map[string][]byte{
		path.Join(fleet.ClustersDir, wk.name, fleet.ClusterFile):    nil,
		path.Join(fleet.ClustersDir, wk.name, fleet.EnrollmentFile): nil,
	}
	if fleetChange != nil {
		changes["fleet.yaml"] = fleetChange
	}
	sha := w.repo.Commit("main", wk.name+": removed", changes)
	w.src.Trigger()
	return sha
}

// restoreCluster commits the cluster's directory back as the first commit had it, and
// has the hub fetch it as a webhook would.
func (w *world) restoreCluster(tb testing.TB, wk *worker) string {
	tb.Helper()
	changes := map[string][]byte{}
	for _, name := range []string{fleet.ClusterFile, fleet.EnrollmentFile} {
		data, err := os.ReadFile(filepath.Join(w.dir, fleet.ClustersDir, wk.name, name))
		if err != nil {
			tb.Fatal(err)
		}
		changes[path.Join(fleet.ClustersDir, wk.name, name)] = data
	}
	sha := w.repo.Commit("main", wk.name+": put back", changes)
	w.src.Trigger()
	return sha
}

// allDispatchable waits until every worker takes work again: what each test starts
// from.
func (w *world) allDispatchable(tb testing.TB) {
	tb.Helper()
	for _, wk := range w.workers {
		w.dispatchReady(tb, wk, metav1.ConditionTrue, v1alpha1.ReasonDispatchable)
	}
}

func (w *world) worker(name string) *worker {
	for _, wk := range w.workers {
		if wk.name == name {
			return wk
		}
	}
	w.tb.Fatalf("no worker %s", name)
	return nil
}

func listen(tb testing.TB) net.Listener {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// countedStatuses counts the statuses the hub posts, per context, and keeps what they
// said.
type countedStatuses struct {
	commitstatus.Backend
	mu    sync.Mutex
	posts map[string]int
	said  []string
}

func (c *countedStatuses) Set(ctx context.Context, commit string, st commitstatus.Status) error {
	err := c.Backend.Set(ctx, commit, st)
	if err == nil {
		c.mu.Lock()
		if c.posts == nil {
			c.posts = map[string]int{}
		}
		c.posts[st.Context]++
		c.said = append(c.said, fmt.Sprintf("%s %s on %.7s: %s", st.Context, st.State, commit, st.Description))
		c.mu.Unlock()
	}
	return err
}

// since is what the posts after the first n of them said.
func (c *countedStatuses) since(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.said[min(n, len(c.said)):])
}

// total is how many statuses were posted so far.
func (c *countedStatuses) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.said)
}

// count is how many statuses were posted, per context, so far.
func (c *countedStatuses) count() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.posts)
}

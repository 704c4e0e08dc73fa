package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"filippo.io/age"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/github"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	fhub "github.com/flotilla-gitops/flotilla/reconciler/hub"
	"github.com/flotilla-gitops/flotilla/reconciler/hubcache"
	"github.com/flotilla-gitops/flotilla/reconciler/hubclient"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/forge/githubtest"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/sopstest"
)

// world is a fleet of n clusters and one hub following it on the hub plane: the fleet
// repository on a git server, commit statuses on a GitHub test server, and the agents
// simulated in a child process. Each cluster has an enrollment file of its own, and
// its agent enrolled with it.
type world struct {
	tb     testing.TB
	n      int
	tenant string
	ns     string
	// files are the fleet as committed last, for changes.
	files fstest.MapFS
	git   *gitserver.Server
	repo  *gitserver.Repo
	forge *githubtest.Server
	ids   *secrets.Identities
	// addr is the hub's tunnel address, the same across the hub's restarts.
	addr string
	hub  *hubRun
	// stopAgents ends the agents' process.
	stopAgents func()
	// watch is the test's own view of the WorkerClusters, through the admin client:
	// nothing it reads counts against the hub.
	watch *fleetWatch
}

// worlds counts the worlds of the test process: each has a tenant of its own.
var worlds atomic.Int64

// hubProfile is how a hub talks to the hub cluster.
type hubProfile struct {
	// QPS and Burst are the client's rate limit; a negative QPS sets none.
	QPS   float32
	Burst int
	// AsServiceAccount makes the hub's requests as a service account, as a hub in a
	// cluster does: the API server's priority and fairness then queues and may refuse
	// them (system:masters, the admin's group, is exempt).
	AsServiceAccount bool
	// LastSeenEvery is the tunnel's; zero for its default.
	LastSeenEvery time.Duration
	// MaxInFlight bounds the requests under way at once (hubclient); zero for none.
	MaxInFlight int
}

// realistic is cmd/flotilla-hub's default client (kubeAPI.qps 100, burst 200, 64
// requests in flight at most) as the hub's service account.
var realistic = hubProfile{QPS: 100, Burst: 200, AsServiceAccount: true, MaxInFlight: hubclient.DefaultMaxInFlight}

// setup is a hub that builds a world about as fast as the API server takes it:
// faster, and its requests time out, and the records they carry are lost.
var setup = hubProfile{QPS: 300, Burst: 600, MaxInFlight: hubclient.DefaultMaxInFlight}

// hubServiceAccount is the identity a hub of the realistic profile acts as.
const (
	hubServiceAccountNS   = "flotilla-system"
	hubServiceAccountName = "flotilla-hub"
)

// newWorld generates a fleet of n clusters, commits it, starts a hub on it and the
// agents, and returns once every cluster is ready; then the hub is restarted with
// profile. Everything goes when tb ends.
func newWorld(tb testing.TB, n int, profile hubProfile) *world {
	tb.Helper()
	ctx := context.Background()
	began := time.Now()
	w := &world{tb: tb, n: n, tenant: fmt.Sprintf("n%d-%d", n, worlds.Add(1))}
	w.ns = "tenant-" + w.tenant
	if err := admin().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}); err != nil {
		tb.Fatal(err)
	}
	allowServiceAccount(tb)
	id := sopstest.NewIdentity(tb)
	ids, err := secrets.NewIdentities(id)
	if err != nil {
		tb.Fatal(err)
	}
	w.ids = ids
	tokens := w.generate(id)
	generated := time.Since(began)
	w.git = gitserver.Start(tb)
	w.repo = newFleetRepo(tb, w.git, "fleet-"+w.tenant, w.files, func(fsys fstest.MapFS) string { return fleetgen.WriteDir(tb, fsys) })
	w.forge = githubtest.Start(tb)
	w.forge.AddCommit(w.repo.Head("main"))
	w.watch = watchFleet(tb, w.ns, n)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	w.addr = l.Addr().String()
	w.hub = w.startHub(l, setup)
	tb.Cleanup(func() { w.hub.stop() })
	// The agents dial once their WorkerClusters exist, as a fleet's are installed after
	// the merge that adds them.
	w.hub.waitSync(tb, 0)
	w.startAgents(tokens)
	committed := time.Since(began)
	w.watch.waitAll(tb, "every cluster enrolled and ready", 30*time.Minute, func(wc *v1alpha1.WorkerCluster) bool { return ready(wc) })
	enrolled := time.Since(began)
	w.waitSteady(w.restartHub(profile), 30*time.Minute)
	w.hub.waitSync(tb, 0)
	tb.Logf("a fleet of %d clusters set up in %s: generated in %s, committed by %s, enrolled by %s",
		n, time.Since(began).Round(time.Second), generated.Round(time.Second), committed.Round(time.Second), enrolled.Round(time.Second))
	return w
}

// generate makes the fleet: the template's fleet.yaml for the world's tenant, without
// dispatch (simulated agents run no Kueue) and with Kueue left to the workers, and n
// clusters, each with an enrollment file of its own encrypted to id. It returns the
// agents' file for simulateAgents.
func (w *world) generate(id *age.X25519Identity) string {
	tb := w.tb
	files := fleetgen.Fleet(w.n, fleetgen.Options{})
	spec := string(files[fleet.FleetFile].Data)
	for _, r := range []struct{ old, new string }{
		{"tenant: example", "tenant: " + w.tenant},
		{"managed: true", "managed: false"},
		{"  statusContextPrefix: flotilla\n", "  statusContextPrefix: flotilla\n  dispatch:\n    enabled: false\n"},
	} {
		if !strings.Contains(spec, r.old) {
			tb.Fatalf("the template's fleet.yaml has no %q", r.old)
		}
		spec = strings.Replace(spec, r.old, r.new, 1)
	}
	files[fleet.FleetFile] = &fstest.MapFile{Data: []byte(spec), Mode: 0o644}

	dir := tb.TempDir()
	cfg := sopstest.WriteConfig(tb, dir, sopstest.Rule{PathRegex: sopstest.EnrollmentPathRegex, EncryptedRegex: "^token$", Age: []*age.X25519Identity{id}})
	lines := make([]string, w.n)
	encrypted := make([][]byte, w.n)
	errs := make([]error, w.n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for i := range next {
				tok, err := secrets.NewToken()
				if err != nil {
					errs[i] = err
					continue
				}
				name := fleetgen.ClusterName(i)
				encrypted[i], errs[i] = secrets.EncryptEnrollment(cfg, filepath.Join(dir, fleet.ClustersDir, name, fleet.EnrollmentFile), tok)
				lines[i] = fleet.Identity(w.tenant, name) + "\t" + tok.Reveal()
			}
		})
	}
	for i := range w.n {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		tb.Fatal(err)
	}
	for i := range w.n {
		files[path.Join(fleet.ClustersDir, fleetgen.ClusterName(i), fleet.EnrollmentFile)] = &fstest.MapFile{Data: encrypted[i], Mode: 0o644}
	}
	w.files = files
	agents := filepath.Join(dir, "agents")
	if err := os.WriteFile(agents, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	return agents
}

// startAgents runs the agents of the file in a child process until tb ends.
func (w *world) startAgents(file string) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), agentsEnv+"=ws://"+w.addr+"|"+file)
	logs := &logtest.Buffer{Max: 64 << 10}
	cmd.Stderr = io.MultiWriter(logs, w.logFile("agents"))
	// The agents die with the test process, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		w.tb.Fatal(err)
	}
	var once sync.Once
	w.stopAgents = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if w.tb.Failed() {
				w.tb.Logf("simulated agents of %d clusters:\n%s", w.n, logs.Last(40))
			}
		})
	}
	w.tb.Cleanup(w.stopAgents)
}

// logFile is where the world's part named keeps its log when FLOTILLA_SCALE_LOGS names
// a directory, for a look at a long run while it runs; io.Discard otherwise.
func (w *world) logFile(part string) io.Writer {
	dir := os.Getenv("FLOTILLA_SCALE_LOGS")
	if dir == "" {
		return io.Discard
	}
	f, err := os.OpenFile(filepath.Join(dir, w.tenant+"-"+part+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		w.tb.Fatal(err)
	}
	w.tb.Cleanup(func() { _ = f.Close() })
	return f
}

// commit commits changes to the fleet on main, tells the forge of the commit, and
// triggers the hub as a webhook would.
func (w *world) commit(msg string, changes map[string][]byte) string {
	sha := w.push(msg, changes)
	w.hub.src.Trigger()
	return sha
}

// push commits changes to the fleet on main and tells the forge of the commit.
func (w *world) push(msg string, changes map[string][]byte) string {
	for p, data := range changes {
		if data == nil {
			delete(w.files, p)
		} else {
			w.files[p] = &fstest.MapFile{Data: data, Mode: 0o644}
		}
	}
	sha := w.repo.Commit("main", msg, changes)
	w.forge.AddCommit(sha)
	return sha
}

// close stops the hub and the agents before the test ends, so that a larger world
// measured next shares the machine with nothing of this one.
func (w *world) close() {
	w.hub.stop()
	w.stopAgents()
}

// file is a file of the fleet as committed last.
func (w *world) file(p string) string { return string(w.files[p].Data) }

// restartHub stops the hub and starts a new one, with nothing in memory, on the same
// address: its agents redial. It returns the latest status.lastSeen the old hub
// recorded; the new one starts in a later second, so that each agent's connection to
// it records a later one.
func (w *world) restartHub(profile hubProfile) (lastSeen time.Time) {
	w.hub.stop()
	for _, wc := range w.watch.snapshot() {
		if s := wc.Status.LastSeen; s != nil && s.Time.After(lastSeen) {
			lastSeen = s.Time
		}
	}
	// status.lastSeen is recorded to the second: the clock, not the hub, is waited for.
	if next := lastSeen.Add(time.Second); time.Now().Before(next) {
		time.Sleep(time.Until(next))
	}
	l, err := net.Listen("tcp", w.addr)
	if err != nil {
		w.tb.Fatal(err)
	}
	w.hub = w.startHub(l, profile)
	return lastSeen
}

// waitSteady waits until every cluster's agent connected again after the old hub's
// last record, and every cluster is ready.
func (w *world) waitSteady(after time.Time, within time.Duration) {
	w.watch.waitAll(w.tb, "every agent back and every cluster ready", within, func(wc *v1alpha1.WorkerCluster) bool {
		return ready(wc) && wc.Status.LastSeen != nil && wc.Status.LastSeen.Time.After(after)
	})
}

// ready is what a cluster's commit status calls success without dispatch: Ready, its
// agent configured at the desired state.
func ready(wc *v1alpha1.WorkerCluster) bool {
	c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionReady)
	return c != nil && c.Status == metav1.ConditionTrue && wc.Status.DesiredHash != "" && wc.Status.AppliedHash == wc.Status.DesiredHash
}

// hubRun is one hub process's worth of parts, put together as cmd/flotilla-hub does.
type hubRun struct {
	tunnel   *tunnel.Server
	src      *fhub.Source
	dec      *secrets.Decryptor
	requests *requestCounter
	log      *logtest.Buffer
	started  time.Time
	stop     func()

	mu sync.Mutex
	// syncs counts the syncs done; synced is closed and replaced at each.
	syncs  int
	synced chan struct{}
	// fetching is the time the syncs spent fetching the fleet's repository.
	fetching time.Duration
}

// fetchTime is how long the hub's syncs spent fetching so far.
func (h *hubRun) fetchTime() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fetching
}

// syncCount is how many syncs the hub did.
func (h *hubRun) syncCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.syncs
}

// waitSync waits until the hub did more than after syncs.
func (h *hubRun) waitSync(tb testing.TB, after int) {
	tb.Helper()
	deadline := time.NewTimer(15 * time.Minute)
	defer deadline.Stop()
	for {
		h.mu.Lock()
		n, synced := h.syncs, h.synced
		h.mu.Unlock()
		if n > after {
			return
		}
		select {
		case <-synced:
		case <-deadline.C:
			tb.Fatalf("the hub did not sync within 15 minutes")
		}
	}
}

// startHub starts a hub with nothing in memory, serving tunnels on l.
func (w *world) startHub(l net.Listener, profile hubProfile) *hubRun {
	tb := w.tb
	h := &hubRun{requests: &requestCounter{}, log: &logtest.Buffer{Max: 256 << 10}, started: time.Now(), synced: make(chan struct{})}
	rc := rest.CopyConfig(planes[0].Config)
	rc.QPS, rc.Burst = profile.QPS, profile.Burst
	if profile.AsServiceAccount {
		rc.Impersonate = rest.ImpersonationConfig{
			UserName: "system:serviceaccount:" + hubServiceAccountNS + ":" + hubServiceAccountName,
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + hubServiceAccountNS, "system:authenticated"},
		}
	}
	hubclient.LimitInFlight(rc, profile.MaxInFlight)
	rc.Wrap(h.requests.wrap)
	scheme := newScheme(tb)
	c, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cached, err := hubcache.Start(ctx, rc, scheme, []string{w.ns})
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(h.log, w.logFile("hub")), nil))
	status := conditions.NewWriterWith(c, conditions.WriterOptions{Reader: cached, Log: log})
	srv, err := tunnel.New(tunnel.Options{Client: c, Reader: cached, IdentityIndexed: true, Status: status, AllowInsecureLoopback: true, LastSeenEvery: profile.LastSeenEvery, Log: log})
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	h.tunnel = srv
	h.dec = secrets.NewDecryptor(secrets.DecryptorOptions{Identities: w.ids})
	onSync := func(string, time.Duration, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.syncs++
		close(h.synced)
		h.synced = make(chan struct{})
	}
	onFetch := func(_ string, took time.Duration, _ error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.fetching += took
	}
	hb, err := fhub.New(fhub.Options{Client: c, Reader: cached, Decryptor: h.dec, Tunnel: srv, Status: status, Log: log, OnSync: onSync, OnFetch: onFetch})
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	statuses, err := github.New(github.Options{BaseURL: w.forge.URL, Owner: w.forge.Owner, Repo: w.forge.Repo, Token: w.forge.Token})
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	h.src, err = hb.AddSource(fhub.SourceOptions{Git: gitsource.Options{URL: w.repo.URL(), Branch: "main"}, Tenant: w.tenant, Namespace: w.ns, Statuses: statuses, Poll: time.Hour})
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(protocol.Path, srv)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() { _ = hs.Serve(l); close(served) }()
	ran := make(chan struct{})
	go func() { h.src.Run(ctx); close(ran) }()
	var once sync.Once
	h.stop = func() {
		once.Do(func() {
			// The listener and every tunnel at once, as when the hub's process ends.
			_ = hs.Close()
			<-served
			srv.Close()
			cancel()
			<-ran
			if tb.Failed() {
				var refusals []string
				for _, line := range strings.Split(h.log.String(), "\n") {
					if strings.Contains(line, "refused") || strings.Contains(line, "level=ERROR") {
						refusals = append(refusals, line)
					}
				}
				tb.Logf("the hub of %d clusters: %d refusals and errors, the first:\n%s\nthe last lines:\n%s", w.n, len(refusals), strings.Join(refusals[:min(len(refusals), 10)], "\n"), h.log.Last(60))
			}
		})
	}
	return h
}

func newScheme(tb testing.TB) *kruntime.Scheme {
	scheme := kruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		tb.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		tb.Fatal(err)
	}
	return scheme
}

// allowServiceAccount lets the hub's service account do what the hub does (what the
// chart's RBAC grants is tested with the chart; here only the API server's fairness
// towards it matters).
func allowServiceAccount(tb testing.TB) {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "flotilla-hub-scale"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: hubServiceAccountNS, Name: hubServiceAccountName}},
	}
	if err := admin().Create(context.Background(), crb); err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatal(err)
	}
}

// fleetWatch is the test's own informer of a namespace's WorkerClusters.
type fleetWatch struct {
	// want is how many WorkerClusters the fleet has.
	want int

	mu     sync.Mutex
	latest map[string]*v1alpha1.WorkerCluster
	// pred and met are the condition being waited for and the clusters that meet it.
	pred    func(*v1alpha1.WorkerCluster) bool
	met     map[string]bool
	changed chan struct{}
}

func watchFleet(tb testing.TB, ns string, want int) *fleetWatch {
	fw := &fleetWatch{want: want, latest: map[string]*v1alpha1.WorkerCluster{}, changed: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	c, err := cache.New(planes[0].Config, cache.Options{Scheme: newScheme(tb), DefaultNamespaces: map[string]cache.Config{ns: {}},
		DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		tb.Fatal(err)
	}
	inf, err := c.GetInformer(ctx, &v1alpha1.WorkerCluster{})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { fw.saw(obj) },
		UpdateFunc: func(_, obj any) { fw.saw(obj) },
	}); err != nil {
		tb.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		tb.Fatal("the test's cache did not fill")
	}
	return fw
}

func (fw *fleetWatch) saw(obj any) {
	wc, ok := obj.(*v1alpha1.WorkerCluster)
	if !ok {
		return
	}
	fw.mu.Lock()
	fw.latest[wc.Name] = wc
	if fw.pred != nil {
		if fw.pred(wc) {
			fw.met[wc.Name] = true
		} else {
			delete(fw.met, wc.Name)
		}
	}
	fw.mu.Unlock()
	select {
	case fw.changed <- struct{}{}:
	default:
	}
}

// snapshot returns the latest copy of every WorkerCluster; they must not be changed.
func (fw *fleetWatch) snapshot() map[string]*v1alpha1.WorkerCluster {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	out := make(map[string]*v1alpha1.WorkerCluster, len(fw.latest))
	for k, v := range fw.latest {
		out[k] = v
	}
	return out
}

// waitAll waits until every WorkerCluster of the fleet meets pred, as the API server
// has them, and fails tb after within.
func (fw *fleetWatch) waitAll(tb testing.TB, what string, within time.Duration, pred func(*v1alpha1.WorkerCluster) bool) {
	tb.Helper()
	fw.count(pred)
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	defer fw.count(nil)
	// A long wait (a large fleet's setup) says how far it got, now and then.
	progress := time.NewTicker(time.Minute)
	defer progress.Stop()
	for {
		fw.mu.Lock()
		met := len(fw.met)
		fw.mu.Unlock()
		if met >= fw.want {
			return
		}
		select {
		case <-fw.changed:
		case <-progress.C:
			fmt.Fprintf(os.Stderr, "%s: %d of %d\n", what, met, fw.want)
		case <-deadline.C:
			tb.Fatalf("%s: not reached within %s; %d of %d", what, within, met, fw.want)
		}
	}
}

// count starts counting the WorkerClusters that meet pred, nil to stop.
func (fw *fleetWatch) count(pred func(*v1alpha1.WorkerCluster) bool) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	fw.pred, fw.met = pred, map[string]bool{}
	if pred == nil {
		return
	}
	for name, wc := range fw.latest {
		if pred(wc) {
			fw.met[name] = true
		}
	}
}

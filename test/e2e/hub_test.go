package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitnotes"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	fhub "github.com/flotilla-gitops/flotilla/reconciler/hub"
	"github.com/flotilla-gitops/flotilla/reconciler/hubcache"
	"github.com/flotilla-gitops/flotilla/reconciler/plan"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/gobuild"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/sopstest"
)

var (
	binsOnce sync.Once
	// bins builds the commands the tests run as processes, into the hub plane's
	// directory, which goes when the test process ends.
	bins gobuild.Cache
)

// builtBinary builds one of the commands once per test process.
func builtBinary(t testing.TB, name string) string {
	t.Helper()
	binsOnce.Do(func() { bins.Dir, bins.Race = planes[0].Dir(), raceEnabled })
	return bins.Binary(t, name)
}

func cli(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(builtBinary(t, "flotilla"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("flotilla %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// values is the handover file `flotilla cluster add` writes for the worker's admin.
type values struct {
	Hub     struct{ URL string } `json:"hub"`
	Cluster struct {
		Tenant, Name, Identity string
	} `json:"cluster"`
	Enrollment struct{ Token string } `json:"enrollment"`
}

// readDir returns every file under dir/sub as repository paths.
func readDir(t testing.TB, dir, sub string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(filepath.Join(dir, sub), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		data, err := os.ReadFile(p)
		files[filepath.ToSlash(rel)] = data
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// fleetRepo is a fleet repository made with the CLI, on the git server, with the hub
// following it.
type fleetRepo struct {
	t     testing.TB
	dir   string // the engineer's checkout, where the CLI writes
	repo  *gitserver.Repo
	src   *fhub.Source
	notes *gitnotes.Backend
	// statuses is the hub's status backend: notes unless an option sets another.
	statuses commitstatus.Backend
	// remembered is the hub source's RememberedCommits; zero for the default.
	remembered int
	tunnel     *hubServer
	tenant     string
	ns         string
	ids        *secrets.Identities
	stopRun    func()
	prs        *openPRs

	syncMu     sync.Mutex
	syncs      []time.Duration // how long each sync that found a new head took
	reconciles []time.Duration // how long each changed cluster's reconcile took
}

// openPRs is the forge's word on which pull requests into main are open. A test can
// hold it, as a forge that does not answer would: the hub's plan worker then waits in
// it until released.
type openPRs struct {
	open map[int]bool

	mu      sync.Mutex
	gate    chan struct{} // closed to release; nil when not held
	entered chan struct{} // receives each time a listing waits at the gate
}

func (o *openPRs) OpenPullRequests(ctx context.Context, base string) (map[int]bool, error) {
	o.mu.Lock()
	gate, entered := o.gate, o.entered
	o.mu.Unlock()
	if gate != nil {
		select {
		case entered <- struct{}{}:
		default:
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if base != "main" {
		return nil, nil
	}
	return o.open, nil
}

// hold makes listings wait until release is called; entered receives once a listing
// waits.
func (o *openPRs) hold() (entered <-chan struct{}, release func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	gate, in := make(chan struct{}), make(chan struct{}, 1)
	o.gate, o.entered = gate, in
	return in, func() {
		o.mu.Lock()
		o.gate = nil
		o.mu.Unlock()
		close(gate)
	}
}

// startHub starts a hub, with nothing in memory, following the repository and serving
// tunnels on l. As cmd/flotilla-hub's, it reads WorkerClusters and the tunnel's Secrets
// from an informer cache.
func (f *fleetRepo) startHub(l net.Listener) {
	t, h := f.t, f.tunnel
	runCtx, cancel := context.WithCancel(context.Background())
	cached, err := hubcache.Start(runCtx, planes[0].Config, hub().Scheme(), []string{f.ns})
	if err != nil {
		t.Fatal(err)
	}
	status := conditions.NewWriterWith(hub(), conditions.WriterOptions{Reader: cached})
	h.opts = tunnel.Options{Client: hub(), Reader: cached, IdentityIndexed: true, Status: status, Liveness: fast, AllowInsecureLoopback: true, Log: h.log.Logger()}
	h.serve(l)
	hb, err := fhub.New(fhub.Options{Client: hub(), Reader: cached, Decryptor: secrets.NewDecryptor(secrets.DecryptorOptions{Identities: f.ids}), Tunnel: h.srv, Status: status, Log: h.log.Logger(), Plans: plan.NewStore(0),
		OnSync: func(_ string, took time.Duration, _ error) {
			f.syncMu.Lock()
			f.syncs = append(f.syncs, took)
			f.syncMu.Unlock()
		},
		OnReconcile: func(_ string, took time.Duration, _ error) {
			f.syncMu.Lock()
			f.reconciles = append(f.reconciles, took)
			f.syncMu.Unlock()
		}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	f.src, err = hb.AddSource(fhub.SourceOptions{Git: gitsource.Options{URL: f.repo.URL(), Branch: "main"}, Tenant: f.tenant, Namespace: f.ns, Statuses: f.statuses, Poll: time.Hour, PullRequests: f.prs,
		RememberedCommits: f.remembered})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { f.src.Run(runCtx); close(done) }()
	f.stopRun = func() { cancel(); <-done }
}

func (f *fleetRepo) stopHub() {
	f.stopRun()
	f.tunnel.stop()
}

// restartHub replaces the hub with a new one on the same address.
func (f *fleetRepo) restartHub() {
	f.stopHub()
	f.resumeHub()
}

// resumeHub starts a new hub on the address of the one stopHub stopped.
func (f *fleetRepo) resumeHub() {
	l, err := net.Listen("tcp", f.tunnel.addr)
	if err != nil {
		f.t.Fatal(err)
	}
	f.startHub(l)
}

// newFleetRepo makes a fleet repository on a git server and a hub that follows it; opts
// change the hub before it starts.
func newFleetRepo(t testing.TB, tenant string, opts ...func(*fleetRepo)) *fleetRepo {
	t.Helper()
	ctx := t.Context()
	id := sopstest.NewIdentity(t)
	f := &fleetRepo{t: t, dir: filepath.Join(t.TempDir(), "fleet"), tenant: tenant, ns: "tenant-" + tenant, prs: &openPRs{open: map[int]bool{1: true, 2: true}}}
	if err := hub().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}}); err != nil {
		t.Fatal(err)
	}
	// The hub's tunnel listens first: its address goes into the values files.
	h := &hubServer{t: t, log: &logtest.Buffer{}}
	l, err := listenLoopback()
	if err != nil {
		t.Fatal(err)
	}
	h.addr = l.Addr().String()
	cli(t, "fleet", "init", f.dir, "--tenant", tenant, "--hub-url", "ws://"+h.addr, "--age-recipient", id.Recipient().String(), "--manage-components=false")
	srv := gitserver.Start(t)
	f.repo = srv.NewRepo(t, "fleet-"+tenant, f.dir)

	ids, err := secrets.NewIdentities(id)
	if err != nil {
		t.Fatal(err)
	}
	f.ids = ids
	if f.notes, err = gitnotes.New(gitnotes.Options{URL: f.repo.URL()}); err != nil {
		t.Fatal(err)
	}
	f.tunnel, f.statuses = h, f.notes
	for _, o := range opts {
		o(f)
	}
	f.startHub(l)
	t.Cleanup(f.stopHub)
	return f
}

// addCluster runs `flotilla cluster add` and commits the cluster's files on branch.
func (f *fleetRepo) addCluster(branch, name string, extra ...string) (values, string) {
	f.t.Helper()
	args := append([]string{"cluster", "add", name, "--dir", f.dir, "--region", "us-east1", "--residency", "us", "--preset", "gpu"}, extra...)
	cli(f.t, args...)
	v := f.values(name)
	sha := f.repo.Commit(branch, "add cluster "+name, readDir(f.t, f.dir, "clusters/"+name))
	return v, sha
}

// values reads the values file the CLI last wrote for the cluster name.
func (f *fleetRepo) values(name string) values {
	f.t.Helper()
	var v values
	data, err := os.ReadFile(filepath.Join(f.dir, "values."+name+".local.yaml"))
	if err != nil {
		f.t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &v); err != nil {
		f.t.Fatal(err)
	}
	return v
}

// edited reads a file of the checkout and returns it with old replaced by new, which
// must occur in it.
func (f *fleetRepo) edited(t testing.TB, file, old, new string) (before, after []byte) {
	t.Helper()
	before, err := os.ReadFile(filepath.Join(f.dir, filepath.FromSlash(file)))
	if err != nil {
		t.Fatal(err)
	}
	after = []byte(strings.Replace(string(before), old, new, 1))
	if string(after) == string(before) {
		t.Fatalf("%s has no %q to change:\n%s", file, old, before)
	}
	return before, after
}

// statusOf reads a context's status on commit, as `flotilla commit status` would.
func (f *fleetRepo) statusOf(commit, context string) commitstatus.Status {
	f.t.Helper()
	got, err := f.statuses.Latest(f.t.Context(), commit)
	if err != nil {
		f.t.Fatal(err)
	}
	return got[context]
}

func (f *fleetRepo) waitStatus(commit, context string, want commitstatus.State, contains string) commitstatus.Status {
	f.t.Helper()
	var st commitstatus.Status
	eventually(f.t, fmt.Sprintf("%s %s on %.8s", context, want, commit), func() (bool, string) {
		st = f.statusOf(commit, context)
		return st.State == want && strings.Contains(st.Description, contains), fmt.Sprintf("%s: %s", st.State, st.Description)
	})
	return st
}

// statusCommit is the commit a cluster's status lives on: the newest one that changed
// its inputs.
func (f *fleetRepo) statusCommit(name string) string {
	f.t.Helper()
	var wc v1alpha1.WorkerCluster
	if err := hub().Get(f.t.Context(), types.NamespacedName{Namespace: f.ns, Name: name}, &wc); err != nil {
		f.t.Fatal(err)
	}
	return wc.SourceCommit()
}

// startAgent runs an agent in-process with the values file's identity and token.
func (f *fleetRepo) startAgent(v values) func() {
	c := &fleetCase{t: f.t, identity: v.Cluster.Identity, token: mustToken(f.t, v.Enrollment.Token), agentNS: "flotilla-" + v.Cluster.Name}
	// An agent installed again with new values runs in the namespace of the first.
	if err := worker().Create(f.t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.agentNS}}); err != nil && !apierrors.IsAlreadyExists(err) {
		f.t.Fatal(err)
	}
	stop, _ := runAgent(f.t, c, f.tunnel, true, nil)
	return stop
}

func mustToken(t testing.TB, s string) secrets.Token {
	t.Helper()
	tok, err := secrets.ParseToken(s)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestMergeTurnsTheCommitGreen(t *testing.T) {
	f := newFleetRepo(t, "acme")
	f.repo.Branch("main", "add-gpu-a")
	v, branchHead := f.addCluster("add-gpu-a", "gpu-a")
	// Before the merge: the pull request's plan, and nothing on a worker.
	f.repo.SetRef("refs/pull/1/head", "add-gpu-a")
	// #9 was closed long ago, but its ref stays, as forges keep them.
	f.repo.Branch("main", "abandoned")
	closed := f.repo.Commit("abandoned", "an idea", map[string][]byte{"README.md": []byte("abandoned\n")})
	f.repo.SetRef("refs/pull/9/head", "abandoned")
	f.src.Trigger()
	f.waitStatus(branchHead, "flotilla/plan", commitstatus.Success, "+1 cluster")
	if err := hub().Get(t.Context(), types.NamespacedName{Namespace: f.ns, Name: "gpu-a"}, &v1alpha1.WorkerCluster{}); err == nil {
		t.Fatal("a plan created the WorkerCluster")
	}
	began := time.Now()
	merge := f.repo.Merge("main", "add-gpu-a", "Merge: add gpu-a")
	f.src.Trigger()
	f.waitStatus(merge, "flotilla/gpu-a", commitstatus.Pending, "enrollment token")
	f.waitStatus(merge, "flotilla/fleet", commitstatus.Pending, "0 of 1")

	stopFirst := f.startAgent(v)
	f.waitStatus(merge, "flotilla/gpu-a", commitstatus.Success, "ready")
	t.Logf("merge to success, agent started after the merge: %s", time.Since(began).Round(time.Millisecond))
	f.waitStatus(merge, "flotilla/fleet", commitstatus.Success, "1 of 1")
	// Several syncs later, each of which planned what it found open.
	if st := f.statusOf(closed, "flotilla/plan"); st.State != "" {
		t.Fatalf("a closed pull request was planned: %+v", st)
	}

	var wc v1alpha1.WorkerCluster
	if err := hub().Get(t.Context(), types.NamespacedName{Namespace: f.ns, Name: "gpu-a"}, &wc); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{v1alpha1.ConditionRegistered, v1alpha1.ConditionConnected, v1alpha1.ConditionWorkerConfigured, v1alpha1.ConditionReady} {
		if c := condition(&wc, typ); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != wc.Generation {
			t.Errorf("%s = %+v, want True at generation %d", typ, c, wc.Generation)
		}
	}
	if c := condition(&wc, v1alpha1.ConditionDispatchReady); c == nil || c.Status != metav1.ConditionUnknown || c.Reason != v1alpha1.ReasonMultiKueueNotConfigured {
		t.Errorf("DispatchReady = %+v, want Unknown MultiKueueNotConfigured", c)
	}

	t.Run("an invalid cluster fails alone, naming file and line", func(t *testing.T) {
		bad := f.repo.Commit("main", "break gpu-b", map[string][]byte{"clusters/gpu-b/cluster.yaml": []byte("apiVersion: flotilla.dev/v1alpha1\nkind: WorkerCluster\nmetadata:\n  name: gpu-b\nspec:\n  region: us-east1\n  residency: mars\n  preset: gpu\n")})
		f.src.Trigger()
		st := f.waitStatus(bad, "flotilla/gpu-b", commitstatus.Failure, "clusters/gpu-b/cluster.yaml:")
		t.Logf("failure: %s", st.Description)
		f.waitStatus(bad, "flotilla/fleet", commitstatus.Failure, "invalid")
		// gpu-a did not change: its status stays on its own commit, green.
		f.waitStatus(merge, "flotilla/gpu-a", commitstatus.Success, "ready")
		if got := f.statusOf(bad, "flotilla/gpu-a"); got.State != "" {
			t.Fatalf("gpu-a got a status on a commit that did not touch it: %+v", got)
		}
	})

	t.Run("a merged cordon reconfigures the worker and turns green", func(t *testing.T) {
		file := filepath.Join(f.dir, "clusters", "gpu-a", "cluster.yaml")
		_, cordoned := f.edited(t, "clusters/gpu-a/cluster.yaml", "cordoned: false", "cordoned: true")
		if err := os.WriteFile(file, cordoned, 0o644); err != nil {
			t.Fatal(err)
		}
		// As a pull request: its plan first, then the merge.
		f.repo.Branch("main", "cordon-gpu-a")
		prHead := f.repo.Commit("cordon-gpu-a", "cordon gpu-a", map[string][]byte{"clusters/gpu-a/cluster.yaml": cordoned})
		f.repo.SetRef("refs/pull/2/head", "cordon-gpu-a")
		f.src.Trigger()
		f.waitStatus(prHead, "flotilla/plan", commitstatus.Success, "~1")
		began := time.Now()
		cordon := f.repo.Merge("main", "cordon-gpu-a", "Merge: cordon gpu-a")
		f.src.Trigger()
		f.waitStatus(cordon, "flotilla/gpu-a", commitstatus.Success, "ready")
		t.Logf("push to success for a connected cluster: %s", time.Since(began).Round(time.Millisecond))
		var cqs unstructured.UnstructuredList
		cqs.SetGroupVersionKind(schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "ClusterQueueList"})
		if err := worker().List(t.Context(), &cqs, client.MatchingLabels{v1alpha1.WorkerClusterLabel: v.Cluster.Identity}); err != nil || len(cqs.Items) == 0 {
			t.Fatalf("ClusterQueues of gpu-a: %d, %v", len(cqs.Items), err)
		}
		for _, cq := range cqs.Items {
			if p, _, _ := unstructured.NestedString(cq.Object, "spec", "stopPolicy"); p != "Hold" {
				t.Fatalf("ClusterQueue %s has stopPolicy %q after the cordon", cq.GetName(), p)
			}
		}
	})

	t.Run("rotate-token --revoke cuts the agent off at the merge, and the new values file brings it back", func(t *testing.T) {
		key := types.NamespacedName{Namespace: f.ns, Name: "gpu-a"}
		cli(t, "cluster", "rotate-token", "gpu-a", "--revoke", "--dir", f.dir)
		fresh := f.values("gpu-a")
		revoked := f.repo.Commit("main", "revoke gpu-a", readDir(t, f.dir, "clusters/gpu-a"))
		f.src.Trigger()
		st := f.waitStatus(revoked, "flotilla/gpu-a", commitstatus.Pending, "values.gpu-a.local.yaml")
		t.Logf("after the revocation: %s", st.Description)
		var wc v1alpha1.WorkerCluster
		if err := hub().Get(t.Context(), key, &wc); err != nil {
			t.Fatal(err)
		}
		if c := condition(&wc, v1alpha1.ConditionConnected); c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonCredentialRevoked {
			t.Fatalf("Connected = %+v, want False, CredentialRevoked", c)
		}
		// Nothing else of the cluster changed: no drain, no prune, no decommission.
		var cqs unstructured.UnstructuredList
		cqs.SetGroupVersionKind(schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "ClusterQueueList"})
		if err := worker().List(t.Context(), &cqs, client.MatchingLabels{v1alpha1.WorkerClusterLabel: v.Cluster.Identity}); err != nil || len(cqs.Items) == 0 {
			t.Fatalf("the worker's ClusterQueues after the revocation: %d, %v", len(cqs.Items), err)
		}
		if _, ok := wc.Annotations[v1alpha1.DecommissionAnnotation]; ok {
			t.Fatal("the revoked cluster is being decommissioned")
		}

		// A pull request cannot take the revocation back.
		file := filepath.Join(f.dir, "clusters", "gpu-a", "cluster.yaml")
		raised, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lowered := f.repo.Commit("main", "undo the revocation", map[string][]byte{"clusters/gpu-a/cluster.yaml": []byte(strings.Replace(string(raised), "  revocation: 1\n", "", 1))})
		f.src.Trigger()
		f.waitStatus(lowered, "flotilla/gpu-a", commitstatus.Failure, "a revocation cannot be undone")
		f.repo.Commit("main", "raise it again", map[string][]byte{"clusters/gpu-a/cluster.yaml": raised})
		f.src.Trigger()

		// The worker's administrator installs the agent with the new values file.
		stopFirst()
		f.startAgent(fresh)
		eventually(t, "gpu-a ready again with the new credential", func() (bool, string) {
			var wc v1alpha1.WorkerCluster
			if err := hub().Get(t.Context(), key, &wc); err != nil {
				return false, err.Error()
			}
			ready := condition(&wc, v1alpha1.ConditionReady)
			return ready != nil && ready.Status == metav1.ConditionTrue && wc.Annotations[v1alpha1.InvalidAnnotation] == "" && wc.Status.Credential != nil && wc.Status.Credential.Revocation == 1,
				fmt.Sprintf("Ready %+v, credential %+v, invalid %q", ready, wc.Status.Credential, wc.Annotations[v1alpha1.InvalidAnnotation])
		})
	})

	t.Run("a fleet.yaml naming another tenant is refused", func(t *testing.T) {
		fleetFile, stolen := f.edited(t, "fleet.yaml", "tenant: acme", "tenant: globex")
		bad := f.repo.Commit("main", "claim another tenant", map[string][]byte{"fleet.yaml": stolen})
		f.src.Trigger()
		f.waitStatus(bad, "flotilla/fleet", commitstatus.Failure, `names tenant "globex"`)
		var list v1alpha1.WorkerClusterList
		if err := hub().List(t.Context(), &list, client.MatchingLabels{v1alpha1.WorkerClusterLabel: fleet.Identity("globex", "gpu-a")}); err != nil || len(list.Items) != 0 {
			t.Fatalf("WorkerClusters of the other tenant: %d (%v)", len(list.Items), err)
		}
		f.repo.Commit("main", "give the tenant back", map[string][]byte{"fleet.yaml": fleetFile})
		f.src.Trigger()
		f.waitStatus(f.repo.Head("main"), "flotilla/fleet", commitstatus.Failure, "invalid")
	})

	t.Run("a restarted hub converges without posting again", func(t *testing.T) {
		head := f.statusCommit("gpu-a")
		before, err := f.notes.Read(t.Context(), head)
		if err != nil {
			t.Fatal(err)
		}
		f.restartHub()
		eventually(t, "the agent back on the new hub", func() (bool, string) { return f.tunnel.srv.Connected(v.Cluster.Identity), "" })
		f.waitStatus(head, "flotilla/gpu-a", commitstatus.Success, "ready")
		after, err := f.notes.Read(t.Context(), head)
		if err != nil {
			t.Fatal(err)
		}
		for name, e := range before.Statuses {
			if a := after.Statuses[name]; a.Count != e.Count || a.State != e.State {
				t.Errorf("%s: %d statuses (%s) before the restart, %d (%s) after", name, e.Count, e.State, a.Count, a.State)
			}
		}
	})

	t.Run("a hub upgraded from one that kept the source in annotations keeps its commit", func(t *testing.T) {
		ctx := t.Context()
		key := types.NamespacedName{Namespace: f.ns, Name: "gpu-a"}
		head := f.statusCommit("gpu-a")
		if head == f.repo.Head("main") {
			t.Fatal("gpu-a's status lives on main's head: the test cannot tell an older commit from it")
		}
		before, err := f.notes.Read(ctx, head)
		if err != nil {
			t.Fatal(err)
		}
		f.stopHub()
		// The WorkerCluster as a hub of before status.source left it.
		var wc v1alpha1.WorkerCluster
		if err := hub().Get(ctx, key, &wc); err != nil {
			t.Fatal(err)
		}
		src := wc.Source()
		old := wc.DeepCopy()
		wc.Status.Source = nil
		if err := hub().Status().Patch(ctx, &wc, client.MergeFrom(old)); err != nil {
			t.Fatal(err)
		}
		old = wc.DeepCopy()
		wc.Annotations[v1alpha1.LegacySourceCommitAnnotation] = src.Commit
		wc.Annotations[v1alpha1.LegacySourceDigestAnnotation] = src.InputsDigest
		if err := hub().Patch(ctx, &wc, client.MergeFrom(old)); err != nil {
			t.Fatal(err)
		}
		f.resumeHub()
		eventually(t, "status.source recorded again and the annotations gone", func() (bool, string) {
			var got v1alpha1.WorkerCluster
			if err := hub().Get(ctx, key, &got); err != nil {
				return false, err.Error()
			}
			_, a := got.Annotations[v1alpha1.LegacySourceCommitAnnotation]
			_, d := got.Annotations[v1alpha1.LegacySourceDigestAnnotation]
			return got.Status.Source != nil && *got.Status.Source == src && !a && !d, fmt.Sprintf("source %+v, annotations %v", got.Status.Source, got.Annotations)
		})
		f.waitStatus(head, "flotilla/gpu-a", commitstatus.Success, "ready")
		if got := f.statusOf(f.repo.Head("main"), "flotilla/gpu-a"); got.State != "" {
			t.Fatalf("the upgraded hub posted gpu-a's status on main's head, which did not change it: %+v", got)
		}
		after, err := f.notes.Read(ctx, head)
		if err != nil {
			t.Fatal(err)
		}
		if b, a := before.Statuses["flotilla/gpu-a"], after.Statuses["flotilla/gpu-a"]; a.Count != b.Count || b.Count == 0 || a.State != b.State {
			t.Errorf("gpu-a: %d statuses (%s) before the upgrade, %d (%s) after", b.Count, b.State, a.Count, a.State)
		}
	})

	t.Run("a removed cluster is decommissioned", func(t *testing.T) {
		files := readDir(t, f.dir, "clusters/gpu-a")
		rm := map[string][]byte{"clusters/gpu-b/cluster.yaml": nil}
		for p := range files {
			rm[p] = nil
		}
		removed := f.repo.Commit("main", "remove gpu-a", rm)
		f.src.Trigger()
		f.waitStatus(removed, "flotilla/gpu-a", commitstatus.Success, "decommissioned")
		eventually(t, "the WorkerCluster gone", func() (bool, string) {
			err := hub().Get(t.Context(), types.NamespacedName{Namespace: f.ns, Name: "gpu-a"}, &v1alpha1.WorkerCluster{})
			return err != nil, "still there"
		})
		var sec corev1.Secret
		if err := hub().Get(t.Context(), types.NamespacedName{Namespace: f.ns, Name: tunnel.CredentialSecretName("gpu-a")}, &sec); err == nil {
			t.Fatal("the agent's credential was not revoked")
		}
		var cqs unstructured.UnstructuredList
		cqs.SetGroupVersionKind(schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "ClusterQueueList"})
		if err := worker().List(t.Context(), &cqs, client.MatchingLabels{v1alpha1.WorkerClusterLabel: v.Cluster.Identity}); err != nil || len(cqs.Items) != 0 {
			t.Fatalf("the worker still has %d ClusterQueues of gpu-a (%v)", len(cqs.Items), err)
		}

		// Reverting the removal brings back a token that was redeemed: the tunnel would
		// refuse it without a word, so the commit says what to do.
		readded := f.repo.Commit("main", "add gpu-a back", files)
		f.src.Trigger()
		f.waitStatus(readded, "flotilla/gpu-a", commitstatus.Failure, "redeemed before; issue a new one with flotilla cluster rotate-token gpu-a")
	})
}

func TestHubFaultsAndKeptDecommission(t *testing.T) {
	f := newFleetRepo(t, "keep")
	ctx := t.Context()

	// An admission policy that refuses every WorkerCluster write in the namespace: to
	// the hub, a fault of the hub cluster's, not of the repository.
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "freeze-" + f.ns},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{v1alpha1.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"workerclusters"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "WorkerClusters are frozen in this namespace"}},
		}}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: f.ns}}}}}
	for _, o := range []client.Object{policy, binding} {
		if err := hub().Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = hub().Delete(context.Background(), o) })
	}
	probe := func() error {
		wc := &v1alpha1.WorkerCluster{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "probe"},
			Spec: v1alpha1.WorkerClusterSpec{Region: "us-east1", Residency: "us", Preset: "gpu"}}
		return hub().Create(ctx, wc, client.DryRunAll)
	}
	// Policies take effect a moment after they are written.
	eventually(t, "the policy in force", func() (bool, string) {
		err := probe()
		return err != nil && strings.Contains(err.Error(), "frozen"), fmt.Sprint(err)
	})
	v, _ := f.addCluster("main", "gpu-k")
	added := f.repo.Head("main")
	f.src.Trigger()
	t.Run("a hub fault is an error on the commit, retried without a new commit", func(t *testing.T) {
		st := f.waitStatus(added, "flotilla/gpu-k", commitstatus.Error, "hub error")
		t.Logf("error: %s", st.Description)
		// Everyone who reads the repository reads the status: the kind of fault, not
		// the hub cluster's own words.
		if !strings.Contains(st.Description, "the hub cluster refused a write; see the hub's log") || strings.Contains(st.Description, "frozen") {
			t.Errorf("the status of a hub fault is %q, want its kind without the API server's message", st.Description)
		}
		if err := hub().Delete(ctx, binding); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the policy lifted", func() (bool, string) {
			err := probe()
			return err == nil, fmt.Sprint(err)
		})
		f.src.Trigger()
		f.waitStatus(added, "flotilla/gpu-k", commitstatus.Pending, "enrollment token")
	})

	f.startAgent(v)
	f.waitStatus(added, "flotilla/gpu-k", commitstatus.Success, "ready")

	t.Run("decommission: Keep revokes the agent and leaves the worker's objects", func(t *testing.T) {
		_, keep := f.edited(t, "fleet.yaml", "decommission: Prune", "decommission: Keep")
		kept := f.repo.Commit("main", "keep what workers have", map[string][]byte{"fleet.yaml": keep})
		f.src.Trigger()
		f.waitStatus(kept, "flotilla/fleet", commitstatus.Success, "1 of 1")

		// The removal arrives with a fleet.yaml that does not validate: the policy
		// cannot be read, so nothing is decommissioned, and the fleet says why.
		broken := []byte(strings.Replace(string(keep), "decommission: Keep", "decommission: Keep\n  decommision: Prune", 1))
		change := map[string][]byte{"fleet.yaml": broken}
		for p := range readDir(t, f.dir, "clusters/gpu-k") {
			change[p] = nil
		}
		removed := f.repo.Commit("main", "hand gpu-k over, with a typo", change)
		f.src.Trigger()
		f.waitStatus(removed, "flotilla/fleet", commitstatus.Failure, "1 removal waits until the fleet validates")
		f.waitStatus(removed, "flotilla/gpu-k", commitstatus.Pending, "removal waits")
		var wc v1alpha1.WorkerCluster
		if err := hub().Get(ctx, types.NamespacedName{Namespace: f.ns, Name: "gpu-k"}, &wc); err != nil || wc.Annotations[v1alpha1.DecommissionAnnotation] != "" {
			t.Fatalf("under a broken fleet.yaml the WorkerCluster was decommissioned: %v %v", err, wc.Annotations)
		}
		if !f.tunnel.srv.Connected(v.Cluster.Identity) {
			t.Fatal("under a broken fleet.yaml the agent was revoked")
		}

		fixed := f.repo.Commit("main", "fix the typo", map[string][]byte{"fleet.yaml": keep})
		f.src.Trigger()
		f.waitStatus(fixed, "flotilla/gpu-k", commitstatus.Success, "Keep")
		eventually(t, "the WorkerCluster gone", func() (bool, string) {
			err := hub().Get(ctx, types.NamespacedName{Namespace: f.ns, Name: "gpu-k"}, &v1alpha1.WorkerCluster{})
			return err != nil, "still there"
		})
		if err := hub().Get(ctx, types.NamespacedName{Namespace: f.ns, Name: tunnel.CredentialSecretName("gpu-k")}, &corev1.Secret{}); err == nil {
			t.Fatal("the agent's credential was not revoked")
		}
		var cqs unstructured.UnstructuredList
		cqs.SetGroupVersionKind(schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "ClusterQueueList"})
		if err := worker().List(ctx, &cqs, client.MatchingLabels{v1alpha1.WorkerClusterLabel: v.Cluster.Identity}); err != nil || len(cqs.Items) == 0 {
			t.Fatalf("the worker kept %d ClusterQueues of gpu-k (%v)", len(cqs.Items), err)
		}
		// The kept objects would stand in the way of the clusters of later tests on
		// this shared worker.
		t.Cleanup(func() { deleteOwned(v.Cluster.Identity) })
	})
}

// A pull request's plan runs beside the branch: while the plan worker waits on a forge
// that does not answer, a merge still turns green, and the plan follows once the forge
// answers.
func TestPlansNeverHoldUpTheBranch(t *testing.T) {
	f := newFleetRepo(t, "plans")
	v, added := f.addCluster("main", "gpu-h")
	f.src.Trigger()
	stop := f.startAgent(v)
	defer stop()
	// The worker is shared by the package's tests: what this cluster applied would stand
	// in the way of the next one's.
	t.Cleanup(func() { deleteOwned(v.Cluster.Identity) })
	f.waitStatus(added, "flotilla/gpu-h", commitstatus.Success, "ready")

	entered, release := f.prs.hold()
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	f.repo.Branch("main", "add-gpu-i")
	_, prHead := f.addCluster("add-gpu-i", "gpu-i")
	f.repo.SetRef("refs/pull/1/head", "add-gpu-i")
	f.src.Trigger()
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("the plan worker never asked the forge for open pull requests")
	}

	_, cordoned := f.edited(t, "clusters/gpu-h/cluster.yaml", "cordoned: false", "cordoned: true")
	f.repo.Branch("main", "cordon-gpu-h")
	f.repo.Commit("cordon-gpu-h", "cordon gpu-h", map[string][]byte{"clusters/gpu-h/cluster.yaml": cordoned})
	merge := f.repo.Merge("main", "cordon-gpu-h", "Merge: cordon gpu-h")
	f.src.Trigger()
	f.waitStatus(merge, "flotilla/gpu-h", commitstatus.Success, "ready")
	// The fleet's summary on the merge follows its clusters' current statuses, not a
	// memory of what was posted: a branch protection rule on it must not wait forever.
	f.waitStatus(merge, "flotilla/fleet", commitstatus.Success, "1 of 1")
	if st := f.statusOf(prHead, "flotilla/plan"); st.State != "" {
		t.Fatalf("the held plan was posted before its forge answered: %+v", st)
	}

	released = true
	release()
	f.waitStatus(prHead, "flotilla/plan", commitstatus.Success, "+1 cluster")
}

// BenchmarkPushToSuccess is what an engineer waits for: from the push of a merged
// change to a connected cluster (a cordon toggled, so the agent has work to do) until
// the commit shows success, with a signed webhook on loopback telling the hub. It also
// reports the hub's time per reconciled cluster (one sync of that one change).
func BenchmarkPushToSuccess(b *testing.B) {
	f := newFleetRepo(b, "latency")
	v, _ := f.addCluster("main", "gpu-l")
	f.src.Trigger()
	f.startAgent(v)
	f.waitStatus(f.repo.Head("main"), "flotilla/gpu-l", commitstatus.Success, "ready")

	secret := []byte("webhook-secret-for-the-benchmark")
	wh := httptest.NewServer(gitsource.NewWebhookHandler(gitsource.WebhookOptions{Secret: secret, Trigger: func(gitsource.Forge, string) { f.src.Trigger() }}))
	defer wh.Close()
	file := filepath.Join(f.dir, "clusters", "gpu-l", "cluster.yaml")
	original, err := os.ReadFile(file)
	if err != nil {
		b.Fatal(err)
	}
	cordoned := []byte(strings.Replace(string(original), "cordoned: false", "cordoned: true", 1))
	f.syncMu.Lock()
	f.syncs, f.reconciles = nil, nil
	f.syncMu.Unlock()
	delivery := 0
	for b.Loop() {
		data := cordoned
		if delivery%2 == 1 {
			data = original
		}
		delivery++
		commit := f.repo.Commit("main", "toggle the cordon", map[string][]byte{"clusters/gpu-l/cluster.yaml": data})
		body := []byte(fmt.Sprintf(`{"ref":"refs/heads/main","after":%q}`, commit))
		mac := hmac.New(sha256.New, secret)
		mac.Write(body)
		req, _ := http.NewRequest(http.MethodPost, wh.URL, bytes.NewReader(body))
		req.Header.Set("X-GitHub-Event", "push")
		req.Header.Set("X-GitHub-Delivery", fmt.Sprintf("bench-%d", delivery))
		req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode/100 != 2 {
			b.Fatalf("webhook delivery: %v %v", resp, err)
		}
		resp.Body.Close()
		f.waitStatus(commit, "flotilla/gpu-l", commitstatus.Success, "ready")
	}
	f.syncMu.Lock()
	mean := func(ds []time.Duration) float64 {
		var total time.Duration
		for _, d := range ds {
			total += d
		}
		return float64(total.Microseconds()) / float64(max(len(ds), 1)) / 1000
	}
	// A sync is the fetch, the reconcile and the commit statuses posted; the reconcile
	// alone is what each changed cluster costs the hub.
	b.ReportMetric(mean(f.syncs), "ms-sync")
	b.ReportMetric(mean(f.reconciles), "ms-reconcile/cluster")
	f.syncMu.Unlock()
}

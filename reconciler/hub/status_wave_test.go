package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"filippo.io/age"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/github"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/plan"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/forge"
	"github.com/flotilla-gitops/flotilla/test/forge/githubtest"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/poll"
	"github.com/flotilla-gitops/flotilla/test/sopstest"
)

// waveHub is a hub on the real hub cluster, following a fleet repository on the git
// server and posting its statuses to a GitHub test server.
type waveHub struct {
	t      *testing.T
	hub    *Hub
	src    *Source
	status *conditions.Writer
	ns     string
	repo   *gitserver.Repo
	forge  *githubtest.Server
	files  map[string][]byte // the fleet at main's head
	ids    *secrets.Identities
	// stalling is the repository's server the hub fetches from, when it stalls some
	// fetches (waveOptions.stall).
	stalling *gitserver.Stalling
	// stop stops the hub; the test's cleanup does too.
	stop func()
}

const wavePublicURL = "https://hub.example"

// waveOptions shape a waveHub.
type waveOptions struct {
	clusters, threshold int
	// writes, when set, is the client the WorkerClusters' status is written through.
	writes client.Client
	// staleAfter is the hub's StaleAfter; zero keeps its default.
	staleAfter time.Duration
	// restarts, when set, is a stopped hub whose namespace, repository and forge the
	// new one takes over: the same hub, restarted.
	restarts *waveHub
	// fetchTimeout is the hub's FetchTimeout; zero keeps its default.
	fetchTimeout time.Duration
	// stall, when set, has the repository's server stall the fetches it says to stall.
	stall func(request []byte) bool
	// calls, when set, stands between the hub and its tunnel and the hub cluster's API
	// server.
	calls *interceptor.Funcs
	// dispatch has the hub keep the tenant's Kueue objects (reconciler/dispatch), in the
	// hub namespaces hubNamespaces, which the hub's configuration gives the tenant.
	dispatch      bool
	hubNamespaces []string
}

func startWaveHub(t *testing.T, clusters, threshold int) *waveHub {
	t.Helper()
	return startWave(t, waveOptions{clusters: clusters, threshold: threshold})
}

// startWaveHubWriting is startWaveHub with the WorkerClusters' status written through
// writes.
func startWaveHubWriting(t *testing.T, clusters, threshold int, writes client.Client) *waveHub {
	t.Helper()
	return startWave(t, waveOptions{clusters: clusters, threshold: threshold, writes: writes})
}

func startWave(t *testing.T, o waveOptions) *waveHub {
	t.Helper()
	c := planes[0].Client
	if o.writes == nil {
		o.writes = c
	}
	w := o.restarts
	if w == nil {
		w = newWaveFleet(t, o.clusters)
	}
	w = &waveHub{t: t, ns: w.ns, repo: w.repo, forge: w.forge, files: w.files, ids: w.ids}
	if o.calls != nil {
		plain, err := client.NewWithWatch(planes[0].Config, client.Options{Scheme: c.Scheme()})
		if err != nil {
			t.Fatal(err)
		}
		c = interceptor.NewClient(plain, *o.calls)
	}
	status := conditions.NewWriter(o.writes)
	tun, err := tunnel.New(tunnel.Options{Client: c, Status: status, AllowInsecureLoopback: true})
	if err != nil {
		t.Fatal(err)
	}
	var disp Dispatcher
	if o.dispatch {
		d, err := dispatch.New(dispatch.Options{Client: c, Tokens: tun, ProxyURL: "https://127.0.0.1:9443", ProxyPath: tunnel.ProxyURL,
			Trust: func() []byte { return []byte("the proxy's CA") }, Status: status})
		if err != nil {
			tun.Close()
			t.Fatal(err)
		}
		disp = d
	}
	h, err := New(Options{Client: c, Decryptor: secrets.NewDecryptor(secrets.DecryptorOptions{Identities: w.ids}), Tunnel: tun, Status: status, Dispatch: disp,
		Plans: plan.NewStore(0), PublicURL: wavePublicURL, Log: slog.New(slog.DiscardHandler), StaleAfter: o.staleAfter, FetchTimeout: o.fetchTimeout})
	if err != nil {
		tun.Close()
		t.Fatal(err)
	}
	backend, err := github.New(github.Options{BaseURL: w.forge.URL, Owner: w.forge.Owner, Repo: w.forge.Repo, Token: w.forge.Token})
	if err != nil {
		tun.Close()
		t.Fatal(err)
	}
	gitURL := w.repo.URL()
	if o.stall != nil {
		w.stalling = w.repo.Stall(t, o.stall)
		gitURL = w.stalling.URL
	}
	src, err := h.AddSource(SourceOptions{Name: "fleet", Git: gitsource.Options{URL: gitURL, Branch: "main"}, Tenant: "example", Namespace: w.ns,
		HubNamespaces: o.hubNamespaces, Statuses: backend, Poll: time.Hour, SummaryThreshold: o.threshold})
	if err != nil {
		tun.Close()
		t.Fatal(err)
	}
	// The summary's count moves with every cluster; a test waits for its last form.
	src.book.every = 100 * time.Millisecond
	w.hub, w.src, w.status = h, src, status
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { src.Run(runCtx); close(done) }()
	var stopOnce sync.Once
	w.stop = func() { stopOnce.Do(func() { cancel(); <-done; tun.Close() }) }
	t.Cleanup(w.stop)
	return w
}

// newWaveFleet makes a namespace, a fleet of clusters whose enrollment files a new age
// key opens, its repository on the git server and a GitHub test server that knows its
// head: all a waveHub needs but the hub.
func newWaveFleet(t *testing.T, clusters int) *waveHub {
	t.Helper()
	ctx := t.Context()
	ns := "wave-" + forge.RandomHex(4)
	if err := planes[0].Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	id := sopstest.NewIdentity(t)
	dir := t.TempDir()
	cfg := sopstest.WriteConfig(t, dir, sopstest.Rule{PathRegex: sopstest.EnrollmentPathRegex, EncryptedRegex: "^token$", Age: []*age.X25519Identity{id}})
	token, err := secrets.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	enrollment, err := secrets.EncryptEnrollment(cfg, filepath.Join(dir, "clusters", "x", fleet.EnrollmentFile), token)
	if err != nil {
		t.Fatal(err)
	}
	fsys := fleetgen.Fleet(clusters, fleetgen.Options{})
	files := map[string][]byte{}
	for p, f := range fsys {
		files[p] = f.Data
		if path.Base(p) == fleet.EnrollmentFile {
			files[p] = enrollment
		}
	}
	repo := gitserver.Start(t).NewRepo(t, "fleet", writeFiles(t, files))
	ids, err := secrets.NewIdentities(id)
	if err != nil {
		t.Fatal(err)
	}
	srv := githubtest.Start(t)
	// A budget that a test does not wait on, stated on every answer as GitHub's is.
	srv.SetRateLimit(100_000, time.Minute)
	srv.AddCommit(repo.Head("main"))
	return &waveHub{t: t, ns: ns, repo: repo, forge: srv, files: files, ids: ids}
}

func writeFiles(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for p, data := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// stored is the WorkerCluster named key as the hub cluster holds it.
func (w *waveHub) stored(key client.ObjectKey) *v1alpha1.WorkerCluster {
	w.t.Helper()
	var wc v1alpha1.WorkerCluster
	if err := planes[0].Client.Get(w.t.Context(), key, &wc); err != nil {
		w.t.Fatal(err)
	}
	return &wc
}

// desiredRecorded waits until the hub recorded the desired state of the WorkerCluster
// named key.
func (w *waveHub) desiredRecorded(key client.ObjectKey) {
	w.t.Helper()
	poll.Until(w.t, "the cluster's desired state recorded", func() (bool, string) {
		var wc v1alpha1.WorkerCluster
		if err := planes[0].Client.Get(w.t.Context(), key, &wc); err != nil {
			return false, err.Error()
		}
		return wc.Status.DesiredHash != "", fmt.Sprintf("%+v", wc.Status)
	})
}

// commit commits changes on branch, registers the commit with the forge and returns it.
func (w *waveHub) commit(branch, msg string, changes map[string][]byte) string {
	sha := w.repo.Commit(branch, msg, changes)
	w.forge.AddCommit(sha)
	if branch == "main" {
		maps.Copy(w.files, changes)
	}
	return sha
}

// edit is the file p of main's head with old replaced by new.
func (w *waveHub) edit(p, old, new string) []byte {
	w.t.Helper()
	s := string(w.files[p])
	if !strings.Contains(s, old) {
		w.t.Fatalf("%s has no %q", p, old)
	}
	return []byte(strings.Replace(s, old, new, 1))
}

// settled waits until the forge shows the fleet's summary on commit as want says and
// the publisher has nothing left to post, and returns the contexts the commit holds.
func (w *waveHub) settled(commit string, want func(commitstatus.Status) bool) map[string]forge.Record {
	w.t.Helper()
	var got map[string]forge.Record
	poll.Until(w.t, "the statuses of "+commit[:12], func() (bool, string) {
		got = map[string]forge.Record{}
		for _, r := range w.forge.Store.Latest(commit) {
			got[r.Context] = r
		}
		f := got["flotilla/fleet"]
		ok := want(commitstatus.Status{Context: f.Context, State: commitstatus.State(f.State), Description: f.Description, TargetURL: f.TargetURL})
		return ok && w.src.publisher.Pending() == 0, fmt.Sprintf("fleet %s %q; %d contexts; %d to post", f.State, f.Description, len(got), w.src.publisher.Pending())
	})
	return got
}

func (w *waveHub) page(commit, suffix string) (int, string) {
	rec := httptest.NewRecorder()
	w.hub.CommitPages().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, CommitPath("fleet", commit)+suffix, nil))
	body, _ := io.ReadAll(rec.Body)
	return rec.Code, string(body)
}

// A change to more clusters than the threshold posts a status only for the clusters that
// fail, beside the fleet's summary, which links to a page of every cluster; a change to
// one cluster posts its status; a pull request's plan is posted whatever it touches.
func TestAWaveOverTheThresholdPostsOnlyItsFailuresAndTheSummary(t *testing.T) {
	const clusters, threshold = 8, 3
	w := startWaveHub(t, clusters, threshold)
	first := w.repo.Head("main")

	t.Run("the first read touches every cluster and posts the summary alone", func(t *testing.T) {
		got := w.settled(first, func(st commitstatus.Status) bool { return strings.Contains(st.Description, "0 of 8 clusters ready") })
		if len(got) != 1 {
			t.Fatalf("the first head holds %v, want the fleet's summary alone: no cluster fails", slices.Sorted(maps.Keys(got)))
		}
	})

	// A fleet-wide change that breaks two clusters, and a pull request that touches
	// every cluster.
	broken := []string{fleetgen.ClusterName(1), fleetgen.ClusterName(6)}
	changes := map[string][]byte{fleet.FleetFile: w.edit(fleet.FleetFile, "    - ml-training\n", "    - ml-training\n    - ml-eval\n")}
	for _, name := range broken {
		p := path.Join(fleet.ClustersDir, name, fleet.ClusterFile)
		changes[p] = w.edit(p, "residency: ", "residency: moon-")
	}
	w.repo.Branch("main", "wide")
	prHead := w.commit("wide", "every cluster gets a priority class", map[string][]byte{fleet.FleetFile: w.edit(fleet.FleetFile, "    - ml-training\n", "    - ml-training\n    - ml-batch\n")})
	w.repo.SetRef("refs/pull/1/head", "wide")
	firstSummaries := w.forge.Store.Count(first, "flotilla/fleet")
	wave := w.commit("main", "a second workload namespace everywhere", changes)
	w.src.Trigger()

	t.Run("a wave posts its failures and the summary, which links to the commit's page", func(t *testing.T) {
		got := w.settled(wave, func(st commitstatus.Status) bool { return strings.Contains(st.Description, "2 failing") })
		// The wave's states are no summary of the head before it, which keeps its own.
		if n := w.forge.Store.Count(first, "flotilla/fleet"); n != firstSummaries {
			var last forge.Record
			for _, r := range w.forge.Store.Latest(first) {
				if r.Context == "flotilla/fleet" {
					last = r
				}
			}
			t.Errorf("the wave's sync posted %d summaries on the head before it, the last %s %q", n-firstSummaries, last.State, last.Description)
		}
		want := []string{"flotilla/fleet", "flotilla/" + broken[0], "flotilla/" + broken[1]}
		if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, want) {
			t.Fatalf("the wave's commit holds %v, want %v", keys, want)
		}
		for _, name := range broken {
			if st := got["flotilla/"+name]; st.State != "failure" {
				t.Errorf("%s is %s %q, want failure", name, st.State, st.Description)
			}
		}
		f := got["flotilla/fleet"]
		if f.State != "failure" || !strings.Contains(f.Description, "0 of 8 clusters ready, 2 failing") {
			t.Errorf("the summary is %s %q", f.State, f.Description)
		}
		if want := wavePublicURL + CommitPath("fleet", wave); f.TargetURL != want {
			t.Errorf("the summary links to %q, want %q", f.TargetURL, want)
		}
	})

	t.Run("the commit's page lists every cluster", func(t *testing.T) {
		code, body := w.page(wave, ".json")
		if code != http.StatusOK {
			t.Fatalf("GET the page: %d %s", code, body)
		}
		var p CommitPage
		if err := json.Unmarshal([]byte(body), &p); err != nil {
			t.Fatal(err)
		}
		if len(p.Clusters) != clusters || p.Counts[commitstatus.Failure] != 2 || p.Counts[commitstatus.Pending] != clusters-2 {
			t.Fatalf("the page lists %d clusters, %v; want %d, 2 failing", len(p.Clusters), p.Counts, clusters)
		}
		if p.Clusters[0].State != commitstatus.Failure || p.Clusters[1].State != commitstatus.Failure {
			t.Errorf("the page does not list the failures first: %+v", p.Clusters[:2])
		}
		code, html := w.page(wave, "")
		if code != http.StatusOK {
			t.Fatalf("GET the page: %d", code)
		}
		for i := range clusters {
			if !strings.Contains(html, fleetgen.ClusterName(i)) {
				t.Errorf("the page does not list %s", fleetgen.ClusterName(i))
			}
		}
	})

	t.Run("the pull request's plan is posted whatever it touches", func(t *testing.T) {
		poll.Until(t, "the plan of the pull request", func() (bool, string) {
			got := w.forge.Store.Latest(prHead)
			return len(got) == 1 && got[0].Context == "flotilla/plan", fmt.Sprintf("%v", got)
		})
		got := w.forge.Store.Latest(prHead)[0]
		if got.State != "success" || !strings.HasPrefix(got.TargetURL, wavePublicURL+plan.PathPrefix) {
			t.Errorf("the plan is %s %q linking to %q", got.State, got.Description, got.TargetURL)
		}
	})

	t.Run("a change to one cluster posts its status", func(t *testing.T) {
		name := fleetgen.ClusterName(3)
		p := path.Join(fleet.ClustersDir, name, fleet.ClusterFile)
		one := w.commit("main", "cordon one", map[string][]byte{p: w.edit(p, "cordoned: false", "cordoned: true")})
		w.src.Trigger()
		got := w.settled(one, func(st commitstatus.Status) bool { return st.State != "" })
		if _, ok := got["flotilla/"+name]; !ok || len(got) != 2 {
			t.Fatalf("the commit holds %v, want the fleet's summary and %s", slices.Sorted(maps.Keys(got)), name)
		}
	})

	t.Run("a push of several commits puts each cluster's status on the newest commit that touched it", func(t *testing.T) {
		a, b := fleetgen.ClusterName(4), fleetgen.ClusterName(5)
		pa, pb := path.Join(fleet.ClustersDir, a, fleet.ClusterFile), path.Join(fleet.ClustersDir, b, fleet.ClusterFile)
		touchedFirst := w.commit("main", "cordon a", map[string][]byte{pa: w.edit(pa, "cordoned: false", "cordoned: true")})
		touchedB := w.commit("main", "cordon b", map[string][]byte{pb: w.edit(pb, "cordoned: false", "cordoned: true")})
		touchedA := w.commit("main", "more memory on a", map[string][]byte{pa: w.edit(pa, "memory: ", "memory: 1")})
		head := w.commit("main", "docs", map[string][]byte{"README.md": []byte("nothing the hub reads\n")})
		w.src.Trigger()
		w.settled(head, func(st commitstatus.Status) bool { return st.State != "" })
		for _, want := range []struct{ commit, cluster string }{{touchedA, a}, {touchedB, b}} {
			poll.Until(t, want.cluster+"'s status on "+want.commit[:12], func() (bool, string) {
				got := w.forge.Store.Latest(want.commit)
				return len(got) == 1 && got[0].Context == "flotilla/"+want.cluster, fmt.Sprint(got)
			})
		}
		for _, r := range w.forge.Store.Latest(head) {
			if r.Context != "flotilla/fleet" {
				t.Errorf("the head, which touched no cluster, holds %s", r.Context)
			}
		}
		if got := w.forge.Store.Latest(touchedFirst); len(got) != 0 {
			t.Errorf("the commit a newer one superseded holds %v", got)
		}
	})

	t.Run("a page of a commit the hub does not keep is not found", func(t *testing.T) {
		if code, _ := w.page(strings.Repeat("0", 40), ""); code != http.StatusNotFound {
			t.Errorf("GET an unknown commit's page: %d, want 404", code)
		}
		if code, _ := w.page("main", ""); code != http.StatusBadRequest {
			t.Errorf("GET a page by branch name: %d, want 400", code)
		}
	})
}

// A head whose fleet.yaml does not decode, or names another tenant, fails under the
// status context prefix of the last head that stated one: the repository's required
// checks wait for those contexts, and a failure under the default's would never reach
// them.
func TestABrokenFleetFileFailsUnderThePrefixTheFleetStatedLast(t *testing.T) {
	w := startWaveHub(t, 2, 0)
	summary := func(commit, context string, want commitstatus.State) {
		t.Helper()
		poll.Until(t, context+" on "+commit[:12], func() (bool, string) {
			got := map[string]forge.Record{}
			for _, r := range w.forge.Store.Latest(commit) {
				got[r.Context] = r
			}
			r, ok := got[context]
			return ok && (want == "" || r.State == string(want)), fmt.Sprintf("%v", slices.Sorted(maps.Keys(got)))
		})
		for _, r := range w.forge.Store.Latest(commit) {
			if strings.HasPrefix(r.Context, "flotilla/") {
				t.Errorf("%s holds %s (%s %q), under the default prefix", commit[:12], r.Context, r.State, r.Description)
			}
		}
	}
	renamed := w.commit("main", "our checks are acme's", map[string][]byte{fleet.FleetFile: w.edit(fleet.FleetFile, "statusContextPrefix: flotilla", "statusContextPrefix: acme")})
	w.src.Trigger()
	summary(renamed, "acme/fleet", "") // no agent is connected: pending

	for _, tc := range []struct {
		name  string
		edits *strings.Replacer
	}{
		{"a fleet.yaml that does not decode", strings.NewReplacer("tenant: example", "tenant: [example")},
		{"a fleet.yaml of another tenant, with its prefix", strings.NewReplacer("tenant: example", "tenant: other", "statusContextPrefix: acme", "statusContextPrefix: other")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Each from the head that stated acme's prefix.
			broken := w.repo.Commit("main", tc.name, map[string][]byte{fleet.FleetFile: []byte(tc.edits.Replace(string(w.files[fleet.FleetFile])))})
			w.forge.AddCommit(broken)
			w.src.Trigger()
			summary(broken, "acme/fleet", commitstatus.Failure)
		})
	}
}

// A cluster the hub failed to reconcile shows the fault on the commit that changed it,
// and, retried on the next sync, what became of it on that same commit: not on the
// next head, which did not touch it.
func TestARetriedClusterIsPostedOnTheCommitThatChangedIt(t *testing.T) {
	x, y := fleetgen.ClusterName(0), fleetgen.ClusterName(1)
	var refuse atomic.Bool
	w := startWave(t, waveOptions{clusters: 2, threshold: DefaultSummaryThreshold, calls: &interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if _, ok := obj.(*v1alpha1.WorkerCluster); ok && obj.GetName() == x && refuse.Load() {
				return apierrors.NewForbidden(schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "workerclusters"}, x, errors.New("an admission policy said no"))
			}
			return c.Update(ctx, obj, opts...)
		}}})
	w.desiredRecorded(client.ObjectKey{Namespace: w.ns, Name: x})
	latest := func(commit, name string) (forge.Record, bool) {
		for _, r := range w.forge.Store.Latest(commit) {
			if r.Context == "flotilla/"+name {
				return r, true
			}
		}
		return forge.Record{}, false
	}
	cordon := func(name string) string {
		file := fleet.ClustersDir + "/" + name + "/" + fleet.ClusterFile
		return w.commit("main", "cordon "+name, map[string][]byte{file: w.edit(file, "cordoned: false", "cordoned: true")})
	}

	refuse.Store(true)
	changed := cordon(x)
	w.src.Trigger()
	poll.Until(t, "the fault on "+x+"'s commit", func() (bool, string) {
		r, _ := latest(changed, x)
		return r.State == "error", fmt.Sprintf("%s %q", r.State, r.Description)
	})

	refuse.Store(false)
	next := cordon(y)
	w.src.Trigger()
	poll.Until(t, x+"'s retry on its commit", func() (bool, string) {
		r, _ := latest(changed, x)
		_, posted := latest(next, y)
		return r.State != "error" && posted, fmt.Sprintf("%s %q; %s posted on the next head: %v", r.State, r.Description, y, posted)
	})
	if r, ok := latest(next, x); ok {
		t.Errorf("the next head, which did not touch %s, holds its status %s %q", x, r.State, r.Description)
	}
}

// A hub upgraded from one that recorded each cluster's source with the digest of every
// preset's files keeps each cluster's commit: the head, which did not change the cluster,
// does not take its status.
func TestAClusterRecordedWithTheFormerDigestKeepsItsCommitThroughAnUpgrade(t *testing.T) {
	x, y := fleetgen.ClusterName(0), fleetgen.ClusterName(1)
	w := startWaveHub(t, 2, DefaultSummaryThreshold)
	key := client.ObjectKey{Namespace: w.ns, Name: x}
	w.desiredRecorded(key)
	first := w.stored(key).SourceCommit()
	file := fleet.ClustersDir + "/" + y + "/" + fleet.ClusterFile
	head := w.commit("main", "cordon "+y, map[string][]byte{file: w.edit(file, "cordoned: false", "cordoned: true")})
	w.src.Trigger()
	poll.Until(t, "the head synced", func() (bool, string) {
		w.src.mu.Lock()
		defer w.src.mu.Unlock()
		return w.src.head == head, w.src.head
	})
	w.stop()

	// x as the hub before the upgrade recorded it.
	fsys := fstest.MapFS{}
	for p, data := range w.files {
		fsys[p] = &fstest.MapFile{Data: data}
	}
	f := fleet.Load(fsys)
	former := filesDigest(f, f.Clusters[x])
	wc := w.stored(key)
	if wc.SourceCommit() != first || first == head {
		t.Fatalf("%s's source is %s before the upgrade, want %s, not the head", x, wc.SourceCommit(), first)
	}
	patch := client.MergeFrom(wc.DeepCopy())
	wc.Status.Source.InputsDigest = former
	if err := planes[0].Client.Status().Patch(t.Context(), wc, patch); err != nil {
		t.Fatal(err)
	}

	upgraded := startWave(t, waveOptions{threshold: DefaultSummaryThreshold, restarts: w})
	poll.Until(t, "the upgraded hub's first sync", func() (bool, string) {
		upgraded.src.mu.Lock()
		defer upgraded.src.mu.Unlock()
		return upgraded.src.head == head, upgraded.src.head
	})
	if got := w.stored(key).Status.Source; got.Commit != first || got.InputsDigest != former {
		t.Fatalf("after the upgrade %s's source is %+v, want commit %s with the former digest", x, got, first)
	}
}

// A push of a commit that changes every cluster followed by one that changes one shows
// the fleet's summary on both: the statuses of the first commit's clusters are summarized
// on it, and without a summary it would show nothing of them.
func TestAPushsFleetWideCommitBelowItsHeadShowsTheSummaryToo(t *testing.T) {
	const clusters, threshold = 8, 3
	w := startWaveHub(t, clusters, threshold)
	w.settled(w.repo.Head("main"), func(st commitstatus.Status) bool { return st.State != "" })
	wide := w.commit("main", "a second workload namespace everywhere", map[string][]byte{fleet.FleetFile: w.edit(fleet.FleetFile, "    - ml-training\n", "    - ml-training\n    - ml-eval\n")})
	file := fleet.ClustersDir + "/" + fleetgen.ClusterName(2) + "/" + fleet.ClusterFile
	head := w.commit("main", "cordon one cluster", map[string][]byte{file: w.edit(file, "cordoned: false", "cordoned: true")})
	w.src.Trigger()
	w.settled(head, func(st commitstatus.Status) bool { return strings.Contains(st.Description, "of 8 clusters") })
	got := w.settled(wide, func(st commitstatus.Status) bool { return strings.Contains(st.Description, "of 8 clusters") })
	if want := wavePublicURL + CommitPath("fleet", wide); got["flotilla/fleet"].TargetURL != want {
		t.Errorf("the fleet-wide commit's summary links to %q, want its page %q", got["flotilla/fleet"].TargetURL, want)
	}
	if _, ok := got["flotilla/"+fleetgen.ClusterName(2)]; ok {
		t.Errorf("the fleet-wide commit holds the status of %s, which the head changed after it", fleetgen.ClusterName(2))
	}

	// A push whose fleet-wide commit breaks fleet.yaml: that commit shows why nothing
	// of the push was applied, as the head does.
	wide = w.commit("main", "a typo", map[string][]byte{fleet.FleetFile: w.edit(fleet.FleetFile, "tenant: example", "tenant: [example")})
	file = fleet.ClustersDir + "/" + fleetgen.ClusterName(3) + "/" + fleet.ClusterFile
	head = w.commit("main", "cordon another cluster", map[string][]byte{file: w.edit(file, "cordoned: false", "cordoned: true")})
	w.src.Trigger()
	w.settled(head, func(st commitstatus.Status) bool { return st.State == commitstatus.Failure })
	w.settled(wide, func(st commitstatus.Status) bool {
		return st.State == commitstatus.Failure && strings.Contains(st.Description, fleet.FleetFile)
	})
}

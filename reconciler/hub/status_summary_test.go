package hub

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitnotes"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/hubcache"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// The fleet's summary against every order of events.
//
// A commit's <prefix>/fleet context is derived from its clusters' statuses, which move
// with merges, the agents' reports, refreshes and the posts of the publisher, each in
// its own goroutine. Whatever order they come in, once they stop the summary must come
// to say what the clusters' own statuses say. Each seed plays a two-cluster fleet's
// events in an order of its own, on the hub as cmd/flotilla-hub builds it (an informer
// cache behind the status writer, the real tunnel, the real publisher posting git
// notes), and then waits for the summary to agree. A seed fixes the order of the events,
// not how the hub's goroutines run between them: a seed that failed once may pass the
// next time, and its events are printed with the failure.

// summarySeeds is how many orders of events make test plays. FLOTILLA_SUMMARY_SEEDS
// asks for another number, FLOTILLA_SUMMARY_SEED for one seed alone.
const summarySeeds = 50

// summaryInterval is the least time between two derivations of the summary, and
// between two posts of it that keep its state, in this test: the source's summary
// interval.
const summaryInterval = summaryCoalesce

// summaryAgreement is how long the summary has to agree with the clusters once the
// events stopped: a generous multiple of the summary's interval, what the hub needs to
// post a few statuses on a loaded machine, not a measure of its speed.
const summaryAgreement = 200 * summaryInterval

// summaryPoll is the hub's poll in this test: a summary follows its clusters within
// one poll at the latest, and the deadline holds several.
const summaryPoll = summaryAgreement / 8

func TestTheFleetSummaryAgreesWithItsClustersWhateverOrderEventsComeIn(t *testing.T) {
	for _, seed := range seedsToPlay(t) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			newInterleaving(t, seed).play()
		})
	}
}

// A summary the forge refused, with an error the publisher does not retry, is derived
// and submitted again at the next poll, though no cluster changed since: the commit
// would otherwise show the count before it until a cluster's next change, which may
// never come.
func TestASummaryTheForgeRefusedIsPostedAgainWithinAPoll(t *testing.T) {
	x := newInterleaving(t, 0)
	x.enroll()
	head := x.repo.Head("main")
	poll.Within(t, summaryAgreement, "both clusters ready", func() (bool, string) { return x.agrees(head) })

	// Every post of the summary is refused until the hub has refreshed the cluster whose
	// agent left, derived the summary that counts it, and has nothing left to do.
	x.posts.refuseNext(math.MaxInt)
	x.disconnect(x.names[1], false)
	poll.Until(t, "the new summary refused, and the hub idle", func() (bool, string) {
		p, _ := x.src.book.snapshot(head)
		derived := p.fleet != nil && strings.HasPrefix(p.fleet.Description, "1 of 2 clusters ready")
		refused, pending, queued, asked := x.posts.refusedSummaries(), x.src.publisher.Pending(), x.src.queue.Len(), len(x.src.summary.c())
		refreshing := true
		if unlock, ok := x.src.refreshLocks.TryLock(x.names[1]); ok {
			unlock()
			refreshing = false
		}
		return derived && refused > 0 && pending == 0 && queued == 0 && asked == 0 && !refreshing,
			fmt.Sprintf("derived: %t; %d refused; %d to post; %d to refresh, refreshing: %t; summary asked for: %d", derived, refused, pending, queued, refreshing, asked)
	})
	x.posts.refuseNext(0)
	// Nothing changes from now on but the hub's polls, which the deadline holds several of.
	poll.Within(t, summaryAgreement, "the summary counting the cluster whose agent left", func() (bool, string) { return x.agrees(head) })
}

// seedsToPlay are the seeds the environment asks for, 1 to summarySeeds by default.
func seedsToPlay(t *testing.T) []uint64 {
	t.Helper()
	if v := os.Getenv("FLOTILLA_SUMMARY_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("FLOTILLA_SUMMARY_SEED=%q is not a seed", v)
		}
		return []uint64{seed}
	}
	n := summarySeeds
	if v := os.Getenv("FLOTILLA_SUMMARY_SEEDS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("FLOTILLA_SUMMARY_SEEDS=%q is not a number of seeds", v)
		}
	}
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = uint64(i + 1)
	}
	return seeds
}

// interleaving is one seed's fleet, hub and agents.
type interleaving struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand
	ctx  context.Context

	ns     string
	repo   *gitserver.Repo
	files  map[string][]byte
	names  []string
	src    *Source
	status *conditions.Writer
	agents *agentsOnline
	posts  *heldPosts
	// reads are the hub cluster's answers to the status writer's reads.
	reads *heldReads
	// notes reads the statuses as anyone reading the repository's notes does.
	notes *gitnotes.Backend

	// events are what happened, in order, for the failure's message.
	mu     sync.Mutex
	events []string
	// sent are the desired states each cluster's agent was sent, oldest first.
	sent map[string][]*protocol.DesiredState
	// eager are the clusters whose agents acknowledge each desired state as it comes,
	// while the hub's sync that pushed it goes on, as a real agent on a quiet worker
	// does.
	eager map[string]bool
	// branches counts the branches merged.
	branches int
	// recording counts the agents' reports being recorded in the background.
	recording int
}

func newInterleaving(t *testing.T, seed uint64) *interleaving {
	t.Helper()
	w := newWaveFleet(t, 2)
	x := &interleaving{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x5eed)), ctx: t.Context(),
		ns: w.ns, repo: w.repo, files: w.files, names: []string{fleetgen.ClusterName(0), fleetgen.ClusterName(1)},
		sent: map[string][]*protocol.DesiredState{}, eager: map[string]bool{}}
	for _, name := range x.names {
		x.eager[name] = x.rng.IntN(2) == 0
	}

	runCtx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	t.Cleanup(func() { cancel(); running.Wait() })
	// Before the hub stops, so that no report outlives the test.
	t.Cleanup(func() { x.reportsRecorded() })
	c := planes[0].Client
	cached, err := hubcache.Start(runCtx, planes[0].Config, c.Scheme(), []string{w.ns})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := client.NewWithWatch(planes[0].Config, client.Options{Scheme: c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	x.reads = &heldReads{}
	x.status = conditions.NewWriterWith(interceptor.NewClient(plain, interceptor.Funcs{Get: x.reads.get}), conditions.WriterOptions{Reader: cached})
	tun, err := tunnel.New(tunnel.Options{Client: c, Reader: cached, IdentityIndexed: true, Status: x.status, AllowInsecureLoopback: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tun.Close)
	x.agents = &agentsOnline{Server: tun, online: map[string]bool{}}
	x.agents.pushed = func(identity string, ds *protocol.DesiredState) {
		for _, name := range x.names {
			if x.identity(name) == identity && x.eager[name] {
				x.acknowledge(name, ds, true)
			}
		}
	}
	backend, err := gitnotes.New(gitnotes.Options{URL: w.repo.URL()})
	if err != nil {
		t.Fatal(err)
	}
	x.posts = newHeldPosts(backend)
	if x.notes, err = gitnotes.New(gitnotes.Options{URL: w.repo.URL()}); err != nil {
		t.Fatal(err)
	}
	h, err := New(Options{Client: c, Reader: cached, Decryptor: secrets.NewDecryptor(secrets.DecryptorOptions{Identities: w.ids}), Tunnel: x.agents, Status: x.status,
		PublicURL: wavePublicURL, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	x.src, err = h.AddSource(SourceOptions{Name: "fleet", Git: gitsource.Options{URL: w.repo.URL(), Branch: "main"}, Tenant: "example", Namespace: w.ns,
		Statuses: x.posts, Poll: summaryPoll})
	if err != nil {
		t.Fatal(err)
	}
	x.src.book.every = summaryInterval
	running.Go(func() { x.src.Run(runCtx) })
	return x
}

// agentsOnline is the hub's tunnel, but for whether an agent is connected, which the
// test says: its agents report through the status writer as the tunnel's sessions do,
// without a connection of their own. pushed, when set, hears of each desired state
// pushed to a connected agent.
type agentsOnline struct {
	*tunnel.Server
	mu     sync.Mutex
	online map[string]bool // by identity
	pushed func(identity string, ds *protocol.DesiredState)
}

func (a *agentsOnline) Connected(identity string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.online[identity]
}

func (a *agentsOnline) Push(key client.ObjectKey, identity string, ds *protocol.DesiredState) bool {
	a.Server.Push(key, identity, ds)
	a.mu.Lock()
	online, pushed := a.online[identity], a.pushed
	a.mu.Unlock()
	if online && pushed != nil {
		pushed(identity, ds)
	}
	return online
}

func (a *agentsOnline) set(identity string, online bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.online[identity] = online
}

// heldPosts is a status backend whose posts wait while the test holds them: newer
// statuses are then derived and submitted while older ones are on their way. It
// refuses the fleet's summary when the test says so, as a forge that answers an error
// the publisher does not retry.
type heldPosts struct {
	commitstatus.Backend
	mu   sync.Mutex
	open chan struct{}
	// refuse is how many of the next posts of the summary are refused, refused how
	// many were.
	refuse, refused int
}

func newHeldPosts(b commitstatus.Backend) *heldPosts {
	open := make(chan struct{})
	close(open)
	return &heldPosts{Backend: b, open: open}
}

func (h *heldPosts) Set(ctx context.Context, commit string, st commitstatus.Status) error {
	h.mu.Lock()
	open := h.open
	h.mu.Unlock()
	select {
	case <-open:
	case <-ctx.Done():
		return ctx.Err()
	}
	h.mu.Lock()
	refuse := h.refuse > 0 && st.Context == "flotilla/"+fleetContext
	if refuse {
		h.refuse--
		h.refused++
	}
	h.mu.Unlock()
	if refuse {
		return fmt.Errorf("the forge refused %s on %s: 422 Unprocessable Entity", st.Context, commit)
	}
	return h.Backend.Set(ctx, commit, st)
}

// refuseNext has the next n posts of the summary refused, none for 0.
func (h *heldPosts) refuseNext(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refuse = n
}

// refusedSummaries is how many posts of the summary were refused.
func (h *heldPosts) refusedSummaries() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.refused
}

// hold has the posts wait, and reports whether they went until now.
func (h *heldPosts) hold() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.open:
		h.open = make(chan struct{})
		return true
	default:
		return false
	}
}

func (h *heldPosts) held() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.open:
		return false
	default:
		return true
	}
}

// release lets the posts go, and reports whether they were held.
func (h *heldPosts) release() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.open:
		return false
	default:
		close(h.open)
		return true
	}
}

// heldReads are the answers to a client's reads of WorkerClusters, which wait while the
// test holds them, as a loaded API server's do. The read is made at once: an answer
// held across a write tells of the state before it.
type heldReads struct {
	mu   sync.Mutex
	gate chan struct{} // nil while answers go at once
}

func (h *heldReads) get(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := c.Get(ctx, key, obj, opts...)
	if _, ok := obj.(*v1alpha1.WorkerCluster); !ok {
		return err
	}
	h.mu.Lock()
	gate := h.gate
	h.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	return err
}

func (h *heldReads) hold() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gate != nil {
		return false
	}
	h.gate = make(chan struct{})
	return true
}

func (h *heldReads) release() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gate == nil {
		return false
	}
	close(h.gate)
	h.gate = nil
	return true
}

func (h *heldReads) held() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gate != nil
}

func (x *interleaving) key(name string) client.ObjectKey {
	return client.ObjectKey{Namespace: x.ns, Name: name}
}

func (x *interleaving) identity(name string) string { return fleet.Identity("example", name) }

func (x *interleaving) logf(format string, args ...any) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.events = append(x.events, fmt.Sprintf(format, args...))
}

// play enrolls both clusters' agents, plays the seed's events, and waits for the
// summary to agree with the clusters.
func (x *interleaving) play() {
	t := x.t
	x.enroll()
	for range 8 + x.rng.IntN(12) {
		x.event()
	}

	// The events end as a demo's do: the newest commit synced, and the agents, connected,
	// acknowledging what they were sent last, most of them.
	if x.posts.release() {
		x.logf("posts released")
	}
	x.releaseReads()
	x.reportsRecorded()
	x.poll()
	final := x.repo.Head("main")
	x.waitForSync(final)
	for _, i := range x.rng.Perm(len(x.names)) {
		name, acks, async := x.names[i], x.rng.IntN(8) > 0, x.rng.IntN(2) == 0
		if !x.agents.Connected(x.identity(name)) {
			x.connect(name, async)
		}
		if acks {
			x.apply(name, 1, async)
		}
	}
	x.reportsRecorded()

	x.mu.Lock()
	events := strings.Join(x.events, "\n  ")
	x.mu.Unlock()
	poll.Within(t, summaryAgreement, fmt.Sprintf("seed %d (FLOTILLA_SUMMARY_SEED=%[1]d plays it alone), after these events:\n  %s\nthe fleet's summary on %s agreeing with its clusters",
		x.seed, events, final[:12]),
		func() (bool, string) { return x.agrees(final) })
}

// enroll waits for the hub's first sync, and has both clusters' agents redeem their
// tokens, connect and apply what they were sent.
func (x *interleaving) enroll() {
	for _, name := range x.names {
		key := x.key(name)
		poll.Until(x.t, name+"'s desired state recorded", func() (bool, string) {
			var wc v1alpha1.WorkerCluster
			if err := planes[0].Client.Get(x.ctx, key, &wc); err != nil {
				return false, err.Error()
			}
			return wc.Status.DesiredHash != "", fmt.Sprintf("%+v", wc.Status)
		})
		var wc v1alpha1.WorkerCluster
		if err := planes[0].Client.Get(x.ctx, key, &wc); err != nil {
			x.t.Fatal(err)
		}
		// What the tunnel records of an agent that redeemed its token.
		now := time.Now()
		if _, err := x.status.Record(x.ctx, key, conditions.Redeemed{TokenHash: wc.Spec.EnrollmentTokenHash, At: now, Credential: "sha256:credential", ExpiresAt: now.Add(90 * 24 * time.Hour)}); err != nil {
			x.t.Fatal(err)
		}
		x.connect(name, false)
		x.apply(name, 1, false)
		x.inventory(name, 0, false)
	}
}

// event plays one event the seed draws. Every draw is made whatever the fleet's state, so
// that a seed plays the same events on every run.
func (x *interleaving) event() {
	kind, name, which, async := x.rng.IntN(24), x.names[x.rng.IntN(len(x.names))], x.rng.Float64(), x.rng.IntN(2) == 0
	// A report that waits on a held answer must not hold the test's events up.
	async = async || x.reads.held()
	switch {
	case kind < 3:
		x.merge(which)
	case kind < 5:
		x.poll()
	case kind < 9:
		x.apply(name, 1, async)
	case kind < 10:
		x.apply(name, which, async)
	case kind < 12:
		x.inventory(name, which, async)
	case kind < 13:
		x.connect(name, async)
	case kind < 14:
		x.disconnect(name, async)
	case kind < 16:
		x.logf("refresh %s", name)
		x.src.queue.Add(name)
	case kind < 17:
		if x.posts.hold() {
			x.logf("posts held")
		}
	case kind < 18:
		if x.posts.release() {
			x.logf("posts released")
		}
	case kind < 19:
		x.waitForSync(x.repo.Head("main"))
	case kind < 20:
		x.settle()
	case kind < 21:
		if x.reads.hold() {
			x.logf("the hub cluster's answers to the status writer's reads held")
		}
	case kind < 22:
		x.releaseReads()
	case kind < 23:
		x.logf("the forge refuses the next post of the summary")
		x.posts.refuseNext(1)
	default:
		x.annotate(name, which)
	}
}

// merge changes one cluster or both, cordoning or uncordoning them: through a branch
// merged into main, as the demo does, or as commits pushed to main, one per cluster.
// Half the merges are fetched at once, as a webhook has it.
func (x *interleaving) merge(which float64) {
	x.branches++
	toggle := func(names ...string) map[string][]byte {
		changes := map[string][]byte{}
		for _, name := range names {
			p := fleet.ClustersDir + "/" + name + "/" + fleet.ClusterFile
			s := string(x.files[p])
			if strings.Contains(s, "cordoned: false") {
				s = strings.Replace(s, "cordoned: false", "cordoned: true", 1)
			} else {
				s = strings.Replace(s, "cordoned: true", "cordoned: false", 1)
			}
			changes[p] = []byte(s)
			x.files[p] = []byte(s)
		}
		return changes
	}
	var head, what string
	switch n := int(which * 8); {
	case n < 3:
		name := x.names[n%2]
		branch := fmt.Sprintf("change-%d", x.branches)
		x.repo.Commit(branch, "toggle "+name, toggle(name))
		head, what = x.repo.Merge("main", branch, "merge "+branch), "a merge that toggles "+name+"'s cordon"
	case n < 5:
		branch := fmt.Sprintf("change-%d", x.branches)
		x.repo.Commit(branch, "toggle both", toggle(x.names...))
		head, what = x.repo.Merge("main", branch, "merge "+branch), "a merge that toggles both cordons"
	default:
		x.repo.Commit("main", "toggle "+x.names[0], toggle(x.names[0]))
		head, what = x.repo.Commit("main", "toggle "+x.names[1], toggle(x.names[1])), "two commits on main, one per cluster"
	}
	x.logf("%s: %s", what, head[:12])
	if int(which*16)%2 == 0 {
		x.poll()
	}
}

// poll asks the hub to fetch, as its poll or a webhook does.
func (x *interleaving) poll() {
	x.logf("fetch")
	x.src.Trigger()
}

// report records facts about name's agent as the tunnel's session does, in the
// background when async is set: a report then races what comes after it.
func (x *interleaving) report(name string, async bool, what string, facts ...conditions.Fact) {
	if async {
		what += " (in the background)"
	}
	x.logf("%s", what)
	record := func() {
		// As the session does, the agent goes on: the writer keeps the facts it could
		// not write.
		if _, err := x.status.RecordOrRetry(x.ctx, x.ctx, x.key(name), time.Second, facts...); err != nil {
			x.logf("%s: not recorded yet: %v", what, err)
		}
	}
	if !async {
		record()
		return
	}
	x.mu.Lock()
	x.recording++
	x.mu.Unlock()
	go func() {
		defer func() {
			x.mu.Lock()
			x.recording--
			x.mu.Unlock()
		}()
		record()
	}()
}

// reportsRecorded waits until no report is being recorded in the background.
func (x *interleaving) reportsRecorded() {
	poll.Until(x.t, "the agents' reports recorded", func() (bool, string) {
		x.mu.Lock()
		defer x.mu.Unlock()
		return x.recording == 0, fmt.Sprintf("%d being recorded", x.recording)
	})
}

func (x *interleaving) connect(name string, async bool) {
	x.agents.set(x.identity(name), true)
	x.report(name, async, name+"'s agent connects",
		conditions.Connected{At: time.Now(), AgentVersion: "test", KubernetesVersion: "v1.37.0", Protocol: protocol.ProtocolVersion})
}

func (x *interleaving) disconnect(name string, async bool) {
	x.agents.set(x.identity(name), false)
	x.report(name, async, name+"'s agent hangs up", conditions.Disconnected{At: time.Now(), Cause: conditions.HungUp})
}

// apply has name's agent report applying a desired state it was sent: the one the hub
// pushed last when which is 1, an older one it was sent before otherwise, as a report
// that crossed the hub's next push does.
func (x *interleaving) apply(name string, which float64, async bool) {
	if ds := x.agents.Desired(x.identity(name)); ds != nil {
		x.received(name, ds)
	}
	x.mu.Lock()
	sent := x.sent[name]
	x.mu.Unlock()
	if len(sent) == 0 {
		x.logf("%s's agent was sent nothing yet", name)
		return
	}
	x.acknowledge(name, sent[min(int(which*float64(len(sent))), len(sent)-1)], async)
}

// received notes that name's agent holds ds.
func (x *interleaving) received(name string, ds *protocol.DesiredState) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if sent := x.sent[name]; len(sent) == 0 || sent[len(sent)-1] != ds {
		x.sent[name] = append(sent, ds)
	}
}

// acknowledge has name's agent report applying ds whole.
func (x *interleaving) acknowledge(name string, ds *protocol.DesiredState, async bool) {
	x.received(name, ds)
	a := &protocol.Applied{Generation: ds.Generation, Hash: ds.Hash}
	for _, o := range ds.Objects {
		a.Results = append(a.Results, protocol.ObjectResult{Kind: "object", Name: fmt.Sprintf("%d bytes", len(o)), Action: protocol.ActionConfigured})
	}
	x.report(name, async, fmt.Sprintf("%s's agent applied generation %d (%s)", name, ds.Generation, ds.Hash[:12]), conditions.Applied{Report: a, Sent: ds.Hash})
}

func (x *interleaving) inventory(name string, which float64, async bool) {
	gpus := int64(8 * (1 + int(which*4)))
	inv := &protocol.Inventory{Totals: []protocol.ProductTotal{{Product: "NVIDIA-H100-80GB-HBM3", GPUs: gpus, Nodes: int(gpus / 8)}}}
	x.report(name, async, fmt.Sprintf("%s's agent reports %d GPUs", name, gpus), conditions.Inventory{Report: inv})
}

// annotate has an operator annotate name's WorkerCluster by hand: a write the status
// writer does not make, which the hub's cache shows before the writer knows of it.
func (x *interleaving) annotate(name string, which float64) {
	x.logf("an operator annotates %s", name)
	wc := &v1alpha1.WorkerCluster{ObjectMeta: metav1.ObjectMeta{Namespace: x.ns, Name: name}}
	note := fmt.Sprintf(`{"metadata":{"annotations":{"example.com/note":"%d"}}}`, int(which*1000))
	if err := planes[0].Client.Patch(x.ctx, wc, client.RawPatch(types.MergePatchType, []byte(note))); err != nil {
		x.t.Fatal(err)
	}
}

func (x *interleaving) releaseReads() {
	if x.reads.release() {
		x.logf("the hub cluster's answers released")
	}
}

// waitForSync waits until the hub applied commit.
func (x *interleaving) waitForSync(commit string) {
	x.releaseReads()
	x.logf("wait for the hub to apply %s", commit[:12])
	x.src.Trigger()
	poll.Until(x.t, "the hub applying "+commit[:12], func() (bool, string) {
		x.src.mu.Lock()
		defer x.src.mu.Unlock()
		return x.src.head == commit, "the head is " + x.src.head
	})
}

// settle waits until the publisher has posted everything submitted, unless the posts are
// held.
func (x *interleaving) settle() {
	if x.posts.held() {
		return
	}
	x.logf("wait for the posts to go")
	poll.Until(x.t, "the posts gone", func() (bool, string) {
		n := x.src.publisher.Pending()
		return n == 0, fmt.Sprintf("%d to post", n)
	})
}

// agrees reports whether every cluster's own status shows what its WorkerCluster says,
// on the commit its state comes from, and the summary on head counts them as they show,
// with nothing left to post; why not, otherwise.
func (x *interleaving) agrees(head string) (bool, string) {
	x.src.mu.Lock()
	synced := x.src.head
	x.src.mu.Unlock()
	if synced != head {
		return false, "the hub's head is " + synced
	}
	var states []commitstatus.State
	var shown []string
	for _, name := range x.names {
		var wc v1alpha1.WorkerCluster
		if err := planes[0].Client.Get(x.ctx, x.key(name), &wc); err != nil {
			return false, err.Error()
		}
		ctxName := "flotilla/" + name
		want := conditions.CommitStatus(ctxName, &wc)
		commit := wc.Status.Source.Commit
		got, err := x.notes.Latest(x.ctx, commit)
		if err != nil {
			return false, err.Error()
		}
		if st := got[ctxName]; st.State != want.State || st.Description != want.Description {
			return false, fmt.Sprintf("%s shows %s %q on %s, its WorkerCluster says %s %q", name, st.State, st.Description, commit[:12], want.State, want.Description)
		}
		states = append(states, want.State)
		shown = append(shown, fmt.Sprintf("%s %s on %s", name, want.State, commit[:12]))
	}
	state, counts := summaryOf(states)
	got, err := x.notes.Latest(x.ctx, head)
	if err != nil {
		return false, err.Error()
	}
	f := got["flotilla/fleet"]
	if f.State != state || !strings.HasPrefix(f.Description, counts) {
		return false, fmt.Sprintf("the summary is %s %q where the clusters show %s", f.State, f.Description, strings.Join(shown, ", "))
	}
	if n := x.src.publisher.Pending(); n > 0 {
		return false, fmt.Sprintf("%d statuses to post", n)
	}
	return true, ""
}

// summaryOf is what a fleet's summary says of clusters showing states: success when
// every one is ready, failure when the others fail, pending while any is on its way.
func summaryOf(states []commitstatus.State) (commitstatus.State, string) {
	ready, failing := 0, 0
	for _, st := range states {
		switch st {
		case commitstatus.Success:
			ready++
		case commitstatus.Failure, commitstatus.Error:
			failing++
		}
	}
	counts := fmt.Sprintf("%d of %d clusters ready", ready, len(states))
	if failing > 0 {
		counts += fmt.Sprintf(", %d failing", failing)
	}
	switch {
	case ready == len(states):
		return commitstatus.Success, counts
	case ready+failing == len(states):
		return commitstatus.Failure, counts
	}
	return commitstatus.Pending, counts
}

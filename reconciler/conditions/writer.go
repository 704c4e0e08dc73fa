package conditions

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/keylock"
)

// Writer writes WorkerClusters' status: it records facts, derives the conditions and
// patches the status subresource, and tells those who asked which statuses changed.
// It is safe for concurrent use.
//
// With a Reader (the hub's informer cache), a record starts from the cached
// WorkerCluster, so that a fact that changes nothing costs the hub cluster no request
// at all. The cache may be behind the Writer's own last write: a record started from
// it would derive from a status gone by, and skip the write that a revert needs. The
// Writer writes every status, and learns of every other write of the WorkerClusters
// the hub makes (Observe), so it knows what a cache that caught up shows: per
// WorkerCluster, a digest of it as last stored, and for a short while the stored copy
// itself. A record starts from the cached copy when it is that one, from the stored
// copy while the cache catches up, and reads the API server otherwise (a hand's edit
// since, or a copy forgotten). A write that conflicts is retried on the API server's
// copy.
//
// Those who publish the status (the hub's commit statuses) read it with View, which
// shows the records under way: a record tells them as it leaves, so that what an agent
// reported reaches them without waiting for the hub's request budget.
type Writer struct {
	client client.Client
	reader client.Reader
	now    func() time.Time
	log    *slog.Logger

	mu      sync.Mutex
	changed []func(client.ObjectKey)
	// known is each WorkerCluster as last stored: one small entry per WorkerCluster,
	// dropped with it.
	known map[client.ObjectKey]*stored
	// young are the entries that hold a copy, oldest first, for dropping the copies.
	young []youngCopy
	// deferred are facts waiting for their WorkerCluster's next write (Defer).
	deferred map[client.ObjectKey]*deferredFacts
	// recording are the facts of the records under way, until the API server has
	// stored them or refused: View shows them meanwhile.
	recording map[client.ObjectKey][]Fact
	// queued are the facts of records waiting for their WorkerCluster's lock, oldest
	// first: View shows them after those under way.
	queued map[client.ObjectKey][]*queuedFacts
	// wanted are the WorkerClusters whose derivation RecordIfIdle left to the holder of
	// their lock, which tells OnChange when it lets go.
	wanted map[client.ObjectKey]bool
	// writing keeps the records, deferrals and reads of one WorkerCluster apart, so
	// that deferred facts a write took are never missing from what a read shows, and
	// never written after facts recorded later.
	writing keylock.Locks[client.ObjectKey]
}

// lock holds the WorkerCluster named key for one record, deferral or read, and tells
// OnChange, when it lets go, if RecordIfIdle found it held meanwhile.
func (w *Writer) lock(key client.ObjectKey) (unlock func()) {
	return w.after(key, w.writing.Lock(key))
}

func (w *Writer) after(key client.ObjectKey, unlock func()) func() {
	return func() {
		unlock()
		w.mu.Lock()
		wanted := w.wanted[key]
		delete(w.wanted, key)
		w.mu.Unlock()
		if wanted {
			w.notify(key)
		}
	}
}

// deferredFacts wait for the next write of a WorkerCluster's status, or for their
// timer. ctx is the context they were deferred under: a hub that stopped meanwhile
// takes its facts with it, and the next one derives them again.
type deferredFacts struct {
	facts  []Fact
	within time.Duration
	ctx    context.Context
	timer  *time.Timer
}

// stored is what the Writer knows of a WorkerCluster as the API server last stored it.
type stored struct {
	digest uint64
	// copy is the WorkerCluster, kept until the cache shows it, or keepCopy has passed.
	copy *v1alpha1.WorkerCluster
	at   time.Time
}

type youngCopy struct {
	key client.ObjectKey
	at  time.Time
}

// keepCopy is how long the Writer keeps a stored copy for a cache that has not caught
// up with it: an informer is milliseconds behind, and one further behind is read
// through.
const keepCopy = 30 * time.Second

// WriterOptions configure a Writer.
type WriterOptions struct {
	// Now is the time conditions are judged at: a credential's lifetime runs out by it.
	// Defaults to time.Now.
	Now func() time.Time
	// Reader, when set, is where a record first reads the WorkerCluster: an informer
	// cache of them. Nil reads the client.
	Reader client.Reader
	// Log is where deferred facts that could not be written are told of.
	Log *slog.Logger
}

// NewWriter writes through c.
func NewWriter(c client.Client) *Writer { return NewWriterWith(c, WriterOptions{}) }

// NewWriterWith writes through c with opts.
func NewWriterWith(c client.Client, opts WriterOptions) *Writer {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Writer{client: c, reader: opts.Reader, now: opts.Now, log: opts.Log,
		known: map[client.ObjectKey]*stored{}, deferred: map[client.ObjectKey]*deferredFacts{},
		recording: map[client.ObjectKey][]Fact{}, queued: map[client.ObjectKey][]*queuedFacts{}, wanted: map[client.ObjectKey]bool{}}
}

// queuedFacts are the facts of one record waiting for its WorkerCluster's lock.
type queuedFacts struct{ facts []Fact }

// OnChange has f called, synchronously, with the key of each WorkerCluster whose status
// the Writer changes: once a record that changes it is on its way to the API server,
// which View then shows, and again once the API server stored it or refused. f should
// hand the work on rather than do it.
func (w *Writer) OnChange(f func(client.ObjectKey)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.changed = append(w.changed, f)
}

// Record records facts on the WorkerCluster's current status and derives the rest,
// retrying on conflicts with other writes of the WorkerCluster; with no facts it only
// derives, for a spec that moved on or a credential whose lifetime moved into its last
// third or past its end. Facts deferred for the WorkerCluster are recorded first, in
// the same write. Nothing is written when nothing changed. It returns the
// WorkerCluster as stored afterwards.
func (w *Writer) Record(ctx context.Context, key client.ObjectKey, facts ...Fact) (*v1alpha1.WorkerCluster, error) {
	return w.recordLocked(ctx, key, facts, nil)
}

// RecordOrRetry is Record for facts the caller learns only once, such as an agent's
// report or Kueue's judgement of a worker. When the hub cluster refuses their write for
// a reason that can pass (anything but a WorkerCluster gone or facts it finds invalid),
// they wait as deferred facts, shown by View, before the WorkerCluster's lock is let
// go: they go with its next write, under the facts recorded after them, or on their
// own every interval, until stored or life ends. When facts are deferred for it
// already, they join those and go at their pace. Without that, one refused write would
// leave the status behind the truth until the next fact came, which may be never. It
// returns Record's error.
func (w *Writer) RecordOrRetry(ctx, life context.Context, key client.ObjectKey, every time.Duration, facts ...Fact) (*v1alpha1.WorkerCluster, error) {
	return w.recordLocked(ctx, key, facts, &retrying{life: life, every: every})
}

// retrying is how a record keeps its own facts when the hub cluster refused them.
type retrying struct {
	life  context.Context
	every time.Duration
}

// recordLocked takes the WorkerCluster's lock and records facts, keeping them as again
// says when the hub cluster refused them, if again is not nil.
func (w *Writer) recordLocked(ctx context.Context, key client.ObjectKey, facts []Fact, again *retrying) (*v1alpha1.WorkerCluster, error) {
	unlock, q := w.lockToRecord(key, facts)
	defer unlock()
	wc, err := w.record(ctx, key, w.takeDeferred(key, facts, q), facts, again)
	if err != nil {
		return nil, fmt.Errorf("recording the status of WorkerCluster %s: %w", key, err)
	}
	return wc, nil
}

// lockToRecord holds the WorkerCluster named key for a record of facts. When another
// write holds it, most often one waiting for the hub's request budget (deferred facts
// whose wait ran out, in a fleet-wide change), the facts are queued, shown (View) and
// told of while the record waits: an agent's acknowledgement then reaches its commit
// status at once, not a minute later. The record takes q off the queue.
func (w *Writer) lockToRecord(key client.ObjectKey, facts []Fact) (unlock func(), q *queuedFacts) {
	if unlock, ok := w.writing.TryLock(key); ok {
		return w.after(key, unlock), nil
	}
	if len(facts) > 0 {
		q = &queuedFacts{facts: facts}
		w.mu.Lock()
		w.queued[key] = append(w.queued[key], q)
		w.mu.Unlock()
		w.notify(key)
	}
	return w.after(key, w.writing.Lock(key)), q
}

// RecordIfIdle is Record with no facts, for a WorkerCluster nobody holds: it derives,
// and writes what changed. When someone holds it (a record waiting for the hub's
// request budget, most often), it returns at once and leaves the derivation to them:
// OnChange is told when they let go, and the caller, asked again, derives then. So a
// refresh never waits behind another's write.
func (w *Writer) RecordIfIdle(ctx context.Context, key client.ObjectKey) error {
	// Wanted before trying: a holder that lets go in between tells, where the other
	// order could lose the request.
	w.mu.Lock()
	w.wanted[key] = true
	w.mu.Unlock()
	unlock, ok := w.writing.TryLock(key)
	if !ok {
		return nil
	}
	w.mu.Lock()
	delete(w.wanted, key)
	w.mu.Unlock()
	defer w.after(key, unlock)()
	if _, err := w.record(ctx, key, w.takeDeferred(key, nil, nil), nil, nil); err != nil {
		return fmt.Errorf("recording the status of WorkerCluster %s: %w", key, err)
	}
	return nil
}

// record records the deferred facts, then facts. Deferred facts that could not be
// written wait again, unless their WorkerCluster is gone, and so do facts, after them,
// when again says so. The caller holds key's lock, and took the deferred facts with
// takeDeferred, which shows them and facts as under way until record ends.
func (w *Writer) record(ctx context.Context, key client.ObjectKey, deferred *deferredFacts, facts []Fact, again *retrying) (*v1alpha1.WorkerCluster, error) {
	own := facts
	if deferred != nil {
		facts = append(slices.Clip(deferred.facts), facts...)
	}
	var wc *v1alpha1.WorkerCluster
	changed, first, told := false, true, false
	// Whoever waits on the status (a commit status, the fleet's summary) hears of the
	// change as it leaves, not once the API server has stored it: with thousands of
	// agents acknowledging a fleet-wide change, the hub's writes queue behind its
	// request budget for minutes, while the facts are known now.
	tell := func() {
		if !told {
			told = true
			w.notify(key)
		}
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		// A conflict means the copy was behind: the retries read the API server.
		var err error
		if wc, err = w.read(ctx, key, first); err != nil {
			return err
		}
		first = false
		changed, err = w.write(ctx, wc, facts, tell)
		return err
	})
	if err != nil {
		if deferred != nil && !apierrors.IsNotFound(err) {
			w.deferAgain(key, deferred)
		}
		if again != nil && len(own) > 0 && mayPass(err) {
			w.keep(key, own, again)
		}
		w.endRecording(key)
		if told || len(facts) > 0 {
			// What View showed is not stored: those who read it read again.
			w.notify(key)
		}
		return nil, err
	}
	w.endRecording(key)
	if changed {
		w.notify(key)
	}
	return wc, nil
}

// endRecording ends what takeDeferred began: the record's facts are stored, or wait
// again as deferred ones, or were refused.
func (w *Writer) endRecording(key client.ObjectKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.recording, key)
}

// Defer records facts with the next write of the WorkerCluster's status, whatever
// makes it, or on their own once within has passed. The hub defers the desired state
// it sends an agent: the agent's acknowledgement comes within moments, and one write
// then records both, where two would double what a change to every cluster costs
// the hub cluster. Until they are written, Get shows them. Defer reports whether they
// change the status; facts that change nothing are dropped.
func (w *Writer) Defer(ctx context.Context, key client.ObjectKey, within time.Duration, facts ...Fact) (bool, error) {
	defer w.lock(key)()
	wc, err := w.get(ctx, key)
	if err != nil {
		return false, fmt.Errorf("deferring facts about WorkerCluster %s: %w", key, err)
	}
	if !w.apply(wc.DeepCopy(), facts) {
		return false, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.addDeferred(ctx, key, facts, within)
	return true, nil
}

// addDeferred puts facts after those deferred for the WorkerCluster named key, or
// defers them on their own, for as long as ctx lasts, written once within has passed
// unless a write takes them first. The caller holds w.mu.
func (w *Writer) addDeferred(ctx context.Context, key client.ObjectKey, facts []Fact, within time.Duration) {
	d := w.deferred[key]
	if d == nil {
		d = &deferredFacts{within: within, ctx: ctx}
		w.deferred[key] = d
		d.timer = time.AfterFunc(within, func() { w.flush(key, d) })
	}
	// Clipped: a record under way may hold the facts deferred before.
	d.facts = append(slices.Clip(d.facts), facts...)
}

// flushTimeout bounds the write of deferred facts whose time came.
const flushTimeout = time.Minute

// flush writes d, the deferred facts of the WorkerCluster named key, on their own.
func (w *Writer) flush(key client.ObjectKey, d *deferredFacts) {
	defer w.lock(key)()
	w.mu.Lock()
	current := w.deferred[key] == d
	w.mu.Unlock()
	if !current {
		return // written with another write meanwhile
	}
	w.takeDeferred(key, nil, nil)
	if d.ctx.Err() != nil {
		w.endRecording(key)
		return // deferred by a hub that stopped
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), flushTimeout)
	defer cancel()
	if _, err := w.record(ctx, key, d, nil, nil); err != nil && !apierrors.IsNotFound(err) {
		w.log.Error("recording deferred facts; trying again", "workerCluster", key, "in", d.within, "error", err)
	}
}

// takeDeferred takes the facts deferred for the WorkerCluster named key, if any, for
// a record of them and facts, and shows them as under way (View) from the same
// instant, so that no read in between misses them; facts leave the queue, q, in that
// instant too. The record ends that.
func (w *Writer) takeDeferred(key client.ObjectKey, facts []Fact, q *queuedFacts) *deferredFacts {
	w.mu.Lock()
	defer w.mu.Unlock()
	if q != nil {
		w.queued[key] = slices.DeleteFunc(w.queued[key], func(o *queuedFacts) bool { return o == q })
		if len(w.queued[key]) == 0 {
			delete(w.queued, key)
		}
	}
	d := w.deferred[key]
	if d == nil {
		w.recording[key] = facts
		return nil
	}
	d.timer.Stop()
	delete(w.deferred, key)
	w.recording[key] = append(slices.Clip(d.facts), facts...)
	return d
}

// deferAgain puts back deferred facts that could not be written, before any deferred
// since, to be tried again after their delay.
func (w *Writer) deferAgain(key client.ObjectKey, d *deferredFacts) {
	if d.ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if later := w.deferred[key]; later != nil {
		later.facts = append(slices.Clip(d.facts), later.facts...)
		return
	}
	w.deferred[key] = d
	d.timer = time.AfterFunc(d.within, func() { w.flush(key, d) })
}

// keep defers facts whose record failed, after those deferred already, or on their own
// as again says. The caller holds key's lock: no record can come between the failed
// one and this, so facts recorded later always go over them.
func (w *Writer) keep(key client.ObjectKey, facts []Fact, again *retrying) {
	if again.life.Err() != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.addDeferred(again.life, key, facts, again.every)
}

// mayPass reports whether a write refused with err may be taken later: not when the
// WorkerCluster is gone, nor when the API server found what it was sent wrong, which
// would only make every later write of the WorkerCluster fail as well.
func mayPass(err error) bool {
	return !apierrors.IsNotFound(err) && !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) && !apierrors.IsRequestEntityTooLargeError(err)
}

// View is the WorkerCluster named key as it will be stored: as last stored, with the
// facts of the record under way, of those waiting their turn and those deferred
// recorded, derived now. Unlike Get it
// never waits for a write: a commit status posted from it is not held up by the hub
// cluster's request budget. A record under way that changes the status tells OnChange
// as it starts, and again when it ends.
func (w *Writer) View(ctx context.Context, key client.ObjectKey) (*v1alpha1.WorkerCluster, error) {
	// The facts are taken before the stored copy is read, so that a record ending in
	// between is never missed: its facts go on a copy that holds them already. Should a
	// later record also be stored in between, its copy shows them over its own for a
	// moment; that record tells OnChange as it ends, and the next View is right.
	w.mu.Lock()
	facts := slices.Clone(w.recording[key])
	for _, q := range w.queued[key] {
		facts = append(facts, q.facts...)
	}
	if d := w.deferred[key]; d != nil {
		facts = append(facts, d.facts...)
	}
	w.mu.Unlock()
	wc, err := w.readFor(ctx, key, true, true)
	if err != nil {
		return nil, err
	}
	w.apply(wc, facts)
	return wc, nil
}

// Get is the WorkerCluster named key as last stored, with the facts deferred for it
// recorded: from the Reader when it caught up with what the Writer knows, else from
// what the Writer knows or the API server.
func (w *Writer) Get(ctx context.Context, key client.ObjectKey) (*v1alpha1.WorkerCluster, error) {
	defer w.lock(key)()
	return w.get(ctx, key)
}

// get is Get for a caller that holds key's lock.
func (w *Writer) get(ctx context.Context, key client.ObjectKey) (*v1alpha1.WorkerCluster, error) {
	wc, err := w.read(ctx, key, true)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	var facts []Fact
	if d := w.deferred[key]; d != nil {
		facts = slices.Clone(d.facts)
	}
	w.mu.Unlock()
	if len(facts) > 0 {
		w.apply(wc, facts)
	}
	return wc, nil
}

// read is the WorkerCluster named key: as Get does when cached is set, else from the
// API server.
func (w *Writer) read(ctx context.Context, key client.ObjectKey, cached bool) (*v1alpha1.WorkerCluster, error) {
	return w.readFor(ctx, key, cached, false)
}

// readFor is read, for View when view is set: View takes no lock, so a record of key
// may be under way meanwhile.
func (w *Writer) readFor(ctx context.Context, key client.ObjectKey, cached, view bool) (*v1alpha1.WorkerCluster, error) {
	if cached && w.reader != nil {
		wc := new(v1alpha1.WorkerCluster)
		err := w.reader.Get(ctx, key, wc)
		w.mu.Lock()
		k := w.known[key]
		_, recording := w.recording[key]
		switch {
		case err == nil && k == nil:
			// Nothing stored since the Writer started: the cache, synced at the start,
			// is as new as anything the Writer could know.
			w.mu.Unlock()
			return wc, nil
		case err == nil && digest(wc) == k.digest:
			k.copy = nil
			w.mu.Unlock()
			return wc, nil
		case k != nil && k.copy != nil && w.now().Sub(k.at) < keepCopy:
			// The cache is behind (or does not have it yet, just created).
			out := k.copy.DeepCopy()
			w.mu.Unlock()
			return out, nil
		case err == nil && view && recording:
			// That record's write can reach the cache before its answer reaches the
			// Writer, which then knows only the state before, which the cache had
			// shown. View lays the record's facts over what it reads either way.
			w.mu.Unlock()
			return wc, nil
		}
		w.mu.Unlock()
	}
	wc := new(v1alpha1.WorkerCluster)
	err := w.client.Get(ctx, key, wc)
	if apierrors.IsNotFound(err) {
		w.Forget(key)
	}
	if err != nil {
		return nil, err
	}
	w.Observe(wc)
	return wc, nil
}

// Observe learns that wc is the WorkerCluster as the API server stored it, written or
// read by another part of the process: the hub's reconciler, which writes the labels,
// annotations and spec, tells the Writer of each write, so that the Writer can tell a
// cache that caught up from one that did not.
func (w *Writer) Observe(wc *v1alpha1.WorkerCluster) {
	d, cp := digest(wc), wc.DeepCopy()
	key := client.ObjectKeyFromObject(wc)
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.known[key] = &stored{digest: d, copy: cp, at: now}
	w.young = append(w.young, youngCopy{key: key, at: now})
	// Copies the cache never caught up with, or that nothing read since, go after
	// keepCopy: their digest stays.
	drop := 0
	for _, y := range w.young {
		if now.Sub(y.at) < keepCopy {
			break
		}
		if k := w.known[y.key]; k != nil && !k.at.After(y.at) {
			k.copy = nil
		}
		drop++
	}
	w.young = w.young[drop:]
}

// Forget drops what the Writer knows of the WorkerCluster named key, which was
// deleted, and the facts deferred for it.
func (w *Writer) Forget(key client.ObjectKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.known, key)
	if d := w.deferred[key]; d != nil {
		d.timer.Stop()
		delete(w.deferred, key)
	}
}

// digest tells two WorkerClusters' labels, annotations, spec and status apart.
// encoding/json writes a struct's fields in order and a map's keys sorted, so equal
// ones give equal digests.
func digest(wc *v1alpha1.WorkerCluster) uint64 {
	h := fnv.New64a()
	e := json.NewEncoder(h)
	_ = e.Encode(wc.Labels)
	_ = e.Encode(wc.Annotations)
	_ = e.Encode(&wc.Spec)
	_ = e.Encode(&wc.Status)
	return h.Sum64()
}

// Claim records facts on wc exactly as the caller read it, and fails with a conflict if
// the stored WorkerCluster has moved on: a redemption claims a one-shot token this way,
// so that of two racing only one succeeds. On success wc is the stored WorkerCluster;
// on failure it is left as it was.
func (w *Writer) Claim(ctx context.Context, wc *v1alpha1.WorkerCluster, facts ...Fact) error {
	next := wc.DeepCopy()
	// A claim may lose its race: nobody hears of it before it is stored.
	changed, err := w.write(ctx, next, facts, nil)
	if err != nil {
		return err
	}
	*wc = *next
	if changed {
		w.notify(client.ObjectKeyFromObject(wc))
	}
	return nil
}

// write records facts on wc, derives, and patches the status when it changed, with an
// optimistic lock on wc's resourceVersion; leaving, when not nil, is called before the
// patch is sent.
func (w *Writer) write(ctx context.Context, wc *v1alpha1.WorkerCluster, facts []Fact, leaving func()) (bool, error) {
	before := wc.DeepCopy()
	// Resync acknowledgements and inventories mostly repeat what is stored; with
	// thousands of agents, writing them anyway would be a steady load for nothing.
	if !w.apply(wc, facts) {
		return false, nil
	}
	if leaving != nil {
		leaving()
	}
	patch := client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
	if err := w.client.Status().Patch(ctx, wc, patch); err != nil {
		return true, err
	}
	// The patch's answer is the stored WorkerCluster: what a cache must show to be
	// current.
	w.Observe(wc)
	return true, nil
}

// apply records facts on wc and derives the rest, and reports whether its status
// changed.
func (w *Writer) apply(wc *v1alpha1.WorkerCluster, facts []Fact) bool {
	before := wc.Status.DeepCopy()
	for _, f := range facts {
		f.record(wc)
	}
	Derive(wc, w.now())
	return !equality.Semantic.DeepEqual(*before, wc.Status)
}

func (w *Writer) notify(key client.ObjectKey) {
	w.mu.Lock()
	fs := w.changed
	w.mu.Unlock()
	for _, f := range fs {
		f(key)
	}
}

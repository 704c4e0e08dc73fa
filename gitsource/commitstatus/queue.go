package commitstatus

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"
)

// Submission says how a queued status is posted.
type Submission struct {
	Lane Lane
	// FailuresOnly posts the status only if it is failing (failure or error), or if the
	// commit already holds a status of its context, which is then kept current: how a
	// change to many clusters shows each of them, beside a summary.
	FailuresOnly bool
	// Every, when positive, is the least time between two posts of the context on the
	// commit that keep its state: a summary whose count moves with every cluster's
	// report is posted at most once per Every, its newest form always, and a change of
	// state at once. Every stretches as the commit's statuses of the context near the
	// forge's cap (spacing).
	Every time.Duration
}

// queued is a status waiting for a worker.
type queued struct {
	commit string
	st     Status
	sub    Submission
	// notBefore is when Every lets it go.
	notBefore time.Time
	// elem is its place in its lane's list; nil while an older status of its context is
	// being posted.
	elem *list.Element
	// overtaken is made when it is taken to be posted, and closed if a newer status of
	// its context is then submitted in a faster lane (overtake).
	overtaken chan struct{}
}

type queueKey struct{ commit, context string }

// queue holds the statuses Submit was given until a worker posts them: the newest one
// per commit and context, each lane first in, first out.
type queue struct {
	p   *Publisher
	max int

	mu      sync.Mutex
	items   map[queueKey]*queued
	lanes   [2]*list.List // of queueKey, by Lane
	posting map[queueKey]*queued
	dropped int
	changed chan struct{}
}

func newQueue(p *Publisher, max int) *queue {
	return &queue{p: p, max: max, items: map[queueKey]*queued{}, lanes: [2]*list.List{list.New(), list.New()},
		posting: map[queueKey]*queued{}, changed: make(chan struct{})}
}

// signal wakes the workers to look again. The caller holds q.mu.
func (q *queue) signal() {
	close(q.changed)
	q.changed = make(chan struct{})
}

// Submit queues st to become the newest status of its context on commit and returns at
// once; the workers Run starts post it, unless a newer status of the context on the
// commit replaces it first. A status submitted in the Urgent lane takes a queued one of
// its context along, ahead of the Bulk lane, and overtakes one of its context that a
// worker holds in the Bulk lane: that one gives its turn up unless it is being sent.
func (p *Publisher) Submit(commit string, st Status, sub Submission) error {
	if err := check(commit, st); err != nil {
		return err
	}
	if sub.Lane != Bulk {
		sub.Lane = Urgent
	}
	q := p.queue
	k := queueKey{commit, st.Context}
	q.mu.Lock()
	defer q.mu.Unlock()
	if it := q.items[k]; it != nil {
		lane := min(it.sub.Lane, sub.Lane)
		if it.elem != nil && lane != it.sub.Lane {
			q.lanes[it.sub.Lane].Remove(it.elem)
			it.elem = q.lanes[lane].PushBack(k)
		}
		// Every is judged again against the new status's state.
		it.st, it.sub, it.notBefore = st, sub, time.Time{}
		it.sub.Lane = lane
		q.overtake(k, lane)
		q.signal()
		return nil
	}
	it := &queued{commit: commit, st: st, sub: sub}
	q.items[k] = it
	if q.posting[k] == nil {
		it.elem = q.lanes[sub.Lane].PushBack(k)
	}
	q.overtake(k, sub.Lane)
	if len(q.items) > q.max {
		q.dropOldest()
	}
	q.signal()
	return nil
}

// overtake tells the post of k under way, if any, that a newer status of k waits to go
// in lane. From a slower lane, that post gives its turn up, and the newer one goes in
// lane's turn once it ended: handed over, it would wait the slower lane's turn, which a
// wave that spent the budget puts as far as its reset. A post already being sent goes
// on, and the newer one follows it. The caller holds q.mu.
func (q *queue) overtake(k queueKey, lane Lane) {
	po := q.posting[k]
	if po == nil || lane >= po.sub.Lane {
		return
	}
	select {
	case <-po.overtaken:
	default:
		close(po.overtaken)
	}
}

// dropOldest drops the status queued longest, Bulk first. The caller holds q.mu.
func (q *queue) dropOldest() {
	for _, lane := range []Lane{Bulk, Urgent} {
		if e := q.lanes[lane].Front(); e != nil {
			k := q.lanes[lane].Remove(e).(queueKey)
			delete(q.items, k)
			q.dropped++
			if q.dropped == 1 || q.dropped%1000 == 0 {
				q.p.opts.Log.Warn("the queue of commit statuses is full; dropped the oldest", "dropped", q.dropped, "max", q.max, "context", k.context, "commit", k.commit)
			}
			return
		}
	}
}

// Pending is how many statuses are queued or being posted.
func (p *Publisher) Pending() int {
	q := p.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	n := len(q.posting)
	for k := range q.items {
		if q.posting[k] == nil {
			n++
		}
	}
	return n
}

// Dropped is how many queued statuses a full queue has dropped unposted since the
// Publisher was made.
func (p *Publisher) Dropped() int {
	q := p.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dropped
}

// Run posts the submitted statuses until ctx ends, with opts.UrgentWorkers workers on
// the Urgent lane and opts.BulkWorkers on the Bulk lane, so that a wave's statuses
// never occupy the workers a single change needs.
func (p *Publisher) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for lane, n := range map[Lane]int{Urgent: p.opts.UrgentWorkers, Bulk: p.opts.BulkWorkers} {
		for range n {
			wg.Go(func() {
				for {
					it, ok := p.queue.next(ctx, lane)
					if !ok {
						return
					}
					p.post(ctx, it)
				}
			})
		}
	}
	wg.Wait()
}

// post posts one queued status and lets its context's next one go.
func (p *Publisher) post(ctx context.Context, it *queued) {
	k := queueKey{it.commit, it.st.Context}
	defer p.queue.done(k)
	st := p.backend.Canonical(it.st)
	unlock := p.keys.Lock(it.commit + "\x00" + st.Context)
	defer unlock()
	var taken *queued
	_, err := p.deliver(ctx, it.commit, st, it.sub, p.opts.MaxPause, func() (Status, Submission, bool) {
		if newer := p.queue.takeNewer(k); newer != nil {
			taken = newer
			return newer.st, newer.sub, true
		}
		return Status{}, Submission{}, false
	}, it.overtaken)
	if err != nil && taken != nil && !errors.Is(err, ErrCapReached) {
		// A status taken over from the queue goes back to it when its post failed or
		// gave its turn up, as it would have stayed there had it not been taken: it is
		// the newest.
		p.queue.giveBack(k, taken)
	}
	if errors.Is(err, errOvertaken) {
		// Not a failure: done queues the newer status in its faster lane.
		return
	}
	if err != nil && ctx.Err() == nil {
		p.opts.Log.Error("posting a commit status", "context", st.Context, "commit", it.commit, "lane", it.sub.Lane, "error", err)
	}
}

// next takes the oldest status of lane that may go now, waiting for one; false once ctx
// ends.
func (q *queue) next(ctx context.Context, lane Lane) (*queued, bool) {
	for {
		q.mu.Lock()
		now := q.p.opts.Clock.Now()
		it, wake := q.take(lane, now)
		changed := q.changed
		q.mu.Unlock()
		if it != nil {
			return it, true
		}
		d := time.Duration(-1)
		if !wake.IsZero() {
			d = max(wake.Sub(now), 0)
		}
		waitFor(ctx, q.p.opts.Clock, d, changed, nil)
		if ctx.Err() != nil {
			return nil, false
		}
	}
}

// take removes and returns the first status of lane that may go at now, marking its
// context as being posted; otherwise it returns when the first held one may go (zero
// for none). The caller holds q.mu.
func (q *queue) take(lane Lane, now time.Time) (*queued, time.Time) {
	var wake time.Time
	hold := func(t time.Time) {
		if wake.IsZero() || t.Before(wake) {
			wake = t
		}
	}
	for e := q.lanes[lane].Front(); e != nil; e = e.Next() {
		k := e.Value.(queueKey)
		it := q.items[k]
		if it.notBefore.After(now) {
			hold(it.notBefore)
			continue
		}
		if it.sub.Every > 0 {
			if at, n, same, ok := q.p.lastPosted(it.commit, q.p.backend.Canonical(it.st)); ok {
				if next := at.Add(spacing(it.sub.Every, n, same)); next.After(now) {
					it.notBefore = next
					hold(it.notBefore)
					continue
				}
			}
		}
		q.lanes[lane].Remove(e)
		it.elem = nil
		it.overtaken = make(chan struct{})
		delete(q.items, k)
		q.posting[k] = it
		return it, time.Time{}
	}
	return nil, wake
}

// done ends the posting of k and queues the status of k submitted meanwhile, if any.
func (q *queue) done(k queueKey) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.posting, k)
	if it := q.items[k]; it != nil && it.elem == nil {
		it.elem = q.lanes[it.sub.Lane].PushBack(k)
	}
	q.signal()
}

// takeNewer takes the newer status of k submitted while an older one is being posted,
// if any: the poster sends it instead.
func (q *queue) takeNewer(k queueKey) *queued {
	q.mu.Lock()
	defer q.mu.Unlock()
	it := q.items[k]
	if it != nil {
		delete(q.items, k)
		q.signal()
	}
	return it
}

// giveBack queues it again as the newest status of k, unless a newer one came meanwhile.
// k is being posted: done queues it in its lane.
func (q *queue) giveBack(k queueKey, it *queued) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.items[k] == nil {
		q.items[k] = it
	}
}

// lastPosted is when this process last posted st's context on commit, how many times it
// did, and whether the commit still shows it in st's state; ok is false if it never did.
func (p *Publisher) lastPosted(commit string, st Status) (at time.Time, n int, sameState, ok bool) {
	cs := p.cached(commit)
	if cs == nil {
		return time.Time{}, 0, false, false
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	at, ok = cs.at[st.Context]
	return at, cs.posted[st.Context], cs.latest[st.Context].State == st.State, ok
}

// spacing is the least time after a post of a context submitted with every, which the
// commit holds n of, before the next one, sameState or not: a forge keeps at most
// MaxPerContext statuses of a context on a commit, and a summary whose count moves all
// day on a head that stays would reach that in hours at every. So every doubles with
// each tenth of the cap spent, which stretches the cap to over a thousand times every
// (twelve days at ten seconds); a change of state goes at once until half the cap is
// spent, and waits its turn too from then on.
func spacing(every time.Duration, n int, sameState bool) time.Duration {
	if !sameState && n < MaxPerContext/2 {
		return 0
	}
	return every << min(n/(MaxPerContext/10), 10)
}

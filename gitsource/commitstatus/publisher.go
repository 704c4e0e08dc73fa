package commitstatus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"

	"github.com/flotilla-gitops/flotilla/reconciler/keylock"
)

// PublisherOptions tune a Publisher; the zero value is usable.
type PublisherOptions struct {
	// Backoff between attempts on a retryable failure without a wait the forge asked
	// for; its Steps bound the attempts. Defaults to 5 attempts from 500ms, doubling,
	// with jitter.
	Backoff wait.Backoff
	// MaxWait bounds a single wait a forge asks for (Retry-After, a rate limit's reset)
	// in Publish: a longer one fails the call instead of stalling its caller. Defaults
	// to one minute.
	MaxWait time.Duration
	// MaxPause bounds the same wait for the statuses queued with Submit, which nobody
	// waits for: the queue pauses as long as the forge asks, up to this, and a status
	// the forge would keep refusing longer is given up. Defaults to an hour, GitHub's
	// rate-limit window.
	MaxPause time.Duration
	// Commits is how many commits' latest statuses are remembered. Default 1024.
	Commits int
	// Limits reads the forge's limits; defaults to the backend when it is Limited. A
	// backend wrapped for metrics passes its own here.
	Limits Limited
	// Rate is how many requests a second go to a forge that states no budget, until it
	// refuses one (see pacer); zero for no limit.
	Rate float64
	// Reserve is the share of a stated budget kept for the Urgent lane. Default 0.05.
	Reserve float64
	// UrgentWorkers and BulkWorkers are how many queued statuses of each lane are
	// posted at once. Default 2 each.
	UrgentWorkers, BulkWorkers int
	// MaxQueued bounds the statuses waiting to be posted; past it the oldest Bulk one
	// is dropped (its cluster posts again on its next change). Default 100,000.
	MaxQueued int
	// Budget, when set, is the forge credential's budget this Publisher shares with
	// the others that post with the same credential (see Budget); the first of them to
	// use it sets its Rate, Reserve and Clock. Nil for a budget of its own.
	Budget *Budget
	// Clock defaults to the real one.
	Clock clock.Clock
	Log   *slog.Logger
}

// Publisher posts statuses through a Backend only when they differ from the newest one
// the backend holds for that context, so a status posted before a hub restart is not
// posted again, and a steady cluster costs no requests. Every request it sends waits
// its turn within the forge's limits (see Lane and pacer).
//
// Publish posts at once and returns when done. Submit queues a status for the workers
// Run starts, and returns at once: a hub's reconcile never waits for a forge, and of
// several statuses of one context on one commit queued before a worker got to them,
// only the newest is posted.
type Publisher struct {
	backend Backend
	opts    PublisherOptions
	pacer   *pacer
	queue   *queue

	mu sync.Mutex
	// commits maps a commit to its *commitState.
	commits *lru.Cache
	// keys serializes the posts of one context on one commit, so that two callers do
	// not both read, both see a change and both post.
	keys keylock.Locks[string]
	// reading holds, per lane and commit, a channel closed when the read of the
	// commit's statuses under way in that lane ends: who needs them meanwhile waits for
	// that read rather than send another, or stops waiting once overtaken.
	reading map[string]chan struct{}
}

type commitState struct {
	mu     sync.Mutex
	latest map[string]Status
	// posted counts this process's posts per context, on top of what the backend held
	// when it was read; see MaxPerContext.
	posted map[string]int
	// unsure marks the contexts whose last Set failed part way: what the forge holds
	// may differ from latest (GitLab's open job canceled before the new post), so the
	// next status is posted even if it equals latest.
	unsure map[string]bool
	// at is when each context was last posted by this process.
	at map[string]time.Time
}

// NewPublisher publishes through b.
func NewPublisher(b Backend, opts PublisherOptions) *Publisher {
	if opts.Backoff.Steps == 0 {
		opts.Backoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 5, Cap: 30 * time.Second}
	}
	if opts.MaxWait == 0 {
		opts.MaxWait = time.Minute
	}
	if opts.MaxPause == 0 {
		opts.MaxPause = time.Hour
	}
	if opts.Commits <= 0 {
		opts.Commits = 1024
	}
	if opts.Reserve <= 0 || opts.Reserve >= 1 {
		opts.Reserve = 0.05
	}
	if opts.UrgentWorkers <= 0 {
		opts.UrgentWorkers = 2
	}
	if opts.BulkWorkers <= 0 {
		opts.BulkWorkers = 2
	}
	if opts.MaxQueued <= 0 {
		opts.MaxQueued = 100_000
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Limits == nil {
		opts.Limits, _ = b.(Limited)
	}
	p := &Publisher{backend: b, opts: opts, commits: lru.New(opts.Commits), pacer: opts.Budget.pacerFor(opts), reading: map[string]chan struct{}{}}
	p.queue = newQueue(p, opts.MaxQueued)
	p.pacer.setLimits(p.limits())
	return p
}

// Budget is the rate limits of one forge credential, shared by every Publisher that
// posts with it. A forge counts a token's requests together, whichever repository or
// branch they are for (GitHub's hourly budget and its limits on content creation are a
// user's or an app installation's): Publishers pacing apart would each spend the whole
// budget. It is safe for concurrent use.
type Budget struct {
	once  sync.Once
	pacer *pacer
}

// NewBudget returns a budget no Publisher uses yet.
func NewBudget() *Budget { return &Budget{} }

// pacerFor is the pacer of b, made with opts' settings on first use; a new one of its
// own when b is nil.
func (b *Budget) pacerFor(opts PublisherOptions) *pacer {
	if b == nil {
		return newPacer(opts.Clock, opts.Reserve, opts.Rate)
	}
	b.once.Do(func() { b.pacer = newPacer(opts.Clock, opts.Reserve, opts.Rate) })
	return b.pacer
}

func (p *Publisher) limits() Limits {
	if p.opts.Limits == nil {
		return Limits{}
	}
	return p.opts.Limits.Limits()
}

func check(commit string, st Status) error {
	if !st.State.Valid() {
		return fmt.Errorf("status: %s on %s: invalid state %q", st.Context, commit, st.State)
	}
	if st.Context == "" {
		return fmt.Errorf("status: on %s: empty context", commit)
	}
	return nil
}

// Publish makes st the newest status of its context on commit, posting it only when
// state, description or target URL differ from what the backend holds, in the Urgent
// lane. It reports whether it posted.
func (p *Publisher) Publish(ctx context.Context, commit string, st Status) (bool, error) {
	if err := check(commit, st); err != nil {
		return false, err
	}
	st = p.backend.Canonical(st)
	unlock := p.keys.Lock(commit + "\x00" + st.Context)
	defer unlock()
	return p.deliver(ctx, commit, st, Submission{Lane: Urgent}, p.opts.MaxWait, nil, nil)
}

// deliver posts st, canonical, on commit unless the backend holds it already, or sub
// says not to. newer, when set, hands over a newer status of the context queued
// meanwhile, with its Submission: that one goes instead, in the turn this one waited
// for. Dropping the older one and queueing the newer afresh would let a status that is
// submitted again faster than the forge's limits let it go (the fleet's summary, at each
// agent's report) never go at all, each turn spent on one that was already outdated.
// overtaken, once closed, ends the waits for a turn with errOvertaken: a newer status
// goes in a faster lane (queue.overtake). The caller holds the context's key lock.
func (p *Publisher) deliver(ctx context.Context, commit string, st Status, sub Submission, maxWait time.Duration, newer func() (Status, Submission, bool), overtaken <-chan struct{}) (bool, error) {
	cs, err := p.state(ctx, commit, sub.Lane, maxWait, overtaken)
	if err != nil {
		return false, err
	}
	if needed, err := p.needed(cs, commit, st, sub); !needed {
		return false, err
	}
	// needless is set when the newest status handed over needs no post.
	var needless error
	var stale func() bool
	if newer != nil {
		stale = func() bool {
			nst, nsub, ok := newer()
			if !ok {
				return false
			}
			st, sub = p.backend.Canonical(nst), nsub
			needed, err := p.needed(cs, commit, st, sub)
			needless = err
			return !needed
		}
	}
	err = p.request(ctx, sub.Lane, true, maxWait, stale, overtaken, func(ctx context.Context) error {
		err := p.backend.Set(ctx, commit, st)
		if err != nil {
			// The forge may have taken it all the same: what the commit shows is not
			// known until a post succeeds, and a status handed over meanwhile must be
			// judged so.
			cs.mu.Lock()
			cs.unsure[st.Context] = true
			cs.mu.Unlock()
		}
		return err
	})
	if errors.Is(err, errSuperseded) {
		return false, needless
	}
	if err != nil {
		if errors.Is(err, ErrCapReached) {
			// The forge counted more than this process did (earlier runs): stop asking.
			cs.mu.Lock()
			cs.posted[st.Context] = MaxPerContext
			cs.mu.Unlock()
		}
		return false, fmt.Errorf("status: setting %s on %s: %w", st.Context, commit, err)
	}
	cs.mu.Lock()
	cs.latest[st.Context] = st
	delete(cs.unsure, st.Context)
	cs.posted[st.Context]++
	cs.at[st.Context] = p.opts.Clock.Now()
	cs.mu.Unlock()
	return true, nil
}

// needed reports whether st, canonical, must be posted on commit, which holds cs: not
// when the commit shows it already, nor when sub posts only failures and st is none
// that the commit must show. A context at the forge's cap is not posted either, with
// the error that says so.
func (p *Publisher) needed(cs *commitState, commit string, st Status, sub Submission) (bool, error) {
	cs.mu.Lock()
	cur, held := cs.latest[st.Context]
	n := cs.posted[st.Context]
	unsure := cs.unsure[st.Context]
	cs.mu.Unlock()
	switch {
	case held && cur == st && !unsure:
		return false, nil
	case sub.FailuresOnly && !held && !unsure && !st.State.failing():
		return false, nil
	case n >= MaxPerContext:
		return false, fmt.Errorf("%w: %s on %s", ErrCapReached, st.Context, commit)
	}
	return true, nil
}

func (s State) failing() bool { return s == Failure || s == Error }

// Latest is the backend's newest status per context on commit, as the Publisher last
// read or wrote it.
func (p *Publisher) Latest(ctx context.Context, commit string) (map[string]Status, error) {
	cs, err := p.state(ctx, commit, Urgent, p.opts.MaxWait, nil)
	if err != nil {
		return nil, err
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	out := make(map[string]Status, len(cs.latest))
	for k, v := range cs.latest {
		out[k] = v
	}
	return out, nil
}

func (p *Publisher) cached(commit string) *commitState {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v, ok := p.commits.Get(commit); ok {
		return v.(*commitState)
	}
	return nil
}

// state is what the backend holds on commit, read once, waiting for the forge at most
// maxWait. The read goes in the lane of the status that needs it: the thousands of
// commits a hub's first read touches are read at the Bulk lane's pace, not out of the
// reserve a single change's status waits for. A read of each lane may be under way for
// one commit at once, so that an Urgent status never waits for a Bulk read; the first
// to finish is kept. overtaken, once closed, ends the wait for the read with
// errOvertaken (see deliver).
func (p *Publisher) state(ctx context.Context, commit string, lane Lane, maxWait time.Duration, overtaken <-chan struct{}) (*commitState, error) {
	key := lane.String() + "/" + commit
	for {
		p.mu.Lock()
		if v, ok := p.commits.Get(commit); ok {
			p.mu.Unlock()
			return v.(*commitState), nil
		}
		under, ok := p.reading[key]
		if !ok {
			p.reading[key] = make(chan struct{})
			p.mu.Unlock()
			break
		}
		p.mu.Unlock()
		select {
		case <-under:
		case <-overtaken:
			return nil, fmt.Errorf("status: reading statuses of %s: %w", commit, errOvertaken)
		case <-ctx.Done():
			return nil, fmt.Errorf("status: reading statuses of %s: %w", commit, ctx.Err())
		}
	}
	defer func() {
		p.mu.Lock()
		close(p.reading[key])
		delete(p.reading, key)
		p.mu.Unlock()
	}()
	var latest map[string]Status
	err := p.request(ctx, lane, false, maxWait, nil, overtaken, func(ctx context.Context) error {
		var err error
		latest, err = p.backend.Latest(ctx, commit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("status: reading statuses of %s: %w", commit, err)
	}
	cs := &commitState{latest: make(map[string]Status, len(latest)), posted: map[string]int{}, at: map[string]time.Time{}, unsure: map[string]bool{}}
	for k, v := range latest {
		cs.latest[k] = p.backend.Canonical(v)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if v, ok := p.commits.Get(commit); ok {
		// The other lane's read finished first, and its state may have moved on since.
		return v.(*commitState), nil
	}
	p.commits.Add(commit, cs)
	return cs, nil
}

// errSuperseded ends the attempts at a status replaced by a newer one that needs no post.
var errSuperseded = errors.New("status: superseded by a newer one")

// errOvertaken ends the waits for its turn of a status a newer one overtook, submitted
// in a faster lane (queue.overtake).
var errOvertaken = errors.New("status: overtaken by a newer one in a faster lane")

// maxRefusals bounds how often one request is refused for a rate limit before it is
// given up: each refusal waits as the forge asks, so this only ends a forge that keeps
// asking.
const maxRefusals = 10

// request sends op when the pacer lets it go, until it succeeds, fails for good, or
// its attempts run out. A forge that refuses it for a rate limit pauses every lane for
// as long as it asks, up to maxWait, without spending the backoff's attempts; other
// retryable failures wait the backoff's steps. stale, when set, is asked before each
// attempt and again once its turn came (it may change what op sends); true ends the
// attempts with errSuperseded. overtaken, once closed, ends the waits between attempts
// and for an attempt's turn with errOvertaken, never an attempt under way.
func (p *Publisher) request(ctx context.Context, lane Lane, write bool, maxWait time.Duration, stale func() bool, overtaken <-chan struct{}, op func(context.Context) error) error {
	b := p.opts.Backoff
	refusals := 0
	for {
		if stale != nil && stale() {
			return errSuperseded
		}
		a := &attempt{p: p, lane: lane, write: write, maxWait: maxWait, overtaken: overtaken}
		if err := a.next(ctx); err != nil {
			return err
		}
		if stale != nil && stale() {
			// Superseded while it waited its turn, which may be long, by a status that
			// needs no post. Its turn stays spent, as if it went.
			a.finish()
			return errSuperseded
		}
		err := op(context.WithValue(ctx, attemptKey{}, a))
		limits := a.finish()
		var re *RetryableError
		if err == nil || !errors.As(err, &re) {
			return err
		}
		if re.After > 0 {
			// Whoever asks next would be refused too: every lane waits, as long as the
			// forge asked and at most MaxPause.
			p.pacer.refused(min(re.After, p.opts.MaxPause), limits, a.sent)
			if re.After > maxWait {
				return fmt.Errorf("%w; the forge asked to wait %s, more than %s", err, re.After, maxWait)
			}
			if refusals++; refusals >= maxRefusals {
				return fmt.Errorf("%w; refused %d times", err, refusals)
			}
			p.opts.Log.InfoContext(ctx, "the forge asked to wait; every commit status waits", "lane", lane, "error", err, "wait", re.After)
			continue
		}
		if b.Steps <= 1 {
			return err
		}
		d := b.Step()
		p.opts.Log.InfoContext(ctx, "commit status request failed; retrying", "lane", lane, "error", err, "wait", d)
		t := p.opts.Clock.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-overtaken:
			t.Stop()
			return errOvertaken
		case <-t.C():
		}
	}
}

// attempt is one attempt at an operation on the forge (a post, a read of every page),
// whose requests go one after another, each in its turn (NextRequest).
type attempt struct {
	p       *Publisher
	lane    Lane
	write   bool
	maxWait time.Duration
	// overtaken ends the wait for its first request's turn (see request).
	overtaken <-chan struct{}
	// sent is when its newest request went; open is set while that request runs.
	sent time.Time
	open bool
}

type attemptKey struct{}

// next ends the attempt's running request, if any, and waits for the next one's turn.
// Only the first request of an attempt waits in its lane: the others go as Urgent ones,
// since the forge may hold the operation half done until they go (GitLab's open job
// canceled before the new post), and a Bulk one would wait behind every Urgent request.
// For the same reason, being overtaken does not end their waits.
func (a *attempt) next(ctx context.Context) error {
	lane, overtaken := a.lane, a.overtaken
	if !a.sent.IsZero() {
		lane, overtaken = Urgent, nil
	}
	a.finish()
	sent, err := a.p.pacer.wait(ctx, lane, a.write, a.maxWait, overtaken)
	if err != nil {
		return err
	}
	a.sent, a.open = sent, true
	return nil
}

// finish ends the attempt's running request, if any, with the forge's limits it learned.
func (a *attempt) finish() Limits {
	limits := a.p.limits()
	if a.open {
		a.p.pacer.done(limits)
		a.open = false
	}
	return limits
}

// NextRequest waits until the forge's limits let one more request of the operation ctx
// belongs to go. A backend calls it before each request of a Set or a Latest after the
// first (a further page, a cancel before a new post): the Publisher paces and counts
// every request it makes, not only each operation's first. Outside a Publisher's
// operation it returns at once.
func NextRequest(ctx context.Context) error {
	if a, ok := ctx.Value(attemptKey{}).(*attempt); ok {
		return a.next(ctx)
	}
	return nil
}

// Send sends op, a request to the forge other than a status's (listing the open pull
// requests), in the Urgent lane within the forge's limits, retried as a status's is.
// op may call NextRequest before each further request it makes.
func (p *Publisher) Send(ctx context.Context, op func(context.Context) error) error {
	return p.request(ctx, Urgent, false, p.opts.MaxWait, nil, nil, op)
}

package commitstatus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/lru"
)

// PublisherOptions tune a Publisher; the zero value is usable.
type PublisherOptions struct {
	// Backoff between attempts on a retryable failure; its Steps bound the attempts.
	// Defaults to 5 attempts from 500ms, doubling, with jitter.
	Backoff wait.Backoff
	// MaxWait bounds a single wait a forge asks for with Retry-After; a longer one
	// fails the attempt instead of stalling the hub. Defaults to one minute.
	MaxWait time.Duration
	// Commits is how many commits' latest statuses are remembered. Default 1024.
	Commits int
	Log     *slog.Logger
}

// Publisher posts statuses through a Backend only when they differ from the newest one
// the backend holds for that context, so a status posted before a hub restart is not
// posted again, and a steady cluster costs no requests.
type Publisher struct {
	backend Backend
	opts    PublisherOptions

	mu sync.Mutex
	// commits maps a commit to its *commitState.
	commits *lru.Cache
	// locks serializes work on one commit, so two reconciles of the same commit do not
	// both read, both see a change and both post.
	locks keyedMutex
}

type commitState struct {
	latest map[string]Status
	// posted counts this process's posts per context, on top of what the backend held
	// when it was read; see MaxPerContext.
	posted map[string]int
}

// NewPublisher publishes through b.
func NewPublisher(b Backend, opts PublisherOptions) *Publisher {
	if opts.Backoff.Steps == 0 {
		opts.Backoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 5, Cap: 30 * time.Second}
	}
	if opts.MaxWait == 0 {
		opts.MaxWait = time.Minute
	}
	if opts.Commits <= 0 {
		opts.Commits = 1024
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Publisher{backend: b, opts: opts, commits: lru.New(opts.Commits)}
}

// Publish makes st the newest status of its context on commit, posting it only when
// state, description or target URL differ from what the backend holds. It reports
// whether it posted.
func (p *Publisher) Publish(ctx context.Context, commit string, st Status) (bool, error) {
	if !st.State.Valid() {
		return false, fmt.Errorf("status: %s on %s: invalid state %q", st.Context, commit, st.State)
	}
	if st.Context == "" {
		return false, fmt.Errorf("status: on %s: empty context", commit)
	}
	st = p.backend.Canonical(st)

	unlock := p.locks.lock(commit)
	defer unlock()
	cs, err := p.state(ctx, commit)
	if err != nil {
		return false, err
	}
	if cur, ok := cs.latest[st.Context]; ok && cur == st {
		return false, nil
	}
	if cs.posted[st.Context] >= MaxPerContext {
		return false, fmt.Errorf("%w: %s on %s", ErrCapReached, st.Context, commit)
	}
	if err := p.set(ctx, commit, st); err != nil {
		if errors.Is(err, ErrCapReached) {
			// The forge counted more than this process did (earlier runs): stop asking.
			cs.posted[st.Context] = MaxPerContext
		}
		return false, err
	}
	cs.latest[st.Context] = st
	cs.posted[st.Context]++
	return true, nil
}

// Latest is the backend's newest status per context on commit, as the Publisher last
// read or wrote it.
func (p *Publisher) Latest(ctx context.Context, commit string) (map[string]Status, error) {
	unlock := p.locks.lock(commit)
	defer unlock()
	cs, err := p.state(ctx, commit)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Status, len(cs.latest))
	for k, v := range cs.latest {
		out[k] = v
	}
	return out, nil
}

func (p *Publisher) state(ctx context.Context, commit string) (*commitState, error) {
	p.mu.Lock()
	v, ok := p.commits.Get(commit)
	p.mu.Unlock()
	if ok {
		return v.(*commitState), nil
	}
	var latest map[string]Status
	err := p.retry(ctx, func() error {
		var err error
		latest, err = p.backend.Latest(ctx, commit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("status: reading statuses of %s: %w", commit, err)
	}
	cs := &commitState{latest: make(map[string]Status, len(latest)), posted: map[string]int{}}
	for k, v := range latest {
		cs.latest[k] = p.backend.Canonical(v)
	}
	p.mu.Lock()
	p.commits.Add(commit, cs)
	p.mu.Unlock()
	return cs, nil
}

func (p *Publisher) set(ctx context.Context, commit string, st Status) error {
	err := p.retry(ctx, func() error { return p.backend.Set(ctx, commit, st) })
	if err != nil {
		return fmt.Errorf("status: setting %s on %s: %w", st.Context, commit, err)
	}
	return nil
}

// retry runs op until it succeeds, fails for good, or the backoff's steps run out. A
// wait the forge asks for replaces the backoff's own when it is longer.
func (p *Publisher) retry(ctx context.Context, op func() error) error {
	b := p.opts.Backoff
	for {
		err := op()
		var re *RetryableError
		if err == nil || !errors.As(err, &re) {
			return err
		}
		if b.Steps <= 1 {
			return err
		}
		d := b.Step()
		if re.After > p.opts.MaxWait {
			return fmt.Errorf("%w; the forge asked to wait %s, more than %s", err, re.After, p.opts.MaxWait)
		}
		if re.After > d {
			d = re.After
		}
		p.opts.Log.InfoContext(ctx, "commit status request failed; retrying", "error", err, "wait", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
}

// keyedMutex hands out one mutex per key and forgets it when nobody holds it.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedEntry
}

type keyedEntry struct {
	mu   sync.Mutex
	refs int
}

func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedEntry{}
	}
	e := k.locks[key]
	if e == nil {
		e = &keyedEntry{}
		k.locks[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

package hub

import (
	"context"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/lru"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/plan"
)

// A commit's statuses, and what they cost the forge.
//
// A change that touches few clusters gets a status per cluster on its commit, in the
// publisher's Urgent lane: someone waits for it. A change that touches more clusters
// than the source's summary threshold (a preset, fleet.yaml, a hub's first read) is
// summarized: its clusters' statuses go in the Bulk lane and only those that fail are
// posted (and, once posted, kept current), while the <prefix>/fleet context counts every
// cluster and links to the hub's page of the commit, which lists them all. Without the
// threshold a fleet-wide change to 10,000 clusters would be 20,000 posts: four hours of
// GitHub's request budget, forty of its limit on new statuses. With it, its failures and
// a summary.
//
// How many clusters a commit touched is known once the sync that brought it has
// reconciled them all: the statuses of a commit first seen during a sync are held until
// the sync ends, and counted then. Pull requests' plan statuses are never held, never
// summarized, always Urgent.

// DefaultSummaryThreshold is how many clusters a change may touch and still get a
// status per cluster on its commit.
const DefaultSummaryThreshold = 50

// summaryEvery is the least time between two posts of the fleet's summary on a commit
// that keep its state: during a wave its count moves with every agent's report, and only
// its newest form matters.
const summaryEvery = 10 * time.Second

// Bounds of what a source keeps in memory about its commits: whether each was
// summarized (SourceOptions.RememberedCommits), and the clusters' statuses of the
// newest ones, for their pages.
const (
	DefaultRememberedCommits = 1024
	pagedCommits             = 16
)

// statusBook keeps, per source, what the statuses of each commit are and how they are
// posted. It is safe for concurrent use.
type statusBook struct {
	// threshold is the source's summary threshold; negative never summarizes.
	threshold int
	// every is summaryEvery, which a test shortens.
	every time.Duration

	mu sync.Mutex
	// modes says of each commit seen whether it is summarized.
	modes *lru.Cache // commit → *commitMode
	// pages are the newest commits' statuses by cluster, for their pages.
	pages *lru.Cache // commit → *commitPage
	// syncing is set while a sync reconciles a new head.
	syncing bool
	// held are the statuses of commits first seen during the running sync, by commit
	// and context.
	held map[string]map[string]commitstatus.Status
}

type commitMode struct {
	summarized bool
	// wave is set when the commit's statuses were first posted in a wave and it was not
	// the head: the next ones its clusters' agents report (as they come back after a
	// hub's restart) are of the wave too. Someone may wait for the head's.
	wave bool
	// clusters are those with a status on the commit, until it is summarized.
	clusters map[string]bool
}

// commitPage is what the page of a commit shows.
type commitPage struct {
	clusters map[string]commitstatus.Status
	fleet    *commitstatus.Status
	updated  time.Time
	// since is set when the page was made again, for a commit whose statuses the hub
	// posted before it kept no page of it any more: it lists the clusters refreshed
	// since, not every one.
	since time.Time
}

func newStatusBook(threshold, remembered int) *statusBook {
	if threshold == 0 {
		threshold = DefaultSummaryThreshold
	}
	return &statusBook{threshold: threshold, every: summaryEvery, modes: lru.New(remembered), pages: lru.New(pagedCommits), held: map[string]map[string]commitstatus.Status{}}
}

// laneThreshold is how many clusters a change may touch and keep its statuses in the
// Urgent lane, summarized or not.
func (b *statusBook) laneThreshold() int {
	if b.threshold < 0 {
		return DefaultSummaryThreshold
	}
	return b.threshold
}

// page is the page record of commit, made when create is set. The caller holds b.mu.
func (b *statusBook) page(commit string, create bool) *commitPage {
	if v, ok := b.pages.Get(commit); ok {
		return v.(*commitPage)
	}
	if !create {
		return nil
	}
	p := &commitPage{clusters: map[string]commitstatus.Status{}}
	if _, seen := b.modes.Get(commit); seen {
		p.since = time.Now()
	}
	b.pages.Add(commit, p)
	return p
}

// cluster records the status of the cluster name on commit and says how to post it;
// false while it is held.
func (b *statusBook) cluster(commit, name string, st commitstatus.Status) (commitstatus.Submission, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.page(commit, true)
	p.clusters[name], p.updated = st, time.Now()

	if held := b.held[commit]; held != nil {
		held[st.Context] = st
		return commitstatus.Submission{}, false
	}
	v, seen := b.modes.Get(commit)
	if !seen && b.syncing {
		b.held[commit] = map[string]commitstatus.Status{st.Context: st}
		return commitstatus.Submission{}, false
	}
	m, _ := v.(*commitMode)
	if m == nil {
		m = &commitMode{clusters: map[string]bool{}}
		b.modes.Add(commit, m)
	}
	return b.submission(m, name), true
}

// submission counts name among m's clusters and says how a status of it is posted. The
// caller holds b.mu.
func (b *statusBook) submission(m *commitMode, name string) commitstatus.Submission {
	n := b.threshold + 1
	if !m.summarized {
		m.clusters[name] = true
		n = len(m.clusters)
		if b.threshold >= 0 && n > b.threshold {
			// Summarized from now on; the statuses already posted stay, and are kept
			// current like the failures.
			m.summarized, m.clusters = true, nil
		}
	}
	lane := commitstatus.Urgent
	if m.summarized || m.wave || n > b.laneThreshold() {
		lane = commitstatus.Bulk
	}
	return commitstatus.Submission{Lane: lane, FailuresOnly: m.summarized}
}

// fleet records the fleet's summary on commit, for its page.
func (b *statusBook) fleet(commit string, st commitstatus.Status) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.page(commit, true)
	p.fleet, p.updated = &st, time.Now()
}

// beginSync holds the statuses of the commits first seen from now on.
func (b *statusBook) beginSync() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.syncing = true
}

// release is a held status with how it is posted.
type release struct {
	commit string
	st     commitstatus.Status
	sub    commitstatus.Submission
}

// endSync ends the hold: each held commit is counted, summarized when it touched more
// clusters than the threshold, and its statuses are returned to be posted. A sync that
// held more statuses than the threshold in all is a wave whatever its commits, as a
// hub's first read is (each cluster's status goes on the commit that last changed it):
// its statuses go in the Bulk lane, behind any change's that someone waits for, and so
// do the later statuses of its commits but head, the sync's. submit is called with each
// before the hold ends: a newer status of the same cluster, recorded once it has, is
// submitted after it and replaces it, never the other way round.
func (b *statusBook) endSync(head string, submit func(release)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.syncing = false
	total := 0
	for _, held := range b.held {
		total += len(held)
	}
	wave := total > b.laneThreshold()
	for commit, held := range b.held {
		m := &commitMode{clusters: map[string]bool{}}
		if v, ok := b.modes.Get(commit); ok {
			m = v.(*commitMode)
		}
		b.modes.Add(commit, m)
		if !m.summarized && b.threshold >= 0 && len(m.clusters)+len(held) > b.threshold {
			m.summarized, m.clusters = true, nil
		}
		m.wave = m.wave || (wave && commit != head)
		for _, st := range held {
			sub := b.submission(m, clusterName(st.Context))
			if wave {
				sub.Lane = commitstatus.Bulk
			}
			submit(release{commit: commit, st: st, sub: sub})
		}
	}
	clear(b.held)
}

// snapshot is a copy of commit's page, false when it is not kept.
func (b *statusBook) snapshot(commit string) (commitPage, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.page(commit, false)
	if p == nil {
		return commitPage{}, false
	}
	out := commitPage{clusters: make(map[string]commitstatus.Status, len(p.clusters)), updated: p.updated, since: p.since}
	for k, v := range p.clusters {
		out.clusters[k] = v
	}
	if p.fleet != nil {
		f := *p.fleet
		out.fleet = &f
	}
	return out, true
}

// clusterName is the cluster a context names: what follows the prefix, which may hold
// slashes where a cluster's name, a DNS label, cannot.
func clusterName(context string) string {
	return context[strings.LastIndex(context, "/")+1:]
}

// post makes st the newest status of its context on commit. It returns at once: the
// source's publisher posts it in its own time, within the forge's limits (see above).
func (s *Source) post(_ context.Context, commit string, st commitstatus.Status) {
	if commit == "" {
		return
	}
	prefix := s.prefixNow()
	var sub commitstatus.Submission
	switch st.Context {
	case plan.Context(prefix):
		// A pull request's plan: one status, waited for, and never summarized.
		sub = commitstatus.Submission{Lane: commitstatus.Urgent}
	case prefix + "/" + fleetContext:
		s.book.fleet(commit, st)
		sub = commitstatus.Submission{Lane: commitstatus.Urgent, Every: s.book.every}
	default:
		var now bool
		if sub, now = s.book.cluster(commit, clusterName(st.Context), st); !now {
			return
		}
	}
	s.submit(commit, st, sub)
}

// fleetContext names the fleet's summary under the source's prefix.
const fleetContext = fleet.SummaryContextName

func (s *Source) submit(commit string, st commitstatus.Status, sub commitstatus.Submission) {
	if s.publisher == nil {
		return
	}
	if err := s.publisher.Submit(commit, st, sub); err != nil {
		s.log.Error("queueing a commit status", "context", st.Context, "commit", commit, "error", err)
	}
}

// endSync posts what the sync held.
func (s *Source) endSync() {
	s.mu.Lock()
	head := s.head
	s.mu.Unlock()
	// The publisher's Submit only queues: it is no work to do under the book's lock.
	s.book.endSync(head, func(r release) { s.submit(r.commit, r.st, r.sub) })
}

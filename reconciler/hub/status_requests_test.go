package hub

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/github"
	"github.com/flotilla-gitops/flotilla/test/forge/githubtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// What a fleet-wide change to 1,000 clusters costs the forge: with the summary
// threshold, a read of the commit, its failures and a few summaries; without it, two
// statuses per cluster. The statuses are the ones the hub's sync and the agents' reports
// make: every cluster pending once its desired state is pushed, then ready or failing.
func TestAThousandClusterWaveCostsTheForgeItsFailuresAndASummary(t *testing.T) {
	const clusters, failing = 1000, 10
	for _, tc := range []struct {
		name      string
		threshold int
		// contexts the commit holds at the end; requests is the most the forge may get.
		contexts, requests int
	}{
		{"summarized at the default threshold", 0, failing + 1, 20},
		{"a status per cluster without a threshold", -1, clusters + 1, 2*clusters + 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := githubtest.Start(t)
			// GitHub states its budget on every answer; one this large lets the test run
			// at the forge's speed and still be paced by what it states.
			srv.SetRateLimit(1_000_000, time.Minute)
			backend, err := github.New(github.Options{BaseURL: srv.URL, Owner: srv.Owner, Repo: srv.Repo, Token: srv.Token})
			if err != nil {
				t.Fatal(err)
			}
			head := srv.NewCommit()
			s := &Source{hub: &Hub{opts: Options{PublicURL: wavePublicURL}}, opts: SourceOptions{Name: "fleet"}, log: slog.New(slog.DiscardHandler),
				publisher: commitstatus.NewPublisher(backend, commitstatus.PublisherOptions{}), book: newStatusBook(tc.threshold, DefaultRememberedCommits),
				prefix: "flotilla", head: head, states: map[string]commitstatus.State{}, invalid: map[string]string{}, waitingRemovals: map[string]bool{}, poolFull: map[string]string{}}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { s.publisher.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()

			report := func(i int, st commitstatus.State, desc string) {
				name := fmt.Sprintf("gpu-%05d", i)
				s.post(ctx, head, commitstatus.Status{Context: s.context(name), State: st, Description: desc})
				s.mu.Lock()
				s.states[name] = st
				s.mu.Unlock()
			}
			began := time.Now()
			// The sync: every cluster rendered and pushed, waiting for its agent.
			s.book.beginSync()
			for i := range clusters {
				report(i, commitstatus.Pending, "waiting for the agent to apply generation 2")
			}
			s.publishFleet(ctx)
			s.endSync()
			drained(t, s, srv, head, "0 of 1,000 clusters ready")
			// The agents' reports, each followed by the summary as refresh does.
			for i := range clusters {
				if i < failing {
					report(i, commitstatus.Failure, "refuse to adopt existing object not owned by this WorkerCluster")
				} else {
					report(i, commitstatus.Success, "ready · 8× H100 80GB on 1 node")
				}
				s.publishFleet(ctx)
			}
			drained(t, s, srv, head, "990 of 1,000 clusters ready, 10 failing")
			took := time.Since(began)

			posts, reads := 0, 0
			for _, r := range srv.Store.Requests() {
				switch r.Method {
				case http.MethodPost:
					posts++
				case http.MethodGet:
					reads++
				}
			}
			held := srv.Store.Latest(head)
			if len(held) != tc.contexts {
				t.Errorf("the commit holds %d contexts, want %d", len(held), tc.contexts)
			}
			if posts+reads > tc.requests {
				t.Errorf("%d requests, want at most %d", posts+reads, tc.requests)
			}
			if r := srv.Store.Refused(); r != 0 {
				t.Errorf("%d requests refused", r)
			}
			// On github.com the publisher keeps every hour within GitHub's 500 new
			// statuses: a burst of 50, then 450 an hour.
			atLimits := "within a burst"
			if posts > 50 {
				atLimits = "about " + (time.Duration(float64(posts-50) / 450 * float64(time.Hour))).Round(time.Minute).String()
			}
			t.Logf("%d clusters, %d failing: %d requests (%d posts, %d reads), %d contexts on the commit; %s here, %s at github.com's limits",
				clusters, failing, posts+reads, posts, reads, len(held), took.Round(time.Millisecond), atLimits)
		})
	}
}

// drained waits until the publisher has nothing left to post and the fleet's summary on
// head says says.
func drained(t *testing.T, s *Source, srv *githubtest.Server, head, says string) {
	t.Helper()
	poll.Until(t, "the statuses posted", func() (bool, string) {
		var fleet string
		for _, r := range srv.Store.Latest(head) {
			if r.Context == "flotilla/fleet" {
				fleet = r.Description
			}
		}
		return s.publisher.Pending() == 0 && strings.Contains(fleet, says), fmt.Sprintf("%d to post; the summary says %q", s.publisher.Pending(), fleet)
	})
}

// A hub's first read posts each cluster's status on the commit that last changed it:
// as many commits as clusters, each read and posted once. That is a wave, whatever its
// commits, and so are the statuses its clusters' agents report next on those commits as
// they come back: a change someone waits for, made meanwhile, is posted ahead of them.
func TestAChangeMadeDuringAHubsFirstReadIsPostedAheadOfIt(t *testing.T) {
	const clusters = 60
	srv := githubtest.Start(t)
	// About a request a second for what is not urgent.
	srv.SetRateLimit(100, time.Minute)
	backend, err := github.New(github.Options{BaseURL: srv.URL, Owner: srv.Owner, Repo: srv.Repo, Token: srv.Token})
	if err != nil {
		t.Fatal(err)
	}
	s := &Source{hub: &Hub{opts: Options{PublicURL: wavePublicURL}}, opts: SourceOptions{Name: "fleet"}, log: slog.New(slog.DiscardHandler),
		publisher: commitstatus.NewPublisher(backend, commitstatus.PublisherOptions{}), book: newStatusBook(DefaultSummaryThreshold, DefaultRememberedCommits),
		prefix: "flotilla", states: map[string]commitstatus.State{}, invalid: map[string]string{}, waitingRemovals: map[string]bool{}, poolFull: map[string]string{}}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.publisher.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	first := make([]string, clusters)
	s.book.beginSync()
	for i := range clusters {
		first[i] = srv.NewCommit()
		s.post(ctx, first[i], commitstatus.Status{Context: s.context(fmt.Sprintf("gpu-%05d", i)), State: commitstatus.Success, Description: "ready"})
	}
	s.endSync()
	// Well under way.
	poll.Until(t, "the first read under way", func() (bool, string) {
		n := len(srv.Store.Requests())
		return n >= 10, fmt.Sprintf("%d requests", n)
	})

	// The agents come back, each a report on its commit.
	for i := range clusters {
		s.post(ctx, first[i], commitstatus.Status{Context: s.context(fmt.Sprintf("gpu-%05d", i)), State: commitstatus.Success, Description: "ready, connected"})
	}

	change := srv.NewCommit()
	s.book.beginSync()
	s.post(ctx, change, commitstatus.Status{Context: s.context("gpu-00000"), State: commitstatus.Pending, Description: "waiting for the agent"})
	s.endSync()
	poll.Until(t, "the change's status posted", func() (bool, string) {
		return len(srv.Store.Latest(change)) == 1, fmt.Sprintf("%d to post", s.publisher.Pending())
	})
	posted := 0
	for _, c := range first {
		posted += len(srv.Store.Latest(c))
	}
	if posted > clusters/2 {
		t.Errorf("the change's status waited until %d of the first read's %d were posted", posted, clusters)
	}
	t.Logf("the change's status posted after %d of the first read's %d", posted, clusters)
}

// After a wave of many commits (a hub's first read), what the agents report next on
// those commits goes in the Bulk lane too; on the head, which someone may have just
// pushed, it goes in the Urgent lane.
func TestReportsOnAWavesCommitsStayInItsLaneButTheHeadsDoNot(t *testing.T) {
	b := newStatusBook(DefaultSummaryThreshold, DefaultRememberedCommits)
	commits := make([]string, 2*DefaultSummaryThreshold)
	b.beginSync()
	for i := range commits {
		commits[i] = fmt.Sprintf("%040x", i)
		if _, now := b.cluster(commits[i], fmt.Sprintf("gpu-%05d", i), commitstatus.Status{Context: fmt.Sprintf("flotilla/gpu-%05d", i), State: commitstatus.Pending}); now {
			t.Fatalf("a status of the sync's commit %d was not held", i)
		}
	}
	head := commits[len(commits)-1]
	b.endSync(head, func(r release) {
		if r.sub.Lane != commitstatus.Bulk {
			t.Fatalf("the wave's status of %s on %s goes %s", r.st.Context, r.commit[:8], r.sub.Lane)
		}
	})
	for i, c := range commits {
		name := fmt.Sprintf("gpu-%05d", i)
		sub, now := b.cluster(c, name, commitstatus.Status{Context: "flotilla/" + name, State: commitstatus.Success})
		want := commitstatus.Bulk
		if c == head {
			want = commitstatus.Urgent
		}
		if !now || sub.Lane != want {
			t.Fatalf("a report on commit %d goes %s (posted now: %v), want %s", i, sub.Lane, now, want)
		}
	}
}

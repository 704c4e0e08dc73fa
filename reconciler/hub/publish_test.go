package hub

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitnotes"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// The fleet's summary is derived from every cluster's current state, counts what fails,
// links to the head's page, and warns of the clusters that a full dispatch pool leaves
// out: they can never take work until pools are declared.
func TestTheFleetSummaryCountsTheFleetAndWarnsOfClustersLeftOutOfAFullPool(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", "../../fleet-template")
	head := repo.Head("main")
	notes, err := gitnotes.New(gitnotes.Options{URL: repo.URL()})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		states   map[string]commitstatus.State
		poolFull map[string]string
		retry    map[string]string
		state    commitstatus.State
		says     string
	}{
		{"every cluster as declared", map[string]commitstatus.State{"a": commitstatus.Success, "b": commitstatus.Success}, nil, nil,
			commitstatus.Success, "2 of 2 clusters ready"},
		{"clusters left out of a full pool", map[string]commitstatus.State{"a": commitstatus.Success, "b": commitstatus.Pending, "c": commitstatus.Pending},
			map[string]string{"b": "eu", "c": "eu"}, nil,
			commitstatus.Pending, "1 of 3 clusters ready · 2 clusters over the 20-cluster limit of dispatch pool eu: declare pools in fleet.yaml"},
		{"failing clusters counted while others are on their way", map[string]commitstatus.State{"a": commitstatus.Success, "b": commitstatus.Failure, "c": commitstatus.Pending}, nil, nil,
			commitstatus.Pending, "1 of 3 clusters ready, 1 failing"},
		{"failing clusters fail the summary once nothing is on its way", fleetOf(10_000, 10), nil, nil,
			commitstatus.Failure, "9,990 of 10,000 clusters ready, 10 failing"},
		// Their agents report them ready, with what they had before the change.
		{"clusters the hub failed to reconcile fail whatever their agents report", map[string]commitstatus.State{"a": commitstatus.Success, "b": commitstatus.Success, "c": commitstatus.Pending},
			nil, map[string]string{"b": "c0ffee", "new": "c0ffee"},
			commitstatus.Pending, "1 of 4 clusters ready, 2 failing · 2 on a fault of the hub, retrying"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Source{hub: &Hub{opts: Options{PublicURL: "https://hub.example/"}}, opts: SourceOptions{Name: "acme"}, log: slog.New(slog.DiscardHandler),
				publisher: commitstatus.NewPublisher(notes, commitstatus.PublisherOptions{}), book: newStatusBook(0, DefaultRememberedCommits),
				prefix: "flotilla", head: head, states: tc.states, poolFull: tc.poolFull, invalid: map[string]string{}, waitingRemovals: map[string]bool{}, retry: tc.retry}
			if s.poolFull == nil {
				s.poolFull = map[string]string{}
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { s.publisher.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()

			s.publishFleet(t.Context())
			var st commitstatus.Status
			poll.Until(t, "the fleet's summary on the head", func() (bool, string) {
				got, err := notes.Latest(t.Context(), head)
				if err != nil {
					return false, err.Error()
				}
				st = got["flotilla/fleet"]
				return st.State == tc.state && strings.Contains(st.Description, tc.says), fmt.Sprintf("%s %q", st.State, st.Description)
			})
			if want := "https://hub.example/commits/acme/" + head; st.TargetURL != want {
				t.Errorf("the summary links to %q, want the head's page %q", st.TargetURL, want)
			}
		})
	}
}

// fleetOf is n clusters' states, failing of them failing and the others ready.
func fleetOf(n, failing int) map[string]commitstatus.State {
	out := make(map[string]commitstatus.State, n)
	for i := range n {
		out[fmt.Sprintf("gpu-%05d", i)] = commitstatus.Success
		if i < failing {
			out[fmt.Sprintf("gpu-%05d", i)] = commitstatus.Failure
		}
	}
	return out
}

func TestThousandsAreSeparatedByCommas(t *testing.T) {
	for n, want := range map[int]string{0: "0", 7: "7", 999: "999", 1000: "1,000", 9990: "9,990", 10000: "10,000", 1234567: "1,234,567", -1000: "-1,000"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

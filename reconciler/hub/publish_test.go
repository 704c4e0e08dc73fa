package hub

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitnotes"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

// The fleet's summary is derived from every cluster's current state, and warns of the
// clusters that a full dispatch pool leaves out: they can never take work until pools
// are declared.
func TestTheFleetSummaryWarnsOfClustersLeftOutOfAFullPool(t *testing.T) {
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
		state    commitstatus.State
		says     string
	}{
		{"every cluster as declared", map[string]commitstatus.State{"a": commitstatus.Success, "b": commitstatus.Success}, nil,
			commitstatus.Success, "2 of 2 clusters ready"},
		{"clusters left out of a full pool", map[string]commitstatus.State{"a": commitstatus.Success, "b": commitstatus.Pending, "c": commitstatus.Pending},
			map[string]string{"b": "eu", "c": "eu"},
			commitstatus.Pending, "1 of 3 clusters ready · 2 clusters over the 20-cluster limit of dispatch pool eu: declare pools in fleet.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Source{hub: &Hub{}, log: slog.New(slog.DiscardHandler), publisher: commitstatus.NewPublisher(notes, commitstatus.PublisherOptions{}),
				prefix: "flotilla", head: head, states: tc.states, poolFull: tc.poolFull, invalid: map[string]string{}, waitingRemovals: map[string]bool{}}
			if s.poolFull == nil {
				s.poolFull = map[string]string{}
			}
			s.publishFleet(t.Context())
			got, err := notes.Latest(t.Context(), head)
			if err != nil {
				t.Fatal(err)
			}
			st := got["flotilla/fleet"]
			if st.State != tc.state || !strings.Contains(st.Description, tc.says) {
				t.Fatalf("flotilla/fleet is %s %q, want %s saying %q", st.State, st.Description, tc.state, tc.says)
			}
		})
	}
}

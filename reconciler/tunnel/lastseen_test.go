package tunnel

import (
	"fmt"
	"testing"
	"time"
)

// Every connected agent's status.lastSeen costs the hub cluster a write. A fleet past
// what LastSeenRate allows at LastSeenEvery records each agent's less often, so that
// the heartbeats of ten thousand agents cost ten writes a second, not 167.
func TestLastSeenIsRecordedLessOftenInALargeFleet(t *testing.T) {
	for _, tc := range []struct {
		agents int
		want   time.Duration
	}{
		{agents: 1, want: time.Minute},
		{agents: 600, want: time.Minute},
		{agents: 1200, want: 2 * time.Minute},
		{agents: 10_000, want: 1000 * time.Second},
	} {
		t.Run(fmt.Sprintf("%d agents", tc.agents), func(t *testing.T) {
			s := &Server{opts: Options{LastSeenEvery: time.Minute, LastSeenRate: 10}, sessions: map[string]*session{}}
			for i := range tc.agents {
				s.sessions[fmt.Sprint(i)] = &session{}
			}
			if got := s.lastSeenEvery(); got != tc.want {
				t.Errorf("each agent's lastSeen recorded every %s, want %s", got, tc.want)
			}
		})
	}
}

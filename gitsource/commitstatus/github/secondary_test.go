package github

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
)

// GitHub answers a secondary rate limit with 403, a body pointing at the secondary
// limits' documentation and, as on every authenticated answer, the X-RateLimit-*
// headers of the primary budget. Its documentation says how long to wait: Retry-After
// when the answer has it; the primary budget's reset when that budget is spent;
// otherwise at least a minute, not the reset, which may be up to an hour away. Every
// lane of the Publisher pauses for that long, so the second answer shows that the
// backend itself holds back nothing past it.
func TestASecondaryLimitWaitsAsGitHubSays(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryAfter string
		remaining  string
		// resetIn is how far the primary budget's reset is from now on this clock:
		// 50 minutes unless set.
		resetIn  time.Duration
		min, max time.Duration
	}{
		{name: "without Retry-After, with budget left: a minute", remaining: "4990", min: time.Minute, max: time.Minute},
		{name: "with Retry-After: its seconds", retryAfter: "90", remaining: "4990", min: 90 * time.Second, max: 90 * time.Second},
		{name: "without Retry-After, the budget spent: until its reset", remaining: "0", min: 49 * time.Minute, max: 50 * time.Minute},
		// A reset GitHub names is at most its hour away on GitHub's clock; one further
		// is this clock lagging, and a wait past the hour would give the status up.
		{name: "a reset further than an hour away: an hour", remaining: "0", resetIn: 90 * time.Minute, min: time.Hour, max: time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reset := time.Now().Add(cmp.Or(tc.resetIn, 50*time.Minute))
			requests := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests++
				h := w.Header()
				h.Set("X-RateLimit-Limit", "5000")
				h.Set("X-RateLimit-Remaining", tc.remaining)
				h.Set("X-RateLimit-Used", "10")
				h.Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
				h.Set("X-RateLimit-Resource", "core")
				if tc.retryAfter != "" {
					h.Set("Retry-After", tc.retryAfter)
				}
				h.Set("Content-Type", "application/json; charset=utf-8")
				w.WriteHeader(http.StatusForbidden)
				_, _ = w.Write([]byte(`{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits","status":"403"}`))
			}))
			defer srv.Close()
			b, err := New(Options{BaseURL: srv.URL + "/", Owner: "o", Repo: "r", Token: "ghp_secret"})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				err = b.Set(context.Background(), "0123456789abcdef0123456789abcdef01234567", commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending})
				var re *commitstatus.RetryableError
				if !errors.As(err, &re) {
					t.Fatalf("a secondary rate limit is not retryable: %v", err)
				}
				if re.After < tc.min-2*time.Second || re.After > tc.max+2*time.Second {
					t.Fatalf("answer %d: waits %s, want %s to %s", i+1, re.After.Round(time.Second), tc.min, tc.max)
				}
			}
			if requests != 2 {
				t.Fatalf("%d requests reached GitHub, want 2: the backend held one back itself", requests)
			}
		})
	}
}

package commitstatus

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Quota is a forge's request budget as one of its answers stated it: Limit requests per
// Window, of which Remaining are left until Reset.
type Quota struct {
	Limit     int
	Remaining int
	Reset     time.Time
	// Window is the period Limit counts, as the forge documents it (an hour on GitHub, a
	// minute in GitLab's RateLimit-Limit); zero when unknown. After Reset, until the forge
	// states its budget again, Limit/Window is the rate the forge is known to accept.
	Window time.Duration
}

// Rate is a limit of N requests per Per.
type Rate struct {
	N   int
	Per time.Duration
}

// Limits is what a backend knows of its forge's limits.
type Limits struct {
	// Quota is the newest budget the forge stated; valid only when Stated is set.
	Quota  Quota
	Stated bool
	// Writes limit how fast statuses may be created, beyond the request budget, where
	// the forge states such a limit in no answer until it refuses a request for it:
	// GitHub's secondary limits on content creation.
	Writes []Rate
}

// Limited is implemented by backends that know their forge's limits. The Publisher
// reads it after every request and paces the next ones by it.
type Limited interface {
	Limits() Limits
}

// QuotaTracker reads the budget a forge states in the headers of its answers, from a
// transport that wraps the backend's own. It is safe for concurrent use.
//
// Two header families are in use: GitHub's X-RateLimit-Limit, -Remaining and -Reset on
// every answer, and GitLab's RateLimit-Limit, -Remaining and -Reset, which GitLab sends
// on the answers it refuses for a rate limit (its documentation, "User and IP rate
// limits", "Response headers"). Both give Reset in epoch seconds.
type QuotaTracker struct {
	// Prefix is the header family: "X-RateLimit-" or "RateLimit-".
	Prefix string
	// Window is the period the forge's Limit counts (see Quota.Window).
	Window time.Duration
	// Resource, when set, is the only X-RateLimit-Resource whose budget is tracked:
	// GitHub keeps separate budgets for its search and GraphQL APIs, and the statuses
	// are "core".
	Resource string

	mu     sync.Mutex
	quota  Quota
	stated bool
}

// Transport wraps base (http.DefaultTransport when nil) so that every answer through it
// is read.
func (t *QuotaTracker) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &quotaTransport{base: base, t: t}
}

// Quota is the newest budget read; false until one was.
func (t *QuotaTracker) Quota() (Quota, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.quota, t.stated
}

// Observe reads the budget in h, if it states one. Answers may arrive out of order:
// within one window (the same reset) the smallest remainder is the newest; a later
// reset is a new window.
func (t *QuotaTracker) Observe(h http.Header) {
	if t.Resource != "" {
		if r := h.Get(t.Prefix + "Resource"); r != "" && !strings.EqualFold(r, t.Resource) {
			return
		}
	}
	limit, err1 := strconv.Atoi(h.Get(t.Prefix + "Limit"))
	remaining, err2 := strconv.Atoi(h.Get(t.Prefix + "Remaining"))
	reset, err3 := strconv.ParseInt(h.Get(t.Prefix+"Reset"), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || limit <= 0 || remaining < 0 {
		return
	}
	q := Quota{Limit: limit, Remaining: remaining, Reset: time.Unix(reset, 0), Window: t.Window}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case !t.stated, q.Reset.After(t.quota.Reset):
		t.quota, t.stated = q, true
	case q.Reset.Equal(t.quota.Reset) && q.Remaining < t.quota.Remaining:
		t.quota.Remaining = q.Remaining
	}
}

type quotaTransport struct {
	base http.RoundTripper
	t    *QuotaTracker
}

func (q *quotaTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := q.base.RoundTrip(r)
	if resp != nil {
		q.t.Observe(resp.Header)
	}
	return resp, err
}

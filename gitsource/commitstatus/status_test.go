package commitstatus_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
)

func TestTruncate(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		limit int
		want  string
	}{
		{"a short description is kept whole", "ready", 140, "ready"},
		{"a description at the limit is kept whole", strings.Repeat("a", 140), 140, strings.Repeat("a", 140)},
		{"one character over ends in an ellipsis at the limit", strings.Repeat("a", 141), 140, strings.Repeat("a", 139) + "…"},
		{"characters, not bytes, are counted", strings.Repeat("ä", 141), 140, strings.Repeat("ä", 139) + "…"},
		{"no limit keeps everything", strings.Repeat("a", 1000), 0, strings.Repeat("a", 1000)},
		{"a limit of one is the ellipsis alone", "ab", 1, "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := commitstatus.Truncate(tt.in, tt.limit)
			if got != tt.want {
				t.Fatalf("Truncate = %q, want %q", got, tt.want)
			}
			if tt.limit > 0 && utf8.RuneCountInString(got) > tt.limit {
				t.Fatalf("%d characters, over the limit %d", utf8.RuneCountInString(got), tt.limit)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	base := errors.New("forge said no")
	tests := []struct {
		name      string
		code      int
		header    http.Header
		retryable bool
		after     time.Duration
		unauth    bool
	}{
		{"a server error is retried", 502, nil, true, 0, false},
		{"too many requests waits as Retry-After says", 429, http.Header{"Retry-After": {"7"}}, true, 7 * time.Second, false},
		{"too many requests that names no wait waits a second", 429, nil, true, time.Second, false},
		{"a secondary rate limit (403 with Retry-After) is retried", 403, http.Header{"Retry-After": {"60"}}, true, time.Minute, false},
		{"an exhausted primary limit waits until the reset", 403, http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"1800000030"}}, true, 30 * time.Second, false},
		{"GitLab's RateLimit-Reset is read", 429, http.Header{"Ratelimit-Remaining": {"0"}, "Ratelimit-Reset": {"1800000005"}}, true, 5 * time.Second, false},
		{"a Retry-After date is read", 503, http.Header{"Retry-After": {now.Add(90 * time.Second).UTC().Format(http.TimeFormat)}}, true, 90 * time.Second, false},
		{"a plain 403 is final", 403, nil, false, 0, false},
		{"a validation error is final", 422, nil, false, 0, false},
		{"refused credentials are reported as such", 401, nil, false, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.header
			if h == nil {
				h = http.Header{}
			}
			err := commitstatus.Classify(&http.Response{StatusCode: tt.code, Header: h}, base, now)
			var re *commitstatus.RetryableError
			if got := errors.As(err, &re); got != tt.retryable {
				t.Fatalf("retryable = %v, want %v (%v)", got, tt.retryable, err)
			}
			if tt.retryable && re.After != tt.after {
				t.Fatalf("wait %s, want %s", re.After, tt.after)
			}
			if got := errors.Is(err, commitstatus.ErrUnauthorized); got != tt.unauth {
				t.Fatalf("unauthorized = %v, want %v", got, tt.unauth)
			}
		})
	}
}

// memory is the smallest backend: what the Publisher decides is under test, not a forge.
type memory struct {
	mu     sync.Mutex
	limit  int
	sets   map[string]int
	latest map[string]map[string]commitstatus.Status
	fail   []error
	reads  int
}

func newMemory(limit int) *memory {
	return &memory{limit: limit, sets: map[string]int{}, latest: map[string]map[string]commitstatus.Status{}}
}

func (m *memory) Set(_ context.Context, commit string, st commitstatus.Status) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.fail) > 0 {
		err := m.fail[0]
		m.fail = m.fail[1:]
		return err
	}
	m.sets[commit+"/"+st.Context]++
	if m.latest[commit] == nil {
		m.latest[commit] = map[string]commitstatus.Status{}
	}
	m.latest[commit][st.Context] = st
	return nil
}

func (m *memory) Latest(_ context.Context, commit string) (map[string]commitstatus.Status, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads++
	out := map[string]commitstatus.Status{}
	for k, v := range m.latest[commit] {
		out[k] = v
	}
	return out, nil
}

func (m *memory) Canonical(st commitstatus.Status) commitstatus.Status {
	st.Description = commitstatus.Truncate(st.Description, m.limit)
	return st
}

const commit = "0123456789abcdef0123456789abcdef01234567"

var quick = commitstatus.PublisherOptions{Backoff: wait.Backoff{Duration: time.Millisecond, Factor: 2, Steps: 4}}

func TestPublisherPostsNoMoreThanTheCap(t *testing.T) {
	m := newMemory(0)
	p := commitstatus.NewPublisher(m, quick)
	ctx := context.Background()
	for i := range commitstatus.MaxPerContext {
		if _, err := p.Publish(ctx, commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: fmt.Sprint(i)}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	_, err := p.Publish(ctx, commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready"})
	if !errors.Is(err, commitstatus.ErrCapReached) {
		t.Fatalf("publish %d = %v, want ErrCapReached", commitstatus.MaxPerContext+1, err)
	}
	if n := m.sets[commit+"/flotilla/a"]; n != commitstatus.MaxPerContext {
		t.Fatalf("%d statuses posted, want %d", n, commitstatus.MaxPerContext)
	}
	if _, err := p.Publish(ctx, commit, commitstatus.Status{Context: "flotilla/b", State: commitstatus.Success}); err != nil {
		t.Fatalf("another context is not capped: %v", err)
	}
}

func TestPublisherComparesCanonicalForms(t *testing.T) {
	m := newMemory(10)
	p := commitstatus.NewPublisher(m, quick)
	ctx := context.Background()
	for range 3 {
		if _, err := p.Publish(ctx, commit, commitstatus.Status{Context: "c", State: commitstatus.Failure, Description: "a description far over ten characters"}); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.sets[commit+"/c"]; n != 1 {
		t.Fatalf("posted %d times a description the backend cuts, want once", n)
	}
	if m.reads != 1 {
		t.Fatalf("read the backend %d times for one commit, want once", m.reads)
	}
}

func TestPublisherRetries(t *testing.T) {
	transient := commitstatus.Retryable(errors.New("HTTP 502"), 0)
	tests := []struct {
		name    string
		fail    []error
		opts    commitstatus.PublisherOptions
		wantErr error
		posted  bool
	}{
		{"transient failures are retried until one succeeds", []error{transient, transient}, quick, nil, true},
		{"attempts are bounded by the backoff's steps", []error{transient, transient, transient, transient}, quick, transient, false},
		{"a final failure is not retried", []error{errors.New("HTTP 422"), nil}, quick, nil, false},
		{"a wait longer than MaxWait fails instead of stalling", []error{commitstatus.Retryable(errors.New("HTTP 403"), time.Hour)}, quick, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMemory(0)
			m.fail = tt.fail
			posted, err := commitstatus.NewPublisher(m, tt.opts).Publish(context.Background(), commit, commitstatus.Status{Context: "c", State: commitstatus.Pending})
			if posted != tt.posted {
				t.Fatalf("posted = %v (%v), want %v", posted, err, tt.posted)
			}
			if tt.posted && err != nil {
				t.Fatal(err)
			}
			if !tt.posted && err == nil {
				t.Fatal("no error")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestPublisherRefusesInvalidStatuses(t *testing.T) {
	p := commitstatus.NewPublisher(newMemory(0), quick)
	for _, st := range []commitstatus.Status{{Context: "c", State: "running"}, {State: commitstatus.Pending}} {
		if _, err := p.Publish(context.Background(), commit, st); err == nil {
			t.Errorf("Publish(%+v) = nil, want an error", st)
		}
	}
}

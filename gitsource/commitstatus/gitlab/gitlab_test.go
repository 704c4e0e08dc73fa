package gitlab_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitlab"
	"github.com/flotilla-gitops/flotilla/test/forge"
	"github.com/flotilla-gitops/flotilla/test/forge/gitlabtest"
	"github.com/flotilla-gitops/flotilla/test/statussuite"
)

func newBackend(t *testing.T, srv *gitlabtest.Server, project, token string) *gitlab.Backend {
	t.Helper()
	b, err := gitlab.New(gitlab.Options{URL: srv.URL, Project: project, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSuite(t *testing.T) {
	statussuite.Run(t, func(t *testing.T) statussuite.Target {
		srv := gitlabtest.Start(t)
		return statussuite.Target{
			Backend: newBackend(t, srv, srv.Project, srv.Token),
			NewBackend: func(t *testing.T, _ []commitstatus.Rate) commitstatus.Backend {
				return newBackend(t, srv, srv.Project, srv.Token)
			},
			NewCommit:        func(*testing.T) string { return srv.NewCommit() },
			Count:            func(_ *testing.T, commit, context string) int { return srv.Store.Count(commit, context) },
			DescriptionLimit: 255,
			Forge:            srv.Store,
			ForgeState:       gitlab.ForgeState,
			Cap:              false,
			SetPullRequest: func(_ *testing.T, iid int, targetBranch string, open bool) {
				srv.SetMergeRequest(iid, targetBranch, open)
			},
			SetRateLimit: srv.SetRateLimit,
		}
	})
}

func publisher(b commitstatus.Backend) *commitstatus.Publisher {
	return commitstatus.NewPublisher(b, commitstatus.PublisherOptions{Backoff: wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Steps: 3}})
}

func TestWrongTokenIsUnauthorized(t *testing.T) {
	srv := gitlabtest.Start(t)
	const wrong = "glpat-not-the-token-0123456789"
	b := newBackend(t, srv, srv.Project, wrong)
	commit := srv.NewCommit()
	for _, tc := range []struct {
		name string
		op   func(ctx context.Context) error
	}{
		{"Set", func(ctx context.Context) error {
			return b.Set(ctx, commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: "waiting"})
		}},
		{"Latest", func(ctx context.Context) error { _, err := b.Latest(ctx, commit); return err }},
		{"OpenPullRequests", func(ctx context.Context) error { _, err := b.OpenPullRequests(ctx, "main"); return err }},
		{"Publish", func(ctx context.Context) error {
			_, err := publisher(b).Publish(ctx, commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op(t.Context())
			if !errors.Is(err, commitstatus.ErrUnauthorized) {
				t.Fatalf("error = %v, want ErrUnauthorized", err)
			}
			for _, secret := range []string{wrong, srv.Token} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("error %q contains a token", err)
				}
			}
			if !strings.Contains(err.Error(), srv.Project) {
				t.Errorf("error %q does not name the project", err)
			}
		})
	}
	if n := srv.Store.Count(commit, "flotilla/a"); n != 0 {
		t.Fatalf("a refused token stored %d statuses", n)
	}
}

func TestErrorReadsBackAsFailureAndIsNotPostedAgain(t *testing.T) {
	for _, tc := range []struct {
		name      string
		restarted bool
	}{
		{"by the same publisher", false},
		{"by a restarted publisher", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := gitlabtest.Start(t)
			b := newBackend(t, srv, srv.Project, srv.Token)
			ctx, commit := t.Context(), srv.NewCommit()
			st := commitstatus.Status{Context: "flotilla/a", State: commitstatus.Error, Description: "agent unreachable"}
			p := publisher(b)
			if _, err := p.Publish(ctx, commit, st); err != nil {
				t.Fatal(err)
			}
			got, err := b.Latest(ctx, commit)
			if err != nil {
				t.Fatal(err)
			}
			if got["flotilla/a"].State != commitstatus.Failure || b.Canonical(st) != got["flotilla/a"] {
				t.Fatalf("read back %+v, want %+v", got["flotilla/a"], b.Canonical(st))
			}
			if recs := srv.All(commit); recs[0].State != "failed" {
				t.Fatalf("GitLab holds %q, want failed", recs[0].State)
			}
			if tc.restarted {
				p = publisher(b)
			}
			for range 3 {
				posted, err := p.Publish(ctx, commit, st)
				if err != nil || posted {
					t.Fatalf("Publish of the same error = %v, %v; want nothing posted", posted, err)
				}
			}
			if n := srv.Store.Count(commit, "flotilla/a"); n != 1 {
				t.Fatalf("GitLab holds %d statuses, want 1", n)
			}
		})
	}
}

func TestProjectByPathAndByID(t *testing.T) {
	srv := gitlabtest.Start(t)
	for _, tc := range []struct {
		name, project string
	}{
		{"full path", srv.Project},
		{"numeric ID", strconv.FormatInt(srv.ID, 10)},
		{"path in other case", strings.ToUpper(srv.Project)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, srv, tc.project, srv.Token)
			ctx, commit := t.Context(), srv.NewCommit()
			st := commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready", TargetURL: "https://hub.example/a"}
			if err := b.Set(ctx, commit, st); err != nil {
				t.Fatal(err)
			}
			got, err := b.Latest(ctx, commit)
			if err != nil {
				t.Fatal(err)
			}
			if got["flotilla/a"] != st {
				t.Fatalf("Latest = %+v, want %+v", got, st)
			}
		})
	}
	t.Run("an unknown project is no credentials problem", func(t *testing.T) {
		b := newBackend(t, srv, "fleet/other", srv.Token)
		_, err := b.Latest(t.Context(), srv.NewCommit())
		if err == nil || errors.Is(err, commitstatus.ErrUnauthorized) || !strings.Contains(err.Error(), "fleet/other") {
			t.Fatalf("error = %v, want a not-found naming the project", err)
		}
	})
}

// TestPendingTwice pins how a pending status gets a new description although GitLab
// refuses pending → pending: the open job is canceled and a new one posted.
func TestPendingTwice(t *testing.T) {
	srv := gitlabtest.Start(t)
	b := newBackend(t, srv, srv.Project, srv.Token)
	ctx, commit := t.Context(), srv.NewCommit()
	for _, d := range []string{"waiting for the agent to connect", "waiting for generation 2", "waiting for generation 3"} {
		st := commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: d}
		if err := b.Set(ctx, commit, st); err != nil {
			t.Fatal(err)
		}
		got, err := b.Latest(ctx, commit)
		if err != nil {
			t.Fatal(err)
		}
		if got["flotilla/a"] != st {
			t.Fatalf("Latest = %+v, want %+v", got["flotilla/a"], st)
		}
	}
	var states []string
	for _, r := range srv.All(commit) {
		states = append(states, r.State+":"+r.Description)
	}
	want := "[pending:waiting for generation 3 canceled:waiting for generation 2 canceled:waiting for the agent to connect]"
	if got := "[" + strings.Join(states, " ") + "]"; got != want {
		t.Fatalf("GitLab holds %s, want %s", got, want)
	}
	if err := b.Set(ctx, commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready"}); err != nil {
		t.Fatal(err)
	}
	if n := srv.Store.Count(commit, "flotilla/a"); n != 3 {
		t.Fatalf("success after pending took %d jobs, want the open one moved (3)", n)
	}
}

// TestClearedFieldsReadBackCleared pins that a status without target URL or
// description reads back without them, although GitLab keeps the old ones when an
// update in place leaves them blank.
func TestClearedFieldsReadBackCleared(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to commitstatus.Status
	}{
		{"pending with a URL to success without",
			commitstatus.Status{Context: "a", State: commitstatus.Pending, Description: "waiting", TargetURL: "https://hub.example/a"},
			commitstatus.Status{Context: "a", State: commitstatus.Success, Description: "ready"}},
		{"pending with a description to failure without",
			commitstatus.Status{Context: "a", State: commitstatus.Pending, Description: "waiting"},
			commitstatus.Status{Context: "a", State: commitstatus.Failure}},
		{"pending with a URL to pending without",
			commitstatus.Status{Context: "a", State: commitstatus.Pending, Description: "waiting", TargetURL: "https://hub.example/a"},
			commitstatus.Status{Context: "a", State: commitstatus.Pending, Description: "waiting"}},
		{"a blank description is none",
			commitstatus.Status{Context: "a", State: commitstatus.Pending, Description: "waiting"},
			commitstatus.Status{Context: "a", State: commitstatus.Success, Description: "  "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := gitlabtest.Start(t)
			b := newBackend(t, srv, srv.Project, srv.Token)
			ctx, commit := t.Context(), srv.NewCommit()
			for _, st := range []commitstatus.Status{tc.from, tc.to} {
				if err := b.Set(ctx, commit, b.Canonical(st)); err != nil {
					t.Fatal(err)
				}
			}
			got, err := b.Latest(ctx, commit)
			if err != nil {
				t.Fatal(err)
			}
			if want := b.Canonical(tc.to); got["a"] != want {
				t.Fatalf("Latest = %+v, want %+v", got["a"], want)
			}
		})
	}
}

func TestFailuresAreClassified(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fault     forge.Fault
		retryable bool
		after     time.Duration
	}{
		{"a bad gateway is retryable", forge.Fault{Code: 502}, true, 0},
		{"a rate limit waits as long as Retry-After says", forge.Fault{Code: 429, RetryAfter: 7 * time.Second}, true, 7 * time.Second},
		{"a conflict on the commit's lock is retryable", forge.Fault{Code: 409}, true, 0},
		{"a forbidden project is not", forge.Fault{Code: 403}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := gitlabtest.Start(t)
			b := newBackend(t, srv, srv.Project, srv.Token)
			commit := srv.NewCommit()
			srv.Store.FailNext(1, tc.fault)
			err := b.Set(t.Context(), commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: "waiting"})
			var re *commitstatus.RetryableError
			if got := errors.As(err, &re); got != tc.retryable {
				t.Fatalf("error %v retryable = %v, want %v", err, got, tc.retryable)
			}
			if tc.retryable && re.After != tc.after {
				t.Fatalf("wait = %s, want %s", re.After, tc.after)
			}
			if !strings.Contains(err.Error(), commit) || !strings.Contains(err.Error(), "flotilla/a") {
				t.Fatalf("error %q does not name the commit and context", err)
			}
			// The client itself does not retry: the Publisher's policy is the only one.
			if n := len(srv.Store.Requests()); n != 1 {
				t.Fatalf("%d requests for one Set, want 1", n)
			}
		})
	}
}

func TestNewRefusesIncompleteOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts gitlab.Options
	}{
		{"no URL", gitlab.Options{Project: "fleet/gpu-fleet", Token: "glpat-x"}},
		{"a URL without scheme", gitlab.Options{URL: "gitlab.example.com", Project: "fleet/gpu-fleet", Token: "glpat-x"}},
		{"no project", gitlab.Options{URL: "https://gitlab.example.com", Token: "glpat-x"}},
		{"no token", gitlab.Options{URL: "https://gitlab.example.com", Project: "fleet/gpu-fleet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := gitlab.New(tc.opts); err == nil {
				t.Fatal("New succeeded")
			} else if tc.opts.Token != "" && strings.Contains(err.Error(), tc.opts.Token) {
				t.Fatalf("error %q contains the token", err)
			}
		})
	}
}

// A proxy or a broken GitLab that names as the next page one already read would keep a
// read going for ever, its requests counted against the budget: the read fails instead,
// saying so.
func TestAPageThatLinksBackEndsTheRead(t *testing.T) {
	requests := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests++
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Page", r.URL.Query().Get("page"))
		w.Header().Set("X-Next-Page", "1")
		_, _ = w.Write([]byte(`[{"id":` + strconv.Itoa(requests) + `,"name":"flotilla/a","status":"pending"}]`))
	}))
	defer srv.Close()
	b, err := gitlab.New(gitlab.Options{URL: srv.URL, Project: "fleet/gpu-fleet", Token: "glpat-secret"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Latest(t.Context(), "0123456789abcdef0123456789abcdef01234567")
	if err == nil || !strings.Contains(err.Error(), "links back to page 1") {
		t.Fatalf("Latest = %v, want an error saying the page links back", err)
	}
	if requests != 1 {
		t.Fatalf("%d requests, want the one whose answer linked back", requests)
	}
}

// afterCancel runs then once a request that cancels a job has been answered.
type afterCancel struct {
	base http.RoundTripper
	then func()
}

func (a afterCancel) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := a.base.RoundTrip(r)
	if strings.Contains(string(body), `"state":"canceled"`) || r.URL.Query().Get("state") == "canceled" {
		a.then()
	}
	return resp, err
}

// A new description of a pending status cancels the open job before posting the new
// one. When that post fails for good, GitLab shows the canceled job, a failure; the
// status the hub last posted is no longer what GitLab holds, so posting it again must
// reach GitLab rather than be skipped as unchanged.
func TestAReplacementThatFailsHalfWayIsPostedAgain(t *testing.T) {
	srv := gitlabtest.Start(t)
	hc := &http.Client{Transport: afterCancel{base: http.DefaultTransport, then: func() {
		srv.Store.FailNext(1, forge.Fault{Code: http.StatusForbidden})
	}}}
	b, err := gitlab.New(gitlab.Options{URL: srv.URL, Project: srv.Project, Token: srv.Token, HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	p := publisher(b)
	ctx, commit := t.Context(), srv.NewCommit()
	waiting := commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: "waiting for the agent to connect"}
	if _, err := p.Publish(ctx, commit, waiting); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(ctx, commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: "waiting for generation 2"}); err == nil {
		t.Fatal("the replacement's post was refused, and Publish reported no error")
	}
	if got, err := b.Latest(ctx, commit); err != nil || got["flotilla/a"].State != commitstatus.Failure {
		t.Fatalf("GitLab shows %+v (%v), want the canceled job the failed replacement left, a failure", got["flotilla/a"], err)
	}
	posted, err := p.Publish(ctx, commit, waiting)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Latest(ctx, commit)
	if err != nil {
		t.Fatal(err)
	}
	if !posted || got["flotilla/a"] != waiting {
		t.Fatalf("after publishing %q again (posted: %v), GitLab shows %+v", waiting.Description, posted, got["flotilla/a"])
	}
}

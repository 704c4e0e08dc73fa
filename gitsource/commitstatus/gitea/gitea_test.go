package gitea_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitea"
	"github.com/flotilla-gitops/flotilla/test/forge"
	"github.com/flotilla-gitops/flotilla/test/forge/giteatest"
	"github.com/flotilla-gitops/flotilla/test/statussuite"
)

func newBackend(t *testing.T, srv *giteatest.Server, token string) *gitea.Backend {
	t.Helper()
	b, err := gitea.New(t.Context(), gitea.Options{URL: srv.URL, Owner: srv.Owner, Repo: srv.Repo, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSuite(t *testing.T) {
	statussuite.Run(t, func(t *testing.T) statussuite.Target {
		srv := giteatest.Start(t)
		return statussuite.Target{
			Backend:          newBackend(t, srv, srv.Token),
			NewBackend:       func(t *testing.T, _ []commitstatus.Rate) commitstatus.Backend { return newBackend(t, srv, srv.Token) },
			NewCommit:        func(*testing.T) string { return srv.NewCommit() },
			Count:            func(_ *testing.T, commit, context string) int { return srv.Store.Count(commit, context) },
			DescriptionLimit: gitea.DescriptionLimit,
			Forge:            srv.Store,
			ForgeState:       func(s commitstatus.State) string { return string(s) },
			// Gitea documents no cap on statuses per commit and context.
			Cap: false,
			SetPullRequest: func(_ *testing.T, number int, base string, open bool) {
				srv.SetPullRequest(number, base, open)
			},
			SetRateLimit: srv.SetRateLimit,
		}
	})
}

func TestWrongTokenIsUnauthorizedAndNotRepeated(t *testing.T) {
	srv := giteatest.Start(t)
	const wrong = "0123456789abcdef0123456789abcdef01234567"
	b := newBackend(t, srv, wrong)
	commit := srv.NewCommit()
	tests := []struct {
		name string
		call func(context.Context) error
	}{
		{"setting a status", func(ctx context.Context) error {
			return b.Set(ctx, commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: "waiting"})
		}},
		{"reading statuses", func(ctx context.Context) error {
			_, err := b.Latest(ctx, commit)
			return err
		}},
		{"listing open pull requests", func(ctx context.Context) error {
			_, err := b.OpenPullRequests(ctx, "main")
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call(t.Context())
			if !errors.Is(err, commitstatus.ErrUnauthorized) {
				t.Fatalf("error = %v, want ErrUnauthorized", err)
			}
			// Gitea's 401 for an unknown token repeats the token.
			for _, secret := range []string{wrong, srv.Token} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("error text %q contains a token", err)
				}
			}
			if !strings.Contains(err.Error(), srv.Owner+"/"+srv.Repo) {
				t.Errorf("error %q does not name the repository", err)
			}
		})
	}
	if n := srv.Store.Count(commit, "flotilla/a"); n != 0 {
		t.Fatalf("the forge holds %d statuses after a refused token, want 0", n)
	}
}

// TestTokenIsRemovedFromEveryAnswer covers answers other than 401 that repeat the
// token: the error keeps its meaning but not the token.
func TestTokenIsRemovedFromEveryAnswer(t *testing.T) {
	const token = "fedcba9876543210fedcba9876543210fedcba98"
	tests := []struct {
		name      string
		code      int
		retryable bool
	}{
		{"a forbidden answer", http.StatusForbidden, false},
		{"a validation error", http.StatusUnprocessableEntity, false},
		{"a server error stays retryable", http.StatusInternalServerError, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tt.code)
				fmt.Fprintf(w, `{"message":"token %s may not do this","url":"x"}`, strings.TrimPrefix(r.Header.Get("Authorization"), "token "))
			}))
			t.Cleanup(srv.Close)
			b, err := gitea.New(t.Context(), gitea.Options{URL: srv.URL, Owner: "o", Repo: "r", Token: token})
			if err != nil {
				t.Fatal(err)
			}
			for _, err := range []error{
				b.Set(t.Context(), strings.Repeat("a", 40), commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending}),
				func() error { _, err := b.Latest(t.Context(), strings.Repeat("a", 40)); return err }(),
			} {
				if err == nil || strings.Contains(err.Error(), token) {
					t.Fatalf("error %v, want one without the token", err)
				}
				if !strings.Contains(err.Error(), "may not do this") {
					t.Errorf("error %q lost Gitea's message", err)
				}
				var re *commitstatus.RetryableError
				if errors.As(err, &re) != tt.retryable {
					t.Errorf("error %v: retryable = %v, want %v", err, !tt.retryable, tt.retryable)
				}
			}
		})
	}
}

// TestStateIsReadFromStatusField pins the field a status's state is read from: Gitea's
// api.CommitStatus carries it in "status", the combined status its own in "state".
func TestStateIsReadFromStatusField(t *testing.T) {
	tests := []struct {
		name   string
		status string // the JSON members of the one status answered
		want   commitstatus.State
	}{
		{"status is read when state differs", `"status":"failure","state":"success"`, commitstatus.Failure},
		{"status is read when it is the only one", `"status":"error"`, commitstatus.Error},
		{"a state field alone is not a status's state", `"state":"success"`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !strings.HasSuffix(r.URL.Path, "/status") {
					http.NotFound(w, r)
					return
				}
				w.Header().Set("X-Total-Count", "1")
				fmt.Fprintf(w, `{"state":"success","sha":"%s","total_count":1,"statuses":[{"id":1,%s,"context":"flotilla/a","description":"d","target_url":""}]}`,
					strings.Repeat("a", 40), tt.status)
			}))
			t.Cleanup(srv.Close)
			b, err := gitea.New(t.Context(), gitea.Options{URL: srv.URL, Owner: "o", Repo: "r", Token: "t"})
			if err != nil {
				t.Fatal(err)
			}
			got, err := b.Latest(t.Context(), strings.Repeat("a", 40))
			if err != nil {
				t.Fatal(err)
			}
			if got["flotilla/a"].State != tt.want {
				t.Fatalf("state read as %q, want %q", got["flotilla/a"].State, tt.want)
			}
		})
	}
}

func TestEveryStateRoundTrips(t *testing.T) {
	srv := giteatest.Start(t)
	b := newBackend(t, srv, srv.Token)
	for _, s := range []commitstatus.State{commitstatus.Pending, commitstatus.Success, commitstatus.Failure, commitstatus.Error} {
		t.Run(string(s), func(t *testing.T) {
			commit := srv.NewCommit()
			st := b.Canonical(commitstatus.Status{Context: "flotilla/" + string(s), State: s, Description: string(s), TargetURL: "https://hub.example/" + string(s)})
			if st.State != s {
				t.Fatalf("Canonical folds %s onto %s: Gitea has every flotilla state", s, st.State)
			}
			if err := b.Set(t.Context(), commit, st); err != nil {
				t.Fatal(err)
			}
			if recs := srv.Store.All(commit); len(recs) != 1 || recs[0].State != string(s) {
				t.Fatalf("the forge holds %+v, want one status in Gitea's state %q", recs, s)
			}
			got, err := b.Latest(t.Context(), commit)
			if err != nil {
				t.Fatal(err)
			}
			if got[st.Context] != st {
				t.Fatalf("read back %+v, want %+v", got[st.Context], st)
			}
		})
	}
}

func TestCanonicalIsWhatGiteaStores(t *testing.T) {
	srv := giteatest.Start(t)
	b := newBackend(t, srv, srv.Token)
	long := strings.Repeat("ClusterQueue/team-ä ", 100)
	tests := []struct {
		name string
		in   commitstatus.Status
		want commitstatus.Status
	}{
		{"surrounding whitespace is trimmed, as Gitea trims it",
			commitstatus.Status{Context: " flotilla/a\n", State: commitstatus.Pending, Description: "  waiting \n", TargetURL: " https://hub.example/a "},
			commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: "waiting", TargetURL: "https://hub.example/a"}},
		{"a long description is kept whole: Gitea has no limit",
			commitstatus.Status{Context: "flotilla/a", State: commitstatus.Failure, Description: long},
			commitstatus.Status{Context: "flotilla/a", State: commitstatus.Failure, Description: strings.TrimSpace(long)}},
		{"inner whitespace is kept",
			commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready ·  8× H100"},
			commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready ·  8× H100"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := b.Canonical(tt.in); got != tt.want {
				t.Fatalf("Canonical = %+v, want %+v", got, tt.want)
			}
			commit := srv.NewCommit()
			if err := b.Set(t.Context(), commit, tt.in); err != nil {
				t.Fatal(err)
			}
			got, err := b.Latest(t.Context(), commit)
			if err != nil {
				t.Fatal(err)
			}
			if got[tt.want.Context] != tt.want {
				t.Fatalf("read back %+v, want the canonical %+v", got[tt.want.Context], tt.want)
			}
		})
	}
}

func TestLatestReadsPagesOfFifty(t *testing.T) {
	tests := []struct {
		name     string
		contexts int
		requests int
	}{
		{"no statuses take one request", 0, 1},
		{"one page", 50, 1},
		{"a page and a bit", 51, 2},
		{"three pages, stopping at the count", 110, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := giteatest.Start(t)
			b := newBackend(t, srv, srv.Token)
			commit := srv.NewCommit()
			for i := range tt.contexts {
				srv.Store.Add(commit, forge.Record{Context: fmt.Sprintf("flotilla/w%03d", i), State: "success"})
			}
			before := len(srv.Store.Requests())
			got, err := b.Latest(t.Context(), commit)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tt.contexts {
				t.Fatalf("read %d contexts, want %d", len(got), tt.contexts)
			}
			if n := len(srv.Store.Requests()) - before; n != tt.requests {
				t.Fatalf("Latest made %d requests, want %d", n, tt.requests)
			}
		})
	}
}

func TestFailures(t *testing.T) {
	tests := []struct {
		name      string
		prepare   func(srv *giteatest.Server) (b func(t *testing.T) *gitea.Backend, commit string)
		retryable bool
		after     time.Duration
		contains  string
	}{
		{"a rate limit is retryable after Retry-After",
			func(srv *giteatest.Server) (func(t *testing.T) *gitea.Backend, string) {
				srv.Store.FailNext(1, forge.Fault{Code: 429, RetryAfter: 3 * time.Second})
				return func(t *testing.T) *gitea.Backend { return newBackend(t, srv, srv.Token) }, srv.NewCommit()
			}, true, 3 * time.Second, "Too Many Requests"},
		{"a server error is retryable",
			func(srv *giteatest.Server) (func(t *testing.T) *gitea.Backend, string) {
				srv.Store.FailNext(1, forge.Fault{Code: 503})
				return func(t *testing.T) *gitea.Backend { return newBackend(t, srv, srv.Token) }, srv.NewCommit()
			}, true, 0, "Service Unavailable"},
		{"an unknown repository is neither retryable nor unauthorized",
			func(srv *giteatest.Server) (func(t *testing.T) *gitea.Backend, string) {
				return func(t *testing.T) *gitea.Backend {
					b, err := gitea.New(t.Context(), gitea.Options{URL: srv.URL, Owner: srv.Owner, Repo: "elsewhere", Token: srv.Token})
					if err != nil {
						t.Fatal(err)
					}
					return b
				}, srv.NewCommit()
			}, false, 0, srv404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := giteatest.Start(t)
			mk, commit := tt.prepare(srv)
			err := mk(t).Set(t.Context(), commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: "waiting"})
			if err == nil {
				t.Fatal("Set succeeded")
			}
			var re *commitstatus.RetryableError
			if errors.As(err, &re) != tt.retryable {
				t.Fatalf("error %v: retryable = %v, want %v", err, !tt.retryable, tt.retryable)
			}
			if tt.retryable && re.After != tt.after {
				t.Fatalf("retry after %s, want %s", re.After, tt.after)
			}
			if errors.Is(err, commitstatus.ErrUnauthorized) {
				t.Fatalf("error %v is ErrUnauthorized", err)
			}
			for _, want := range []string{tt.contains, commit, "flotilla/a"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
}

// srv404 is Gitea's not-found message, which the SDK makes the error.
const srv404 = "The target couldn't be found."

func TestContextIsPassedToEveryRequest(t *testing.T) {
	srv := giteatest.Start(t)
	b := newBackend(t, srv, srv.Token)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	commit := srv.NewCommit()
	if err := b.Set(ctx, commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Set with a cancelled context = %v, want context.Canceled", err)
	}
	if _, err := b.Latest(ctx, commit); !errors.Is(err, context.Canceled) {
		t.Fatalf("Latest with a cancelled context = %v, want context.Canceled", err)
	}
	if n := len(srv.Store.Requests()); n != 0 {
		t.Fatalf("%d requests reached the forge with a cancelled context", n)
	}
}

func TestNewRefusesIncompleteOptions(t *testing.T) {
	tests := []struct {
		name string
		opts gitea.Options
	}{
		{"no URL", gitea.Options{Owner: "o", Repo: "r", Token: "t"}},
		{"not an http URL", gitea.Options{URL: "ssh://gitea.example", Owner: "o", Repo: "r", Token: "t"}},
		{"the API URL instead of the base URL", gitea.Options{URL: "https://gitea.example/api/v1/", Owner: "o", Repo: "r", Token: "t"}},
		{"no owner", gitea.Options{URL: "https://gitea.example", Repo: "r", Token: "t"}},
		{"no repository", gitea.Options{URL: "https://gitea.example", Owner: "o", Token: "t"}},
		{"a blank token", gitea.Options{URL: "https://gitea.example", Owner: "o", Repo: "r", Token: " \n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := gitea.New(t.Context(), tt.opts); err == nil {
				t.Fatal("New accepted the options")
			}
		})
	}
}

func TestTokenFileNewlineIsIgnored(t *testing.T) {
	srv := giteatest.Start(t)
	b := newBackend(t, srv, srv.Token+"\n")
	commit := srv.NewCommit()
	if err := b.Set(t.Context(), commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready"}); err != nil {
		t.Fatal(err)
	}
}

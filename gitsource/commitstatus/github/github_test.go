package github

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	gh "github.com/google/go-github/v93/github"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/test/forge"
	"github.com/flotilla-gitops/flotilla/test/forge/githubtest"
	"github.com/flotilla-gitops/flotilla/test/statussuite"
)

func TestSuite(t *testing.T) {
	statussuite.Run(t, func(t *testing.T) statussuite.Target {
		srv := githubtest.Start(t)
		return statussuite.Target{
			Backend: newBackend(t, srv, Options{Token: srv.Token, RateWindow: statussuite.RateWindow}),
			NewBackend: func(t *testing.T, writes []commitstatus.Rate) commitstatus.Backend {
				return newBackend(t, srv, Options{Token: srv.Token, RateWindow: statussuite.RateWindow, ContentLimits: writes})
			},
			NewCommit:        func(*testing.T) string { return srv.NewCommit() },
			Count:            func(_ *testing.T, commit, context string) int { return srv.Store.Count(commit, context) },
			DescriptionLimit: DescriptionLimit,
			Forge:            srv.Store,
			ForgeState:       func(s commitstatus.State) string { return string(s) },
			Cap:              true,
			SetPullRequest: func(_ *testing.T, number int, base string, open bool) {
				srv.SetPullRequest(number, base, open)
			},
			SetRateLimit:  srv.SetRateLimit,
			SetWriteLimit: srv.Store.SetWriteLimit,
			StatesBudget:  true,
		}
	})
}

// newBackend is a backend on srv's repository; opts carries the credentials.
func newBackend(t *testing.T, srv *githubtest.Server, opts Options) *Backend {
	t.Helper()
	opts.BaseURL, opts.Owner, opts.Repo = srv.URL, srv.Owner, srv.Repo
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestCredentials(t *testing.T) {
	const appID, installationID = 4711, 815
	cases := []struct {
		name string
		// opts are the credentials; secret is what must not appear in an error.
		opts             func(srv *githubtest.Server, appKey, otherKey []byte) (opts Options, secret string)
		wantUnauthorized bool
	}{
		{
			name: "the repository's token posts a status",
			opts: func(srv *githubtest.Server, _, _ []byte) (Options, string) {
				return Options{Token: srv.Token}, srv.Token
			},
		},
		{
			name: "a token read from a file with its final newline posts a status",
			opts: func(srv *githubtest.Server, _, _ []byte) (Options, string) {
				return Options{Token: srv.Token + "\n"}, srv.Token
			},
		},
		{
			name: "a wrong token is refused as unauthorized and never shown",
			opts: func(*githubtest.Server, []byte, []byte) (Options, string) {
				const wrong = "ghp_0123456789abcdef0123456789abcdef0123"
				return Options{Token: wrong}, wrong
			},
			wantUnauthorized: true,
		},
		{
			name: "an App installation posts a status",
			opts: func(_ *githubtest.Server, appKey, _ []byte) (Options, string) {
				return Options{App: &App{AppID: appID, InstallationID: installationID, PrivateKey: appKey}}, string(appKey)
			},
		},
		{
			name: "an App with another app's private key is refused as unauthorized",
			opts: func(_ *githubtest.Server, _, otherKey []byte) (Options, string) {
				return Options{App: &App{AppID: appID, InstallationID: installationID, PrivateKey: otherKey}}, string(otherKey)
			},
			wantUnauthorized: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := githubtest.Start(t)
			appKey := srv.AddApp(appID, installationID)
			otherKey := srv.AddApp(appID+1, installationID+1)
			opts, secret := tc.opts(srv, appKey, otherKey)
			b := newBackend(t, srv, opts)
			ctx, commit := testContext(t), srv.NewCommit()
			st := commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready"}

			setErr := b.Set(ctx, commit, st)
			_, latestErr := b.Latest(ctx, commit)
			for op, err := range map[string]error{"Set": setErr, "Latest": latestErr} {
				if !tc.wantUnauthorized {
					if err != nil {
						t.Fatalf("%s: %v", op, err)
					}
					continue
				}
				if !errors.Is(err, commitstatus.ErrUnauthorized) {
					t.Fatalf("%s = %v, want ErrUnauthorized", op, err)
				}
				if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), srv.Token) {
					t.Fatalf("%s error shows the credentials: %v", op, err)
				}
				if !strings.Contains(err.Error(), srv.Owner+"/"+srv.Repo) || !strings.Contains(err.Error(), commit) {
					t.Fatalf("%s error %q does not name the repository and commit", op, err)
				}
			}
			if tc.wantUnauthorized {
				return
			}
			got, err := b.Latest(ctx, commit)
			if err != nil {
				t.Fatal(err)
			}
			if got[st.Context] != st {
				t.Fatalf("Latest = %+v, want %+v", got, st)
			}
		})
	}
}

// TestErrors pins what each of GitHub's failures becomes, which is what the Publisher
// decides upon: retry and how long to wait, stop at the cap, or give up.
func TestErrors(t *testing.T) {
	cases := []struct {
		name    string
		prepare func(srv *githubtest.Server, commit string) (commitToUse string)
		// check judges the error of Set.
		check func(t *testing.T, err error)
	}{
		{
			name: "a server error is retried with the Publisher's own backoff",
			prepare: func(srv *githubtest.Server, commit string) string {
				srv.Store.FailNext(1, forge.Fault{Code: http.StatusBadGateway})
				return commit
			},
			check: wantRetryable(0, 0),
		},
		{
			name: "a secondary rate limit answered 429 waits as long as Retry-After says",
			prepare: func(srv *githubtest.Server, commit string) string {
				srv.Store.FailNext(1, forge.Fault{Code: http.StatusTooManyRequests, RetryAfter: 3 * time.Second})
				return commit
			},
			check: wantRetryable(3*time.Second, 3*time.Second),
		},
		{
			name: "a secondary rate limit answered 403 waits as long as Retry-After says",
			prepare: func(srv *githubtest.Server, commit string) string {
				srv.Store.FailNext(1, forge.Fault{Code: http.StatusForbidden, RetryAfter: 7 * time.Second})
				return commit
			},
			check: wantRetryable(7*time.Second, 7*time.Second),
		},
		{
			name: "a secondary rate limit without Retry-After waits the minute GitHub asks for",
			prepare: func(srv *githubtest.Server, commit string) string {
				srv.Store.FailNext(1, forge.Fault{Code: http.StatusForbidden})
				return commit
			},
			check: wantRetryable(time.Minute, time.Minute),
		},
		{
			name: "an exhausted primary rate limit waits until its reset",
			prepare: func(srv *githubtest.Server, commit string) string {
				srv.ExhaustRateLimit(time.Now().Add(30 * time.Second))
				return commit
			},
			check: wantRetryable(25*time.Second, 31*time.Second),
		},
		{
			name: "a commit and context at GitHub's cap give ErrCapReached",
			prepare: func(srv *githubtest.Server, commit string) string {
				srv.Store.Fill(commit, "flotilla/a", "pending", githubtest.MaxPerContext)
				return commit
			},
			check: func(t *testing.T, err error) {
				if !errors.Is(err, commitstatus.ErrCapReached) {
					t.Fatalf("Set = %v, want ErrCapReached", err)
				}
				if _, ok := errors.AsType[*commitstatus.RetryableError](err); ok {
					t.Fatalf("Set = %v: the cap is not worth retrying", err)
				}
			},
		},
		{
			name: "a commit GitHub does not know fails for good",
			prepare: func(*githubtest.Server, string) string {
				return "0123456789abcdef0123456789abcdef01234567"
			},
			check: func(t *testing.T, err error) {
				if _, ok := errors.AsType[*commitstatus.RetryableError](err); ok || errors.Is(err, commitstatus.ErrUnauthorized) || errors.Is(err, commitstatus.ErrCapReached) {
					t.Fatalf("Set = %v, want a plain failure", err)
				}
				if !strings.Contains(err.Error(), "No commit found for SHA") {
					t.Fatalf("Set = %v, want GitHub's message", err)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := githubtest.Start(t)
			b := newBackend(t, srv, Options{Token: srv.Token})
			commit := tc.prepare(srv, srv.NewCommit())
			err := b.Set(testContext(t), commit, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready"})
			if err == nil {
				t.Fatal("Set succeeded")
			}
			tc.check(t, err)
			for _, want := range []string{srv.Owner + "/" + srv.Repo, commit, "flotilla/a"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
			if strings.Contains(err.Error(), srv.Token) {
				t.Errorf("error shows the token: %v", err)
			}
		})
	}
}

func wantRetryable(least, most time.Duration) func(t *testing.T, err error) {
	return func(t *testing.T, err error) {
		t.Helper()
		re, ok := errors.AsType[*commitstatus.RetryableError](err)
		if !ok {
			t.Fatalf("Set = %v, want a RetryableError", err)
		}
		if re.After < least || re.After > most {
			t.Fatalf("retry after %s, want between %s and %s", re.After, least, most)
		}
	}
}

// TestDescriptionLimit posts straight through the Backend, past Canonical, to pin that
// the limit Canonical cuts to is the one GitHub enforces.
func TestDescriptionLimit(t *testing.T) {
	cases := []struct {
		name        string
		description string
		wantRefused bool
	}{
		{name: "140 characters are accepted", description: strings.Repeat("a", 140)},
		{name: "140 characters of two bytes each are accepted", description: strings.Repeat("ä", 140)},
		{name: "141 characters are refused naming the description", description: strings.Repeat("a", 141), wantRefused: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := githubtest.Start(t)
			b := newBackend(t, srv, Options{Token: srv.Token})
			err := b.Set(testContext(t), srv.NewCommit(), commitstatus.Status{Context: "flotilla/a", State: commitstatus.Failure, Description: tc.description})
			if !tc.wantRefused {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			er, ok := errors.AsType[*gh.ErrorResponse](err)
			if !ok || er.Response.StatusCode != http.StatusUnprocessableEntity {
				t.Fatalf("Set = %v, want GitHub's 422", err)
			}
			if len(er.Errors) != 1 || er.Errors[0].Field != "description" {
				t.Fatalf("errors = %+v, want one on the description", er.Errors)
			}
			if !strings.Contains(err.Error(), "description is too long") {
				t.Fatalf("Set = %v, want the error to name the description", err)
			}
			if _, ok := errors.AsType[*commitstatus.RetryableError](err); ok {
				t.Fatalf("Set = %v: a validation error is not worth retrying", err)
			}
		})
	}
}

func TestCanonical(t *testing.T) {
	b := &Backend{}
	long := strings.Repeat("é", 200)
	cases := []struct {
		name string
		in   commitstatus.Status
		want commitstatus.Status
	}{
		{
			name: "a description within the limit is kept",
			in:   commitstatus.Status{Context: "c", State: commitstatus.Success, Description: "ready"},
			want: commitstatus.Status{Context: "c", State: commitstatus.Success, Description: "ready"},
		},
		{
			name: "a long description is cut to 140 characters with an ellipsis",
			in:   commitstatus.Status{Context: "c", State: commitstatus.Failure, Description: long},
			want: commitstatus.Status{Context: "c", State: commitstatus.Failure, Description: strings.Repeat("é", 139) + commitstatus.Ellipsis},
		},
		{
			name: "error stays error: GitHub has it",
			in:   commitstatus.Status{Context: "c", State: commitstatus.Error},
			want: commitstatus.Status{Context: "c", State: commitstatus.Error},
		},
		{
			name: "an empty context is GitHub's default one",
			in:   commitstatus.Status{State: commitstatus.Pending},
			want: commitstatus.Status{Context: "default", State: commitstatus.Pending},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := b.Canonical(tc.in); got != tc.want {
				t.Fatalf("Canonical = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestCombinedState reads the combined state through go-github after posting through the
// Backend: the server computes it as GitHub documents.
func TestCombinedState(t *testing.T) {
	cases := []struct {
		name   string
		posted []commitstatus.Status
		want   string
	}{
		{name: "no statuses is pending", want: "pending"},
		{
			name:   "all success is success",
			posted: []commitstatus.Status{{Context: "a", State: commitstatus.Success}, {Context: "b", State: commitstatus.Success}},
			want:   "success",
		},
		{
			name:   "a pending context makes it pending",
			posted: []commitstatus.Status{{Context: "a", State: commitstatus.Success}, {Context: "b", State: commitstatus.Pending}},
			want:   "pending",
		},
		{
			name:   "an error context makes it failure",
			posted: []commitstatus.Status{{Context: "a", State: commitstatus.Pending}, {Context: "b", State: commitstatus.Error}},
			want:   "failure",
		},
		{
			name:   "a failure context makes it failure",
			posted: []commitstatus.Status{{Context: "a", State: commitstatus.Success}, {Context: "b", State: commitstatus.Failure}},
			want:   "failure",
		},
		{
			name:   "only the newest status of a context counts",
			posted: []commitstatus.Status{{Context: "a", State: commitstatus.Failure}, {Context: "a", State: commitstatus.Success}},
			want:   "success",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := githubtest.Start(t)
			b := newBackend(t, srv, Options{Token: srv.Token})
			ctx, commit := testContext(t), srv.NewCommit()
			for _, st := range tc.posted {
				if err := b.Set(ctx, commit, st); err != nil {
					t.Fatal(err)
				}
			}
			cs, _, err := b.client.Repositories.GetCombinedStatus(ctx, srv.Owner, srv.Repo, commit, nil)
			if err != nil {
				t.Fatal(err)
			}
			if cs.GetState() != tc.want {
				t.Fatalf("combined state = %q, want %q", cs.GetState(), tc.want)
			}
		})
	}
}

func TestNewValidatesOptions(t *testing.T) {
	const token = "ghp_secret0123456789"
	key := githubtest.Start(t).AddApp(1, 2)
	cases := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{name: "an owner is required", opts: Options{Repo: "r", Token: token}, wantErr: "owner"},
		{name: "a repository is required", opts: Options{Owner: "o", Token: token}, wantErr: "repository name"},
		{name: "a repository is a name, not a path", opts: Options{Owner: "o", Repo: "r/x", Token: token}, wantErr: "repository name"},
		{name: "credentials are required", opts: Options{Owner: "o", Repo: "r"}, wantErr: "no credentials"},
		{name: "a blank token is refused", opts: Options{Owner: "o", Repo: "r", Token: " \n"}, wantErr: "blank"},
		{name: "a token and an App are exclusive", opts: Options{Owner: "o", Repo: "r", Token: token, App: &App{AppID: 1, InstallationID: 2, PrivateKey: key}}, wantErr: "set one"},
		{name: "an App needs its ID", opts: Options{Owner: "o", Repo: "r", App: &App{InstallationID: 2, PrivateKey: key}}, wantErr: "app ID"},
		{name: "an App needs an installation", opts: Options{Owner: "o", Repo: "r", App: &App{AppID: 1, PrivateKey: key}}, wantErr: "installation ID"},
		{name: "an App needs a private key", opts: Options{Owner: "o", Repo: "r", App: &App{AppID: 1, InstallationID: 2}}, wantErr: "no private key"},
		{name: "an App's private key must parse", opts: Options{Owner: "o", Repo: "r", App: &App{AppID: 1, InstallationID: 2, PrivateKey: []byte("not a key")}}, wantErr: "private key"},
		{name: "the base URL must be absolute", opts: Options{Owner: "o", Repo: "r", Token: token, BaseURL: "ghe.example.com/api/v3"}, wantErr: "base URL"},
		{name: "the base URL holds no credentials", opts: Options{Owner: "o", Repo: "r", Token: token, BaseURL: "https://u:p@ghe.example.com/api/v3/"}, wantErr: "credentials"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("New = %v, want an error about %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), token) || strings.Contains(err.Error(), "u:p") {
				t.Fatalf("New error shows credentials: %v", err)
			}
		})
	}
}

func TestBaseURL(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{name: "empty is github.com", in: "", want: "https://api.github.com/"},
		{name: "an Enterprise Server root gets its trailing slash", in: "https://ghe.example.com/api/v3", want: "https://ghe.example.com/api/v3/"},
		{name: "a root with its slash is kept", in: "https://ghe.example.com/api/v3/", want: "https://ghe.example.com/api/v3/"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(Options{BaseURL: tc.in, Owner: "o", Repo: "r", Token: "t"})
			if err != nil {
				t.Fatal(err)
			}
			if got := b.client.BaseURL(); got != tc.want {
				t.Fatalf("base URL = %q, want %q", got, tc.want)
			}
		})
	}
}

// Closed pull requests keep their refs/pull/N/head forever, and pull requests into
// other branches never merge into the followed one; the hub plans only the open ones into
// its branch, which the forge lists over as many pages as it takes.
func TestOpenPullRequestsIntoTheBranch(t *testing.T) {
	srv := githubtest.Start(t)
	want := map[int]bool{}
	for n := 1; n <= 160; n++ {
		open, base := n%7 != 0, "main"
		if n%5 == 0 {
			base = "release"
		}
		srv.SetPullRequest(n, base, open)
		if open && base == "main" {
			want[n] = true
		}
	}
	got, err := newBackend(t, srv, Options{Token: srv.Token}).OpenPullRequests(testContext(t), "main")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d open pull requests into main, want %d", len(got), len(want))
	}
	for n := range want {
		if !got[n] {
			t.Fatalf("#%d is open into main but not listed", n)
		}
	}
	if _, err := newBackend(t, srv, Options{Token: "ghp_wrong"}).OpenPullRequests(testContext(t), "main"); !errors.Is(err, commitstatus.ErrUnauthorized) {
		t.Fatalf("with a wrong token: %v, want ErrUnauthorized", err)
	}
}

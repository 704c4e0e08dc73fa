// Package github keeps flotilla's commit statuses as GitHub commit statuses, through the
// REST API of github.com or a GitHub Enterprise Server, authenticated with a token or as a
// GitHub App installation. It reads back the combined status, which holds the newest
// status of every context, so a restarted hub knows what it already posted.
package github

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/bradleyfalzon/ghinstallation/v2"
	gh "github.com/google/go-github/v93/github"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
)

// DefaultBaseURL is github.com's REST API.
const DefaultBaseURL = "https://api.github.com/"

// DescriptionLimit is GitHub's documented maximum description length in characters; a
// longer one is refused with "description is too long (maximum is 140 characters)".
const DescriptionLimit = 140

// defaultContext is the context GitHub gives a status posted without one.
const defaultContext = "default"

// secondaryWait is how long to wait after a secondary rate limit without Retry-After:
// GitHub says "wait for at least one minute before retrying".
const secondaryWait = time.Minute

// secondaryWaitOf is how long GitHub's documentation says to wait after a secondary
// rate limit: Retry-After when the answer has it; the primary budget's reset when that
// budget is spent; otherwise a minute. go-github's RetryAfter takes the reset whenever
// there is one, and GitHub states it on every answer.
func secondaryWaitOf(abuse *gh.AbuseRateLimitError, now time.Time) time.Duration {
	var h http.Header
	if abuse.Response != nil {
		h = abuse.Response.Header
	}
	if v := h.Get("Retry-After"); v != "" {
		if s, err := strconv.ParseInt(v, 10, 64); err == nil {
			return max(time.Duration(s)*time.Second, 0)
		}
	}
	if h.Get(gh.HeaderRateRemaining) == "0" {
		if s, err := strconv.ParseInt(h.Get(gh.HeaderRateReset), 10, 64); err == nil {
			return untilReset(time.Unix(s, 0), now)
		}
	}
	return secondaryWait
}

// untilReset is the wait until GitHub's budget renews at reset. GitHub's reset is never
// more than RateWindow away on its own clock: a later one is this machine's clock lagging
// GitHub's, and a wait of a window outlasts the true one, where a longer one could pass
// the Publisher's bound and give a status up.
func untilReset(reset, now time.Time) time.Duration {
	return min(max(reset.Sub(now), 0), RateWindow)
}

// Options say which repository to keep statuses on and how to authenticate. Exactly one
// of Token and App is set.
type Options struct {
	// BaseURL is the REST API root: empty for github.com, "https://HOST/api/v3/" for a
	// GitHub Enterprise Server.
	BaseURL string
	Owner   string
	Repo    string
	// Token is a personal access token or an installation token, as read from its file;
	// surrounding white space, such as the file's final newline, is ignored.
	Token string
	// App authenticates as an installation of a GitHub App, minting and renewing
	// installation tokens as they expire.
	App *App
	// HTTPClient is the client requests go through; its transport is the base that
	// authentication wraps. Nil for a default client.
	HTTPClient *http.Client
	// ContentLimits bound how fast statuses are created. GitHub documents secondary
	// limits on content-generating requests that no answer states until one is refused:
	// "no more than 80 content-generating requests per minute and no more than 500
	// content-generating requests per hour". Nil applies those on github.com and none
	// on a GitHub Enterprise Server, where rate limits are off unless its administrator
	// turned them on.
	ContentLimits []commitstatus.Rate
	// RateWindow is the period the primary rate limit counts: zero for GitHub's hour,
	// which github.com and GitHub Enterprise Server both count in. A test server that
	// compresses time into a shorter window says so here.
	RateWindow time.Duration
}

// DefaultContentLimits are github.com's documented secondary limits on creating content.
var DefaultContentLimits = []commitstatus.Rate{{N: 80, Per: time.Minute}, {N: 500, Per: time.Hour}}

// RateWindow is the period of GitHub's primary rate limit: "5,000 requests per hour".
const RateWindow = time.Hour

// App names a GitHub App installation and holds the app's private key.
type App struct {
	AppID          int64
	InstallationID int64
	// PrivateKey is the app's RSA private key, PEM-encoded as GitHub hands it out.
	PrivateKey []byte
}

// Backend keeps statuses on one GitHub repository. It is safe for concurrent use.
type Backend struct {
	client *gh.Client
	owner  string
	repo   string
	quota  *commitstatus.QuotaTracker
	writes []commitstatus.Rate
}

var (
	_ commitstatus.Backend = (*Backend)(nil)
	_ commitstatus.Limited = (*Backend)(nil)
)

// New checks opts and returns a backend; nothing is sent until the first Set or Latest.
func New(opts Options) (*Backend, error) {
	if opts.Owner == "" || strings.Contains(opts.Owner, "/") {
		return nil, fmt.Errorf("github: invalid repository owner %q", opts.Owner)
	}
	if opts.Repo == "" || strings.Contains(opts.Repo, "/") {
		return nil, fmt.Errorf("github: invalid repository name %q", opts.Repo)
	}
	repo := opts.Owner + "/" + opts.Repo
	token := strings.TrimSpace(opts.Token)
	switch {
	case opts.Token != "" && token == "":
		return nil, fmt.Errorf("github: %s: the token is blank", repo)
	case token == "" && opts.App == nil:
		return nil, fmt.Errorf("github: %s: no credentials: set a token or a GitHub App", repo)
	case token != "" && opts.App != nil:
		return nil, fmt.Errorf("github: %s: both a token and a GitHub App are set; set one", repo)
	}

	base, err := baseURL(opts.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("github: %s: %w", repo, err)
	}
	// Every answer states the budget left: X-RateLimit-* of the "core" resource, which
	// the status endpoints count against.
	quota := &commitstatus.QuotaTracker{Prefix: "X-RateLimit-", Window: cmp.Or(opts.RateWindow, RateWindow), Resource: "core"}
	hc := &http.Client{}
	if opts.HTTPClient != nil {
		c := *opts.HTTPClient
		hc = &c
	}
	// The exchange of a GitHub App's JWT for an installation token goes around the
	// tracker: it is authenticated as the app, whose budget is not the installation's.
	exchange := hc.Transport
	hc.Transport = quota.Transport(hc.Transport)
	writes := opts.ContentLimits
	if writes == nil && base == DefaultBaseURL {
		writes = DefaultContentLimits
	}
	clientOpts := []gh.ClientOptionsFunc{
		gh.WithHTTPClient(hc),
		// The same origin for uploads keeps the credentials on the API host only.
		gh.WithURLs(&base, &base),
		// The Publisher waits out every refusal, for as long as classify says. go-github
		// would also refuse requests itself until the time it took from the refusal,
		// which for a secondary limit without Retry-After is the primary budget's reset,
		// up to an hour away.
		gh.WithDisableRateLimitCheck(),
	}
	if token != "" {
		clientOpts = append(clientOpts, gh.WithAuthToken(token))
	} else {
		tr, err := appTransport(hc, exchange, base, opts.App)
		if err != nil {
			return nil, fmt.Errorf("github: %s: %w", repo, err)
		}
		clientOpts = append(clientOpts, gh.WithTransport(tr))
	}
	client, err := gh.NewClient(clientOpts...)
	if err != nil {
		return nil, fmt.Errorf("github: %s: %w", repo, err)
	}
	return &Backend{client: client, owner: opts.Owner, repo: opts.Repo, quota: quota, writes: writes}, nil
}

// Limits are the budget GitHub stated in its newest answer and the limits on creating
// content (see Options.ContentLimits).
func (b *Backend) Limits() commitstatus.Limits {
	q, ok := b.quota.Quota()
	return commitstatus.Limits{Quota: q, Stated: ok, Writes: b.writes}
}

// baseURL checks the API root and gives it the trailing slash go-github resolves paths
// against.
func baseURL(s string) (string, error) {
	if s == "" {
		return DefaultBaseURL, nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return "", fmt.Errorf("invalid API base URL %q: want http(s)://HOST/PATH", s)
	}
	if u.User != nil {
		return "", errors.New("invalid API base URL: credentials do not belong in it")
	}
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	return u.String(), nil
}

// appTransport authenticates as the installation over hc's transport. The token
// exchange goes to the same API root, through exchange (nil for the default), the
// transport every other request goes through before the budget's tracker, which is what
// a GitHub Enterprise Server and a test server need.
func appTransport(hc *http.Client, exchange http.RoundTripper, base string, app *App) (http.RoundTripper, error) {
	switch {
	case app.AppID <= 0:
		return nil, fmt.Errorf("GitHub App: invalid app ID %d", app.AppID)
	case app.InstallationID <= 0:
		return nil, fmt.Errorf("GitHub App %d: invalid installation ID %d", app.AppID, app.InstallationID)
	case len(app.PrivateKey) == 0:
		return nil, fmt.Errorf("GitHub App %d: no private key", app.AppID)
	}
	rt := hc.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	tr, err := ghinstallation.New(rt, app.AppID, app.InstallationID, app.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("GitHub App %d: %w", app.AppID, err)
	}
	tr.BaseURL = strings.TrimSuffix(base, "/")
	if exchange == nil {
		exchange = http.DefaultTransport
	}
	tr.Client = &http.Client{Transport: exchange, Timeout: hc.Timeout}
	return tr, nil
}

// Set posts st as a new status of commit.
func (b *Backend) Set(ctx context.Context, commit string, st commitstatus.Status) error {
	rs := gh.RepoStatus{State: new(string(st.State))}
	// Empty fields are left out rather than sent empty: GitHub then applies its own
	// default context and keeps no description or target URL.
	if st.Context != "" {
		rs.Context = new(st.Context)
	}
	if st.Description != "" {
		rs.Description = new(st.Description)
	}
	if st.TargetURL != "" {
		rs.TargetURL = new(st.TargetURL)
	}
	_, resp, err := b.client.Repositories.CreateStatus(ctx, b.owner, b.repo, commit, rs)
	if err != nil {
		return fmt.Errorf("github: %s/%s: setting status %s on %s: %w", b.owner, b.repo, st.Context, commit, classify(resp, err))
	}
	return nil
}

// Latest reads the combined status of commit, every page of it. The combined status
// lists the newest status of each context, which is exactly what Latest returns; the
// status list would be the whole history, up to a thousand statuses per context.
func (b *Backend) Latest(ctx context.Context, commit string) (map[string]commitstatus.Status, error) {
	out := map[string]commitstatus.Status{}
	opts := &gh.ListOptions{PerPage: 100}
	for {
		cs, resp, err := b.client.Repositories.GetCombinedStatus(ctx, b.owner, b.repo, commit, opts)
		if err != nil {
			return nil, fmt.Errorf("github: %s/%s: reading statuses of %s: %w", b.owner, b.repo, commit, classify(resp, err))
		}
		for _, s := range cs.Statuses {
			out[s.GetContext()] = commitstatus.Status{
				Context:     s.GetContext(),
				State:       commitstatus.State(s.GetState()),
				Description: s.GetDescription(),
				TargetURL:   s.GetTargetURL(),
			}
		}
		if resp.NextPage == 0 {
			return out, nil
		}
		if resp.NextPage <= max(opts.Page, 1) {
			return nil, fmt.Errorf("github: %s/%s: reading statuses of %s: page %d links back to page %d", b.owner, b.repo, commit, max(opts.Page, 1), resp.NextPage)
		}
		opts.Page = resp.NextPage
		if err := commitstatus.NextRequest(ctx); err != nil {
			return nil, fmt.Errorf("github: %s/%s: reading statuses of %s (page %d): %w", b.owner, b.repo, commit, opts.Page, err)
		}
	}
}

// Canonical is st as GitHub keeps it: the description cut to 140 characters and an empty
// context named "default". GitHub's four states are flotilla's, so none is folded.
func (b *Backend) Canonical(st commitstatus.Status) commitstatus.Status {
	st.Description = commitstatus.Truncate(st.Description, DescriptionLimit)
	if st.Context == "" {
		st.Context = defaultContext
	}
	return st
}

// classify turns go-github's errors into the ones the Publisher acts upon. go-github has
// already read the rate-limit answers: a secondary limit as *AbuseRateLimitError with its
// Retry-After, a primary one as *RateLimitError with the reset time, also when it
// refuses to send a request before a known reset.
func classify(resp *gh.Response, err error) error {
	now := time.Now()
	if abuse, ok := errors.AsType[*gh.AbuseRateLimitError](err); ok {
		return commitstatus.Retryable(err, secondaryWaitOf(abuse, now))
	}
	if rate, ok := errors.AsType[*gh.RateLimitError](err); ok {
		return commitstatus.Retryable(err, untilReset(rate.Rate.Reset.Time, now))
	}
	if er, ok := errors.AsType[*gh.ErrorResponse](err); ok && er.Response != nil {
		switch code := er.Response.StatusCode; {
		case code == http.StatusUnauthorized:
			// go-github's text is the method, URL and GitHub's message: no credentials.
			return fmt.Errorf("%w: %w", commitstatus.ErrUnauthorized, err)
		case code == http.StatusUnprocessableEntity && capReached(er):
			return fmt.Errorf("%w: %w", commitstatus.ErrCapReached, err)
		}
	}
	// A failed exchange of the app's JWT for an installation token surfaces as a
	// transport error, its answer inside: classify that answer.
	if he, ok := errors.AsType[*ghinstallation.HTTPError](err); ok && he.Response != nil {
		// ghinstallation leaves the failed answer's body open for its caller.
		_, _ = io.Copy(io.Discard, io.LimitReader(he.Response.Body, 1<<16))
		_ = he.Response.Body.Close()
		if he.Response.StatusCode == http.StatusUnauthorized {
			return fmt.Errorf("%w: GitHub App installation %d: the app's JWT was refused: %w", commitstatus.ErrUnauthorized, he.InstallationID, err)
		}
		return commitstatus.Classify(he.Response, err, now)
	}
	var hr *http.Response
	if resp != nil {
		hr = resp.Response
	}
	return commitstatus.Classify(hr, err, now)
}

// capReached tells GitHub's refusal of a status beyond the 1,000 per commit and context:
// "This SHA and context has reached the maximum number of statuses."
func capReached(er *gh.ErrorResponse) bool {
	const msg = "reached the maximum number of statuses"
	if strings.Contains(er.Message, msg) {
		return true
	}
	for _, e := range er.Errors {
		if strings.Contains(e.Message, msg) {
			return true
		}
	}
	return false
}

// OpenPullRequests lists the numbers of the repository's open pull requests into base,
// every page.
func (b *Backend) OpenPullRequests(ctx context.Context, base string) (map[int]bool, error) {
	out := map[int]bool{}
	opts := &gh.PullRequestListOptions{State: "open", Base: base, ListOptions: gh.ListOptions{PerPage: 100}}
	for {
		prs, resp, err := b.client.PullRequests.List(ctx, b.owner, b.repo, opts)
		if err != nil {
			return nil, fmt.Errorf("github: %s/%s: listing open pull requests: %w", b.owner, b.repo, classify(resp, err))
		}
		for _, pr := range prs {
			// The filter is the forge's; a pull request retargeted meanwhile is checked
			// again here.
			if pr.GetBase().GetRef() == base {
				out[pr.GetNumber()] = true
			}
		}
		if resp.NextPage == 0 || resp.NextPage <= max(opts.Page, 1) {
			return out, nil
		}
		opts.Page = resp.NextPage
		if err := commitstatus.NextRequest(ctx); err != nil {
			return nil, fmt.Errorf("github: %s/%s: listing open pull requests (page %d): %w", b.owner, b.repo, opts.Page, err)
		}
	}
}

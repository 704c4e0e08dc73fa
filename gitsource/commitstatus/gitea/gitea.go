// Package gitea keeps flotilla's commit statuses on a Gitea repository, through
// Gitea's Go SDK: a status is created with POST /repos/{owner}/{repo}/statuses/{sha}
// and the newest status of every context is read from the commit's combined status,
// page by page.
//
// The backend is also a commitstatus.PullRequestLister: it lists the open pull requests
// into a branch from GET /repos/{owner}/{repo}/pulls.
//
// Gitea's states are pending, success, error, failure and warning (and, in newer
// releases, skipped); flotilla's four are among them and map one to one. Gitea keeps
// descriptions in a TEXT column and documents no length limit, so none is cut; it
// trims surrounding whitespace from description, context and target URL, which
// Canonical does too, so that what is read back compares equal to what was posted.
package gitea

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	sdk "code.gitea.io/sdk/gitea"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
)

// DescriptionLimit is Gitea's limit on a status description in characters: none, as
// the description is a TEXT column (models/git/commit_status.go) and the API documents
// no limit.
const DescriptionLimit = 0

// pageSize is how many contexts Latest asks for a page. Gitea grants at most
// MAX_RESPONSE_ITEMS per page, 50 unless its administrator changed it; Latest follows
// pages until it has read every context, so a smaller setting costs requests, not
// contexts.
const pageSize = 50

// defaultTimeout bounds one request when the caller gives no HTTP client, so a forge
// that stops answering cannot stall the hub.
const defaultTimeout = 30 * time.Second

// Options say which repository holds the statuses and how to reach it.
type Options struct {
	// URL is Gitea's base URL, e.g. https://gitea.example.com, without /api/v1.
	URL   string
	Owner string
	Repo  string
	// Token is an access token allowed to write the repository's commit statuses
	// (scope write:repository, which also reads its pull requests); the caller reads
	// it from a file. It is sent as "Authorization: token <Token>" and never appears
	// in an error.
	Token string
	// HTTPClient defaults to a client with a 30s timeout.
	HTTPClient *http.Client
}

// Backend is a commitstatus.Backend over a Gitea repository. It is safe for concurrent use.
type Backend struct {
	opts  Options
	hc    *http.Client
	quota *commitstatus.QuotaTracker
}

var (
	_ commitstatus.Backend           = (*Backend)(nil)
	_ commitstatus.PullRequestLister = (*Backend)(nil)
	_ commitstatus.Limited           = (*Backend)(nil)
)

// New prepares a backend. It makes no request: the hub must start, and reconcile its
// clusters, while the forge is away, and the SDK's version check at NewClient, which
// it skips, would gate nothing the backend uses, every endpoint it calls being older
// than the SDK's oldest supported Gitea. ctx is not kept; each call takes its own.
func New(ctx context.Context, opts Options) (*Backend, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	u, err := url.Parse(opts.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("gitea: %q is not an http(s) URL of a Gitea server", opts.URL)
	}
	if strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/api/v1") {
		return nil, fmt.Errorf("gitea: %q: give Gitea's base URL, without /api/v1", opts.URL)
	}
	if opts.Owner == "" || opts.Repo == "" {
		return nil, errors.New("gitea: owner and repository are required")
	}
	// A token read from a file often ends in a newline, which no header can carry.
	opts.Token = strings.TrimSpace(opts.Token)
	if opts.Token == "" {
		return nil, fmt.Errorf("gitea: %s/%s: no token", opts.Owner, opts.Repo)
	}
	hc := &http.Client{Timeout: defaultTimeout}
	if opts.HTTPClient != nil {
		c := *opts.HTTPClient
		hc = &c
	}
	// Gitea itself limits no API request (go-gitea/gitea#9559 asks for it); an
	// administrator limits it with a proxy in front, which refuses with 429 and
	// Retry-After, and may state its budget in X-RateLimit-* headers, read here when
	// they carry an epoch reset as GitHub's do.
	quota := &commitstatus.QuotaTracker{Prefix: "X-RateLimit-"}
	hc.Transport = quota.Transport(hc.Transport)
	return &Backend{opts: opts, hc: hc, quota: quota}, nil
}

// Limits are what a proxy in front of Gitea stated of its budget, if anything.
func (b *Backend) Limits() commitstatus.Limits {
	q, ok := b.quota.Quota()
	return commitstatus.Limits{Quota: q, Stated: ok}
}

// client returns an SDK client bound to ctx. The SDK keeps one context per client,
// set with SetContext, and offers no per-call context; a client per call is how each
// call gets its own without two goroutines racing on a shared one. A client is a few
// fields: with the version check off, making one sends nothing.
func (b *Backend) client(ctx context.Context, hc *http.Client) (*sdk.Client, error) {
	return sdk.NewClient(b.opts.URL,
		sdk.SetToken(b.opts.Token),
		sdk.SetHTTPClient(hc),
		sdk.SetGiteaVersion(""),
		sdk.SetContext(ctx),
	)
}

// Set creates st as the newest status of its context on commit.
func (b *Backend) Set(ctx context.Context, commit string, st commitstatus.Status) error {
	c, err := b.client(ctx, b.hc)
	if err != nil {
		return b.errorf(err, "setting %s on %s", st.Context, commit)
	}
	_, resp, err := c.CreateStatus(b.opts.Owner, b.opts.Repo, commit, sdk.CreateStatusOption{
		State:       sdk.StatusState(st.State),
		TargetURL:   st.TargetURL,
		Description: st.Description,
		Context:     st.Context,
	})
	if err != nil {
		return b.errorf(b.classify(resp, err), "setting %s on %s", st.Context, commit)
	}
	return nil
}

// Latest reads the newest status of every context on commit from its combined status.
//
// Gitea paginates the combined status (page and limit, newest context first) and
// counts the contexts in X-Total-Count, but the SDK's GetCombinedStatus takes no list
// options; each page is asked for through a transport that sets page and limit on the
// SDK's request, so the SDK still sends, authenticates and decodes it. Pages are read
// until the count is reached, or, from a Gitea that sends no count, until a page
// brings no context not seen before.
func (b *Backend) Latest(ctx context.Context, commit string) (map[string]commitstatus.Status, error) {
	out := map[string]commitstatus.Status{}
	for page := 1; ; page++ {
		if page > 1 {
			if err := commitstatus.NextRequest(ctx); err != nil {
				return nil, b.errorf(err, "reading statuses of %s (page %d)", commit, page)
			}
		}
		c, err := b.client(ctx, b.paged(page))
		if err != nil {
			return nil, b.errorf(err, "reading statuses of %s", commit)
		}
		cs, resp, err := c.GetCombinedStatus(b.opts.Owner, b.opts.Repo, commit)
		if err != nil {
			return nil, b.errorf(b.classify(resp, err), "reading statuses of %s (page %d)", commit, page)
		}
		added := 0
		if cs != nil {
			for _, s := range cs.Statuses {
				if s == nil {
					continue
				}
				// A context whose status changed between two pages moves to the first
				// page and may be seen twice; the page read first holds the one kept.
				if _, seen := out[s.Context]; seen {
					continue
				}
				out[s.Context] = fromGitea(s)
				added++
			}
		}
		total, counted := totalCount(resp)
		if added == 0 || (counted && len(out) >= total) {
			return out, nil
		}
	}
}

// OpenPullRequests lists the numbers of the repository's open pull requests into
// base, every page; a number is the N of refs/pull/N/head.
//
// The SDK's list options have no base filter, and Gitea filters by base_branch only in
// recent releases, older ones ignoring the parameter, so every open pull request is
// read and base.ref decides. Pages are followed through the Link header's next page,
// which Gitea computes from the page size it granted, so a MAX_RESPONSE_ITEMS below
// pageSize costs requests, not pull requests.
func (b *Backend) OpenPullRequests(ctx context.Context, base string) (map[int]bool, error) {
	c, err := b.client(ctx, b.hc)
	if err != nil {
		return nil, b.errorf(err, "listing open pull requests")
	}
	out := map[int]bool{}
	opt := sdk.ListPullRequestsOptions{ListOptions: sdk.ListOptions{Page: 1, PageSize: pageSize}, State: sdk.StateOpen}
	for {
		prs, resp, err := c.ListRepoPullRequests(b.opts.Owner, b.opts.Repo, opt)
		if err != nil {
			return nil, b.errorf(b.classify(resp, err), "listing open pull requests (page %d)", opt.Page)
		}
		for _, pr := range prs {
			// Each is judged by what Gitea says of it, not by the filter asked for.
			if pr != nil && pr.State == sdk.StateOpen && pr.Base != nil && pr.Base.Ref == base {
				out[int(pr.Index)] = true
			}
		}
		if resp == nil || resp.NextPage <= opt.Page {
			return out, nil
		}
		opt.Page = resp.NextPage
		if err := commitstatus.NextRequest(ctx); err != nil {
			return nil, b.errorf(err, "listing open pull requests (page %d)", opt.Page)
		}
	}
}

// Canonical is st as Gitea stores it: context, description and target URL trimmed of
// surrounding whitespace (git_model.NewCommitStatus does so), the description not cut
// (DescriptionLimit), the state unchanged.
func (b *Backend) Canonical(st commitstatus.Status) commitstatus.Status {
	st.Context = strings.TrimSpace(st.Context)
	st.Description = commitstatus.Truncate(strings.TrimSpace(st.Description), DescriptionLimit)
	st.TargetURL = strings.TrimSpace(st.TargetURL)
	return st
}

// fromGitea reads a status as the SDK decoded it. Gitea's API gives a status's state
// in the field "status" (api.CommitStatus), which the SDK's Status.State is tagged
// with. Flotilla's states map one to one; a state flotilla does not post (warning,
// skipped, from other tools on their own contexts) is passed on as Gitea named it.
func fromGitea(s *sdk.Status) commitstatus.Status {
	return commitstatus.Status{
		Context:     s.Context,
		State:       commitstatus.State(s.State),
		Description: s.Description,
		TargetURL:   s.TargetURL,
	}
}

func totalCount(resp *sdk.Response) (int, bool) {
	if resp == nil || resp.Response == nil {
		return 0, false
	}
	n, err := strconv.Atoi(resp.Header.Get("X-Total-Count"))
	return n, err == nil
}

// paged is the backend's HTTP client with a transport that asks for one page.
func (b *Backend) paged(page int) *http.Client {
	c := *b.hc
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	c.Transport = &pageTransport{base: base, page: page, limit: pageSize}
	return &c
}

// pageTransport sets Gitea's pagination parameters on every request it carries.
type pageTransport struct {
	base        http.RoundTripper
	page, limit int
}

func (t *pageTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	// A RoundTripper must not change the request it is given.
	r = r.Clone(r.Context())
	q := r.URL.Query()
	q.Set("page", strconv.Itoa(t.page))
	q.Set("limit", strconv.Itoa(t.limit))
	r.URL.RawQuery = q.Encode()
	return t.base.RoundTrip(r)
}

// classify turns an SDK failure into the error the Publisher acts upon. The SDK's
// error is Gitea's message, and Gitea's answer to a token it does not know repeats
// the token, so the token is taken out of the text first.
func (b *Backend) classify(resp *sdk.Response, err error) error {
	var hr *http.Response
	if resp != nil {
		hr = resp.Response
	}
	return commitstatus.Classify(hr, redact(err, b.opts.Token), time.Now())
}

// errorf wraps err with what was being done, on which repository.
func (b *Backend) errorf(err error, format string, args ...any) error {
	return fmt.Errorf("gitea: %s/%s: %s: %w", b.opts.Owner, b.opts.Repo, fmt.Sprintf(format, args...), redact(err, b.opts.Token))
}

// redacted is an error whose text had a secret in it. It unwraps only to the context
// error it may stem from, so the secret cannot be reached through it either.
type redacted struct {
	msg   string
	cause error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.cause }

func redact(err error, secret string) error {
	if err == nil || secret == "" || !strings.Contains(err.Error(), secret) {
		return err
	}
	r := &redacted{msg: strings.ReplaceAll(err.Error(), secret, "[redacted]")}
	switch {
	case errors.Is(err, context.Canceled):
		r.cause = context.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		r.cause = context.DeadlineExceeded
	}
	return r
}

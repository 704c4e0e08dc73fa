// Package gitlab keeps flotilla's commit statuses on GitLab, through its REST API (v4)
// and the GitLab client library. GitLab keeps a commit status as an external job of
// the commit's pipeline, named after the status's context. The backend also lists the
// open merge requests into a branch, GitLab's pull requests.
package gitlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	gl "gitlab.com/gitlab-org/api/client-go/v2"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
)

// DescriptionLimit is the length, in characters, GitLab allows a status description
// (CommitStatus validates description at 255; doc/api/commits.md says the same).
const DescriptionLimit = 255

// perPage is the largest page GitLab serves.
const perPage = 100

// externalStage is the stage GitLab puts every status posted through the API in;
// reading only it leaves out the jobs of the project's own CI.
const externalStage = "external"

// Options configure a Backend.
type Options struct {
	// URL is GitLab's base URL, e.g. https://gitlab.example.com; the API is under /api/v4.
	URL string
	// Project is the project's numeric ID or its full path, e.g. "fleet/gpu-fleet".
	Project string
	// Token is a project or personal access token allowed to post statuses and read
	// merge requests (api scope), sent as PRIVATE-TOKEN. It never appears in an error.
	Token string
	// HTTPClient sends the requests; nil for a pooled default.
	HTTPClient *http.Client
}

// Backend is a commitstatus.Backend on one GitLab project. It is safe for concurrent use.
type Backend struct {
	client  *gl.Client
	project string
	quota   *commitstatus.QuotaTracker
}

var (
	_ commitstatus.Backend           = (*Backend)(nil)
	_ commitstatus.PullRequestLister = (*Backend)(nil)
	_ commitstatus.Limited           = (*Backend)(nil)
)

// RateWindow is the period of GitLab's RateLimit-Limit: "the request quota for the
// client each minute".
const RateWindow = time.Minute

// New returns a Backend for opts.Project on the GitLab at opts.URL.
func New(opts Options) (*Backend, error) {
	if opts.Project == "" {
		return nil, errors.New("gitlab: no project")
	}
	u, err := url.Parse(opts.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("gitlab: project %s: the URL %q is not an http(s) URL", opts.Project, opts.URL)
	}
	if opts.Token == "" {
		return nil, fmt.Errorf("gitlab: project %s: no token", opts.Project)
	}
	copts := []gl.ClientOptionFunc{
		gl.WithURLWarningLogger(slog.New(slog.DiscardHandler)),
		gl.WithBaseURL(opts.URL),
		// The client retries 429 and 5xx answers itself by default, on a backoff of its
		// own that reads RateLimit-Reset but not Retry-After. commitstatus.Publisher already
		// retries what commitstatus.Classify marks retryable, waiting as long as Retry-After
		// says and bounding the wait; two policies stacked would multiply the attempts
		// and hide the forge's answers from it.
		gl.WithoutRetries(),
	}
	// GitLab states its budget in RateLimit-* headers on the answers it refuses for a
	// rate limit (doc/administration/settings/user_and_ip_rate_limits.md, "Response
	// headers"), not on the others: the Publisher learns the limit at the first refusal
	// and paces by it from then on.
	quota := &commitstatus.QuotaTracker{Prefix: "RateLimit-", Window: RateWindow}
	hc := &http.Client{}
	if opts.HTTPClient != nil {
		c := *opts.HTTPClient
		hc = &c
	}
	hc.Transport = quota.Transport(hc.Transport)
	copts = append(copts, gl.WithHTTPClient(hc))
	c, err := gl.NewClient(opts.Token, copts...)
	if err != nil {
		return nil, fmt.Errorf("gitlab: project %s: %w", opts.Project, err)
	}
	return &Backend{client: c, project: opts.Project, quota: quota}, nil
}

// Limits are the budget GitLab stated when it last refused a request, if it did.
func (b *Backend) Limits() commitstatus.Limits {
	q, ok := b.quota.Quota()
	return commitstatus.Limits{Quota: q, Stated: ok}
}

// ForgeState is GitLab's state for a flotilla state. GitLab has no error state: an
// error is a failed job.
func ForgeState(s commitstatus.State) string {
	switch s {
	case commitstatus.Success:
		return string(gl.Success)
	case commitstatus.Failure, commitstatus.Error:
		return string(gl.Failed)
	}
	return string(gl.Pending)
}

// state is the flotilla state of a GitLab job state.
func state(s string) commitstatus.State {
	switch gl.BuildStateValue(s) {
	case gl.Success:
		return commitstatus.Success
	case gl.Pending, gl.Running, gl.Created, gl.WaitingForResource, gl.Preparing, gl.Scheduled, gl.Manual:
		return commitstatus.Pending
	}
	// failed, canceled, skipped: the work did not succeed.
	return commitstatus.Failure
}

// Canonical folds Error onto Failure, which is what GitLab gives back for both, and cuts
// the description to DescriptionLimit. A blank description or target URL reads back as
// none: GitLab does not store blank optional attributes.
func (b *Backend) Canonical(st commitstatus.Status) commitstatus.Status {
	if st.State == commitstatus.Error {
		st.State = commitstatus.Failure
	}
	st.Description = commitstatus.Truncate(st.Description, DescriptionLimit)
	if strings.TrimSpace(st.Description) == "" {
		st.Description = ""
	}
	if strings.TrimSpace(st.TargetURL) == "" {
		st.TargetURL = ""
	}
	return st
}

// Set posts st as a job state of commit's pipeline.
//
// GitLab updates a pending or running job of the same name in place, through its state
// machine, and refuses a transition that machine lacks: a pending job cannot be made
// pending again ("Cannot transition status via :enqueue from :pending"), so a new
// description of a pending status cannot be posted as such. What GitLab does allow is a
// new job once the open one is done (doc/ci/ci_cd_for_external_repos/
// external_commit_statuses.md, "Job updates and retries"): Set cancels the open job and
// posts the status again, as a new job that hides the canceled one.
func (b *Backend) Set(ctx context.Context, commit string, st commitstatus.Status) error {
	st = b.Canonical(st)
	want := ForgeState(st.State)
	got, err := b.post(ctx, commit, st, want, true)
	if err != nil && refusedTransition(err) {
		got, err = b.reopen(ctx, commit, st, want, gl.Pending)
	}
	if err != nil {
		return err
	}
	// On an update in place GitLab keeps the old description or target URL where the
	// new one is blank; a new job has none, as asked.
	if (st.Description == "" && got.Description != "") || (st.TargetURL == "" && got.TargetURL != "") {
		if _, err := b.reopen(ctx, commit, st, want, gl.BuildStateValue(got.Status)); err != nil {
			return err
		}
	}
	return nil
}

// reopen posts st as a new job: it cancels the open job of its context first when
// current, the state of that job, is pending or running.
func (b *Backend) reopen(ctx context.Context, commit string, st commitstatus.Status, want string, current gl.BuildStateValue) (*gl.CommitStatus, error) {
	if current == gl.Pending || current == gl.Running {
		// Only the state: the canceled job keeps its own description.
		if _, err := b.next(ctx, commit, commitstatus.Status{Context: st.Context}, string(gl.Canceled), false); err != nil {
			return nil, err
		}
	}
	return b.next(ctx, commit, st, want, true)
}

// next posts as post does, a further request of Set, when the Publisher lets it go.
func (b *Backend) next(ctx context.Context, commit string, st commitstatus.Status, forgeState string, fields bool) (*gl.CommitStatus, error) {
	if err := commitstatus.NextRequest(ctx); err != nil {
		return nil, fmt.Errorf("gitlab: project %s, commit %s: setting %s to %s: %w", b.project, commit, st.Context, forgeState, err)
	}
	return b.post(ctx, commit, st, forgeState, fields)
}

func (b *Backend) post(ctx context.Context, commit string, st commitstatus.Status, forgeState string, fields bool) (*gl.CommitStatus, error) {
	opt := &gl.SetCommitStatusOptions{State: gl.BuildStateValue(forgeState), Name: gl.Ptr(st.Context)}
	if fields {
		opt.Description = gl.Ptr(commitstatus.Truncate(st.Description, DescriptionLimit))
		opt.TargetURL = gl.Ptr(st.TargetURL)
	}
	cs, resp, err := b.client.Commits.SetCommitStatus(b.project, commit, opt, gl.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("gitlab: project %s, commit %s: setting %s to %s: %w", b.project, commit, st.Context, forgeState, classify(resp, err))
	}
	return cs, nil
}

// refusedTransition reports whether GitLab refused to make an open job pending again.
func refusedTransition(err error) bool {
	var er *gl.ErrorResponse
	if !errors.As(err, &er) || er.StatusCode != http.StatusBadRequest {
		return false
	}
	var body struct {
		Message any `json:"message"`
	}
	if json.Unmarshal(er.Body, &body) != nil {
		return false
	}
	m, _ := body.Message.(string)
	return strings.HasPrefix(m, "Cannot transition status via :enqueue from :")
}

// Latest reads the statuses of commit's external stage, every page of them, and keeps
// the newest job of each name.
//
// Without `all`, GitLab lists the latest job of each name in each pipeline (the jobs
// that hid no newer one; lib/api/commit_statuses.rb), and with it every job; a commit
// with pipelines on several refs has a job of a name in each. Keeping the job with the
// highest ID per name, IDs being assigned in creation order, reads the newest either
// way.
func (b *Backend) Latest(ctx context.Context, commit string) (map[string]commitstatus.Status, error) {
	opt := &gl.GetCommitStatusesOptions{
		ListOptions: gl.ListOptions{PerPage: perPage, Page: 1},
		Stage:       gl.Ptr(externalStage),
	}
	newest := map[string]*gl.CommitStatus{}
	for {
		page, resp, err := b.client.Commits.GetCommitStatuses(b.project, commit, opt, gl.WithContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("gitlab: project %s, commit %s: listing statuses: %w", b.project, commit, classify(resp, err))
		}
		for _, cs := range page {
			if cur, ok := newest[cs.Name]; !ok || cs.ID > cur.ID {
				newest[cs.Name] = cs
			}
		}
		if resp.NextPage == 0 {
			break
		}
		if resp.NextPage <= opt.Page {
			return nil, fmt.Errorf("gitlab: project %s, commit %s: listing statuses: page %d links back to page %d", b.project, commit, opt.Page, resp.NextPage)
		}
		opt.Page = resp.NextPage
		if err := commitstatus.NextRequest(ctx); err != nil {
			return nil, fmt.Errorf("gitlab: project %s, commit %s: listing statuses (page %d): %w", b.project, commit, opt.Page, err)
		}
	}
	out := make(map[string]commitstatus.Status, len(newest))
	for name, cs := range newest {
		out[name] = commitstatus.Status{Context: name, State: state(cs.Status), Description: cs.Description, TargetURL: cs.TargetURL}
	}
	return out, nil
}

// classify is commitstatus.Classify on the client's answer, and a 409 retryable: GitLab
// answers it while another update of the commit holds the lock, and documents a retry
// as the way to handle it.
func classify(resp *gl.Response, err error) error {
	var hr *http.Response
	if resp != nil {
		hr = resp.Response
	}
	if hr != nil && hr.StatusCode == http.StatusConflict {
		return commitstatus.Retryable(err, commitstatus.RetryAfter(hr.Header, time.Now()))
	}
	return commitstatus.Classify(hr, err, time.Now())
}

// OpenPullRequests lists the IIDs of the project's open merge requests into base, every
// page: the IID is the N of refs/merge-requests/N/head, and GitLab's API filters by
// state and target branch itself.
func (b *Backend) OpenPullRequests(ctx context.Context, base string) (map[int]bool, error) {
	opt := &gl.ListProjectMergeRequestsOptions{
		ListOptions:  gl.ListOptions{PerPage: perPage, Page: 1},
		State:        gl.Ptr("opened"),
		TargetBranch: gl.Ptr(base),
	}
	out := map[int]bool{}
	for {
		mrs, resp, err := b.client.MergeRequests.ListProjectMergeRequests(b.project, opt, gl.WithContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("gitlab: project %s: listing open merge requests into %s: %w", b.project, base, classify(resp, err))
		}
		for _, mr := range mrs {
			// Each is judged by what GitLab says of it, not by the filter asked for.
			if mr != nil && mr.State == "opened" && mr.TargetBranch == base {
				out[int(mr.IID)] = true
			}
		}
		if resp == nil || resp.NextPage <= opt.Page {
			return out, nil
		}
		opt.Page = resp.NextPage
		if err := commitstatus.NextRequest(ctx); err != nil {
			return nil, fmt.Errorf("gitlab: project %s: listing open merge requests into %s (page %d): %w", b.project, base, opt.Page, err)
		}
	}
}

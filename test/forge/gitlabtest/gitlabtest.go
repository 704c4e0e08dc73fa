// Package gitlabtest is an in-process GitLab REST API (v4) for tests: the two commit
// status endpoints, answered the way GitLab documents them (doc/api/commits.md, "Commit
// status") and implements them (lib/api/commit_statuses.rb,
// app/services/ci/create_commit_status_service.rb, app/models/commit_status.rb), on top
// of a forge.Store.
//
// GitLab keeps a commit status as an external job in the commit's pipeline. A post
// whose name matches a pending or running job of the same ref updates that job in
// place, through its state machine, and refuses a transition the machine lacks
// (pending → pending among them); any other post adds a new job and hides the older
// ones of that name ("retried"). The Store holds one record per job, so Store.Count
// stays the number of statuses GitLab holds for a commit and name; an update in place
// is kept beside the Store, and All reads the records with it applied.
//
// Beside the statuses it lists the project's merge requests (doc/api/merge_requests.md,
// "List project merge requests"; lib/api/merge_requests.rb), which a test records with
// SetMergeRequest.
package gitlabtest

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/flotilla-gitops/flotilla/test/forge"
)

const (
	// DefaultBranch is the branch every commit from NewCommit is on, and so the ref a
	// status posted without one is attached to.
	DefaultBranch = "main"

	// DefaultName is the name of a status posted with neither name nor context.
	DefaultName = "default"

	// ProjectPath and ProjectID name the one project the server knows.
	ProjectPath       = "fleet/gpu-fleet"
	ProjectID   int64 = 4242

	apiPrefix = "/api/v4"

	// Offset pagination (doc/api/rest/_index.md, "Offset-based pagination"): per_page
	// defaults to 20 and is capped at 100 (Kaminari's max_per_page).
	defaultPerPage = 20
	maxPerPage     = 100
	// Above this many rows GitLab stops counting and leaves out X-Total, X-Total-Pages
	// and the "last" link (Gitlab::Pagination::OffsetPagination, MAX_COUNT_LIMIT).
	maxCount = 10000

	// CommitStatus validates ref, target_url and description at 255 characters.
	maxLength = 255

	// externalStage is the stage GitLab puts every posted status in.
	externalStage = "external"
)

// Server is a running test GitLab. Its fields are set by Start and read-only after.
type Server struct {
	// URL is GitLab's base URL; the API is under URL + "/api/v4".
	URL string
	// Project is the project's full path, which the API takes URL-encoded wherever it
	// takes ID, the numeric ID.
	Project string
	ID      int64
	// Token is the only access token accepted, as PRIVATE-TOKEN or Authorization: Bearer.
	Token string
	// Store keeps the statuses, one record per job; see All for their current fields.
	Store *forge.Store

	mu sync.Mutex
	// jobs is what GitLab keeps of a job beyond a forge.Record, and the fields an update
	// in place changed since the Store recorded it. Records the Store got directly (Add,
	// Fill) have no entry: they are jobs on DefaultBranch as recorded.
	jobs      map[int64]*job
	pipelines []pipeline
	// pipelineIDs counts the pipelines ever created, which name them.
	pipelineIDs int64
	// mergeRequests are the project's merge requests by IID.
	mergeRequests map[int64]mergeRequest
}

// mergeRequest is what the server keeps of a merge request.
type mergeRequest struct {
	targetBranch string
	state        string // "opened" or "closed"
}

type job struct {
	ref               string
	state             string
	description       string
	targetURL         string
	started, finished *time.Time
	coverage          *float64
}

type pipeline struct {
	id       int64
	sha, ref string
}

// Start serves a new GitLab until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{
		Project: ProjectPath,
		ID:      ProjectID,
		Token:   "glpat-" + forge.RandomHex(10),
		Store:   forge.NewStore(),
		jobs:    map[int64]*job{},
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// NewCommit registers a new commit on DefaultBranch and returns its 40-hex SHA.
func (s *Server) NewCommit() string {
	return s.Store.NewCommit()
}

// SetRateLimit turns on the authenticated API request rate limit (off by default on a
// self-managed GitLab) at limit requests per window. As Rack::Attack does, a request over
// it is answered 429 "Retry later" with Retry-After and the RateLimit-* headers; the
// answers it lets through state nothing of the budget.
func (s *Server) SetRateLimit(limit int, window time.Duration) {
	s.Store.SetRateLimit(limit, window)
}

// SetMergeRequest records merge request iid into targetBranch as open or closed, for
// GET /projects/:id/merge_requests.
func (s *Server) SetMergeRequest(iid int, targetBranch string, open bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mergeRequests == nil {
		s.mergeRequests = map[int64]mergeRequest{}
	}
	s.mergeRequests[int64(iid)] = mergeRequest{targetBranch: targetBranch, state: map[bool]string{true: "opened", false: "closed"}[open]}
}

// Forget drops commits with their statuses, jobs and pipelines, as Store.Forget does;
// the statuses of a commit must be dropped here, not in the Store alone, so that its
// jobs go too.
func (s *Server) Forget(commits ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range commits {
		c = strings.ToLower(c)
		for _, r := range s.Store.All(c) {
			delete(s.jobs, r.ID)
		}
		s.pipelines = slices.DeleteFunc(s.pipelines, func(p pipeline) bool { return p.sha == c })
	}
	s.Store.Forget(commits...)
}

// All is every status of commit, newest first, with the updates GitLab made in place
// applied: what a reader of GitLab sees, where Store.All shows each job as first
// recorded.
func (s *Server) All(commit string) []forge.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []forge.Record
	for _, e := range s.entries(strings.ToLower(commit)) {
		out = append(out, e.Record)
	}
	slices.Reverse(out)
	return out
}

// entry is a job as the API shows it.
type entry struct {
	forge.Record
	ref               string
	pipeline          int64
	started, finished *time.Time
	coverage          *float64
	// latest is false for a job a newer one of the same name and pipeline hid.
	latest bool
}

// entries is every job of sha, oldest first. The caller holds s.mu.
func (s *Server) entries(sha string) []entry {
	recs := s.Store.All(sha)
	slices.Reverse(recs)
	out := make([]entry, 0, len(recs))
	newest := map[[2]string]int{}
	for _, r := range recs {
		e := entry{Record: r, ref: DefaultBranch}
		if j, ok := s.jobs[r.ID]; ok {
			e.ref, e.State, e.Description, e.TargetURL = j.ref, j.state, j.description, j.targetURL
			e.started, e.finished, e.coverage = j.started, j.finished, j.coverage
		} else if finishedState(r.State) {
			created := r.Created
			e.finished = &created
		}
		e.pipeline = s.pipelineFor(sha, e.ref).id
		// The newest job of a name hides the older ones of its pipeline
		// (CommitStatus#update_older_statuses_retried!); one pipeline per ref here.
		key := [2]string{e.Context, e.ref}
		if i, ok := newest[key]; ok {
			out[i].latest = false
		}
		newest[key] = len(out)
		e.latest = true
		out = append(out, e)
	}
	return out
}

// pipelineFor is the pipeline of sha and ref, created on first use as GitLab creates an
// external pipeline for the first status of a ref. The caller holds s.mu.
func (s *Server) pipelineFor(sha, ref string) pipeline {
	for _, p := range s.pipelines {
		if p.sha == sha && p.ref == ref {
			return p
		}
	}
	s.pipelineIDs++
	p := pipeline{id: 1000 + s.pipelineIDs, sha: sha, ref: ref}
	s.pipelines = append(s.pipelines, p)
	return p
}

func finishedState(state string) bool {
	return state == "success" || state == "failed" || state == "canceled"
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f, ok := s.Store.Begin(r.Method, r.URL.Path); ok {
		s.fault(w, r, f)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), apiPrefix+"/projects/")
	if !ok {
		notFoundRoute(w)
		return
	}
	// The project ID is one path segment: a path must be URL-encoded
	// (API::NAMESPACE_OR_PROJECT_REQUIREMENTS), so "fleet/gpu-fleet" unencoded is no route.
	seg := strings.Split(rest, "/")
	var (
		handler func(http.ResponseWriter, *http.Request, string, string)
		allow   string
		rawSHA  string
	)
	switch {
	case len(seg) == 2 && seg[1] == "merge_requests":
		s.serveMergeRequests(w, r, seg[0])
		return
	case len(seg) == 3 && seg[1] == "statuses":
		handler, allow, rawSHA = s.postStatus, http.MethodPost, seg[2]
	case len(seg) == 5 && seg[1] == "repository" && seg[2] == "commits" && seg[4] == "statuses":
		handler, allow, rawSHA = s.listStatuses, http.MethodGet, seg[3]
	default:
		notFoundRoute(w)
		return
	}
	// Grape answers HEAD for every GET route; net/http leaves the body out.
	if r.Method != allow && (r.Method != http.MethodHead || allow != http.MethodGet) {
		w.Header().Set("Allow", allow+", OPTIONS")
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "405 Not Allowed"})
		return
	}
	id, err1 := url.PathUnescape(seg[0])
	sha, err2 := url.PathUnescape(rawSHA)
	if err1 != nil || err2 != nil || id == "" || sha == "" {
		notFoundRoute(w)
		return
	}
	// Every commit status route authenticates first (before { authenticate! }).
	if !s.authenticated(r) {
		writeJSON(w, http.StatusUnauthorized, message("401 Unauthorized"))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	handler(w, r, id, sha)
}

// authenticated accepts the token as PRIVATE-TOKEN or as an OAuth-style bearer token,
// both of which GitLab takes for personal and project access tokens
// (doc/api/rest/authentication.md).
func (s *Server) authenticated(r *http.Request) bool {
	tok := token(r)
	return tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.Token)) == 1
}

// token is the access token a request carries, "" for none.
func token(r *http.Request) string {
	tok := r.Header.Get("PRIVATE-TOKEN")
	if tok == "" {
		if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			tok = v
		}
	}
	return tok
}

// project finds the project by numeric ID or by full path, which GitLab matches without
// regard to case.
func (s *Server) project(id string) bool {
	if n, err := strconv.ParseInt(id, 10, 64); err == nil {
		return n == s.ID
	}
	return strings.EqualFold(id, s.Project)
}

// fault answers an injected failure with GitLab's shape for it. A rate limit is
// Rack::Attack's: a plain-text "Retry later" with the RateLimit-* headers it sends on
// a throttled request (doc/administration/settings/user_and_ip_rate_limits.md,
// "Response headers"); everything else is the API's {"message": "<code> <reason>"}.
func (s *Server) fault(w http.ResponseWriter, r *http.Request, f forge.Fault) {
	secs := int64((f.RetryAfter + time.Second - 1) / time.Second)
	if f.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	if f.Code == http.StatusTooManyRequests {
		reset := time.Now().Add(time.Duration(secs) * time.Second)
		// An injected fault stands for GitLab.com's authenticated API limit, 2,000 a
		// minute; the limit SetRateLimit set is stated as GitLab states a limit of
		// another period: "the request quota for the client each minute".
		limit, observed := "2000", "2001"
		if q := f.Quota; q != nil {
			limit = strconv.Itoa(int(float64(q.Limit) * float64(time.Minute) / float64(q.Window)))
			observed = strconv.Itoa(q.Used + 1)
		}
		h := w.Header()
		h.Set("RateLimit-Name", "throttle_authenticated_api")
		h.Set("RateLimit-Limit", limit)
		h.Set("RateLimit-Observed", observed)
		h.Set("RateLimit-Remaining", "0")
		h.Set("RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
		h.Set("RateLimit-ResetTime", reset.UTC().Format(http.TimeFormat))
		h.Set("Content-Type", "text/plain")
		w.WriteHeader(f.Code)
		_, _ = fmt.Fprint(w, "Retry later\n")
		return
	}
	msg := fmt.Sprintf("%d %s", f.Code, http.StatusText(f.Code))
	if f.Code == http.StatusConflict && r.Method == http.MethodPost {
		// Ci::CreateCommitStatusService, when another update of the SHA holds the lock.
		msg = "Another update to this commit status is in progress"
	}
	writeJSON(w, f.Code, message(msg))
}

func message(m any) map[string]any { return map[string]any{"message": m} }

// notFoundRoute is the API's catch-all answer for a path it has no route for.
func notFoundRoute(w http.ResponseWriter) {
	writeJSON(w, http.StatusNotFound, map[string]string{"error": "404 Not Found"})
}

// validationError is Grape's answer to parameters that fail their declaration.
func validationError(w http.ResponseWriter, errs []string) {
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": strings.Join(errs, ", ")})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// params reads a request's parameters the way Grape merges them: the query string,
// then a form or JSON body.
func params(r *http.Request) (url.Values, error) {
	v := r.URL.Query()
	if r.Body == nil || r.Method == http.MethodGet {
		return v, nil
	}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "application/json":
		var body map[string]any
		dec := json.NewDecoder(r.Body)
		dec.UseNumber()
		if err := dec.Decode(&body); err != nil {
			return nil, err
		}
		for k, x := range body {
			switch x := x.(type) {
			case nil:
			case string:
				v.Set(k, x)
			case json.Number:
				v.Set(k, x.String())
			case bool:
				v.Set(k, strconv.FormatBool(x))
			default:
				b, _ := json.Marshal(x)
				v.Set(k, string(b))
			}
		}
	case "application/x-www-form-urlencoded", "multipart/form-data":
		if err := r.ParseMultipartForm(1 << 20); err != nil && err != http.ErrNotMultipart {
			return nil, err
		}
		for k, xs := range r.PostForm {
			v[k] = xs
		}
	}
	return v, nil
}

// Ruby's blank?: attributes_for_keys leaves out blank optional attributes, so a blank
// description or target URL is not stored, and on an update in place the old one stays.
func blank(s string) bool { return strings.TrimSpace(s) == "" }

// states are the values POST accepts for state (doc/api/commits.md).
var states = []string{"pending", "running", "success", "failed", "canceled", "skipped"}

// postStatus is POST /projects/:id/statuses/:sha ("Set commit pipeline status").
func (s *Server) postStatus(w http.ResponseWriter, r *http.Request, id, sha string) {
	p, err := params(r)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, message("400 Bad request - "+err.Error()))
		return
	}
	var errs []string
	state := p.Get("state")
	switch {
	case !p.Has("state"):
		errs = append(errs, "state is missing")
	case !slices.Contains(states, state):
		errs = append(errs, "state does not have a valid value")
	}
	var coverage *float64
	if p.Has("coverage") {
		f, err := strconv.ParseFloat(p.Get("coverage"), 64)
		if err != nil {
			errs = append(errs, "coverage is invalid")
		}
		coverage = &f
	}
	var pipelineID int64
	if p.Has("pipeline_id") {
		if pipelineID, err = strconv.ParseInt(p.Get("pipeline_id"), 10, 64); err != nil {
			errs = append(errs, "pipeline_id is invalid")
		}
	}
	if len(errs) > 0 {
		validationError(w, errs)
		return
	}
	if !s.project(id) {
		writeJSON(w, http.StatusNotFound, message("404 Project Not Found"))
		return
	}
	sha = strings.ToLower(sha)
	if !s.Store.Known(sha) {
		writeJSON(w, http.StatusNotFound, message("404 Commit Not Found"))
		return
	}

	// The ref is the one given, else that of the newest pipeline of the SHA, else the
	// first branch holding the commit.
	ref, refGiven := p.Get("ref"), p.Has("ref")
	if refGiven && blank(ref) {
		writeJSON(w, http.StatusNotFound, message("404 References for commit Not Found"))
		return
	}
	var pl *pipeline
	for i := len(s.pipelines) - 1; i >= 0; i-- {
		c := s.pipelines[i]
		if c.sha == sha && (!refGiven || c.ref == ref) && (pipelineID == 0 || c.id == pipelineID) {
			pl = &c
			break
		}
	}
	if pipelineID != 0 && pl == nil {
		writeJSON(w, http.StatusNotFound, message("404 Pipeline for pipeline_id, sha and ref Not Found"))
		return
	}
	switch {
	case refGiven:
	case pl != nil:
		ref = pl.ref
	default:
		ref = DefaultBranch
	}
	name := DefaultName
	if p.Has("name") {
		name = p.Get("name")
	} else if p.Has("context") {
		name = p.Get("context")
	}

	// The job to update: a pending or running one of this name and ref, else a new one.
	// GitLab's scope also takes the user and does not ask for the latest job; with one
	// user, as here, the open job GitLab finds is the latest of its name, except in a
	// history a test wrote into the Store directly, where the latest is the one meant.
	var cur *entry
	all := s.entries(sha)
	for i := len(all) - 1; i >= 0; i-- {
		if e := &all[i]; e.latest && e.Context == name && e.ref == ref && (e.State == "pending" || e.State == "running") {
			cur = e
			break
		}
	}
	j := &job{ref: ref, state: "created"}
	if cur != nil {
		j = &job{ref: ref, state: cur.State, description: cur.Description, targetURL: cur.TargetURL,
			started: cur.started, finished: cur.finished, coverage: cur.coverage}
	}
	if d := p.Get("description"); !blank(d) {
		j.description = d
	}
	if u := p.Get("target_url"); !blank(u) {
		j.targetURL = u
	}
	if coverage != nil {
		j.coverage = coverage
	}

	// CommitStatus validations, checked before the transition.
	invalid := map[string][]string{}
	if blank(name) {
		invalid["name"] = []string{"can't be blank"}
	}
	for field, v := range map[string]string{"ref": ref, "target_url": j.targetURL, "description": j.description} {
		if utf8.RuneCountInString(v) > maxLength {
			invalid[field] = []string{fmt.Sprintf("is too long (maximum is %d characters)", maxLength)}
		}
	}
	if len(invalid) > 0 {
		writeJSON(w, http.StatusBadRequest, message(invalid))
		return
	}

	now := time.Now().UTC()
	if cur != nil && now.Before(cur.Created) {
		now = cur.Created
	}
	next, refused := transition(j.state, state)
	if refused != "" {
		// StateMachines::InvalidTransition: nothing is saved.
		writeJSON(w, http.StatusBadRequest, message(refused))
		return
	}
	if next == "running" && j.started == nil {
		j.started = &now
	}
	if finishedState(next) {
		j.finished = &now
	}
	j.state = next

	var rec forge.Record
	if cur != nil {
		rec = cur.Record
	} else {
		rec = s.Store.Add(sha, forge.Record{Context: name, State: next, Description: j.description, TargetURL: j.targetURL})
		// A new job and its transition are one request: its times are its creation's.
		if j.started != nil {
			j.started = &rec.Created
		}
		if j.finished != nil {
			j.finished = &rec.Created
		}
	}
	s.jobs[rec.ID] = j
	rec.State, rec.Description, rec.TargetURL = j.state, j.description, j.targetURL
	e := entry{Record: rec, ref: ref, pipeline: s.pipelineFor(sha, ref).id,
		started: j.started, finished: j.finished, coverage: j.coverage, latest: true}
	writeJSON(w, http.StatusCreated, s.render(sha, e))
}

// transition applies the event GitLab's API fires for the requested state
// (Ci::CreateCommitStatusService#apply_job_state!) to a job in state from (created,
// pending or running), following CommitStatus's state machine. It returns the new
// state, or the message of the InvalidTransition GitLab answers 400 with.
func transition(from, to string) (next, refused string) {
	refuse := func(event, from string) (string, string) {
		return "", fmt.Sprintf("Cannot transition status via :%s from :%s (Reason(s): Status cannot transition via %q)", event, from, event)
	}
	switch to {
	case "pending": // enqueue!: created → pending
		if from != "created" {
			return refuse("enqueue", from)
		}
		return "pending", ""
	case "running": // enqueue (quietly refused unless created), then run!: pending → running
		if from == "created" {
			from = "pending"
		}
		if from != "pending" {
			return refuse("run", from)
		}
		return "running", ""
	case "skipped": // skip!: created, pending → skipped
		if from == "running" {
			return refuse("skip", from)
		}
		return "skipped", ""
	}
	// success!, drop!, cancel!: from created, pending and running alike.
	return to, ""
}

type user struct {
	ID        int64  `json:"id"`
	Username  string `json:"username"`
	Name      string `json:"name"`
	State     string `json:"state"`
	Locked    bool   `json:"locked"`
	AvatarURL string `json:"avatar_url"`
	WebURL    string `json:"web_url"`
}

// commitStatus is API::Entities::CommitStatus.
type commitStatus struct {
	ID           int64    `json:"id"`
	SHA          string   `json:"sha"`
	Ref          string   `json:"ref"`
	Status       string   `json:"status"`
	Name         string   `json:"name"`
	TargetURL    *string  `json:"target_url"`
	Description  *string  `json:"description"`
	CreatedAt    apiTime  `json:"created_at"`
	StartedAt    *apiTime `json:"started_at"`
	FinishedAt   *apiTime `json:"finished_at"`
	AllowFailure bool     `json:"allow_failure"`
	Coverage     *float64 `json:"coverage"`
	PipelineID   int64    `json:"pipeline_id"`
	Author       user     `json:"author"`
}

// apiTime is a time as GitLab's API writes it: ISO 8601 in UTC with milliseconds.
type apiTime time.Time

func (t apiTime) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Time(t).UTC().Format("2006-01-02T15:04:05.000Z") + `"`), nil
}

func optTime(t *time.Time) *apiTime {
	if t == nil {
		return nil
	}
	a := apiTime(*t)
	return &a
}

// optString is an attribute GitLab stores as NULL when it was never given.
func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (s *Server) render(sha string, e entry) commitStatus {
	return commitStatus{
		ID: e.ID, SHA: sha, Ref: e.ref, Status: e.State, Name: e.Context,
		TargetURL: optString(e.TargetURL), Description: optString(e.Description),
		CreatedAt: apiTime(e.Created), StartedAt: optTime(e.started), FinishedAt: optTime(e.finished),
		Coverage: e.coverage, PipelineID: e.pipeline,
		Author: s.bot(),
	}
}

// bot is the user the server's token belongs to.
func (s *Server) bot() user {
	return user{ID: 1, Username: "flotilla-bot", Name: "Flotilla Bot", State: "active",
		AvatarURL: s.URL + "/uploads/-/system/user/avatar/1/avatar.png", WebURL: s.URL + "/flotilla-bot"}
}

// grapeBool is Grape's Boolean coercion.
func grapeBool(v string) (bool, bool) {
	switch strings.ToLower(v) {
	case "1", "on", "t", "true", "y", "yes":
		return true, true
	case "0", "off", "f", "false", "n", "no":
		return false, true
	}
	return false, false
}

// listStatuses is GET /projects/:id/repository/commits/:sha/statuses ("List commit
// statuses").
func (s *Server) listStatuses(w http.ResponseWriter, r *http.Request, id, sha string) {
	q := r.URL.Query()
	var errs []string
	all := false
	if q.Has("all") {
		var ok bool
		if all, ok = grapeBool(q.Get("all")); !ok {
			errs = append(errs, "all is invalid")
		}
	}
	var pipelineID int64
	if q.Has("pipeline_id") {
		var err error
		if pipelineID, err = strconv.ParseInt(q.Get("pipeline_id"), 10, 64); err != nil {
			errs = append(errs, "pipeline_id is invalid")
		}
	}
	orderBy, sortDir := "id", "asc"
	if q.Has("order_by") {
		if orderBy = q.Get("order_by"); orderBy != "id" && orderBy != "pipeline_id" {
			errs = append(errs, "order_by does not have a valid value")
		}
	}
	if q.Has("sort") {
		if sortDir = q.Get("sort"); sortDir != "asc" && sortDir != "desc" {
			errs = append(errs, "sort does not have a valid value")
		}
	}
	pg := readPagination(q, &errs)
	if len(errs) > 0 {
		validationError(w, errs)
		return
	}
	if errs := pg.verify(); len(errs) > 0 {
		validationError(w, errs)
		return
	}

	if !s.project(id) {
		writeJSON(w, http.StatusNotFound, message("404 Project Not Found"))
		return
	}
	sha = strings.ToLower(sha)
	if !s.Store.Known(sha) {
		writeJSON(w, http.StatusNotFound, message("404 Commit Not Found"))
		return
	}

	var list []entry
	for _, e := range s.entries(sha) {
		switch {
		case !all && !e.latest: // "If true, include all statuses instead of latest only."
		case pipelineID != 0 && e.pipeline != pipelineID:
		case q.Get("ref") != "" && e.ref != q.Get("ref"):
		case q.Get("stage") != "" && q.Get("stage") != externalStage:
		case q.Get("name") != "" && e.Context != q.Get("name"):
		default:
			list = append(list, e)
		}
	}
	slices.SortStableFunc(list, func(a, b entry) int {
		c := int(a.ID - b.ID)
		if orderBy == "pipeline_id" && a.pipeline != b.pipeline {
			c = int(a.pipeline - b.pipeline)
		}
		if sortDir == "desc" {
			c = -c
		}
		return c
	})

	from, to := pg.window(len(list))
	out := make([]commitStatus, 0, to-from)
	for _, e := range list[from:to] {
		out = append(out, s.render(sha, e))
	}
	s.paginate(w, r, pg, len(list), url.Values{"id": {id}, "sha": {sha}, "order_by": {orderBy}})
	writeJSON(w, http.StatusOK, out)
}

// pagination is a request's page and per_page (PaginationParams).
type pagination struct {
	page, perPage     int
	pageOK, perPageOK bool
}

// readPagination reads page and per_page, defaulting to page 1 of 20, adding Grape's
// coercion errors to errs; verify checks the values once coercion has passed.
func readPagination(q url.Values, errs *[]string) pagination {
	pg := pagination{page: 1, perPage: defaultPerPage, pageOK: true, perPageOK: true}
	if q.Has("page") {
		var err error
		if pg.page, err = strconv.Atoi(q.Get("page")); err != nil {
			*errs, pg.pageOK = append(*errs, "page is invalid"), false
		}
	}
	if q.Has("per_page") {
		var err error
		if pg.perPage, err = strconv.Atoi(q.Get("per_page")); err != nil {
			*errs, pg.perPageOK = append(*errs, "per_page is invalid"), false
		} else if pg.perPage == 0 {
			*errs = append(*errs, "per_page has a value not allowed")
		}
	}
	return pg
}

// verify is PaginationParams#verify_pagination_params!; it caps per_page at 100.
func (pg *pagination) verify() []string {
	if pg.pageOK && pg.page < 1 {
		return []string{"page does not have a valid value"}
	}
	if pg.perPageOK && pg.perPage < 1 {
		return []string{"per_page does not have a valid value"}
	}
	pg.perPage = min(pg.perPage, maxPerPage)
	return nil
}

// window is the slice [from, to) of n items that the page shows.
func (pg pagination) window(n int) (from, to int) {
	from = min((pg.page-1)*pg.perPage, n)
	return from, min(from+pg.perPage, n)
}

// paginate writes Gitlab::Pagination::OffsetHeaderBuilder's headers for a page of
// total items: X-Next-Page and X-Prev-Page are empty where there is no such page, and
// above maxCount items the total, the page count and the "last" link are left out. The
// Link URLs carry every parameter of the request and the route's and defaulted ones in
// params.
func (s *Server) paginate(w http.ResponseWriter, r *http.Request, pg pagination, total int, params url.Values) {
	page, perPage := pg.page, pg.perPage
	pages := max((total+perPage-1)/perPage, 1)
	h := w.Header()
	next, prev := "", ""
	if page < pages {
		next = strconv.Itoa(page + 1)
	}
	if page > 1 && page <= pages {
		prev = strconv.Itoa(page - 1)
	}
	h.Set("X-Per-Page", strconv.Itoa(perPage))
	h.Set("X-Page", strconv.Itoa(page))
	h.Set("X-Next-Page", next)
	h.Set("X-Prev-Page", prev)
	link := func(n int, rel string) string {
		v := url.Values{}
		for k, xs := range r.URL.Query() {
			v[k] = xs
		}
		for k, xs := range params {
			v[k] = xs
		}
		v.Set("page", strconv.Itoa(n))
		v.Set("per_page", strconv.Itoa(perPage))
		return fmt.Sprintf("<%s%s?%s>; rel=%q", s.URL, r.URL.EscapedPath(), v.Encode(), rel)
	}
	var links []string
	if prev != "" {
		links = append(links, link(page-1, "prev"))
	}
	if next != "" {
		links = append(links, link(page+1, "next"))
	}
	links = append(links, link(1, "first"))
	if total <= maxCount {
		links = append(links, link(pages, "last"))
		h.Set("X-Total", strconv.Itoa(total))
		h.Set("X-Total-Pages", strconv.Itoa(pages))
	}
	h.Set("Link", strings.Join(links, ", "))
}

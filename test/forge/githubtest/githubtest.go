// Package githubtest serves the part of GitHub's REST API that commit statuses need, on
// top of a forge.Store, so the GitHub status backend is tested against the behaviour
// GitHub documents rather than against itself: the create, combined and list endpoints of
// https://docs.github.com/rest/commits/statuses with their validation errors, the
// 1,000-statuses cap, pagination, rate-limit headers, token authentication, and GitHub App
// installation tokens minted from an RS256 JWT.
//
//	srv := githubtest.Start(t)
//	sha := srv.NewCommit()
//	// point a client at srv.URL with srv.Token, for srv.Owner/srv.Repo
package githubtest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"math"
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

	jwt "github.com/golang-jwt/jwt/v4"

	"github.com/flotilla-gitops/flotilla/test/forge"
)

// Documented limits and defaults the server enforces.
const (
	// DescriptionLimit is the longest description GitHub accepts, in characters; a longer
	// one is refused with "description is too long (maximum is 140 characters)".
	DescriptionLimit = 140
	// MaxPerContext is GitHub's documented "limit of 1000 statuses per sha and context
	// within a repository".
	MaxPerContext = 1000
	// DefaultPerPage and MaxPerPage are GitHub's pagination defaults: "per_page: The number
	// of results per page (max 100). Default: 30".
	DefaultPerPage = 30
	MaxPerPage     = 100
	// RateLimit is the hourly primary limit reported in X-RateLimit-Limit, GitHub's figure
	// for a personal access token and the floor for an App installation.
	RateLimit = 5000
)

// Documentation URLs GitHub puts in error bodies.
const (
	docRoot      = "https://docs.github.com/rest"
	docCreate    = "https://docs.github.com/rest/commits/statuses#create-a-commit-status"
	docCombined  = "https://docs.github.com/rest/commits/statuses#get-the-combined-status-for-a-specific-reference"
	docList      = "https://docs.github.com/rest/commits/statuses#list-commit-statuses-for-a-reference"
	docSecondary = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"
	docPrimary   = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-rate-limits"
	docToken     = "https://docs.github.com/rest/apps/apps#create-an-installation-access-token-for-an-app"
)

// Messages GitHub answers with, word for word as its API returns them.
const (
	msgBadCredentials = "Bad credentials"
	msgNotFound       = "Not Found"
	msgValidation     = "Validation Failed"
	msgCap            = "This SHA and context has reached the maximum number of statuses."
	msgSecondary      = "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID %s."
	msgPrimary        = "API rate limit exceeded for user ID 1. If you reach out to GitHub Support for help, please include the request ID %s."
	msgJWTUndecodable = "A JSON web token could not be decoded"
	msgJWTExpired     = "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires"
	msgJWTTooFar      = "'Expiration time' claim ('exp') is too far in the future"
	msgJWTIssuedAt    = "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued"
)

// states are the four states GitHub accepts: "error, failure, pending, success".
var states = map[string]bool{"error": true, "failure": true, "pending": true, "success": true}

// repoID is the numeric ID of the one repository the server keeps.
const repoID = 1296269

// Server is a running GitHub API for one repository.
type Server struct {
	// URL is the REST API base URL, ending in "/", as go-github's BaseURL wants it.
	URL   string
	Owner string
	Repo  string
	// Token is a personal access token the server accepts, sent as "Authorization:
	// Bearer <token>" or "Authorization: token <token>".
	Token string
	Store *forge.Store

	srv *httptest.Server

	mu       sync.Mutex
	apps     map[int64]*rsa.PublicKey
	installs map[int64]int64      // installation ID to app ID
	tokens   map[string]time.Time // installation token to its expiry
	// used and reset are the primary rate-limit window reported in X-RateLimit-*.
	used  int
	reset time.Time
	// exhaustedUntil, when in the future, answers every authenticated request with the
	// primary rate limit exhausted.
	exhaustedUntil time.Time
	requestID      int

	// post serializes the cap check of a create with its insert, so concurrent posts
	// cannot both take the last slot.
	post sync.Mutex

	pulls map[int]pullRequest
}

type pullRequest struct {
	state string // "open" or "closed"
	base  string // the branch it would merge into
}

// SetPullRequest records pull request number into branch base as open or closed, for
// GET /pulls.
func (s *Server) SetPullRequest(number int, base string, open bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pulls == nil {
		s.pulls = map[int]pullRequest{}
	}
	s.pulls[number] = pullRequest{state: map[bool]string{true: "open", false: "closed"}[open], base: base}
}

// listPulls is GET /repos/{owner}/{repo}/pulls: "state: Either open, closed, or all to
// filter by state. Default: open", "base: Filter pulls by base branch name", newest
// first, paginated like every list.
func (s *Server) listPulls(w http.ResponseWriter, r *http.Request) {
	base := r.URL.Query().Get("base")
	want := r.URL.Query().Get("state")
	if want == "" {
		want = "open"
	}
	if want != "open" && want != "closed" && want != "all" {
		s.error(w, http.StatusUnprocessableEntity, validation(docRoot, fieldError{Resource: "PullRequest", Code: "invalid", Field: "state"}))
		return
	}
	s.mu.Lock()
	var numbers []int
	for n, pr := range s.pulls {
		if (want == "all" || pr.state == want) && (base == "" || pr.base == base) {
			numbers = append(numbers, n)
		}
	}
	pulls := maps.Clone(s.pulls)
	s.mu.Unlock()
	slices.SortFunc(numbers, func(a, b int) int { return b - a })
	page, per := pagination(r.URL.Query())
	from, to := window(page, per, len(numbers))
	type ref struct {
		Ref string `json:"ref"`
	}
	type pull struct {
		Number int    `json:"number"`
		State  string `json:"state"`
		URL    string `json:"url"`
		Base   ref    `json:"base"`
	}
	out := make([]pull, 0, to-from)
	for _, n := range numbers[from:to] {
		out = append(out, pull{Number: n, State: pulls[n].state, Base: ref{pulls[n].base}, URL: s.URL + fmt.Sprintf("repos/%s/%s/pulls/%d", s.Owner, s.Repo, n)})
	}
	s.link(w, r, page, per, len(numbers))
	s.json(w, http.StatusOK, out)
}

// Start serves a new repository until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{
		Owner:    "flotilla-gitops",
		Repo:     "fleet",
		Token:    "ghp_" + forge.RandomHex(18),
		Store:    forge.NewStore(),
		apps:     map[int64]*rsa.PublicKey{},
		installs: map[int64]int64{},
		tokens:   map[string]time.Time{},
	}
	s.srv = httptest.NewServer(s)
	t.Cleanup(s.srv.Close)
	s.URL = s.srv.URL + "/"
	return s
}

// NewCommit registers a new random commit SHA on the repository and returns it.
func (s *Server) NewCommit() string {
	return s.Store.NewCommit()
}

// AddCommit registers sha, a commit of a real repository, on the repository.
func (s *Server) AddCommit(sha string) {
	s.Store.AddCommit(sha)
}

// AddApp registers a GitHub App installed on the repository and returns the app's
// private key, PEM-encoded as GitHub hands it out. The server then mints installation
// tokens for a JWT the key signs.
func (s *Server) AddApp(appID, installationID int64) (privateKeyPEM []byte) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(fmt.Sprintf("githubtest: generating an app key: %v", err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.apps[appID] = &key.PublicKey
	s.installs[installationID] = appID
	return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
}

// ExhaustRateLimit makes the primary rate limit run out until reset: GitHub then answers
// 403 with X-RateLimit-Remaining: 0 and X-RateLimit-Reset at the reset time.
func (s *Server) ExhaustRateLimit(reset time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.exhaustedUntil = reset
}

// ServeHTTP answers one API request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Every request is logged and may be answered by an injected fault, whatever it is.
	if f, ok := s.Store.Begin(r.Method, r.URL.Path); ok {
		s.fault(w, f)
		return
	}
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(segs) == 4 && segs[0] == "app" && segs[1] == "installations" && segs[3] == "access_tokens" && r.Method == http.MethodPost:
		s.createInstallationToken(w, r, segs[2])
	case len(segs) >= 4 && segs[0] == "repos":
		s.repository(w, r, segs)
	default:
		s.error(w, http.StatusNotFound, apiError{Message: msgNotFound, DocumentationURL: docRoot})
	}
}

// repository serves /repos/{owner}/{repo}/...: authentication first, then the rate limit,
// then the repository and the route, in the order GitHub applies them.
func (s *Server) repository(w http.ResponseWriter, r *http.Request, segs []string) {
	switch s.authenticate(r) {
	case authMissing:
		// "Requests that require authentication will return 404 Not Found, instead of 403
		// Forbidden, in some places. This is to prevent the accidental leakage of private
		// repositories to unauthorized users."
		s.error(w, http.StatusNotFound, apiError{Message: msgNotFound, DocumentationURL: docRoot})
		return
	case authBad:
		s.error(w, http.StatusUnauthorized, apiError{Message: msgBadCredentials, DocumentationURL: docRoot})
		return
	}
	if s.rateLimited(w) {
		return
	}
	// "The name is not case sensitive", for both the owner and the repository.
	if !strings.EqualFold(segs[1], s.Owner) || !strings.EqualFold(segs[2], s.Repo) {
		s.error(w, http.StatusNotFound, apiError{Message: msgNotFound, DocumentationURL: docRoot})
		return
	}
	last := segs[len(segs)-1]
	switch {
	case segs[3] == "pulls" && len(segs) == 4 && r.Method == http.MethodGet:
		s.listPulls(w, r)
	case segs[3] == "statuses" && len(segs) == 5 && r.Method == http.MethodPost:
		s.createStatus(w, r, segs[4])
	case segs[3] == "statuses" && len(segs) == 5 && r.Method == http.MethodGet:
		// "This resource is also available via a legacy route: GET
		// /repos/:owner/:repo/statuses/:ref."
		s.listStatuses(w, r, segs[4])
	case segs[3] == "commits" && len(segs) >= 6 && last == "status" && r.Method == http.MethodGet:
		s.combinedStatus(w, r, strings.Join(segs[4:len(segs)-1], "/"))
	case segs[3] == "commits" && len(segs) >= 6 && last == "statuses" && r.Method == http.MethodGet:
		s.listStatuses(w, r, strings.Join(segs[4:len(segs)-1], "/"))
	default:
		s.error(w, http.StatusNotFound, apiError{Message: msgNotFound, DocumentationURL: docRoot})
	}
}

// createStatus is POST /repos/{owner}/{repo}/statuses/{sha}.
func (s *Server) createStatus(w http.ResponseWriter, r *http.Request, sha string) {
	var in struct {
		State       *string `json:"state"`
		TargetURL   *string `json:"target_url"`
		Description *string `json:"description"`
		Context     *string `json:"context"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		s.error(w, http.StatusBadRequest, apiError{Message: "Problems parsing JSON", DocumentationURL: docCreate})
		return
	}
	if !isSHA(sha) {
		s.error(w, http.StatusUnprocessableEntity, validation(docCreate, fieldError{Resource: "Status", Code: "custom", Field: "sha", Message: "sha must be a 40 character SHA1"}))
		return
	}
	sha = strings.ToLower(sha)
	if !s.known(sha) {
		s.error(w, http.StatusUnprocessableEntity, apiError{Message: "No commit found for SHA: " + sha, DocumentationURL: docCreate})
		return
	}
	// state is the one required parameter.
	if in.State == nil {
		s.error(w, http.StatusUnprocessableEntity, apiError{Message: "Invalid request.\n\n\"state\" wasn't supplied.", DocumentationURL: docCreate})
		return
	}
	var errs []fieldError
	if !states[*in.State] {
		errs = append(errs, fieldError{Resource: "Status", Code: "custom", Field: "state", Message: "state is not included in the list"})
	}
	desc, target := deref(in.Description), deref(in.TargetURL)
	if utf8.RuneCountInString(desc) > DescriptionLimit {
		errs = append(errs, fieldError{Resource: "Status", Code: "custom", Field: "description",
			Message: fmt.Sprintf("description is too long (maximum is %d characters)", DescriptionLimit)})
	}
	if len(errs) > 0 {
		s.error(w, http.StatusUnprocessableEntity, validation(docCreate, errs...))
		return
	}
	// "context: A string label to differentiate this status from the status of other
	// systems. Default: default".
	name := "default"
	if in.Context != nil && *in.Context != "" {
		name = *in.Context
	}

	s.post.Lock()
	if s.Store.Count(sha, name) >= MaxPerContext {
		s.post.Unlock()
		// No field: GitHub names none for the cap.
		s.error(w, http.StatusUnprocessableEntity, validation(docCreate, fieldError{Resource: "Status", Code: "custom", Message: msgCap}))
		return
	}
	rec := s.Store.Add(sha, forge.Record{Context: name, State: *in.State, Description: desc, TargetURL: target})
	s.post.Unlock()

	out := s.status(sha, rec)
	out.Creator = s.creator()
	w.Header().Set("Location", s.URL+fmt.Sprintf("repos/%s/%s/statuses/%s", s.Owner, s.Repo, sha))
	s.json(w, http.StatusCreated, out)
}

// combinedStatus is GET /repos/{owner}/{repo}/commits/{ref}/status: the newest status of
// each context, paginated, and the combined state over all of them.
func (s *Server) combinedStatus(w http.ResponseWriter, r *http.Request, ref string) {
	sha := strings.ToLower(ref)
	if !s.known(sha) {
		s.error(w, http.StatusNotFound, apiError{Message: "No commit found for SHA: " + ref, DocumentationURL: docCombined})
		return
	}
	latest := s.Store.Latest(sha)
	page, per := pagination(r.URL.Query())
	from, to := window(page, per, len(latest))
	statuses := make([]repoStatus, 0, to-from)
	for _, rec := range latest[from:to] {
		statuses = append(statuses, s.status(sha, rec))
	}
	s.link(w, r, page, per, len(latest))
	s.json(w, http.StatusOK, combined{
		State:      CombinedState(latest),
		Statuses:   statuses,
		SHA:        sha,
		TotalCount: len(latest),
		Repository: s.repositoryJSON(),
		CommitURL:  s.URL + fmt.Sprintf("repos/%s/%s/commits/%s", s.Owner, s.Repo, sha),
		URL:        s.URL + fmt.Sprintf("repos/%s/%s/commits/%s/status", s.Owner, s.Repo, sha),
	})
}

// listStatuses is GET /repos/{owner}/{repo}/commits/{ref}/statuses: "Statuses are
// returned in reverse chronological order. The first status in the list will be the
// latest one."
func (s *Server) listStatuses(w http.ResponseWriter, r *http.Request, ref string) {
	sha := strings.ToLower(ref)
	if !s.known(sha) {
		s.error(w, http.StatusNotFound, apiError{Message: "No commit found for SHA: " + ref, DocumentationURL: docList})
		return
	}
	all := s.Store.All(sha)
	page, per := pagination(r.URL.Query())
	from, to := window(page, per, len(all))
	out := make([]repoStatus, 0, to-from)
	for _, rec := range all[from:to] {
		st := s.status(sha, rec)
		st.Creator = s.creator()
		out = append(out, st)
	}
	s.link(w, r, page, per, len(all))
	s.json(w, http.StatusOK, out)
}

// CombinedState is GitHub's combined state of the newest status per context: "failure
// if any of the contexts report as error or failure; pending if there are no statuses or
// a context is pending; success if the latest status for all contexts is success".
func CombinedState(latest []forge.Record) string {
	state := "success"
	if len(latest) == 0 {
		state = "pending"
	}
	for _, r := range latest {
		switch r.State {
		case "error", "failure":
			return "failure"
		case "pending":
			state = "pending"
		}
	}
	return state
}

// createInstallationToken is POST /app/installations/{installation_id}/access_tokens,
// authenticated as the app with a JWT: RS256-signed by the app's private key, "iss" the
// app's ID, "iat" not in the future and "exp" in the future but "no more than 10 minutes
// into the future".
func (s *Server) createInstallationToken(w http.ResponseWriter, r *http.Request, installation string) {
	scheme, raw, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "Bearer") || raw == "" {
		s.error(w, http.StatusUnauthorized, apiError{Message: msgJWTUndecodable, DocumentationURL: docRoot})
		return
	}
	var claims jwt.RegisteredClaims
	parser := jwt.NewParser(jwt.WithValidMethods([]string{jwt.SigningMethodRS256.Alg()}), jwt.WithoutClaimsValidation())
	_, err := parser.ParseWithClaims(strings.TrimSpace(raw), &claims, func(*jwt.Token) (any, error) {
		id, err := strconv.ParseInt(claims.Issuer, 10, 64)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		key, ok := s.apps[id]
		if !ok {
			return nil, errors.New("no such app")
		}
		return key, nil
	})
	if err != nil {
		s.error(w, http.StatusUnauthorized, apiError{Message: msgJWTUndecodable, DocumentationURL: docRoot})
		return
	}
	now := time.Now()
	switch {
	case claims.IssuedAt == nil || claims.IssuedAt.After(now):
		s.error(w, http.StatusUnauthorized, apiError{Message: msgJWTIssuedAt, DocumentationURL: docRoot})
		return
	case claims.ExpiresAt == nil || !claims.ExpiresAt.After(now):
		s.error(w, http.StatusUnauthorized, apiError{Message: msgJWTExpired, DocumentationURL: docRoot})
		return
	case claims.ExpiresAt.After(now.Add(10 * time.Minute)):
		s.error(w, http.StatusUnauthorized, apiError{Message: msgJWTTooFar, DocumentationURL: docRoot})
		return
	}
	appID, _ := strconv.ParseInt(claims.Issuer, 10, 64)
	id, err := strconv.ParseInt(installation, 10, 64)
	s.mu.Lock()
	owner, ok := s.installs[id]
	s.mu.Unlock()
	if err != nil || !ok || owner != appID {
		s.error(w, http.StatusNotFound, apiError{Message: msgNotFound, DocumentationURL: docToken})
		return
	}
	// "The installation access token will expire after 1 hour."
	token, expires := "ghs_"+forge.RandomHex(18), now.Add(time.Hour).UTC().Truncate(time.Second)
	s.mu.Lock()
	s.tokens[token] = expires
	s.mu.Unlock()
	s.json(w, http.StatusCreated, map[string]any{
		"token":                token,
		"expires_at":           expires.Format(time.RFC3339),
		"permissions":          map[string]string{"metadata": "read", "statuses": "write"},
		"repository_selection": "selected",
	})
}

type authResult int

const (
	authOK authResult = iota
	authMissing
	authBad
)

// authenticate accepts the personal token or a live installation token, sent with either
// scheme GitHub takes: "Authorization: Bearer <token>" or "Authorization: token <token>".
func (s *Server) authenticate(r *http.Request) authResult {
	h := r.Header.Get("Authorization")
	if h == "" {
		return authMissing
	}
	scheme, tok, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "Bearer") && !strings.EqualFold(scheme, "token") {
		return authBad
	}
	tok = strings.TrimSpace(tok)
	if subtle.ConstantTimeCompare([]byte(tok), []byte(s.Token)) == 1 {
		return authOK
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if exp, ok := s.tokens[tok]; ok && time.Now().Before(exp) {
		return authOK
	}
	return authBad
}

// rateLimited writes the X-RateLimit-* headers GitHub sends on every authenticated
// answer and, when the primary limit is exhausted, answers 403 with remaining 0: "If you
// exceed your primary rate limit, you will receive a 403 or 429 response, and the
// x-ratelimit-remaining header will be 0."
func (s *Server) rateLimited(w http.ResponseWriter) bool {
	exhausted := s.budget(w)
	if exhausted {
		s.error(w, http.StatusForbidden, apiError{Message: fmt.Sprintf(msgPrimary, s.nextRequestID()), DocumentationURL: docPrimary})
	}
	return exhausted
}

// budget counts the request against the primary rate limit, writes where it stands in
// the X-RateLimit-* headers, and reports whether it is exhausted.
func (s *Server) budget(w http.ResponseWriter) bool {
	if q, ok := s.Store.Quota(); ok {
		// A limit the test set: Begin counted this request against it already.
		s.rateHeaders(w, q.Limit, q.Limit-q.Used, q.Used, q.Reset)
		return false
	}
	now := time.Now()
	s.mu.Lock()
	if now.After(s.reset) {
		s.used, s.reset = 0, now.Add(time.Hour)
	}
	exhausted := now.Before(s.exhaustedUntil)
	reset, remaining := s.reset, 0
	if exhausted {
		reset = s.exhaustedUntil
	} else {
		s.used++
		// The real limit would run out after RateLimit requests; tests that want that
		// say so with ExhaustRateLimit, so a long test never trips it by accident.
		remaining = max(RateLimit-s.used, 1)
	}
	used := s.used
	s.mu.Unlock()

	s.rateHeaders(w, RateLimit, remaining, used, reset)
	return exhausted
}

// rateHeaders are the X-RateLimit-* headers of the "core" budget; the reset is in epoch
// seconds, rounded up so that a client waiting for it never comes early.
func (s *Server) rateHeaders(w http.ResponseWriter, limit, remaining, used int, reset time.Time) {
	h := w.Header()
	h.Set("X-RateLimit-Limit", strconv.Itoa(limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(int64(math.Ceil(float64(reset.UnixNano())/1e9)), 10))
	h.Set("X-RateLimit-Used", strconv.Itoa(used))
	h.Set("X-RateLimit-Resource", "core")
}

// SetRateLimit makes the primary rate limit limit requests per window (the Store's),
// stated in X-RateLimit-* on every answer; a request over it is answered as GitHub
// answers an exhausted primary limit: 403, X-RateLimit-Remaining 0 and the reset.
func (s *Server) SetRateLimit(limit int, window time.Duration) {
	s.Store.SetRateLimit(limit, window)
}

// fault answers with an injected failure in GitHub's own words for its code: rate
// limits as the secondary limit ("You have exceeded a secondary rate limit", with
// Retry-After), a generic body for server errors.
func (s *Server) fault(w http.ResponseWriter, f forge.Fault) {
	if q := f.Quota; q != nil {
		// "If you exceed your primary rate limit, you will receive a 403 or 429
		// response, and the x-ratelimit-remaining header will be 0."
		s.rateHeaders(w, q.Limit, 0, q.Used, q.Reset)
		s.error(w, http.StatusForbidden, apiError{Message: fmt.Sprintf(msgPrimary, s.nextRequestID()), DocumentationURL: docPrimary})
		return
	}
	if f.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(f.RetryAfter.Seconds()))))
	}
	switch {
	case f.Code == http.StatusForbidden || f.Code == http.StatusTooManyRequests:
		// A secondary limit's answer states the primary budget too, as every
		// authenticated answer does; a client must not wait for that budget's reset.
		s.budget(w)
		s.error(w, f.Code, apiError{Message: fmt.Sprintf(msgSecondary, s.nextRequestID()), DocumentationURL: docSecondary})
	case f.Code == http.StatusUnauthorized:
		s.error(w, f.Code, apiError{Message: msgBadCredentials, DocumentationURL: docRoot})
	case f.Code == http.StatusNotFound:
		s.error(w, f.Code, apiError{Message: msgNotFound, DocumentationURL: docRoot})
	case f.Code >= 500:
		s.error(w, f.Code, apiError{Message: "Server Error"})
	default:
		s.error(w, f.Code, apiError{Message: http.StatusText(f.Code)})
	}
}

// link writes GitHub's pagination Link header: rel="prev" and "first" past the first
// page, rel="next" and "last" before the last, none when everything fits on one page.
func (s *Server) link(w http.ResponseWriter, r *http.Request, page, per, total int) {
	last := max(1, (total+per-1)/per)
	ref := func(p int, rel string) string {
		q := r.URL.Query()
		q.Set("page", strconv.Itoa(p))
		q.Set("per_page", strconv.Itoa(per))
		u := url.URL{Path: r.URL.Path, RawQuery: q.Encode()}
		return fmt.Sprintf("<%s%s>; rel=%q", s.srv.URL, u.String(), rel)
	}
	var links []string
	if page > 1 {
		links = append(links, ref(min(page-1, last), "prev"))
	}
	if page < last {
		links = append(links, ref(page+1, "next"), ref(last, "last"))
	}
	if page > 1 {
		links = append(links, ref(1, "first"))
	}
	if len(links) > 0 {
		w.Header().Set("Link", strings.Join(links, ", "))
	}
}

// pagination reads page and per_page as GitHub does: page from 1, per_page 30 unless
// given, at most 100; values that are not positive numbers fall back to the defaults.
func pagination(q url.Values) (page, per int) {
	page, per = 1, DefaultPerPage
	if v, err := strconv.Atoi(q.Get("page")); err == nil && v > 0 {
		page = v
	}
	if v, err := strconv.Atoi(q.Get("per_page")); err == nil && v > 0 {
		per = min(v, MaxPerPage)
	}
	return page, per
}

// window is the slice [from, to) of n items that page shows.
func window(page, per, n int) (from, to int) {
	from = min((page-1)*per, n)
	return from, min(from+per, n)
}

func (s *Server) known(sha string) bool {
	return s.Store.Known(sha)
}

func (s *Server) nextRequestID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requestID++
	return fmt.Sprintf("0400:%04X:%06X", repoID%0xFFFF, s.requestID)
}

// repoStatus is GitHub's status object, as the create and list endpoints return it
// (with creator) and the combined endpoint lists it (without).
type repoStatus struct {
	URL         string  `json:"url"`
	AvatarURL   *string `json:"avatar_url"`
	ID          int64   `json:"id"`
	NodeID      string  `json:"node_id"`
	State       string  `json:"state"`
	Description *string `json:"description"`
	TargetURL   *string `json:"target_url"`
	Context     string  `json:"context"`
	CreatedAt   string  `json:"created_at"`
	UpdatedAt   string  `json:"updated_at"`
	Creator     *user   `json:"creator,omitempty"`
}

type user struct {
	Login string `json:"login"`
	ID    int64  `json:"id"`
	Type  string `json:"type"`
	URL   string `json:"url"`
}

type combined struct {
	State      string         `json:"state"`
	Statuses   []repoStatus   `json:"statuses"`
	SHA        string         `json:"sha"`
	TotalCount int            `json:"total_count"`
	Repository map[string]any `json:"repository"`
	CommitURL  string         `json:"commit_url"`
	URL        string         `json:"url"`
}

type apiError struct {
	Message          string       `json:"message"`
	Errors           []fieldError `json:"errors,omitempty"`
	DocumentationURL string       `json:"documentation_url,omitempty"`
	Status           string       `json:"status"`
}

type fieldError struct {
	Resource string `json:"resource"`
	Code     string `json:"code"`
	Field    string `json:"field,omitempty"`
	Message  string `json:"message,omitempty"`
}

func validation(doc string, errs ...fieldError) apiError {
	return apiError{Message: msgValidation, Errors: errs, DocumentationURL: doc}
}

func (s *Server) status(sha string, r forge.Record) repoStatus {
	at := r.Created.UTC().Format(time.RFC3339)
	return repoStatus{
		URL:         s.URL + fmt.Sprintf("repos/%s/%s/statuses/%s", s.Owner, s.Repo, sha),
		ID:          r.ID,
		NodeID:      base64.StdEncoding.EncodeToString([]byte("06:Status" + strconv.FormatInt(r.ID, 10))),
		State:       r.State,
		Description: nullable(r.Description),
		TargetURL:   nullable(r.TargetURL),
		Context:     r.Context,
		CreatedAt:   at,
		UpdatedAt:   at,
	}
}

func (s *Server) creator() *user {
	return &user{Login: "flotilla-bot", ID: 1, Type: "User", URL: s.URL + "users/flotilla-bot"}
}

func (s *Server) repositoryJSON() map[string]any {
	full := s.Owner + "/" + s.Repo
	return map[string]any{
		"id":        repoID,
		"node_id":   base64.StdEncoding.EncodeToString([]byte("010:Repository" + strconv.Itoa(repoID))),
		"name":      s.Repo,
		"full_name": full,
		"private":   true,
		"owner":     map[string]any{"login": s.Owner, "id": 2, "type": "Organization", "url": s.URL + "users/" + s.Owner},
		"html_url":  "https://github.com/" + full,
		"url":       s.URL + "repos/" + full,
		"fork":      false,
	}
}

func (s *Server) json(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-GitHub-Media-Type", "github.v3; format=json")
	w.Header().Set("X-GitHub-Request-Id", s.nextRequestID())
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// error answers with GitHub's error body, which carries the status code as a string.
func (s *Server) error(w http.ResponseWriter, code int, e apiError) {
	e.Status = strconv.Itoa(code)
	s.json(w, code, e)
}

func isSHA(s string) bool {
	if len(s) != 40 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

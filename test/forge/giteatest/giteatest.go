// Package giteatest is an in-process Gitea for the commit-status backend's tests: the
// parts of Gitea's REST API (/api/v1) that read and write commit statuses, answering
// as Gitea's own handlers do, over a forge.Store that the tests can fill, fault and
// inspect.
//
// What each rule follows is said where it is implemented. The sources are Gitea's API
// handlers (routers/api/v1/repo/status.go), its model (models/git/commit_status.go:
// description, context and target URL are TEXT columns, stored trimmed), its API
// structs (modules/structs: a CommitStatus carries its state in "status", while a
// CreateStatusOption and a CombinedStatus carry theirs in "state"), its pagination
// (page and limit; DEFAULT_PAGING_NUM 30 and MAX_RESPONSE_ITEMS 50; X-Total-Count and
// Link) and its API context (error bodies {"message","url"}, 422 for binding errors,
// 401 for a token that does not exist, 404 for a private repository one cannot see).
// Beside the statuses it lists the repository's pull requests (routers/api/v1/repo/
// pull.go ListPullRequests over models/issues/pull_list.go), which a test records with
// SetPullRequest.
package giteatest

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/test/forge"
)

// Version is what GET /api/v1/version reports: the Gitea release whose behaviour the
// server follows (the combined state is computed as Gitea does since 1.25).
const Version = "1.25.0"

// Gitea's [api] defaults: the page size of a request that gives no limit, and the
// largest one it grants; a larger limit is cut to it, not refused.
const (
	DefaultPagingNum = 30
	MaxResponseItems = 50
)

// The user the server's token belongs to, shown as the creator of the statuses it keeps.
const (
	userID    = 2
	userLogin = "flotilla-hub"
)

// Server is a running test Gitea holding one private repository, Owner/Repo, and
// accepting one token.
type Server struct {
	// URL is Gitea's base URL, what a client is configured with; the API is below
	// URL + "/api/v1".
	URL   string
	Owner string
	Repo  string
	// Token is accepted as "Authorization: token <Token>" or "Authorization: Bearer
	// <Token>", the two schemes Gitea reads an access token from.
	Token string
	Store *forge.Store

	mu    sync.Mutex
	pulls map[int64]pullRequest
}

// Start serves a test Gitea until t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{
		Owner: "flotilla",
		Repo:  "fleet",
		Token: forge.RandomHex(20),
		Store: forge.NewStore(),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/version", s.version)
	mux.HandleFunc("POST /api/v1/repos/{owner}/{repo}/statuses/{sha}", s.createStatus)
	mux.HandleFunc("GET /api/v1/repos/{owner}/{repo}/statuses/{sha}", s.listStatuses)
	mux.HandleFunc("GET /api/v1/repos/{owner}/{repo}/commits/{ref}/statuses", s.listStatuses)
	mux.HandleFunc("GET /api/v1/repos/{owner}/{repo}/commits/{ref}/status", s.combinedStatus)
	mux.HandleFunc("GET /api/v1/repos/{owner}/{repo}/pulls", s.listPulls)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { s.notFound(w, nil) })
	hs := httptest.NewServer(s.middleware(mux))
	t.Cleanup(hs.Close)
	s.URL = hs.URL
	return s
}

// NewCommit registers a new commit in the repository and returns its full hash.
// Statuses can only be created on registered commits: Gitea looks the commit up in
// the repository before it stores a status.
func (s *Server) NewCommit() string {
	return s.Store.NewCommit()
}

func (s *Server) hasCommit(sha string) bool {
	return s.Store.Known(sha)
}

// resolve turns a ref into a commit hash as Gitea's utils.ResolveRefOrSha does for a
// repository without branches or tags of that name: an abbreviated hash of a known
// commit becomes the full hash, anything else is taken as a hash as it is, so an
// unknown commit simply has no statuses.
func (s *Server) resolve(ref string) string {
	ref = strings.ToLower(ref)
	if !abbrevSHA.MatchString(ref) || len(ref) == 40 {
		return ref
	}
	var found string
	for _, c := range s.Store.Commits() {
		if strings.HasPrefix(c, ref) {
			if found != "" {
				return ref // ambiguous: git does not resolve it either
			}
			found = c
		}
	}
	return cmp.Or(found, ref)
}

var abbrevSHA = regexp.MustCompile(`^[0-9a-f]{4,40}$`)

func (s *Server) appURL() string     { return s.URL + "/" }
func (s *Server) swaggerURL() string { return s.appURL() + "api/swagger" }
func (s *Server) repoAPIURL() string {
	return s.appURL() + "api/v1/repos/" + url.PathEscape(s.Owner) + "/" + url.PathEscape(s.Repo)
}

type signedKey struct{}

func signed(r *http.Request) bool { v, _ := r.Context().Value(signedKey{}).(bool); return v }

// middleware logs every request with the store first and answers a queued fault with
// nothing else, then authenticates the caller as Gitea's API auth does before any
// route: a token that does not exist is refused with 401 on every route, the public
// ones too; no token at all is an anonymous caller.
func (s *Server) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f, ok := s.Store.Begin(r.Method, r.URL.Path); ok {
			if f.Quota != nil {
				s.proxyRefusal(w, f)
				return
			}
			if f.RetryAfter > 0 {
				w.Header().Set("Retry-After", strconv.Itoa(int((f.RetryAfter+time.Second-1)/time.Second)))
			}
			s.apiError(w, f.Code, http.StatusText(f.Code))
			return
		}
		token, ok := bearer(r.Header.Get("Authorization"))
		if ok && token != s.Token {
			// Gitea's OAuth2 auth method returns the access-token store's
			// ErrAccessTokenNotExist, whose text holds the token as sent, and the API
			// answers it as 401 with that text: a client must not repeat Gitea's
			// message without removing its token from it.
			s.apiError(w, http.StatusUnauthorized, fmt.Sprintf("access token does not exist [sha: %s]", token))
			return
		}
		if ok {
			r = r.WithContext(context.WithValue(r.Context(), signedKey{}, true))
		}
		next.ServeHTTP(w, r)
	})
}

// SetRateLimit puts a rate-limiting proxy in front of the server, accepting limit
// requests per window. Gitea itself limits no API request (go-gitea/gitea#9559, "API
// Rate Limiting", is open) and states no budget in its answers; its administrators limit
// it in a reverse proxy. The proxy modelled is Traefik's RateLimit middleware: 429 with a
// plain-text body and Retry-After, nothing about the budget before it refuses.
func (s *Server) SetRateLimit(limit int, window time.Duration) {
	s.Store.SetRateLimit(limit, window)
}

// proxyRefusal is the proxy's answer to a request over its limit.
func (s *Server) proxyRefusal(w http.ResponseWriter, f forge.Fault) {
	w.Header().Set("Retry-After", strconv.Itoa(int((f.RetryAfter+time.Second-1)/time.Second)))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = fmt.Fprintln(w, http.StatusText(http.StatusTooManyRequests))
}

// AddCommit registers sha, a commit of a real repository, in the repository.
func (s *Server) AddCommit(sha string) { s.Store.AddCommit(sha) }

// bearer reads an access token from an Authorization header as Gitea's
// httpauth.ParseAuthorizationHeader does: the scheme "token" or "Bearer", in any case,
// then the token. Tokens in the query string are not read, as with
// DISABLE_QUERY_AUTH_TOKEN set.
func bearer(h string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	token = strings.TrimSpace(token)
	if !ok || token == "" {
		return "", false
	}
	if strings.EqualFold(scheme, "token") || strings.EqualFold(scheme, "bearer") {
		return token, true
	}
	return "", false
}

// checkRepo checks the owner and name in the path as Gitea's repoAssignment does:
// names compare without case; a repository that does not exist, or that an anonymous
// caller may not see (this one is private), is 404 alike, so its existence is not told.
func (s *Server) checkRepo(w http.ResponseWriter, r *http.Request) bool {
	owner, repo := r.PathValue("owner"), r.PathValue("repo")
	if !strings.EqualFold(owner, s.Owner) {
		s.notFound(w, []string{fmt.Sprintf("user redirect does not exist [name: %s]", strings.ToLower(owner))})
		return false
	}
	if !strings.EqualFold(repo, s.Repo) || !signed(r) {
		s.notFound(w, nil)
		return false
	}
	return true
}

func (s *Server) version(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": Version})
}

// createOption is Gitea's api.CreateStatusOption: the state is sent as "state".
type createOption struct {
	State       string `json:"state"`
	TargetURL   string `json:"target_url"`
	Description string `json:"description"`
	Context     string `json:"context"`
}

// validStates are the states Gitea's API documents for CreateStatusOption.state
// (commitstatus.CommitStatusState).
var validStates = []string{"pending", "success", "error", "failure", "warning", "skipped"}

// createStatus is POST /repos/{owner}/{repo}/statuses/{sha} (repoCreateStatus).
func (s *Server) createStatus(w http.ResponseWriter, r *http.Request) {
	if !s.checkRepo(w, r) {
		return
	}
	// The route's bind(api.CreateStatusOption{}) decodes a JSON body when the request
	// says it is JSON and a form otherwise; a body that does not decode is a binding
	// error, answered 422 with "<field names>: <error>", field names none here.
	var opt createOption
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); strings.Contains(ct, "json") {
		if err := json.NewDecoder(r.Body).Decode(&opt); err != nil {
			s.apiError(w, http.StatusUnprocessableEntity, "[]: "+err.Error())
			return
		}
	} else {
		if err := r.ParseForm(); err != nil {
			s.apiError(w, http.StatusUnprocessableEntity, "[]: "+err.Error())
			return
		}
		opt = createOption{State: r.PostForm.Get("state"), TargetURL: r.PostForm.Get("target_url"),
			Description: r.PostForm.Get("description"), Context: r.PostForm.Get("context")}
	}
	// Gitea documents the state as one of validStates. Its struct carries no binding
	// rule for it, so a Gitea with a permissive database stores other short strings;
	// this server holds clients to the documented enum and answers any other state as
	// Gitea answers a failed In(...) binding rule, so a client sending an undocumented
	// state fails here instead of passing a test that a real Gitea might not.
	if !slices.Contains(validStates, opt.State) {
		s.apiError(w, http.StatusUnprocessableEntity, "[State]: In")
		return
	}
	sha := s.resolve(r.PathValue("sha"))
	if !s.hasCommit(sha) {
		// files_service.CreateCommitStatus fails to find the commit and the handler
		// answers every failure of it as 500, whose message Gitea blanks in
		// production for anyone but an admin.
		s.apiError(w, http.StatusInternalServerError, "")
		return
	}
	// git_model.NewCommitStatus trims description, context and target URL.
	rec := s.Store.Add(sha, forge.Record{
		Context:     strings.TrimSpace(opt.Context),
		State:       opt.State,
		Description: strings.TrimSpace(opt.Description),
		TargetURL:   strings.TrimSpace(opt.TargetURL),
	})
	index := 0
	for _, o := range s.Store.All(sha) {
		if o.ID <= rec.ID {
			index++
		}
	}
	writeJSON(w, http.StatusCreated, s.commitStatus(sha, rec, index))
}

// indexed is a record with its index among its commit's statuses, which is what
// Gitea's API shows as a status's id (convert.ToCommitStatus: ID is status.Index).
type indexed struct {
	forge.Record
	index int
}

// history is every status of sha, newest first, with its index.
func (s *Server) history(sha string) []indexed {
	all := s.Store.All(sha)
	out := make([]indexed, len(all))
	for i, r := range all {
		out[i] = indexed{r, len(all) - i}
	}
	return out
}

// listStatuses is GET /repos/{owner}/{repo}/statuses/{sha} (repoListStatuses) and
// GET /repos/{owner}/{repo}/commits/{ref}/statuses (repoListStatusesByRef): a
// commit's statuses, history included, filtered by state and sorted as asked.
func (s *Server) listStatuses(w http.ResponseWriter, r *http.Request) {
	if !s.checkRepo(w, r) {
		return
	}
	sha := s.resolve(cmp.Or(r.PathValue("sha"), r.PathValue("ref")))
	q := r.URL.Query()
	all := s.history(sha)
	// git_model.listCommitStatusesStatement filters only by the states it knows and
	// ignores any other value.
	switch state := strings.TrimSpace(q.Get("state")); state {
	case "pending", "success", "error", "failure", "warning":
		all = slices.DeleteFunc(all, func(x indexed) bool { return x.State != state })
	}
	// git_model.sortCommitStatusesSession. Gitea creates and updates a status at once,
	// so update order is creation order; "leastindex" sorts by index descending and
	// "highestindex" ascending, as Gitea's own code has them.
	switch strings.TrimSpace(q.Get("sort")) {
	case "oldest", "leastupdate", "highestindex":
		slices.Reverse(all)
	}
	page, size := listOptions(q)
	total := len(all)
	items := pageOf(all, page, size)
	out := make([]commitStatus, 0, len(items))
	for _, x := range items {
		out = append(out, s.commitStatus(sha, x.Record, x.index))
	}
	s.setLinkHeader(w, r, total, size, page)
	setTotalCount(w, total)
	writeJSON(w, http.StatusOK, out)
}

// combinedStatus is GET /repos/{owner}/{repo}/commits/{ref}/status
// (repoGetCombinedStatusByRef): the newest status of each context, paginated.
func (s *Server) combinedStatus(w http.ResponseWriter, r *http.Request) {
	if !s.checkRepo(w, r) {
		return
	}
	sha := s.resolve(r.PathValue("ref"))
	// git_model.GetLatestCommitStatus: the newest status per context, contexts in the
	// order of their newest status, newest first, a page of them; the count is of
	// contexts.
	var latest []indexed
	seen := map[string]bool{}
	for _, x := range s.history(sha) {
		if !seen[x.Context] {
			seen[x.Context] = true
			latest = append(latest, x)
		}
	}
	page, size := listOptions(r.URL.Query())
	items := pageOf(latest, page, size)
	if len(items) == 0 {
		// An empty page is a zero CombinedStatus, without X-Total-Count.
		writeJSON(w, http.StatusOK, combined{})
		return
	}
	// convert.ToCombinedStatus works on the page it is given: state and total_count
	// are those of this page's statuses.
	out := combined{
		SHA:        sha,
		TotalCount: len(items),
		Statuses:   make([]commitStatus, 0, len(items)),
		Repository: s.repoObject(),
		CommitURL:  s.repoAPIURL() + "/commits/" + url.PathEscape(sha),
		URL:        s.repoAPIURL() + "/commits/" + url.PathEscape(sha) + "/status",
	}
	states := make([]string, 0, len(items))
	for _, x := range items {
		out.Statuses = append(out.Statuses, s.commitStatus(sha, x.Record, x.index))
		states = append(states, x.State)
	}
	out.State = Combine(states)
	setTotalCount(w, len(latest))
	writeJSON(w, http.StatusOK, out)
}

// Combine is Gitea's combined state (commitstatus.CommitStatusStates.Combine, which
// follows GitHub's rule): failure when any status is error or failure, success when
// every one is success, warning or skipped, pending otherwise.
func Combine(states []string) string {
	ok := 0
	for _, st := range states {
		switch st {
		case "error", "failure":
			return "failure"
		case "success", "warning", "skipped":
			ok++
		}
	}
	if ok > 0 && ok == len(states) {
		return "success"
	}
	return "pending"
}

// listOptions reads page and limit as Gitea's utils.GetListOptions and
// convert.ToCorrectPageSize do: a limit of zero or less is DEFAULT_PAGING_NUM, one
// above MAX_RESPONSE_ITEMS is cut to it, a page below 1 is page 1.
func listOptions(q url.Values) (page, size int) {
	page, _ = strconv.Atoi(q.Get("page"))
	size, _ = strconv.Atoi(q.Get("limit"))
	if size <= 0 {
		size = DefaultPagingNum
	} else if size > MaxResponseItems {
		size = MaxResponseItems
	}
	return max(page, 1), size
}

func pageOf[T any](all []T, page, size int) []T {
	start := (page - 1) * size
	if start >= len(all) {
		return nil
	}
	return all[start:min(start+size, len(all))]
}

// setLinkHeader is Gitea's APIContext.SetLinkHeader: links to the next, last, first
// and previous pages, in that order, joined by "," without a space, each the request's
// URL on the server's ROOT_URL with page replaced, the query re-encoded.
func (s *Server) setLinkHeader(w http.ResponseWriter, r *http.Request, total, size, page int) {
	pages := 1
	if total > 0 {
		pages = (total + size - 1) / size
	}
	// Gitea's paginator clamps the current page to the last one.
	cur := min(page, pages)
	link := func(p int, rel string) string {
		u := *r.URL
		q := u.Query()
		q.Set("page", strconv.Itoa(p))
		u.RawQuery = q.Encode()
		return fmt.Sprintf("<%s%s>; rel=%q", s.appURL(), u.RequestURI()[1:], rel)
	}
	var links []string
	hasNext := total > cur*size
	if hasNext {
		links = append(links, link(cur+1, "next"))
	}
	if isLast := total == 0 || (total > (cur-1)*size && !hasNext); !isLast {
		links = append(links, link(pages, "last"))
	}
	if cur != 1 {
		links = append(links, link(1, "first"))
	}
	if cur > 1 {
		links = append(links, link(cur-1, "prev"))
	}
	if len(links) > 0 {
		w.Header().Set("Link", strings.Join(links, ","))
		w.Header().Add("Access-Control-Expose-Headers", "Link")
	}
}

// setTotalCount is Gitea's APIContext.SetTotalCountHeader.
func setTotalCount(w http.ResponseWriter, n int) {
	w.Header().Set("X-Total-Count", strconv.Itoa(n))
	w.Header().Add("Access-Control-Expose-Headers", "X-Total-Count")
}

// commitStatus is Gitea's api.CommitStatus, field for field. The state is in "status".
type commitStatus struct {
	ID          int64     `json:"id"`
	State       string    `json:"status"`
	TargetURL   string    `json:"target_url"`
	Description string    `json:"description"`
	URL         string    `json:"url"`
	Context     string    `json:"context"`
	Creator     *user     `json:"creator"`
	Created     time.Time `json:"created_at"`
	Updated     time.Time `json:"updated_at"`
}

// combined is Gitea's api.CombinedStatus, whose state is in "state".
type combined struct {
	State      string         `json:"state"`
	SHA        string         `json:"sha"`
	TotalCount int            `json:"total_count"`
	Statuses   []commitStatus `json:"statuses"`
	Repository *repository    `json:"repository"`
	CommitURL  string         `json:"commit_url"`
	URL        string         `json:"url"`
}

// user is the part of Gitea's api.User a status's creator shows.
type user struct {
	ID        int64  `json:"id"`
	Login     string `json:"login"`
	LoginName string `json:"login_name"`
	FullName  string `json:"full_name"`
	Email     string `json:"email"`
	AvatarURL string `json:"avatar_url"`
	HTMLURL   string `json:"html_url"`
	IsAdmin   bool   `json:"is_admin"`
	Active    bool   `json:"active"`
	// Username repeats Login, as api.User's MarshalJSON adds it.
	Username string `json:"username"`
}

// repository is the part of Gitea's api.Repository a combined status shows.
type repository struct {
	ID            int64  `json:"id"`
	Owner         *user  `json:"owner"`
	Name          string `json:"name"`
	FullName      string `json:"full_name"`
	Private       bool   `json:"private"`
	HTMLURL       string `json:"html_url"`
	URL           string `json:"url"`
	CloneURL      string `json:"clone_url"`
	DefaultBranch string `json:"default_branch"`
}

func (s *Server) creator() *user {
	return &user{
		ID: userID, Login: userLogin, Username: userLogin, FullName: "flotilla hub",
		Email: userLogin + "@noreply.localhost", AvatarURL: s.appURL() + "avatars/" + userLogin,
		HTMLURL: s.appURL() + userLogin, Active: true,
	}
}

// repoObject is the repository as Gitea's API shows it.
func (s *Server) repoObject() *repository {
	html := s.appURL() + url.PathEscape(s.Owner) + "/" + url.PathEscape(s.Repo)
	return &repository{
		ID: 1, Owner: &user{ID: 1, Login: s.Owner, Username: s.Owner, HTMLURL: s.appURL() + s.Owner, Active: true},
		Name: s.Repo, FullName: s.Owner + "/" + s.Repo, Private: true,
		HTMLURL: html, URL: s.repoAPIURL(), CloneURL: html + ".git", DefaultBranch: "main",
	}
}

func (s *Server) commitStatus(sha string, r forge.Record, index int) commitStatus {
	return commitStatus{
		ID:          int64(index),
		State:       r.State,
		TargetURL:   r.TargetURL,
		Description: r.Description,
		// CommitStatus.APIURL: the repository's API URL, /statuses/ and the commit.
		URL:     s.repoAPIURL() + "/statuses/" + url.PathEscape(sha),
		Context: r.Context,
		Creator: s.creator(),
		Created: r.Created,
		// Gitea sets updated_at from the creation time too.
		Updated: r.Created,
	}
}

// apiError is Gitea's APIContext.Error body.
func (s *Server) apiError(w http.ResponseWriter, code int, message string) {
	writeJSON(w, code, map[string]string{"message": message, "url": s.swaggerURL()})
}

// notFound is Gitea's APIContext.NotFound body: the locale's not-found message, the
// swagger URL and the errors that led to it (null when there are none).
func (s *Server) notFound(w http.ResponseWriter, errs []string) {
	writeJSON(w, http.StatusNotFound, map[string]any{
		"message": "The target couldn't be found.",
		"url":     s.swaggerURL(),
		"errors":  errs,
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json;charset=utf-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

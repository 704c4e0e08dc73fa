package githubtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	jwt "github.com/golang-jwt/jwt/v4"

	"github.com/flotilla-gitops/flotilla/test/forge"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// answer is one response, its body decoded.
type answer struct {
	code   int
	header http.Header
	body   map[string]any
	list   []map[string]any
}

// do sends one request to srv with the given Authorization header ("" for none).
func do(t *testing.T, srv *Server, method, path, auth string, body any) answer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+strings.TrimPrefix(path, "/"), rd)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{code: resp.StatusCode, header: resp.Header}
	if len(raw) > 0 && raw[0] == '[' {
		err = json.Unmarshal(raw, &a.list)
	} else {
		err = json.Unmarshal(raw, &a.body)
	}
	if err != nil {
		t.Fatalf("%s %s answered %d with a body that is not JSON: %q", method, path, resp.StatusCode, raw)
	}
	return a
}

func bearer(tok string) string { return "Bearer " + tok }

// The three endpoints' paths, relative to srv.URL.
func createPath(srv *Server, sha string) string {
	return fmt.Sprintf("repos/%s/%s/statuses/%s", srv.Owner, srv.Repo, sha)
}

func combinedPath(srv *Server, sha string) string {
	return fmt.Sprintf("repos/%s/%s/commits/%s/status", srv.Owner, srv.Repo, sha)
}

func historyPath(srv *Server, sha string) string {
	return fmt.Sprintf("repos/%s/%s/commits/%s/statuses", srv.Owner, srv.Repo, sha)
}

// links parses a Link header into rel → page number.
func links(t *testing.T, h string) map[string]int {
	t.Helper()
	out := map[string]int{}
	if h == "" {
		return out
	}
	for part := range strings.SplitSeq(h, ",") {
		target, rel, ok := strings.Cut(strings.TrimSpace(part), ";")
		if !ok || !strings.HasPrefix(target, "<") || !strings.HasSuffix(target, ">") {
			t.Fatalf("malformed link %q", part)
		}
		u, err := url.Parse(strings.Trim(target, "<>"))
		if err != nil {
			t.Fatal(err)
		}
		p, err := strconv.Atoi(u.Query().Get("page"))
		if err != nil {
			t.Fatalf("link %q has no page", part)
		}
		out[strings.Trim(strings.TrimPrefix(strings.TrimSpace(rel), "rel="), `"`)] = p
	}
	return out
}

func TestCreateStatus(t *testing.T) {
	srv := Start(t)
	sha := srv.NewCommit()
	a := do(t, srv, http.MethodPost, createPath(srv, sha), bearer(srv.Token), map[string]string{
		"state": "success", "description": "ready", "context": "flotilla/a", "target_url": "https://hub.example/a",
	})
	if a.code != http.StatusCreated {
		t.Fatalf("POST answered %d %v, want 201", a.code, a.body)
	}
	for field, want := range map[string]any{
		"state": "success", "description": "ready", "context": "flotilla/a", "target_url": "https://hub.example/a",
		"url": srv.URL + createPath(srv, sha),
	} {
		if a.body[field] != want {
			t.Errorf("%s = %v, want %v", field, a.body[field], want)
		}
	}
	for _, field := range []string{"id", "node_id", "created_at", "updated_at", "creator"} {
		if a.body[field] == nil {
			t.Errorf("no %s in %v", field, a.body)
		}
	}
	if got := a.header.Get("Location"); got != srv.URL+createPath(srv, sha) {
		t.Errorf("Location = %q", got)
	}

	// "context ... Default: default"; no description or target URL reads as null.
	a = do(t, srv, http.MethodPost, createPath(srv, sha), bearer(srv.Token), map[string]string{"state": "pending"})
	if a.code != http.StatusCreated || a.body["context"] != "default" || a.body["description"] != nil || a.body["target_url"] != nil {
		t.Fatalf("POST without context answered %d %v", a.code, a.body)
	}
}

func TestValidation(t *testing.T) {
	cases := []struct {
		name        string
		sha         func(srv *Server) string
		body        map[string]any
		wantCode    int
		wantMessage string
		// wantField is the field of the one errors[] entry, "" for no errors[] at all.
		wantField string
	}{
		{
			name:     "a state outside the four is refused",
			sha:      func(s *Server) string { return s.NewCommit() },
			body:     map[string]any{"state": "cancelled"},
			wantCode: 422, wantMessage: msgValidation, wantField: "state",
		},
		{
			name:     "a description over 140 characters is refused",
			sha:      func(s *Server) string { return s.NewCommit() },
			body:     map[string]any{"state": "failure", "description": strings.Repeat("ü", 141)},
			wantCode: 422, wantMessage: msgValidation, wantField: "description",
		},
		{
			name:     "a missing state is refused",
			sha:      func(s *Server) string { return s.NewCommit() },
			body:     map[string]any{"description": "x"},
			wantCode: 422, wantMessage: "Invalid request.\n\n\"state\" wasn't supplied.",
		},
		{
			name:     "an unknown commit is refused",
			sha:      func(*Server) string { return strings.Repeat("ab", 20) },
			body:     map[string]any{"state": "success"},
			wantCode: 422, wantMessage: "No commit found for SHA: " + strings.Repeat("ab", 20),
		},
		{
			name:     "a ref that is not a SHA is refused",
			sha:      func(*Server) string { return "HEAD" },
			body:     map[string]any{"state": "success"},
			wantCode: 422, wantMessage: msgValidation, wantField: "sha",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := Start(t)
			sha := tc.sha(srv)
			a := do(t, srv, http.MethodPost, createPath(srv, sha), bearer(srv.Token), tc.body)
			if a.code != tc.wantCode || a.body["message"] != tc.wantMessage {
				t.Fatalf("answered %d %v, want %d %q", a.code, a.body, tc.wantCode, tc.wantMessage)
			}
			if a.body["documentation_url"] != docCreate || a.body["status"] != strconv.Itoa(tc.wantCode) {
				t.Errorf("body %v lacks GitHub's documentation_url or status", a.body)
			}
			errs, _ := a.body["errors"].([]any)
			if tc.wantField == "" {
				if errs != nil {
					t.Fatalf("errors = %v, want none", errs)
				}
				return
			}
			if len(errs) != 1 {
				t.Fatalf("errors = %v, want one", errs)
			}
			e := errs[0].(map[string]any)
			if e["resource"] != "Status" || e["code"] != "custom" || e["message"] == "" {
				t.Errorf("error %v is not GitHub's", e)
			}
			if field, _ := e["field"].(string); field != tc.wantField {
				t.Errorf("field = %q, want %q", field, tc.wantField)
			}
			if n := srv.Store.Count(sha, "default"); n != 0 {
				t.Errorf("a refused status was kept")
			}
		})
	}
}

func TestCap(t *testing.T) {
	srv := Start(t)
	sha := srv.NewCommit()
	srv.Store.Fill(sha, "flotilla/a", "pending", MaxPerContext-1)
	post := func(context string) answer {
		return do(t, srv, http.MethodPost, createPath(srv, sha), bearer(srv.Token), map[string]string{"state": "success", "context": context})
	}
	if a := post("flotilla/a"); a.code != http.StatusCreated {
		t.Fatalf("the 1000th status answered %d %v", a.code, a.body)
	}
	a := post("flotilla/a")
	if a.code != http.StatusUnprocessableEntity || a.body["message"] != msgValidation {
		t.Fatalf("the 1001st status answered %d %v, want 422 Validation Failed", a.code, a.body)
	}
	errs, _ := a.body["errors"].([]any)
	if len(errs) != 1 || errs[0].(map[string]any)["message"] != msgCap {
		t.Fatalf("errors = %v, want GitHub's cap message", errs)
	}
	if n := srv.Store.Count(sha, "flotilla/a"); n != MaxPerContext {
		t.Fatalf("the store holds %d, want %d", n, MaxPerContext)
	}
	if a := post("flotilla/b"); a.code != http.StatusCreated {
		t.Fatalf("another context answered %d %v: the cap is per context", a.code, a.body)
	}
}

func TestAuthentication(t *testing.T) {
	cases := []struct {
		name        string
		auth        func(srv *Server) string
		wantCode    int
		wantMessage string
	}{
		{name: "a Bearer token is accepted", auth: func(s *Server) string { return "Bearer " + s.Token }, wantCode: 200},
		{name: "a token-scheme token is accepted", auth: func(s *Server) string { return "token " + s.Token }, wantCode: 200},
		{name: "a wrong token is bad credentials", auth: func(*Server) string { return "Bearer ghp_wrong" }, wantCode: 401, wantMessage: msgBadCredentials},
		{name: "an unknown scheme is bad credentials", auth: func(s *Server) string { return "Basic " + s.Token }, wantCode: 401, wantMessage: msgBadCredentials},
		{name: "no credentials hide the private repository", auth: func(*Server) string { return "" }, wantCode: 404, wantMessage: msgNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := Start(t)
			a := do(t, srv, http.MethodGet, combinedPath(srv, srv.NewCommit()), tc.auth(srv), nil)
			if a.code != tc.wantCode {
				t.Fatalf("answered %d %v, want %d", a.code, a.body, tc.wantCode)
			}
			if tc.wantMessage != "" && (a.body["message"] != tc.wantMessage || a.body["documentation_url"] == nil) {
				t.Fatalf("body = %v, want GitHub's %q", a.body, tc.wantMessage)
			}
		})
	}
}

func TestNotFound(t *testing.T) {
	unknown := strings.Repeat("0", 40)
	cases := []struct {
		name        string
		path        func(srv *Server, sha string) string
		wantMessage string
	}{
		{name: "another owner", path: func(_ *Server, sha string) string { return "repos/someone-else/fleet/commits/" + sha + "/status" }, wantMessage: msgNotFound},
		{name: "another repository", path: func(s *Server, sha string) string { return "repos/" + s.Owner + "/other/commits/" + sha + "/status" }, wantMessage: msgNotFound},
		{name: "an unknown endpoint", path: func(s *Server, sha string) string { return "repos/" + s.Owner + "/" + s.Repo + "/pulls/" + sha }, wantMessage: msgNotFound},
		{name: "an unknown commit's combined status", path: func(s *Server, _ string) string { return combinedPath(s, unknown) }, wantMessage: "No commit found for SHA: " + unknown},
		{name: "an unknown commit's history", path: func(s *Server, _ string) string { return historyPath(s, unknown) }, wantMessage: "No commit found for SHA: " + unknown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := Start(t)
			a := do(t, srv, http.MethodGet, tc.path(srv, srv.NewCommit()), bearer(srv.Token), nil)
			if a.code != http.StatusNotFound || a.body["message"] != tc.wantMessage {
				t.Fatalf("answered %d %v, want 404 %q", a.code, a.body, tc.wantMessage)
			}
		})
	}

	t.Run("owner and repository are not case sensitive", func(t *testing.T) {
		srv := Start(t)
		path := fmt.Sprintf("repos/%s/%s/commits/%s/status", strings.ToUpper(srv.Owner), strings.ToUpper(srv.Repo), srv.NewCommit())
		if a := do(t, srv, http.MethodGet, path, bearer(srv.Token), nil); a.code != http.StatusOK {
			t.Fatalf("answered %d %v", a.code, a.body)
		}
	})
}

func TestCombinedPagination(t *testing.T) {
	srv := Start(t)
	sha := srv.NewCommit()
	for i := range 75 {
		srv.Store.Add(sha, forge.Record{Context: fmt.Sprintf("c%02d", i), State: "success"})
	}
	srv.Store.Add(sha, forge.Record{Context: "c00", State: "pending"}) // newer status of a context

	cases := []struct {
		name      string
		query     string
		wantCount int
		wantLinks map[string]int
	}{
		{name: "30 per page by default", query: "", wantCount: 30, wantLinks: map[string]int{"next": 2, "last": 3}},
		{name: "a middle page links every way", query: "?page=2", wantCount: 30, wantLinks: map[string]int{"prev": 1, "next": 3, "last": 3, "first": 1}},
		{name: "the last page links back only", query: "?page=3", wantCount: 15, wantLinks: map[string]int{"prev": 2, "first": 1}},
		{name: "per_page above 100 is 100", query: "?per_page=500", wantCount: 75, wantLinks: map[string]int{}},
		{name: "per_page is honoured", query: "?per_page=50&page=2", wantCount: 25, wantLinks: map[string]int{"prev": 1, "first": 1}},
		{name: "a page past the end is empty", query: "?page=9", wantCount: 0, wantLinks: map[string]int{"prev": 3, "first": 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := do(t, srv, http.MethodGet, combinedPath(srv, sha)+tc.query, bearer(srv.Token), nil)
			if a.code != http.StatusOK {
				t.Fatalf("answered %d %v", a.code, a.body)
			}
			sts, _ := a.body["statuses"].([]any)
			if len(sts) != tc.wantCount {
				t.Fatalf("%d statuses, want %d", len(sts), tc.wantCount)
			}
			if a.body["total_count"] != float64(75) {
				t.Errorf("total_count = %v, want 75 contexts", a.body["total_count"])
			}
			if a.body["state"] != "pending" {
				t.Errorf("state = %v, want pending over all pages", a.body["state"])
			}
			if got := links(t, a.header.Get("Link")); fmt.Sprint(got) != fmt.Sprint(tc.wantLinks) {
				t.Errorf("links = %v, want %v", got, tc.wantLinks)
			}
			for _, field := range []string{"sha", "repository", "commit_url", "url"} {
				if a.body[field] == nil {
					t.Errorf("no %s", field)
				}
			}
		})
	}

	t.Run("each context appears once, with its newest status", func(t *testing.T) {
		a := do(t, srv, http.MethodGet, combinedPath(srv, sha)+"?per_page=100", bearer(srv.Token), nil)
		seen := map[string]string{}
		for _, s := range a.body["statuses"].([]any) {
			st := s.(map[string]any)
			ctx := st["context"].(string)
			if _, dup := seen[ctx]; dup {
				t.Fatalf("context %s listed twice", ctx)
			}
			seen[ctx] = st["state"].(string)
		}
		if seen["c00"] != "pending" {
			t.Fatalf("c00 = %q, want its newest state, pending", seen["c00"])
		}
	})
}

func TestHistory(t *testing.T) {
	srv := Start(t)
	sha := srv.NewCommit()
	srv.Store.Fill(sha, "flotilla/a", "pending", 5)
	a := do(t, srv, http.MethodGet, historyPath(srv, sha)+"?per_page=2", bearer(srv.Token), nil)
	if a.code != http.StatusOK || len(a.list) != 2 {
		t.Fatalf("answered %d with %d statuses", a.code, len(a.list))
	}
	if a.list[0]["description"] != "filled 4" || a.list[1]["description"] != "filled 3" {
		t.Fatalf("history starts %v, %v; want newest first", a.list[0]["description"], a.list[1]["description"])
	}
	if got := links(t, a.header.Get("Link")); got["next"] != 2 || got["last"] != 3 {
		t.Fatalf("links = %v", got)
	}
	// The legacy route lists the same.
	legacy := do(t, srv, http.MethodGet, createPath(srv, sha)+"?per_page=2", bearer(srv.Token), nil)
	if legacy.code != http.StatusOK || len(legacy.list) != 2 || legacy.list[0]["id"] != a.list[0]["id"] {
		t.Fatalf("legacy route answered %d %v", legacy.code, legacy.list)
	}
}

func TestCombinedState(t *testing.T) {
	cases := []struct {
		name   string
		states []string // one context each
		want   string
	}{
		{name: "no statuses are pending", want: "pending"},
		{name: "all success is success", states: []string{"success", "success"}, want: "success"},
		{name: "a pending context is pending", states: []string{"success", "pending"}, want: "pending"},
		{name: "an error context is failure", states: []string{"pending", "error"}, want: "failure"},
		{name: "a failure context is failure", states: []string{"success", "failure", "pending"}, want: "failure"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var recs []forge.Record
			for i, s := range tc.states {
				recs = append(recs, forge.Record{Context: strconv.Itoa(i), State: s})
			}
			if got := CombinedState(recs); got != tc.want {
				t.Fatalf("CombinedState = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRateLimitHeaders(t *testing.T) {
	srv := Start(t)
	sha := srv.NewCommit()
	var used int
	for i := range 3 {
		a := do(t, srv, http.MethodGet, combinedPath(srv, sha), bearer(srv.Token), nil)
		h := a.header
		if h.Get("X-RateLimit-Limit") != strconv.Itoa(RateLimit) || h.Get("X-RateLimit-Resource") != "core" {
			t.Fatalf("headers %v", h)
		}
		u, _ := strconv.Atoi(h.Get("X-RateLimit-Used"))
		rem, _ := strconv.Atoi(h.Get("X-RateLimit-Remaining"))
		reset, _ := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64)
		if u != used+1 || rem != RateLimit-u || rem == 0 || time.Unix(reset, 0).Before(time.Now()) {
			t.Fatalf("request %d: used %d remaining %d reset %d", i, u, rem, reset)
		}
		used = u
	}

	reset := time.Now().Add(time.Minute)
	srv.ExhaustRateLimit(reset)
	a := do(t, srv, http.MethodGet, combinedPath(srv, sha), bearer(srv.Token), nil)
	if a.code != http.StatusForbidden || a.header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("an exhausted limit answered %d remaining %q", a.code, a.header.Get("X-RateLimit-Remaining"))
	}
	if got, _ := strconv.ParseInt(a.header.Get("X-RateLimit-Reset"), 10, 64); got < reset.Unix() {
		t.Fatalf("X-RateLimit-Reset = %d, want %d", got, reset.Unix())
	}
	if msg, _ := a.body["message"].(string); !strings.HasPrefix(msg, "API rate limit exceeded") {
		t.Fatalf("message = %q", msg)
	}
}

func TestFaults(t *testing.T) {
	cases := []struct {
		name            string
		fault           forge.Fault
		wantRetryAfter  string
		wantMessage     string
		wantDocumentURL string
	}{
		{name: "429 is the secondary rate limit with Retry-After", fault: forge.Fault{Code: 429, RetryAfter: 2 * time.Second}, wantRetryAfter: "2", wantMessage: "You have exceeded a secondary rate limit", wantDocumentURL: docSecondary},
		{name: "403 is the secondary rate limit with Retry-After", fault: forge.Fault{Code: 403, RetryAfter: 1500 * time.Millisecond}, wantRetryAfter: "2", wantMessage: "You have exceeded a secondary rate limit", wantDocumentURL: docSecondary},
		{name: "403 without a wait has no Retry-After", fault: forge.Fault{Code: 403}, wantMessage: "You have exceeded a secondary rate limit", wantDocumentURL: docSecondary},
		{name: "5xx has a generic body", fault: forge.Fault{Code: 502}, wantMessage: "Server Error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := Start(t)
			sha := srv.NewCommit()
			srv.Store.FailNext(1, tc.fault)
			a := do(t, srv, http.MethodPost, createPath(srv, sha), bearer(srv.Token), map[string]string{"state": "success"})
			if a.code != tc.fault.Code || a.header.Get("Retry-After") != tc.wantRetryAfter {
				t.Fatalf("answered %d Retry-After %q", a.code, a.header.Get("Retry-After"))
			}
			if msg, _ := a.body["message"].(string); !strings.HasPrefix(msg, tc.wantMessage) {
				t.Fatalf("message = %q, want %q", msg, tc.wantMessage)
			}
			if tc.wantDocumentURL != "" && a.body["documentation_url"] != tc.wantDocumentURL {
				t.Fatalf("documentation_url = %v", a.body["documentation_url"])
			}
			// GitHub states the primary budget on every authenticated answer, a secondary
			// limit's included, with budget left: that budget's reset is not the wait.
			if secondary := tc.wantDocumentURL == docSecondary; secondary && (a.header.Get("X-RateLimit-Limit") == "" || a.header.Get("X-RateLimit-Remaining") == "0" || a.header.Get("X-RateLimit-Reset") == "") {
				t.Fatalf("a secondary limit's answer states no primary budget with some left: limit %q remaining %q reset %q",
					a.header.Get("X-RateLimit-Limit"), a.header.Get("X-RateLimit-Remaining"), a.header.Get("X-RateLimit-Reset"))
			}
			if n := srv.Store.Count(sha, "default"); n != 0 {
				t.Fatal("a faulted request was served")
			}
			reqs := srv.Store.Requests()
			if len(reqs) != 1 || reqs[0].Fault != tc.fault.Code {
				t.Fatalf("requests = %+v", reqs)
			}
			// The fault is spent: the next request is served.
			if a := do(t, srv, http.MethodPost, createPath(srv, sha), bearer(srv.Token), map[string]string{"state": "success"}); a.code != http.StatusCreated {
				t.Fatalf("after the fault: %d %v", a.code, a.body)
			}
		})
	}
}

func TestInstallationToken(t *testing.T) {
	const appID, installationID = 12, 34
	srv := Start(t)
	key, err := jwt.ParseRSAPrivateKeyFromPEM(srv.AddApp(appID, installationID))
	if err != nil {
		t.Fatal(err)
	}
	otherKey, err := jwt.ParseRSAPrivateKeyFromPEM(srv.AddApp(appID+1, installationID+1))
	if err != nil {
		t.Fatal(err)
	}
	sign := func(t *testing.T, claims jwt.RegisteredClaims, method jwt.SigningMethod, k any) string {
		s, err := jwt.NewWithClaims(method, claims).SignedString(k)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	now := time.Now()
	good := jwt.RegisteredClaims{
		Issuer:    strconv.Itoa(appID),
		IssuedAt:  jwt.NewNumericDate(now.Add(-time.Minute)),
		ExpiresAt: jwt.NewNumericDate(now.Add(5 * time.Minute)),
	}
	with := func(f func(c *jwt.RegisteredClaims)) jwt.RegisteredClaims { c := good; f(&c); return c }

	cases := []struct {
		name         string
		jwt          func(t *testing.T) string
		installation int64
		wantCode     int
		wantMessage  string
	}{
		{name: "a JWT the app signed gets a token", jwt: func(t *testing.T) string { return sign(t, good, jwt.SigningMethodRS256, key) }, installation: installationID, wantCode: 201},
		{name: "a JWT signed by another key is refused", jwt: func(t *testing.T) string { return sign(t, good, jwt.SigningMethodRS256, otherKey) }, installation: installationID, wantCode: 401, wantMessage: msgJWTUndecodable},
		{name: "a JWT not signed RS256 is refused", jwt: func(t *testing.T) string { return sign(t, good, jwt.SigningMethodHS256, []byte("k")) }, installation: installationID, wantCode: 401, wantMessage: msgJWTUndecodable},
		{name: "an unknown issuer is refused", jwt: func(t *testing.T) string {
			return sign(t, with(func(c *jwt.RegisteredClaims) { c.Issuer = "999" }), jwt.SigningMethodRS256, key)
		}, installation: installationID, wantCode: 401, wantMessage: msgJWTUndecodable},
		{name: "an expired JWT is refused", jwt: func(t *testing.T) string {
			return sign(t, with(func(c *jwt.RegisteredClaims) { c.ExpiresAt = jwt.NewNumericDate(now.Add(-time.Second)) }), jwt.SigningMethodRS256, key)
		}, installation: installationID, wantCode: 401, wantMessage: msgJWTExpired},
		{name: "a JWT expiring more than 10 minutes ahead is refused", jwt: func(t *testing.T) string {
			return sign(t, with(func(c *jwt.RegisteredClaims) { c.ExpiresAt = jwt.NewNumericDate(now.Add(11 * time.Minute)) }), jwt.SigningMethodRS256, key)
		}, installation: installationID, wantCode: 401, wantMessage: msgJWTTooFar},
		{name: "a JWT issued in the future is refused", jwt: func(t *testing.T) string {
			return sign(t, with(func(c *jwt.RegisteredClaims) { c.IssuedAt = jwt.NewNumericDate(now.Add(time.Minute)) }), jwt.SigningMethodRS256, key)
		}, installation: installationID, wantCode: 401, wantMessage: msgJWTIssuedAt},
		{name: "another app's installation is not found", jwt: func(t *testing.T) string { return sign(t, good, jwt.SigningMethodRS256, key) }, installation: installationID + 1, wantCode: 404, wantMessage: msgNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := do(t, srv, http.MethodPost, fmt.Sprintf("app/installations/%d/access_tokens", tc.installation), bearer(tc.jwt(t)), nil)
			if a.code != tc.wantCode {
				t.Fatalf("answered %d %v, want %d", a.code, a.body, tc.wantCode)
			}
			if tc.wantCode != http.StatusCreated {
				if a.body["message"] != tc.wantMessage {
					t.Fatalf("message = %v, want %q", a.body["message"], tc.wantMessage)
				}
				return
			}
			token, _ := a.body["token"].(string)
			exp, err := time.Parse(time.RFC3339, fmt.Sprint(a.body["expires_at"]))
			if token == "" || err != nil || exp.Before(time.Now().Add(59*time.Minute)) {
				t.Fatalf("body = %v, want a token expiring in an hour", a.body)
			}
			st := do(t, srv, http.MethodPost, createPath(srv, srv.NewCommit()), "token "+token, map[string]string{"state": "success"})
			if st.code != http.StatusCreated {
				t.Fatalf("the installation token was refused: %d %v", st.code, st.body)
			}
		})
	}
}

// A small primary limit runs out as GitHub's does: every answer counts it down in
// X-RateLimit-*, the request past it is refused with 403 and remaining 0 until the
// reset, and a new window begins after it.
func TestASetRateLimitRunsOutAndRenews(t *testing.T) {
	srv := Start(t)
	sha := srv.NewCommit()
	srv.SetRateLimit(3, time.Second)
	for i := range 3 {
		a := do(t, srv, http.MethodGet, combinedPath(srv, sha), bearer(srv.Token), nil)
		if a.code != http.StatusOK || a.header.Get("X-RateLimit-Limit") != "3" || a.header.Get("X-RateLimit-Remaining") != strconv.Itoa(2-i) {
			t.Fatalf("request %d: %d, limit %q remaining %q", i+1, a.code, a.header.Get("X-RateLimit-Limit"), a.header.Get("X-RateLimit-Remaining"))
		}
	}
	a := do(t, srv, http.MethodGet, combinedPath(srv, sha), bearer(srv.Token), nil)
	reset, _ := strconv.ParseInt(a.header.Get("X-RateLimit-Reset"), 10, 64)
	if a.code != http.StatusForbidden || a.header.Get("X-RateLimit-Remaining") != "0" || !strings.Contains(fmt.Sprint(a.body["message"]), "API rate limit exceeded") {
		t.Fatalf("the request past the limit answered %d remaining %q: %v", a.code, a.header.Get("X-RateLimit-Remaining"), a.body)
	}
	if srv.Store.Refused() != 1 {
		t.Fatalf("%d requests recorded as refused, want 1", srv.Store.Refused())
	}
	poll.Until(t, "the reset", func() (bool, string) { return time.Now().Unix() >= reset, "" })
	if a := do(t, srv, http.MethodGet, combinedPath(srv, sha), bearer(srv.Token), nil); a.code != http.StatusOK || a.header.Get("X-RateLimit-Remaining") != "2" {
		t.Fatalf("after the reset: %d remaining %q", a.code, a.header.Get("X-RateLimit-Remaining"))
	}
}

// GitHub's secondary limit on creating content refuses a status beyond it with 403, the
// secondary limit's message and Retry-After, while reads go on; once the oldest post
// leaves the period, a post goes again.
func TestAWriteLimitRefusesPostsBeyondIt(t *testing.T) {
	srv := Start(t)
	sha := srv.NewCommit()
	srv.Store.SetWriteLimit(2, time.Second)
	for i := range 2 {
		if a := do(t, srv, http.MethodPost, createPath(srv, sha), bearer(srv.Token), map[string]string{"state": "success", "context": fmt.Sprint("c", i)}); a.code != http.StatusCreated {
			t.Fatalf("post %d within the limit: %d", i+1, a.code)
		}
	}
	a := do(t, srv, http.MethodPost, createPath(srv, sha), bearer(srv.Token), map[string]string{"state": "success", "context": "c2"})
	if a.code != http.StatusForbidden || a.header.Get("Retry-After") != "1" || !strings.HasPrefix(fmt.Sprint(a.body["message"]), "You have exceeded a secondary rate limit") {
		t.Fatalf("the post beyond the limit answered %d, Retry-After %q: %v", a.code, a.header.Get("Retry-After"), a.body)
	}
	if a := do(t, srv, http.MethodGet, combinedPath(srv, sha), bearer(srv.Token), nil); a.code != http.StatusOK {
		t.Fatalf("a read beyond the write limit answered %d", a.code)
	}
	if n := srv.Store.Refused(); n != 1 {
		t.Fatalf("%d requests recorded as refused, want 1", n)
	}
	poll.Until(t, "the oldest post leaving the period", func() (bool, string) {
		a := do(t, srv, http.MethodPost, createPath(srv, sha), bearer(srv.Token), map[string]string{"state": "success", "context": "c2"})
		return a.code == http.StatusCreated, fmt.Sprint(a.code)
	})
	if n := srv.Store.Count(sha, "c2"); n != 1 {
		t.Fatalf("the refused posts were kept: %d statuses of c2, want 1", n)
	}
}

package gitlabtest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/test/forge"
	"github.com/flotilla-gitops/flotilla/test/forge/gitlabtest"
)

type answer struct {
	code   int
	header http.Header
	body   []byte
}

func (a answer) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("answer %d %q is not JSON: %v", a.code, a.body, err)
	}
}

// do sends a request with the server's token unless header says otherwise.
func do(t *testing.T, srv *gitlabtest.Server, method, path string, body any, header map[string]string) answer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("PRIVATE-TOKEN", srv.Token)
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{code: resp.StatusCode, header: resp.Header, body: b}
}

func encodedProject(srv *gitlabtest.Server) string { return url.PathEscape(srv.Project) }

func statusesPath(srv *gitlabtest.Server, sha string) string {
	return "/api/v4/projects/" + encodedProject(srv) + "/repository/commits/" + sha + "/statuses"
}

func postPath(srv *gitlabtest.Server, sha string) string {
	return "/api/v4/projects/" + encodedProject(srv) + "/statuses/" + sha
}

type commitStatus struct {
	ID          int64   `json:"id"`
	SHA         string  `json:"sha"`
	Ref         string  `json:"ref"`
	Status      string  `json:"status"`
	Name        string  `json:"name"`
	TargetURL   *string `json:"target_url"`
	Description *string `json:"description"`
	CreatedAt   *string `json:"created_at"`
	StartedAt   *string `json:"started_at"`
	FinishedAt  *string `json:"finished_at"`
	PipelineID  int64   `json:"pipeline_id"`
	Author      struct {
		Username string `json:"username"`
	} `json:"author"`
}

func post(t *testing.T, srv *gitlabtest.Server, sha string, body map[string]any) (answer, commitStatus) {
	t.Helper()
	a := do(t, srv, http.MethodPost, postPath(srv, sha), body, nil)
	var cs commitStatus
	if a.code == http.StatusCreated {
		a.json(t, &cs)
	}
	return a, cs
}

func mustPost(t *testing.T, srv *gitlabtest.Server, sha string, body map[string]any) commitStatus {
	t.Helper()
	a, cs := post(t, srv, sha, body)
	if a.code != http.StatusCreated {
		t.Fatalf("POST %v = %d %s, want 201", body, a.code, a.body)
	}
	return cs
}

func list(t *testing.T, srv *gitlabtest.Server, sha, query string) (answer, []commitStatus) {
	t.Helper()
	a := do(t, srv, http.MethodGet, statusesPath(srv, sha)+query, nil, nil)
	var out []commitStatus
	if a.code == http.StatusOK {
		a.json(t, &out)
	}
	return a, out
}

func TestAuthentication(t *testing.T) {
	srv := gitlabtest.Start(t)
	sha := srv.NewCommit()
	for _, tc := range []struct {
		name   string
		header map[string]string
		want   int
	}{
		{"PRIVATE-TOKEN is accepted", nil, http.StatusOK},
		{"a bearer token is accepted", map[string]string{"PRIVATE-TOKEN": "", "Authorization": "Bearer " + srv.Token}, http.StatusOK},
		{"a wrong token is refused", map[string]string{"PRIVATE-TOKEN": "glpat-wrong"}, http.StatusUnauthorized},
		{"a wrong bearer token is refused", map[string]string{"PRIVATE-TOKEN": "", "Authorization": "Bearer glpat-wrong"}, http.StatusUnauthorized},
		{"no token is refused", map[string]string{"PRIVATE-TOKEN": ""}, http.StatusUnauthorized},
		{"the token as basic credentials is refused", map[string]string{"PRIVATE-TOKEN": "", "Authorization": "Basic " + srv.Token}, http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := do(t, srv, http.MethodGet, statusesPath(srv, sha), nil, tc.header)
			if a.code != tc.want {
				t.Fatalf("GET = %d %s, want %d", a.code, a.body, tc.want)
			}
			if tc.want == http.StatusUnauthorized {
				var m map[string]string
				a.json(t, &m)
				if m["message"] != "401 Unauthorized" {
					t.Fatalf("body = %s, want GitLab's 401 message", a.body)
				}
			}
		})
	}
}

func TestProjectAndCommitLookup(t *testing.T) {
	srv := gitlabtest.Start(t)
	sha := srv.NewCommit()
	for _, tc := range []struct {
		name, project, sha string
		want               int
		body               string
	}{
		{"the URL-encoded path finds the project", url.PathEscape(srv.Project), sha, http.StatusOK, ""},
		{"the numeric ID finds the project", strconv.FormatInt(srv.ID, 10), sha, http.StatusOK, ""},
		{"the path is matched without regard to case", url.PathEscape(strings.ToUpper(srv.Project)), sha, http.StatusOK, ""},
		{"an unknown path is not found", url.PathEscape("fleet/other"), sha, http.StatusNotFound, `{"message":"404 Project Not Found"}`},
		{"an unknown ID is not found", "1", sha, http.StatusNotFound, `{"message":"404 Project Not Found"}`},
		{"an unencoded path is no route", srv.Project, sha, http.StatusNotFound, `{"error":"404 Not Found"}`},
		{"an unknown commit is not found", url.PathEscape(srv.Project), strings.Repeat("0", 40), http.StatusNotFound, `{"message":"404 Commit Not Found"}`},
		{"the commit is found in capitals", url.PathEscape(srv.Project), strings.ToUpper(sha), http.StatusOK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, method := range []string{http.MethodGet, http.MethodPost} {
				path := "/api/v4/projects/" + tc.project + "/repository/commits/" + tc.sha + "/statuses"
				var body any
				if method == http.MethodPost {
					path = "/api/v4/projects/" + tc.project + "/statuses/" + tc.sha
					body = map[string]any{"state": "success", "name": "lookup"}
				}
				a := do(t, srv, method, path, body, nil)
				want := tc.want
				if want == http.StatusOK && method == http.MethodPost {
					want = http.StatusCreated
				}
				if a.code != want {
					t.Fatalf("%s = %d %s, want %d", method, a.code, a.body, want)
				}
				if tc.body != "" && strings.TrimSpace(string(a.body)) != tc.body {
					t.Fatalf("%s body = %s, want %s", method, a.body, tc.body)
				}
			}
		})
	}
}

func TestPostValidation(t *testing.T) {
	srv := gitlabtest.Start(t)
	sha := srv.NewCommit()
	long := strings.Repeat("ä", 256)
	for _, tc := range []struct {
		name string
		body map[string]any
		want string
	}{
		{"a missing state is refused", map[string]any{"name": "a"}, `{"error":"state is missing"}`},
		{"GitHub's failure is no GitLab state", map[string]any{"state": "failure", "name": "a"}, `{"error":"state does not have a valid value"}`},
		{"GitHub's error is no GitLab state", map[string]any{"state": "error", "name": "a"}, `{"error":"state does not have a valid value"}`},
		{"a description over 255 characters is refused", map[string]any{"state": "pending", "name": "a", "description": long},
			`{"message":{"description":["is too long (maximum is 255 characters)"]}}`},
		{"a target URL over 255 characters is refused", map[string]any{"state": "pending", "name": "a", "target_url": "https://x/" + long},
			`{"message":{"target_url":["is too long (maximum is 255 characters)"]}}`},
		{"a blank name is refused", map[string]any{"state": "pending", "name": " "}, `{"message":{"name":["can't be blank"]}}`},
		{"an unknown pipeline is not found", map[string]any{"state": "pending", "name": "a", "pipeline_id": 999999},
			`{"message":"404 Pipeline for pipeline_id, sha and ref Not Found"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := post(t, srv, sha, tc.body)
			if a.code != http.StatusBadRequest && a.code != http.StatusNotFound {
				t.Fatalf("POST = %d %s, want a refusal", a.code, a.body)
			}
			if got := strings.TrimSpace(string(a.body)); got != tc.want {
				t.Fatalf("body = %s, want %s", got, tc.want)
			}
		})
	}
	if n := len(srv.Store.All(sha)); n != 0 {
		t.Fatalf("refused posts left %d statuses", n)
	}
	t.Run("255 characters are accepted", func(t *testing.T) {
		cs := mustPost(t, srv, sha, map[string]any{"state": "pending", "name": "a", "description": long[:255*2]})
		if cs.Description == nil || *cs.Description != long[:255*2] {
			t.Fatalf("description = %v", cs.Description)
		}
	})
}

func TestPostAnswersWithTheCommitStatus(t *testing.T) {
	srv := gitlabtest.Start(t)
	sha := srv.NewCommit()
	cs := mustPost(t, srv, sha, map[string]any{"state": "success", "context": "flotilla/a", "description": "ready", "target_url": "https://hub.example/a"})
	if cs.ID == 0 || cs.SHA != sha || cs.Ref != gitlabtest.DefaultBranch || cs.Status != "success" || cs.Name != "flotilla/a" ||
		*cs.Description != "ready" || *cs.TargetURL != "https://hub.example/a" || cs.PipelineID == 0 || cs.Author.Username == "" {
		t.Fatalf("answer = %+v", cs)
	}
	if cs.CreatedAt == nil || cs.FinishedAt == nil || cs.StartedAt != nil {
		t.Fatalf("a success has created_at and finished_at, no started_at: %+v", cs)
	}
	if _, err := time.Parse(time.RFC3339, *cs.CreatedAt); err != nil {
		t.Fatalf("created_at %q: %v", *cs.CreatedAt, err)
	}
	d := mustPost(t, srv, sha, map[string]any{"state": "pending"})
	if d.Name != gitlabtest.DefaultName || d.Description != nil || d.TargetURL != nil {
		t.Fatalf("a status without name or description = %+v, want name %q and null attributes", d, gitlabtest.DefaultName)
	}
}

// TestTransitions pins GitLab's state machine: a post finds the open (pending or
// running) job of its name and moves it, and refuses a move the machine lacks; a post
// with no open job adds a job.
func TestTransitions(t *testing.T) {
	type step struct {
		state, description string
		// wantCode is the answer; wantNew whether it added a job.
		wantCode int
		wantNew  bool
		wantMsg  string
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"pending to pending is refused, description and all", []step{
			{"pending", "one", 201, true, ""},
			{"pending", "two", 400, false, `Cannot transition status via :enqueue from :pending (Reason(s): Status cannot transition via "enqueue")`},
		}},
		{"pending moves to success in place", []step{
			{"pending", "one", 201, true, ""},
			{"success", "two", 201, false, ""},
		}},
		{"pending moves to failed in place", []step{{"pending", "", 201, true, ""}, {"failed", "x", 201, false, ""}}},
		{"pending moves to canceled in place", []step{{"pending", "", 201, true, ""}, {"canceled", "x", 201, false, ""}}},
		{"pending moves to skipped in place", []step{{"pending", "", 201, true, ""}, {"skipped", "x", 201, false, ""}}},
		{"pending moves to running, and running to success, in place", []step{
			{"pending", "", 201, true, ""}, {"running", "", 201, false, ""}, {"success", "", 201, false, ""},
		}},
		{"running to running is refused", []step{
			{"running", "", 201, true, ""},
			{"running", "", 400, false, `Cannot transition status via :run from :running (Reason(s): Status cannot transition via "run")`},
		}},
		{"running to pending is refused", []step{
			{"running", "", 201, true, ""},
			{"pending", "", 400, false, `Cannot transition status via :enqueue from :running (Reason(s): Status cannot transition via "enqueue")`},
		}},
		{"running to skipped is refused", []step{
			{"running", "", 201, true, ""},
			{"skipped", "", 400, false, `Cannot transition status via :skip from :running (Reason(s): Status cannot transition via "skip")`},
		}},
		{"a done job is followed by a new one, in any state", []step{
			{"success", "", 201, true, ""}, {"success", "", 201, true, ""}, {"pending", "", 201, true, ""},
			{"canceled", "", 201, false, ""}, {"pending", "", 201, true, ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := gitlabtest.Start(t)
			sha := srv.NewCommit()
			jobs := 0
			var last commitStatus
			for i, s := range tc.steps {
				body := map[string]any{"state": s.state, "name": "flotilla/a"}
				if s.description != "" {
					body["description"] = s.description
				}
				a, cs := post(t, srv, sha, body)
				if a.code != s.wantCode {
					t.Fatalf("step %d (%s): %d %s, want %d", i, s.state, a.code, a.body, s.wantCode)
				}
				if s.wantCode != 201 {
					var m map[string]string
					a.json(t, &m)
					if m["message"] != s.wantMsg {
						t.Fatalf("step %d: message %q, want %q", i, m["message"], s.wantMsg)
					}
					continue
				}
				if s.wantNew {
					jobs++
					if cs.ID == last.ID {
						t.Fatalf("step %d: updated job %d, want a new one", i, cs.ID)
					}
				} else if cs.ID != last.ID {
					t.Fatalf("step %d: new job %d, want job %d updated in place", i, cs.ID, last.ID)
				}
				if cs.Status != s.state {
					t.Fatalf("step %d: status %q, want %q", i, cs.Status, s.state)
				}
				last = cs
			}
			if n := srv.Store.Count(sha, "flotilla/a"); n != jobs {
				t.Fatalf("the forge holds %d statuses, want %d", n, jobs)
			}
			_, latest := list(t, srv, sha, "")
			if len(latest) != 1 || latest[0].ID != last.ID || latest[0].Status != last.Status {
				t.Fatalf("latest = %+v, want job %d %s", latest, last.ID, last.Status)
			}
		})
	}
}

func TestUpdateInPlace(t *testing.T) {
	srv := gitlabtest.Start(t)
	sha := srv.NewCommit()
	first := mustPost(t, srv, sha, map[string]any{"state": "pending", "name": "a", "description": "waiting", "target_url": "https://hub.example/a"})

	t.Run("a refused transition saves nothing", func(t *testing.T) {
		if a, _ := post(t, srv, sha, map[string]any{"state": "pending", "name": "a", "description": "still waiting"}); a.code != 400 {
			t.Fatalf("POST = %d", a.code)
		}
		_, got := list(t, srv, sha, "")
		if *got[0].Description != "waiting" {
			t.Fatalf("description = %q after a refused post", *got[0].Description)
		}
	})
	t.Run("running sets started_at", func(t *testing.T) {
		cs := mustPost(t, srv, sha, map[string]any{"state": "running", "name": "a", "description": "applying"})
		if cs.ID != first.ID || cs.StartedAt == nil || cs.FinishedAt != nil {
			t.Fatalf("running = %+v", cs)
		}
	})
	t.Run("blank attributes keep their old values", func(t *testing.T) {
		cs := mustPost(t, srv, sha, map[string]any{"state": "success", "name": "a", "description": " ", "target_url": ""})
		if cs.ID != first.ID || *cs.Description != "applying" || *cs.TargetURL != "https://hub.example/a" || cs.FinishedAt == nil {
			t.Fatalf("success = %+v, want the old description and target URL", cs)
		}
	})
	t.Run("All shows the update and Count one job", func(t *testing.T) {
		all := srv.All(sha)
		if len(all) != 1 || all[0].State != "success" || all[0].Description != "applying" {
			t.Fatalf("All = %+v", all)
		}
		if n := srv.Store.Count(sha, "a"); n != 1 {
			t.Fatalf("Count = %d, want 1", n)
		}
	})
}

func TestListing(t *testing.T) {
	srv := gitlabtest.Start(t)
	sha := srv.NewCommit()
	// Two pipelines: main's, created by the first post, and feature's, created between
	// two posts on main, so that ordering by pipeline differs from ordering by ID.
	mustPost(t, srv, sha, map[string]any{"state": "success", "name": "a", "description": "old"})
	mustPost(t, srv, sha, map[string]any{"state": "failed", "name": "a", "description": "new"})
	mustPost(t, srv, sha, map[string]any{"state": "success", "name": "c", "ref": "feature"})
	mustPost(t, srv, sha, map[string]any{"state": "pending", "name": "b", "ref": "main"})

	for _, tc := range []struct {
		name, query string
		want        []string // name:status:ref of each, in order
	}{
		{"by default only the latest of each name", "", []string{"a:failed:main", "c:success:feature", "b:pending:main"}},
		{"all=true lists the history", "?all=true", []string{"a:success:main", "a:failed:main", "c:success:feature", "b:pending:main"}},
		{"all=false is the default", "?all=false", []string{"a:failed:main", "c:success:feature", "b:pending:main"}},
		{"ref filters", "?ref=feature", []string{"c:success:feature"}},
		{"name filters", "?name=b", []string{"b:pending:main"}},
		{"name and all together", "?name=a&all=1", []string{"a:success:main", "a:failed:main"}},
		{"posted statuses are in the external stage", "?stage=external", []string{"a:failed:main", "c:success:feature", "b:pending:main"}},
		{"no status is in another stage", "?stage=test", nil},
		{"sort=desc reverses", "?sort=desc", []string{"b:pending:main", "c:success:feature", "a:failed:main"}},
		{"order_by=pipeline_id groups pipelines", "?order_by=pipeline_id", []string{"a:failed:main", "b:pending:main", "c:success:feature"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, got := list(t, srv, sha, tc.query)
			if a.code != http.StatusOK {
				t.Fatalf("GET = %d %s", a.code, a.body)
			}
			var names []string
			for _, cs := range got {
				names = append(names, cs.Name+":"+cs.Status+":"+cs.Ref)
			}
			if fmt.Sprint(names) != fmt.Sprint(tc.want) {
				t.Fatalf("listed %v, want %v", names, tc.want)
			}
		})
	}
	for _, tc := range []struct{ query, want string }{
		{"?all=maybe", `{"error":"all is invalid"}`},
		{"?order_by=name", `{"error":"order_by does not have a valid value"}`},
		{"?sort=up", `{"error":"sort does not have a valid value"}`},
		{"?page=x", `{"error":"page is invalid"}`},
		{"?page=0", `{"error":"page does not have a valid value"}`},
		{"?per_page=0", `{"error":"per_page has a value not allowed"}`},
		{"?per_page=-1", `{"error":"per_page does not have a valid value"}`},
	} {
		t.Run("invalid "+tc.query, func(t *testing.T) {
			a, _ := list(t, srv, sha, tc.query)
			if a.code != http.StatusBadRequest || strings.TrimSpace(string(a.body)) != tc.want {
				t.Fatalf("GET %s = %d %s, want 400 %s", tc.query, a.code, a.body, tc.want)
			}
		})
	}
}

func TestRefOfAPostWithoutOne(t *testing.T) {
	srv := gitlabtest.Start(t)
	sha := srv.NewCommit()
	for _, tc := range []struct {
		name string
		body map[string]any
		ref  string
	}{
		{"the first status goes on the branch holding the commit", map[string]any{"state": "success", "name": "a"}, gitlabtest.DefaultBranch},
		{"a ref given is taken", map[string]any{"state": "success", "name": "a", "ref": "feature"}, "feature"},
		{"a status without ref joins the newest pipeline", map[string]any{"state": "success", "name": "b"}, "feature"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if cs := mustPost(t, srv, sha, tc.body); cs.Ref != tc.ref {
				t.Fatalf("ref = %q, want %q", cs.Ref, tc.ref)
			}
		})
	}
	if a, _ := post(t, srv, sha, map[string]any{"state": "success", "name": "a", "ref": ""}); a.code != 404 ||
		strings.TrimSpace(string(a.body)) != `{"message":"404 References for commit Not Found"}` {
		t.Fatalf("an empty ref = %d %s, want 404 References for commit Not Found", a.code, a.body)
	}
}

func TestPagination(t *testing.T) {
	srv := gitlabtest.Start(t)
	sha := srv.NewCommit()
	for i := range 45 {
		srv.Store.Add(sha, forge.Record{Context: fmt.Sprintf("w%02d", i), State: "success"})
	}
	for _, tc := range []struct {
		name, query                          string
		n                                    int
		perPage, page, next, prev, totalPage string
		rels                                 []string
	}{
		{"20 a page by default", "", 20, "20", "1", "2", "", "3", []string{"next", "first", "last"}},
		{"a middle page links both ways", "?page=2", 20, "20", "2", "3", "1", "3", []string{"prev", "next", "first", "last"}},
		{"the last page has no next", "?page=3", 5, "20", "3", "", "2", "3", []string{"prev", "first", "last"}},
		{"a page past the end is empty", "?page=9", 0, "20", "9", "", "", "3", []string{"first", "last"}},
		{"per_page is capped at 100", "?per_page=500", 45, "100", "1", "", "", "1", []string{"first", "last"}},
		{"per_page is honoured", "?per_page=10&page=5", 5, "10", "5", "", "4", "5", []string{"prev", "first", "last"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, got := list(t, srv, sha, tc.query)
			if a.code != http.StatusOK || len(got) != tc.n {
				t.Fatalf("GET = %d with %d statuses, want %d", a.code, len(got), tc.n)
			}
			h := a.header
			for k, want := range map[string]string{
				"X-Total": "45", "X-Total-Pages": tc.totalPage, "X-Per-Page": tc.perPage,
				"X-Page": tc.page, "X-Next-Page": tc.next, "X-Prev-Page": tc.prev,
			} {
				if _, ok := h[http.CanonicalHeaderKey(k)]; !ok || h.Get(k) != want {
					t.Errorf("%s = %q (present %v), want %q", k, h.Get(k), ok, want)
				}
			}
			var rels []string
			for l := range strings.SplitSeq(h.Get("Link"), ", ") {
				target, rel, ok := strings.Cut(l, "; rel=")
				if !ok {
					t.Fatalf("Link %q", h.Get("Link"))
				}
				rels = append(rels, strings.Trim(rel, `"`))
				u, err := url.Parse(strings.Trim(target, "<>"))
				if err != nil || u.Query().Get("per_page") != tc.perPage || u.Query().Get("page") == "" {
					t.Fatalf("Link target %q", target)
				}
				if !strings.HasPrefix(u.String(), srv.URL+statusesPath(srv, sha)) {
					t.Fatalf("Link target %q is not this listing", target)
				}
			}
			if fmt.Sprint(rels) != fmt.Sprint(tc.rels) {
				t.Fatalf("Link rels %v, want %v", rels, tc.rels)
			}
		})
	}
	t.Run("following X-Next-Page reads every status once", func(t *testing.T) {
		seen := map[int64]bool{}
		for page := "1"; page != ""; {
			a, got := list(t, srv, sha, "?per_page=7&page="+page)
			for _, cs := range got {
				if seen[cs.ID] {
					t.Fatalf("status %d listed twice", cs.ID)
				}
				seen[cs.ID] = true
			}
			page = a.header.Get("X-Next-Page")
		}
		if len(seen) != 45 {
			t.Fatalf("read %d statuses, want 45", len(seen))
		}
	})
}

func TestFaults(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fault      forge.Fault
		method     string
		wantType   string
		wantBody   string
		wantHeader map[string]string
	}{
		{"a server error has GitLab's message", forge.Fault{Code: 500}, http.MethodGet, "application/json", `{"message":"500 Internal Server Error"}`, nil},
		{"a bad gateway says when to retry", forge.Fault{Code: 502, RetryAfter: 3 * time.Second}, http.MethodPost, "application/json",
			`{"message":"502 Bad Gateway"}`, map[string]string{"Retry-After": "3"}},
		{"a conflict on a post is the lock's", forge.Fault{Code: 409}, http.MethodPost, "application/json",
			`{"message":"Another update to this commit status is in progress"}`, nil},
		{"a rate limit is Rack::Attack's", forge.Fault{Code: 429, RetryAfter: 2 * time.Second}, http.MethodGet, "text/plain", "Retry later",
			map[string]string{"Retry-After": "2", "RateLimit-Name": "throttle_authenticated_api", "RateLimit-Remaining": "0", "RateLimit-Limit": "2000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := gitlabtest.Start(t)
			sha := srv.NewCommit()
			srv.Store.FailNext(1, tc.fault)
			path, body := statusesPath(srv, sha), any(nil)
			if tc.method == http.MethodPost {
				path, body = postPath(srv, sha), map[string]any{"state": "pending", "name": "a"}
			}
			before := time.Now()
			a := do(t, srv, tc.method, path, body, nil)
			if a.code != tc.fault.Code || !strings.HasPrefix(a.header.Get("Content-Type"), tc.wantType) || strings.TrimSpace(string(a.body)) != tc.wantBody {
				t.Fatalf("answer %d %s %q, want %d %s %q", a.code, a.header.Get("Content-Type"), a.body, tc.fault.Code, tc.wantType, tc.wantBody)
			}
			for k, v := range tc.wantHeader {
				if a.header.Get(k) != v {
					t.Errorf("%s = %q, want %q", k, a.header.Get(k), v)
				}
			}
			if tc.fault.Code == 429 {
				reset, err := strconv.ParseInt(a.header.Get("RateLimit-Reset"), 10, 64)
				if err != nil || time.Unix(reset, 0).Before(before.Truncate(time.Second)) {
					t.Errorf("RateLimit-Reset = %q, want the epoch second the quota resets", a.header.Get("RateLimit-Reset"))
				}
				if _, err := http.ParseTime(a.header.Get("RateLimit-ResetTime")); err != nil {
					t.Errorf("RateLimit-ResetTime = %q: %v", a.header.Get("RateLimit-ResetTime"), err)
				}
			}
			if n := len(srv.Store.All(sha)); n != 0 {
				t.Fatalf("a faulted request stored %d statuses", n)
			}
			reqs := srv.Store.Requests()
			if len(reqs) != 1 || reqs[0].Fault != tc.fault.Code || reqs[0].Method != tc.method {
				t.Fatalf("requests = %+v", reqs)
			}
			if a := do(t, srv, tc.method, path, body, nil); a.code >= 300 {
				t.Fatalf("the request after the fault = %d %s", a.code, a.body)
			}
		})
	}
}

func TestRoutes(t *testing.T) {
	srv := gitlabtest.Start(t)
	sha := srv.NewCommit()
	for _, tc := range []struct {
		name, method, path string
		want               int
	}{
		{"DELETE on the statuses of a commit is not allowed", http.MethodDelete, statusesPath(srv, sha), http.StatusMethodNotAllowed},
		{"GET on the post route is not allowed", http.MethodGet, postPath(srv, sha), http.StatusMethodNotAllowed},
		{"HEAD lists", http.MethodHead, statusesPath(srv, sha), http.StatusOK},
		{"another API is no route", http.MethodGet, "/api/v4/projects/" + encodedProject(srv) + "/issues", http.StatusNotFound},
		{"outside the API is no route", http.MethodGet, "/projects", http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if a := do(t, srv, tc.method, tc.path, nil, nil); a.code != tc.want {
				t.Fatalf("%s %s = %d %s, want %d", tc.method, tc.path, a.code, a.body, tc.want)
			}
		})
	}
}

func TestFilledHistoryReadsAsJobs(t *testing.T) {
	srv := gitlabtest.Start(t)
	sha := srv.NewCommit()
	srv.Store.Fill(sha, "flotilla/a", "pending", 30)
	_, latest := list(t, srv, sha, "")
	if len(latest) != 1 || latest[0].Description == nil || *latest[0].Description != "filled 29" {
		t.Fatalf("latest = %+v, want the newest filled status alone", latest)
	}
	a, _ := list(t, srv, sha, "?all=true")
	if a.header.Get("X-Total") != "30" {
		t.Fatalf("X-Total = %q with all=true, want 30", a.header.Get("X-Total"))
	}
	cs := mustPost(t, srv, sha, map[string]any{"state": "success", "name": "flotilla/a"})
	if cs.ID != latest[0].ID {
		t.Fatalf("success went to job %d, want the open job %d moved", cs.ID, latest[0].ID)
	}
	if n := srv.Store.Count(sha, "flotilla/a"); n != 30 {
		t.Fatalf("Count = %d, want 30", n)
	}
}

// The authenticated API limit SetRateLimit turns on answers as Rack::Attack does: the
// requests within it state nothing, the one past it is 429 "Retry later" with
// Retry-After and RateLimit-* headers, its limit stated per minute.
func TestARateLimitRefusesAsRackAttack(t *testing.T) {
	srv := gitlabtest.Start(t)
	sha := srv.NewCommit()
	srv.SetRateLimit(2, time.Second)
	for i := range 2 {
		a := do(t, srv, http.MethodGet, statusesPath(srv, sha), nil, nil)
		if a.code != http.StatusOK || a.header.Get("RateLimit-Remaining") != "" {
			t.Fatalf("request %d: %d, RateLimit-Remaining %q", i+1, a.code, a.header.Get("RateLimit-Remaining"))
		}
	}
	a := do(t, srv, http.MethodGet, statusesPath(srv, sha), nil, nil)
	h := a.header
	if a.code != http.StatusTooManyRequests || strings.TrimSpace(string(a.body)) != "Retry later" {
		t.Fatalf("the request past the limit answered %d %q", a.code, a.body)
	}
	if h.Get("RateLimit-Limit") != "120" || h.Get("RateLimit-Remaining") != "0" || h.Get("RateLimit-Reset") == "" || h.Get("Retry-After") == "" {
		t.Fatalf("the refusal's headers: limit %q remaining %q reset %q retry-after %q", h.Get("RateLimit-Limit"), h.Get("RateLimit-Remaining"), h.Get("RateLimit-Reset"), h.Get("Retry-After"))
	}
}

// A forgotten commit goes with its statuses, jobs and pipeline, as a force-pushed one
// GitLab collected: posting on it is refused as on an unknown commit, the other commits
// keep theirs, and a pipeline created afterwards takes no other pipeline's ID.
func TestForget(t *testing.T) {
	srv := gitlabtest.Start(t)
	gone, kept := srv.NewCommit(), srv.NewCommit()
	forgotten := mustPost(t, srv, gone, map[string]any{"state": "running", "context": "flotilla/a"})
	other := mustPost(t, srv, kept, map[string]any{"state": "pending", "context": "flotilla/a"})
	srv.Forget(gone)
	if a, _ := post(t, srv, gone, map[string]any{"state": "success", "context": "flotilla/a"}); a.code != http.StatusNotFound {
		t.Errorf("POST on a forgotten commit = %d %s, want 404", a.code, a.body)
	}
	if all := srv.All(gone); len(all) != 0 {
		t.Errorf("a forgotten commit holds %v", all)
	}
	if _, out := list(t, srv, kept, ""); len(out) != 1 || out[0].Status != "pending" {
		t.Errorf("the commit kept lists %+v, want its pending status", out)
	}
	next := mustPost(t, srv, srv.NewCommit(), map[string]any{"state": "pending", "context": "flotilla/a"})
	if next.PipelineID == forgotten.PipelineID || next.PipelineID == other.PipelineID {
		t.Errorf("a new commit's pipeline %d is another's: the forgotten commit's %d, the kept one's %d", next.PipelineID, forgotten.PipelineID, other.PipelineID)
	}
	srv.Store.ForgetRequests()
	if reqs := srv.Store.Requests(); len(reqs) != 0 {
		t.Errorf("after ForgetRequests the log holds %d requests", len(reqs))
	}
}

package giteatest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/test/forge"
	"github.com/flotilla-gitops/flotilla/test/forge/giteatest"
)

// call sends one request and returns the status code, the headers and the body.
func call(t *testing.T, method, url, auth, body string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
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
	return resp.StatusCode, resp.Header, b
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return v
}

func api(srv *giteatest.Server, path string) string {
	return srv.URL + "/api/v1/repos/" + srv.Owner + "/" + srv.Repo + path
}

func TestVersionIsAnswered(t *testing.T) {
	srv := giteatest.Start(t)
	code, _, body := call(t, "GET", srv.URL+"/api/v1/version", "", "")
	if code != 200 {
		t.Fatalf("GET /version = %d %s", code, body)
	}
	if v := decode[map[string]string](t, body); v["version"] != giteatest.Version {
		t.Fatalf("version = %q, want %q", v["version"], giteatest.Version)
	}
}

func TestAuthorization(t *testing.T) {
	srv := giteatest.Start(t)
	commit := srv.NewCommit()
	post := `{"state":"pending","context":"flotilla/a"}`
	tests := []struct {
		name    string
		method  string
		auth    string
		code    int
		message string
	}{
		{"a token with the token scheme is accepted", "POST", "token " + srv.Token, 201, ""},
		{"a token with the Bearer scheme is accepted", "POST", "Bearer " + srv.Token, 201, ""},
		{"the scheme is read in any case", "POST", "TOKEN " + srv.Token, 201, ""},
		{"an unknown token is 401 with Gitea's message, token and all", "POST", "token wrong", 401, "access token does not exist [sha: wrong]"},
		{"an unknown token is 401 on reads too", "GET", "Bearer wrong", 401, "access token does not exist [sha: wrong]"},
		{"no token cannot see the private repository", "GET", "", 404, "The target couldn't be found."},
		{"no token cannot post to it either", "POST", "", 404, "The target couldn't be found."},
		{"another scheme is no token", "POST", "Basic " + srv.Token, 404, "The target couldn't be found."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, body := api(srv, "/commits/"+commit+"/status"), ""
			if tt.method == "POST" {
				url, body = api(srv, "/statuses/"+commit), post
			}
			code, _, got := call(t, tt.method, url, tt.auth, body)
			if code != tt.code {
				t.Fatalf("%s = %d %s, want %d", tt.method, code, got, tt.code)
			}
			if tt.message == "" {
				return
			}
			e := decode[map[string]any](t, got)
			if e["message"] != tt.message || e["url"] != srv.URL+"/api/swagger" {
				t.Fatalf("error body %s, want message %q and the swagger URL", got, tt.message)
			}
		})
	}
	t.Run("an unknown token is refused on the public version endpoint too", func(t *testing.T) {
		if code, _, _ := call(t, "GET", srv.URL+"/api/v1/version", "token wrong", ""); code != 401 {
			t.Fatalf("GET /version with an unknown token = %d, want 401", code)
		}
	})
}

func TestCreateStatus(t *testing.T) {
	srv := giteatest.Start(t)
	auth := "token " + srv.Token
	commit := srv.NewCommit()
	code, _, body := call(t, "POST", api(srv, "/statuses/"+commit), auth,
		`{"state":"failure","target_url":" https://hub.example/a ","description":"  bad preset\n","context":" flotilla/a "}`)
	if code != 201 {
		t.Fatalf("POST = %d %s, want 201", code, body)
	}
	got := decode[map[string]any](t, body)
	t.Run("the answer is a CommitStatus, its state in status", func(t *testing.T) {
		for _, k := range []string{"id", "status", "target_url", "description", "url", "context", "creator", "created_at", "updated_at"} {
			if _, ok := got[k]; !ok {
				t.Errorf("answer %s has no %q", body, k)
			}
		}
		if _, ok := got["state"]; ok {
			t.Errorf("answer %s has a state field; Gitea's CommitStatus names it status", body)
		}
		if got["status"] != "failure" {
			t.Errorf("status = %v, want failure", got["status"])
		}
	})
	t.Run("text fields are stored trimmed", func(t *testing.T) {
		if got["context"] != "flotilla/a" || got["description"] != "bad preset" || got["target_url"] != "https://hub.example/a" {
			t.Errorf("answer %s, want trimmed context, description and target URL", body)
		}
		recs := srv.Store.All(commit)
		if len(recs) != 1 || recs[0].Context != "flotilla/a" || recs[0].Description != "bad preset" || recs[0].State != "failure" {
			t.Errorf("store holds %+v", recs)
		}
	})
	t.Run("the id is the status's index on its commit", func(t *testing.T) {
		if got["id"] != float64(1) {
			t.Errorf("id = %v, want 1", got["id"])
		}
		_, _, again := call(t, "POST", api(srv, "/statuses/"+commit), auth, `{"state":"success","context":"flotilla/b"}`)
		if id := decode[map[string]any](t, again)["id"]; id != float64(2) {
			t.Errorf("second id = %v, want 2", id)
		}
		other := srv.NewCommit()
		_, _, first := call(t, "POST", api(srv, "/statuses/"+other), auth, `{"state":"success","context":"flotilla/b"}`)
		if id := decode[map[string]any](t, first)["id"]; id != float64(1) {
			t.Errorf("id on another commit = %v, want 1", id)
		}
	})
	t.Run("url and creator are Gitea's", func(t *testing.T) {
		if want := api(srv, "/statuses/"+commit); got["url"] != want {
			t.Errorf("url = %v, want %s", got["url"], want)
		}
		c, _ := got["creator"].(map[string]any)
		if c["login"] == "" || c["id"] == nil {
			t.Errorf("creator = %v", got["creator"])
		}
		if got["created_at"] != got["updated_at"] {
			t.Errorf("created_at %v and updated_at %v differ; Gitea sets both from the creation", got["created_at"], got["updated_at"])
		}
	})
	t.Run("an abbreviated hash is the commit", func(t *testing.T) {
		code, _, body := call(t, "POST", api(srv, "/statuses/"+commit[:10]), auth, `{"state":"success","context":"flotilla/c"}`)
		if code != 201 || srv.Store.Count(commit, "flotilla/c") != 1 {
			t.Fatalf("POST on %s = %d %s", commit[:10], code, body)
		}
	})
}

func TestCreateStatusRefusals(t *testing.T) {
	srv := giteatest.Start(t)
	auth := "token " + srv.Token
	commit := srv.NewCommit()
	tests := []struct {
		name    string
		path    string
		body    string
		code    int
		message string
		prefix  bool // the message is decoder text after Gitea's "[]: "
	}{
		{"a state outside Gitea's documented ones is a binding error", "/statuses/" + commit, `{"state":"cancelled","context":"a"}`, 422, "[State]: In", false},
		{"a state sent as status is no state", "/statuses/" + commit, `{"status":"success","context":"a"}`, 422, "[State]: In", false},
		{"a body that is not JSON is a binding error", "/statuses/" + commit, `{"state":`, 422, "[]: ", true},
		{"a state of the wrong type is a binding error", "/statuses/" + commit, `{"state":1}`, 422, "[]: json: cannot unmarshal number", true},
		{"an unknown commit is a server error with the message blanked", "/statuses/" + strings.Repeat("0", 40), `{"state":"success","context":"a"}`, 500, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, body := call(t, "POST", api(srv, tt.path), auth, tt.body)
			if code != tt.code {
				t.Fatalf("POST = %d %s, want %d", code, body, tt.code)
			}
			e := decode[map[string]any](t, body)
			msg, _ := e["message"].(string)
			if (tt.prefix && !strings.HasPrefix(msg, tt.message)) || (!tt.prefix && msg != tt.message) || e["url"] == nil {
				t.Fatalf("body %s, want message %q", body, tt.message)
			}
		})
	}
	if n := len(srv.Store.All(commit)); n != 0 {
		t.Fatalf("refused posts stored %d statuses", n)
	}
	t.Run("an unknown repository is 404", func(t *testing.T) {
		for _, path := range []string{"/api/v1/repos/" + srv.Owner + "/other/statuses/" + commit, "/api/v1/repos/nobody/" + srv.Repo + "/statuses/" + commit} {
			code, _, body := call(t, "POST", srv.URL+path, auth, `{"state":"success"}`)
			if code != 404 || decode[map[string]any](t, body)["message"] != "The target couldn't be found." {
				t.Errorf("POST %s = %d %s, want Gitea's 404", path, code, body)
			}
		}
	})
	t.Run("repository names compare without case", func(t *testing.T) {
		path := "/api/v1/repos/" + strings.ToUpper(srv.Owner) + "/" + strings.ToUpper(srv.Repo) + "/statuses/" + commit
		if code, _, body := call(t, "POST", srv.URL+path, auth, `{"state":"success","context":"a"}`); code != 201 {
			t.Errorf("POST %s = %d %s", path, code, body)
		}
	})
}

type combined struct {
	State      string           `json:"state"`
	SHA        string           `json:"sha"`
	TotalCount int              `json:"total_count"`
	Statuses   []map[string]any `json:"statuses"`
	Repository map[string]any   `json:"repository"`
	CommitURL  string           `json:"commit_url"`
	URL        string           `json:"url"`
}

func TestCombinedStatus(t *testing.T) {
	srv := giteatest.Start(t)
	auth := "token " + srv.Token
	commit := srv.NewCommit()
	for i := range 75 {
		srv.Store.Add(commit, forge.Record{Context: fmt.Sprintf("flotilla/w%02d", i), State: "pending"})
	}
	// w00 is posted again last, so it is the newest context.
	srv.Store.Add(commit, forge.Record{Context: "flotilla/w00", State: "success"})
	tests := []struct {
		name  string
		query string
		n     int
		first string
	}{
		{"no limit is DEFAULT_PAGING_NUM", "", 30, "flotilla/w00"},
		{"a limit above MAX_RESPONSE_ITEMS is cut to it", "?limit=100", 50, "flotilla/w00"},
		{"the second page holds the rest", "?limit=50&page=2", 25, "flotilla/w25"},
		{"page 0 is page 1", "?page=0&limit=10", 10, "flotilla/w00"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, h, body := call(t, "GET", api(srv, "/commits/"+commit+"/status"+tt.query), auth, "")
			if code != 200 {
				t.Fatalf("GET = %d %s", code, body)
			}
			cs := decode[combined](t, body)
			if len(cs.Statuses) != tt.n || cs.TotalCount != tt.n {
				t.Fatalf("%d statuses, total_count %d, want %d (the page's)", len(cs.Statuses), cs.TotalCount, tt.n)
			}
			if h.Get("X-Total-Count") != "75" {
				t.Fatalf("X-Total-Count = %q, want 75 contexts", h.Get("X-Total-Count"))
			}
			if cs.Statuses[0]["context"] != tt.first {
				t.Fatalf("first context %v, want %s: contexts come newest first", cs.Statuses[0]["context"], tt.first)
			}
			if cs.SHA != commit || cs.Repository["full_name"] != srv.Owner+"/"+srv.Repo ||
				cs.CommitURL != api(srv, "/commits/"+commit) || cs.URL != api(srv, "/commits/"+commit+"/status") {
				t.Fatalf("combined status %s", body)
			}
		})
	}
	t.Run("the newest status of each context is the one shown", func(t *testing.T) {
		_, _, body := call(t, "GET", api(srv, "/commits/"+commit+"/status?limit=1"), auth, "")
		cs := decode[combined](t, body)
		if cs.Statuses[0]["status"] != "success" || cs.Statuses[0]["id"] != float64(76) {
			t.Fatalf("w00 shown as %v, want its newest status, index 76", cs.Statuses[0])
		}
	})
	t.Run("a page past the end is an empty combined status without a count", func(t *testing.T) {
		code, h, body := call(t, "GET", api(srv, "/commits/"+commit+"/status?limit=50&page=3"), auth, "")
		cs := decode[combined](t, body)
		if code != 200 || cs.SHA != "" || cs.Statuses != nil || cs.Repository != nil || h.Get("X-Total-Count") != "" {
			t.Fatalf("GET past the end = %d %v %s", code, h, body)
		}
	})
	t.Run("an unknown commit has no statuses", func(t *testing.T) {
		code, _, body := call(t, "GET", api(srv, "/commits/"+strings.Repeat("f", 40)+"/status"), auth, "")
		if cs := decode[combined](t, body); code != 200 || len(cs.Statuses) != 0 || cs.State != "" {
			t.Fatalf("GET = %d %s", code, body)
		}
	})
}

func TestCombinedState(t *testing.T) {
	tests := []struct {
		name   string
		states []string
		want   string
	}{
		{"all success is success", []string{"success", "success"}, "success"},
		{"warning and skipped count as success", []string{"success", "warning", "skipped"}, "success"},
		{"an error is failure", []string{"success", "error"}, "failure"},
		{"a failure is failure, pending or not", []string{"pending", "failure"}, "failure"},
		{"a pending context makes it pending", []string{"success", "pending"}, "pending"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := giteatest.Start(t)
			commit := srv.NewCommit()
			for i, s := range tt.states {
				srv.Store.Add(commit, forge.Record{Context: fmt.Sprint(i), State: s})
			}
			_, _, body := call(t, "GET", api(srv, "/commits/"+commit+"/status"), "token "+srv.Token, "")
			if got := decode[combined](t, body).State; got != tt.want {
				t.Fatalf("state = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestListStatuses(t *testing.T) {
	srv := giteatest.Start(t)
	auth := "token " + srv.Token
	commit := srv.NewCommit()
	for i := range 7 {
		state := "pending"
		if i%2 == 1 {
			state = "success"
		}
		srv.Store.Add(commit, forge.Record{Context: "flotilla/a", State: state, Description: fmt.Sprint(i)})
	}
	for _, base := range []string{"/statuses/" + commit, "/commits/" + commit + "/statuses"} {
		t.Run(base, func(t *testing.T) {
			tests := []struct {
				name  string
				query string
				descs []string
				link  string
			}{
				{"history comes newest first", "?limit=3", []string{"6", "5", "4"},
					`<URL?limit=3&page=2>; rel="next",<URL?limit=3&page=3>; rel="last"`},
				{"a middle page links every way", "?limit=3&page=2", []string{"3", "2", "1"},
					`<URL?limit=3&page=3>; rel="next",<URL?limit=3&page=3>; rel="last",<URL?limit=3&page=1>; rel="first",<URL?limit=3&page=1>; rel="prev"`},
				{"the last page links back", "?limit=3&page=3", []string{"0"},
					`<URL?limit=3&page=1>; rel="first",<URL?limit=3&page=2>; rel="prev"`},
				{"oldest sorts by creation ascending", "?sort=oldest&limit=2", []string{"0", "1"},
					`<URL?limit=2&page=2&sort=oldest>; rel="next",<URL?limit=2&page=4&sort=oldest>; rel="last"`},
				{"the state filter keeps one state", "?state=success", []string{"5", "3", "1"}, ""},
				{"an unknown state filter is ignored", "?state=bogus&limit=50", []string{"6", "5", "4", "3", "2", "1", "0"}, ""},
				{"leastindex is index descending, as Gitea has it", "?sort=leastindex&limit=1", []string{"6"},
					`<URL?limit=1&page=2&sort=leastindex>; rel="next",<URL?limit=1&page=7&sort=leastindex>; rel="last"`},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					code, h, body := call(t, "GET", api(srv, base+tt.query), auth, "")
					if code != 200 {
						t.Fatalf("GET = %d %s", code, body)
					}
					var got []string
					for _, s := range decode[[]map[string]any](t, body) {
						got = append(got, s["description"].(string))
					}
					if fmt.Sprint(got) != fmt.Sprint(tt.descs) {
						t.Fatalf("descriptions %v, want %v", got, tt.descs)
					}
					if want := strings.ReplaceAll(tt.link, "URL", api(srv, base)); h.Get("Link") != want {
						t.Fatalf("Link = %q\nwant   %q", h.Get("Link"), want)
					}
					if want := fmt.Sprint(len(tt.descs)); tt.query == "?state=success" && h.Get("X-Total-Count") != want {
						t.Fatalf("X-Total-Count = %q, want %s", h.Get("X-Total-Count"), want)
					}
				})
			}
		})
	}
	t.Run("the total counts every status", func(t *testing.T) {
		_, h, _ := call(t, "GET", api(srv, "/statuses/"+commit+"?limit=1"), auth, "")
		if h.Get("X-Total-Count") != "7" {
			t.Fatalf("X-Total-Count = %q, want 7", h.Get("X-Total-Count"))
		}
	})
	t.Run("a commit without statuses is an empty list", func(t *testing.T) {
		code, h, body := call(t, "GET", api(srv, "/statuses/"+srv.NewCommit()), auth, "")
		if code != 200 || strings.TrimSpace(string(body)) != "[]" || h.Get("X-Total-Count") != "0" || h.Get("Link") != "" {
			t.Fatalf("GET = %d %v %s", code, h, body)
		}
	})
	t.Run("the default page is DEFAULT_PAGING_NUM", func(t *testing.T) {
		other := srv.NewCommit()
		srv.Store.Fill(other, "flotilla/a", "pending", 40)
		_, _, body := call(t, "GET", api(srv, "/statuses/"+other), auth, "")
		if n := len(decode[[]map[string]any](t, body)); n != giteatest.DefaultPagingNum {
			t.Fatalf("%d statuses, want %d", n, giteatest.DefaultPagingNum)
		}
	})
}

func TestFaults(t *testing.T) {
	srv := giteatest.Start(t)
	commit := srv.NewCommit()
	srv.Store.FailNext(1, forge.Fault{Code: 429, RetryAfter: 1500 * time.Millisecond})
	srv.Store.FailNext(1, forge.Fault{Code: 502})
	url := api(srv, "/statuses/"+commit)
	tests := []struct {
		name       string
		code       int
		retryAfter string
	}{
		{"a fault with a wait sends Retry-After in whole seconds, rounded up", 429, "2"},
		{"a fault without a wait sends none", 502, ""},
		{"the next request is served", 201, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, h, body := call(t, "POST", url, "token "+srv.Token, `{"state":"success","context":"a"}`)
			if code != tt.code || h.Get("Retry-After") != tt.retryAfter {
				t.Fatalf("POST = %d, Retry-After %q, want %d, %q", code, h.Get("Retry-After"), tt.code, tt.retryAfter)
			}
			if tt.code != 201 {
				e := decode[map[string]any](t, body)
				if e["message"] != http.StatusText(tt.code) || e["url"] == nil {
					t.Fatalf("fault body %s is not Gitea's error shape", body)
				}
			}
		})
	}
	reqs := srv.Store.Requests()
	if len(reqs) != 3 || reqs[0].Fault != 429 || reqs[1].Fault != 502 || reqs[2].Fault != 0 || reqs[2].Path != "/api/v1/repos/"+srv.Owner+"/"+srv.Repo+"/statuses/"+commit {
		t.Fatalf("requests logged: %+v", reqs)
	}
	if n := srv.Store.Count(commit, "a"); n != 1 {
		t.Fatalf("faulted requests stored statuses: %d, want 1", n)
	}
}

// Gitea limits no request itself; the proxy SetRateLimit puts in front of it refuses
// the request past its limit with 429 and Retry-After, and states nothing before.
func TestARateLimitingProxyRefusesWithRetryAfter(t *testing.T) {
	srv := giteatest.Start(t)
	sha := srv.NewCommit()
	srv.SetRateLimit(2, time.Minute)
	for i := range 2 {
		code, h, _ := call(t, "GET", api(srv, "/commits/"+sha+"/status"), "token "+srv.Token, "")
		if code != http.StatusOK || h.Get("X-RateLimit-Remaining") != "" || h.Get("RateLimit-Remaining") != "" {
			t.Fatalf("request %d: %d, with budget headers %v", i+1, code, h)
		}
	}
	code, h, body := call(t, "GET", api(srv, "/commits/"+sha+"/status"), "token "+srv.Token, "")
	if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" || h.Get("Retry-After") == "0" {
		t.Fatalf("the request past the limit answered %d, Retry-After %q: %s", code, h.Get("Retry-After"), body)
	}
	if srv.Store.Refused() != 1 {
		t.Fatalf("%d requests recorded as refused, want 1", srv.Store.Refused())
	}
}

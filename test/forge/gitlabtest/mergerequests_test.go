package gitlabtest_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/test/forge/gitlabtest"
)

type mergeRequest struct {
	IID          int64  `json:"iid"`
	State        string `json:"state"`
	TargetBranch string `json:"target_branch"`
	ProjectID    int64  `json:"project_id"`
	WebURL       string `json:"web_url"`
}

func mergeRequestsPath(srv *gitlabtest.Server) string {
	return "/api/v4/projects/" + encodedProject(srv) + "/merge_requests"
}

// TestListMergeRequests pins GET /projects/:id/merge_requests as GitLab documents it:
// the state and target_branch filters, newest first, page and per_page with their
// limits and the X-* headers, and Grape's refusal of values it does not know.
func TestListMergeRequests(t *testing.T) {
	srv := gitlabtest.Start(t)
	// 1..130: every third is closed, every fourth goes into release.
	for iid := 1; iid <= 130; iid++ {
		target := "main"
		if iid%4 == 0 {
			target = "release"
		}
		srv.SetMergeRequest(iid, target, iid%3 != 0)
	}
	count := func(keep func(iid int) bool) string {
		n := 0
		for iid := 1; iid <= 130; iid++ {
			if keep(iid) {
				n++
			}
		}
		return fmt.Sprint(n)
	}
	openIntoMain := count(func(iid int) bool { return iid%3 != 0 && iid%4 != 0 })
	for _, tc := range []struct {
		name, query string
		n           int
		first       int64
		// keep says which merge requests the query selects.
		keep                  func(iid int) bool
		perPage, next, xTotal string
	}{
		{"without state every merge request is listed, 20 a page", "", 20, 130,
			func(int) bool { return true }, "20", "2", "130"},
		{"opened lists the open ones", "?state=opened&per_page=100", 87, 130,
			func(iid int) bool { return iid%3 != 0 }, "100", "", "87"},
		{"closed lists the closed ones", "?state=closed&per_page=100", 43, 129,
			func(iid int) bool { return iid%3 == 0 }, "100", "", "43"},
		{"target_branch keeps the ones into that branch", "?target_branch=release&per_page=100", 32, 128,
			func(iid int) bool { return iid%4 == 0 }, "100", "", "32"},
		{"both filters together", "?state=opened&target_branch=main&per_page=50", 50, 130,
			func(iid int) bool { return iid%3 != 0 && iid%4 != 0 }, "50", "2", openIntoMain},
		{"per_page is capped at 100", "?per_page=500", 100, 130,
			func(int) bool { return true }, "100", "2", "130"},
		{"sort=asc lists the oldest first", "?sort=asc&per_page=5", 5, 1,
			func(int) bool { return true }, "5", "2", "130"},
		{"a branch without merge requests lists none", "?target_branch=mainline", 0, 0,
			func(int) bool { return false }, "20", "", "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := do(t, srv, http.MethodGet, mergeRequestsPath(srv)+tc.query, nil, nil)
			if a.code != http.StatusOK {
				t.Fatalf("GET = %d %s", a.code, a.body)
			}
			var got []mergeRequest
			a.json(t, &got)
			if len(got) != tc.n {
				t.Fatalf("%d merge requests, want %d", len(got), tc.n)
			}
			if tc.n > 0 && got[0].IID != tc.first {
				t.Fatalf("first !%d, want !%d", got[0].IID, tc.first)
			}
			for _, mr := range got {
				if !tc.keep(int(mr.IID)) {
					t.Fatalf("!%d (%s into %s) listed", mr.IID, mr.State, mr.TargetBranch)
				}
				wantState := map[bool]string{true: "opened", false: "closed"}[mr.IID%3 != 0]
				if mr.State != wantState || mr.ProjectID != srv.ID || !strings.HasSuffix(mr.WebURL, fmt.Sprintf("/-/merge_requests/%d", mr.IID)) {
					t.Fatalf("merge request %+v", mr)
				}
			}
			for k, want := range map[string]string{"X-Per-Page": tc.perPage, "X-Next-Page": tc.next, "X-Total": tc.xTotal, "X-Page": "1"} {
				if _, ok := a.header[http.CanonicalHeaderKey(k)]; !ok || a.header.Get(k) != want {
					t.Errorf("%s = %q, want %q", k, a.header.Get(k), want)
				}
			}
		})
	}
	t.Run("following X-Next-Page reads every open merge request into main once", func(t *testing.T) {
		seen := map[int64]bool{}
		pages := 0
		for page := "1"; page != ""; pages++ {
			a := do(t, srv, http.MethodGet, mergeRequestsPath(srv)+"?state=opened&target_branch=main&per_page=20&page="+page, nil, nil)
			var got []mergeRequest
			a.json(t, &got)
			for _, mr := range got {
				if seen[mr.IID] || mr.State != "opened" || mr.TargetBranch != "main" {
					t.Fatalf("!%d (%s into %s) listed, or listed twice", mr.IID, mr.State, mr.TargetBranch)
				}
				seen[mr.IID] = true
			}
			page = a.header.Get("X-Next-Page")
		}
		if fmt.Sprint(len(seen)) != openIntoMain || pages < 2 {
			t.Fatalf("read %d merge requests on %d pages, want %s on more than one", len(seen), pages, openIntoMain)
		}
	})
	t.Run("the Link header keeps the filters", func(t *testing.T) {
		a := do(t, srv, http.MethodGet, mergeRequestsPath(srv)+"?state=opened&target_branch=main", nil, nil)
		for l := range strings.SplitSeq(a.header.Get("Link"), ", ") {
			target, _, _ := strings.Cut(l, "; rel=")
			u, err := url.Parse(strings.Trim(target, "<>"))
			if err != nil || u.Query().Get("state") != "opened" || u.Query().Get("target_branch") != "main" {
				t.Fatalf("Link target %q lost the filters", target)
			}
		}
	})
	for _, tc := range []struct {
		name, path string
		header     map[string]string
		code       int
		body       string
	}{
		{"an unknown state is refused", mergeRequestsPath(srv) + "?state=open", nil, http.StatusBadRequest, `{"error":"state does not have a valid value"}`},
		{"an unknown order is refused", mergeRequestsPath(srv) + "?order_by=iid", nil, http.StatusBadRequest, `{"error":"order_by does not have a valid value"}`},
		{"page 0 is refused", mergeRequestsPath(srv) + "?page=0", nil, http.StatusBadRequest, `{"error":"page does not have a valid value"}`},
		{"a wrong token is 401", mergeRequestsPath(srv), map[string]string{"PRIVATE-TOKEN": "glpat-wrong"}, http.StatusUnauthorized, `{"message":"401 Unauthorized"}`},
		{"no token cannot see the private project", mergeRequestsPath(srv), map[string]string{"PRIVATE-TOKEN": ""}, http.StatusNotFound, `{"message":"404 Project Not Found"}`},
		{"another project is not found", "/api/v4/projects/other%2Fproject/merge_requests", nil, http.StatusNotFound, `{"message":"404 Project Not Found"}`},
		{"the numeric ID names the project too", fmt.Sprintf("/api/v4/projects/%d/merge_requests?per_page=1", srv.ID), nil, http.StatusOK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := do(t, srv, http.MethodGet, tc.path, nil, tc.header)
			if a.code != tc.code || (tc.body != "" && strings.TrimSpace(string(a.body)) != tc.body) {
				t.Fatalf("GET = %d %s, want %d %s", a.code, a.body, tc.code, tc.body)
			}
		})
	}
}

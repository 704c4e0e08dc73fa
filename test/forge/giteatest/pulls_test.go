package giteatest_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/test/forge/giteatest"
)

// TestListPulls pins GET /repos/{owner}/{repo}/pulls as Gitea serves it: the state
// filter of its code, newest first, pages of at most MAX_RESPONSE_ITEMS with
// X-Total-Count and Link, and each pull request's base branch.
func TestListPulls(t *testing.T) {
	srv := giteatest.Start(t)
	auth := "token " + srv.Token
	// 1..120: every third is closed, every fourth goes into release.
	for n := 1; n <= 120; n++ {
		base := "main"
		if n%4 == 0 {
			base = "release"
		}
		srv.SetPullRequest(n, base, n%3 != 0)
	}
	type pull struct {
		Number int64  `json:"number"`
		State  string `json:"state"`
		Base   struct {
			Ref   string `json:"ref"`
			Label string `json:"label"`
		} `json:"base"`
	}
	tests := []struct {
		name  string
		query string
		n     int
		first int64
		state string // every listed pull request's state, "" for any
		total string
		rels  []string
	}{
		{"open lists the open ones, newest first", "?state=open&limit=50", 50, 119, "open", "80", []string{"next", "last"}},
		{"the second page goes on where the first ended", "?state=open&limit=50&page=2", 30, 44, "open", "80", []string{"first", "prev"}},
		{"closed lists the closed ones", "?state=closed&limit=50", 40, 120, "closed", "40", nil},
		{"all lists every one", "?state=all&limit=10", 10, 120, "", "120", []string{"next", "last"}},
		{"no state lists every one, as Gitea's code does", "?limit=10", 10, 120, "", "120", []string{"next", "last"}},
		{"no limit is DEFAULT_PAGING_NUM", "?state=open", giteatest.DefaultPagingNum, 119, "open", "80", []string{"next", "last"}},
		{"a limit above MAX_RESPONSE_ITEMS is cut to it", "?state=open&limit=100", giteatest.MaxResponseItems, 119, "open", "80", []string{"next", "last"}},
		{"oldest sorts by creation ascending", "?state=open&sort=oldest&limit=5", 5, 1, "open", "80", []string{"next", "last"}},
		{"a page past the end is empty", "?state=open&limit=50&page=9", 0, 0, "open", "80", []string{"first", "prev"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, h, body := call(t, "GET", api(srv, "/pulls"+tt.query), auth, "")
			if code != 200 {
				t.Fatalf("GET = %d %s", code, body)
			}
			prs := decode[[]pull](t, body)
			if len(prs) != tt.n {
				t.Fatalf("%d pull requests, want %d", len(prs), tt.n)
			}
			if tt.n > 0 && prs[0].Number != tt.first {
				t.Fatalf("first #%d, want #%d", prs[0].Number, tt.first)
			}
			for _, pr := range prs {
				if tt.state != "" && pr.State != tt.state {
					t.Fatalf("#%d is %s in a listing of %s ones", pr.Number, pr.State, tt.state)
				}
				want := map[bool]string{false: "main", true: "release"}[pr.Number%4 == 0]
				if pr.Base.Ref != want || pr.Base.Label != want {
					t.Fatalf("#%d has base %+v, want %s", pr.Number, pr.Base, want)
				}
			}
			if h.Get("X-Total-Count") != tt.total {
				t.Fatalf("X-Total-Count = %q, want %s", h.Get("X-Total-Count"), tt.total)
			}
			var rels []string
			for l := range strings.SplitSeq(h.Get("Link"), ",") {
				if _, rel, ok := strings.Cut(l, "; rel="); ok {
					rels = append(rels, strings.Trim(rel, `"`))
				}
			}
			if fmt.Sprint(rels) != fmt.Sprint(tt.rels) {
				t.Fatalf("Link %q has rels %v, want %v", h.Get("Link"), rels, tt.rels)
			}
		})
	}
	t.Run("following the next links reads every open pull request once", func(t *testing.T) {
		seen := map[int64]bool{}
		for next := api(srv, "/pulls?state=open&limit=50"); next != ""; {
			code, h, body := call(t, "GET", next, auth, "")
			if code != 200 {
				t.Fatalf("GET %s = %d %s", next, code, body)
			}
			for _, pr := range decode[[]pull](t, body) {
				if seen[pr.Number] {
					t.Fatalf("#%d listed twice", pr.Number)
				}
				seen[pr.Number] = true
			}
			next = ""
			for l := range strings.SplitSeq(h.Get("Link"), ",") {
				if target, ok := strings.CutSuffix(l, `; rel="next"`); ok {
					next = strings.Trim(target, "<>")
				}
			}
		}
		if len(seen) != 80 {
			t.Fatalf("read %d open pull requests, want 80", len(seen))
		}
	})
	t.Run("a repository without pull requests lists none", func(t *testing.T) {
		other := giteatest.Start(t)
		code, h, body := call(t, "GET", api(other, "/pulls?state=open"), "token "+other.Token, "")
		if code != 200 || strings.TrimSpace(string(body)) != "[]" || h.Get("X-Total-Count") != "0" || h.Get("Link") != "" {
			t.Fatalf("GET = %d %v %s", code, h, body)
		}
	})
	for _, tt := range []struct {
		name, auth string
		code       int
	}{
		{"an unknown token is 401", "token wrong", 401},
		{"no token cannot see the private repository's pull requests", "", 404},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if code, _, body := call(t, "GET", api(srv, "/pulls?state=open"), tt.auth, ""); code != tt.code {
				t.Fatalf("GET = %d %s, want %d", code, body, tt.code)
			}
		})
	}
}

package giteatest

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// pullRequest is what the server keeps of a pull request.
type pullRequest struct {
	base   string // the branch it would merge into
	closed bool
}

// SetPullRequest records pull request number into branch base as open or closed, for
// GET /repos/{owner}/{repo}/pulls.
func (s *Server) SetPullRequest(number int, base string, open bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pulls == nil {
		s.pulls = map[int64]pullRequest{}
	}
	s.pulls[int64(number)] = pullRequest{base: base, closed: !open}
}

// listPulls is GET /repos/{owner}/{repo}/pulls (repoListPullRequests): the
// repository's pull requests, a page of them, counted in X-Total-Count and linked in
// Link.
//
// The state filter is Gitea's code, not its swagger: listPullRequestStatement filters
// on "open" and "closed" alone, so any other state, and none, lists every pull request
// although the swagger gives "open" as the default. The order is applySorts': newest
// first, "oldest" and "leastupdate" oldest first. The other sorts (recentupdate,
// mostcomment, leastcomment, priority) fall back to newest first, and with pull
// requests that are never updated, commented or prioritised here, that is the order
// they give. Filters this server does not keep the data for (labels, milestone,
// poster) and the base_branch filter of recent releases are not served: the
// backend filters by base.ref itself, so that it works with every release.
func (s *Server) listPulls(w http.ResponseWriter, r *http.Request) {
	if !s.checkRepo(w, r) {
		return
	}
	q := r.URL.Query()
	state := strings.TrimSpace(q.Get("state"))
	s.mu.Lock()
	type numbered struct {
		number int64
		pullRequest
	}
	var all []numbered
	for n, pr := range s.pulls {
		if (state == "open" && pr.closed) || (state == "closed" && !pr.closed) {
			continue
		}
		all = append(all, numbered{n, pr})
	}
	s.mu.Unlock()
	slices.SortFunc(all, func(a, b numbered) int { return cmp.Compare(b.number, a.number) })
	switch strings.TrimSpace(q.Get("sort")) {
	case "oldest", "leastupdate":
		slices.Reverse(all)
	}
	page, size := listOptions(q)
	total := len(all)
	items := pageOf(all, page, size)
	out := make([]pull, 0, len(items))
	for _, x := range items {
		out = append(out, s.pull(x.number, x.pullRequest))
	}
	s.setLinkHeader(w, r, total, size, page)
	setTotalCount(w, total)
	writeJSON(w, http.StatusOK, out)
}

// pull is the part of Gitea's api.PullRequest a listing shows that this server keeps.
type pull struct {
	ID        int64      `json:"id"`
	URL       string     `json:"url"`
	Number    int64      `json:"number"`
	User      *user      `json:"user"`
	Title     string     `json:"title"`
	State     string     `json:"state"`
	HTMLURL   string     `json:"html_url"`
	DiffURL   string     `json:"diff_url"`
	PatchURL  string     `json:"patch_url"`
	Merged    bool       `json:"merged"`
	Base      branchInfo `json:"base"`
	Head      branchInfo `json:"head"`
	Created   time.Time  `json:"created_at"`
	Updated   time.Time  `json:"updated_at"`
	Closed    *time.Time `json:"closed_at"`
	Draft     bool       `json:"draft"`
	IsLocked  bool       `json:"is_locked"`
	Comments  int        `json:"comments"`
	Mergeable bool       `json:"mergeable"`
}

// branchInfo is Gitea's api.PRBranchInfo: "label" and "ref" are both the branch name.
type branchInfo struct {
	Label  string      `json:"label"`
	Ref    string      `json:"ref"`
	RepoID int64       `json:"repo_id"`
	Repo   *repository `json:"repo"`
}

// pull shows pull request number as the API does, from a head branch of its own.
func (s *Server) pull(number int64, pr pullRequest) pull {
	html := s.appURL() + url.PathEscape(s.Owner) + "/" + url.PathEscape(s.Repo) + "/pulls/" + strconv.FormatInt(number, 10)
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(number) * time.Minute)
	state := "open"
	var closed *time.Time
	if pr.closed {
		state, closed = "closed", &created
	}
	repo := s.repoObject()
	head := fmt.Sprintf("change-%d", number)
	return pull{
		ID: 1000 + number, URL: html, Number: number, User: s.creator(),
		Title: fmt.Sprintf("Change %d", number), State: state,
		HTMLURL: html, DiffURL: html + ".diff", PatchURL: html + ".patch",
		Base:    branchInfo{Label: pr.base, Ref: pr.base, RepoID: repo.ID, Repo: repo},
		Head:    branchInfo{Label: head, Ref: head, RepoID: repo.ID, Repo: repo},
		Created: created, Updated: created, Closed: closed, Mergeable: !pr.closed,
	}
}

package hub

import (
	_ "embed"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/reconciler/plan"
)

// CommitsPathPrefix is where the hub serves its commit pages: CommitsPathPrefix + source
// + "/" + commit lists every cluster's state on that commit, as HTML, and with ".json"
// appended for machines. The fleet's summary status links there.
const CommitsPathPrefix = "/commits/"

// CommitPath is where the page of a source's commit is served.
func CommitPath(source, commit string) string {
	return CommitsPathPrefix + url.PathEscape(source) + "/" + commit
}

// CommitPages serves the commit pages of every source, from memory: each source keeps
// the newest commits it posted statuses on (pagedCommits of them), and an older commit's
// page is not found.
func (h *Hub) CommitPages() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+CommitsPathPrefix+"{source}/{commit}", h.serveCommit)
	return mux
}

// PageCluster is one cluster's state on a commit, as the page lists it.
type PageCluster struct {
	Name        string             `json:"name"`
	State       commitstatus.State `json:"state"`
	Description string             `json:"description"`
	TargetURL   string             `json:"targetURL,omitempty"`
}

// CommitPage is what a commit page shows.
type CommitPage struct {
	Source  string    `json:"source"`
	Commit  string    `json:"commit"`
	Updated time.Time `json:"updated"`
	// Since is set when the page lists only the clusters refreshed since then: the hub
	// had let the commit's page go, keeping the newest commits' only.
	Since *time.Time           `json:"since,omitempty"`
	Fleet *commitstatus.Status `json:"fleet,omitempty"`
	// Counts are the clusters listed by state.
	Counts   map[commitstatus.State]int `json:"counts"`
	Clusters []PageCluster              `json:"clusters"`
}

func (h *Hub) serveCommit(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("source")
	commit, asJSON := strings.CutSuffix(r.PathValue("commit"), ".json")
	if !plan.IsCommit(commit) {
		http.Error(w, "not a commit: pages are served by full 40-hex commit hash", http.StatusBadRequest)
		return
	}
	commit = strings.ToLower(commit)
	var src *Source
	h.mu.Lock()
	for _, s := range h.sources {
		if s.opts.Name == name {
			src = s
		}
	}
	h.mu.Unlock()
	if src == nil {
		http.Error(w, "no such source", http.StatusNotFound)
		return
	}
	rec, ok := src.book.snapshot(commit)
	if !ok {
		http.Error(w, "no statuses of this commit are kept: the hub keeps the newest commits' only", http.StatusNotFound)
		return
	}
	page := CommitPage{Source: name, Commit: commit, Updated: rec.updated, Fleet: rec.fleet, Counts: map[commitstatus.State]int{}}
	if !rec.since.IsZero() {
		page.Since = &rec.since
	}
	for n, st := range rec.clusters {
		page.Clusters = append(page.Clusters, PageCluster{Name: n, State: st.State, Description: st.Description, TargetURL: st.TargetURL})
		page.Counts[st.State]++
	}
	// What needs a look first: failures, then what is on its way, then what is done.
	rank := map[commitstatus.State]int{commitstatus.Error: 0, commitstatus.Failure: 0, commitstatus.Pending: 1, commitstatus.Success: 2}
	slices.SortFunc(page.Clusters, func(a, b PageCluster) int {
		if d := rank[a.State] - rank[b.State]; d != 0 {
			return d
		}
		return strings.Compare(a.Name, b.Name)
	})

	plan.WritePage(w, commitPageTemplate, page, asJSON)
}

//go:embed page_commits.html
var commitPageHTML string

var commitPageTemplate = template.Must(template.New("commit").Funcs(template.FuncMap{
	"short":     func(commit string) string { return commit[:min(len(commit), 12)] },
	"thousands": thousands,
	// safeURL lets only http(s) links through; html/template would neutralize others,
	// and a link that goes nowhere is better left out.
	"link": func(s string) string {
		if u, err := url.Parse(s); err == nil && (u.Scheme == "https" || u.Scheme == "http") {
			return s
		}
		return ""
	},
}).Parse(commitPageHTML))

package gitlabtest

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"
)

// mergeRequestStates are the values the list takes for state (merge_requests_base_params).
var mergeRequestStates = []string{"opened", "closed", "locked", "merged", "all"}

// mergeRequestOrders are the values it takes for order_by
// (Helpers::MergeRequestsHelpers.sort_options).
var mergeRequestOrders = []string{"created_at", "label_priority", "milestone_due", "merged_at", "popularity", "priority", "title", "updated_at"}

// serveMergeRequests is GET /projects/:id/merge_requests ("List project merge
// requests"): the project's merge requests, all of them unless state says which,
// those into target_branch when it is given, newest first, paginated like every list.
//
// The route reads without authentication (authenticate_non_get!), so a request
// without a token is an anonymous one, which cannot see this private project: 404. A
// token that GitLab does not know is refused with 401 on every route. Merge requests
// here are never updated, commented, labelled or prioritised, so every order_by sorts
// by creation, which is the order of the IIDs. Creating a merge request (POST) is not
// served.
func (s *Server) serveMergeRequests(w http.ResponseWriter, r *http.Request, rawID string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		notFoundRoute(w)
		return
	}
	id, err := url.PathUnescape(rawID)
	if err != nil || id == "" {
		notFoundRoute(w)
		return
	}
	switch {
	case s.authenticated(r):
	case token(r) != "":
		writeJSON(w, http.StatusUnauthorized, message("401 Unauthorized"))
		return
	default:
		writeJSON(w, http.StatusNotFound, message("404 Project Not Found"))
		return
	}

	q := r.URL.Query()
	var errs []string
	state, orderBy, sortDir := "all", "created_at", "desc"
	if q.Has("state") {
		if state = q.Get("state"); !slices.Contains(mergeRequestStates, state) {
			errs = append(errs, "state does not have a valid value")
		}
	}
	if q.Has("order_by") {
		if orderBy = q.Get("order_by"); !slices.Contains(mergeRequestOrders, orderBy) {
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

	type numbered struct {
		iid int64
		mergeRequest
	}
	var list []numbered
	s.mu.Lock()
	for iid, mr := range s.mergeRequests {
		if (state == "all" || mr.state == state) && (!q.Has("target_branch") || mr.targetBranch == q.Get("target_branch")) {
			list = append(list, numbered{iid, mr})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b numbered) int {
		if sortDir == "asc" {
			return cmp.Compare(a.iid, b.iid)
		}
		return cmp.Compare(b.iid, a.iid)
	})
	from, to := pg.window(len(list))
	out := make([]mergeRequestJSON, 0, to-from)
	for _, x := range list[from:to] {
		out = append(out, s.renderMergeRequest(x.iid, x.mergeRequest))
	}
	s.paginate(w, r, pg, len(list), url.Values{"id": {id}, "state": {state}, "order_by": {orderBy}, "sort": {sortDir}})
	writeJSON(w, http.StatusOK, out)
}

// mergeRequestJSON is the part of API::Entities::MergeRequestBasic this server keeps
// the data for.
type mergeRequestJSON struct {
	ID              int64      `json:"id"`
	IID             int64      `json:"iid"`
	ProjectID       int64      `json:"project_id"`
	Title           string     `json:"title"`
	Description     string     `json:"description"`
	State           string     `json:"state"`
	CreatedAt       apiTime    `json:"created_at"`
	UpdatedAt       apiTime    `json:"updated_at"`
	ClosedAt        *apiTime   `json:"closed_at"`
	TargetBranch    string     `json:"target_branch"`
	SourceBranch    string     `json:"source_branch"`
	Author          user       `json:"author"`
	SourceProjectID int64      `json:"source_project_id"`
	TargetProjectID int64      `json:"target_project_id"`
	Labels          []string   `json:"labels"`
	Draft           bool       `json:"draft"`
	MergeStatus     string     `json:"merge_status"`
	Reference       string     `json:"reference"`
	References      references `json:"references"`
	WebURL          string     `json:"web_url"`
}

type references struct {
	Short    string `json:"short"`
	Relative string `json:"relative"`
	Full     string `json:"full"`
}

func (s *Server) renderMergeRequest(iid int64, mr mergeRequest) mergeRequestJSON {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(iid) * time.Minute)
	var closed *apiTime
	if mr.state == "closed" {
		closed = optTime(&created)
	}
	ref := "!" + strconv.FormatInt(iid, 10)
	return mergeRequestJSON{
		ID: 90000 + iid, IID: iid, ProjectID: s.ID,
		Title: fmt.Sprintf("Change %d", iid), State: mr.state,
		CreatedAt: apiTime(created), UpdatedAt: apiTime(created), ClosedAt: closed,
		TargetBranch: mr.targetBranch, SourceBranch: fmt.Sprintf("change-%d", iid),
		Author:          s.bot(),
		SourceProjectID: s.ID, TargetProjectID: s.ID, Labels: []string{},
		MergeStatus: "can_be_merged", Reference: ref,
		References: references{Short: ref, Relative: ref, Full: s.Project + ref},
		WebURL:     fmt.Sprintf("%s/%s/-/merge_requests/%d", s.URL, s.Project, iid),
	}
}

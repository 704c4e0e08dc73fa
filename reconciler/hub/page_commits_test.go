package hub

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
)

// The hub keeps the pages of its newest commits only. A commit whose page it let go, and
// whose clusters post again, gets a page of those clusters alone, which says so: it
// does not claim to list every cluster whose state comes from the commit.
func TestAPageMadeAgainSaysItListsOnlyWhatWasPostedSince(t *testing.T) {
	book := newStatusBook(DefaultSummaryThreshold, DefaultRememberedCommits)
	s := &Source{opts: SourceOptions{Name: "fleet"}, book: book}
	h := &Hub{sources: map[string]*Source{"ns": s}}
	commitOf := func(i int) string { return fmt.Sprintf("%040x", i) }
	ready := commitstatus.Status{Context: "flotilla/x", State: commitstatus.Success, Description: "ready"}
	old := commitOf(0)
	book.cluster(old, "gpu-a", ready)
	book.cluster(old, "gpu-b", ready)
	for i := 1; i <= pagedCommits; i++ {
		book.cluster(commitOf(i), "gpu-c", ready)
	}
	book.cluster(old, "gpu-a", ready)

	get := func(commit, suffix string) string {
		t.Helper()
		rec := httptest.NewRecorder()
		h.CommitPages().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, CommitPath("fleet", commit)+suffix, nil))
		body, _ := io.ReadAll(rec.Body)
		if rec.Code != http.StatusOK {
			t.Fatalf("GET the page of %s: %d %s", commit[:12], rec.Code, body)
		}
		return string(body)
	}
	var p CommitPage
	if err := json.Unmarshal([]byte(get(old, ".json")), &p); err != nil {
		t.Fatal(err)
	}
	if p.Since == nil || len(p.Clusters) != 1 {
		t.Errorf("the page made again lists %d clusters, since %v; want gpu-a alone, since it was made again", len(p.Clusters), p.Since)
	}
	if html := get(old, ""); !strings.Contains(html, "lists only the clusters whose state was posted since") || strings.Contains(html, "lists every one") {
		t.Errorf("the page made again does not say it lists only what was posted since")
	}
	if html := get(commitOf(pagedCommits), ""); !strings.Contains(html, "lists every one") {
		t.Errorf("a page kept all along does not say it lists every cluster")
	}
}

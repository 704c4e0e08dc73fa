package plan_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/plan"
)

// testSource is the fleet source the tests' plans belong to.
const testSource = "acme"

func commit(i int) string { return fmt.Sprintf("%040x", i+1) }

func samplePlan(c string) *plan.Plan {
	return &plan.Plan{
		PullRequest: 4, Ref: "refs/pull/4/head", Commit: c, Base: commit(100), BaseFound: true,
		Clusters: []*plan.ClusterPlan{{
			Name:   "gpu-a",
			Change: plan.Changed,
			Errors: fleet.ErrorList{{File: "clusters/gpu-a/cluster.yaml", Line: 7, Column: 3, Cluster: "gpu-a", Message: "spec.quota: bad"}},
			Objects: []plan.ObjectDiff{{
				APIVersion: "kueue.x-k8s.io/v1beta2", Kind: "ClusterQueue", Name: "cluster-queue", Change: plan.Changed,
				Diff: "--- a/x\n+++ b/x\n@@ -1 +1 @@\n--- removed line starting with dashes\n+added\n",
			}},
		}},
		Counts: plan.Counts{Changed: 1, Objects: 1},
	}
}

func TestStoreServesPlansByFullCommit(t *testing.T) {
	known := commit(1)
	srv := httptest.NewServer(storeOf(samplePlan(known)))
	t.Cleanup(srv.Close)

	tests := []struct {
		name        string
		method      string
		path        string
		code        int
		contentType string
		body        []string
	}{
		{name: "the page of a known commit is HTML", path: "/plans/acme/" + known, code: http.StatusOK, contentType: "text/html; charset=utf-8",
			body: []string{`<p class="state failure">failure: clusters/gpu-a/cluster.yaml:7:3: spec.quota: bad</p>`, "<details open>", "gpu-a · 1 object · 1 error</summary>",
				`<span class="del">--- removed line starting with dashes</span>`, `<span class="add">&#43;added</span>`, `<span class="file">--- a/x</span>`}},
		{name: "an upper-case commit is the same commit", path: "/plans/acme/" + strings.ToUpper(known), code: http.StatusOK, contentType: "text/html; charset=utf-8"},
		{name: "the JSON of a known commit is for machines", path: "/plans/acme/" + known + ".json", code: http.StatusOK, contentType: "application/json",
			body: []string{`"state": "failure"`, `"file": "clusters/gpu-a/cluster.yaml"`, `"text": "clusters/gpu-a/cluster.yaml:7:3: spec.quota: bad"`}},
		{name: "an unknown commit is not found", path: "/plans/acme/" + commit(2), code: http.StatusNotFound},
		{name: "an unknown commit's JSON is not found", path: "/plans/acme/" + commit(2) + ".json", code: http.StatusNotFound},
		{name: "a short commit is a bad request", path: "/plans/acme/" + known[:12], code: http.StatusBadRequest},
		{name: "a commit that is not hex is a bad request", path: "/plans/acme/" + strings.Repeat("g", 40), code: http.StatusBadRequest},
		{name: "a longer hash is a bad request", path: "/plans/acme/" + known + known[:24], code: http.StatusBadRequest},
		{name: "another suffix is a bad request", path: "/plans/acme/" + known + ".html", code: http.StatusBadRequest},
		{name: "a markup path is a bad request", path: "/plans/acme/%3Cscript%3E", code: http.StatusBadRequest},
		{name: "a path below a commit is not found", path: "/plans/acme/" + known + "/x", code: http.StatusNotFound},
		{name: "plans are only read", method: http.MethodPost, path: "/plans/acme/" + known, code: http.StatusMethodNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tt.method, srv.URL+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			data, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			body := string(data)
			if resp.StatusCode != tt.code {
				t.Fatalf("%s %s: %s %q, want %d", tt.method, tt.path, resp.Status, body, tt.code)
			}
			if tt.contentType != "" && resp.Header.Get("Content-Type") != tt.contentType {
				t.Errorf("Content-Type %q, want %q", resp.Header.Get("Content-Type"), tt.contentType)
			}
			if tt.code == http.StatusOK && resp.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Error("the browser may sniff the content type")
			}
			for _, w := range tt.body {
				if !strings.Contains(body, w) {
					t.Errorf("body does not hold %q:\n%s", w, body)
				}
			}
		})
	}
}

func TestStoreJSONDecodesToThePlan(t *testing.T) {
	known := commit(1)
	srv := httptest.NewServer(storeOf(samplePlan(known)))
	t.Cleanup(srv.Close)
	_, body := get(t, srv.URL+plan.Path(testSource, known)+".json")
	var got struct {
		Commit      string `json:"commit"`
		PullRequest int    `json:"pullRequest"`
		State       string `json:"state"`
		Summary     string `json:"summary"`
		Counts      plan.Counts
		Clusters    []struct {
			Name    string
			Change  plan.Change
			Errors  []struct{ File, Text string }
			Objects []plan.ObjectDiff
		}
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("%v:\n%s", err, body)
	}
	if got.Commit != known || got.PullRequest != 4 || got.State != "failure" || got.Counts.Objects != 1 ||
		len(got.Clusters) != 1 || got.Clusters[0].Change != plan.Changed || len(got.Clusters[0].Errors) != 1 ||
		got.Clusters[0].Errors[0].Text != "clusters/gpu-a/cluster.yaml:7:3: spec.quota: bad" || len(got.Clusters[0].Objects) != 1 {
		t.Fatalf("decoded %+v from\n%s", got, body)
	}
}

func TestStoreKeepsTheMostRecentlyUsedPlans(t *testing.T) {
	s := plan.NewStore(2)
	s.Put(testSource, samplePlan(commit(1)))
	s.Put(testSource, samplePlan(commit(2)))
	if _, ok := s.Get(testSource, commit(1)); !ok { // commit 1 is now the most recently used
		t.Fatal("lost a plan before the store was full")
	}
	s.Put(testSource, samplePlan(commit(3)))
	for i, want := range []bool{true, false, true} {
		if _, ok := s.Get(testSource, commit(i+1)); ok != want {
			t.Errorf("plan %d kept: %v, want %v", i+1, ok, want)
		}
	}
	if s.Len() != 2 {
		t.Errorf("%d plans kept, want 2", s.Len())
	}

	// A newer plan of the same head replaces the older.
	newer := samplePlan(commit(3))
	newer.Base = commit(200)
	s.Put(testSource, newer)
	if p, _ := s.Get(testSource, commit(3)); p != newer || s.Len() != 2 {
		t.Errorf("the newer plan of a head did not replace the older")
	}
}

// Each source has its own cache: a tenant's pull requests never evict another
// tenant's plans, and the same commit in two repositories is two plans.
func TestStoreKeepsEachSourcesPlansApart(t *testing.T) {
	s := plan.NewStore(2)
	shared := samplePlan(commit(1))
	s.Put("globex", shared)
	for i := range 5 {
		s.Put(testSource, samplePlan(commit(10+i)))
	}
	if p, ok := s.Get("globex", commit(1)); !ok || p != shared {
		t.Fatal("another source's pull requests evicted globex's plan")
	}
	if _, ok := s.Get(testSource, commit(1)); ok {
		t.Fatal("acme is served globex's plan of the same commit")
	}
	ownOf := samplePlan(commit(1))
	s.Put(testSource, ownOf)
	if p, _ := s.Get("globex", commit(1)); p != shared {
		t.Error("acme's plan of the same commit replaced globex's")
	}
	if s.Len() != 3 {
		t.Errorf("%d plans kept, want 2 of acme and 1 of globex", s.Len())
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	if resp, _ := get(t, srv.URL+plan.Path("initech", commit(1))); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a source without plans answered %s", resp.Status)
	}
	if resp, _ := get(t, srv.URL+plan.Path("globex", commit(1))); resp.StatusCode != http.StatusOK {
		t.Errorf("globex's plan answered %s", resp.Status)
	}
}

// Plans are put by the hub's reconcile loop while reviewers read pages; the race
// detector checks that nothing is shared unguarded.
func TestStoreIsSafeForConcurrentUse(t *testing.T) {
	s := plan.NewStore(8)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				c := commit(g*50 + i%10)
				s.Put(testSource, samplePlan(c))
				s.Get(testSource, c)
				rec := httptest.NewRecorder()
				s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, plan.Path(testSource, c), nil))
				if rec.Code != http.StatusOK && rec.Code != http.StatusNotFound {
					t.Errorf("GET %s: %d", c, rec.Code)
				}
			}
		})
	}
	wg.Wait()
	if s.Len() > 8 {
		t.Errorf("%d plans kept, over the bound of 8", s.Len())
	}
}

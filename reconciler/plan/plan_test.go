package plan_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/reconciler/plan"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

const template = "../../fleet-template"

func clusterFile(name string) string { return "clusters/" + name + "/cluster.yaml" }

// exampleAs is the template's example cluster.yaml under another name, with replacements
// (old, new, old, new, ...) applied.
func exampleAs(name string, replacements ...string) []byte {
	s := string(fleetgen.Template()[clusterFile(fleetgen.ExampleCluster)].Data)
	s = strings.Replace(s, "name: "+fleetgen.ExampleCluster, "name: "+name, 1)
	return []byte(strings.NewReplacer(replacements...).Replace(s))
}

func templateFile(p string) string { return string(fleetgen.Template()[p].Data) }

// cluster is the files of a new cluster directory: cluster.yaml and the example's
// enrollment file, which validation wants present.
func cluster(name string, clusterYAML []byte) map[string][]byte {
	return map[string][]byte{
		clusterFile(name): clusterYAML,
		"clusters/" + name + "/enrollment.sops.yaml": []byte(templateFile("clusters/" + fleetgen.ExampleCluster + "/enrollment.sops.yaml")),
	}
}

func merged(sets ...map[string][]byte) map[string][]byte {
	out := map[string][]byte{}
	for _, s := range sets {
		maps.Copy(out, s)
	}
	return out
}

// position is where the first "key: " of text is, as file:line:col.
func position(file, text, key string) string {
	for i, l := range strings.Split(text, "\n") {
		if c := strings.Index(l, key+": "); c >= 0 {
			return fmt.Sprintf("%s:%d:%d", file, i+1, c+1)
		}
	}
	panic(key + " not found in " + file)
}

const hostileResidency = `<img src=x onerror=alert(1)>`
const hostileDescription = `</pre><script>alert("plan")</script>`

func TestComputePlansWhatMergingWouldChange(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	// main holds the example cluster (preset gke-dws) and gpu-a (preset gpu).
	repo.Commit("main", "add gpu-a", cluster("gpu-a", exampleAs("gpu-a", "preset: gke-dws", "preset: gpu")))

	fleetYAML := templateFile("fleet.yaml")
	brokenFleet := strings.Replace(fleetYAML, "hubURL: wss://hub.example.com", "hubURL: http://hub.example.com", 1)
	invalid := exampleAs("gpu-c", "residency: us", "residency: mars")
	hostile := exampleAs("gpu-x", "residency: us", fmt.Sprintf("residency: %q", hostileResidency))
	overlay := strings.Replace(fleetgen.OverlayPriority, "jobs that may jump the queue on this cluster", fmt.Sprintf("%q", hostileDescription), 1)

	tests := []struct {
		name    string
		files   map[string][]byte
		state   commitstatus.State
		summary string
		check   func(t *testing.T, p *plan.Plan)
	}{
		{
			name:    "a pull request adding a cluster adds its objects",
			files:   cluster("gpu-b", exampleAs("gpu-b")),
			state:   commitstatus.Success,
			summary: "+1 cluster, ~0, -0 · 7 objects changed",
			check: func(t *testing.T, p *plan.Plan) {
				c := only(t, p, "gpu-b", plan.Added)
				for _, o := range c.Objects {
					if o.Change != plan.Added || !strings.HasPrefix(o.Diff, "--- /dev/null\n+++ b/") {
						t.Errorf("%s: %s with diff\n%s\nwant an addition", c.Name, o, o.Diff)
					}
				}
				wantInDiff(t, c, "+kind: ClusterQueue", "+  name: cluster-queue", "+    flotilla.dev/worker-cluster: 7-example-gpu-b")
				if c.BaseYAML != "" || !strings.Contains(c.HeadYAML, "# cluster: gpu-b") {
					t.Errorf("base YAML %q, head YAML\n%s\nwant the head's rendering only", c.BaseYAML, c.HeadYAML)
				}
			},
		},
		{
			name:    "a pull request cordoning a cluster holds its ClusterQueue",
			files:   map[string][]byte{clusterFile(fleetgen.ExampleCluster): []byte(strings.Replace(templateFile(clusterFile(fleetgen.ExampleCluster)), "cordoned: false", "cordoned: true", 1))},
			state:   commitstatus.Success,
			summary: "+0 clusters, ~1, -0 · 1 object changed",
			check: func(t *testing.T, p *plan.Plan) {
				c := only(t, p, fleetgen.ExampleCluster, plan.Changed)
				if len(c.Objects) != 1 || c.Objects[0].String() != "ClusterQueue cluster-queue" || c.Objects[0].Change != plan.Changed {
					t.Fatalf("objects %v, want the ClusterQueue modified", c.Objects)
				}
				wantInDiff(t, c, "--- a/ClusterQueue.kueue.x-k8s.io/cluster-queue\n+++ b/ClusterQueue.kueue.x-k8s.io/cluster-queue\n", "+  stopPolicy: Hold\n")
				if c.BaseHash == "" || c.HeadHash == "" || c.BaseHash == c.HeadHash {
					t.Errorf("hashes %q and %q, want two different desired generations", c.BaseHash, c.HeadHash)
				}
			},
		},
		{
			name:    "a pull request with an invalid cluster fails naming the file and line",
			files:   cluster("gpu-c", invalid),
			state:   commitstatus.Failure,
			summary: position("clusters/gpu-c/cluster.yaml", string(invalid), "residency") + `: residency "mars" is not allowed in this fleet; fleet.yaml allows us, eu`,
			check: func(t *testing.T, p *plan.Plan) {
				c := only(t, p, "gpu-c", plan.Added)
				if len(c.Objects) != 0 || c.HeadHash != "" {
					t.Errorf("an invalid cluster rendered: %v", c.Objects)
				}
			},
		},
		{
			name:    "a pull request breaking fleet.yaml fails naming it",
			files:   map[string][]byte{"fleet.yaml": []byte(brokenFleet)},
			state:   commitstatus.Failure,
			summary: position("fleet.yaml", brokenFleet, "hubURL") + `: spec.hubURL "http://hub.example.com" must be a wss:// URL with a host; http:// is not accepted`,
			check: func(t *testing.T, p *plan.Plan) {
				if !p.AllClusters || len(p.FleetErrors) != 1 || len(p.Clusters) != 2 {
					t.Fatalf("all %v, fleet errors %v, clusters %d: want every cluster planned under one fleet error", p.AllClusters, p.FleetErrors, len(p.Clusters))
				}
				for _, c := range p.Clusters {
					if len(c.Objects) != 0 || c.HeadHash != "" {
						t.Errorf("%s rendered under a broken fleet.yaml", c.Name)
					}
				}
			},
		},
		{
			name:    "a pull request removing a cluster removes its objects",
			files:   map[string][]byte{clusterFile("gpu-a"): nil, "clusters/gpu-a/enrollment.sops.yaml": nil},
			state:   commitstatus.Success,
			summary: "+0 clusters, ~0, -1 · 5 objects changed",
			check: func(t *testing.T, p *plan.Plan) {
				c := only(t, p, "gpu-a", plan.Removed)
				for _, o := range c.Objects {
					if o.Change != plan.Removed || !strings.Contains(o.Diff, "\n+++ /dev/null\n") {
						t.Errorf("%s with diff\n%s\nwant a removal", o, o.Diff)
					}
				}
				wantInDiff(t, c, "-kind: ResourceFlavor")
				for _, o := range c.Objects {
					if kept := o.Kind == "Namespace"; kept != strings.Contains(o.Note, "stays on the worker") {
						t.Errorf("%s noted %q: only the workload namespace stays on the worker", o, o.Note)
					}
				}
			},
		},
		{
			name: "a preset change plans every cluster and leaves the others unchanged",
			files: map[string][]byte{"presets/gpu/queues.yaml": []byte(strings.Replace(templateFile("presets/gpu/queues.yaml"),
				"  name: default-flavor\n", "  name: default-flavor\nspec:\n  nodeLabels:\n    pool: gpu\n", 1))},
			state:   commitstatus.Success,
			summary: "+0 clusters, ~1, -0, 1 unchanged · 1 object changed",
			check: func(t *testing.T, p *plan.Plan) {
				if !p.AllClusters || p.Reason == "" {
					t.Errorf("all %v (%q), want every cluster planned", p.AllClusters, p.Reason)
				}
				if c := p.Cluster(fleetgen.ExampleCluster); c == nil || c.Change != plan.Unchanged || len(c.Objects) != 0 || c.HeadYAML != "" {
					t.Errorf("the cluster on the other preset: %+v, want it unchanged and without details", c)
				}
				wantInDiff(t, p.Cluster("gpu-a"), "+spec:\n+  nodeLabels:\n+    pool: gpu\n")
			},
		},
		{
			name:    "a pull request changing no cluster plans nothing",
			files:   map[string][]byte{"README.md": []byte("docs\n")},
			state:   commitstatus.Success,
			summary: "no cluster changes",
			check: func(t *testing.T, p *plan.Plan) {
				if len(p.Clusters) != 0 {
					t.Errorf("clusters %v, want none", p.Clusters)
				}
			},
		},
		{
			name: "hostile file contents are shown as text",
			files: merged(cluster("gpu-x", hostile), cluster("gpu-y", exampleAs("gpu-y")), map[string][]byte{
				"clusters/gpu-y/kustomization.yaml": []byte(fleetgen.Overlay),
				"clusters/gpu-y/priority.yaml":      []byte(overlay),
			}),
			state: commitstatus.Failure,
			check: func(t *testing.T, p *plan.Plan) {
				if !strings.Contains(p.Summary(), hostileResidency) {
					t.Errorf("summary %q does not name the bad residency", p.Summary())
				}
				wantInDiff(t, p.Cluster("gpu-y"), "+description: "+hostileDescription+"\n")

				srv := httptest.NewServer(storeOf(p))
				t.Cleanup(srv.Close)
				resp, body := get(t, srv.URL+plan.Path(testSource, p.Commit))
				if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
					t.Fatalf("page: %s %s", resp.Status, resp.Header.Get("Content-Type"))
				}
				for _, raw := range []string{"<script", "<img", hostileDescription} {
					if strings.Contains(body, raw) {
						t.Errorf("the page holds %q unescaped", raw)
					}
				}
				for _, escaped := range []string{"&lt;img src=x onerror=alert(1)&gt;", "&lt;/pre&gt;&lt;script&gt;alert(&#34;plan&#34;)&lt;/script&gt;"} {
					if !strings.Contains(body, escaped) {
						t.Errorf("the page does not show %q", escaped)
					}
				}
				if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
					t.Errorf("Content-Security-Policy %q lets the page load or run things", csp)
				}
			},
		},
	}

	for i, tt := range tests {
		branch := fmt.Sprintf("pr-%d", i+1)
		repo.Branch("main", branch)
		repo.Commit(branch, tt.name, tt.files)
		repo.SetRef(fmt.Sprintf("refs/pull/%d/head", i+1), branch)
	}
	s, err := gitsource.New(gitsource.Options{URL: repo.URL(), Branch: "main"})
	if err != nil {
		t.Fatal(err)
	}
	prs, err := s.PullRequests(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(prs) != len(tests) {
		t.Fatalf("%d pull requests, want %d", len(prs), len(tests))
	}
	r := render.New()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pr := prs[i]
			p, err := plan.Compute(t.Context(), pr, r, plan.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if p.Commit != pr.Head.String() || p.Base != pr.Base.String() || p.PullRequest != i+1 || !p.BaseFound {
				t.Errorf("plan of #%d at %s from %s (found %v), want #%d at %s from %s", p.PullRequest, p.Commit, p.Base, p.BaseFound, i+1, pr.Head, pr.Base)
			}
			st := p.Status("flotilla", "https://hub.example.com"+plan.Path(testSource, p.Commit))
			if st.Context != "flotilla/plan" || st.State != tt.state || st.TargetURL != "https://hub.example.com/plans/acme/"+p.Commit {
				t.Errorf("status %+v, want %s on flotilla/plan linking to the plan", st, tt.state)
			}
			if tt.summary != "" && st.Description != commitstatus.Truncate(tt.summary, plan.MaxDescription) {
				t.Errorf("description\n%q\nwant\n%q", st.Description, tt.summary)
			}
			if n := len([]rune(st.Description)); n > plan.MaxDescription {
				t.Errorf("description of %d characters, over %d", n, plan.MaxDescription)
			}
			tt.check(t, p)
		})
	}
}

// only checks that the plan concerns the one cluster name, changed as want.
func only(t *testing.T, p *plan.Plan, name string, want plan.Change) *plan.ClusterPlan {
	t.Helper()
	if len(p.Clusters) != 1 || p.Clusters[0].Name != name || p.Clusters[0].Change != want {
		var got []string
		for _, c := range p.Clusters {
			got = append(got, c.Name+" "+string(c.Change))
		}
		t.Fatalf("clusters %v, want only %s %s", got, name, want)
	}
	if p.Counts.Objects != len(p.Clusters[0].Objects) {
		t.Errorf("counted %d objects, the cluster lists %d", p.Counts.Objects, len(p.Clusters[0].Objects))
	}
	return p.Clusters[0]
}

func wantInDiff(t *testing.T, c *plan.ClusterPlan, want ...string) {
	t.Helper()
	if c == nil {
		t.Fatal("cluster not planned")
	}
	d := c.Diff()
	for _, w := range want {
		if !strings.Contains(d, w) {
			t.Errorf("%s's diff does not hold %q:\n%s", c.Name, w, d)
		}
	}
}

func storeOf(plans ...*plan.Plan) *plan.Store {
	s := plan.NewStore(0)
	for _, p := range plans {
		s.Put(testSource, p)
	}
	return s
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// A fleet-wide change to a large fleet renders MaxRendered clusters only and
// summarizes the rest: a partial plan that still counts every cluster, not a failure.
func TestComputeRendersAtMostMaxRenderedClustersAndSummarizesTheRest(t *testing.T) {
	const limit, extra = 5, 3
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	fsys := fstest.MapFS{}
	enrollment := []byte(templateFile("clusters/" + fleetgen.ExampleCluster + "/enrollment.sops.yaml"))
	for i := range limit + extra {
		fleetgen.AddCluster(fsys, fleetgen.ClusterName(i), enrollment, i, fleetgen.Options{})
	}
	files := map[string][]byte{}
	for p, f := range fsys {
		files[p] = f.Data
	}
	repo.Commit("main", "many clusters", files)
	repo.Branch("main", "eval")
	repo.Commit("eval", "another workload namespace", map[string][]byte{
		"fleet.yaml": []byte(strings.Replace(templateFile("fleet.yaml"), "    - ml-training\n", "    - ml-training\n    - ml-eval\n", 1)),
	})
	repo.SetRef("refs/pull/1/head", "eval")
	s, err := gitsource.New(gitsource.Options{URL: repo.URL(), Branch: "main"})
	if err != nil {
		t.Fatal(err)
	}
	prs, err := s.PullRequests(t.Context(), nil)
	if err != nil || len(prs) != 1 {
		t.Fatalf("pull requests %v: %v", prs, err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := plan.Compute(ctx, prs[0], render.New(), plan.Options{MaxRendered: limit}); !errors.Is(err, context.Canceled) {
		t.Errorf("planning with an ended context: %v, want context.Canceled", err)
	}

	p, err := plan.Compute(t.Context(), prs[0], render.New(), plan.Options{MaxRendered: limit})
	if err != nil {
		t.Fatal(err)
	}
	total := limit + extra + 1 // and the example cluster
	if want := (plan.Counts{Changed: limit, Objects: 3 * limit, Summarized: total - limit}); p.Counts != want {
		t.Fatalf("counts %+v, want %+v: %d clusters rendered with a Namespace, a LocalQueue and the dispatch pool's LocalQueue each, the rest summarized", p.Counts, want, limit)
	}
	if p.State() != commitstatus.Success {
		t.Errorf("a partial plan is %s, want success", p.State())
	}
	summarized := 0
	for _, c := range p.Clusters {
		if c.Summarized {
			summarized++
			if c.Change != plan.Changed || c.HeadYAML != "" || c.HeadHash != "" || len(c.Objects) != 0 {
				t.Errorf("%s is summarized but %s with hash %q and %d objects", c.Name, c.Change, c.HeadHash, len(c.Objects))
			}
			continue
		}
		if len(c.Objects) != 3 || !strings.Contains(c.Diff(), "+  name: ml-eval\n") {
			t.Errorf("%s's diff does not add the namespace:\n%s", c.Name, c.Diff())
		}
	}
	if summarized != total-limit || len(p.Clusters) != total {
		t.Errorf("%d of %d clusters summarized, want %d of %d", summarized, len(p.Clusters), total-limit, total)
	}
	want := fmt.Sprintf("+0 clusters, ~%d, -0 · %d objects changed · %d more clusters not rendered (a plan renders %d)", limit, 3*limit, total-limit, limit)
	if p.Summary() != want {
		t.Errorf("summary %q, want %q", p.Summary(), want)
	}
	srv := httptest.NewServer(storeOf(p))
	t.Cleanup(srv.Close)
	if _, body := get(t, srv.URL+plan.Path(testSource, p.Commit)); !strings.Contains(body, "Not rendered: the plan reached its limit") {
		t.Errorf("the page does not say which clusters were not rendered")
	}
}

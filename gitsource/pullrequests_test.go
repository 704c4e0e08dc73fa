package gitsource_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

func TestPullRequestsNameTheClustersTheyWouldChange(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	example := string(fleetgen.Template()[clusterFile(fleetgen.ExampleCluster)].Data)
	withName := func(name string) []byte {
		return []byte(strings.Replace(example, "name: "+fleetgen.ExampleCluster, "name: "+name, 1))
	}
	repo.Commit("main", "add a and b", map[string][]byte{clusterFile("gpu-a"): withName("gpu-a"), clusterFile("gpu-b"): withName("gpu-b")})

	// #1 (GitHub's ref) cordons a and adds c; meanwhile main changes b, which #1 must not claim.
	repo.Branch("main", "cordon-a")
	repo.Commit("cordon-a", "cordon a", map[string][]byte{clusterFile("gpu-a"): []byte(strings.Replace(string(withName("gpu-a")), "cordoned: false", "cordoned: true", 1))})
	head1 := repo.Commit("cordon-a", "add c", map[string][]byte{clusterFile("gpu-c"): withName("gpu-c")})
	repo.SetRef("refs/pull/1/head", "cordon-a")
	// #7 (GitLab's ref) changes a preset: every cluster.
	repo.Branch("main", "preset")
	repo.Commit("preset", "tune preset", map[string][]byte{"presets/gpu/notes.txt": []byte("x\n")})
	repo.SetRef("refs/merge-requests/7/head", "preset")
	// #9 removes b: a cluster removed is a cluster changed.
	repo.Branch("main", "remove-b")
	repo.Commit("remove-b", "remove b", map[string][]byte{clusterFile("gpu-b"): nil})
	repo.SetRef("refs/pull/9/head", "remove-b")
	main := repo.Commit("main", "change b on main", map[string][]byte{clusterFile("gpu-b"): []byte(strings.Replace(string(withName("gpu-b")), "cordoned: false", "cordoned: true", 1))})

	s := newSource(t, repo.URL())
	prs, err := s.PullRequests(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		ref      string
		number   int
		all      bool
		clusters []string
	}
	var gotPRs []got
	for _, pr := range prs {
		gotPRs = append(gotPRs, got{pr.Ref, pr.Number, pr.Changes.All, pr.Changes.Clusters})
		if !pr.BaseFound || pr.Base.String() == main {
			t.Errorf("%s compared with %s (found %v), want its fork point, not main's head", pr.Ref, pr.Base, pr.BaseFound)
		}
	}
	want := []got{
		{"refs/pull/1/head", 1, false, []string{"gpu-a", "gpu-c"}},
		{"refs/merge-requests/7/head", 7, true, nil},
		{"refs/pull/9/head", 9, false, []string{"gpu-b"}},
	}
	if fmt.Sprint(gotPRs) != fmt.Sprint(want) {
		t.Fatalf("pull requests\n%v\nwant\n%v", gotPRs, want)
	}
	if prs[0].Head.String() != head1 {
		t.Fatalf("#1 head %s, want %s", prs[0].Head, head1)
	}

	// The head reads like a checkout of the pull request, so the hub can render it.
	f := fleet.Load(prs[0].FS())
	if !f.Clusters["gpu-a"].Object.Spec.Cordoned || f.Clusters["gpu-c"] == nil {
		t.Fatalf("#1's head reads clusters %v without its changes", f.ClusterNames())
	}
	if base := fleet.Load(prs[0].BaseFS()); base.Clusters["gpu-c"] != nil {
		t.Fatal("#1's base already has the cluster #1 adds")
	}

	// Only open pull requests, as the forge says.
	prs, err = s.PullRequests(t.Context(), func(n int) bool { return n == 9 })
	if err != nil {
		t.Fatal(err)
	}
	if len(prs) != 1 || prs[0].Number != 9 {
		t.Fatalf("with only #9 open: %v", prs)
	}

	// A new push to #1 is seen on the next call.
	head1 = repo.Commit("cordon-a", "add d", map[string][]byte{clusterFile("gpu-d"): withName("gpu-d")})
	repo.SetRef("refs/pull/1/head", "cordon-a")
	prs, err = s.PullRequests(t.Context(), func(n int) bool { return n == 1 })
	if err != nil {
		t.Fatal(err)
	}
	if len(prs) != 1 || prs[0].Head.String() != head1 || !slices.Equal(prs[0].Changes.Clusters, []string{"gpu-a", "gpu-c", "gpu-d"}) {
		t.Fatalf("after a push to #1: %+v", prs[0])
	}
}

// A pull request that forked further back than the history fetched for it is compared
// with the branch's head, and says so.
func TestPullRequestForkedLongAgoIsComparedWithTheBranch(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	repo.Branch("main", "old")
	repo.Commit("old", "readme", map[string][]byte{"README.md": []byte("old\n")})
	repo.SetRef("refs/pull/3/head", "old")
	for i := range 60 {
		repo.Commit("main", "docs", map[string][]byte{"docs.txt": fmt.Appendf(nil, "%d\n", i)})
	}
	s := newSource(t, repo.URL())
	prs, err := s.PullRequests(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(prs) != 1 || prs[0].BaseFound || prs[0].Base.String() != repo.Head("main") {
		t.Fatalf("%+v: want a comparison with main's head, marked as such", prs)
	}
}

package gitsource_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/gitsource"
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
		gotPRs = append(gotPRs, got{pr.Ref, pr.Number, affected(pr.Changes).All, affected(pr.Changes).Clusters})
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
	if len(prs) != 1 || prs[0].Head.String() != head1 || !slices.Equal(affected(prs[0].Changes).Clusters, []string{"gpu-a", "gpu-c", "gpu-d"}) {
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

// In a branch of more commits than the history fetched below it, a pull request behind
// the branch's head is compared with its fork point all the same: what the branch
// changed since is not the pull request's. One the branch took in is merged.
func TestPullRequestBehindALongBranchIsComparedWithItsForkPoint(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	for i := range 60 {
		repo.Commit("main", "docs", map[string][]byte{"docs.txt": fmt.Appendf(nil, "%d\n", i)})
	}
	example := string(fleetgen.Template()[clusterFile(fleetgen.ExampleCluster)].Data)
	repo.Branch("main", "cordon")
	repo.Commit("cordon", "cordon", map[string][]byte{clusterFile(fleetgen.ExampleCluster): []byte(strings.Replace(example, "cordoned: false", "cordoned: true", 1))})
	repo.SetRef("refs/pull/4/head", "cordon")
	merged := repo.Commit("main", "docs again", map[string][]byte{"docs.txt": []byte("again\n")})
	repo.SetRef("refs/pull/5/head", "main")
	repo.Commit("main", "tune the preset", map[string][]byte{"presets/gpu/notes.txt": []byte("x\n")})

	prs, err := newSource(t, repo.URL()).PullRequests(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(prs) != 2 {
		t.Fatalf("%d pull requests, want 2", len(prs))
	}
	behind, in := prs[0], prs[1]
	if !behind.BaseFound || behind.Merged {
		t.Errorf("#4: fork point found %t, merged %t: want found, not merged", behind.BaseFound, behind.Merged)
	}
	if a := affected(behind.Changes); a.All || !slices.Equal(a.Clusters, []string{fleetgen.ExampleCluster}) {
		t.Errorf("#4 changes %+v, want %s alone: the preset tuned on main since is not its change", a, fleetgen.ExampleCluster)
	}
	if !in.BaseFound || !in.Merged || in.Base.String() != merged {
		t.Errorf("#5: fork point %s (found %t), merged %t: want its own head %s, merged", in.Base, in.BaseFound, in.Merged, merged)
	}
}

// A pull request whose fetch takes all the time a call has holds up no other: the call
// returns what it could not read as not read, and the next reads the others first.
func TestASlowPullRequestHoldsUpNoOther(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	example := string(fleetgen.Template()[clusterFile(fleetgen.ExampleCluster)].Data)
	heads := map[int]string{}
	for n := 1; n <= 3; n++ {
		branch := fmt.Sprintf("pr-%d", n)
		name := fmt.Sprintf("gpu-%d", n)
		repo.Commit(branch, "add "+name, map[string][]byte{clusterFile(name): []byte(strings.Replace(example, "name: "+fleetgen.ExampleCluster, "name: "+name, 1))})
		heads[n] = repo.SetRef(fmt.Sprintf("refs/pull/%d/head", n), branch)
	}
	// A server that never answers the fetch of #1's head, until the hub gives up.
	stalling := repo.Stall(t, func(req []byte) bool { return bytes.Contains(req, []byte("want "+heads[1])) })
	s := newSource(t, stalling.URL)
	for pass := 1; pass <= 2; pass++ {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		prs, err := s.PullRequests(ctx, nil)
		cancel()
		if err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		got := map[int]*gitsource.PullRequest{}
		for _, pr := range prs {
			got[pr.Number] = pr
		}
		if len(got) != 3 || !errors.Is(got[1].Err, gitsource.ErrNotRead) {
			t.Fatalf("pass %d: %d pull requests, #1's error %v; want 3, #1 not read", pass, len(got), got[1].Err)
		}
		if pass == 1 {
			continue
		}
		for n := 2; n <= 3; n++ {
			if pr := got[n]; pr.Err != nil || !slices.Equal(affected(pr.Changes).Clusters, []string{fmt.Sprintf("gpu-%d", n)}) {
				t.Errorf("pass 2: #%d: error %v, changes %+v; want it read after the slow #1 held up the first pass", n, pr.Err, affected(pr.Changes))
			}
		}
	}
}

// A pull request whose head would bring more than the budget is returned with an error
// its author can act on, and the pull requests beside it are read all the same.
func TestPullRequestOverTheBudgetIsReportedAndTheOthersAreRead(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	example := string(fleetgen.Template()[clusterFile(fleetgen.ExampleCluster)].Data)
	cordoned := []byte(strings.Replace(example, "cordoned: false", "cordoned: true", 1))
	manyFiles := map[string][]byte{}
	for i := range 60 {
		manyFiles[fmt.Sprintf("clusters/%s/notes/%d.txt", fleetgen.ExampleCluster, i)] = fmt.Appendf(nil, "note %d\n", i)
	}
	fileOf := func(size int) map[string][]byte {
		return map[string][]byte{"clusters/" + fleetgen.ExampleCluster + "/payload.bin": randomFile(uint64(size), size)}
	}
	open := map[int]map[string][]byte{
		1: {clusterFile(fleetgen.ExampleCluster): cordoned},
		2: fileOf(3 << 20),
		3: manyFiles,
		5: {clusterFile(fleetgen.ExampleCluster): cordoned, "README.md": []byte("fine\n")},
	}
	// #4 brings its budget in two commits of 600 KiB; a branch that does not exist yet
	// starts from main.
	repo.Commit("pr-4", "first half", map[string][]byte{"clusters/" + fleetgen.ExampleCluster + "/a.bin": randomFile(41, 600<<10)})
	repo.Commit("pr-4", "second half", map[string][]byte{"clusters/" + fleetgen.ExampleCluster + "/b.bin": randomFile(42, 600<<10)})
	repo.SetRef("refs/pull/4/head", "pr-4")
	heads := map[int]string{4: repo.Head("pr-4")}
	for n, files := range open {
		branch := fmt.Sprintf("pr-%d", n)
		repo.Commit(branch, "change", files)
		heads[n] = repo.SetRef(fmt.Sprintf("refs/pull/%d/head", n), branch)
	}
	s, err := gitsource.New(gitsource.Options{URL: repo.URL(), Branch: "main", PullRequestLimits: gitsource.Limits{Bytes: 1 << 20, Objects: 50}})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		number int
		// err is what the author reads; empty for a pull request that is read.
		err string
	}{
		{1, ""},
		{2, "pull request #2: a file of 3 MiB is larger than the 1 MiB the hub reads for one pull request"},
		{3, "pull request #3: its last 50 commits bring more than 50 new files, directories and commits, the most the hub reads for one pull request"},
		{4, "pull request #4: its last 50 commits bring more than 1 MiB of new content, the most the hub reads for one pull request"},
		{5, ""},
	}
	// Twice: a head over the budget stays so, and does not stop the others either time.
	for range 2 {
		prs, err := s.PullRequests(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(prs) != len(want) {
			t.Fatalf("%d pull requests, want %d", len(prs), len(want))
		}
		for i, w := range want {
			pr := prs[i]
			if pr.Number != w.number || pr.Head.String() != heads[w.number] {
				t.Fatalf("pull request %d is #%d at %s, want #%d at %s", i, pr.Number, pr.Head, w.number, heads[w.number])
			}
			if w.err == "" {
				if pr.Err != nil || !slices.Equal(affected(pr.Changes).Clusters, []string{fleetgen.ExampleCluster}) {
					t.Errorf("#%d: %v, changes %+v: want it read, changing %s", pr.Number, pr.Err, pr.Changes, fleetgen.ExampleCluster)
				} else if f := fleet.Load(pr.FS()); !f.Clusters[fleetgen.ExampleCluster].Object.Spec.Cordoned {
					t.Errorf("#%d reads without its change", pr.Number)
				}
				continue
			}
			var be *gitsource.BudgetError
			if !errors.As(pr.Err, &be) || be.Commit != pr.Head || pr.Err.Error() != w.err {
				t.Errorf("#%d: error %v, want a budget error on its head saying %q", pr.Number, pr.Err, w.err)
			}
			if _, err := fs.ReadFile(pr.FS(), "fleet.yaml"); !errors.Is(err, pr.Err) {
				t.Errorf("#%d: its head reads %v, want its error", pr.Number, err)
			}
		}
	}
	if held := s.Memory().PullRequests.Bytes; held > 1<<20 {
		t.Errorf("the pull requests' copy holds %d KiB: what was refused was kept", held>>10)
	}
}

// Each pull request is bounded on its own, and all of them together too: past the
// number or the bytes the hub holds at once, the pull requests with the higher numbers
// wait, told so, and are read once older ones close.
func TestPullRequestsPastWhatTheHubHoldsAtOnceWaitTheirTurn(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts gitsource.Options
		// message is what #3 says while #1 and #2 are open.
		message string
	}{
		{"more pull requests than the hub holds at once", gitsource.Options{MaxPullRequests: 2},
			"pull request #3: the hub holds at most 2 pull requests at once, the oldest first; this one is read once older ones close"},
		{"more bytes of pull requests than the hub holds at once", gitsource.Options{PullRequestsTotal: 250 << 10},
			"pull request #3: the hub holds at most 250 KiB of pull requests at once, the oldest first; this one is read once older ones close"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := gitserver.Start(t).NewRepo(t, "fleet", template)
			heads := map[int]string{}
			for n := 1; n <= 3; n++ {
				branch := fmt.Sprintf("pr-%d", n)
				// Some 100 KiB each that no other pull request shares.
				repo.Commit(branch, "payload", map[string][]byte{
					"clusters/" + fleetgen.ExampleCluster + "/payload.bin": randomFile(uint64(100+n), 100<<10),
				})
				heads[n] = repo.SetRef(fmt.Sprintf("refs/pull/%d/head", n), branch)
			}
			opts := tc.opts
			opts.URL, opts.Branch = repo.URL(), "main"
			s, err := gitsource.New(opts)
			if err != nil {
				t.Fatal(err)
			}
			// Twice: a pull request waiting its turn waits on the next pass too.
			for range 2 {
				prs, err := s.PullRequests(t.Context(), nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(prs) != 3 {
					t.Fatalf("%d pull requests, want 3", len(prs))
				}
				for _, pr := range prs[:2] {
					if pr.Err != nil || !slices.Equal(affected(pr.Changes).Clusters, []string{fleetgen.ExampleCluster}) {
						t.Fatalf("#%d: %v, changes %+v: want it read", pr.Number, pr.Err, pr.Changes)
					}
				}
				var be *gitsource.BudgetError
				if pr := prs[2]; !errors.As(pr.Err, &be) || be.Commit.String() != heads[3] || pr.Err.Error() != tc.message {
					t.Fatalf("#%d: error %v, want a budget error on %s saying %q", pr.Number, pr.Err, heads[3], tc.message)
				}
			}
			// #1 closes: #3 has its turn.
			prs, err := s.PullRequests(t.Context(), func(n int) bool { return n != 1 })
			if err != nil {
				t.Fatal(err)
			}
			if len(prs) != 2 || prs[1].Number != 3 || prs[1].Err != nil || prs[1].Head.String() != heads[3] {
				t.Fatalf("after #1 closed: %+v, want #3 read", prs)
			}
			if f := fleet.Load(prs[1].FS()); f.Clusters[fleetgen.ExampleCluster].Files["clusters/"+fleetgen.ExampleCluster+"/payload.bin"] == nil {
				t.Fatal("#3 reads without its change")
			}
		})
	}
}

// What a pull request that did not fit brought stays in the copy until the next
// pruning, and counts against what the hub holds of pull requests at once: otherwise
// each pull request after it could bring as much again. Those after #1 here are stacked
// on #12, whose content the copy holds from the first pass: each needs little from the
// server but is charged #12's content too, which no pull request read before it holds.
func TestPullRequestsThatDidNotFitBringNoMoreThanTheHubHoldsAtOnce(t *testing.T) {
	const total = 250 << 10
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	payload := func(n, size int) map[string][]byte {
		return map[string][]byte{fmt.Sprintf("clusters/%s/payload-%d.bin", fleetgen.ExampleCluster, n): randomFile(uint64(1000+n), size)}
	}
	for n := 1; n <= 11; n++ {
		branch := fmt.Sprintf("pr-%d", n)
		repo.Commit(branch, "a small change", map[string][]byte{"README.md": fmt.Appendf(nil, "pull request %d\n", n)})
		repo.SetRef(fmt.Sprintf("refs/pull/%d/head", n), branch)
	}
	repo.Commit("pr-12", "a large file", payload(12, 100<<10))
	repo.SetRef("refs/pull/12/head", "pr-12")
	s, err := gitsource.New(gitsource.Options{URL: repo.URL(), Branch: "main", PullRequestsTotal: total, PullRequestLimits: gitsource.Limits{Bytes: 220 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	prs, err := s.PullRequests(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range prs {
		if pr.Err != nil {
			t.Fatalf("first pass: #%d: %v", pr.Number, pr.Err)
		}
	}
	before := s.Memory().PullRequests.Bytes

	repo.Commit("pr-1", "a larger file", payload(1, 200<<10))
	repo.SetRef("refs/pull/1/head", "pr-1")
	for n := 2; n <= 11; n++ {
		branch := fmt.Sprintf("pr-%d-on-12", n)
		repo.Branch("pr-12", branch)
		repo.Commit(branch, "a file on top of #12", payload(n, 40<<10))
		repo.SetRef(fmt.Sprintf("refs/pull/%d/head", n), branch)
	}
	if prs, err = s.PullRequests(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if prs[0].Number != 1 || prs[0].Err != nil {
		t.Fatalf("#%d: %v; want #1 read", prs[0].Number, prs[0].Err)
	}
	if grew := s.Memory().PullRequests.Bytes - before; grew > total {
		t.Fatalf("the pull requests' copy grew by %d KiB in one pass, past the %d KiB the hub holds of pull requests at once", grew>>10, total>>10)
	}
}

// What a pull request that did not fit brought is charged once: one stacked on it is
// charged for what it adds. #2 is a change with #9 merged in; the copy holds #9's
// content from the first pass, which no pull request before #2 holds, and with it #2
// does not fit, though what it brings does. #3 is stacked on #2's change: it brings
// little, and is read.
func TestAPullRequestStackedOnOneThatDidNotFitIsChargedForWhatItAdds(t *testing.T) {
	const total = 250 << 10
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	file := func(n, size int) map[string][]byte {
		return map[string][]byte{fmt.Sprintf("clusters/%s/payload-%d.bin", fleetgen.ExampleCluster, n): randomFile(uint64(2000+n), size)}
	}
	repo.Branch("main", "pr-9")
	repo.Commit("pr-9", "a large file", file(9, 100<<10))
	repo.SetRef("refs/pull/9/head", "pr-9")
	s, err := gitsource.New(gitsource.Options{URL: repo.URL(), Branch: "main", PullRequestsTotal: total, PullRequestLimits: gitsource.Limits{Bytes: 220 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	prs, err := s.PullRequests(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(prs) != 1 || prs[0].Err != nil {
		t.Fatalf("first pass: %+v; want #9 read", prs)
	}
	before := s.Memory().PullRequests.Bytes

	repo.Branch("main", "pr-2")
	repo.Commit("pr-2", "a larger file", file(2, 160<<10))
	repo.Branch("pr-2", "pr-3")
	repo.Merge("pr-2", "pr-9", "merge #9")
	repo.SetRef("refs/pull/2/head", "pr-2")
	repo.Commit("pr-3", "a small file on top of #2's change", file(3, 1<<10))
	repo.SetRef("refs/pull/3/head", "pr-3")
	if prs, err = s.PullRequests(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	var be *gitsource.BudgetError
	if prs[0].Number != 2 || !errors.As(prs[0].Err, &be) || be.HeldBytes == 0 {
		t.Fatalf("#%d: %v; want #2 not to fit beside #9's content", prs[0].Number, prs[0].Err)
	}
	if prs[1].Number != 3 || prs[1].Err != nil {
		t.Fatalf("#%d: %v; want #3 read: what it shares with #2 was charged to #2", prs[1].Number, prs[1].Err)
	}
	if grew := s.Memory().PullRequests.Bytes - before; grew > total {
		t.Fatalf("the pull requests' copy grew by %d KiB in one pass, past the %d KiB the hub holds of pull requests at once", grew>>10, total>>10)
	}
}

// A pull request with a directory wider than the budget is refused at its fetch,
// before any of the directory's entries is read, in words its author can act on.
func TestPullRequestWithAWideDirectoryIsRefused(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	notes := map[string][]byte{}
	for i := range 41 {
		notes[fmt.Sprintf("clusters/%s/notes/%d.txt", fleetgen.ExampleCluster, i)] = fmt.Appendf(nil, "note %d\n", i)
	}
	repo.Commit("wide", "notes", notes)
	head := repo.SetRef("refs/pull/6/head", "wide")
	s, err := gitsource.New(gitsource.Options{URL: repo.URL(), Branch: "main", PullRequestLimits: gitsource.Limits{DirEntries: 40}})
	if err != nil {
		t.Fatal(err)
	}
	prs, err := s.PullRequests(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	const want = "pull request #6: its last 50 commits bring a directory of 41 entries, more than the 40 the hub reads in one directory"
	var be *gitsource.BudgetError
	if len(prs) != 1 || !errors.As(prs[0].Err, &be) || be.Commit.String() != head || be.DirEntries != 41 || prs[0].Err.Error() != want {
		t.Fatalf("%+v: want #6 refused saying %q", prs, want)
	}
}

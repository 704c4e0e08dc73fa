package gitsource_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

const template = "../fleet-template"

func newSource(t *testing.T, url string) *gitsource.Source {
	t.Helper()
	s, err := gitsource.New(gitsource.Options{URL: url, Branch: "main"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func clusterFile(name string) string {
	return "clusters/" + name + "/cluster.yaml"
}

// affected is what the hub makes of ch: the fleet model's reading of its paths.
func affected(ch gitsource.Changes) fleet.Affected {
	return fleet.Change{All: ch.All, Reason: ch.Reason, Paths: ch.Paths, FirstChange: ch.FirstChange}.Affected()
}

func TestSnapshotReadsLikeACheckout(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	s := newSource(t, repo.URL())
	snap, ch, err := s.Update(t.Context(), plumbing.ZeroHash)
	if err != nil {
		t.Fatal(err)
	}
	if !ch.All || snap.Commit.String() != repo.Head("main") {
		t.Fatalf("first update: %+v at %s, want everything at %s", ch, snap.Commit, repo.Head("main"))
	}
	fromGit := fleet.Load(snap.FS())
	fromDisk := fleet.Load(fleetgen.Template())
	if errs := fromGit.AllErrors(); len(errs) > 0 {
		t.Fatalf("the template read from git has errors: %v", errs)
	}
	if !slices.Equal(fromGit.ClusterNames(), fromDisk.ClusterNames()) {
		t.Fatalf("clusters %v from git, %v from disk", fromGit.ClusterNames(), fromDisk.ClusterNames())
	}
	for name, c := range fromDisk.Clusters {
		if fromGit.Clusters[name].Digest != c.Digest {
			t.Errorf("cluster %s reads differently from git", name)
		}
	}
	for name, p := range fromDisk.Presets {
		if fromGit.Presets[name].Digest != p.Digest {
			t.Errorf("preset %s reads differently from git", name)
		}
	}
}

// Update names the paths a new head changed, and the fleet model reads them as the
// clusters the hub re-reads: a cluster's directory is that cluster, a fleet-wide file
// every cluster with the file in the reason, anything else nothing.
func TestUpdateNamesTheChangedPaths(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	s := newSource(t, repo.URL())
	first, _, err := s.Update(t.Context(), plumbing.ZeroHash)
	if err != nil {
		t.Fatal(err)
	}
	example := fleetgen.Template()[clusterFile(fleetgen.ExampleCluster)].Data
	withName := func(name string) []byte {
		return []byte(strings.Replace(string(example), "name: "+fleetgen.ExampleCluster, "name: "+name, 1))
	}
	last := first.Commit
	for _, step := range []struct {
		name   string
		commit func() string
		// paths are what the source names; nil when anything may have changed.
		paths []string
		// all, reason and clusters are what the fleet model makes of them.
		all      bool
		reason   string
		clusters []string
	}{
		{name: "a cluster added", commit: func() string {
			return repo.Commit("main", "add", map[string][]byte{clusterFile("gpu-a"): withName("gpu-a"), clusterFile("gpu-b"): withName("gpu-b")})
		}, paths: []string{"clusters/gpu-a", "clusters/gpu-b"}, clusters: []string{"gpu-a", "gpu-b"}},
		{name: "a cluster modified", commit: func() string {
			return repo.Commit("main", "cordon", map[string][]byte{clusterFile("gpu-a"): []byte(strings.Replace(string(withName("gpu-a")), "cordoned: false", "cordoned: true", 1))})
		}, paths: []string{"clusters/gpu-a"}, clusters: []string{"gpu-a"}},
		{name: "a cluster deleted", commit: func() string {
			return repo.Commit("main", "remove", map[string][]byte{clusterFile("gpu-b"): nil})
		}, paths: []string{"clusters/gpu-b"}, clusters: []string{"gpu-b"}},
		{name: "a cluster renamed", commit: func() string {
			return repo.Commit("main", "rename", map[string][]byte{clusterFile("gpu-a"): nil, clusterFile("gpu-c"): withName("gpu-c")})
		}, paths: []string{"clusters/gpu-a", "clusters/gpu-c"}, clusters: []string{"gpu-a", "gpu-c"}},
		{name: "a file outside clusters and presets", commit: func() string {
			return repo.Commit("main", "docs", map[string][]byte{"README.md": []byte("new text\n")})
		}, paths: []string{"README.md"}},
		{name: "a preset", commit: func() string {
			return repo.Commit("main", "preset", map[string][]byte{"presets/gpu/notes.txt": []byte("x\n")})
		}, paths: []string{"presets/gpu"}, all: true, reason: "presets/gpu/notes.txt changed"},
		{name: "fleet.yaml", commit: func() string {
			f := fleetgen.Template()["fleet.yaml"].Data
			return repo.Commit("main", "fleet", map[string][]byte{"fleet.yaml": append(append([]byte{}, f...), "# touched\n"...)})
		}, paths: []string{"fleet.yaml"}, all: true, reason: "fleet.yaml changed"},
		{name: ".sops.yaml", commit: func() string {
			return repo.Commit("main", "sops", map[string][]byte{".sops.yaml": []byte("creation_rules: []\n")})
		}, paths: []string{".sops.yaml"}, all: true, reason: ".sops.yaml changed"},
		{name: "a force-push", commit: func() string {
			return repo.Rewrite("main", "rewritten", map[string][]byte{clusterFile("gpu-d"): withName("gpu-d")})
		}, all: true, reason: "the new head does not descend from the last reconciled commit within 50 commits"},
	} {
		t.Run(step.name, func(t *testing.T) {
			head := step.commit()
			snap, ch, err := s.Update(t.Context(), last)
			if err != nil {
				t.Fatal(err)
			}
			if snap.Commit.String() != head {
				t.Fatalf("head %s, want %s", snap.Commit, head)
			}
			if ch.All != (step.paths == nil) || !slices.Equal(ch.Paths, step.paths) {
				t.Fatalf("changes %+v, want paths %q", ch, step.paths)
			}
			if got := affected(ch); got.All != step.all || got.Reason != step.reason || !slices.Equal(got.Clusters, step.clusters) {
				t.Fatalf("affected %+v, want all=%v reason=%q clusters=%q", got, step.all, step.reason, step.clusters)
			}
			last = snap.Commit
		})
	}
	// Nothing new: nothing to do, and the same head.
	snap, ch, err := s.Update(t.Context(), last)
	if err != nil || !ch.Empty() || snap.Commit != last {
		t.Fatalf("an update without a new commit gave %+v at %v (%v)", ch, snap, err)
	}
}

// clusterNote is a commit's change to one cluster's directory and nothing else: a note
// beside its cluster.yaml.
func clusterNote(name, text string) map[string][]byte {
	return map[string][]byte{"clusters/" + name + "/notes.txt": []byte(text + "\n")}
}

// A push of several commits is told apart along the branch's own line, commit by
// commit, newest first, so that the hub puts each cluster's status on the newest commit
// that brought a change to it to the branch: a merge names what its branch changed, and
// a push too long to tell apart is read whole.
func TestUpdateTellsAPushsCommitsApart(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	s := newSource(t, repo.URL())
	first, _, err := s.Update(t.Context(), plumbing.ZeroHash)
	if err != nil {
		t.Fatal(err)
	}
	last := first.Commit
	type commit struct {
		hash  string
		paths []string
	}
	for _, tc := range []struct {
		name string
		push func() []commit
		// all says the push is read whole, as one change.
		all bool
	}{
		{name: "one commit is the head's alone", push: func() []commit {
			repo.Commit("main", "a", clusterNote("gpu-a", "1"))
			return nil
		}},
		{name: "three commits, one cluster touched twice", push: func() []commit {
			c1 := repo.Commit("main", "a", clusterNote("gpu-a", "2"))
			c2 := repo.Commit("main", "b", clusterNote("gpu-b", "1"))
			c3 := repo.Commit("main", "a again", clusterNote("gpu-a", "3"))
			return []commit{{c3, []string{"clusters/gpu-a"}}, {c2, []string{"clusters/gpu-b"}}, {c1, []string{"clusters/gpu-a"}}}
		}},
		{name: "a merge names what it brought to the branch, its branch's commits nothing", push: func() []commit {
			repo.Branch("main", "feature")
			repo.Commit("feature", "c", clusterNote("gpu-c", "1"))
			m1 := repo.Commit("main", "d", clusterNote("gpu-d", "1"))
			merge := repo.Merge("main", "feature", "merge feature")
			return []commit{{merge, []string{"clusters/gpu-c"}}, {m1, []string{"clusters/gpu-d"}}}
		}},
		{name: "a pull request merged onto the last head is its merge's alone", push: func() []commit {
			// A merge commit turns green, as the person who merged it expects, whether or
			// not the copy holds the branch's commits.
			repo.Branch("main", "pull")
			repo.Commit("pull", "a", clusterNote("gpu-a", "4"))
			repo.Commit("pull", "b", clusterNote("gpu-b", "2"))
			repo.Merge("main", "pull", "merge pull")
			return nil
		}},
		{name: "the branch's line is told apart, newest first, whatever a merged branch holds", push: func() []commit {
			x1 := repo.Commit("main", "x 1", clusterNote("gpu-x", "1"))
			repo.Branch("main", "side")
			repo.Commit("side", "y", clusterNote("gpu-y", "1"))
			x2 := repo.Commit("main", "x 2", clusterNote("gpu-x", "2"))
			z := repo.Commit("main", "z", clusterNote("gpu-z", "1"))
			w := repo.Commit("main", "w", clusterNote("gpu-w", "1"))
			merge := repo.Merge("main", "side", "merge side")
			// Breadth first from the merge, x1 would be reached over y before x2 over w
			// and z; y is the merge's.
			return []commit{{merge, []string{"clusters/gpu-y"}}, {w, []string{"clusters/gpu-w"}}, {z, []string{"clusters/gpu-z"}},
				{x2, []string{"clusters/gpu-x"}}, {x1, []string{"clusters/gpu-x"}}}
		}},
		{name: "more commits than PushDepth", all: true, push: func() []commit {
			for i := range gitsource.PushDepth + 1 {
				repo.Commit("main", "step", clusterNote("gpu-e", fmt.Sprint(i)))
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.push()
			snap, ch, err := s.Update(t.Context(), last)
			if err != nil {
				t.Fatal(err)
			}
			last = snap.Commit
			if ch.All != tc.all {
				t.Fatalf("read whole: %v (%s), want %v", ch.All, ch.Reason, tc.all)
			}
			var got []commit
			for _, c := range ch.Commits {
				if c.All {
					t.Fatalf("commit %s read whole", c.Hash)
				}
				got = append(got, commit{c.Hash.String(), c.Paths})
			}
			if !slices.EqualFunc(got, want, func(a, b commit) bool { return a.hash == b.hash && slices.Equal(a.paths, b.paths) }) {
				t.Fatalf("commits %v, want %v", got, want)
			}
		})
	}
}

// A branch forked long before the last reconciled commit is merged. The copy held the
// last commit alone, and the branch leads back into history the hub reconciled before:
// its fork point is no commit of the push. Here the fork point changed a preset, as the
// push does, and only the push's own commit may carry the fleet-wide change.
// A caller that could not apply a push asks again with the same last commit; the push's
// commits are told apart on the next head all the same, though the copy was pruned
// between the two.
func TestUpdateTellsAPushApartForACallerThatStayedBehind(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	s := newSource(t, repo.URL())
	first, _, err := s.Update(t.Context(), plumbing.ZeroHash)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, name := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		want = append([]string{repo.Commit("main", name, clusterNote(name, "1"))}, want...)
	}
	if _, ch, err := s.Update(t.Context(), first.Commit); err != nil || ch.All || len(ch.Commits) != 3 {
		t.Fatalf("the push of three: %d commits told apart, all %t (%s), error %v", len(ch.Commits), ch.All, ch.Reason, err)
	}
	// Enough for the copy to be pruned at the next fetch.
	want = append([]string{repo.Commit("main", "large", map[string][]byte{"clusters/gpu-d/payload.bin": randomFile(7, 6<<20)})}, want...)
	_, ch, err := s.Update(t.Context(), first.Commit)
	if err != nil {
		t.Fatal(err)
	}
	wantToldApart(t, ch, want)
}

// wantToldApart fails t unless ch tells the commits want apart, newest first.
func wantToldApart(t *testing.T, ch gitsource.Changes, want []string) {
	t.Helper()
	if ch.All {
		t.Fatalf("read whole: %s", ch.Reason)
	}
	var got []string
	for _, c := range ch.Commits {
		got = append(got, c.Hash.String())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("commits %q, want %q", got, want)
	}
}

func TestUpdateLeavesAnOldForkPointOutOfAPush(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	// The fork point of the branch merged below.
	repo.Commit("main", "fork", map[string][]byte{"presets/gpu/notes.txt": []byte("fork\n")})
	repo.Branch("main", "long")
	for i := range 3 {
		repo.Commit("main", "l", clusterNote("gpu-l", fmt.Sprint(i)))
	}
	s := newSource(t, repo.URL())
	first, _, err := s.Update(t.Context(), plumbing.ZeroHash)
	if err != nil {
		t.Fatal(err)
	}
	repo.Commit("long", "s", clusterNote("gpu-s", "1"))
	preset := repo.Commit("main", "preset", map[string][]byte{"presets/gpu/other.txt": []byte("a1\n")})
	a := repo.Commit("main", "a", clusterNote("gpu-a", "1"))
	merge := repo.Merge("main", "long", "merge long")

	_, ch, err := s.Update(t.Context(), first.Commit)
	if err != nil {
		t.Fatal(err)
	}
	// Neither the fork point nor what lies between it and the last head.
	wantToldApart(t, ch, []string{merge, a, preset})
}

func TestWrongCredentialsAreAClearErrorWithoutTheSecret(t *testing.T) {
	const user, password = "fleet-reader", "s3cret-password-for-the-test"
	srv := gitserver.StartWithAuth(t, user, password)
	repo := srv.NewRepo(t, "fleet", template)

	for _, tc := range []struct {
		name string
		auth string
		ok   bool
	}{
		{"right password", password, true},
		{"wrong password", "not-the-" + password, false},
		{"no credentials", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := gitsource.Options{URL: repo.URL(), Branch: "main"}
			if tc.auth != "" {
				opts.Auth = gitsource.HTTPAuth(user, tc.auth)
			}
			s, err := gitsource.New(opts)
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Fetch(t.Context())
			if tc.ok {
				if err != nil {
					t.Fatalf("Fetch: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Fetch with bad credentials succeeded")
			}
			if !strings.Contains(err.Error(), "authentication") || strings.Contains(err.Error(), password) {
				t.Fatalf("error %q: want an authentication error without the password", err)
			}
		})
	}
}

// A URL that does not parse is refused without the credentials written into it, which
// may be what does not parse.
func TestAMalformedURLIsRefusedWithoutItsCredentials(t *testing.T) {
	const secret = "s3cr3t%zz"
	for _, u := range []string{
		"https://reader:" + secret + "@git.example/fleet.git",
		"https://reader:" + secret + " with a space@git.example/fleet.git",
		"https://" + secret + "@git.example/a@b/fleet.git",
	} {
		_, err := gitsource.New(gitsource.Options{URL: u, Branch: "main"})
		if err == nil {
			t.Errorf("New accepted %s", gitsource.RedactURL(u))
			continue
		}
		if strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "not a valid URL") {
			t.Errorf("error %q: want the URL refused without its credentials", err)
		}
	}
}

// A token given as the URL's user name, as GitHub and GitLab accept one, stays out of
// the error of a fetch that fails for any reason: the transport writes the URL it asked
// into its error, user name included.
func TestAFailedFetchKeepsATokenInTheURLOutOfItsError(t *testing.T) {
	const token = "ghp_s3cr3tT0ken"
	// Nothing listens on port 1: the request fails with the URL it asked in its error.
	for _, userinfo := range []string{token, token + ":x-oauth-basic"} {
		s, err := gitsource.New(gitsource.Options{URL: "https://" + userinfo + "@127.0.0.1:1/fleet.git", Branch: "main"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Fetch(t.Context())
		if err == nil {
			t.Fatal("a fetch from nowhere succeeded")
		}
		if strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "127.0.0.1:1") {
			t.Errorf("error %q: want the failure, where it went, and no token", err)
		}
	}
}

func TestMissingBranchIsAnError(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	s, err := gitsource.New(gitsource.Options{URL: repo.URL(), Branch: "release"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Fetch(context.Background()); err == nil || !strings.Contains(err.Error(), `no branch "release"`) {
		t.Fatalf("Fetch of a missing branch = %v", err)
	}
	if _, err := gitsource.New(gitsource.Options{Branch: "main"}); err == nil {
		t.Fatal("a source without URL was accepted")
	}
}

// A head of the branch over the budget fails Update, as a broken fleet.yaml does: the
// hub applies nothing of it and keeps the last head; a head back within the budget is
// compared with that last head.
func TestBranchHeadOverTheBudgetFailsUpdate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change map[string][]byte
		err    string
	}{
		{"a file larger than the budget", map[string][]byte{"clusters/gpu-a/payload.bin": randomFile(7, 3<<20)},
			"branch main: a file of 3 MiB is larger than the 2 MiB the hub reads for one fetch of the branch"},
		{"more objects than the budget", func() map[string][]byte {
			files := map[string][]byte{}
			for i := range 120 {
				files[fmt.Sprintf("clusters/gpu-a/notes/%d.txt", i)] = fmt.Appendf(nil, "note %d\n", i)
			}
			return files
		}(), "branch main: its head commit brings more than 100 new files, directories and commits, the most the hub reads for one fetch of the branch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := gitserver.Start(t).NewRepo(t, "fleet", template)
			s, err := gitsource.New(gitsource.Options{URL: repo.URL(), Branch: "main", BranchLimits: gitsource.Limits{Bytes: 2 << 20, Objects: 100}})
			if err != nil {
				t.Fatal(err)
			}
			first, _, err := s.Update(t.Context(), plumbing.ZeroHash)
			if err != nil {
				t.Fatal(err)
			}
			held := s.Memory().Branch
			tooMuch := repo.Commit("main", "too much", tc.change)
			_, _, err = s.Update(t.Context(), first.Commit)
			var be *gitsource.BudgetError
			if !errors.As(err, &be) || be.Commit.String() != tooMuch || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Update = %v, want a budget error on %s saying %q", err, tooMuch, tc.err)
			}
			if s.Head() != first.Commit || s.Memory().Branch != held {
				t.Fatalf("after the refused head: head %s, holding %+v; want %s, %+v as before", s.Head(), s.Memory().Branch, first.Commit, held)
			}
			if _, _, again := s.Update(t.Context(), first.Commit); !errors.As(again, &be) || again.Error() != err.Error() {
				t.Fatalf("the same head again: %v, want %v", again, err)
			}

			removed := map[string][]byte{}
			for p := range tc.change {
				removed[p] = nil
			}
			fixed := repo.Commit("main", "undo", removed)
			snap, ch, err := s.Update(t.Context(), first.Commit)
			if err != nil || snap.Commit.String() != fixed || !ch.Empty() && !ch.All {
				t.Fatalf("Update after the fix = %v at %v with %+v, want %s changing nothing", err, snap, ch, fixed)
			}
		})
	}
}

func TestNegativeLimitsAreRefused(t *testing.T) {
	for _, opts := range []gitsource.Options{
		{URL: "https://example.invalid/fleet.git", Branch: "main", BranchLimits: gitsource.Limits{Bytes: -1}},
		{URL: "https://example.invalid/fleet.git", Branch: "main", PullRequestLimits: gitsource.Limits{Objects: -1}},
	} {
		if _, err := gitsource.New(opts); err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("New(%+v) = %v, want a refusal of the negative limit", opts, err)
		}
	}
}

package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gittree"
)

// refRepo is a git repository whose working tree holds the fleet template, with commits
// on branches that the working tree does not hold: each branch is the template with
// changes, committed on top of main.
func refRepo(t *testing.T, branches map[string]gittree.Files) string {
	t.Helper()
	dir := fleetgen.WriteDir(t, fleetgen.Template())
	repo, err := git.PlainInit(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	main, err := gittree.WriteCommit(repo.Storer, gittree.FromMapFS(fleetgen.Template()), "the template")
	if err != nil {
		t.Fatal(err)
	}
	setRef := func(name plumbing.ReferenceName, h plumbing.Hash) {
		t.Helper()
		if err := repo.Storer.SetReference(plumbing.NewHashReference(name, h)); err != nil {
			t.Fatal(err)
		}
	}
	setRef(plumbing.NewBranchReferenceName("main"), main)
	if err := repo.Storer.SetReference(plumbing.NewSymbolicReference(plumbing.HEAD, plumbing.NewBranchReferenceName("main"))); err != nil {
		t.Fatal(err)
	}
	for branch, changes := range branches {
		files := gittree.FromMapFS(fleetgen.Template())
		for p, f := range changes {
			files[p] = f
		}
		h, err := gittree.WriteCommit(repo.Storer, files, branch, main)
		if err != nil {
			t.Fatal(err)
		}
		setRef(plumbing.NewBranchReferenceName(branch), h)
	}
	return dir
}

func TestValidateRefChecksTheCommitAsTheHubReadsIt(t *testing.T) {
	example := "clusters/" + fleetgen.ExampleCluster
	// One blob of the most a file may hold, named from 20,000 paths: of as many
	// clusters, past the head's budget; of one, past that cluster's.
	big := []byte(strings.Repeat("#", fleet.MaxFileSize-1) + "\n")
	overBudget, clusterOverBudget := gittree.Files{}, gittree.Files{}
	for i := range 20_000 {
		overBudget[fmt.Sprintf("clusters/copy-%05d/cluster.yaml", i)] = gittree.File{Data: big}
		clusterOverBudget[fmt.Sprintf("%s/copies/c%05d.yaml", example, i)] = gittree.File{Data: big}
	}
	token, err := secrets.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	dir := refRepo(t, map[string]gittree.Files{
		"self-link":           {fleet.FleetFile: gittree.Link(fleet.FleetFile)},
		"over-budget":         overBudget,
		"cluster-over-budget": clusterOverBudget,
		"leak":                {example + "/notes.txt": gittree.Regular("token: " + token.Reveal() + "\n")},
		"deep":                {example + "/" + strings.Repeat("d/", 30) + "x.yaml": gittree.Regular("x: 1\n")},
		// A git shorthand beside a local directory of that name: kustomize would clone it.
		"remote": {
			example + "/kustomization.yaml":                         gittree.Regular("resources:\n  - github.com/org/repo//dir\n"),
			example + "/github.com/org/repo/dir/kustomization.yaml": gittree.Regular("resources: []\n"),
		},
	})

	// The working tree is the template: it passes, whatever the branches hold.
	if code, out, errOut := runCLI(t, "validate", dir); code != 0 {
		t.Fatalf("the working tree: exit %d, stdout %q, stderr:\n%s", code, out, errOut)
	}

	cases := []struct {
		ref string
		// lines the output must hold, on stderr when the commit fails, on stdout when it
		// passes.
		fail  bool
		lines []string
		// flags are the hub's budgets, when not its defaults.
		flags []string
	}{
		{ref: "self-link", fail: true, lines: []string{"fleet.yaml:1:1: too many levels of symbolic links"}},
		{ref: "over-budget", fail: true, lines: []string{
			"clusters/copy-00063/cluster.yaml:1:1: the head's files add up to more than 67108864 bytes (64 MiB), the most the hub reads of one head (budget bytes)",
			example + ":1:1: not read: the head broke the hub's budget at clusters/copy-00063/cluster.yaml",
		}},
		{ref: "cluster-over-budget", fail: true, lines: []string{
			example + "/copies:1:1: the cluster directory holds more than 1000 files, directories and symbolic links followed, the most the hub reads of one cluster directory (budget clusterFiles)",
		}},
		{ref: "cluster-over-budget", flags: []string{"--max-cluster-files", "30000", "--max-cluster-bytes", "8388608"}, fail: true, lines: []string{
			example + "/copies/c00007.yaml:1:1: the cluster directory's files add up to more than 8388608 bytes (8 MiB), the most the hub reads of one cluster directory (budget clusterBytes)",
		}},
		{ref: "deep", fail: true, lines: []string{
			example + "/" + strings.TrimSuffix(strings.Repeat("d/", 15), "/") + ":1:1: the cluster directory nests paths more than 16 deep",
		}},
		{ref: "leak", fail: true, lines: []string{example + "/notes.txt:1:8: a plaintext enrollment token (fingerprint"}},
		{ref: "remote", fail: true, lines: []string{example + "/kustomization.yaml:2:5: ", "would clone it"}},
		{ref: "main", fail: true, flags: []string{"--max-depth", "2"}, lines: []string{"more than 2 deep"}},
		{ref: "main", lines: []string{`at main (`, `): fleet "example" is valid: 1 cluster, 2 presets`}},
		{ref: "self-link~1", lines: []string{`fleet "example" is valid`}},
		{ref: "HEAD", lines: []string{`fleet "example" is valid`}},
	}
	for _, tc := range cases {
		t.Run(strings.Join(append([]string{tc.ref}, tc.flags...), " "), func(t *testing.T) {
			code, out, errOut := runCLI(t, append(append([]string{"validate", "--ref", tc.ref}, tc.flags...), dir)...)
			got := out
			if tc.fail {
				got = errOut
				if code != 1 || out != "" {
					t.Fatalf("exit %d, stdout %q; want exit 1 and nothing on stdout; stderr:\n%s", code, out, errOut)
				}
			} else if code != 0 || errOut != "" {
				t.Fatalf("exit %d, stderr:\n%s", code, errOut)
			}
			for _, line := range tc.lines {
				if !strings.Contains(got, line) {
					t.Errorf("output lacks %q:\n%s", line, got)
				}
			}
			if strings.Contains(errOut, token.Reveal()) {
				t.Fatal("the output repeats the leaked token")
			}
		})
	}

	t.Run("from a directory inside the repository", func(t *testing.T) {
		code, out, errOut := runCLI(t, "validate", "--ref", "main", filepath.Join(dir, "clusters"))
		// clusters/ of the commit is no fleet: its own fleet.yaml is missing.
		if code != 1 || !strings.Contains(errOut, "fleet.yaml:1:1: the repository has no fleet.yaml") {
			t.Fatalf("exit %d, stdout %q, stderr:\n%s", code, out, errOut)
		}
	})
	t.Run("an unknown ref", func(t *testing.T) {
		code, _, errOut := runCLI(t, "validate", "--ref", "nope", dir)
		if code != 1 || !strings.Contains(errOut, "--ref: nope: reference not found") {
			t.Fatalf("exit %d, stderr:\n%s", code, errOut)
		}
	})
	t.Run("outside a repository", func(t *testing.T) {
		code, _, errOut := runCLI(t, "validate", "--ref", "HEAD", fleetgen.WriteDir(t, fleetgen.Template()))
		if code != 1 || !strings.Contains(errOut, "--ref: opening the git repository of") {
			t.Fatalf("exit %d, stderr:\n%s", code, errOut)
		}
	})
}

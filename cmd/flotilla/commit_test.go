package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitnotes"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

func TestCommitStatusShowsTheNotesOfACommit(t *testing.T) {
	srv := gitserver.Start(t)
	repo := srv.NewRepo(t, "fleet", "")
	first := repo.Commit("main", "add a", map[string][]byte{"clusters/a/cluster.yaml": []byte("name: a\n")})
	head := repo.Commit("main", "add b", map[string][]byte{"clusters/b/cluster.yaml": []byte("name: b\n")})
	b, err := gitnotes.New(gitnotes.Options{URL: repo.URL()})
	if err != nil {
		t.Fatal(err)
	}
	p := commitstatus.NewPublisher(b, commitstatus.PublisherOptions{})
	for _, s := range []struct {
		commit string
		st     commitstatus.Status
	}{
		{first, commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready · 8× H100 80GB on 1 node"}},
		{head, commitstatus.Status{Context: "flotilla/b", State: commitstatus.Pending, Description: "waiting for the agent to register"}},
		{head, commitstatus.Status{Context: "flotilla/fleet", State: commitstatus.Pending, Description: "1 of 2 clusters ready"}},
	} {
		if _, err := p.Publish(context.Background(), s.commit, s.st); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		name    string
		args    []string
		want    []string
		notWant []string
	}{
		{"the head of the branch by default", []string{"commit", "status", "--repo", repo.URL()},
			[]string{"commit " + head, "flotilla/b", "pending", "waiting for the agent to register", "flotilla/fleet"}, []string{"flotilla/a"}},
		{"a given commit", []string{"commit", "status", "--repo", repo.URL(), "--commit", first},
			[]string{"commit " + first, "flotilla/a", "success", "8× H100 80GB"}, []string{"flotilla/b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tt.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(out, w) {
					t.Errorf("output shows %q:\n%s", w, out)
				}
			}
		})
	}

	if code, _, errOut := runCLI(t, "commit", "status", "--repo", repo.URL(), "--commit", "abc"); code == 0 || !strings.Contains(errOut, "not a full commit hash") {
		t.Errorf("a short commit: exit %d, %q; want a clear refusal", code, errOut)
	}
}

// `flotilla status` was the name of `commit status`; it works for one more release,
// prints the same on stdout, says on stderr what to use instead, and is not offered in
// help.
func TestStatusIsAHiddenDeprecatedNameOfCommitStatus(t *testing.T) {
	srv := gitserver.Start(t)
	repo := srv.NewRepo(t, "fleet", "")
	head := repo.Commit("main", "add a", map[string][]byte{"clusters/a/cluster.yaml": []byte("name: a\n")})
	b, err := gitnotes.New(gitnotes.Options{URL: repo.URL()})
	if err != nil {
		t.Fatal(err)
	}
	st := commitstatus.Status{Context: "flotilla/a", State: commitstatus.Success, Description: "ready"}
	if _, err := commitstatus.NewPublisher(b, commitstatus.PublisherOptions{}).Publish(t.Context(), head, st); err != nil {
		t.Fatal(err)
	}

	code, want, errOut := runCLI(t, "commit", "status", "--repo", repo.URL())
	if code != 0 || errOut != "" {
		t.Fatalf("commit status: exit %d, stderr %q", code, errOut)
	}
	code, got, errOut := runCLI(t, "status", "--repo", repo.URL())
	if code != 0 {
		t.Fatalf("status: exit %d, stderr %q", code, errOut)
	}
	if got != want || !strings.Contains(got, "flotilla/a") {
		t.Errorf("status printed\n%s\ncommit status printed\n%s", got, want)
	}
	if errOut != "flotilla: `flotilla status` is deprecated and will be removed in the next release; use `flotilla commit status`\n" {
		t.Errorf("stderr %q; want one line naming `flotilla commit status`", errOut)
	}

	_, help, _ := runCLI(t, "--help")
	if !regexp.MustCompile(`(?m)^  commit +`).MatchString(help) || regexp.MustCompile(`(?m)^  status +`).MatchString(help) {
		t.Errorf("help lists status, or not commit:\n%s", help)
	}
}

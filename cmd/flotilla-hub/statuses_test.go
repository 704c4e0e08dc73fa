package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/gitsource"
)

// Sources that post statuses with one credential share its budget at the forge; the
// hub tells them by the credential each names, whatever file holds it. The name never
// holds the token.
func TestSourcesPostingWithOneCredentialShareItsBudget(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const token, other = "ghp_first0123456789", "ghp_second0123456789"
	a, b, c := file("a", token), file("b", token), file("c", other)
	source := func(kind, url, tokenFile string) SourceConfig {
		var sc SourceConfig
		sc.Name = "fleet"
		sc.Statuses.Kind, sc.Statuses.URL, sc.Statuses.TokenFile = kind, url, tokenFile
		sc.Statuses.Owner, sc.Statuses.Repo, sc.Statuses.Project = "fleet", "gpu-fleet", "fleet/gpu-fleet"
		return sc
	}
	credential := func(sc SourceConfig) string {
		t.Helper()
		_, c, err := statusBackend(t.Context(), sc, gitsource.Options{URL: "https://git.example.com/fleet/gpu-fleet.git"})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(c, token) || strings.Contains(c, other) {
			t.Fatalf("the credential's name %q holds the token", c)
		}
		return c
	}
	tests := []struct {
		name  string
		x, y  SourceConfig
		share bool
	}{
		{"one token in two files", source("github", "", a), source("github", "", b), true},
		{"one token, GitHub's API root left out and spelled out", source("github", "", a), source("github", "HTTPS://api.github.com", b), true},
		{"one token, GitHub's API root with and without its slash", source("github", "https://api.github.com/", a), source("github", "https://api.github.com", b), true},
		{"two tokens", source("github", "", a), source("github", "", c), false},
		{"one token on two forges", source("gitlab", "https://gitlab.example.com", a), source("gitlab", "https://gitlab.other.example", b), false},
		{"one token, GitHub and GitLab", source("github", "https://git.example.com/api/v3/", a), source("gitlab", "https://git.example.com", a), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := credential(tt.x) == credential(tt.y); got != tt.share {
				t.Fatalf("the two sources share a budget: %v, want %v", got, tt.share)
			}
		})
	}
	t.Run("git notes have no forge budget", func(t *testing.T) {
		if c := credential(source("notes", "", "")); c != "" {
			t.Fatalf("git notes post with credential %q, want none", c)
		}
	})
}

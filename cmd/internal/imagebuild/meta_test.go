package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The tag comes from the charts, the revision from git, the creation time from
// SOURCE_DATE_EPOCH or the commit, and never from the clock.
func TestMetaComesFromTheChartsGitAndSourceDateEpoch(t *testing.T) {
	const commitTime = 1600000000
	for _, tc := range []struct {
		name        string
		hub, agent  string // appVersions
		git         bool
		epoch       string // SOURCE_DATE_EPOCH
		wantVersion string
		wantCreated time.Time
		wantErr     []string
	}{
		{name: "SOURCE_DATE_EPOCH wins over the commit", hub: "0.1.0", agent: "0.1.0", git: true, epoch: "1700000000",
			wantVersion: "0.1.0", wantCreated: time.Unix(1700000000, 0)},
		{name: "the commit's time without SOURCE_DATE_EPOCH", hub: "1.2.3-rc.1", agent: "1.2.3-rc.1", git: true,
			wantVersion: "1.2.3-rc.1", wantCreated: time.Unix(commitTime, 0)},
		{name: "outside git: revision unknown, the epoch", hub: "0.1.0", agent: "0.1.0",
			wantVersion: "0.1.0", wantCreated: time.Unix(0, 0)},
		{name: "charts that disagree are refused", hub: "0.1.0", agent: "0.2.0", git: true,
			wantErr: []string{"charts/flotilla-agent/Chart.yaml", `"0.2.0"`, "charts/flotilla-hub/Chart.yaml", `"0.1.0"`}},
		{name: "an appVersion that is no image tag is refused", hub: "0.1.0+build", agent: "0.1.0+build", git: true,
			wantErr: []string{"charts/flotilla-hub/Chart.yaml", `appVersion "0.1.0+build" is not a valid image tag`}},
		{name: "an empty appVersion is refused", hub: "", agent: "", git: true,
			wantErr: []string{"is not a valid image tag"}},
		{name: "a SOURCE_DATE_EPOCH that is no number is refused", hub: "0.1.0", agent: "0.1.0", git: true, epoch: "yesterday",
			wantErr: []string{`SOURCE_DATE_EPOCH="yesterday"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, v := range map[string]string{"flotilla-hub": tc.hub, "flotilla-agent": tc.agent} {
				dir := filepath.Join(root, "charts", name)
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				chart := "apiVersion: v2\nname: " + name + "\nversion: 0.1.0\nappVersion: \"" + v + "\"\n"
				if err := os.WriteFile(filepath.Join(dir, "Chart.yaml"), []byte(chart), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			wantRevision := "unknown"
			if tc.git {
				gitIn(t, root, "init", "-q")
				gitIn(t, root, "add", ".")
				gitIn(t, root, "-c", "user.name=flotilla", "-c", "user.email=flotilla@example.com", "commit", "-q", "-m", "charts")
				wantRevision = gitIn(t, root, "rev-parse", "HEAD")
			}
			getenv := func(k string) string {
				if k == "SOURCE_DATE_EPOCH" {
					return tc.epoch
				}
				return ""
			}
			m, err := readMeta(t.Context(), root, getenv)
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("read %+v, want an error", m)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %s", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Version != tc.wantVersion || m.Revision != wantRevision || !m.Created.Equal(tc.wantCreated) {
				t.Errorf("read version %s, revision %s, created %s; want %s, %s, %s", m.Version, m.Revision, m.Created, tc.wantVersion, wantRevision, tc.wantCreated.UTC())
			}
		})
	}
}

// gitIn runs git in dir at a fixed commit time and returns its output.
func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_COMMITTER_DATE=@1600000000 +0000", "GIT_AUTHOR_DATE=@1500000000 +0000",
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return strings.TrimSpace(string(out))
}

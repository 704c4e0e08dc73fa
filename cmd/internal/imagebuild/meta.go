package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// charts are the charts whose appVersion tags the images; they must agree.
var charts = []string{"charts/flotilla-hub/Chart.yaml", "charts/flotilla-agent/Chart.yaml"}

// meta is what a build stamps on its images besides their files.
type meta struct {
	// Version is the charts' appVersion: the tag, the version label and --version.
	Version string
	// Revision is the commit at HEAD, or "unknown".
	Revision string
	// Created is the images' creation time.
	Created time.Time
}

// readMeta reads the version from the charts under root and the revision and time from
// git and the environment.
func readMeta(ctx context.Context, root string, getenv func(string) string) (meta, error) {
	var m meta
	for _, c := range charts {
		v, err := appVersion(filepath.Join(root, c))
		if err != nil {
			return meta{}, err
		}
		if m.Version != "" && v != m.Version {
			return meta{}, fmt.Errorf("%s has appVersion %q but %s has %q: the images share one version, set both alike", c, v, charts[0], m.Version)
		}
		m.Version = v
	}
	m.Revision = "unknown"
	if rev, err := git(ctx, root, "rev-parse", "HEAD"); err == nil {
		m.Revision = rev
	}
	created, err := createdAt(ctx, root, getenv)
	if err != nil {
		return meta{}, err
	}
	m.Created = created
	return m, nil
}

// appVersion is a Chart.yaml's appVersion.
func appVersion(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading the images' version: %w", err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		return "", fmt.Errorf("%s: %w", file, err)
	}
	// The version becomes an image tag: refuse what a registry would.
	if !validTag(chart.AppVersion) {
		return "", fmt.Errorf("%s: appVersion %q is not a valid image tag", file, chart.AppVersion)
	}
	return chart.AppVersion, nil
}

// validTag follows the distribution spec: [A-Za-z0-9_][A-Za-z0-9._-]{0,127}.
func validTag(s string) bool {
	if s == "" || len(s) > 128 || s[0] == '.' || s[0] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return false
		}
	}
	return true
}

// createdAt is $SOURCE_DATE_EPOCH (reproducible-builds.org's convention), else the commit
// time of HEAD, else the Unix epoch: never now, which would change every digest.
func createdAt(ctx context.Context, root string, getenv func(string) string) (time.Time, error) {
	if s := getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil || sec < 0 {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since the Unix epoch", s)
		}
		return time.Unix(sec, 0).UTC(), nil
	}
	if s, err := git(ctx, root, "log", "-1", "--format=%ct", "HEAD"); err == nil {
		if sec, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(sec, 0).UTC(), nil
		}
	}
	return time.Unix(0, 0).UTC(), nil
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return strings.TrimSpace(string(out)), nil
}

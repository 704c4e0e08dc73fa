package main

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The Dockerfile's build stage gets the base files from `imagebuild rootfs`: the same
// bytes and modes as the images' base layer, nonroot's home left to its COPY --chown.
func TestRootfsWritesTheRootOwnedBaseFiles(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"rootfs", dir}, &stdout, &stderr, func(string) string { return "" }); err != nil {
		t.Fatalf("rootfs: %v\n%s", err, stderr.String())
	}
	want := map[string]fs.FileMode{}
	for _, e := range withParents(baseFiles()) {
		if e.UID == 0 && e.GID == 0 {
			want[e.Path] = e.Mode
		}
	}
	got := map[string]fs.FileMode{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		got["/"+filepath.ToSlash(strings.TrimPrefix(p, dir+string(filepath.Separator)))] = info.Mode() & (fs.ModeDir | fs.ModeSticky | fs.ModePerm)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for p, m := range want {
		if got[p] != m {
			t.Errorf("%s: mode %s, want %s", p, got[p], m)
		}
	}
	if len(got) != len(want) {
		t.Errorf("rootfs wrote %v, want %v", got, want)
	}
	for _, e := range baseFiles() {
		if e.dir() || e.UID != 0 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(e.Path)))
		if err != nil || !bytes.Equal(b, e.Data) {
			t.Errorf("%s differs from the base layer's (%v)", e.Path, err)
		}
	}
}

// A command line the builder cannot honour fails before anything is compiled, saying why.
func TestCommandLineRefusesWhatItCannotBuild(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "flag: help requested"},
		{"unknown command", []string{"push"}, `unknown command "push"`},
		{"rootfs without a directory", []string{"rootfs"}, "flag: help requested"},
		{"a platform twice", []string{"images", "--platforms", "linux/amd64,linux/amd64"}, `platform "linux/amd64" named twice`},
		{"a platform that is not linux", []string{"images", "--platforms", "windows/amd64"}, "the images are for linux"},
		{"no platform", []string{"images", "--platforms", ""}, "platform"},
		{"stray arguments", []string{"images", "hub"}, `unexpected arguments ["hub"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tc.args, &stdout, &stderr, func(string) string { return "" })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run %q: %v, want an error saying %s", tc.args, err, tc.want)
			}
			if stdout.Len() != 0 {
				t.Errorf("run %q wrote %q to stdout", tc.args, stdout.String())
			}
		})
	}
}

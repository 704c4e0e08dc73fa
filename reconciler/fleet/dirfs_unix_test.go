//go:build unix

package fleet_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// A checkout can hold a FIFO where a fleet file belongs: opened for reading, it waits
// for a writer that never comes. The loader refuses it, by its lstat and, on DirFS, by
// an open that does not wait, and goes on with the rest of the fleet.
func TestLoadRefusesAFIFOWithoutWaitingForAWriter(t *testing.T) {
	cases := []struct {
		name, fifo, link string
		// fleetToo is whether the FIFO fails the fleet, not only the example cluster.
		fleetToo bool
	}{
		{name: "cluster.yaml", fifo: clusterFile},
		{name: "enrollment file", fifo: enrollmentFile},
		{name: "link to a FIFO", fifo: exampleDir + "/pipe", link: exampleDir + "/extra.yaml"},
		{name: "preset file", fifo: "presets/gpu/queues.yaml", fleetToo: true},
		{name: "fleet.yaml", fifo: fleet.FleetFile, fleetToo: true},
	}
	for _, tc := range cases {
		for _, fsys := range []struct {
			name string
			open func(string) fs.FS
		}{{"DirFS", fleet.DirFS}, {"os.DirFS", os.DirFS}} {
			t.Run(tc.name+"/"+fsys.name, func(t *testing.T) {
				dir := writeDir(t, baseFleet())
				fifo := filepath.Join(dir, filepath.FromSlash(tc.fifo))
				if err := os.Remove(fifo); err != nil && !os.IsNotExist(err) {
					t.Fatal(err)
				}
				if err := syscall.Mkfifo(fifo, 0o644); err != nil {
					t.Fatal(err)
				}
				file := tc.fifo
				if tc.link != "" {
					if err := os.Symlink(filepath.Base(fifo), filepath.Join(dir, filepath.FromSlash(tc.link))); err != nil {
						t.Fatal(err)
					}
					file = tc.link
				}
				loaded := make(chan *fleet.Fleet, 1)
				go func() { loaded <- fleet.Load(fsys.open(dir)) }()
				var f *fleet.Fleet
				select {
				case f = <-loaded:
				case <-time.After(poll.Deadline):
					t.Fatalf("the load is still waiting on the FIFO after %s", poll.Deadline)
				}
				wantError(t, f.AllErrors(), file, 0, 0, "not a regular file")
				if tc.fleetToo {
					return
				}
				if f.Clusters[example].Valid() {
					t.Fatal("a cluster with a FIFO for a file is valid")
				}
				if !f.Valid() {
					t.Fatalf("the fleet failed too:\n%s", describe(f.Errors))
				}
				wantOthersValid(t, f, example, "")
			})
		}
	}
}

// DirFS is read as os.DirFS is: fstest.TestFS checks every way of reading it, and its
// errors name a file as the caller did, never the directory the checkout lies in.
func TestDirFSReadsAsOSDirFS(t *testing.T) {
	dir := writeDir(t, baseFleet())
	fsys := fleet.DirFS(dir)
	if err := fstest.TestFS(fsys, clusterFile, enrollmentFile, fleet.FleetFile); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{exampleDir + "/missing.yaml", "../outside.yaml", "/etc/hostname", ""} {
		_, err := fsys.Open(name)
		var pe *fs.PathError
		if !errors.As(err, &pe) || pe.Path != name {
			t.Errorf("Open(%q) = %v, want a path error naming %q", name, err, name)
		}
		if err != nil && strings.Contains(err.Error(), dir) {
			t.Errorf("Open(%q) names the checkout's directory: %v", name, err)
		}
	}
	if _, err := fsys.Open("../outside.yaml"); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("Open of a path leaving the checkout = %v, want fs.ErrInvalid", err)
	}
}

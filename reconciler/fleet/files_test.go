package fleet_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// stolen is the content of a file outside the repository that no link may bring in.
const stolen = "stolen: content from outside the repository\n"

// linkedRepo writes the base fleet with changes into a directory, next to another
// directory outside the repository holding stolen.yaml, and creates links (path in the
// repository to target; "$OUTSIDE" in a target stands for the outside directory).
func linkedRepo(t *testing.T, changes, links map[string]string) fs.FS {
	t.Helper()
	fsys := baseFleet()
	apply(fsys, changes)
	root := writeDir(t, fsys)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "stolen.yaml"), []byte(stolen), 0o644); err != nil {
		t.Fatal(err)
	}
	for p, target := range links {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(full); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if err := os.Symlink(strings.ReplaceAll(target, "$OUTSIDE", outside), full); err != nil {
			t.Fatal(err)
		}
	}
	return fleet.DirFS(root)
}

// wantNothingStolen fails when content from outside the repository was read.
func wantNothingStolen(t *testing.T, f *fleet.Fleet) {
	t.Helper()
	for _, c := range f.Clusters {
		for p, data := range c.Files {
			if bytes.Contains(data, []byte("stolen:")) {
				t.Fatalf("%s holds content from outside the repository", p)
			}
		}
	}
	for _, p := range f.Presets {
		for name, data := range p.Files {
			if bytes.Contains(data, []byte("stolen:")) {
				t.Fatalf("%s holds content from outside the repository", name)
			}
		}
	}
}

func TestLoadRejectsSymlinksLeavingTheRepository(t *testing.T) {
	cases := []struct {
		name  string
		links map[string]string
		file  string
		msg   string
		// fleetToo is whether a link outside the cluster fails the fleet as well.
		fleetToo bool
	}{
		{
			name:  "absolute link out",
			links: map[string]string{exampleDir + "/extra.yaml": "$OUTSIDE/stolen.yaml"},
			file:  exampleDir + "/extra.yaml",
			msg:   "/stolen.yaml\" leaves the repository",
		},
		{
			name:  "absolute link to a system file",
			links: map[string]string{exampleDir + "/extra.yaml": "/etc/hostname"},
			file:  exampleDir + "/extra.yaml",
			msg:   `symbolic link to "/etc/hostname" leaves the repository`,
		},
		{
			name:  "relative link out",
			links: map[string]string{exampleDir + "/extra.yaml": "../../../outside/stolen.yaml"},
			file:  exampleDir + "/extra.yaml",
			msg:   `symbolic link to "../../../outside/stolen.yaml" leaves the repository`,
		},
		{
			name: "link out through a second link",
			links: map[string]string{
				exampleDir + "/extra.yaml": "hop.yaml",
				exampleDir + "/hop.yaml":   "../../../outside/stolen.yaml",
			},
			file: exampleDir + "/extra.yaml",
			msg:  `symbolic link to "../../../outside/stolen.yaml" leaves the repository`,
		},
		{
			name:  "cluster.yaml linked out",
			links: map[string]string{clusterFile: "$OUTSIDE/stolen.yaml"},
			file:  clusterFile,
			msg:   "leaves the repository",
		},
		{
			name: "link through a linked directory",
			links: map[string]string{
				exampleDir + "/outside":    "$OUTSIDE",
				exampleDir + "/extra.yaml": "outside/stolen.yaml",
			},
			file: exampleDir + "/extra.yaml",
			msg:  `symbolic link to "outside/stolen.yaml" passes through the symbolic link clusters/example-us-central1/outside, which is not supported`,
		},
		{
			name: "link through a linked directory elsewhere in the repository",
			links: map[string]string{
				"presets/outside":          "$OUTSIDE",
				exampleDir + "/extra.yaml": "../../presets/outside/stolen.yaml",
			},
			file:     exampleDir + "/extra.yaml",
			msg:      "passes through the symbolic link presets/outside",
			fleetToo: true,
		},
		{
			name:  "link to a directory in the repository",
			links: map[string]string{exampleDir + "/presets": "../../presets"},
			file:  exampleDir + "/presets",
			msg:   "symbolic links to directories are not supported",
		},
		{
			name:  "link to a directory outside",
			links: map[string]string{exampleDir + "/outside": "$OUTSIDE"},
			file:  exampleDir + "/outside",
			msg:   "leaves the repository",
		},
		{
			name: "link loop",
			links: map[string]string{
				exampleDir + "/a.yaml": "b.yaml",
				exampleDir + "/b.yaml": "a.yaml",
			},
			file: exampleDir + "/a.yaml",
			msg:  "too many levels of symbolic links",
		},
		{
			name:  "dangling link",
			links: map[string]string{exampleDir + "/extra.yaml": "missing.yaml"},
			file:  exampleDir + "/extra.yaml",
			msg:   "cannot read:",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := fleet.Load(linkedRepo(t, nil, tc.links))
			errs := clusterErrors(t, f, example)
			wantError(t, errs, tc.file, 0, 0, tc.msg)
			if f.Clusters[example].Valid() {
				t.Fatal("cluster with a bad link is valid")
			}
			wantNothingStolen(t, f)
			if !tc.fleetToo && !f.Valid() {
				t.Fatalf("fleet failed too:\n%s", describe(f.Errors))
			}
			wantOthersValid(t, f, example, "")
		})
	}

	t.Run("cluster directory linked", func(t *testing.T) {
		f := fleet.Load(linkedRepo(t, nil, map[string]string{"clusters/alias": example}))
		wantOnlyError(t, f.AllErrors(), "clusters/alias", 0, 0, "symbolic links to directories are not supported")
		if _, ok := f.Clusters["alias"]; ok {
			t.Fatal("a linked cluster directory was loaded")
		}
		wantOthersValid(t, f, "")
	})
	t.Run("cluster directory linked out", func(t *testing.T) {
		f := fleet.Load(linkedRepo(t, nil, map[string]string{"clusters/alias": "$OUTSIDE"}))
		wantOnlyError(t, f.AllErrors(), "clusters/alias", 0, 0, "leaves the repository")
		wantOthersValid(t, f, "")
	})
	t.Run("fleet.yaml linked out", func(t *testing.T) {
		f := fleet.Load(linkedRepo(t, nil, map[string]string{fleet.FleetFile: "$OUTSIDE/stolen.yaml"}))
		wantOnlyError(t, f.Errors, fleet.FleetFile, 0, 0, "leaves the repository")
		if f.Spec != nil {
			t.Fatal("fleet.yaml from outside the repository was decoded")
		}
	})
	t.Run("preset file linked out", func(t *testing.T) {
		f := fleet.Load(linkedRepo(t, nil, map[string]string{"presets/gpu/queues.yaml": "../../../outside/stolen.yaml"}))
		wantOnlyError(t, f.Errors, "presets/gpu/queues.yaml", 0, 0, "leaves the repository")
		wantNothingStolen(t, f)
	})
}

func TestLoadAcceptsSymlinksToFilesInTheRepository(t *testing.T) {
	queues := template(t, "presets/gpu/queues.yaml")
	cases := map[string]struct {
		changes, links map[string]string
		file, want     string
	}{
		"to a preset file": {
			links: map[string]string{exampleDir + "/queues.yaml": "../../presets/gpu/queues.yaml"},
			file:  exampleDir + "/queues.yaml", want: queues,
		},
		"through two links": {
			links: map[string]string{
				exampleDir + "/queues.yaml": "hop.yaml",
				exampleDir + "/hop.yaml":    "../../presets/gpu/queues.yaml",
			},
			file: exampleDir + "/queues.yaml", want: queues,
		},
		"cluster.yaml to another name in the directory": {
			changes: map[string]string{clusterFile: removed, exampleDir + "/worker.yaml": template(t, clusterFile)},
			links:   map[string]string{clusterFile: "worker.yaml"},
			file:    clusterFile, want: template(t, clusterFile),
		},
		"fleet.yaml to a file in a directory": {
			changes: map[string]string{fleet.FleetFile: removed, "config/fleet.yaml": template(t, fleet.FleetFile)},
			links:   map[string]string{fleet.FleetFile: "config/fleet.yaml"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := fleet.Load(linkedRepo(t, tc.changes, tc.links))
			wantNoErrors(t, f)
			if tc.file != "" {
				if got := string(f.Clusters[example].Files[tc.file]); got != tc.want {
					t.Fatalf("%s holds %q, want the link's target", tc.file, got)
				}
			}
			if f.Spec == nil || !f.Clusters[example].Valid() {
				t.Fatal("fleet or cluster did not load")
			}
		})
	}
}

func TestLoadRejectsFilesOverMaxFileSize(t *testing.T) {
	// padded is data grown by a comment to size bytes.
	padded := func(data string, size int) string {
		pad := size - len(data) - 2
		return data + "#" + strings.Repeat("x", pad) + "\n"
	}
	tooBig := func(data string) string { return padded(data, fleet.MaxFileSize+1) }
	const msg = "file is 1048577 bytes; files in a fleet repository may be at most 1048576 bytes (1 MiB)"
	runRejects(t, []rejectCase{
		{name: "cluster.yaml", changes: map[string]string{clusterFile: tooBig(template(t, clusterFile))}, file: clusterFile, msg: msg},
		{name: "enrollment", changes: map[string]string{enrollmentFile: tooBig(template(t, enrollmentFile))}, file: enrollmentFile, msg: msg},
		{name: "overlay", changes: map[string]string{overlayFile: tooBig(overlayHead + "resources:\n  - priority.yaml\n")}, file: overlayFile, msg: msg},
		{name: "file the overlay names", changes: merge(overlay("resources:\n  - priority.yaml\n"), map[string]string{
			exampleDir + "/priority.yaml": tooBig(fleetgen.OverlayPriority)}), file: exampleDir + "/priority.yaml", msg: msg},
		{name: "file that is no YAML", changes: map[string]string{exampleDir + "/notes.bin": strings.Repeat("\x00", fleet.MaxFileSize+1)},
			file: exampleDir + "/notes.bin", msg: msg},
	})

	t.Run("fleet.yaml", func(t *testing.T) {
		f := loadWith(t, map[string]string{fleet.FleetFile: tooBig(template(t, fleet.FleetFile))})
		wantOnlyError(t, f.Errors, fleet.FleetFile, 0, 0, msg)
	})
	t.Run("preset file", func(t *testing.T) {
		f := loadWith(t, map[string]string{"presets/gpu/queues.yaml": tooBig(template(t, "presets/gpu/queues.yaml"))})
		wantOnlyError(t, f.Errors, "presets/gpu/queues.yaml", 0, 0, msg)
	})
	t.Run("exactly the limit", func(t *testing.T) {
		data := padded(template(t, clusterFile), fleet.MaxFileSize)
		if len(data) != fleet.MaxFileSize {
			t.Fatalf("padded to %d bytes", len(data))
		}
		wantNoErrors(t, loadWith(t, map[string]string{clusterFile: data}))
	})
	t.Run("file that grows after it was listed", func(t *testing.T) {
		fsys := baseFleet()
		apply(fsys, map[string]string{clusterFile: tooBig(template(t, clusterFile))})
		f := fleet.Load(lyingFS{fsys: fsys, lie: clusterFile})
		wantOnlyError(t, clusterErrors(t, f, example), clusterFile, 0, 0,
			"file is larger than 1048576 bytes (1 MiB), the most a fleet file may be")
		wantOthersValid(t, f, example)
	})
}

// lyingFS reports the file lie as 1 byte long, as a file that grows between the stat
// and the read would be. It implements only fs.FS, so every stat goes through Open.
type lyingFS struct {
	fsys fs.FS
	lie  string
}

func (l lyingFS) Open(name string) (fs.File, error) {
	f, err := l.fsys.Open(name)
	if err != nil || name != l.lie {
		return f, err
	}
	return lyingFile{f}, nil
}

type lyingFile struct{ fs.File }

func (f lyingFile) Stat() (fs.FileInfo, error) {
	info, err := f.File.Stat()
	if err != nil {
		return nil, err
	}
	return smallInfo{info}, nil
}

type smallInfo struct{ fs.FileInfo }

func (smallInfo) Size() int64 { return 1 }

func TestLoadRejectsNULBytesAndInvalidUTF8(t *testing.T) {
	display := "displayName: Example GKE cluster in Iowa"
	replace := func(file, old, new string) map[string]string {
		return map[string]string{file: edited(t, file, old, new)}
	}
	runRejects(t, []rejectCase{
		{name: "NUL in cluster.yaml", changes: replace(clusterFile, display, "displayName: Example\x00 GKE cluster in Iowa"),
			file: clusterFile, line: 7, col: 23, msg: "file contains a NUL byte; fleet files must be UTF-8 text"},
		{name: "NUL at the start", changes: map[string]string{clusterFile: "\x00" + template(t, clusterFile)},
			file: clusterFile, line: 1, col: 1, msg: "file contains a NUL byte"},
		{name: "invalid UTF-8 in cluster.yaml", changes: replace(clusterFile, display, "displayName: Example GKE cluster in Io\xffwa"),
			file: clusterFile, line: 7, col: 41, msg: "file is not valid UTF-8"},
		{name: "columns count characters, not bytes", changes: replace(clusterFile, display, "displayName: Zürich \xff"),
			file: clusterFile, line: 7, col: 23, msg: "file is not valid UTF-8"},
		{name: "truncated character at the end", changes: map[string]string{clusterFile: template(t, clusterFile) + "# caf\xc3"},
			file: clusterFile, line: 21, col: 6, msg: "file is not valid UTF-8"},
		{name: "Latin-1 in the enrollment", changes: replace(enrollmentFile, "# Placeholder", "# Plac\xe9holder"),
			file: enrollmentFile, line: 1, col: 7, msg: "file is not valid UTF-8"},
		{name: "NUL in the enrollment", changes: replace(enrollmentFile, "sops:\n", "sops:\x00\n"),
			file: enrollmentFile, line: 4, col: 6, msg: "file contains a NUL byte"},
		{name: "NUL in the overlay", changes: overlay("resources:\n  - priority.yaml\x00\n"),
			file: overlayFile, line: 4, col: 18, msg: "file contains a NUL byte"},
		{name: "invalid UTF-8 in an extra object", changes: map[string]string{
			overlayFile: overlayHead + "resources:\n  - priority.yaml\n", exampleDir + "/priority.yaml": "kind: Workload\xc0PriorityClass\n"},
			file: exampleDir + "/priority.yaml", line: 1, col: 15, msg: "file is not valid UTF-8"},
	})
}

func TestLoadRejectsYAMLAliasBombs(t *testing.T) {
	// laughs is the billion laughs: nine anchors of ten aliases each, 10^9 strings when
	// expanded, from line at on.
	laughs := func(indent string) string {
		var b strings.Builder
		b.WriteString(indent + "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n")
		for c := 'b'; c <= 'i'; c++ {
			p := string(c - 1)
			b.WriteString(indent + string(c) + ": &" + string(c) + " [")
			for i := range 10 {
				if i > 0 {
					b.WriteString(",")
				}
				b.WriteString("*" + p)
			}
			b.WriteString("]\n")
		}
		return b.String()
	}
	// wide is a file of one anchor and as many aliases as fit in the size limit.
	var wide strings.Builder
	wide.WriteString("a: &a x\nb:\n")
	for wide.Len() < fleet.MaxFileSize-8 {
		wide.WriteString("  - *a\n")
	}
	const msg = "YAML anchors and aliases are not allowed in fleet files"
	cases := []rejectCase{
		{name: "in cluster.yaml", changes: map[string]string{clusterFile: edited(t, clusterFile, "spec:\n", "spec:\n"+laughs("  "))},
			file: clusterFile, line: 7, col: 6, msg: msg},
		{name: "in the enrollment", changes: map[string]string{enrollmentFile: laughs("") + template(t, enrollmentFile)},
			file: enrollmentFile, line: 1, col: 4, msg: msg},
		{name: "in the overlay", changes: overlay(laughs("") + "resources:\n  - priority.yaml\n"),
			file: overlayFile, line: 3, col: 4, msg: msg},
		{name: "in an extra object", changes: map[string]string{
			overlayFile: overlayHead + "resources:\n  - priority.yaml\n", exampleDir + "/priority.yaml": fleetgen.OverlayPriority + laughs("")},
			file: exampleDir + "/priority.yaml", line: 7, col: 4, msg: msg},
		{name: "alias before its anchor", changes: map[string]string{clusterFile: edited(t, clusterFile, "spec:\n", "spec:\n  x: *later\n")},
			file: clusterFile, line: 7, col: 6, msg: msg},
		{name: "a file full of aliases", changes: map[string]string{clusterFile: wide.String()},
			file: clusterFile, line: 1, col: 4, msg: msg},
	}
	runRejects(t, cases)

	// Loading a bomb costs what loading its text does: nothing is expanded.
	for _, tc := range cases {
		t.Run("memory "+tc.name, func(t *testing.T) {
			fsys := baseFleet()
			apply(fsys, tc.changes)
			allocated := allocatedBy(func() { fleet.Load(fsys) })
			if limit := uint64(64 << 20); allocated > limit {
				t.Fatalf("loading allocated %d MiB, more than %d MiB", allocated>>20, limit>>20)
			}
		})
	}

	t.Run("in fleet.yaml", func(t *testing.T) {
		f := loadWith(t, map[string]string{fleet.FleetFile: edited(t, fleet.FleetFile, "spec:\n", "spec:\n"+laughs("  "))})
		wantOnlyError(t, f.Errors, fleet.FleetFile, 7, 6, msg)
	})
	t.Run("in a preset", func(t *testing.T) {
		f := loadWith(t, map[string]string{"presets/gpu/queues.yaml": laughs("") + "---\n" + template(t, "presets/gpu/queues.yaml")})
		wantOnlyError(t, f.Errors, "presets/gpu/queues.yaml", 1, 4, msg)
	})
}

// allocatedBy is how many bytes fn allocates.
func allocatedBy(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

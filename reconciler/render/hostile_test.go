package render_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// sensors observe what kustomize must never do on the hub: run git, make an HTTP
// request, leave a kustomize-* directory behind. PATH and TMPDIR are the process's, so
// that a test using them must not run in parallel (t.Setenv sees to it).
type sensors struct {
	gitCalls string
	tmp      string
	requests atomic.Int64
	url      string
}

func newSensors(t *testing.T) *sensors {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("the fake git is a shell script")
	}
	s := &sensors{}
	bin := t.TempDir()
	s.gitCalls = filepath.Join(bin, "calls")
	script := "#!/bin/sh\necho \"$*\" >> '" + s.gitCalls + "'\nexit 1\n"
	if err := os.WriteFile(filepath.Join(bin, "git"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	s.tmp = t.TempDir()
	t.Setenv("TMPDIR", s.tmp)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// host is the server's host:port.
func (s *sensors) host() string { return strings.TrimPrefix(s.url, "http://") }

// seen is what the sensors saw so far: git calls, HTTP requests, kustomize-* directories.
func (s *sensors) seen(t *testing.T) (git int, requests int64, tmpDirs []string) {
	t.Helper()
	data, err := os.ReadFile(s.gitCalls)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	tmpDirs, err = filepath.Glob(filepath.Join(s.tmp, "kustomize-*"))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(data, []byte("\n")), s.requests.Load(), tmpDirs
}

// hostileCase is a fleet change that would make kustomize reach out of the repository.
type hostileCase struct {
	name string
	// files are changed or added, by path from the repository's root.
	files map[string]string
	// file is where the problem is reported.
	file string
	// run is the directory kustomize would be run in: the example cluster when empty.
	run string
	// local is true for a case that stays in the repository (a cycle): kustomize itself
	// would refuse it, and must not loop.
	local bool
}

const (
	exampleDir = "clusters/" + example
	overlay    = exampleDir + "/kustomization.yaml"
	kHead      = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
	cHead      = "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\n"
	extraLQ    = "apiVersion: kueue.x-k8s.io/v1beta2\nkind: LocalQueue\nmetadata:\n  name: extra\nspec:\n  clusterQueue: cluster-queue\n"
)

func hostileCases(s *sensors) []hostileCase {
	obj := s.url + "/obj.yaml"
	// A URL whose base64 is a file name that kustomize's in-memory file system accepts
	// (letters and digits only), so that render gets as far as running kustomize.
	var binary string
	for n := 0; ; n++ {
		binary = base64.StdEncoding.EncodeToString([]byte(s.url + "/" + strings.Repeat("o", n) + ".yaml"))
		if !strings.ContainsAny(binary, "+/=") {
			break
		}
	}
	return []hostileCase{
		{
			name: "URL in a kustomization the overlay includes",
			files: map[string]string{
				overlay:                                kHead + "resources:\n  - sub\n",
				exampleDir + "/sub/kustomization.yaml": kHead + "resources:\n  - " + obj + "\n",
			},
			file: exampleDir + "/sub/kustomization.yaml",
		},
		{
			name: "git shorthand beside a local directory of that name",
			files: map[string]string{
				overlay: kHead + "resources:\n  - github.com/org/repo//dir\n",
				exampleDir + "/github.com/org/repo/dir/kustomization.yaml": kHead + "resources:\n  - extra.yaml\n",
				exampleDir + "/github.com/org/repo/dir/extra.yaml":         extraLQ,
			},
			file: overlay,
		},
		{
			name:  "git repository over loopback HTTP with a ref",
			files: map[string]string{overlay: kHead + "resources:\n  - " + s.url + "/org/repo.git//dir?ref=main\n"},
			file:  overlay,
		},
		{
			name:  "forced git protocol",
			files: map[string]string{overlay: kHead + "resources:\n  - git::" + s.url + "/org/repo//dir?timeout=1\n"},
			file:  overlay,
		},
		{
			name:  "ssh URL",
			files: map[string]string{overlay: kHead + "resources:\n  - ssh://git@" + s.host() + "/org/repo.git//dir\n"},
			file:  overlay,
		},
		{
			name:  "scp-like git address",
			files: map[string]string{overlay: kHead + "resources:\n  - git@127.0.0.1:org/repo.git//dir?version=v1\n"},
			file:  overlay,
		},
		{
			name:  "file URL",
			files: map[string]string{overlay: kHead + "resources:\n  - file:///srv/repo.git//dir\n"},
			file:  overlay,
		},
		{
			name: "component that names a remote resource",
			files: map[string]string{
				overlay:                                kHead + "components:\n  - sub\n",
				exampleDir + "/sub/kustomization.yaml": cHead + "resources:\n  - " + obj + "\n",
			},
			file: exampleDir + "/sub/kustomization.yaml",
		},
		{
			name: "component that names a remote component",
			files: map[string]string{
				overlay:                                kHead + "components:\n  - sub\n",
				exampleDir + "/sub/kustomization.yaml": cHead + "components:\n  - " + s.url + "/org/repo//component\n",
			},
			file: exampleDir + "/sub/kustomization.yaml",
		},
		{
			name: "patch file over HTTP in a component",
			files: map[string]string{
				overlay:                                kHead + "components:\n  - sub\n",
				exampleDir + "/sub/kustomization.yaml": cHead + "patches:\n  - path: " + s.url + "/patch.yaml\n",
			},
			file: exampleDir + "/sub/kustomization.yaml",
		},
		{
			name: "replacement file over HTTP",
			files: map[string]string{
				overlay:                    kHead + "resources:\n  - extra.yaml\nreplacements:\n  - path: " + s.url + "/r.yaml\n",
				exampleDir + "/extra.yaml": extraLQ,
			},
			file: overlay,
		},
		{
			name: "URL that kustomize decodes from !!binary, beside a file of the encoded name",
			files: map[string]string{
				overlay:                       kHead + "resources:\n  - !!binary " + binary + "\n",
				path.Join(exampleDir, binary): extraLQ,
			},
			file: overlay,
		},
		{
			name: "preset that includes a kustomization naming a URL",
			files: map[string]string{
				"presets/gke-dws/kustomization.yaml":     kHead + "resources:\n  - sub\n",
				"presets/gke-dws/sub/kustomization.yaml": kHead + "resources:\n  - " + obj + "\n",
			},
			file: "presets/gke-dws/sub/kustomization.yaml",
			run:  "presets/gke-dws",
		},
		{
			name: "kustomizations that include each other",
			files: map[string]string{
				overlay:                              kHead + "resources:\n  - a\n",
				exampleDir + "/a/kustomization.yaml": kHead + "resources:\n  - ../b\n",
				exampleDir + "/b/kustomization.yaml": kHead + "resources:\n  - ../a\n",
			},
			file:  exampleDir + "/b/kustomization.yaml",
			local: true,
		},
	}
}

// hostileFleet is the template with the case's files.
func hostileFleet(tc hostileCase) fstest.MapFS {
	fsys := fleetgen.Template()
	for p, data := range tc.files {
		fsys[p] = &fstest.MapFile{Data: []byte(data), Mode: 0o644}
	}
	return fsys
}

// errorIn fails unless err is a fleet.ErrorList with an error in file.
func errorIn(t *testing.T, err error, file string) {
	t.Helper()
	var list fleet.ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("err = %v (%T), want a fleet.ErrorList", err, err)
	}
	for _, e := range list {
		if e.File == file {
			return
		}
	}
	t.Fatalf("no error in %s:\n%v", file, list)
}

func TestRenderNeverFetchesNorClonesForAHostileFleet(t *testing.T) {
	s := newSensors(t)
	for _, tc := range hostileCases(s) {
		t.Run(tc.name, func(t *testing.T) {
			t.Run("validated by the loader", func(t *testing.T) {
				f := fleet.Load(hostileFleet(tc))
				errorIn(t, f.AllErrors(), tc.file)
				if f.Clusters[example].Valid() && f.Valid() {
					t.Fatal("the example cluster and the fleet are valid")
				}
				if _, err := render.New().Render(f, example); err == nil {
					t.Fatal("render of the hostile cluster succeeded")
				}
			})
			t.Run("changed after loading", func(t *testing.T) {
				// A Fleet is a value that a caller could change after the loader validated
				// it: render proves the bytes it gives kustomize once more.
				f := fleet.Load(fleetgen.Template())
				if errs := f.AllErrors(); len(errs) > 0 {
					t.Fatalf("the template does not load:\n%v", errs)
				}
				for p, data := range tc.files {
					if name, ok := strings.CutPrefix(p, fleet.PresetsDir+"/"); ok {
						name, _, _ = strings.Cut(name, "/")
						f.Presets[name].Files[p] = []byte(data)
					} else {
						f.Clusters[example].Files[p] = []byte(data)
					}
				}
				_, err := render.New().Render(f, example)
				errorIn(t, err, tc.file)
			})
		})
	}
	git, requests, tmpDirs := s.seen(t)
	if git != 0 || requests != 0 || len(tmpDirs) != 0 {
		t.Errorf("validating and rendering hostile fleets ran git %d times, made %d HTTP requests and left %v behind",
			git, requests, tmpDirs)
	}
	// Kustomize over an in-memory file system creates no temporary file of its own
	// either: after a render that runs it, TMPDIR is still empty.
	f := load(t, withCluster(t, same, map[string]string{
		"kustomization.yaml": fleetgen.Overlay, "priority.yaml": fleetgen.OverlayPriority,
	}))
	if _, err := render.New().Render(f, example); err != nil {
		t.Fatal(err)
	}
	if entries, err := os.ReadDir(s.tmp); err != nil || len(entries) > 0 {
		t.Errorf("rendering an overlay left %v in TMPDIR (%v)", entries, err)
	}
}

// TestHostileFleetsMakeKustomizeReachOut shows that each hostile case is one, and that
// the sensors see it: kustomize, run on the case without the proof, runs git or makes a
// request.
func TestHostileFleetsMakeKustomizeReachOut(t *testing.T) {
	s := newSensors(t)
	for _, tc := range hostileCases(s) {
		t.Run(tc.name, func(t *testing.T) {
			mem := filesys.MakeFsInMemory()
			for p, f := range hostileFleet(tc) {
				if err := mem.WriteFile(path.Join("/", p), f.Data); err != nil {
					t.Fatal(err)
				}
			}
			dir := tc.run
			if dir == "" {
				dir = exampleDir
			}
			opts := krusty.MakeDefaultOptions()
			opts.LoadRestrictions = types.LoadRestrictionsNone
			opts.PluginConfig = types.DisabledPluginConfig()
			git, requests, _ := s.seen(t)
			_, err := krusty.MakeKustomizer(opts).Run(mem, path.Join("/", dir))
			if err == nil {
				t.Fatal("kustomize succeeded")
			}
			gitAfter, requestsAfter, _ := s.seen(t)
			reached := gitAfter > git || requestsAfter > requests
			if reached == tc.local {
				t.Errorf("kustomize ran git %d times and made %d requests (%v)", gitAfter-git, requestsAfter-requests, err)
			}
		})
	}
	if _, _, tmpDirs := s.seen(t); len(tmpDirs) == 0 {
		t.Error("kustomize cloned with git and left no kustomize-* directory in TMPDIR")
	}
}

func TestRenderRendersNestedLocalKustomizations(t *testing.T) {
	fsys := withCluster(t, same, map[string]string{
		"kustomization.yaml":           kHead + "components:\n  - sub\n",
		"sub/kustomization.yaml":       cHead + "resources:\n  - extra.yaml\ncomponents:\n  - inner\n",
		"sub/extra.yaml":               extraLQ,
		"sub/inner/kustomization.yaml": cHead + "labels:\n  - pairs: {team: ml}\n",
	})
	res, err := render.New().Render(load(t, fsys), example)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, o := range res.Objects {
		if o.GetKind() == "LocalQueue" && o.GetName() == "extra" {
			found = true
			if o.GetLabels()["team"] != "ml" {
				t.Errorf("LocalQueue extra lacks the label of the inner component: %v", o.GetLabels())
			}
		}
	}
	if !found {
		t.Error("LocalQueue extra of the nested component is not rendered")
	}
}

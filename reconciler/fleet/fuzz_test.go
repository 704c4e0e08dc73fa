package fleet_test

import (
	"bytes"
	"cmp"
	"maps"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"go.yaml.in/yaml/v3"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gittree"
)

// fuzzFiles are the files FuzzLoad can edit, by its first argument.
var fuzzFiles = []string{fleet.FleetFile, clusterFile, overlayFile, enrollmentFile}

// First arguments of FuzzLoad.
const (
	fuzzFleet uint8 = iota
	fuzzCluster
	fuzzOverlay
	fuzzEnrollment
)

// fuzzMarker stands for a token committed in plain text to the enrollment file.
const fuzzMarker = "PLAINTEXT-TOKEN-4f1d9a"

// whole as the cut of a FuzzLoad input replaces the file from the offset on.
const whole = 0xffff

// FuzzLoad loads the template with one file edited: at an offset, some bytes cut and
// arbitrary bytes put in their place. Load must not panic, must place every error in a
// file with a message, and must never repeat a plaintext value of the enrollment file.
//
// The input is an edit rather than a whole file because the fuzzer minimizes every input
// that finds new coverage, trying to remove each subset of its bytes: on a whole 1 KiB
// file that is hundreds of thousands of loads, and the fuzzer ran nothing else for the
// minute each minimization may take. An edit is a few bytes in the template's context.
// For the same reason, only an edit of fleet.yaml loads the whole fleet again; an edit
// of a cluster's file re-reads that cluster, as the hub does after a change to it.
func FuzzLoad(f *testing.F) {
	tmpl := fleetgen.Template()
	for i := range fuzzFiles {
		f.Add(uint8(i), uint16(0), uint16(0), []byte{})
	}
	replace := func(which uint8, data string) { f.Add(which, uint16(0), uint16(whole), []byte(data)) }
	replace(fuzzOverlay, fleetgen.Overlay)
	replace(fuzzOverlay, overlayHead+"resources:\n  - ../../presets/gpu\n  - https://example.com/x\n  - /etc/passwd\n  - ../../../x\n")
	replace(fuzzOverlay, overlayHead+"helmCharts:\n  - name: x\nnamespace: y\n")
	replace(fuzzOverlay, overlayHead+"components:\n  - priority.yaml\npatches:\n  - path: ../../fleet.yaml\n")
	replace(fuzzEnrollment, "token: "+fuzzMarker+"\nsops:\n    age:\n        - recipient: x\n    mac: y\n")
	replace(fuzzEnrollment, "token: \""+fuzzMarker+"\nsops: {}\n")
	replace(fuzzEnrollment, "token: *"+fuzzMarker+"\n")
	replace(fuzzEnrollment, "- "+fuzzMarker+"\n---\ntoken: "+fuzzMarker+"\n")
	replace(fuzzCluster, "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n")
	replace(fuzzCluster, "spec:\n  quota:\n    cpu: -1\n    x/y/z: true\n    memory: null\nspec: 1\n")
	replace(fuzzCluster, "apiVersion: flotilla.dev/v1alpha1\nkind: WorkerCluster\nmetadata: {name: Example}\nspec: {cordonned: true, expectedGPUs: [{count: x}, 5]}\n")
	replace(fuzzCluster, "a: 1\n---\nb: 2\n")
	replace(fuzzCluster, "spec:\n  quota:\n    cpu: 1e-999999999\n    memory: 0.000000000000000000000000001Ki\n")
	replace(fuzzCluster, "a: \x00\n\xff")
	replace(fuzzFleet, "spec:\n  tenant: A\n  workloadNamespaces: [x, x, X]\n  hubURL: http://\n  allowedResidencies: ['', '']\n")
	replace(fuzzFleet, "? [a]\n: b\n? {c: d}\n: e\n")
	// Edits inside the template's own files.
	edit := func(which uint8, old, new string) {
		d := string(tmpl[fuzzFiles[which]].Data)
		at := strings.Index(d, old)
		if at < 0 {
			f.Fatalf("%s does not contain %q", fuzzFiles[which], old)
		}
		f.Add(which, uint16(at), uint16(len(old)), []byte(new))
	}
	edit(fuzzCluster, "cordoned: false", "cordoned: &c true\n  x: *c")
	edit(fuzzCluster, "residency: us", "residency: [us]")
	edit(fuzzCluster, "name: example-us-central1", "name: Example_US")
	edit(fuzzFleet, "tenant: example", "tenant: \"\"")
	edit(fuzzFleet, "kueueVersion: v0.17.0", "kueueVersion: 0.17")
	edit(fuzzEnrollment, "token: ENC[", "token: flt1_")

	// The fleet every edit of a cluster's file is re-read into; the fuzzer calls the
	// target from one goroutine at a time.
	base := fleet.Load(tmpl)
	f.Fuzz(func(t *testing.T, which uint8, at, cut uint16, data []byte) {
		file := fuzzFiles[int(which)%len(fuzzFiles)]
		var old []byte
		if d, ok := tmpl[file]; ok {
			old = d.Data
		}
		from := min(int(at), len(old))
		to := from + min(int(cut), len(old)-from)
		edited := slices.Concat(old[:from], data, old[to:])
		fsys := maps.Clone(tmpl)
		fsys[file] = &fstest.MapFile{Data: edited, Mode: 0o644}
		if file == overlayFile {
			fsys[exampleDir+"/priority.yaml"] = &fstest.MapFile{Data: []byte(fleetgen.OverlayPriority), Mode: 0o644}
		}

		fl := base
		if file == fleet.FleetFile {
			fl = fleet.Load(fsys)
		} else if fl.LoadCluster(fsys, example) == nil {
			t.Fatal("LoadCluster lost the example cluster")
		}
		all := fl.AllErrors()
		for _, e := range all {
			if e.File == "" || e.Message == "" {
				t.Fatalf("error without a file or message: %#v", e)
			}
			if e.Line < 0 || e.Column < 0 || (e.Line == 0 && e.Column != 0) {
				t.Fatalf("error with an impossible place: %#v", e)
			}
			if strings.HasPrefix(e.File, exampleDir) != (e.Cluster == example) {
				t.Fatalf("error of %s belongs to cluster %q: %#v", e.File, e.Cluster, e)
			}
		}
		if !slices.IsSortedFunc(all, func(a, b fleet.Error) int {
			return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
		}) {
			t.Fatalf("AllErrors is not sorted:\n%s", describe(all))
		}
		_ = all.Error()

		c := fl.Clusters[example]
		if c == nil {
			t.Fatal("the example cluster is missing")
		}
		if c.Valid() && (c.Object == nil || len(c.Errors) > 0) {
			t.Fatal("Valid disagrees with Object and Errors")
		}
		if fl.Spec == nil && len(fl.Errors) == 0 {
			t.Fatal("fleet.yaml gave no Spec and no error")
		}

		if file == enrollmentFile && bytes.Contains(edited, []byte(fuzzMarker)) && !inKey(edited, fuzzMarker) {
			for _, e := range all {
				if strings.Contains(e.Error(), fuzzMarker) {
					t.Fatalf("an error repeats a value of the enrollment file: %s", e)
				}
			}
		}

		// Reading the cluster again gives what the first read did.
		before := *c
		again := fl.LoadCluster(fsys, example)
		if again == nil || !reflect.DeepEqual(before, *again) {
			t.Fatalf("LoadCluster of an unchanged cluster differs:\n%s\nthen:\n%s", describe(before.Errors), describe(again.Errors))
		}
	})
}

// inKey reports whether s appears in a mapping key of the YAML data. SOPS leaves keys
// in clear text, so a key is no secret and may be named in an error.
func inKey(data []byte, s string) bool {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	found := false
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			return found
		}
		var walk func(n *yaml.Node)
		walk = func(n *yaml.Node) {
			if n.Kind == yaml.MappingNode {
				for i := 0; i < len(n.Content); i += 2 {
					if strings.Contains(n.Content[i].Value, s) {
						found = true
					}
				}
			}
			for _, c := range n.Content {
				walk(c)
			}
		}
		walk(&n)
	}
}

// treeBudget is FuzzLoadTree's budget: small, so that random trees break each part of it.
var treeBudget = fleet.Budget{MaxBytes: 64 << 10, MaxFiles: 300, MaxDepth: 6}

// treeWords are what FuzzLoadTree builds paths and link targets from.
var treeWords = []string{
	fleet.ClustersDir, fleet.PresetsDir, example, fleetgen.ClusterName(0), "gpu", "gke-dws",
	fleet.FleetFile, fleet.ClusterFile, fleet.EnrollmentFile, fleet.KustomizationFile,
	"queues.yaml", "x.yaml", "a", "..", ".",
}

// treeProgram reads a FuzzLoadTree input as a sequence of operations on a tree.
type treeProgram struct{ b []byte }

func (p *treeProgram) next() int {
	if len(p.b) == 0 {
		return 0
	}
	c := p.b[0]
	p.b = p.b[1:]
	return int(c)
}

func (p *treeProgram) path() string {
	parts := make([]string, 1+p.next()%6)
	for i := range parts {
		parts[i] = treeWords[p.next()%len(treeWords)]
	}
	return strings.Join(parts, "/")
}

// Operations of a FuzzLoadTree input, by its first byte.
const (
	opFile     = iota // path, blob: a file
	opLink            // path, flags, target: a symbolic link, absolute or climbing by the flags
	opDeep            // path, n, blob: a file below the path repeated n times
	opCopies          // path, n, blob: n*2 files in a directory, all of one blob
	opRemove          // path: remove everything at or below it
	opTemplate        // path, n: a file of the template, the n-th, at another path
	opCount
)

// FuzzLoadTree builds a commit from the fleet template and a program of operations
// (symbolic links with any target, deep directories, many paths to one blob, files
// moved about) and loads it through TreeFS with a small budget. Nothing may panic or
// overflow the stack, and the loader may never take more bytes than the budget allows,
// in a full load or in re-reading one cluster.
func FuzzLoadTree(f *testing.F) {
	tmpl := fleetgen.Template()
	tmplPaths := slices.Sorted(maps.Keys(tmpl))
	// Blobs a program picks from: template files, a YAML alias, nothing, and sizes on
	// either side of the budget.
	blobs := [][]byte{
		tmpl[clusterFile].Data, tmpl[enrollmentFile].Data, []byte(fleetgen.Overlay), []byte("a: &a [x]\nb: *a\n"), {},
		bytes.Repeat([]byte("#"), 16<<10), bytes.Repeat([]byte("#"), fleet.MaxFileSize),
	}
	word := func(w string) byte { return byte(slices.Index(treeWords, w)) }
	at := func(words ...string) []byte {
		out := []byte{byte(len(words) - 1)}
		for _, w := range words {
			out = append(out, word(w))
		}
		return out
	}
	prog := func(parts ...[]byte) []byte { return slices.Concat(parts...) }
	f.Add(prog([]byte{opLink}, at(fleet.FleetFile), []byte{0}, at(fleet.FleetFile)))
	f.Add(prog([]byte{opRemove}, at(fleet.ClustersDir), []byte{opLink}, at(fleet.ClustersDir), []byte{0}, at(fleet.ClustersDir)))
	f.Add(prog([]byte{opLink}, at(fleet.ClustersDir, example, "x.yaml"), []byte{2}, at("x.yaml")))
	f.Add(prog([]byte{opLink}, at(fleet.ClustersDir, example, "a"), []byte{0}, at("..", "..", fleet.PresetsDir),
		[]byte{opLink}, at(fleet.ClustersDir, example, "x.yaml"), []byte{0}, at("a", "gpu", "queues.yaml")))
	f.Add(prog([]byte{opLink}, at(fleet.ClustersDir, example, "a"), []byte{1}, at("a")))
	f.Add(prog([]byte{opDeep}, at(fleet.ClustersDir, example, "a"), []byte{200, 0}))
	f.Add(prog([]byte{opCopies}, at(fleet.ClustersDir, example, "a"), []byte{200, 6}))
	f.Add(prog([]byte{opCopies}, at(fleet.PresetsDir, "gpu"), []byte{4, 5}))
	f.Add(prog([]byte{opFile}, at(fleet.ClustersDir, example, "..", "x.yaml"), []byte{0}))
	f.Add(prog([]byte{opTemplate}, at(fleet.ClustersDir, "a", fleet.ClusterFile), []byte{byte(slices.Index(tmplPaths, clusterFile))}))

	f.Fuzz(func(t *testing.T, input []byte) {
		files := gittree.FromMapFS(tmpl)
		p := &treeProgram{b: input}
		for ops := 0; len(p.b) > 0 && ops < 64; ops++ {
			switch p.next() % opCount {
			case opFile:
				files[p.path()] = gittree.File{Data: blobs[p.next()%len(blobs)]}
			case opLink:
				at, flags, target := p.path(), p.next(), p.path()
				if flags&1 != 0 {
					target = "/" + target
				}
				if flags&2 != 0 {
					target = "../" + target
				}
				files[at] = gittree.Link(target)
			case opDeep:
				dir, n := p.path(), 1+p.next()
				files[strings.Repeat(dir+"/", n)+"x.yaml"] = gittree.File{Data: blobs[p.next()%len(blobs)]}
			case opCopies:
				dir, n := p.path(), p.next()*2
				blob := blobs[p.next()%len(blobs)]
				for i := range n {
					files[dir+"/c"+strconv.Itoa(i)+".yaml"] = gittree.File{Data: blob}
				}
			case opRemove:
				gone := p.path()
				for q := range files {
					if q == gone || strings.HasPrefix(q, gone+"/") {
						delete(files, q)
					}
				}
			case opTemplate:
				files[p.path()] = gittree.File{Data: tmpl[tmplPaths[p.next()%len(tmplPaths)]].Data}
			}
		}
		tree := gitsource.NewTreeFS(gittree.New(t, files))
		fsys := &countingFS{fsys: tree}
		fl := fleet.LoadWith(fsys, fleet.LoadOptions{Budget: treeBudget})
		if fsys.bytes > treeBudget.MaxBytes {
			t.Fatalf("Load took %d bytes, more than the budget's %d", fsys.bytes, treeBudget.MaxBytes)
		}
		for _, e := range fl.AllErrors() {
			if e.File == "" || e.Message == "" {
				t.Fatalf("error without a file or message: %#v", e)
			}
		}
		if fl.OverBudget() != strings.Contains(fl.Errors.Error(), "(budget ") {
			t.Fatalf("OverBudget is %t; errors:\n%s", fl.OverBudget(), describe(fl.Errors))
		}
		for _, name := range fl.ClusterNames() {
			fsys.bytes = 0
			fl.LoadCluster(fsys, name)
			if fsys.bytes > treeBudget.MaxBytes {
				t.Fatalf("LoadCluster %s took %d bytes, more than the budget's %d", name, fsys.bytes, treeBudget.MaxBytes)
			}
		}

		// The tree read directly, as any other reader of a head would.
		dirs := map[string]bool{}
		for q := range files {
			dirs[path.Dir(q)] = true
			_, _ = tree.Stat(q)
			_, _ = tree.Lstat(q)
			_, _ = tree.ReadLink(q)
			if data, err := tree.ReadShared(q); err == nil && len(data) > fleet.MaxFileSize {
				t.Fatalf("%s read %d bytes, more than any blob holds", q, len(data))
			}
		}
		for d := range dirs {
			_, _ = tree.ReadDir(d)
		}
	})
}
